"""Order statistics and sample statistics against NumPy's values and central differences:
median, quantile, percentile (every method) and their nan-versions, cov, corrcoef, histogram,
bincount, unique, digitize."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from breadth import assert_same_value, check_rule, traced_value
from conftest import central_difference_grad
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradtape as gt
from gradtape._compat import QUANTILE_WEAK_Q_IN_INPUT_DTYPE

DTYPES = st.sampled_from([np.float64, np.float32])
SHAPES = [(1,), (5,), (4, 3), (2, 3, 2)]
METHODS = [
    "inverted_cdf",
    "averaged_inverted_cdf",
    "closest_observation",
    "interpolated_inverted_cdf",
    "hazen",
    "weibull",
    "linear",
    "median_unbiased",
    "normal_unbiased",
    "lower",
    "higher",
    "midpoint",
    "nearest",
]


@st.composite
def distinct(draw, shape, dtype):
    """Distinct values 0.5 apart (no ties: the order, hence the gradient, is unambiguous)."""
    n = int(np.prod(shape))
    order = np.array(draw(st.permutations(range(n))), dtype=np.float64)
    return ((order - n / 2) * 0.5 + 0.05).reshape(shape).astype(dtype)


@st.composite
def axes(draw, ndim):
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return None
    if kind == "int":
        return draw(st.integers(-ndim, ndim - 1))
    return tuple(draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True)))


def _quiet(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return f(*args)


@pytest.mark.parametrize("method", METHODS)
@given(data=st.data(), dtype=DTYPES, keepdims=st.booleans())
def test_quantile(method, data, dtype, keepdims):
    shape = data.draw(st.sampled_from(SHAPES), label="shape")
    x = data.draw(distinct(shape, dtype), label="x")
    axis = data.draw(axes(len(shape)), label="axis")
    # (NumPy before 2.4 computes a float32 input's index in float32, central differences
    # in float64: a Python-float q is drawn representable in float32 there, so both agree)
    width = 32 if dtype == np.float32 and QUANTILE_WEAK_Q_IN_INPUT_DTYPE else 64
    q = data.draw(
        st.one_of(
            st.floats(0.0, 1.0, width=width),
            hnp.arrays(np.float64, st.integers(1, 3), elements=st.floats(0.0, 1.0)),
        ),
        label="q",
    )
    check_rule(
        lambda x: np.quantile(x, q, axis=axis, method=method, keepdims=keepdims),
        x,
        compiled=dtype == np.float64,
    )
    check_rule(
        lambda x: np.percentile(
            x, np.multiply(q, 100), axis=axis, method=method, keepdims=keepdims
        ),
        x,
        compiled=False,
        forward=False,
    )


@given(data=st.data(), dtype=DTYPES, keepdims=st.booleans())
def test_median(data, dtype, keepdims):
    shape = data.draw(st.sampled_from(SHAPES), label="shape")
    x = data.draw(distinct(shape, dtype), label="x")
    axis = data.draw(axes(len(shape)), label="axis")
    check_rule(
        lambda x: np.median(x, axis=axis, keepdims=keepdims), x, compiled=dtype == np.float64
    )


NAN_ORDER = {
    "nanmedian": lambda x, axis: np.nanmedian(x, axis=axis),
    "nanquantile": lambda x, axis: np.nanquantile(x, [0.2, 0.75], axis=axis),
    "nanquantile_lower": lambda x, axis: np.nanquantile(x, 0.4, axis=axis, method="lower"),
    "nanpercentile": lambda x, axis: np.nanpercentile(x, 35.0, axis=axis, keepdims=True),
    "median_with_nan": lambda x, axis: np.median(x, axis=axis),
    "quantile_with_nan": lambda x, axis: np.quantile(x, 0.3, axis=axis),
}


@pytest.mark.parametrize("name", NAN_ORDER)
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_order_statistics_with_nans(name, axis):
    func = NAN_ORDER[name]
    x = np.array(
        [
            [1.5, np.nan, -0.7, 2.0, 0.2],
            [np.nan] * 5,
            [0.3, 1.1, np.nan, -1.6, 0.9],
            [0.95, -0.4, 0.8, np.nan, 2.5],
        ]
    )
    expected = _quiet(func, x, axis)
    assert_same_value(_quiet(traced_value, lambda x: func(x, axis), x), expected)
    w = np.linspace(0.5, 1.5, np.size(expected)).reshape(np.shape(expected))

    def loss(x):
        r = func(x, axis)
        return np.sum(np.where(np.isnan(r), 0.0, w * r))

    g = _quiet(gt.grad(loss), x)
    assert np.all(g[np.isnan(x)] == 0)
    for i in zip(*np.nonzero(~np.isnan(x))):
        xp, xm = x.copy(), x.copy()
        xp[i] += 1e-6
        xm[i] -= 1e-6
        fd = (_quiet(loss, xp) - _quiet(loss, xm)) / 2e-6
        np.testing.assert_allclose(g[i], fd, rtol=1e-5, atol=1e-7)
    cf = gt.compile(lambda x: func(x, axis), backend="numpy")
    _quiet(cf, x)
    y = x.copy()
    y[0, 0], y[2, 1] = np.nan, 7.0  # another NaN pattern: the compiled function picks again
    assert_same_value(_quiet(cf, y), _quiet(func, y, axis))


def test_quantile_compiled_picks_again_for_new_values():
    f = gt.compile(gt.grad(lambda x: np.quantile(x, 0.3) + np.median(x) * 2.0), backend="numpy")
    ref = gt.grad(lambda x: np.quantile(x, 0.3) + np.median(x) * 2.0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.normal(size=7)
        np.testing.assert_allclose(f(x), ref(x))


def test_weighted_quantile():
    x = np.array([0.3, -1.2, 2.0, 1.5, 0.1, -0.7])
    weights = np.array([1.0, 2.0, 0.5, 1.0, 3.0, 1.0])
    for q in (0.1, 0.5, [0.25, 0.9]):
        check_rule(lambda x: np.quantile(x, q, method="inverted_cdf", weights=weights), x)
    m = x.reshape(2, 3)
    check_rule(
        lambda m: np.quantile(
            m, 0.5, axis=1, method="inverted_cdf", weights=np.array([1.0, 2.0, 1.0])
        ),
        m,
    )


def test_quantile_errors_match_numpy():
    x = np.array([1.0, 2.0])
    with pytest.raises(ValueError, match="range"):
        traced_value(lambda x: np.quantile(x, 1.5), x)
    with pytest.raises(ValueError, match="not a valid method"):
        traced_value(lambda x: np.quantile(x, 0.5, method="bogus"), x)
    with pytest.raises(ValueError, match="Percentiles"):
        traced_value(lambda x: np.percentile(x, 150), x)


def test_quantile_with_a_traced_q():
    x = np.array([0.3, -1.2, 2.0, 1.5, 0.1])
    check_rule(lambda q: np.quantile(x, q), np.array([0.15, 0.6]))
    check_rule(lambda q: np.quantile(x, q, method="hazen"), np.array([0.35]))


# --- cov and corrcoef -------------------------------------------------------------------------
M = np.array([[0.3, -1.2, 2.0, 1.5], [0.1, -0.7, 0.4, 1.1], [1.3, 0.2, -0.5, 0.6]])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"rowvar": False},
        {"bias": True},
        {"ddof": 2},
        {"aweights": np.array([1.0, 2.0, 0.5, 1.5])},
        {"fweights": np.array([1, 2, 1, 3])},
        {"fweights": np.array([1, 2, 1, 3]), "aweights": np.array([1.0, 2.0, 0.5, 1.5]), "ddof": 1},
    ],
)
def test_cov(kwargs):
    check_rule(lambda m: np.cov(m, **kwargs), M)
    check_rule(lambda m: np.cov(m[0], m[1], **kwargs), M)


def test_cov_traced_weights_and_edge_cases():
    check_rule(lambda w: np.cov(M, aweights=w), np.array([1.0, 2.0, 0.5, 1.5]))
    check_rule(lambda v: np.cov(v), M[0])
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        got = traced_value(lambda m: np.cov(m[:, :1]), M)
    assert_same_value(got, _quiet(np.cov, M[:, :1]))


@pytest.mark.parametrize("kwargs", [{}, {"rowvar": False}])
def test_corrcoef(kwargs):
    check_rule(lambda m: np.corrcoef(m, **kwargs), M)
    check_rule(lambda m: np.corrcoef(m[0], m[2], **kwargs), M)


# --- histograms, counts, unique ---------------------------------------------------------------
X = np.array([0.3, -1.2, 2.0, 1.5, 0.1, -0.7, 0.45, 1.05])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"bins": 3},
        {"bins": 4, "range": (-1.0, 1.0)},
        {"bins": np.array([-2.0, 0.0, 0.5, 3.0])},
        {"bins": "auto"},
        {"bins": 5, "density": True},
    ],
)
def test_histogram(kwargs):
    counts, edges = traced_value(lambda x: np.histogram(x, **kwargs), X)
    ref_counts, ref_edges = np.histogram(X, **kwargs)
    assert_same_value(counts, ref_counts)
    assert_same_value(edges, ref_edges)
    # the edges follow the data's minimum and maximum (when they come from the data)
    if isinstance(kwargs.get("bins", 10), (int, str)) and "range" not in kwargs:
        check_rule(lambda x: np.histogram(x, **kwargs)[1], X, compiled=False)
    w = np.linspace(0.5, 2.0, X.size)
    if kwargs.get("bins") != "auto" if isinstance(kwargs.get("bins"), str) else True:
        check_rule(lambda w: np.histogram(X, weights=w, **kwargs)[0], w, compiled=False)


def test_bincount_digitize_unique():
    idx = np.array([0, 2, 2, 5, 1])
    check_rule(lambda w: np.bincount(idx, weights=w, minlength=8), np.linspace(0.5, 1.5, 5))
    assert_same_value(
        traced_value(lambda x: np.digitize(x, [0.0, 1.0]) * 1.0, X),
        np.digitize(X, [0.0, 1.0]) * 1.0,
    )
    check_rule(lambda y: np.unique(y), np.array([2.0, 1.0, -0.5, 3.0]))
    y = np.array([2.0, 1.0, 2.0, -0.5, 1.0, 3.0])
    values, index, inverse, counts = traced_value(
        lambda y: np.unique(y, return_index=True, return_inverse=True, return_counts=True), y
    )
    for got, ref in zip(
        (values, index, inverse, counts),
        np.unique(y, return_index=True, return_inverse=True, return_counts=True),
    ):
        assert_same_value(got, ref)
    g = gt.grad(lambda y: np.sum(np.unique(y) * np.array([1.0, 2.0, 3.0, 4.0])))(y)
    np.testing.assert_allclose(g, [3.0, 2.0, 0.0, 1.0, 0.0, 4.0])  # first occurrences
    cf = gt.compile(lambda y: np.unique(y), backend="numpy")
    assert_same_value(cf(y), np.unique(y))
    assert_same_value(cf(y[::-1].copy()), np.unique(y[::-1]))


COMPILED = {
    "mean_where": lambda x: np.mean(x, where=x > 0),
    "sum_where": lambda x: np.sum(x**2, where=x > 0),
    "var_where": lambda x: np.var(x, where=x > -0.5),
    "max_where": lambda x: np.max(x, where=x < 1, initial=-5.0),
    "nanmean": lambda x: np.nanmean(np.where(x > 1, np.nan, x)),
    "nanmedian": lambda x: np.nanmedian(np.where(x > 1, np.nan, x)),
    "histogram_edges": lambda x: np.sum(np.histogram(x, bins=3)[1] ** 2),
    "unique": lambda x: np.sum(np.unique(np.round(x)) ** 2 * x[:1]),
    "unique_counts": lambda x: np.sum(np.unique(np.round(x), return_counts=True)[1] * x[0]),
    "bincount": lambda x: np.sum(np.bincount(np.array([0, 1, 1, 3, 2]), weights=x) ** 2),
    "interp": lambda x: np.sum(np.interp(x, [-1.0, 0.0, 1.0], [1.0, 3.0, 2.0])),
    "partition": lambda x: np.sum(np.partition(x, 2)[:3] ** 2),
}


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_value_and_gradient_follow_the_data(name):
    """Data-dependent choices (masks, picks, lengths) are made again on every compiled call."""
    f = COMPILED[name]
    cf = gt.compile(gt.value_and_grad(f), backend="numpy")
    rng = np.random.default_rng(0)
    for _ in range(6):
        x = rng.normal(size=5)
        value, g = _quiet(cf, x)
        ref_value, ref_g = _quiet(gt.value_and_grad(f), x)
        np.testing.assert_allclose(value, _quiet(f, x), equal_nan=True)
        np.testing.assert_allclose(value, ref_value, equal_nan=True)
        np.testing.assert_allclose(g, ref_g, equal_nan=True)


_HX = np.random.default_rng(7).normal(size=40)
_HY = np.random.default_rng(8).normal(size=40)
_HW = np.random.default_rng(9).uniform(0.5, 1.5, size=40)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"bins": [3, 5]},
        {"bins": 3, "range": [[-1.0, 1.0], [-2.0, 2.0]]},
        {"bins": 4, "density": True},
        {"bins": [np.linspace(-2.0, 2.0, 4), 3], "density": True},
    ],
)
def test_histogram2d_values_and_gradients(kwargs):
    expected = np.histogram2d(_HX, _HY, weights=_HW, **kwargs)
    got = gt.vjp(lambda w: np.histogram2d(_HX, _HY, weights=w, **kwargs), _HW)[0]
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-13)
    cells = np.cos(np.arange(expected[0].size)).reshape(expected[0].shape)

    def loss(w, x):
        return np.sum(cells * np.histogram2d(x, _HY, weights=w, **kwargs)[0])

    # in the weights: the cell each point falls in; in the data: through the edges' min and max
    np.testing.assert_allclose(
        gt.grad(loss)(_HW, _HX), central_difference_grad(loss, (_HW, _HX), 0), rtol=1e-6
    )
    gx = gt.grad(loss, argnums=1)(_HW, _HX)
    if "range" in kwargs or isinstance(kwargs.get("bins"), list):
        assert np.all(np.isfinite(gx))
    else:  # the edges move with min(x) and max(x) only if the bins come from the data
        np.testing.assert_allclose(gx, central_difference_grad(loss, (_HW, _HX), 1), atol=1e-6)


def test_histogramdd_of_an_n_by_d_sample():
    sample = np.stack([_HX, _HY, _HW], axis=1)
    expected = np.histogramdd(sample, bins=3, weights=_HW)
    got = gt.vjp(lambda s: np.histogramdd(s, bins=3, weights=_HW), sample)[0]
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-13)
    for e, g in zip(expected[1], got[1]):
        np.testing.assert_allclose(g, e, rtol=1e-13)
    counts = gt.vjp(lambda s: np.histogramdd(s, bins=(2, 3, 2)), sample)[0][0]
    np.testing.assert_array_equal(counts, np.histogramdd(sample, bins=(2, 3, 2))[0])
