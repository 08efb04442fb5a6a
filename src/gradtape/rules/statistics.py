"""Order statistics and sample statistics: median, quantile, percentile (and their nan-versions),
cov, corrcoef, histogram, bincount, unique, digitize.

Order statistics are gathers from the sorted array: the value is NumPy's own formula (the same
interpolation, in the same order of operations) applied to the elements NumPy would pick, and
the gradient flows to those elements. Which elements are picked depends on the values; that
choice is made by recorded integer operations (argsort, searchsorted, counts), so a compiled
function picks again on every call. Derivatives with respect to the picked positions are zero,
as NumPy's piecewise definition implies.
"""

from __future__ import annotations

import builtins
import warnings

import numpy as np

from .._compat import QUANTILE_WEAK_Q_IN_INPUT_DTYPE
from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements
from ..core.tracing import bind
from ._util import dtype_of, ndim_of, normalize_axis, shape_of
from .indexing import SparseCotangent, getitem, materialize
from .reductions import _any_true, _astype, _nondiff_function


def _no_out(out, name):
    if out is not None:
        raise GradtapeError(
            f"np.{name}(..., out=...) writes into an array in place, which "
            "cannot be traced; assign the result instead."
        )


def _nondiff(name, impl, **facts):
    """A primitive with no derivative whose implementation is NumPy code on plain arrays; on
    the values of an outer level (Tracers, under compile(grad(f))) it is recorded there."""

    def run(*args, **params):
        if any(hasattr(a, "_var") for a in args):
            return bind(prim, args, params)
        return impl(*args, **params)

    prim = Primitive(name, run, nondiff=True, **facts)
    return prim


def _last_axis(a, axis):
    """`a` with the reduced axes moved to the end and merged into one: (array, axes)."""
    nd = ndim_of(a)
    axes = normalize_axis(axis, nd)
    shape = shape_of(a)
    keep = [i for i in range(nd) if i not in axes]
    a = np.transpose(a, keep + list(axes)) if keep + list(axes) != list(range(nd)) else a
    merged = int(np.prod([shape[i] for i in axes], dtype=np.int64))
    return np.reshape(a, tuple(shape[i] for i in keep) + (merged,)), axes


def _with_keepdims(r, shape, axes, keepdims, lead=()):
    """Reshape a result over the kept axes (with leading q axes `lead`) for keepdims=True."""
    if not keepdims:
        return r
    return np.reshape(r, tuple(lead) + tuple(1 if i in axes else d for i, d in enumerate(shape)))


# --- quantiles --------------------------------------------------------------------------------
def _discrete(index, condition):
    previous = np.floor(index)
    gamma = index - previous
    res = np.where(condition(gamma, index), previous, previous + 1).astype(np.intp)
    return np.where(res < 0, 0, res)


def _continuous(n, q, alpha, beta):
    return n * q + (alpha + q * (1 - alpha - beta)) - 1


# NumPy's methods (Hyndman & Fan): the virtual index of each quantile, and the rule that
# adjusts the interpolation weight (None: the index is an integer, no interpolation).
_METHODS = {
    "inverted_cdf": (lambda n, q: _discrete(n * q - 1, lambda g, i: g == 0), None),
    "averaged_inverted_cdf": (lambda n, q: n * q - 1, lambda g, i: np.where(g == 0, 0.5, 1.0)),
    "closest_observation": (
        lambda n, q: _discrete(n * q - 1 - 0.5, lambda g, i: (g == 0) & (np.floor(i) % 2 == 1)),
        None,
    ),
    "interpolated_inverted_cdf": (lambda n, q: _continuous(n, q, 0, 1), lambda g, i: g),
    "hazen": (lambda n, q: _continuous(n, q, 0.5, 0.5), lambda g, i: g),
    "weibull": (lambda n, q: _continuous(n, q, 0, 0), lambda g, i: g),
    "linear": (lambda n, q: (n - 1) * q, lambda g, i: g),
    "median_unbiased": (lambda n, q: _continuous(n, q, 1 / 3.0, 1 / 3.0), lambda g, i: g),
    "normal_unbiased": (lambda n, q: _continuous(n, q, 3 / 8.0, 3 / 8.0), lambda g, i: g),
    "lower": (lambda n, q: np.floor((n - 1) * q).astype(np.intp), None),
    "higher": (lambda n, q: np.ceil((n - 1) * q).astype(np.intp), None),
    "midpoint": (
        lambda n, q: 0.5 * (np.floor((n - 1) * q) + np.ceil((n - 1) * q)),
        lambda g, i: np.where(i % 1 == 0, 0.0, 0.5),
    ),
    "nearest": (lambda n, q: np.around((n - 1) * q).astype(np.intp), None),
}


def _lerp(a, b, t):
    """NumPy's interpolation: a + (b - a) t, or b - (b - a)(1 - t) when t >= 0.5."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def _gather_last(s, idx):
    """s[..., idx] along the last axis, idx shaped (kept..., k)."""
    return np.take_along_axis(s, idx, axis=-1)


def _check_q(q, percent: bool):
    qv = q
    while hasattr(qv, "_var"):
        qv = qv._value
    qv = np.asarray(qv)
    if qv.dtype.kind == "c" or not (np.all(qv >= 0) and np.all(qv <= 1)):
        raise ValueError(
            "Percentiles must be in the range [0, 100]"
            if percent
            else "Quantiles must be in the range [0, 1]"
        )


def _quantile(a, q, axis, method, keepdims, weights, ignore_nan, percent, weak_q):
    if method not in _METHODS:
        raise ValueError(f"{method!r} is not a valid method. Use one of: {_METHODS.keys()}")
    if dtype_of(a).kind == "c":
        raise TypeError("a must be an array of real numbers")
    _check_q(q, percent)
    shape = shape_of(a)
    qshape = shape_of(q)
    if len(qshape) > 1 and not ignore_nan:
        raise ValueError("q must be a scalar or 1d")
    flat, axes = _last_axis(a, axis)
    kept = shape_of(flat)[:-1]
    count = shape_of(flat)[-1]
    if count == 0 and not ignore_nan:
        raise IndexError("index -1 is out of bounds for axis 0 with size 0")
    if ignore_nan and 0 in shape:  # NumPy: the nanmean of the empty array (whatever q is)
        return np.nanmean(a, axis=axis, keepdims=keepdims)
    qv = np.reshape(q, (1,) * len(kept) + (-1,))
    inexact = dtype_of(a).kind == "f"
    if weak_q and inexact and QUANTILE_WEAK_Q_IN_INPUT_DTYPE:
        qv = _astype(qv, dtype_of(a))  # (the index computed as this NumPy does: _compat)
    if weights is not None:
        return _weighted_quantile(
            a, flat, q, qv, axes, shape, kept, count, weights, keepdims, axis, ignore_nan
        )
    order = np.argsort(flat, axis=-1)
    s = _gather_last(flat, order)
    if ignore_nan and inexact:
        n = np.sum(~np.isnan(flat), axis=-1, keepdims=True)  # NaNs sort last
    else:
        n = np.full(kept + (1,), count, dtype=np.intp)
    get_index, fix_gamma = _METHODS[method]
    with np.errstate(invalid="ignore"):
        virtual = get_index(n, qv)
    last = np.maximum(n - 1, 0)
    if fix_gamma is None or dtype_of(virtual).kind in "iu":
        idx = np.where(virtual < 0, virtual + n, virtual).astype(np.intp)
        result = _gather_last(s, np.clip(idx, 0, last))
    else:
        previous = np.floor(virtual)
        following = previous + 1
        above = virtual >= n - 1
        below = virtual < 0
        previous = np.where(above, -1, np.where(below, 0, previous))
        following = np.where(above, -1, np.where(below, 0, following))
        if inexact:
            bad = np.isnan(virtual)
            previous = np.where(bad, -1, previous)
            following = np.where(bad, -1, following)
        gamma = fix_gamma(virtual - previous, virtual)
        if weak_q and inexact:
            gamma = _astype(gamma, dtype_of(a))
        previous = previous.astype(np.intp)
        following = following.astype(np.intp)
        lo = _gather_last(s, np.clip(np.where(previous < 0, previous + n, previous), 0, last))
        hi = _gather_last(s, np.clip(np.where(following < 0, following + n, following), 0, last))
        result = _lerp(lo, hi, gamma)
    if inexact:
        if ignore_nan:
            empty = np.equal(n, 0)
            if _any_true(empty):
                warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=4)
            result = np.where(empty, np.nan, result)
        else:
            result = np.where(np.isnan(s[..., -1:]), s[..., -1:], result)
    return _finish(result, qshape, kept, shape, axes, keepdims)


def _finish(result, qshape, kept, shape, axes, keepdims):
    """(kept..., q) -> NumPy's layout: the q axes first, then the kept (or kept-dims) axes."""
    result = np.reshape(result, kept + tuple(qshape))
    nk, nq = len(kept), len(qshape)
    if nq:
        result = np.transpose(result, tuple(range(nk, nk + nq)) + tuple(range(nk)))
    return _with_keepdims(result, shape, axes, keepdims, lead=qshape)


def _weighted_quantile(
    a, flat, q, qv, axes, shape, kept, count, weights, keepdims, axis, ignore_nan
):
    """method='inverted_cdf' with weights: the first sorted value whose weighted CDF reaches q
    (zero derivative with respect to the weights, which only choose the element)."""
    if ignore_nan:
        raise GradtapeError(
            "np.nanquantile/np.nanpercentile with weights= cannot be traced; "
            "drop the NaNs first (np.quantile on the remaining values)."
        )
    w = weights
    wshape = shape_of(w)
    if wshape != shape:
        if axis is None or wshape != tuple(shape[ax] for ax in axes):
            raise ValueError(
                "Shape of weights must be consistent with shape of a along specified axis."
            )
        w = np.broadcast_to(
            np.reshape(w, tuple(shape[i] if i in axes else 1 for i in range(len(shape)))), shape
        )
    if _any_true(np.less(w, 0)):
        raise ValueError("Weights must be non-negative.")
    wflat, _ = _last_axis(w, axis)
    order = np.argsort(flat, axis=-1)
    s = _gather_last(flat, order)
    cdf = np.cumsum(_astype(_gather_last(wflat, order), np.float64), axis=-1)
    cdf = cdf / cdf[..., -1:]
    if _any_true(np.isnan(cdf[..., -1])):
        raise ValueError("Weights included NaN, inf or were all zero.")
    if dtype_of(qv).kind == "f":
        cdf = _astype(cdf, dtype_of(qv))
    cdf = np.where(cdf == 0, -1, cdf)
    idx = np.sum(cdf[..., :, None] < qv[..., None, :], axis=-2)  # searchsorted, side="left"
    result = _gather_last(s, np.minimum(idx, count - 1))
    if dtype_of(a).kind == "f":
        result = np.where(np.isnan(s[..., -1:]), s[..., -1:], result)
    return _finish(result, shape_of(q), kept, shape, axes, keepdims)


def _method(method, interpolation):
    if interpolation is not None:
        warnings.warn(
            "the `interpolation=` argument is deprecated; use `method=` instead",
            DeprecationWarning,
            stacklevel=3,
        )
        return interpolation
    return method


def _weighted_method(method, interpolation, weights) -> str:
    """The interpolation method, checked against weights= as NumPy does."""
    name = _method(method, interpolation)
    if weights is not None and name != "inverted_cdf":
        raise ValueError(f"Only method 'inverted_cdf' supports weights. Got: {method}.")
    return name


@implements(np.quantile)
def quantile(
    a,
    q,
    axis=None,
    out=None,
    overwrite_input=False,
    method="linear",
    keepdims=False,
    *,
    weights=None,
    interpolation=None,
):
    """np.quantile: NumPy's interpolation of the sorted values (every method)."""
    _no_out(out, "quantile")
    weak = type(q) in (int, float)
    q = q if hasattr(q, "_var") else np.asarray(q)
    return _quantile(
        a,
        q,
        axis,
        _weighted_method(method, interpolation, weights),
        keepdims,
        weights,
        False,
        False,
        weak,
    )


@implements(np.percentile)
def percentile(
    a,
    q,
    axis=None,
    out=None,
    overwrite_input=False,
    method="linear",
    keepdims=False,
    *,
    weights=None,
    interpolation=None,
):
    """np.percentile: np.quantile of q / 100."""
    _no_out(out, "percentile")
    weak = type(q) in (int, float)
    q = np.true_divide(q, 100)
    return _quantile(
        a,
        q,
        axis,
        _weighted_method(method, interpolation, weights),
        keepdims,
        weights,
        False,
        True,
        weak,
    )


@implements(np.nanquantile)
def nanquantile(
    a,
    q,
    axis=None,
    out=None,
    overwrite_input=False,
    method="linear",
    keepdims=False,
    *,
    weights=None,
    interpolation=None,
):
    """np.nanquantile: the quantile of each slice's non-NaN values (NaN for an all-NaN slice)."""
    _no_out(out, "nanquantile")
    weak = type(q) in (int, float)
    q = q if hasattr(q, "_var") else np.asarray(q)
    return _quantile(
        a, q, axis, _method(method, interpolation), keepdims, weights, True, False, weak
    )


@implements(np.nanpercentile)
def nanpercentile(
    a,
    q,
    axis=None,
    out=None,
    overwrite_input=False,
    method="linear",
    keepdims=False,
    *,
    weights=None,
    interpolation=None,
):
    """np.nanpercentile: np.nanquantile of q / 100."""
    _no_out(out, "nanpercentile")
    weak = type(q) in (int, float)
    return _quantile(
        a,
        np.true_divide(q, 100),
        axis,
        _method(method, interpolation),
        keepdims,
        weights,
        True,
        True,
        weak,
    )


def _median(a, axis, keepdims, ignore_nan):
    shape = shape_of(a)
    flat, axes = _last_axis(a, axis)
    kept = shape_of(flat)[:-1]
    count = shape_of(flat)[-1]
    if count == 0:
        return _with_keepdims(np.mean(flat, axis=-1), shape, axes, keepdims)
    s = _gather_last(flat, np.argsort(flat, axis=-1))
    inexact = dtype_of(a).kind == "f"
    if ignore_nan and inexact:
        n = np.sum(~np.isnan(flat), axis=-1, keepdims=True)
        lo = np.maximum((n - 1) // 2, 0)
        hi = np.where(n == 0, 0, n // 2)
        a_lo, a_hi = _gather_last(s, lo), _gather_last(s, hi)
        r = np.where(n % 2 == 1, a_lo, (a_lo + a_hi) / 2)[..., 0]
        empty = np.equal(n[..., 0], 0)
        if _any_true(empty):
            warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=3)
        r = np.where(empty, np.nan, r)
    else:
        half = count // 2
        r = np.mean(
            s[..., half - 1 : half + 1] if count % 2 == 0 else s[..., half : half + 1], axis=-1
        )
        if inexact:
            r = np.where(np.isnan(s[..., -1]), s[..., -1], r)
    return _with_keepdims(np.reshape(r, kept), shape, axes, keepdims)


@implements(np.median)
def median(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    """np.median: the mean of the middle one or two sorted values (NaN if a NaN is present)."""
    _no_out(out, "median")
    return _median(a, axis, keepdims, False)


@implements(np.nanmedian)
def nanmedian(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    """np.nanmedian: the median of each slice's non-NaN values (NaN for an all-NaN slice)."""
    _no_out(out, "nanmedian")
    return _median(a, axis, keepdims, True)


# --- covariance and correlation ---------------------------------------------------------------
def _as_float(x, dtype):
    return _astype(x if hasattr(x, "_var") else np.asarray(x), dtype)


@implements(np.cov)
def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None, *, dtype=None):
    """np.cov, with NumPy's operations in NumPy's order (weights may be traced)."""
    if ddof is not None and ddof != int(ddof):
        raise ValueError("ddof must be integer")
    if dtype_of(m).kind == "c" or (y is not None and dtype_of(y).kind == "c"):
        raise GradtapeError(
            "np.cov of complex values cannot be traced (gradtape differentiates real functions)."
        )
    if ndim_of(m) > 2:
        raise ValueError("m has more than 2 dimensions")
    if y is not None and ndim_of(y) > 2:
        raise ValueError("y has more than 2 dimensions")
    if dtype is None:
        dtype = (
            np.result_type(dtype_of(m), np.float64)
            if y is None
            else np.result_type(dtype_of(m), dtype_of(y), np.float64)
        )
    X = np.atleast_2d(_as_float(m, dtype))
    if not rowvar and ndim_of(m) != 1:
        X = X.T
    if shape_of(X)[0] == 0:
        return np.array([]).reshape(0, 0)
    if y is not None:
        Y = np.atleast_2d(_as_float(y, dtype))
        if not rowvar and shape_of(Y)[0] != 1:
            Y = Y.T
        X = np.concatenate((X, Y), axis=0)
    if ddof is None:
        ddof = 1 if bias == 0 else 0
    w = None
    nobs = shape_of(X)[1]
    if fweights is not None:
        fweights = _as_float(fweights, np.float64)
        if not _any_true(np.all(fweights == np.around(fweights))):
            raise TypeError("fweights must be integer")
        if ndim_of(fweights) > 1:
            raise RuntimeError("cannot handle multidimensional fweights")
        if shape_of(fweights)[0] != nobs:
            raise RuntimeError("incompatible numbers of samples and fweights")
        if _any_true(fweights < 0):
            raise ValueError("fweights cannot be negative")
        w = fweights
    if aweights is not None:
        aweights = _as_float(aweights, np.float64)
        if ndim_of(aweights) > 1:
            raise RuntimeError("cannot handle multidimensional aweights")
        if shape_of(aweights)[0] != nobs:
            raise RuntimeError("incompatible numbers of samples and aweights")
        if _any_true(aweights < 0):
            raise ValueError("aweights cannot be negative")
        w = aweights if w is None else w * aweights
    if w is None:
        avg = np.mean(X, axis=1)
        w_sum = None
        fact = nobs - ddof
    else:
        w_sum = np.sum(np.broadcast_to(w, shape_of(X)), axis=1)[0]
        avg = np.sum(X * w, axis=1) / np.sum(np.broadcast_to(w, shape_of(X)), axis=1)
        if ddof == 0:
            fact = w_sum
        elif aweights is None:
            fact = w_sum - ddof
        else:
            fact = w_sum - ddof * np.sum(w * aweights) / w_sum
    if _any_true(np.less_equal(fact, 0)):
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=2)
        fact = np.where(np.less_equal(fact, 0), 0.0, fact) if hasattr(fact, "_var") else 0.0
    X = X - avg[:, None]
    X_T = X.T if w is None else (X * w).T
    c = np.matmul(X, X_T)
    c = c * _astype(np.true_divide(1, fact), dtype_of(c))
    return np.squeeze(c)


@implements(np.corrcoef)
def corrcoef(x, y=None, rowvar=True, bias=np._NoValue, ddof=np._NoValue, *, dtype=None):
    """np.corrcoef: the covariance scaled by the standard deviations, clipped to [-1, 1]."""
    c = cov(x, y, rowvar, dtype=dtype)
    if ndim_of(c) == 0:
        return c / c
    d = np.diagonal(c)
    stddev = np.sqrt(d)
    c = c / stddev[:, None]
    c = c / stddev[None, :]
    return np.clip(c, -1, 1)


# --- histograms and counts (the counts have no derivative; edges and weights do) ----------------
def _bin_index_impl(a, edges):
    """NumPy's bin of each element (the last bin includes its right edge), -1 outside."""
    idx = np.searchsorted(edges, a, side="right") - 1
    nbins = len(edges) - 1
    idx = np.where(a == edges[-1], nbins - 1, idx)
    return np.where((a >= edges[0]) & (a <= edges[-1]), idx, -1)


_bin_index_p = _nondiff("histogram_bin_index", _bin_index_impl)
_count_bins_p = _nondiff(
    "histogram_bin_count", lambda a, bins, range: len(np.histogram_bin_edges(a, bins, range)) - 1
)


def _concrete_bool(x, every: bool = True) -> bool:
    """A check of the concrete value (no guard: it only decides whether to raise); under vmap
    the value holds every member's answer: all of them (every) or any of them."""
    while hasattr(x, "_var"):
        x = x._value
    return bool(np.all(x) if every else np.any(x))


def _bin_edges(a, bins, range, weights):
    if isinstance(bins, str) or np.ndim(bins) == 0 and not hasattr(bins, "_var"):
        if range is not None:
            first, last = range
            if _concrete_bool(np.greater(first, last), every=False):
                raise ValueError("max must be larger than min in range parameter.")
            if not _concrete_bool(np.isfinite(first) & np.isfinite(last)):
                raise ValueError(f"supplied range of [{first}, {last}] is not finite")
        elif shape_of(a)[0] == 0:
            first, last = 0, 1
        else:
            first, last = np.min(a), np.max(a)
            if not _concrete_bool(np.isfinite(first) & np.isfinite(last)):
                raise ValueError("autodetected range of the data is not finite")
        equal = np.equal(first, last)
        first, last = np.where(equal, first - 0.5, first), np.where(equal, last + 0.5, last)
        if isinstance(bins, str):
            if weights is not None:
                raise TypeError(
                    "Automated estimation of the number of bins is not supported for weighted data"
                )
            nbins = int(bind(_count_bins_p, (a,), {"bins": bins, "range": range}))
        else:
            nbins = int(bins)
            if nbins < 1:
                raise ValueError("`bins` must be positive, when an integer")
        bin_type = np.result_type(dtype_of(first), dtype_of(last), dtype_of(a))
        if bin_type.kind in "iub":
            bin_type = np.result_type(bin_type, float)
        return np.linspace(first, last, nbins + 1, endpoint=True, dtype=bin_type)
    if ndim_of(bins) != 1:
        raise ValueError("`bins` must be 1d, when an array")
    if _any_true(np.greater(bins[:-1], bins[1:])):
        raise ValueError("`bins` must increase monotonically, when an array")
    return bins


@implements(np.histogram_bin_edges)
def histogram_bin_edges(a, bins=10, range=None, weights=None):
    """np.histogram_bin_edges: differentiable in the data through its minimum and maximum."""
    return _bin_edges(np.ravel(a), bins, range, weights)


@implements(np.histogram)
def histogram(a, bins=10, range=None, density=None, weights=None):
    """np.histogram: counts (no derivative), weighted sums (differentiable in the weights) and
    the bin edges (differentiable in the data when they come from its minimum and maximum)."""
    a = np.ravel(a)
    if weights is not None:
        if shape_of(weights) != shape_of(a) and np.size(weights) != shape_of(a)[0]:
            raise ValueError("weights should have the same shape as a.")
        weights = np.ravel(weights)
    edges = _bin_edges(a, bins, range, weights)
    nbins = shape_of(edges)[0] - 1
    if weights is None:
        counts = bind(_bincount_p, (bind(_bin_index_p, (a, edges), {}),), {"minlength": nbins + 1})
        n = counts[1:]
    else:
        idx = bind(_bin_index_p, (a, edges), {}) + 1
        n = materialize(SparseCotangent((nbins + 1,), dtype_of(weights), (idx,), weights, False))[
            1:
        ]
    if density:
        db = _astype(np.diff(edges), np.float64)
        return n / db / np.sum(n), edges
    return n, edges


@implements(np.histogramdd)
def histogramdd(sample, bins=10, range=None, density=None, weights=None):
    """np.histogramdd: counts (no derivative), weighted sums (differentiable in the weights) and
    each axis's edges (differentiable in the data where they come from its minimum and maximum).
    """
    if isinstance(sample, (list, tuple)) and not hasattr(sample, "_var"):
        columns = [np.ravel(np.asarray(s)) for s in sample]
    else:
        sample = np.asarray(sample)
        if ndim_of(sample) != 2:
            sample = np.reshape(sample, (-1, 1)) if ndim_of(sample) < 2 else sample
        columns = [sample[:, d] for d in builtins.range(shape_of(sample)[1])]
    dims = len(columns)
    per_axis = bins if isinstance(bins, (list, tuple)) or ndim_of(bins) == 1 else [bins] * dims
    if isinstance(per_axis, (list, tuple)) and len(per_axis) != dims:
        raise ValueError("The dimension of bins must be equal to the dimension of the sample x.")
    ranges = [None] * dims if range is None else list(range)
    if len(ranges) != dims:
        raise ValueError("range argument must have one entry per dimension")
    edges = [_bin_edges(c, b, r, None) for c, b, r in zip(columns, per_axis, ranges)]
    sizes = [shape_of(e)[0] - 1 for e in edges]
    flat = None
    inside = None
    stride = 1
    for c, e, n in reversed(list(zip(columns, edges, sizes))):
        idx = bind(_bin_index_p, (c, e), {})
        flat = idx * stride if flat is None else flat + idx * stride
        inside = idx >= 0 if inside is None else inside & (idx >= 0)
        stride *= n
    index = np.where(inside, flat, -1)
    cells = stride
    if weights is None:
        counts = bind(_bincount_p, (index,), {"minlength": cells + 1})[1:]
        hist = _astype(counts, np.float64)
    else:
        w = np.ravel(weights)
        if shape_of(w)[0] != shape_of(columns[0])[0]:
            raise ValueError("weights should have the same length as the sample.")
        hist = materialize(SparseCotangent((cells + 1,), dtype_of(w), (index + 1,), w, False))[1:]
    hist = np.reshape(hist, tuple(sizes))
    if density:
        total = np.sum(hist)
        for d, e in enumerate(edges):
            shape = [1] * dims
            shape[d] = sizes[d]
            hist = hist / np.reshape(np.diff(e), shape)
        hist = hist / total
    return hist, edges


@implements(np.histogram2d)
def histogram2d(x, y, bins=10, range=None, density=None, weights=None):
    """np.histogram2d: np.histogramdd of (x, y) (x along the first axis of the counts)."""
    if not isinstance(bins, (list, tuple)) and ndim_of(bins) == 1:
        bins = [bins, bins]
    hist, edges = histogramdd([x, y], bins, range, density, weights)
    return hist, edges[0], edges[1]


_bincount_p = _nondiff(
    "bincount_shifted",
    lambda idx, minlength: (
        np.bincount(idx + 1, minlength=minlength)[:minlength]
        if idx.size
        else np.zeros(minlength, np.intp)
    ),
)


@implements(np.bincount)
def bincount(x, weights=None, minlength=0):
    """np.bincount: integer counts, or weighted sums differentiable in the weights."""
    if dtype_of(x).kind not in "iub":
        raise TypeError(
            "Cannot cast array data from dtype('float64') to dtype('int64') "
            "according to the rule 'safe'"
        )
    if ndim_of(x) != 1:
        raise ValueError("object too deep for desired array")
    if _any_true(np.less(x, 0)):
        raise ValueError("'list' argument must have no negative elements")
    # the length depends on the values: int() of a traced maximum records a guard
    length = max(int(np.max(x)) + 1 if shape_of(x)[0] else 0, int(minlength))
    if weights is None or not hasattr(weights, "_var"):
        return bind(_plain_bincount_p, (x, weights), {"minlength": length})
    if shape_of(weights) != shape_of(x):
        raise ValueError("The weights and list don't have the same length.")
    w = _astype(weights, np.float64)
    return materialize(SparseCotangent((length,), np.dtype(np.float64), (x,), w, False))


_plain_bincount_p = _nondiff(
    "bincount", lambda x, w, minlength: np.bincount(x, w, minlength=minlength)
)


# --- unique: the values are the first occurrences (a gather), the rest has no derivative -------
# The number of unique values depends on the data. It is found by np.flatnonzero of a mask of
# fixed shape (a compiled replay checks the length it gets, and records again when it changes);
# a rank per position then orders the first occurrences as NumPy does.
def _unique_rank_impl(ar, axis, equal_nan, order):
    """For each position along the axis (all positions for axis=None): the rank of its value
    in NumPy's unique order if it is that value's first occurrence, else -1."""
    n = ar.size if axis is None else ar.shape[axis]
    if order == "values":
        index = _unique_values_index_impl(ar)
    else:
        index = np.unique(ar, return_index=True, axis=axis, equal_nan=equal_nan)[1]
    rank = np.full(n, -1, np.intp)
    rank[index] = np.arange(len(index))
    return rank


_unique_rank_p = _nondiff("unique_rank", _unique_rank_impl)
_unique_inverse_p = _nondiff(
    "unique_inverse",
    lambda ar, axis, equal_nan: np.unique(ar, return_inverse=True, axis=axis, equal_nan=equal_nan)[
        1
    ],
)


def _unique_index(ar, axis, equal_nan, order="sorted"):
    rank = bind(_unique_rank_p, (ar,), {"axis": axis, "equal_nan": equal_nan, "order": order})
    positions = np.flatnonzero(rank >= 0)
    return getitem(positions, np.argsort(getitem(rank, positions), kind="stable"))


@implements(np.unique)
def unique(
    ar,
    return_index=False,
    return_inverse=False,
    return_counts=False,
    axis=None,
    *,
    equal_nan=True,
    sorted=True,
):
    """np.unique: the unique values are gathered from their first occurrences."""
    if axis is None:
        flat = np.ravel(ar)
        index = _unique_index(flat, None, equal_nan)
        values = getitem(flat, index)
    else:
        axis = int(axis) % ndim_of(ar)
        index = _unique_index(ar, axis, equal_nan)
        values = np.take(ar, index, axis=axis)
    out = [values]
    if return_index:
        out.append(index)
    inverse = None
    if return_inverse or return_counts:
        inverse = bind(_unique_inverse_p, (ar,), {"axis": axis, "equal_nan": equal_nan})
    if return_inverse:
        out.append(inverse)
    if return_counts:
        out.append(
            bind(_plain_bincount_p, (np.ravel(inverse), None), {"minlength": shape_of(index)[0]})
        )
    return out[0] if len(out) == 1 else tuple(out)


def _unique_values_index_impl(x):
    """Positions whose values are np.unique_values(x), in its order (its order for integers is
    not sorted; each NaN is its own value)."""
    xf = x.ravel()
    values = np.unique_values(xf)
    inexact = xf.dtype.kind in "fc"
    nan_values = np.isnan(values) if inexact else np.zeros(values.shape, bool)
    ok = np.flatnonzero(~np.isnan(xf)) if inexact else np.arange(xf.size)
    sorted_values, first = np.unique(xf[ok], return_index=True)
    index = np.empty(values.shape, np.intp)
    index[~nan_values] = ok[first][np.searchsorted(sorted_values, values[~nan_values])]
    index[nan_values] = np.flatnonzero(np.isnan(xf)) if inexact else []
    return index


if hasattr(np, "unique_values"):

    @implements(np.unique_values)
    def unique_values(x, /):
        """np.unique_values: NumPy's unique values (in its order), gathered from x."""
        flat = np.ravel(x)
        return getitem(flat, _unique_index(flat, None, False, order="values"))

    @implements(np.unique_counts)
    def unique_counts(x, /):
        """np.unique_counts: the sorted unique values (differentiable) and their counts."""
        return np.lib._arraysetops_impl.UniqueCountsResult(
            *unique(x, return_counts=True, equal_nan=False)
        )

    @implements(np.unique_inverse)
    def unique_inverse(x, /):
        """np.unique_inverse: the sorted unique values (differentiable) and the inverse."""
        return np.lib._arraysetops_impl.UniqueInverseResult(
            *unique(x, return_inverse=True, equal_nan=False)
        )

    @implements(np.unique_all)
    def unique_all(x, /):
        """np.unique_all: values (differentiable), first indices, inverse and counts."""
        return np.lib._arraysetops_impl.UniqueAllResult(
            *unique(x, return_index=True, return_inverse=True, return_counts=True, equal_nan=False)
        )


for _f in (np.digitize, np.argpartition):
    _nondiff_function(_f, _f.__name__)

_lexsort_p = _nondiff("lexsort", lambda *keys, axis: np.lexsort(keys, axis=axis))
implements(np.lexsort)(lambda keys, axis=-1: bind(_lexsort_p, tuple(keys), {"axis": axis}))
