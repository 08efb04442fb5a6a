"""Reductions on every input NumPy accepts: where=, initial=, dtype=, keepdims, empty arrays,
all-NaN slices for the nan-reductions, ufunc.reduce keywords, and outputs of size one."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from breadth import assert_same_value, check_rule, traced_value
from conftest import argument_strategy
from hypothesis import given
from hypothesis import strategies as st

import gradtape as gt

DTYPES = st.sampled_from([np.float64, np.float32])
SHAPES = [(5,), (2, 3), (2, 3, 2)]


@st.composite
def axes(draw, ndim: int):
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return None
    if kind == "int":
        return draw(st.integers(-ndim, ndim - 1))
    return tuple(draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True)))


@st.composite
def distinct(draw, shape, dtype):
    n = int(np.prod(shape))
    order = np.array(draw(st.permutations(range(n))), dtype=np.float64)
    return ((order - n / 2) * 0.5 + 0.05).reshape(shape).astype(dtype)


# name -> f(x, axis, keepdims, where); the masked reductions with initial where NumPy needs it
MASKED = {
    "sum": lambda x, axis, k, w: np.sum(x, axis=axis, keepdims=k, where=w),
    "sum_initial": lambda x, axis, k, w: np.sum(x, axis=axis, keepdims=k, where=w, initial=1.5),
    "prod": lambda x, axis, k, w: np.prod(x, axis=axis, keepdims=k, where=w),
    "mean": lambda x, axis, k, w: np.mean(x, axis=axis, keepdims=k, where=w),
    "var": lambda x, axis, k, w: np.var(x, axis=axis, keepdims=k, where=w),
    "std": lambda x, axis, k, w: np.std(x, axis=axis, keepdims=k, where=w),
    "max": lambda x, axis, k, w: np.max(x, axis=axis, keepdims=k, where=w, initial=-10.0),
    "min": lambda x, axis, k, w: np.min(x, axis=axis, keepdims=k, where=w, initial=10.0),
    "nansum": lambda x, axis, k, w: np.nansum(x, axis=axis, keepdims=k, where=w),
    "nanprod": lambda x, axis, k, w: np.nanprod(x, axis=axis, keepdims=k, where=w),
    "nanmean": lambda x, axis, k, w: np.nanmean(x, axis=axis, keepdims=k, where=w),
    "nanvar": lambda x, axis, k, w: np.nanvar(x, axis=axis, keepdims=k, where=w),
    "nanmax": lambda x, axis, k, w: np.nanmax(x, axis=axis, keepdims=k, where=w, initial=-10.0),
    "nanmin": lambda x, axis, k, w: np.nanmin(x, axis=axis, keepdims=k, where=w, initial=10.0),
    "add_reduce": lambda x, axis, k, w: np.add.reduce(x, axis=axis, keepdims=k, where=w),
    "maximum_reduce": lambda x, axis, k, w: np.maximum.reduce(
        x, axis=axis, keepdims=k, where=w, initial=-10.0
    ),
}
NEEDS_DISTINCT = {"max", "min", "nanmax", "nanmin", "maximum_reduce", "std"}


@pytest.mark.parametrize("name", MASKED)
@given(data=st.data(), dtype=DTYPES, keepdims=st.booleans())
def test_where_and_initial(name, data, dtype, keepdims):
    func = MASKED[name]
    shape = data.draw(st.sampled_from(SHAPES), label="shape")
    x = data.draw(
        distinct(shape, dtype)
        if name in NEEDS_DISTINCT
        else argument_strategy(shape, ((-2.0, -0.5), (0.5, 2.0)), dtype),
        label="x",
    )
    axis = data.draw(axes(len(shape)), label="axis")
    mask = np.arange(x.size).reshape(shape) % 3 != 1
    if np.min(np.sum(mask, axis=axis), initial=2) < 2:  # every slice keeps two entries
        mask = np.ones(shape, bool)
        mask.reshape(-1)[1] = False
        if np.min(np.sum(mask, axis=axis), initial=2) < 2:
            mask = np.ones(shape, bool)
    if name.startswith("nan"):
        x = x.copy()
        x.reshape(-1)[::4] = np.nan
        assert_same_value(
            traced_value(lambda x: func(x, axis, keepdims, mask), x),
            _quiet(func, x, axis, keepdims, mask),
        )
        return
    check_rule(lambda x: func(x, axis, keepdims, mask), x, compiled=dtype == np.float64)


def _quiet(func, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return func(*args)


NAN_FUNCS = {
    "nansum": np.nansum,
    "nanprod": np.nanprod,
    "nanmean": np.nanmean,
    "nanvar": np.nanvar,
    "nanstd": np.nanstd,
    "nanmax": np.nanmax,
    "nanmin": np.nanmin,
    "nanvar_ddof": lambda x, axis: np.nanvar(x, axis=axis, ddof=1),
    "nancumsum": np.nancumsum,
    "nancumprod": np.nancumprod,
}


@pytest.mark.parametrize("name", NAN_FUNCS)
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_nan_reductions_match_numpy_with_nans(name, axis):
    func = NAN_FUNCS[name]
    x = np.array(
        [
            [1.5, np.nan, -0.7, 2.0],
            [np.nan, np.nan, np.nan, np.nan],
            [0.3, 1.1, np.nan, -1.6],
            [0.9, -0.4, 0.8, np.nan],
        ]
    )
    expected = _quiet(func, x, axis)
    got = _quiet(traced_value, lambda x: func(x, axis), x)
    assert_same_value(got, expected)
    # the gradient reaches exactly the non-NaN entries (finite differences: the NaNs stay put)
    w = np.linspace(0.5, 1.5, np.size(expected)).reshape(np.shape(expected))

    def loss(x):
        r = func(x, axis)
        return np.sum(np.where(np.isnan(r), 0.0, w * r))

    g = _quiet(gt.grad(loss), x)
    assert np.all(g[np.isnan(x)] == 0)
    ok = ~np.isnan(x)
    h = 1e-6
    for i in zip(*np.nonzero(ok)):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        fd = (_quiet(loss, xp) - _quiet(loss, xm)) / (2 * h)
        np.testing.assert_allclose(g[i], fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "name, warning",
    [
        ("nanmax", "All-NaN"),
        ("nanmin", "All-NaN"),
        ("nanmean", "Mean of empty"),
        ("nanvar", "Degrees of freedom"),
    ],
)
def test_all_nan_slices_warn_like_numpy(name, warning):
    x = np.full((2, 3), np.nan)
    x[0, 1] = 2.0
    func = getattr(np, name)
    with pytest.warns(RuntimeWarning, match=warning):
        got = traced_value(lambda x: func(x, axis=1), x)
    assert_same_value(got, _quiet(func, x, 1))


@pytest.mark.parametrize(
    "func",
    [
        np.sum,
        np.prod,
        np.mean,
        np.var,
        np.std,
        np.nansum,
        np.nanmean,
        np.ptp,
        np.max,
        np.cumsum,
        np.nanvar,
        np.nanstd,
        np.nanmax,
        np.nanprod,
        np.nancumsum,
        np.median,
        np.nanmedian,
        lambda x, axis: np.quantile(x, 0.5, axis=axis),
        lambda x, axis: np.nanquantile(x, [0.2, 0.5], axis=axis),
        lambda x, axis: np.max(x, axis=axis, initial=1.0),
        lambda x, axis: np.std(x, axis=axis, ddof=1),
        lambda x, axis: np.logaddexp.reduce(x, axis=axis),
        lambda x, axis: np.subtract.reduce(x, axis=axis),
    ],
    ids=lambda f: f.__name__,
)
def test_empty_arrays(func):
    """Empty reductions give NumPy's value (0, 1, NaN with its warning) or NumPy's error; the
    gradient is an empty array, never a ZeroDivisionError from a rule."""
    for shape, axis in (((0,), None), ((0, 3), 0), ((2, 0), 1), ((2, 0), 0)):
        x = np.zeros(shape)
        try:
            expected = _quiet(lambda x, axis: func(x, axis=axis), x, axis)
        except (ValueError, IndexError) as e:
            with pytest.raises(type(e), match=str(e)[:20]):
                traced_value(lambda x: func(x, axis=axis), x)
            continue
        assert_same_value(_quiet(traced_value, lambda x: func(x, axis=axis), x), expected)
        g = _quiet(gt.grad(lambda x: np.sum(func(x, axis=axis) * 2.0)), x)
        assert g.shape == shape


def test_degrees_of_freedom_exhausted():
    x = np.array([[1.0, 2.0], [3.0, 5.0]])
    for ddof in (2, 3):
        expected = _quiet(np.var, x, 1, None, None, ddof)
        with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
            got = traced_value(lambda x: np.var(x, axis=1, ddof=ddof), x)
        assert_same_value(got, expected)
        _quiet(gt.grad(lambda x: np.sum(np.var(x, axis=1, ddof=ddof))), x)


def test_max_with_where_needs_initial_as_in_numpy():
    x = np.array([1.0, 2.0])
    with pytest.raises(ValueError, match="identity"):
        np.max(x, where=x > 1)
    with pytest.raises(ValueError, match="identity"):
        gt.grad(lambda x: np.max(x, where=np.array([True, False])))(x)


def test_initial_on_empty_and_winning():
    x = np.array([1.0, 2.0])
    assert gt.grad(lambda x: np.max(x, initial=5.0))(x).tolist() == [0.0, 0.0]
    assert gt.grad(lambda x: np.max(x, initial=0.0))(x).tolist() == [0.0, 1.0]
    assert_same_value(traced_value(lambda x: np.max(x[:0], initial=3.0), x), np.float64(3.0))
    assert_same_value(traced_value(lambda x: np.sum(x, initial=3.0), x), np.float64(6.0))
    assert_same_value(traced_value(lambda x: np.prod(x, initial=3.0), x), np.float64(6.0))


def test_var_with_mean_argument():
    x = np.array([[1.0, 2.5, -0.5], [0.3, 0.1, 4.0]])
    check_rule(lambda x: np.var(x, axis=1, mean=np.mean(x, axis=1, keepdims=True)), x)
    check_rule(lambda x: np.std(x, axis=0, ddof=1, mean=np.mean(x, axis=0, keepdims=True)), x)


@pytest.mark.parametrize(
    "func, dtype",
    [
        (np.sum, np.int64),
        (np.sum, np.float32),
        (np.mean, np.float32),
        (np.cumsum, np.int64),
        (np.prod, np.float32),
        (np.nansum, np.float32),
    ],
)
def test_dtype_casts_before_reducing(func, dtype):
    """NumPy reduces in `dtype`: sum([0.5, 0.5], dtype=int) is 0, not int(1.0)."""
    x = np.array([0.5, 0.5, 1.75, 2.25])
    got = traced_value(lambda x: func(x, dtype=dtype), x)
    assert_same_value(got, func(x, dtype=dtype))


@pytest.mark.parametrize(
    "reduce, kwargs",
    [
        (np.add.reduce, {"initial": 2.0}),
        (np.add.reduce, {"dtype": np.float64}),
        (np.multiply.reduce, {"where": np.array([True, False, True])}),
        (np.maximum.reduce, {"initial": 0.5}),
        (np.minimum.reduce, {"axis": None}),
        (np.add.accumulate, {"dtype": np.float64}),
    ],
)
def test_ufunc_reduce_keywords(reduce, kwargs):
    x = np.array([0.3, -1.2, 2.0], np.float32 if "dtype" in kwargs else np.float64)
    check_rule(lambda x: reduce(x, **kwargs), x, compiled=False)


def test_ptp():
    x = np.array([[0.3, -1.2, 2.0], [1.5, 0.1, -0.7]])
    for axis in (None, 0, 1):
        check_rule(lambda x: np.ptp(x, axis=axis), x)
    check_rule(lambda x: np.ptp(x, axis=1, keepdims=True), x)


# --- outputs of size one: grad works as in HIPS autograd ----------------------------------------
@pytest.mark.parametrize(
    "f",
    [
        lambda x: np.sum(x**2, keepdims=True),
        lambda x: np.reshape(np.sum(x * x), (1, 1)),
        lambda x: x[:1] * x[1:2],
    ],
    ids=["(1,)", "(1, 1)", "slice"],
)
def test_grad_of_an_output_of_size_one(f):
    x = np.array([1.0, 2.0, 3.0])
    ref = gt.grad(lambda x: np.sum(f(x)))(x)
    np.testing.assert_allclose(gt.grad(f)(x), ref)
    value, g = gt.value_and_grad(f)(x)
    assert np.shape(value) == np.shape(f(x))
    np.testing.assert_allclose(g, ref)
    np.testing.assert_allclose(gt.compile(gt.grad(f), backend="numpy")(x), ref)


def test_grad_of_a_larger_output_still_refuses():
    with pytest.raises(gt.GradtapeError, match="scalar output"):
        gt.grad(lambda x: x * 2.0)(np.ones(2))
