"""Numerical edge cases: masked branches, division by zero, empty and all-NaN reductions,
reductions with where=/initial= through ndarray's methods, and complex values refused or
exact. Each behaviour is NumPy's value (with NumPy's warnings) and a gradient that is either
right or a clear error, never a silently different number."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import central_difference_grad

import gradtape as gt

X = np.array([-1.0, 0.5, 4.0, 2.0])
MASK = X > 0


def fd(f, x):
    return central_difference_grad(f, (x,), 0)


# --- ndarray methods take the keywords of their np. spellings ---------------------------------
METHOD_CASES = {
    "sum where": (lambda x: x.sum(where=MASK), lambda x: np.sum(x, where=MASK)),
    "sum initial": (lambda x: x.sum(initial=3.0), lambda x: np.sum(x, initial=3.0)),
    "mean where": (lambda x: x.mean(where=MASK), lambda x: np.mean(x, where=MASK)),
    "prod where initial": (
        lambda x: x.prod(where=MASK, initial=2.0),
        lambda x: np.prod(x, where=MASK, initial=2.0),
    ),
    "max initial": (lambda x: x.max(initial=3.0), lambda x: np.max(x, initial=3.0)),
    "max where": (
        lambda x: x.max(where=MASK, initial=-5.0),
        lambda x: np.max(x, where=MASK, initial=-5.0),
    ),
    "min where": (
        lambda x: x.min(where=MASK, initial=5.0),
        lambda x: np.min(x, where=MASK, initial=5.0),
    ),
    "var where": (lambda x: x.var(where=MASK), lambda x: np.var(x, where=MASK)),
    "std where ddof": (
        lambda x: x.std(where=MASK, ddof=1),
        lambda x: np.std(x, where=MASK, ddof=1),
    ),
    "var mean": (
        lambda x: x.var(mean=np.mean(x, keepdims=True)),
        lambda x: np.var(x, mean=np.mean(x, keepdims=True)),
    ),
}


@pytest.mark.parametrize("name", list(METHOD_CASES))
def test_reduction_methods_take_where_and_initial(name):
    method, function = METHOD_CASES[name]
    value, grad = gt.value_and_grad(method)(X)
    np.testing.assert_allclose(value, method(X), rtol=1e-14)
    np.testing.assert_allclose(value, function(X), rtol=1e-14)
    np.testing.assert_allclose(grad, fd(method, X), rtol=1e-6, atol=1e-8)
    compiled = gt.compile(gt.value_and_grad(method), backend="numpy")(X)
    np.testing.assert_allclose(compiled[0], value, rtol=1e-14)
    np.testing.assert_allclose(compiled[1], grad, rtol=1e-14)


def test_any_and_all_methods_take_where():
    def f(x):
        return x.sum() * (x.any(where=MASK) + x.all(where=~MASK))

    value, grad = gt.value_and_grad(f)(X)
    assert value == f(X)
    np.testing.assert_allclose(grad, np.full(4, 1.0 + (X[~MASK] > 0).all()))


# --- division by zero: NumPy's inf and nan, with its warning, in the value and the gradient -----
@pytest.mark.parametrize(
    "f",
    [
        lambda x: np.sum(x / 0.0),
        lambda x: np.sum(x) / 0,
        lambda x: np.sum(np.divide(x, 0.0)),
        lambda x: np.sum(x / np.float64(0.0)),
    ],
    ids=["x/0.0", "sum(x)/0", "np.divide(x, 0.0)", "x/float64(0)"],
)
def test_division_by_a_zero_constant_gives_numpys_inf(f):
    x = np.array([1.0, 2.0])
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        value, grad = gt.value_and_grad(f)(x)
    with np.errstate(all="ignore"):
        assert value == f(x)
    np.testing.assert_array_equal(grad, [np.inf, np.inf])
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        _, tangent = gt.jvp(f, (x,), (np.ones(2),))
    assert tangent == np.inf
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        compiled = gt.compile(gt.value_and_grad(f), backend="numpy")(x)
    np.testing.assert_array_equal(compiled[1], grad)


def test_division_by_a_python_zero_keeps_float32():
    x = np.ones(2, np.float32)
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        grad = gt.grad(lambda x: np.sum(x / 0.0))(x)
    assert grad.dtype == np.float32
    np.testing.assert_array_equal(grad, [np.inf, np.inf])


def test_std_with_ddof_of_one_element_is_numpys_nan():
    x = np.array([2.0])
    with warnings.catch_warnings(record=True) as numpy_warnings:
        warnings.simplefilter("always")
        expected = np.std(x, ddof=1)
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        value, grad = gt.value_and_grad(lambda x: np.std(x, ddof=1))(x)
    assert np.isnan(value) and np.isnan(expected)
    assert np.isnan(grad).all()
    assert any("Degrees of freedom" in str(w.message) for w in numpy_warnings)
    assert any("Degrees of freedom" in str(w.message) for w in ours)
