"""ndarray attributes and methods on traced values: the ones with a meaning give NumPy's values
and gradients; the memory attributes a traced value cannot have raise a clear error that is
also an AttributeError (so hasattr and getattr with a default answer as for any object)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad

import gradtape as gt
from gradtape import TracedAttributeError

X = np.array([0.3, -1.2, 2.5, 0.7, -0.1])


@pytest.mark.parametrize(
    "method",
    [
        lambda x: np.sum(x.compress(np.array([1, 0, 1, 1, 0], bool)) ** 2),
        lambda x: np.sum(x * np.sort(x).searchsorted(0.5)),
        lambda x: _sorted_copy(x) @ np.arange(5.0),
        lambda x: _partitioned_copy(x)[:2].sum() * x[1],
        lambda x: x.sum() * x.itemsize + x.nbytes,
    ],
)
def test_methods_give_numpys_values_and_gradients(method):
    expected = method(X.copy())
    value, grad = gt.value_and_grad(method)(X)
    np.testing.assert_allclose(value, expected, rtol=1e-14)
    np.testing.assert_allclose(grad, central_difference_grad(method, (X,), 0), rtol=1e-6)


def _sorted_copy(x):
    y = x * 1.0
    y.sort()  # in place, as ndarray.sort
    return y


def _partitioned_copy(x):
    y = x * 1.0
    y.partition(2)
    return y


def test_choose_with_a_traced_index_array_is_numpys():
    choices = [np.arange(5.0), 10 * np.arange(5.0)]

    def f(x):
        index = (x > 0).astype(int)
        return np.sum(index.choose(choices) * x)

    np.testing.assert_allclose(gt.grad(f)(X), np.where(X > 0, 10, 1) * np.arange(5.0))


@pytest.mark.parametrize("name", ["flags", "strides", "ctypes", "data", "base", "view"])
def test_memory_attributes_raise_a_clear_error_naming_the_line(name):
    def f(x):
        return getattr(x, name)

    with pytest.raises(TracedAttributeError, match=rf"test_tracer_attributes.py:\d+.*\.{name}"):
        gt.grad(f)(X)


def test_the_error_is_an_attribute_error_for_hasattr_and_getattr():
    def f(x):
        assert not hasattr(x, "flags")
        assert getattr(x, "strides", None) is None
        return np.sum(x * x)

    np.testing.assert_allclose(gt.grad(f)(X), 2 * X)
    assert issubclass(TracedAttributeError, gt.GradtapeError)
    assert issubclass(TracedAttributeError, AttributeError)


@pytest.mark.parametrize("name", ["no_such_attribute", "ptp"])  # (ndarray.ptp: gone in NumPy 2)
def test_an_unknown_attribute_is_a_plain_attribute_error(name):
    def f(x):
        return getattr(x, name)

    with pytest.raises(AttributeError, match=name) as info:
        gt.grad(f)(X)
    assert not isinstance(info.value, gt.GradtapeError)


def test_flat_reads_and_writes_as_ndarray_flat():
    """x.flat: iteration, indexing and writes in C order (scipy.stats.linregress unpacks
    np.cov(x, y).flat)."""
    x = np.array([0.3, -1.2, 2.0, 0.7, 1.1])

    def f(x):
        a, b, c, d = np.cov(x, x**2).flat
        y = x.reshape(5, 1) * 1.0
        y.flat[2] = 10 * x[0]
        y.flat[3:] = x[:2] ** 2
        return a + 2 * b + c * d + np.sum(y**2) + sum(v for v in x.flat) + len(x.flat)

    value, grad = gt.value_and_grad(f)(x)
    assert value == pytest.approx(f(x), rel=1e-14)
    h = 1e-6
    fd = [(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(5)]
    np.testing.assert_allclose(grad, fd, rtol=1e-6)
    assert gt.grad(lambda x: x.flat[-1] * x.flat[0])(x).tolist() == [1.1, 0, 0, 0, 0.3]


def test_linregress_through_flat():
    scipy_stats = pytest.importorskip("scipy.stats")
    y = np.array([0.3, -1.2, 2.0, 0.7, 1.1])
    slope = gt.grad(lambda y: scipy_stats.linregress(np.arange(5.0), y).slope)(y)
    np.testing.assert_allclose(slope, (np.arange(5.0) - 2) / 10, atol=1e-15)
