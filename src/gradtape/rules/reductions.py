"""Reductions and scans: sum, prod, max, min, cumsum, cumprod, and the composites built on them."""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements, implements_ufunc_method
from ..core.tracing import Tracer, bind
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
from .stop import stop_gradient


def _no_out(out, name):
    if out is not None:
        raise GradtapeError(f"np.{name}(..., out=...) cannot be traced; assign the result instead.")


# --- sum ------------------------------------------------------------------------------
_SMALL = 4096  # elements: filling an array costs less than making a broadcast view below this
_add_reduce = np.add.reduce  # (np.sum's Python wrapper costs more than the sum at small sizes)
_ndarray = np.ndarray


def _sum_vjp(g, ans, x, axes, keepdims):
    shape = shape_of(x)
    if type(g) is _ndarray and g.ndim == 0 or isinstance(g, np.generic):
        # the whole array summed (the common case): one value everywhere
        size = 1
        for d in shape:
            size *= d
        if size <= _SMALL:
            out = np.empty(shape, g.dtype)
            out[...] = g
            return out
        # larger: a read-only view repeating the value, as np.broadcast_to makes, without
        # its Python
        one = g if type(g) is _ndarray else np.asarray(g)
        out = _ndarray(shape, one.dtype, buffer=one, strides=(0,) * len(shape))
        out.flags.writeable = False
        return out
    return np.broadcast_to(expand_reduced(g, shape, axes, keepdims), shape)


def _sum_impl(x, axes, keepdims):
    if type(x) is _ndarray:
        return _add_reduce(x, axis=axes, keepdims=keepdims)
    return np.sum(x, axis=axes, keepdims=keepdims)


reduce_sum = Primitive(
    "reduce_sum",
    _sum_impl,
    vjps=(_sum_vjp,),
    jvp=lambda ts, ans, x, axes, keepdims: _sum_tangent(ts[0], x, axes, keepdims),
    linear=True,
    jvp_batched=True,
)


def _sum_tangent(t, x, axes, keepdims):
    """Sum a tangent (of x's shape, maybe with leading batch axes) over x's `axes`."""
    return reduce_sum(t, axes=shift_axes(axes, len(batch_shape(t, x))), keepdims=keepdims)


@implements(np.sum)
def sum_(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    _no_out(out, "sum")
    if where is not True or initial is not None or dtype is not None:
        return _sum_masked(a, axis, dtype, keepdims, initial, where)
    axes = normalize_axis(axis, ndim_of(a))
    r = bind(reduce_sum, (a,), {"axes": axes, "keepdims": bool(keepdims)})
    return (
        np.asarray(r, dtype)
        if dtype is not None and not hasattr(r, "_var")
        else (r.astype(dtype) if dtype is not None else r)
    )


@implements(np.mean)
def mean(a, axis=None, dtype=None, out=None, keepdims=False, where=True):
    _no_out(out, "mean")
    shape = shape_of(a)
    axes = normalize_axis(axis, len(shape))
    count = 1
    for ax in axes:
        count *= shape[ax]
    if where is not True or count == 0 or dtype is not None:
        return _mean_masked(a, axes, dtype, keepdims, where)
    r = sum_(a, axis=axes, keepdims=keepdims, where=where)
    if dtype_of(a).kind in "iub":
        r = r.astype(np.float64)
    return r / count if dtype is None else (r / count).astype(dtype)


@implements(np.var)
def var(
    a,
    axis=None,
    dtype=None,
    out=None,
    ddof=0,
    keepdims=False,
    where=True,
    mean=None,
    correction=None,
):
    _no_out(out, "var")
    if correction is not None:
        ddof = correction
    shape = shape_of(a)
    axes = normalize_axis(axis, len(shape))
    count = 1
    for ax in axes:
        count *= shape[ax]
    if where is not True or mean is not None or count - ddof <= 0 or dtype is not None:
        return _var_masked(a, axes, dtype, ddof, keepdims, where, mean)
    d = a - globals()["mean"](a, axis=axes, keepdims=True)
    if dtype_of(d).kind == "c":  # |d|^2, a real variance, as NumPy computes it
        sq = np.real(d) * np.real(d) + np.imag(d) * np.imag(d)
    else:
        sq = d * d
    return sum_(sq, axis=axes, keepdims=keepdims) / (count - ddof)


@implements(np.std)
def std(
    a,
    axis=None,
    dtype=None,
    out=None,
    ddof=0,
    keepdims=False,
    where=True,
    mean=None,
    correction=None,
):
    v = var(
        a,
        axis=axis,
        dtype=dtype,
        out=out,
        ddof=ddof,
        keepdims=keepdims,
        correction=correction,
        where=where,
        mean=mean,
    )
    shape = shape_of(a)
    count = 1
    for ax in normalize_axis(axis, len(shape)):
        count *= shape[ax]
    if count == 1 and (correction if correction is not None else ddof) == 0:
        if where is True and mean is None:
            # the deviation of one element from its own mean is 0 for every input: the
            # standard deviation is constant, and each of its derivatives is exactly 0 (the
            # square root's derivative at 0 would make them NaN); the value stays NumPy's
            # (NaN for an infinite element)
            return np.sqrt(stop_gradient(v))
    return np.sqrt(v)


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
    den = sum_(
        np.broadcast_to(weights, shape_of(a)) if shape_of(weights) != shape_of(a) else weights,
        axis=axis,
        keepdims=keepdims,
    )
    return (num / den, den) if returned else num / den


# --- prod -------------------------------------------------------------------------------
def _prod_of_others(x, axes):
    """For each element, the product of the other elements reduced with it (exact with zeros)."""
    shape = shape_of(x)
    if 0 in shape:  # an empty product: nothing to differentiate
        return np.zeros_like(x)
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
    vjps=(_prod_vjp,),
    jvp=_prod_jvp,
    jvp_batched=True,
)


@implements(np.prod)
def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    _no_out(out, "prod")
    a = a if dtype is None else _astype(a, dtype)
    axes = normalize_axis(axis, ndim_of(a))
    if where is not True:
        a = _where_mask(a, where, 1)
    r = bind(reduce_prod, (a,), {"axes": axes, "keepdims": bool(keepdims)})
    return r if initial is None else r * initial


# --- max / min ----------------------------------------------------------------------------
def _extreme_weights(ans, x, axes, keepdims):
    """1/k on each of the k elements that attain the extreme, 0 elsewhere (ties share)."""
    mask = np.equal(x, expand_reduced(ans, shape_of(x), axes, keepdims))
    return mask / np.sum(mask, axis=axes, keepdims=True)


def _extreme_vjp(g, ans, x, axes, keepdims):
    return expand_reduced(g, shape_of(x), axes, keepdims) * _extreme_weights(ans, x, axes, keepdims)


def _extreme_jvp(ts, ans, x, axes, keepdims):
    return _sum_tangent(ts[0] * _extreme_weights(ans, x, axes, keepdims), x, axes, keepdims)


reduce_max = Primitive(
    "reduce_max",
    lambda x, axes, keepdims: np.max(x, axis=axes, keepdims=keepdims),
    vjps=(_extreme_vjp,),
    jvp=_extreme_jvp,
    jvp_batched=True,
)
reduce_min = Primitive(
    "reduce_min",
    lambda x, axes, keepdims: np.min(x, axis=axes, keepdims=keepdims),
    vjps=(_extreme_vjp,),
    jvp=_extreme_jvp,
    jvp_batched=True,
)


@implements(np.max, np.amax)
def max_(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    _no_out(out, "max")
    if where is not True or initial is not None:
        return _extreme_masked(max_, np.maximum, a, axis, keepdims, initial, where)
    r = bind(
        reduce_max, (a,), {"axes": normalize_axis(axis, ndim_of(a)), "keepdims": bool(keepdims)}
    )
    return r if initial is None else np.maximum(r, initial)


@implements(np.min, np.amin)
def min_(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    _no_out(out, "min")
    if where is not True or initial is not None:
        return _extreme_masked(min_, np.minimum, a, axis, keepdims, initial, where)
    r = bind(
        reduce_min, (a,), {"axes": normalize_axis(axis, ndim_of(a)), "keepdims": bool(keepdims)}
    )
    return r if initial is None else np.minimum(r, initial)


# --- cumulative ----------------------------------------------------------------------------
def _reverse_cumsum(g, axis):
    idx = (slice(None),) * axis + (slice(None, None, -1),)
    return np.cumsum(g[idx], axis=axis)[idx]


cumsum_p = Primitive(
    "cumsum",
    lambda x, axis: np.cumsum(x, axis=axis),
    vjps=(lambda g, ans, x, axis: _reverse_cumsum(g, axis),),
    jvp=lambda ts, ans, x, axis: cumsum_p(ts[0], axis=axis + len(batch_shape(ts[0], x))),
    linear=True,
    jvp_batched=True,
)


def _no_zero(is_zero) -> bool:
    """Whether no element is zero. Under vmap, in no member: the zero-safe form is exact
    for every member, so a batch with a zero in any member takes it for all."""
    check = np.any(is_zero)
    while type(check) is Tracer and check._level.batch_size is not None:
        check = np.any(check._value)
    return not bool(check)


def _cumprod_vjp(g, ans, x, axis):
    """sum_{j>=i} g_j prod_{k<=j, k!=i} x_k: exact, to every order, also where x has zeros."""
    is_zero = x == 0
    if _no_zero(is_zero):  # the quotient form is exact (when staging: a guard)
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
    if _no_zero(is_zero):  # the quotient form is exact (when staging: a guard)
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
    "cumprod",
    lambda x, axis: np.cumprod(x, axis=axis),
    vjps=(_cumprod_vjp,),
    jvp=_cumprod_jvp,
    jvp_batched=True,
)


def _cumulative(prim, a, axis):
    if axis is None:
        a, axis = np.ravel(a), 0
    return bind(prim, (a,), {"axis": int(axis) % max(ndim_of(a), 1)})


@implements(np.cumsum)
def cumsum(a, axis=None, dtype=None, out=None):
    _no_out(out, "cumsum")
    a = a if dtype is None else _astype(a, dtype)
    return _cumulative(cumsum_p, a, axis)


@implements(np.cumprod)
def cumprod(a, axis=None, dtype=None, out=None):
    _no_out(out, "cumprod")
    a = a if dtype is None else _astype(a, dtype)
    return _cumulative(cumprod_p, a, axis)


# --- no derivative: arg-reductions and predicates (recorded when staging) ----------------------
def _nondiff_function(func, name, shape_from_data=False, multiple_results=False):
    prim = Primitive(
        name,
        func,
        nondiff=True,
        shape_from_data=shape_from_data,
        multiple_results=multiple_results,
    )

    @implements(func)
    def impl(*args, **kwargs):
        return bind(prim, args, kwargs)

    return prim


for _f in (
    np.argmax,
    np.argmin,
    np.argsort,
    np.any,
    np.all,
    np.count_nonzero,
    np.nonzero,
    np.searchsorted,
    np.isclose,
    np.allclose,
    np.array_equal,
    np.argwhere,
    np.flatnonzero,
    np.isnan,
    np.sign,
):
    if hasattr(_f, "__name__") and not isinstance(_f, np.ufunc):
        _nondiff_function(
            _f,
            _f.__name__,
            shape_from_data=_f in (np.nonzero, np.argwhere, np.flatnonzero),
            multiple_results=_f is np.nonzero,  # a tuple of index arrays, one per axis
        )


# --- ufunc methods: np.add.reduce is np.sum, np.multiply.accumulate is np.cumprod, ... ---------
def _ufunc_reduction(ufunc, function) -> None:
    def reduce(a, axis=0, dtype=None, out=None, keepdims=False, initial=None, where=True):
        return _ufunc_reduce(function, a, axis, dtype, out, keepdims, initial, where)

    implements_ufunc_method(ufunc, "reduce")(reduce)


def _ufunc_accumulation(ufunc, function) -> None:
    implements_ufunc_method(ufunc, "accumulate")(
        lambda a, axis=0, dtype=None, out=None: function(a, axis=axis, dtype=dtype, out=out)
    )


for _ufunc, _function in (
    (np.add, np.sum),
    (np.multiply, np.prod),
    (np.maximum, np.max),
    (np.minimum, np.min),
):
    _ufunc_reduction(_ufunc, _function)
for _ufunc, _function in ((np.add, np.cumsum), (np.multiply, np.cumprod)):
    _ufunc_accumulation(_ufunc, _function)


# --- NumPy's full signatures: where=, initial=, dtype=, empty slices, all-NaN slices -----------
def _astype(a, dtype):
    """`a` cast to `dtype` (a Tracer, an ndarray or a Python number)."""
    dtype = np.dtype(dtype)
    if dtype_of(a) == dtype:
        return a
    return a.astype(dtype) if hasattr(a, "_var") else np.asarray(a).astype(dtype)


def _where_mask(a, where, fill):
    """`a` with the entries outside `where` replaced by `fill` (where= must broadcast to a)."""
    shape = shape_of(a)
    if np.broadcast_shapes(shape, shape_of(where)) != shape:
        raise ValueError(
            f"where= of shape {shape_of(where)} does not broadcast to the "
            f"reduced array's shape {shape}"
        )
    return np.where(where, a, _astype(fill, dtype_of(a)) if hasattr(fill, "_var") else fill)


def _reduced_count(a, axes, where, keepdims):
    """How many entries are reduced into each result: an int, or an integer array for where=."""
    shape = shape_of(a)
    if where is True:
        count = 1
        for ax in axes:
            count *= shape[ax]
        return count
    return np.sum(np.broadcast_to(where, shape), axis=axes, keepdims=keepdims, dtype=np.intp)


def _result_float(a, dtype):
    """The floating dtype NumPy's mean and var compute in."""
    if dtype is not None:
        return np.dtype(dtype)
    dt = dtype_of(a)
    return np.dtype(np.float64) if dt.kind in "iub" else dt


def _count_as(count, dtype):
    """A divisor of `dtype`: never a Python 0, whose reciprocal in a rule would raise."""
    if hasattr(count, "_var"):
        return count.astype(dtype)
    return np.asarray(count, dtype=dtype)


def _any_true(x) -> bool:
    """bool(np.any(x)) for a warning: read from the concrete value (not a guard)."""
    while hasattr(x, "_var"):
        x = x._value
    return bool(np.any(x))


def _sum_masked(a, axis, dtype, keepdims, initial, where):
    axes = normalize_axis(axis, ndim_of(a))
    if dtype is not None:
        a = _astype(a, dtype)
    if where is not True:
        a = _where_mask(a, where, 0)
    r = bind(reduce_sum, (a,), {"axes": axes, "keepdims": bool(keepdims)})
    r = r if initial is None else r + initial
    return r if dtype is None else _astype(r, dtype)


def _mean_masked(a, axes, dtype, keepdims, where):
    """np.mean with where=, dtype= or empty slices (0/0: NaN and NumPy's warning)."""
    import warnings

    rdtype = _result_float(a, dtype)
    count = _reduced_count(a, axes, where, keepdims)
    if _any_true(np.equal(count, 0)):
        warnings.warn("Mean of empty slice", RuntimeWarning, stacklevel=3)
    a = _astype(a, rdtype)
    if where is not True:
        a = _where_mask(a, where, 0)
    total = bind(reduce_sum, (a,), {"axes": axes, "keepdims": bool(keepdims)})
    return _astype(total / _count_as(count, rdtype), rdtype)


def _var_masked(a, axes, dtype, ddof, keepdims, where, mean):
    """np.var with where=, mean=, dtype= or no degrees of freedom left (NaN or inf, warned)."""
    import warnings

    rdtype = _result_float(a, dtype)
    count = _reduced_count(a, axes, where, keepdims)
    if _any_true(np.less_equal(np.subtract(count, ddof), 0)):
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
    a = _astype(a, rdtype)
    if mean is None:
        kcount = _reduced_count(a, axes, where, True)
        masked = a if where is True else _where_mask(a, where, 0)
        mean = bind(reduce_sum, (masked,), {"axes": axes, "keepdims": True}) / _count_as(
            kcount, rdtype
        )
    d = a - mean
    sq = d * d
    if where is not True:
        sq = _where_mask(sq, where, 0)
    total = bind(reduce_sum, (sq,), {"axes": axes, "keepdims": bool(keepdims)})
    return _astype(total / _count_as(np.maximum(np.subtract(count, ddof), 0), rdtype), rdtype)


def _masked_extreme(function, a, selected, fill, axes, keepdims):
    """function(a) over the `selected` entries, the others filled with `fill` (max or min of
    where=, nanmax), with the gradient of the selected entries alone.

    A filled entry that ties with the result (every selected entry is -inf in nanmax, or
    equals initial=) would take a share of the gradient and lose it: such slices give each of
    the k selected entries attaining the extreme 1/k of it instead.
    """
    filled = np.where(selected, a, fill)
    r = function(filled, axis=axes, keepdims=keepdims)
    if not hasattr(a, "_var"):
        return r
    r_wide = expand_reduced(r, shape_of(a), axes, keepdims)
    selected = np.broadcast_to(selected, shape_of(a))
    tied = np.logical_and(np.logical_not(selected), np.equal(filled, r_wide))
    if not np.any(tied):  # the common case (when staging: a guard)
        return r
    hits = np.logical_and(selected, np.equal(a, r_wide))
    k = np.sum(hits, axis=axes, keepdims=keepdims)
    share = np.sum(np.where(hits, a, 0), axis=axes, keepdims=keepdims) / np.maximum(k, 1)
    # r's value exactly (k equal finite values need not sum to k times one) with share's
    # gradient; an infinite extreme is the share itself
    finite = np.isfinite(r)
    finite_share = np.where(finite, share, 0)
    exact = np.where(finite, stop_gradient(r) + (finite_share - stop_gradient(finite_share)), share)
    return np.where(np.any(tied, axis=axes, keepdims=keepdims) & (k > 0), exact, r)


def _extreme_masked(function, combine, a, axis, keepdims, initial, where):
    """np.max/np.min with where= (which needs initial=, as in NumPy) or initial=."""
    name = combine.__name__
    if initial is None:
        raise ValueError(
            f"reduction operation '{name}' does not have an identity, so to use a "
            "where mask one has to specify 'initial'"
        )
    axes = normalize_axis(axis, ndim_of(a))
    if where is not True:
        _where_mask(a, where, initial)  # where= must broadcast to a
    shape = shape_of(a)
    if any(shape[ax] == 0 for ax in axes):  # an empty reduction is `initial`
        kshape = tuple(1 if i in axes else d for i, d in enumerate(shape))
        oshape = kshape if keepdims else tuple(d for i, d in enumerate(shape) if i not in axes)
        dt = np.result_type(dtype_of(a), dtype_of(initial) if hasattr(initial, "_var") else initial)
        return (
            np.full(oshape, initial, dt)
            if not hasattr(initial, "_var")
            else (np.broadcast_to(_astype(initial, dt), oshape))
        )
    if where is not True:
        fill = _astype(initial, dtype_of(a)) if hasattr(initial, "_var") else initial
        r = _masked_extreme(function, a, where, fill, axes, keepdims)
    else:
        r = function(a, axis=axes, keepdims=keepdims)
    return combine(r, initial)


def _ufunc_reduce(function, a, axis, dtype, out, keepdims, initial, where):
    """`np.add.reduce(a, ...)` through np.sum (and likewise for multiply, maximum, minimum)."""
    _no_out(out, "ufunc.reduce")
    if dtype is not None:
        a = _astype(a, dtype)
    kwargs = {}
    if initial is not None:
        kwargs["initial"] = initial
    if where is not True:
        kwargs["where"] = where
    return function(a, axis=axis, keepdims=keepdims, **kwargs)


# --- NaN-ignoring reductions ----------------------------------------------------------------------
def _inexact(a) -> bool:
    return dtype_of(a).kind in "fc"


def _replace_nan(a, value):
    """(a with NaNs replaced by `value`, the NaN mask), or (a, None) for exact dtypes."""
    if not _inexact(a):
        return a, None
    mask = np.isnan(a)
    return np.where(mask, _astype(value, dtype_of(a)) if hasattr(value, "_var") else value, a), mask


def _reduction_kwargs(initial, where):
    kwargs = {}
    if initial is not None:
        kwargs["initial"] = initial
    if where is not True:
        kwargs["where"] = where
    return kwargs


@implements(np.nansum)
def nansum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    """np.nansum: NaNs count as zero (an all-NaN slice sums to 0)."""
    _no_out(out, "nansum")
    a, _ = _replace_nan(a, 0)
    return sum_(a, axis=axis, dtype=dtype, keepdims=keepdims, initial=initial, where=where)


@implements(np.nanprod)
def nanprod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    """np.nanprod: NaNs count as one."""
    _no_out(out, "nanprod")
    a, _ = _replace_nan(a, 1)
    if dtype is not None:
        a = _astype(a, dtype)
    return prod(a, axis=axis, keepdims=keepdims, initial=initial, where=where)


@implements(np.nancumsum)
def nancumsum(a, axis=None, dtype=None, out=None):
    """np.nancumsum: NaNs count as zero."""
    _no_out(out, "nancumsum")
    return cumsum(_replace_nan(a, 0)[0], axis=axis, dtype=dtype)


@implements(np.nancumprod)
def nancumprod(a, axis=None, dtype=None, out=None):
    """np.nancumprod: NaNs count as one."""
    _no_out(out, "nancumprod")
    return cumprod(_replace_nan(a, 1)[0], axis=axis, dtype=dtype)


def _nan_extreme(function, fill, a, axis, out, keepdims, initial, where, name):
    """np.nanmax / np.nanmin: NumPy's fmax.reduce / fmin.reduce, NaN for an all-NaN slice."""
    import warnings

    _no_out(out, name)
    kwargs = _reduction_kwargs(initial, where)
    if not _inexact(a):
        return function(a, axis=axis, keepdims=keepdims, **kwargs)
    if where is not True and initial is None:
        raise ValueError(
            f"reduction operation '{'fmax' if name == 'nanmax' else 'fmin'}' does "
            "not have an identity, so to use a where mask one has to specify "
            "'initial'"
        )
    mask = np.isnan(a)
    if where is not True:
        mask = mask | ~np.broadcast_to(where, shape_of(a))
    axes = normalize_axis(axis, ndim_of(a))
    shape = shape_of(a)
    if any(shape[ax] == 0 for ax in axes):
        return function(a, axis=axes, keepdims=keepdims, **kwargs)  # initial, or NumPy's error
    none = np.all(mask, axis=axes, keepdims=keepdims)
    r = _masked_extreme(function, a, ~mask, fill, axes, keepdims)
    r = np.where(none, np.nan, r)
    if initial is not None:
        r = (np.fmax if name == "nanmax" else np.fmin)(r, initial)
    if _any_true(np.isnan(r)):
        warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=3)
    return r


@implements(np.nanmax)
def nanmax(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    """np.nanmax: the maximum ignoring NaNs; NaN (with NumPy's warning) for all-NaN slices."""
    return _nan_extreme(max_, -np.inf, a, axis, out, keepdims, initial, where, "nanmax")


@implements(np.nanmin)
def nanmin(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    """np.nanmin: the minimum ignoring NaNs; NaN (with NumPy's warning) for all-NaN slices."""
    return _nan_extreme(min_, np.inf, a, axis, out, keepdims, initial, where, "nanmin")


def _nan_count(mask, axes, where, keepdims):
    ok = ~mask if where is True else ~mask & np.broadcast_to(where, shape_of(mask))
    return np.sum(ok, axis=axes, keepdims=keepdims, dtype=np.intp)


@implements(np.nanmean)
def nanmean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=True):
    """np.nanmean: the mean of the non-NaN entries; NaN (warned) for an all-NaN slice."""
    import warnings

    _no_out(out, "nanmean")
    arr, mask = _replace_nan(a, 0)
    if mask is None:
        return mean(a, axis=axis, dtype=dtype, keepdims=keepdims, where=where)
    axes = normalize_axis(axis, ndim_of(a))
    count = _nan_count(mask, axes, where, keepdims)
    total = sum_(arr, axis=axes, dtype=dtype, keepdims=keepdims, where=where)
    if _any_true(np.equal(count, 0)):
        warnings.warn("Mean of empty slice", RuntimeWarning, stacklevel=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / _count_as(count, dtype_of(total))


@implements(np.nanvar)
def nanvar(
    a,
    axis=None,
    dtype=None,
    out=None,
    ddof=0,
    keepdims=False,
    *,
    where=True,
    mean=None,
    correction=None,
):
    """np.nanvar: the variance of the non-NaN entries; NaN (warned) without degrees of freedom."""
    import warnings

    _no_out(out, "nanvar")
    arr, mask = _replace_nan(a, 0)
    if mask is None:
        return var(
            a,
            axis=axis,
            dtype=dtype,
            ddof=ddof,
            keepdims=keepdims,
            where=where,
            mean=mean,
            correction=correction,
        )
    if correction is not None:
        if ddof != 0:
            raise ValueError("ddof and correction can't be provided simultaneously.")
        ddof = correction
    axes = normalize_axis(axis, ndim_of(a))
    if dtype is not None:
        arr = _astype(arr, dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        if mean is None:
            kcount = _nan_count(mask, axes, where, True)
            mean = sum_(arr, axis=axes, keepdims=True, where=where) / _count_as(
                kcount, dtype_of(arr)
            )
        d = np.where(mask, 0, arr - mean)
        total = sum_(d * d, axis=axes, keepdims=keepdims, where=where)
        dof = np.subtract(_nan_count(mask, axes, where, keepdims), ddof)
        r = total / _count_as(dof, dtype_of(total))
    bad = np.less_equal(dof, 0)
    if _any_true(bad):
        warnings.warn("Degrees of freedom <= 0 for slice.", RuntimeWarning, stacklevel=2)
        r = np.where(bad, np.nan, r)
    return r


@implements(np.nanstd)
def nanstd(
    a,
    axis=None,
    dtype=None,
    out=None,
    ddof=0,
    keepdims=False,
    *,
    where=True,
    mean=None,
    correction=None,
):
    """np.nanstd: the square root of np.nanvar."""
    return np.sqrt(
        nanvar(
            a,
            axis=axis,
            dtype=dtype,
            out=out,
            ddof=ddof,
            keepdims=keepdims,
            where=where,
            mean=mean,
            correction=correction,
        )
    )


@implements(np.ptp)
def ptp(a, axis=None, out=None, keepdims=False):
    """np.ptp: max - min (ties share the gradient, as for max and min)."""
    _no_out(out, "ptp")
    return np.subtract(max_(a, axis=axis, keepdims=keepdims), min_(a, axis=axis, keepdims=keepdims))


for _f in (np.nanargmax, np.nanargmin):
    _nondiff_function(_f, _f.__name__)


# Sums, products and cumulative sums are holomorphic (polynomial) in each element: their rules
# hold for complex values as written. max and min order complex numbers lexicographically:
# refused.
complex_rules("reduce_sum", "reduce_prod", "cumsum", "cumprod")
