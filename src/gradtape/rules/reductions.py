"""Reductions and scans: sum, prod, max, min, cumsum, cumprod, and the composites built on them."""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements, implements_ufunc_method
from ..core.tracing import bind
from ._complex import complex_rules
from ._util import (
    batch_shape,
    dtype_of,
    expand_reduced,
    ndim_of,
    normalize_axis,
    shape_of,
    shift_axes,
)


def _no_out(out, name):
    if out is not None:
        raise GradtapeError(f"np.{name}(..., out=...) cannot be traced; assign the result instead.")


# --- sum ------------------------------------------------------------------------------
def _sum_vjp(g, ans, x, axes, keepdims):
    return np.broadcast_to(expand_reduced(g, shape_of(x), axes, keepdims), shape_of(x))


reduce_sum = Primitive(
    "reduce_sum",
    lambda x, axes, keepdims: np.sum(x, axis=axes, keepdims=keepdims),
    vjps=(_sum_vjp,),
    jvp=lambda ts, ans, x, axes, keepdims: _sum_tangent(ts[0], x, axes, keepdims),
    linear=True, jvp_batched=True,
)


def _sum_tangent(t, x, axes, keepdims):
    """Sum a tangent (of x's shape, maybe with leading batch axes) over x's `axes`."""
    return reduce_sum(t, axes=shift_axes(axes, len(batch_shape(t, x))), keepdims=keepdims)


@implements(np.sum)
def sum_(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    _no_out(out, "sum")
    if where is not True or initial is not None:
        raise GradtapeError("np.sum with where= or initial= cannot be traced; use np.where first.")
    axes = normalize_axis(axis, ndim_of(a))
    r = bind(reduce_sum, (a,), {"axes": axes, "keepdims": bool(keepdims)})
    return np.asarray(r, dtype) if dtype is not None and not hasattr(r, "_var") else (
        r.astype(dtype) if dtype is not None else r)


@implements(np.mean)
def mean(a, axis=None, dtype=None, out=None, keepdims=False, where=True):
    _no_out(out, "mean")
    shape = shape_of(a)
    axes = normalize_axis(axis, len(shape))
    count = 1
    for ax in axes:
        count *= shape[ax]
    r = sum_(a, axis=axes, keepdims=keepdims, where=where)
    if dtype_of(a).kind in "iub":
        r = r.astype(np.float64)
    return r / count if dtype is None else (r / count).astype(dtype)


@implements(np.var)
def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=True, mean=None,
        correction=None):
    _no_out(out, "var")
    if correction is not None:
        ddof = correction
    shape = shape_of(a)
    axes = normalize_axis(axis, len(shape))
    count = 1
    for ax in axes:
        count *= shape[ax]
    d = a - globals()["mean"](a, axis=axes, keepdims=True)
    if dtype_of(d).kind == "c":  # |d|^2, a real variance, as NumPy computes it
        sq = np.real(d) * np.real(d) + np.imag(d) * np.imag(d)
    else:
        sq = d * d
    return sum_(sq, axis=axes, keepdims=keepdims) / (count - ddof)


@implements(np.std)
def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=True, mean=None,
        correction=None):
    return np.sqrt(var(a, axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims,
                       correction=correction))


@implements(np.average)
def average(a, axis=None, weights=None, returned=False, *, keepdims=False):
    if weights is None:
        r = mean(a, axis=axis, keepdims=keepdims)
        if returned:
            shape = shape_of(a)
            n = np.prod([shape[i] for i in normalize_axis(axis, len(shape))])
            return r, np.broadcast_to(np.asarray(n, dtype=float), shape_of(r))
        return r
    wshape = shape_of(weights)
    if wshape != shape_of(a):
        if axis is None or len(wshape) != 1:
            raise GradtapeError("np.average: 1-D weights need an axis (as in NumPy).")
        bshape = [1] * ndim_of(a)
        bshape[axis] = wshape[0]
        weights = np.reshape(weights, bshape)
    num = sum_(a * weights, axis=axis, keepdims=keepdims)
    den = sum_(np.broadcast_to(weights, shape_of(a)) if shape_of(weights) != shape_of(a)
               else weights, axis=axis, keepdims=keepdims)
    return (num / den, den) if returned else num / den


@implements(np.nansum)
def nansum(a, axis=None, dtype=None, out=None, keepdims=False, **kw):
    return sum_(np.where(np.isnan(a), 0, a), axis=axis, dtype=dtype, out=out, keepdims=keepdims)


@implements(np.nanmean)
def nanmean(a, axis=None, dtype=None, out=None, keepdims=False, **kw):
    ok = ~np.isnan(a)
    return nansum(a, axis=axis, keepdims=keepdims) / np.sum(ok, axis=axis, keepdims=keepdims)


# --- prod -------------------------------------------------------------------------------
def _prod_of_others(x, axes):
    """For each element, the product of the other elements reduced with it (exact with zeros)."""
    shape = shape_of(x)
    keep = [i for i in range(len(shape)) if i not in axes]
    perm = keep + list(axes)
    xt = np.transpose(x, perm)
    kshape = tuple(shape[i] for i in keep)
    flat = np.reshape(xt, kshape + (-1,))
    ones = np.ones(kshape + (1,), dtype=dtype_of(x))
    left = np.cumprod(np.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
    right = np.cumprod(np.concatenate([ones, flat[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
    others = np.reshape(left * right, shape_of(xt))
    return np.transpose(others, np.argsort(perm))


def _prod_vjp(g, ans, x, axes, keepdims):
    return expand_reduced(g, shape_of(x), axes, keepdims) * _prod_of_others(x, axes)


def _prod_jvp(ts, ans, x, axes, keepdims):
    return _sum_tangent(ts[0] * _prod_of_others(x, axes), x, axes, keepdims)


reduce_prod = Primitive(
    "reduce_prod",
    lambda x, axes, keepdims: np.prod(x, axis=axes, keepdims=keepdims),
    vjps=(_prod_vjp,), jvp=_prod_jvp, jvp_batched=True,
)


@implements(np.prod)
def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    _no_out(out, "prod")
    axes = normalize_axis(axis, ndim_of(a))
    r = bind(reduce_prod, (a,), {"axes": axes, "keepdims": bool(keepdims)})
    return r if initial is None else r * initial


# --- max / min ----------------------------------------------------------------------------
def _extreme_weights(ans, x, axes, keepdims):
    """1/k on each of the k elements that attain the extreme, 0 elsewhere (ties share)."""
    mask = np.equal(x, expand_reduced(ans, shape_of(x), axes, keepdims))
    return mask / np.sum(mask, axis=axes, keepdims=True)


def _extreme_vjp(g, ans, x, axes, keepdims):
    return expand_reduced(g, shape_of(x), axes, keepdims) * _extreme_weights(ans, x, axes,
                                                                             keepdims)


def _extreme_jvp(ts, ans, x, axes, keepdims):
    return _sum_tangent(ts[0] * _extreme_weights(ans, x, axes, keepdims), x, axes, keepdims)


reduce_max = Primitive("reduce_max", lambda x, axes, keepdims: np.max(x, axis=axes,
                                                                      keepdims=keepdims),
                       vjps=(_extreme_vjp,), jvp=_extreme_jvp, jvp_batched=True)
reduce_min = Primitive("reduce_min", lambda x, axes, keepdims: np.min(x, axis=axes,
                                                                      keepdims=keepdims),
                       vjps=(_extreme_vjp,), jvp=_extreme_jvp, jvp_batched=True)


@implements(np.max, np.amax)
def max_(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    _no_out(out, "max")
    r = bind(reduce_max, (a,), {"axes": normalize_axis(axis, ndim_of(a)),
                                "keepdims": bool(keepdims)})
    return r if initial is None else np.maximum(r, initial)


@implements(np.min, np.amin)
def min_(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    _no_out(out, "min")
    r = bind(reduce_min, (a,), {"axes": normalize_axis(axis, ndim_of(a)),
                                "keepdims": bool(keepdims)})
    return r if initial is None else np.minimum(r, initial)


@implements(np.nanmax)
def nanmax(a, axis=None, out=None, keepdims=False, **kw):
    return max_(np.where(np.isnan(a), -np.inf, a), axis=axis, keepdims=keepdims)


@implements(np.nanmin)
def nanmin(a, axis=None, out=None, keepdims=False, **kw):
    return min_(np.where(np.isnan(a), np.inf, a), axis=axis, keepdims=keepdims)


# --- cumulative ----------------------------------------------------------------------------
def _reverse_cumsum(g, axis):
    idx = (slice(None),) * axis + (slice(None, None, -1),)
    return np.cumsum(g[idx], axis=axis)[idx]


cumsum_p = Primitive(
    "cumsum", lambda x, axis: np.cumsum(x, axis=axis),
    vjps=(lambda g, ans, x, axis: _reverse_cumsum(g, axis),),
    jvp=lambda ts, ans, x, axis: cumsum_p(ts[0], axis=axis + len(batch_shape(ts[0], x))),
    linear=True, jvp_batched=True,
)


def _cumprod_vjp(g, ans, x, axis):
    """sum_{j>=i} g_j prod_{k<=j, k!=i} x_k: exact, to every order, also where x has zeros."""
    is_zero = x == 0
    if not np.any(is_zero):  # the quotient form is exact (when staging: a guard)
        return _reverse_cumsum(g * ans, axis) / x
    # Before a lane's first zero the quotient form is exact. From that zero on, every product
    # of the others holds its factor except its own: take the factor out (set it to 1) and
    # recurse, with one zero fewer per lane.
    zeros_so_far = np.cumsum(is_zero, axis=axis)
    before = zeros_so_far == 0
    first_zero = (zeros_so_far == 1) & is_zero
    x1 = np.where(first_zero, 1, x)
    zero_factor = np.sum(np.where(first_zero, x, 0), axis=axis, keepdims=True)
    rest = _cumprod_vjp(g, np.cumprod(x1, axis=axis), x1, axis)
    quotient = _reverse_cumsum(g * ans, axis) / np.where(before, x, 1)
    return np.where(before, quotient, np.where(first_zero, 1, zero_factor) * rest)


def _cumprod_jvp(ts, ans, x, axis):
    """sum_{i<=j} t_i prod_{k<=j, k!=i} x_k, exact where x has zeros (t / x was nan there)."""
    t = ts[0]
    ax = axis + len(batch_shape(t, x))
    is_zero = x == 0
    if not np.any(is_zero):  # the quotient form is exact (when staging: a guard)
        return ans * cumsum_p(t / x, axis=ax)
    # Before a lane's first zero, the quotient form. From it on, every term but the one of the
    # first zero holds that zero as a factor: t at the first zero times the product of the rest.
    zeros_so_far = np.cumsum(is_zero, axis=axis)
    before = zeros_so_far == 0
    first_zero = (zeros_so_far == 1) & is_zero
    quotient = ans * cumsum_p(np.where(before, t / np.where(before, x, 1), 0), axis=ax)
    t_zero = np.sum(np.where(first_zero, t, 0), axis=ax, keepdims=True)
    return np.where(before, quotient, t_zero * np.cumprod(np.where(first_zero, 1, x), axis=axis))


cumprod_p = Primitive(
    "cumprod", lambda x, axis: np.cumprod(x, axis=axis),
    vjps=(_cumprod_vjp,), jvp=_cumprod_jvp, jvp_batched=True,
)


def _cumulative(prim, a, axis):
    if axis is None:
        a, axis = np.ravel(a), 0
    return bind(prim, (a,), {"axis": int(axis) % max(ndim_of(a), 1)})


@implements(np.cumsum)
def cumsum(a, axis=None, dtype=None, out=None):
    _no_out(out, "cumsum")
    return _cumulative(cumsum_p, a, axis)


@implements(np.cumprod)
def cumprod(a, axis=None, dtype=None, out=None):
    _no_out(out, "cumprod")
    return _cumulative(cumprod_p, a, axis)


# --- no derivative: arg-reductions and predicates (recorded when staging) ----------------------
def _nondiff_function(func, name):
    prim = Primitive(name, func, nondiff=True)

    @implements(func)
    def impl(*args, **kwargs):
        return bind(prim, args, kwargs)

    return prim


for _f in (np.argmax, np.argmin, np.argsort, np.any, np.all, np.count_nonzero, np.nonzero,
           np.searchsorted, np.isclose, np.allclose, np.array_equal, np.argwhere, np.flatnonzero,
           np.isnan, np.sign):
    if hasattr(_f, "__name__") and not isinstance(_f, np.ufunc):
        _nondiff_function(_f, _f.__name__)


# --- ufunc methods: np.add.reduce is np.sum, np.multiply.accumulate is np.cumprod, ... ---------
def _ufunc_reduction(ufunc, function) -> None:
    def reduce(a, axis=0, dtype=None, out=None, keepdims=False, **unsupported):
        return function(a, axis=axis, keepdims=keepdims)

    implements_ufunc_method(ufunc, "reduce")(reduce)


def _ufunc_accumulation(ufunc, function) -> None:
    implements_ufunc_method(ufunc, "accumulate")(
        lambda a, axis=0, dtype=None, out=None, **unsupported: function(a, axis=axis))


for _ufunc, _function in ((np.add, np.sum), (np.multiply, np.prod), (np.maximum, np.max),
                          (np.minimum, np.min)):
    _ufunc_reduction(_ufunc, _function)
for _ufunc, _function in ((np.add, np.cumsum), (np.multiply, np.cumprod)):
    _ufunc_accumulation(_ufunc, _function)


# Sums, products and cumulative sums are holomorphic (polynomial) in each element: their rules
# hold for complex values as written. max and min order complex numbers lexicographically:
# refused.
complex_rules("reduce_sum", "reduce_prod", "cumsum", "cumprod")
