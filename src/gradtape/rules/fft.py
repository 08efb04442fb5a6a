"""np.fft (and scipy.fft): discrete Fourier transforms, their shifts and frequencies.

One primitive, `fft`, transforms one axis: kind "fft", "ifft" (complex to complex), "rfft"
(real to the n//2 + 1 non-negative frequencies) or "irfft" (back to n real samples), with
NumPy's `norm` ("backward", "ortho", "forward"). Its input already has the transform's length:
`n=` crops (a slice) or zero-pads (np.pad) first, as NumPy does inside. The n-dimensional
functions are sequences of one-axis transforms in NumPy's own order, and hfft/ihfft are
irfft/rfft of the conjugate, as NumPy computes them: the values are NumPy's.

Transposes follow JAX (jax/_src/lax/fft.py), under the pairing Re(sum u * v):

* fft and ifft: their matrices are symmetric, so each is its own transpose (same norm).
* rfft of length n: the cotangent ct of the m = n//2 + 1 frequencies goes back through
  irfft(conj(ct) / mask, n) with the opposite norm, where mask is 2 for the frequencies that
  stand for a conjugate pair and 1 for the zero frequency (and n/2 for even n).
* irfft: mask * conj(rfft(ct)) with the opposite norm.

Every transform is linear, so its JVP is the transform of the tangent.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements, implements_module_function
from ..core.tracing import bind
from ._complex import complex_rules
from ._util import batch_shape, dtype_of, ndim_of, shape_of

_NORMS = {None: "backward", "backward": "backward", "ortho": "ortho", "forward": "forward"}
_SWAP = {"backward": "forward", "ortho": "ortho", "forward": "backward"}
_ONE_AXIS = {"fft": np.fft.fft, "ifft": np.fft.ifft, "rfft": np.fft.rfft, "irfft": np.fft.irfft}


def _fft_impl(x, kind, axis, n, norm):
    return _ONE_AXIS[kind](x, n, axis, norm)


def _mask(m: int, n: int, axis: int, ndim: int, dtype) -> np.ndarray:
    """2 for the frequencies of an rfft of length n that stand for a conjugate pair, 1 for the
    zero frequency (and the Nyquist frequency n/2 of an even n), shaped along `axis`."""
    mask = np.full(m, 2.0, dtype)
    mask[0] = 1.0
    if n % 2 == 0:
        mask[-1] = 1.0
    return np.reshape(mask, (m,) + (1,) * (ndim - 1 - axis))


def _real_dtype(x) -> np.dtype:
    return np.finfo(dtype_of(x)).dtype if dtype_of(x).kind in "fc" else np.dtype(np.float64)


def _fft_vjp(g, ans, x, kind, axis, n, norm):
    if kind in ("fft", "ifft"):  # a symmetric matrix
        return fft_p(g, kind=kind, axis=axis, n=n, norm=norm)
    if kind == "rfft":
        m = shape_of(g)[axis]
        mask = _mask(m, n, axis, ndim_of(g), _real_dtype(g))
        return fft_p(np.conjugate(g) / mask, kind="irfft", axis=axis, n=n, norm=_SWAP[norm])
    m = shape_of(x)[axis]  # irfft: x has the m = n//2 + 1 frequencies
    mask = _mask(m, n, axis, ndim_of(g), _real_dtype(g))
    return mask * np.conjugate(fft_p(g, kind="rfft", axis=axis, n=n, norm=_SWAP[norm]))


def _fft_jvp(ts, ans, x, kind, axis, n, norm):
    t = ts[0]
    return fft_p(t, kind=kind, axis=axis + len(batch_shape(t, x)), n=n, norm=norm)


fft_p = Primitive("fft", _fft_impl, vjps=(_fft_vjp,), jvp=_fft_jvp, linear=True, jvp_batched=True)
complex_rules("fft")


# --- the one-axis transforms -------------------------------------------------------------------
def _norm(norm) -> str:
    try:
        return _NORMS[norm]
    except (KeyError, TypeError):
        raise ValueError(
            f'Invalid norm value {norm}; should be "backward", "ortho" or "forward".'
        ) from None


def _no_out(out, name: str) -> None:
    if out is not None:
        raise GradtapeError(
            f"np.fft.{name}(..., out=...) cannot be traced; assign the result instead."
        )


def _operand(a):
    return a if hasattr(a, "shape") else np.asarray(a)


def _resize(a, axis: int, n: int):
    """`a` cropped or zero-padded to length n along `axis` (what NumPy does with n=)."""
    length = shape_of(a)[axis]
    if length > n:
        return a[(slice(None),) * axis + (slice(0, n),)]
    if length < n:
        pad = [(0, 0)] * ndim_of(a)
        pad[axis] = (0, n - length)
        return np.pad(a, pad)
    return a


def _one_axis(kind: str, a, n, axis, norm, out=None, name=None):
    _no_out(out, name or kind)
    norm = _norm(norm)
    a = _operand(a)
    axis = np.lib.array_utils.normalize_axis_index(operator.index(axis), ndim_of(a))
    length = shape_of(a)[axis]
    if kind == "irfft":
        n = 2 * (length - 1) if n is None else operator.index(n)
        if n < 1:
            raise ValueError(f"Invalid number of FFT data points ({n}) specified.")
        a = _resize(a, axis, n // 2 + 1)
    else:
        n = length if n is None else operator.index(n)
        if n < 1:
            raise ValueError(f"Invalid number of FFT data points ({n}) specified.")
        a = _resize(a, axis, n)
    return bind(fft_p, (a,), {"kind": kind, "axis": axis, "n": n, "norm": norm})


@implements(np.fft.fft)
def fft(a, n=None, axis=-1, norm=None, out=None):
    """np.fft.fft on a traced array."""
    return _one_axis("fft", a, n, axis, norm, out)


@implements(np.fft.ifft)
def ifft(a, n=None, axis=-1, norm=None, out=None):
    """np.fft.ifft on a traced array."""
    return _one_axis("ifft", a, n, axis, norm, out)


@implements(np.fft.rfft)
def rfft(a, n=None, axis=-1, norm=None, out=None):
    """np.fft.rfft on a traced (real) array."""
    if dtype_of(a).kind == "c":
        raise TypeError("rfft needs a real input; use fft for complex arrays.")
    return _one_axis("rfft", a, n, axis, norm, out)


@implements(np.fft.irfft)
def irfft(a, n=None, axis=-1, norm=None, out=None):
    """np.fft.irfft on a traced array (the imaginary parts of the zero and Nyquist
    frequencies are ignored, as NumPy does: their derivative is zero)."""
    return _one_axis("irfft", a, n, axis, norm, out)


@implements(np.fft.hfft)
def hfft(a, n=None, axis=-1, norm=None, out=None):
    """np.fft.hfft: irfft of the conjugate with the opposite norm, as NumPy computes it."""
    _no_out(out, "hfft")
    a = _operand(a)
    if n is None:
        n = (shape_of(a)[axis] - 1) * 2
    return irfft(np.conjugate(a), n, axis, norm=_SWAP[_norm(norm)])


@implements(np.fft.ihfft)
def ihfft(a, n=None, axis=-1, norm=None, out=None):
    """np.fft.ihfft: the conjugate of rfft with the opposite norm, as NumPy computes it."""
    _no_out(out, "ihfft")
    return np.conjugate(rfft(a, n, axis, norm=_SWAP[_norm(norm)]))


# --- n-dimensional transforms: one axis at a time, in NumPy's order ---------------------------
def _cook(a, s, axes, invreal: bool = False):
    """NumPy's reading of s and axes (numpy.fft._pocketfft._cook_nd_args)."""
    shape = shape_of(a)
    shapeless = s is None
    if s is None:
        s = list(shape) if axes is None else [shape[ax] for ax in axes]
    s = list(s)
    if axes is None:
        if not shapeless:
            warnings.warn(
                "`axes` should not be `None` if `s` is not `None` (Deprecated in "
                "NumPy 2.0). Pass axes explicitly.",
                DeprecationWarning,
                stacklevel=4,
            )
        axes = list(range(-len(s), 0))
    axes = list(axes)
    if len(s) != len(axes):
        raise ValueError("Shape and axes have different lengths.")
    if invreal and shapeless:
        s[-1] = (shape[axes[-1]] - 1) * 2
    s = [shape[ax] if n == -1 else n for n, ax in zip(s, axes)]
    return s, axes


def _nd(function, a, s, axes, norm, out, name):
    _no_out(out, name)
    a = _operand(a)
    s, axes = _cook(a, s, axes)
    for ii in reversed(range(len(axes))):
        a = function(a, n=s[ii], axis=axes[ii], norm=norm)
    return a


def _rnd(a, s, axes, norm, out, name):
    _no_out(out, name)
    a = _operand(a)
    s, axes = _cook(a, s, axes)
    a = rfft(a, s[-1], axes[-1], norm)
    for ii in range(len(axes) - 2, -1, -1):
        a = fft(a, s[ii], axes[ii], norm)
    return a


def _irnd(a, s, axes, norm, out, name):
    _no_out(out, name)
    a = _operand(a)
    s, axes = _cook(a, s, axes, invreal=True)
    for ii in range(len(axes) - 1):
        a = ifft(a, s[ii], axes[ii], norm)
    return irfft(a, s[-1], axes[-1], norm)


@implements(np.fft.fftn)
def fftn(a, s=None, axes=None, norm=None, out=None):
    """np.fft.fftn on a traced array."""
    return _nd(fft, a, s, axes, norm, out, "fftn")


@implements(np.fft.ifftn)
def ifftn(a, s=None, axes=None, norm=None, out=None):
    """np.fft.ifftn on a traced array."""
    return _nd(ifft, a, s, axes, norm, out, "ifftn")


@implements(np.fft.fft2)
def fft2(a, s=None, axes=(-2, -1), norm=None, out=None):
    """np.fft.fft2 on a traced array."""
    return _nd(fft, a, s, axes, norm, out, "fft2")


@implements(np.fft.ifft2)
def ifft2(a, s=None, axes=(-2, -1), norm=None, out=None):
    """np.fft.ifft2 on a traced array."""
    return _nd(ifft, a, s, axes, norm, out, "ifft2")


@implements(np.fft.rfftn)
def rfftn(a, s=None, axes=None, norm=None, out=None):
    """np.fft.rfftn on a traced (real) array."""
    return _rnd(a, s, axes, norm, out, "rfftn")


@implements(np.fft.rfft2)
def rfft2(a, s=None, axes=(-2, -1), norm=None, out=None):
    """np.fft.rfft2 on a traced (real) array."""
    return _rnd(a, s, axes, norm, out, "rfft2")


@implements(np.fft.irfftn)
def irfftn(a, s=None, axes=None, norm=None, out=None):
    """np.fft.irfftn on a traced array."""
    return _irnd(a, s, axes, norm, out, "irfftn")


@implements(np.fft.irfft2)
def irfft2(a, s=None, axes=(-2, -1), norm=None, out=None):
    """np.fft.irfft2 on a traced array."""
    return _irnd(a, s, axes, norm, out, "irfft2")


# --- shifts: rolls, as NumPy writes them -------------------------------------------------------
@implements(np.fft.fftshift)
def fftshift(x, axes=None):
    """np.fft.fftshift: the zero frequency moved to the centre (np.roll)."""
    x = _operand(x)
    shape = shape_of(x)
    if axes is None:
        axes = tuple(range(len(shape)))
        shift = [dim // 2 for dim in shape]
    elif isinstance(axes, (int, np.integer)):
        shift = shape[axes] // 2
    else:
        shift = [shape[ax] // 2 for ax in axes]
    return np.roll(x, shift, axes)


@implements(np.fft.ifftshift)
def ifftshift(x, axes=None):
    """np.fft.ifftshift: the inverse of fftshift (np.roll)."""
    x = _operand(x)
    shape = shape_of(x)
    if axes is None:
        axes = tuple(range(len(shape)))
        shift = [-(dim // 2) for dim in shape]
    elif isinstance(axes, (int, np.integer)):
        shift = -(shape[axes] // 2)
    else:
        shift = [-(shape[ax] // 2) for ax in axes]
    return np.roll(x, shift, axes)


# np.fft.fftfreq and rfftfreq are plain arithmetic on n and d (no override protocol): with a
# traced d they are traced as they are.


# --- scipy.fft: the same transforms. SciPy converts its input with np.asarray, so a traced array
# never reaches NumPy's protocols there: these run instead when an argument is traced. -----------
def _scipy_args(name: str, overwrite_x, workers, plan) -> None:
    if plan is not None:
        raise GradtapeError(
            f"scipy.fft.{name}(..., plan=...) cannot be traced; call it without a plan."
        )


def _scipy_one_axis(function, name: str):
    def traced(x, n=None, axis=-1, norm=None, overwrite_x=False, workers=None, *, plan=None):
        _scipy_args(name, overwrite_x, workers, plan)
        return function(x, n, axis, norm)

    traced.__name__ = name
    traced.__doc__ = f"scipy.fft.{name} on a traced array (as np.fft.{name})."
    return traced


def _scipy_nd(function, name: str, default_axes):
    def traced(
        x, s=None, axes=default_axes, norm=None, overwrite_x=False, workers=None, *, plan=None
    ):
        _scipy_args(name, overwrite_x, workers, plan)
        if axes is None and s is not None:  # SciPy transforms the last len(s) axes
            axes = tuple(range(-len(s), 0))
        return function(x, s, axes, norm)

    traced.__name__ = name
    traced.__doc__ = f"scipy.fft.{name} on a traced array (as np.fft.{name})."
    return traced


for _name, _function in (
    ("fft", fft),
    ("ifft", ifft),
    ("rfft", rfft),
    ("irfft", irfft),
    ("hfft", hfft),
    ("ihfft", ihfft),
):
    implements_module_function("scipy.fft", _name)(_scipy_one_axis(_function, _name))
for _name, _function, _axes in (
    ("fftn", fftn, None),
    ("ifftn", ifftn, None),
    ("rfftn", rfftn, None),
    ("irfftn", irfftn, None),
    ("fft2", fft2, (-2, -1)),
    ("ifft2", ifft2, (-2, -1)),
    ("rfft2", rfft2, (-2, -1)),
    ("irfft2", irfft2, (-2, -1)),
):
    implements_module_function("scipy.fft", _name)(_scipy_nd(_function, _name, _axes))
implements_module_function("scipy.fft", "fftshift")(fftshift)
implements_module_function("scipy.fft", "ifftshift")(ifftshift)


def _scipy_no_rule(name: str):
    def traced(*args, **kwargs):
        raise GradtapeError(
            f"gradtape has no derivative rule for scipy.fft.{name}. Define one with "
            "gradtape.custom_vjp, or write it with the transforms gradtape differentiates "
            "(np.fft.fft, rfft, irfft, ...)."
        )

    traced.__name__ = name
    return traced


for _name in (
    "dct",
    "idct",
    "dst",
    "idst",
    "dctn",
    "idctn",
    "dstn",
    "idstn",
    "hfft2",
    "ihfft2",
    "hfftn",
    "ihfftn",
    "fht",
    "ifht",
):
    implements_module_function("scipy.fft", _name)(_scipy_no_rule(_name))
