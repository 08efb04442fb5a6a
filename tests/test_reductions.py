"""Reductions and scans: axis (None, int, negative, tuple), keepdims, dtypes, zeros and ties."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    argument_strategy,
    assert_grad_matches,
    central_difference_grad,
    weights_like,
)
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradtape as gt

SHAPES = [(5,), (2, 3), (2, 3, 2)]
DTYPES = st.sampled_from([np.float64, np.float32])


@st.composite
def axes(draw, ndim: int):
    """None, an int (possibly negative) or a tuple of distinct axes (possibly negative)."""
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return None
    if kind == "int":
        return draw(st.integers(-ndim, ndim - 1))
    chosen = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(a - ndim if draw(st.booleans()) else a for a in chosen)


@st.composite
def separated_arrays(draw, shape: tuple, dtype):
    """Values at least 0.4 apart (no ties, and no kink within a finite-difference step)."""
    n = int(np.prod(shape))
    order = np.array(draw(st.permutations(range(n))), dtype=np.float64)
    jitter = draw(hnp.arrays(np.float64, n, elements=st.floats(0.0, 0.1)))
    return ((order - n / 2) * 0.5 + jitter).reshape(shape).astype(dtype)


def _sum(x, axis, keepdims):
    return np.sum(x, axis=axis, keepdims=keepdims)


# name -> (f(x, axis, keepdims), element intervals, distinct values needed (no ties))
REDUCTIONS = {
    "sum": (_sum, ((-3.0, 3.0),), False),
    "mean": (
        lambda x, axis, keepdims: np.mean(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        False,
    ),
    "prod": (
        lambda x, axis, keepdims: np.prod(x, axis=axis, keepdims=keepdims),
        ((-2.0, -0.5), (0.5, 2.0)),
        False,
    ),
    "max": (
        lambda x, axis, keepdims: np.max(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "min": (
        lambda x, axis, keepdims: np.min(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "amax": (
        lambda x, axis, keepdims: np.amax(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "amin": (
        lambda x, axis, keepdims: np.amin(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "var": (
        lambda x, axis, keepdims: np.var(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        False,
    ),
    "var_ddof1": (
        lambda x, axis, keepdims: np.var(x, axis=axis, ddof=1, keepdims=keepdims),
        ((-3.0, 3.0),),
        False,
    ),
    "std": (
        lambda x, axis, keepdims: np.std(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "std_ddof1": (
        lambda x, axis, keepdims: np.std(x, axis=axis, ddof=1, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "method_sum": (
        lambda x, axis, keepdims: x.sum(axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        False,
    ),
    "method_mean": (
        lambda x, axis, keepdims: x.mean(axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        False,
    ),
    "method_prod": (
        lambda x, axis, keepdims: x.prod(axis=axis, keepdims=keepdims),
        ((0.5, 2.0),),
        False,
    ),
    "method_max": (
        lambda x, axis, keepdims: x.max(axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "method_min": (
        lambda x, axis, keepdims: x.min(axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "method_var": (
        lambda x, axis, keepdims: x.var(axis=axis, ddof=1, keepdims=keepdims),
        ((-3.0, 3.0),),
        False,
    ),
    "method_std": (
        lambda x, axis, keepdims: x.std(axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
    "add_reduce": (
        lambda x, axis, keepdims: np.add.reduce(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        False,
    ),
    "maximum_reduce": (
        lambda x, axis, keepdims: np.maximum.reduce(x, axis=axis, keepdims=keepdims),
        ((-3.0, 3.0),),
        True,
    ),
}


def _needs_more_than(func_name: str, x, axis) -> bool:
    """ddof=1 needs 2 elements per reduction; std needs them to differ (unique takes care)."""
    if "ddof1" not in func_name and func_name != "method_var":
        return False
    axes_ = range(x.ndim) if axis is None else np.atleast_1d(axis)
    return int(np.prod([x.shape[a] for a in axes_])) < 2


@pytest.mark.parametrize("name", REDUCTIONS)
@given(data=st.data(), dtype=DTYPES, keepdims=st.booleans())
def test_reduction_gradient(name, data, dtype, keepdims):
    func, intervals, distinct = REDUCTIONS[name]
    shape = data.draw(st.sampled_from(SHAPES), label="shape")
    x = data.draw(
        separated_arrays(shape, dtype) if distinct else argument_strategy(shape, intervals, dtype),
        label="x",
    )
    axis = data.draw(axes(len(shape)), label="axis")
    if name.startswith("maximum_reduce") and isinstance(axis, tuple) and len(axis) > 1:
        axis = axis[0]
    if _needs_more_than(name, x, axis):
        return
    out = func(x, axis, keepdims)
    assert np.shape(gt.grad(lambda x: np.sum(func(x, axis, keepdims)))(x)) == x.shape
    weights = weights_like(np.shape(out), dtype)
    assert_grad_matches(
        lambda x: np.sum(weights * func(x, axis, keepdims)), x, complex_step=not distinct
    )


@pytest.mark.parametrize("method", [False, True], ids=["function", "method"])
def test_traced_reduction_values_match_numpy(method):
    """The value computed while tracing is NumPy's (shape, keepdims, negative axes)."""
    x = np.arange(24.0).reshape(2, 3, 4) / 7
    for axis in (None, 0, -1, (0, 2), (-1, -3)):
        for keepdims in (False, True):

            def f(x, axis=axis, keepdims=keepdims):
                s = (
                    x.sum(axis=axis, keepdims=keepdims)
                    if method
                    else np.sum(x, axis=axis, keepdims=keepdims)
                )
                return np.sum(s * s), s

            (_, s), _ = gt.value_and_grad(f, has_aux=True)(x)
            np.testing.assert_allclose(s, np.sum(x, axis=axis, keepdims=keepdims))


# --- prod with zeros: the derivative is the product of the other elements ---------------------
@pytest.mark.parametrize(
    "x, expected",
    [
        ([2.0, 0.0, 3.0, -1.5], [0.0, -9.0, 0.0, 0.0]),  # one zero: only it has a gradient
        ([2.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]),  # two zeros: all zero
        ([0.0], [1.0]),
        ([0.0, 0.0], [0.0, 0.0]),
    ],
)
def test_prod_with_zeros(x, expected):
    x = np.array(x)
    g = assert_grad_matches(lambda x: np.prod(x), x)
    np.testing.assert_array_equal(g, expected)


def test_prod_with_zeros_along_an_axis():
    x = np.array([[1.0, 0.0, 2.0], [3.0, 4.0, 5.0], [0.0, 0.0, 7.0]])
    for axis in (0, 1, -1, None):
        w = weights_like(np.prod(x, axis=axis).shape, np.float64)
        assert_grad_matches(lambda x: np.sum(w * np.prod(x, axis=axis)), x)


# --- max / min with ties: the k tied elements share the cotangent -----------------------------
@pytest.mark.parametrize(
    "func, x, expected",
    [
        (np.max, [1.0, 3.0, 3.0, 2.0], [0.0, 0.5, 0.5, 0.0]),
        (np.min, [1.0, 1.0, 1.0, 2.0], [1 / 3, 1 / 3, 1 / 3, 0.0]),
        (np.amax, [[2.0, 2.0], [1.0, 2.0]], [[1 / 3, 1 / 3], [0.0, 1 / 3]]),
    ],
)
def test_max_min_ties_share(func, x, expected):
    g = gt.grad(lambda x: func(x))(np.array(x))
    np.testing.assert_allclose(g, expected)


def test_max_ties_along_an_axis():
    x = np.array([[1.0, 1.0, 0.0], [2.0, 5.0, 5.0]])
    g = gt.grad(lambda x: np.sum(np.max(x, axis=1) * np.array([1.0, 4.0])))(x)
    np.testing.assert_allclose(g, [[0.5, 0.5, 0.0], [0.0, 2.0, 2.0]])


# --- cumulative ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "func",
    [
        np.cumsum,
        np.cumprod,
        lambda x, axis: x.cumsum(axis=axis),
        lambda x, axis: x.cumprod(axis=axis),
        lambda x, axis: np.add.accumulate(x, axis=axis or 0),
        lambda x, axis: np.multiply.accumulate(x, axis=axis or 0),
    ],
    ids=[
        "cumsum",
        "cumprod",
        "method_cumsum",
        "method_cumprod",
        "add_accumulate",
        "multiply_accumulate",
    ],
)
@given(data=st.data(), dtype=DTYPES)
def test_cumulative_gradient(func, data, dtype):
    shape = data.draw(st.sampled_from(SHAPES), label="shape")
    x = data.draw(argument_strategy(shape, ((-2.0, -0.5), (0.5, 2.0)), dtype), label="x")
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)), label="axis")
    weights = weights_like(np.shape(func(x, axis)), dtype)
    assert_grad_matches(lambda x: np.sum(weights * func(x, axis)), x)


@pytest.mark.parametrize(
    "x", [[2.0, 0.0, 3.0, -1.0], [0.0, 2.0, 3.0], [1.5, 0.0, 0.0, 2.0], [2.0, 3.0, 0.0]]
)
def test_cumprod_with_zeros(x):
    x = np.array(x)
    w = np.array([1.0, -2.0, 0.5, 3.0])[: x.size]
    g = assert_grad_matches(lambda x: np.sum(w * np.cumprod(x)), x)
    np.testing.assert_allclose(g, _cumprod_gradient_closed_form(x, w))


def _cumprod_gradient_closed_form(x, w):
    """d/dx_i sum_j w_j prod_{k<=j} x_k = sum_{j>=i} w_j prod_{k<=j, k!=i} x_k (no division)."""
    return np.array(
        [
            sum(w[j] * np.prod(np.delete(x[: j + 1], i)) for j in range(i, x.size))
            for i in range(x.size)
        ]
    )


@pytest.mark.parametrize(
    "x",
    [[2.0, 0.0, 3.0, -1.0], [0.0, 0.0, 3.0, -1.0], [2.0, 0.0, 0.0, -1.0], [1.5, 0.7, 2.0, -1.0]],
)
def test_second_derivative_of_cumprod_and_prod_with_zeros(x):
    """grad of <grad f, v> against central differences of the closed-form gradient."""
    x, w, v = np.array(x), np.array([1.0, -2.0, 0.5, 3.0]), np.array([0.3, 1.0, -1.0, 2.0])
    hvp = gt.grad(lambda x: np.sum(gt.grad(lambda y: np.sum(w * np.cumprod(y)))(x) * v))(x)
    fd = central_difference_grad(lambda x: np.sum(_cumprod_gradient_closed_form(x, w) * v), [x], 0)
    np.testing.assert_allclose(hvp, fd, atol=1e-7)
    # prod: d2/dx_i dx_j prod(x) = prod of the elements other than i and j
    hvp = gt.grad(lambda x: np.sum(gt.grad(lambda y: np.prod(y))(x) * v))(x)
    hessian = [
        [0.0 if i == j else np.prod(np.delete(x, [i, j])) for j in range(4)] for i in range(4)
    ]
    np.testing.assert_allclose(hvp, np.array(hessian) @ v, atol=1e-12)


def test_cumprod_with_zeros_2d():
    x = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    for axis in (0, 1, None):
        w = weights_like(np.cumprod(x, axis=axis).shape, np.float64)
        assert_grad_matches(lambda x: np.sum(w * np.cumprod(x, axis=axis)), x)


# --- average --------------------------------------------------------------------------------------
A = np.array([[0.3, -1.2, 2.0], [1.5, 0.1, -0.7]])


@pytest.mark.parametrize(
    "axis, weights",
    [
        (None, None),
        (0, None),
        (1, None),
        (None, np.array([[1.0, 2.0, 0.5], [0.2, 1.0, 3.0]])),
        (1, np.array([1.0, 2.0, 0.5])),
        (0, np.array([0.3, 0.7])),
        (-1, np.array([1.0, 2.0, 0.5])),
    ],
)
def test_average(axis, weights):
    out_shape = np.average(A, axis=axis, weights=weights).shape
    w = weights_like(out_shape, np.float64)
    assert_grad_matches(lambda a: np.sum(w * np.average(a, axis=axis, weights=weights)), A)
    if weights is not None:  # the weights are differentiable too
        assert_grad_matches(lambda wt: np.sum(w * np.average(A, axis=axis, weights=wt)), weights)


def test_average_returned():
    weights = np.array([1.0, 2.0, 0.5])

    def f(a):
        avg, total = np.average(a, axis=1, weights=weights, returned=True)
        np.testing.assert_allclose(np.asarray(total), [3.5, 3.5])
        return np.sum(avg)

    assert_grad_matches(f, A)


def test_nan_reductions():
    x = np.array([1.0, np.nan, 3.0, 2.0])
    np.testing.assert_allclose(gt.grad(lambda x: np.nansum(3.0 * x))(x), [3.0, 0.0, 3.0, 3.0])
    np.testing.assert_allclose(gt.grad(lambda x: np.nanmean(x))(x), [1 / 3, 0.0, 1 / 3, 1 / 3])
    np.testing.assert_allclose(gt.grad(lambda x: np.nanmax(x))(x), [0.0, 0.0, 1.0, 0.0])


def test_sum_of_float32_is_float32_and_int_input_mean():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    value, g = gt.value_and_grad(lambda x: np.mean(x, axis=0).sum())(x)
    assert value.dtype == np.float32 and g.dtype == np.float32
    counts = np.arange(3)  # a constant int array mixed in
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(x * np.mean(counts)))(x), 1.0)
