"""Sequences and grids: diff, ediff1d, gradient, trapezoid, cumulative_sum/prod, linspace,
logspace, geomspace, meshgrid, interp, convolve, correlate, cross.

Most are compositions of differentiable primitives written as NumPy writes them (the same
operations in the same order), so the values are NumPy's to the last bit and every mode of
differentiation, compile and higher orders come for free. convolve and correlate are one
primitive each, whose derivatives are correlations.
"""

from __future__ import annotations

import functools
import operator
import warnings

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements
from ..core.tracing import bind
from ._util import dtype_of, ndim_of, shape_of
from .indexing import getitem
from .reductions import _any_true, _astype
from .stop import stop_gradient


def _array(x):
    """A Tracer as it is, anything else as an ndarray."""
    return x if hasattr(x, "_var") else np.asanyarray(x)


def _is_traced(x) -> bool:
    return hasattr(x, "_var")


def _normalize_axis(axis, ndim):
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim


def _no_complex(name, *xs):
    if any(dtype_of(_array(x)).kind == "c" for x in xs if x is not None):
        raise GradtapeError(
            f"np.{name} of complex values cannot be traced: gradtape "
            "differentiates real functions. Split real and imaginary parts."
        )


# --- differences ------------------------------------------------------------------------------
@implements(np.diff)
def diff(a, n=1, axis=-1, prepend=np._NoValue, append=np._NoValue):
    """np.diff: slices subtracted, as NumPy does (not_equal for booleans)."""
    if n == 0:
        return a
    if n < 0:
        raise ValueError("order must be non-negative but got " + repr(n))
    a = _array(a)
    nd = ndim_of(a)
    if nd == 0:
        raise ValueError("diff requires input that is at least one dimensional")
    axis = _normalize_axis(axis, nd)
    combined = []
    for extra in (prepend, None, append):
        if extra is None:
            combined.append(a)
            continue
        if extra is np._NoValue:
            continue
        extra = _array(extra)
        if ndim_of(extra) == 0:
            shape = list(shape_of(a))
            shape[axis] = 1
            extra = np.broadcast_to(extra, tuple(shape))
        combined.append(extra)
    if len(combined) > 1:
        a = np.concatenate(combined, axis)
    hi = (slice(None),) * axis + (slice(1, None),)
    lo = (slice(None),) * axis + (slice(None, -1),)
    op = np.not_equal if dtype_of(a) == np.bool_ else np.subtract
    for _ in range(n):
        a = op(a[hi], a[lo])
    return a


@implements(np.ediff1d)
def ediff1d(ary, to_end=None, to_begin=None):
    """np.ediff1d: differences of the flattened array, with values before and after."""
    ary = np.ravel(_array(ary))
    dtype = dtype_of(ary)
    d = ary[1:] - ary[:-1]
    if to_begin is None and to_end is None:
        return d
    parts = []
    for extra in (to_begin, d, to_end):
        if extra is d:
            parts.append(d)
            continue
        if extra is None:
            continue
        extra = _array(extra)
        if not np.can_cast(dtype_of(extra), dtype, casting="same_kind"):
            raise TypeError(
                "dtype of `to_begin` must be compatible with input `ary` under "
                "the `same_kind` rule."
            )
        parts.append(_astype(np.ravel(extra), dtype))
    return np.concatenate(parts)


@implements(np.gradient)
def gradient(f, *varargs, axis=None, edge_order=1):
    """np.gradient: NumPy's second-order differences, in NumPy's order of operations.

    Traced coordinates are differentiated through the non-uniform formula (its value is
    NumPy's where the spacing is uniform), so their derivative is right everywhere.
    """
    f = _array(f)
    nd = ndim_of(f)
    axes = (
        tuple(range(nd))
        if axis is None
        else tuple(_normalize_axis(ax, nd) for ax in ((axis,) if np.ndim(axis) == 0 else axis))
    )
    if len(set(axes)) != len(axes):
        raise ValueError("repeated axis")
    n = len(varargs)
    if n == 0:
        dx = [1.0] * len(axes)
    elif n == 1 and np.ndim(varargs[0]) == 0:
        dx = list(varargs) * len(axes)
    elif n == len(axes):
        dx = []
        for i, distances in enumerate(varargs):
            distances = _array(distances)
            if ndim_of(distances) == 0:
                dx.append(distances)
                continue
            if ndim_of(distances) != 1:
                raise ValueError("distances must be either scalars or 1d")
            if shape_of(distances)[0] != shape_of(f)[axes[i]]:
                raise ValueError(
                    "when 1d, distances must match the length of the corresponding dimension"
                )
            if dtype_of(distances).kind in "iub":
                distances = _astype(distances, np.float64)
            diffx = diff(distances)
            # a traced spacing: bool() records a guard, so a compiled replay checks it
            dx.append(("coordinates", diffx, bool(np.all(diffx == diffx[0]))))
    else:
        raise TypeError("invalid number of arguments")
    if edge_order > 2:
        raise ValueError("'edge_order' greater than 2 not supported")
    if dtype_of(f).kind not in "fc":
        f = _astype(f, np.float64)
    outvals = []
    for ax, ax_dx in zip(axes, dx):
        if shape_of(f)[ax] < edge_order + 1:
            raise ValueError(
                "Shape of array too small to calculate a numerical gradient, "
                "at least (edge_order + 1) elements are required."
            )
        if isinstance(ax_dx, tuple):
            _, diffx, uniform = ax_dx
            if not uniform:
                out = _gradient_axis(f, ax, diffx, edge_order, False)
            elif not _is_traced(diffx):
                out = _gradient_axis(f, ax, diffx[0], edge_order, True)
            else:  # NumPy's value (uniform formula), the derivative of the general one
                general = _gradient_axis(f, ax, diffx, edge_order, False)
                value = _gradient_axis(f, ax, diffx[0], edge_order, True)
                out = np.where(np.isfinite(value), general + stop_gradient(value - general), value)
        else:
            out = _gradient_axis(f, ax, ax_dx, edge_order, True)
        outvals.append(out)
    return outvals[0] if len(axes) == 1 else tuple(outvals)


def _gradient_axis(f, axis, ax_dx, edge_order, uniform):
    nd = ndim_of(f)

    def at(s):
        return f[(slice(None),) * axis + (s,)]

    def along(c):  # a 1-D array of coefficients, shaped to broadcast along `axis`
        shape = [1] * nd
        shape[axis] = -1
        return np.reshape(c, tuple(shape))

    if uniform:
        interior = (at(slice(2, None)) - at(slice(None, -2))) / (2.0 * ax_dx)
    else:
        dx1, dx2 = ax_dx[0:-1], ax_dx[1:]
        a = -(dx2) / (dx1 * (dx1 + dx2))
        b = (dx2 - dx1) / (dx1 * dx2)
        c = dx1 / (dx2 * (dx1 + dx2))
        interior = (
            along(a) * at(slice(None, -2))
            + along(b) * at(slice(1, -1))
            + along(c) * at(slice(2, None))
        )
    if edge_order == 1:
        dx_0 = ax_dx if uniform else ax_dx[0]
        dx_n = ax_dx if uniform else ax_dx[-1]
        first = (at(slice(1, 2)) - at(slice(0, 1))) / dx_0
        last = (at(slice(-1, None)) - at(slice(-2, -1))) / dx_n
    else:
        if uniform:
            a, b, c = -1.5 / ax_dx, 2.0 / ax_dx, -0.5 / ax_dx
        else:
            dx1, dx2 = ax_dx[0], ax_dx[1]
            a = -(2.0 * dx1 + dx2) / (dx1 * (dx1 + dx2))
            b = (dx1 + dx2) / (dx1 * dx2)
            c = -dx1 / (dx2 * (dx1 + dx2))
        first = a * at(slice(0, 1)) + b * at(slice(1, 2)) + c * at(slice(2, 3))
        if uniform:
            a, b, c = 0.5 / ax_dx, -2.0 / ax_dx, 1.5 / ax_dx
        else:
            dx1, dx2 = ax_dx[-2], ax_dx[-1]
            a = (dx2) / (dx1 * (dx1 + dx2))
            b = -(dx2 + dx1) / (dx1 * dx2)
            c = (2.0 * dx2 + dx1) / (dx2 * (dx1 + dx2))
        last = a * at(slice(-3, -2)) + b * at(slice(-2, -1)) + c * at(slice(-1, None))
    dt = dtype_of(f)
    return np.concatenate([_astype(p, dt) for p in (first, interior, last)], axis=axis)


@implements(*(getattr(np, name) for name in ("trapezoid", "trapz") if hasattr(np, name)))
def trapezoid(y, x=None, dx=1.0, axis=-1):
    """np.trapezoid: the trapezoidal rule, differentiable in y, x and dx."""
    y = _array(y)
    nd = ndim_of(y)
    axis = _normalize_axis(axis, nd)
    if x is None:
        d = dx
    else:
        x = _array(x)
        if ndim_of(x) == 1:
            d = diff(x)
            shape = [1] * nd
            shape[axis] = shape_of(d)[0]
            d = np.reshape(d, tuple(shape))
        else:
            d = diff(x, axis=axis)
    hi = (slice(None),) * axis + (slice(1, None),)
    lo = (slice(None),) * axis + (slice(None, -1),)
    return np.sum(d * (y[hi] + y[lo]) / 2.0, axis=axis)


def _cumulative(function, identity, x, axis, dtype, out, include_initial, name):
    if out is not None:
        raise GradtapeError(f"np.{name}(..., out=...) cannot be traced; assign the result.")
    x = _array(x)
    if ndim_of(x) == 0:
        raise ValueError("The input must be at least 1-D (got a 0-d array).")
    if axis is None:
        if ndim_of(x) > 1:
            raise ValueError(
                "For arrays which have more than one dimension ``axis`` argument is required."
            )
        axis = 0
    axis = _normalize_axis(axis, ndim_of(x))
    r = function(x, axis=axis, dtype=dtype)
    if not include_initial:
        return r
    shape = list(shape_of(r))
    shape[axis] = 1
    return np.concatenate([np.full(tuple(shape), identity, dtype_of(r)), r], axis=axis)


if hasattr(np, "cumulative_sum"):

    @implements(np.cumulative_sum)
    def cumulative_sum(x, /, *, axis=None, dtype=None, out=None, include_initial=False):
        """np.cumulative_sum (NumPy 2): np.cumsum with an optional leading zero."""
        return _cumulative(np.cumsum, 0, x, axis, dtype, out, include_initial, "cumulative_sum")

    @implements(np.cumulative_prod)
    def cumulative_prod(x, /, *, axis=None, dtype=None, out=None, include_initial=False):
        """np.cumulative_prod (NumPy 2): np.cumprod with an optional leading one."""
        return _cumulative(np.cumprod, 1, x, axis, dtype, out, include_initial, "cumulative_prod")


# --- grids ------------------------------------------------------------------------------------
def _result_inexact(*xs):
    dt = np.result_type(
        *(dtype_of(x) if _is_traced(x) or isinstance(x, np.ndarray) else x for x in xs)
    )
    return dt if dt.kind in "fc" else np.result_type(dt, np.float64)


@implements(np.linspace)
def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0, *, device=None):
    """np.linspace with traced endpoints: NumPy's arithmetic, differentiable in both ends."""
    num = operator.index(num)
    if num < 0:
        raise ValueError(f"Number of samples, {num}, must be non-negative.")
    div = (num - 1) if endpoint else num
    dt = _result_inexact(start, stop)
    _no_complex("linspace", start, stop)
    start = _astype(_array(start), dt)
    stop = _astype(_array(stop), dt)
    integer_dtype = dtype is not None and np.issubdtype(dtype, np.integer)
    dtype = dt if dtype is None else np.dtype(dtype)
    delta = np.subtract(stop, start)
    y = np.arange(0, num, dtype=dt).reshape((-1,) + (1,) * ndim_of(delta))
    if div > 0:
        step = delta / div
        any_zero = np.any(step == 0)
        y = np.where(any_zero, (y / div) * delta, y * step)
    else:
        step = np.nan
        y = y * delta
    y = y + start
    if endpoint and num > 1:
        y[-1, ...] = stop
    if axis != 0:
        y = np.moveaxis(y, 0, axis)
    if integer_dtype:
        y = np.floor(y)
    y = _astype(y, dtype)
    return (y, step) if retstep else y


@implements(np.logspace)
def logspace(start, stop, num=50, endpoint=True, base=10.0, dtype=None, axis=0):
    """np.logspace: base ** linspace(start, stop), differentiable in the ends and the base."""
    if not isinstance(base, (float, int)) and np.ndim(base):
        ndmax = len(np.broadcast_shapes(shape_of(start), shape_of(stop), shape_of(base)))
        start, stop, base = (
            np.reshape(_array(a), (1,) * (ndmax - ndim_of(a)) + shape_of(a))
            for a in (start, stop, base)
        )
        base = np.expand_dims(base, axis=axis)
    y = linspace(start, stop, num=num, endpoint=endpoint, axis=axis)
    r = np.power(base, y)
    return r if dtype is None else _astype(r, dtype)


@implements(np.geomspace)
def geomspace(start, stop, num=50, endpoint=True, dtype=None, axis=0):
    """np.geomspace: NumPy's logarithmic spacing, with the exact ends, differentiable in both."""
    start, stop = _array(start), _array(stop)
    _no_complex("geomspace", start, stop)
    if _any_true(np.equal(start, 0)) or _any_true(np.equal(stop, 0)):
        raise ValueError("Geometric sequence cannot include zero")
    dt = np.result_type(dtype_of(start), dtype_of(stop), float(num), np.zeros((), dtype).dtype)
    dtype = dt if dtype is None else np.dtype(dtype)
    start = _astype(start, dt)
    stop = _astype(stop, dt)
    out_sign = np.sign(start)
    start = start / out_sign
    stop = stop / out_sign
    result = logspace(
        np.log10(start), np.log10(stop), num=num, endpoint=endpoint, base=10.0, dtype=dt
    )
    if not _is_traced(result):
        result = np.array(result)
    if num > 0:
        result[0] = start
        if num > 1 and endpoint:
            result[-1] = stop
    result = result * out_sign
    if axis != 0:
        result = np.moveaxis(result, 0, axis)
    return _astype(result, dtype)


@implements(np.meshgrid)
def meshgrid(*xi, copy=True, sparse=False, indexing="xy"):
    """np.meshgrid: reshapes and broadcasts (differentiable in every coordinate array)."""
    ndim = len(xi)
    if indexing not in ["xy", "ij"]:
        raise ValueError("Valid values for `indexing` are 'xy' and 'ij'.")
    s0 = (1,) * ndim
    output = [np.reshape(_array(x), s0[:i] + (-1,) + s0[i + 1 :]) for i, x in enumerate(xi)]
    if indexing == "xy" and ndim > 1:
        output[0] = np.reshape(output[0], (1, -1) + s0[2:])
        output[1] = np.reshape(output[1], (-1, 1) + s0[2:])
    if not sparse:
        output = np.broadcast_arrays(*output)
    return tuple(output)


# --- interp -----------------------------------------------------------------------------------
@implements(np.interp)
def interp(x, xp, fp, left=None, right=None, period=None):
    """np.interp: piecewise linear, differentiable in x, xp, fp, left and right.

    The value is NumPy's (its slope formula and branches). At a breakpoint the derivative with
    respect to x is the slope of the segment to its right (0 past the last point, where NumPy
    returns fp[-1]).
    """
    _no_complex("interp", fp)
    x = _astype(_array(x), np.float64)
    xp = _astype(_array(xp), np.float64)
    fp = _astype(_array(fp), np.float64)
    if period is not None:
        if _any_true(np.equal(period, 0)):
            raise ValueError("period must be a non-zero value")
        period = np.abs(period)
        left = right = None
        if ndim_of(xp) != 1 or ndim_of(fp) != 1:
            raise ValueError("Data points must be 1-D sequences")
        if shape_of(xp)[0] != shape_of(fp)[0]:
            raise ValueError("fp and xp are not of the same length")
        x = x % period
        xp = xp % period
        order = np.argsort(xp)
        xp = getitem(xp, order)
        fp = getitem(fp, order)
        xp = np.concatenate((xp[-1:] - period, xp, xp[0:1] + period))
        fp = np.concatenate((fp[-1:], fp, fp[0:1]))
    if ndim_of(xp) != 1 or ndim_of(fp) != 1:
        raise ValueError("object of too small depth for desired array")
    n = shape_of(xp)[0]
    if shape_of(fp)[0] != n:
        raise ValueError("fp and xp are not of the same length.")
    if n == 0:
        raise ValueError("array of sample points is empty")
    lval = fp[0] if left is None else _astype(_array(left), np.float64)
    rval = fp[-1] if right is None else _astype(_array(right), np.float64)
    if n == 1:
        return np.where(x < xp[0], lval, np.where(x > xp[0], rval, fp[0]))  # NaN: fp[0]
    j = np.searchsorted(xp, x, side="right") - 1
    jc = np.clip(j, 0, n - 2)
    # getitem: xp and fp may be constants indexed by traced positions (compile)
    x0, x1 = getitem(xp, jc), getitem(xp, jc + 1)
    f0, f1 = getitem(fp, jc), getitem(fp, jc + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (f1 - f0) / (x1 - x0)
        r = slope * (x - x0) + f0
        r = np.where(np.isnan(r), slope * (x - x1) + f1, r)
        r = np.where(np.isnan(r) & (f0 == f1), f0, r)
        # NumPy returns fp[j] at a breakpoint (also where the slope is not finite)
        r = np.where((x == x0) & ~np.isfinite(r), f0, r)
    r = np.where(j == n - 1, fp[-1], r)
    r = np.where(x > xp[-1], rval, r)
    r = np.where(x < xp[0], lval, r)
    return np.where(np.isnan(x), x, r)


# --- convolve and correlate -------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _mode_offset(kind: str, n: int, m: int, mode: str) -> int:
    """Where NumPy's `mode` output starts inside the full output (found once per lengths)."""
    rng = np.random.default_rng(0)
    a, v = rng.random(n) + 1, rng.random(m) + 1
    fn = np.convolve if kind == "convolve" else np.correlate
    full, part = fn(a, v, "full"), fn(a, v, mode)
    for s in range(len(full) - len(part) + 1):
        if np.allclose(full[s : s + len(part)], part, rtol=1e-12, atol=0):
            return s
    raise AssertionError(f"np.{kind} mode {mode!r} is not a slice of the full output")


def _full_cotangent(kind, g, n, m, mode):
    total = n + m - 1
    s = _mode_offset(kind, n, m, mode)
    return np.pad(g, (s, total - s - shape_of(g)[0]))


def _conv_vjp(i, g, ans, a, v, kind, mode):
    n, m = shape_of(a)[0], shape_of(v)[0]
    gf = _full_cotangent(kind, g, n, m, mode)
    if kind == "convolve":
        return np.correlate(gf, v if i == 0 else a, "valid")
    if i == 0:
        return np.correlate(gf, v[::-1], "valid")
    return np.correlate(gf, a, "valid")[::-1]


def _conv_jvp(ts, ans, a, v, kind, mode):
    out = None
    if ts[0] is not None:
        out = convolution_p(ts[0], v, kind=kind, mode=mode)
    if ts[1] is not None:
        t = convolution_p(a, ts[1], kind=kind, mode=mode)
        out = t if out is None else out + t
    return out


convolution_p = Primitive(
    "convolution",
    lambda a, v, kind, mode: (np.convolve if kind == "convolve" else np.correlate)(a, v, mode),
    vjps=(
        lambda g, ans, a, v, kind, mode: _conv_vjp(0, g, ans, a, v, kind, mode),
        lambda g, ans, a, v, kind, mode: _conv_vjp(1, g, ans, a, v, kind, mode),
    ),
    jvp=_conv_jvp,
)


def _convolution(kind, a, v, mode):
    a, v = _array(a), _array(v)
    _no_complex(kind, a, v)
    a = np.reshape(a, (1,)) if ndim_of(a) == 0 else a
    v = np.reshape(v, (1,)) if ndim_of(v) == 0 else v
    if ndim_of(a) != 1 or ndim_of(v) != 1:
        raise ValueError("object too deep for desired array")
    if shape_of(a)[0] == 0 or shape_of(v)[0] == 0:
        raise ValueError(f"{'a' if shape_of(a)[0] == 0 else 'v'} cannot be empty")
    if mode not in ("full", "same", "valid"):
        raise ValueError(f"mode must be one of 'valid', 'same', or 'full' (got {mode!r})")
    dt = np.result_type(dtype_of(a), dtype_of(v))
    return bind(convolution_p, (_astype(a, dt), _astype(v, dt)), {"kind": kind, "mode": mode})


@implements(np.convolve)
def convolve(a, v, mode="full"):
    """np.convolve: one primitive; its derivatives are correlations."""
    return _convolution("convolve", a, v, mode)


@implements(np.correlate)
def correlate(a, v, mode="valid"):
    """np.correlate: one primitive; its derivatives are correlations and convolutions."""
    return _convolution("correlate", a, v, mode)


# --- cross ------------------------------------------------------------------------------------
@implements(np.cross)
def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """np.cross: NumPy's component formulas (2- and 3-vectors, broadcast)."""
    if axis is not None:
        axisa, axisb, axisc = (axis,) * 3
    a, b = _array(a), _array(b)
    _no_complex("cross", a, b)
    if ndim_of(a) < 1 or ndim_of(b) < 1:
        raise ValueError("At least one array has zero dimension")
    a = np.moveaxis(a, _normalize_axis(axisa, ndim_of(a)), -1)
    b = np.moveaxis(b, _normalize_axis(axisb, ndim_of(b)), -1)
    na, nb = shape_of(a)[-1], shape_of(b)[-1]
    if na not in (2, 3) or nb not in (2, 3):
        raise ValueError("incompatible dimensions for cross product\n(dimension must be 2 or 3)")
    if na == 2 or nb == 2:
        warnings.warn(
            "Arrays of 2-dimensional vectors are deprecated. Use arrays of "
            "3-dimensional vectors instead. (deprecated in NumPy 2.0)",
            DeprecationWarning,
            stacklevel=2,
        )
    dt = np.promote_types(dtype_of(a), dtype_of(b))
    a, b = _astype(a, dt), _astype(b, dt)
    a0, a1, b0, b1 = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
    if na == 2 and nb == 2:
        return a0 * b1 - a1 * b0
    if na == 2:
        b2 = b[..., 2]
        parts = (a1 * b2, -(a0 * b2), a0 * b1 - a1 * b0)
    elif nb == 2:
        a2 = a[..., 2]
        parts = (-(a2 * b1), a2 * b0, a0 * b1 - a1 * b0)
    else:
        a2, b2 = a[..., 2], b[..., 2]
        parts = (a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0)
    shape = np.broadcast_shapes(*(shape_of(p) for p in parts))
    cp = np.stack([np.broadcast_to(p, shape) for p in parts], axis=-1)
    return np.moveaxis(cp, -1, _normalize_axis(axisc, ndim_of(cp)))


if hasattr(np.linalg, "cross"):

    @implements(np.linalg.cross)
    def linalg_cross(x1, x2, /, *, axis=-1):
        """np.linalg.cross: 3-vectors only (as NumPy)."""
        if shape_of(x1)[axis] != 3 or shape_of(x2)[axis] != 3:
            raise ValueError(
                "Both input arrays must be (arrays of) 3-dimensional vectors, "
                f"but they are {shape_of(x1)[axis]} and {shape_of(x2)[axis]} "
                "dimensional instead."
            )
        return cross(x1, x2, axis=axis)
