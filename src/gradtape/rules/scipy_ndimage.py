"""scipy.ndimage's separable filters on traced values: `correlate1d`, `convolve1d`,
`uniform_filter1d`, `uniform_filter` and `gaussian_filter` (and through them SciPy's own
`gaussian_filter1d` and `scipy.signal.savgol_filter`, which call them).

SciPy filters in compiled code on plain arrays, which would cut the gradient. Here the input is
extended at its ends as the mode says (np.pad, whose modes cover ndimage's), and the filter is
a sum of shifted slices times the weights: the derivatives in the input and in the weights
follow. Real values only; an `output=` array is refused (the result is returned instead).
"""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.routes import implements_module_function
from ._util import dtype_of, ndim_of, shape_of

# ndimage's boundary modes as np.pad's
_PAD_MODES = {
    "reflect": "symmetric",
    "grid-mirror": "symmetric",
    "mirror": "reflect",
    "nearest": "edge",
    "wrap": "wrap",
    "grid-wrap": "wrap",
    "constant": "constant",
    "grid-constant": "constant",
}


def _checked_output(output, name: str):
    if output is None:
        return None
    if isinstance(output, (type, np.dtype, str)):
        return np.dtype(output)
    raise GradtapeError(
        f"scipy.ndimage.{name}(..., output=array) writes traced values into a plain array, "
        "which would cut the gradient: leave output out and use the result."
    )


def correlate1d(input, weights, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """scipy.ndimage.correlate1d on traced values (see the module docstring)."""
    dtype = _checked_output(output, "correlate1d")
    input, weights = np.asarray(input), np.asarray(weights)
    if dtype_of(input).kind == "c" or dtype_of(weights).kind == "c":
        raise GradtapeError("scipy.ndimage.correlate1d of complex values cannot be traced.")
    if ndim_of(weights) != 1 or shape_of(weights)[0] < 1:
        raise RuntimeError("no filter weights given")
    if mode not in _PAD_MODES:
        raise RuntimeError("boundary mode not supported")
    size = shape_of(weights)[0]
    if (size // 2 + origin < 0) or (size // 2 + origin >= size):
        raise ValueError(
            "Invalid origin; origin must satisfy -(weights.shape[0] // 2) <= origin <= "
            "(weights.shape[0] - 1) // 2"
        )
    x = np.moveaxis(input, axis, -1)
    if not np.issubdtype(dtype_of(x), np.floating):
        x = x.astype(np.float64)
    n = shape_of(x)[-1]
    before = size // 2 + origin
    widths = [(0, 0)] * (ndim_of(x) - 1) + [(before, size - 1 - before)]
    pad_mode = _PAD_MODES[mode]
    if pad_mode == "constant":
        extended = np.pad(x, widths, mode="constant", constant_values=cval)
    else:
        extended = np.pad(x, widths, mode=pad_mode)
    out = None
    for j in range(size):
        term = weights[j] * extended[..., j : j + n]
        out = term if out is None else out + term
    out = np.moveaxis(out, -1, axis)
    if dtype is not None:
        out = out.astype(dtype)
    elif out.dtype != dtype_of(input) and np.issubdtype(dtype_of(input), np.floating):
        out = out.astype(dtype_of(input))
    return out


def convolve1d(input, weights, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """scipy.ndimage.convolve1d on traced values: correlate1d with the weights reversed (and
    SciPy's shift of the origin for an even number of weights)."""
    weights = np.asarray(weights)[::-1]
    origin = -origin
    if not shape_of(weights)[0] & 1:
        origin -= 1
    return correlate1d(input, weights, axis, output, mode, cval, origin)


def uniform_filter1d(input, size, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """scipy.ndimage.uniform_filter1d on traced values: the mean over a window of `size`."""
    if size < 1:
        raise RuntimeError("incorrect filter size")
    weights = np.full(int(size), 1.0 / size)
    return correlate1d(input, weights, axis, output, mode, cval, origin)


def _per_axis(value, count: int, name: str) -> list:
    """A scalar for every axis, or one entry per axis (SciPy's _normalize_sequence)."""
    if isinstance(value, (str, bytes)) or np.ndim(value) == 0:
        return [value] * count
    value = list(value)
    if len(value) != count:
        raise RuntimeError(f"sequence argument {name} must have length equal to input rank")
    return value


def _filter_axes(input, axes) -> list[int]:
    ndim = ndim_of(input)
    if axes is None:
        return list(range(ndim))
    axes = [axes] if np.ndim(axes) == 0 else list(axes)
    normalized = [int(a) % ndim if -ndim <= int(a) < ndim else None for a in axes]
    if None in normalized:
        raise ValueError("axis out of range")
    if len(set(normalized)) != len(normalized):
        raise ValueError("axes must be unique")
    return normalized


def gaussian_filter(
    input,
    sigma,
    order=0,
    output=None,
    mode="reflect",
    cval=0.0,
    truncate=4.0,
    *,
    radius=None,
    axes=None,
):
    """scipy.ndimage.gaussian_filter on traced values: SciPy's gaussian_filter1d along each
    axis in turn (SciPy's own writes each pass into a preallocated output array)."""
    import scipy.ndimage

    dtype = _checked_output(output, "gaussian_filter")
    axes = _filter_axes(input, axes)
    count = len(axes)
    passes = zip(
        axes,
        _per_axis(sigma, count, "sigma"),
        _per_axis(order, count, "order"),
        _per_axis(mode, count, "mode"),
        _per_axis(radius, count, "radius"),
    )
    out = np.asarray(input)
    for axis, s, o, m, r in passes:
        if s > 1e-15:
            out = scipy.ndimage.gaussian_filter1d(
                out, s, axis, o, None, m, cval, truncate, radius=r
            )
    return out if dtype is None else out.astype(dtype)


def uniform_filter(input, size=3, output=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """scipy.ndimage.uniform_filter on traced values: uniform_filter1d along each axis."""
    dtype = _checked_output(output, "uniform_filter")
    axes = _filter_axes(input, axes)
    count = len(axes)
    passes = zip(
        axes,
        _per_axis(size, count, "size"),
        _per_axis(mode, count, "mode"),
        _per_axis(origin, count, "origin"),
    )
    out = np.asarray(input)
    for axis, z, m, o in passes:
        if z > 1:
            out = uniform_filter1d(out, z, axis, None, m, cval, o)
    return out if dtype is None else out.astype(dtype)


for _module in ("scipy.ndimage", "scipy.ndimage._filters"):
    for _name, _traced in (
        ("correlate1d", correlate1d),
        ("convolve1d", convolve1d),
        ("uniform_filter1d", uniform_filter1d),
        ("gaussian_filter", gaussian_filter),
        ("uniform_filter", uniform_filter),
    ):
        implements_module_function(_module, _name)(_traced)
