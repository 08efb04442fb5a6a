"""Native lowerings of small shapes: a size-1 slice reshaped to 0-d, the sum (product, max,
min) of a 0-d value, and np.diag / np.diagonal in both directions (paired integer-array reads
and writes). Each compiles with no python stage on the numba backend and agrees with the numpy
backend and with central differences."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.compile import coverage
from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba.backend import lowered

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed"),
]


def python_stages(compiled, *args) -> list[str]:
    """The primitives the numba backend runs through NumPy for this call."""
    plan = lowered(compiled, *args).generated.plan
    return [s.members[0].prim.name for s in plan.stages if s.kind == "python"]


def assert_native_matches_numpy(f, x, rtol=1e-12):
    native = gt.compile(gt.value_and_grad(f), backend="numba")
    reference = gt.compile(gt.value_and_grad(f), backend="numpy")
    value, grad = native(x)
    expected_value, expected_grad = reference(x)
    np.testing.assert_allclose(value, expected_value, rtol=rtol)
    np.testing.assert_allclose(grad, expected_grad, rtol=rtol, atol=1e-13)
    np.testing.assert_allclose(grad, central_difference_grad(f, (x,), 0), rtol=1e-6, atol=1e-8)
    assert python_stages(native, x) == []


def slice_to_scalar(x):
    return x[0:1].reshape(()) ** 2 * 3.0 + np.sum(np.sin(x[1:]))


def sum_of_scalar(x):
    total = np.sum(x * x)
    return np.sum(total * 3.0) + np.prod(np.sum(np.cos(x))) + np.max(np.min(total))


def diag_of_vector(x):
    return np.sum((np.diag(x) @ np.cos(x)) ** 2) + np.sum(np.diag(x, 1) * 0.5)


def diag_of_matrix(x):
    m = x.reshape(3, 3)
    return np.sum(np.diag(m) ** 2) + np.sum(np.diag(m, -1) * np.diag(m, 1)) + np.trace(m @ m)


def diagonal_of_stack(x):
    stack = x.reshape(2, 3, 3)
    return np.sum(np.exp(np.diagonal(stack, axis1=1, axis2=2)))


@pytest.mark.parametrize(
    "f, size",
    [
        (slice_to_scalar, 4),
        (sum_of_scalar, 3),
        (diag_of_vector, 4),
        (diag_of_matrix, 9),
        (diagonal_of_stack, 18),
    ],
)
def test_lowered_natively_and_agrees_with_the_numpy_backend(f, size):
    x = np.linspace(-1.0, 1.5, size)
    assert_native_matches_numpy(f, x)


def test_sum_of_a_scalar_keeps_its_dtype():
    def f(x):
        return np.sum(np.sum(x.astype(np.float32)), dtype=np.float64) * 2.0

    x = np.linspace(0.0, 1.0, 5)
    native = gt.compile(f, backend="numba")
    assert python_stages(native, x) == []
    np.testing.assert_allclose(native(x), gt.compile(f, backend="numpy")(x), rtol=1e-6)


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 5), k=st.integers(-3, 3), seed=st.integers(0, 2**16))
def test_diag_both_directions_over_sizes_and_offsets(n, k, seed):
    x = np.random.default_rng(seed).normal(size=n * n)
    if abs(k) >= n:
        k = 0

    def f(x):
        m = x.reshape(n, n)
        d = np.diag(m, k)
        return np.sum(np.diag(d, -k) * m) + np.sum(np.sin(d))

    assert_native_matches_numpy(f, x)


def test_paired_indices_that_repeat_accumulate_their_cotangents():
    idx = np.array([0, 1, 1, 2, 1])
    weights = np.array([1.0, 2.0, 3.0, 4.0, 5.0])

    def f(x):
        # the backward pass of the read is a scatter-add at (idx, idx): index 1 three times
        return np.sum(np.diag(x)[idx, idx] ** 2 * weights)

    assert_native_matches_numpy(f, np.array([0.5, -1.0, 2.0]))


def test_coverage_lists_none_of_them():
    gaps = set(coverage.native_gaps())
    assert not gaps & {"reshape", "reduce_sum", "getitem", "scatter_add"}
