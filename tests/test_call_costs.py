"""The fixed cost of a call: eager grad's short paths and compile's memo keys give the same
answers as the general ones. Every check here compares values or counts; none times anything.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradtape as gt
from gradtape.compile import memo
from gradtape.rules import reductions


# --- eager grad: one array argument, the whole-array sum ---------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.float64, np.float32]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=7),
        elements=st.floats(-3, 3, width=32),
    )
)
def test_one_array_argument_agrees_with_the_same_array_in_a_tuple(x):
    def f(x):
        return np.sum(np.exp(x) * np.sin(x)) + np.sum(x * x) * 0.5

    def g(args):
        return f(args[0])

    value, grad = gt.value_and_grad(f)(x)
    value_t, (grad_t,) = gt.value_and_grad(g)((x,))
    assert grad.dtype == x.dtype and grad.shape == x.shape and value.dtype == x.dtype
    np.testing.assert_array_equal(grad, grad_t)
    np.testing.assert_array_equal(value, value_t)
    want = np.exp(x) * (np.sin(x) + np.cos(x)) + x
    np.testing.assert_allclose(grad, want, rtol=1e-5 if x.dtype == np.float32 else 1e-12)


def test_the_gradient_of_an_array_is_the_callers_to_write():
    x = np.linspace(0.0, 1.0, 5)
    grad = gt.grad(lambda x: np.sum(x))(x)
    grad[0] = 7.0  # writable, and not shared with the next call
    np.testing.assert_array_equal(gt.grad(lambda x: np.sum(x))(x), np.ones(5))
    unused = gt.grad(lambda x: np.sum(x * 0.0) + 1.0)(x)
    unused[0] = 1.0


def test_integer_and_boolean_arrays_are_refused_by_name():
    with pytest.raises(gt.GradtapeError, match="dtype int64"):
        gt.grad(lambda x: np.sum(x))(np.arange(3))
    with pytest.raises(gt.GradtapeError, match="dtype bool"):
        gt.grad(lambda x: np.sum(x))(np.ones(3, bool))


@pytest.mark.parametrize("n", [1, 7, reductions._SMALL, reductions._SMALL + 1, 50_000])
def test_the_vjp_of_a_whole_sum_filled_or_broadcast(monkeypatch, n):
    broadcasts = []
    real = np.broadcast_to

    def counting(*args, **kwargs):
        broadcasts.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "broadcast_to", counting)
    x = np.linspace(-1.0, 1.0, n)
    grad = gt.grad(lambda x: np.sum(x) * 3.0)(x)
    np.testing.assert_array_equal(grad, np.full(n, 3.0))
    assert not broadcasts  # filled when small, else a view made without NumPy's Python
    assert grad.flags.writeable
    vjp = reductions._sum_vjp(np.array(2.0), None, x, (0,), False)
    np.testing.assert_array_equal(vjp, np.full(n, 2.0))
    assert vjp.flags.writeable == (n <= reductions._SMALL)
    grad32 = gt.grad(lambda x: np.sum(x))(x.astype(np.float32))
    assert grad32.dtype == np.float32


def test_sum_over_some_axes_still_broadcasts_back():
    x = np.arange(24.0).reshape(2, 3, 4)
    for axis, keepdims in [((0,), False), ((1, 2), True), (None, True), (-1, False)]:
        weights = np.arange(np.sum(x, axis=axis, keepdims=keepdims).size, dtype=float)

        def f(x, axis=axis, keepdims=keepdims, weights=weights):
            s = np.sum(x, axis=axis, keepdims=keepdims)
            return np.sum(s * weights.reshape(np.shape(s)))

        want = np.broadcast_to(weights.reshape(np.sum(x, axis=axis, keepdims=True).shape), x.shape)
        np.testing.assert_array_equal(gt.grad(f)(x), want)


def test_a_broadcast_cotangent_with_a_zero_still_masks():
    """The short path of the eager product (one repeated nonzero cotangent) is not taken for
    a repeated zero."""

    def f(x):
        return np.sum(np.sqrt(x)) * 0.0

    x = np.array([0.0, 4.0])
    grad = gt.grad(f)(x)
    np.testing.assert_array_equal(grad, [0.0, 0.0])
    big = np.zeros(reductions._SMALL + 10)
    np.testing.assert_array_equal(gt.grad(f)(big), np.zeros_like(big))
    np.testing.assert_array_equal(
        gt.grad(lambda x: np.sum(np.sqrt(x)))(np.array([1.0, 0.0])), [0.5, np.inf]
    )


def test_a_zero_cotangent_still_masks_an_infinite_partial():
    """The eager product's NaN test (a sum compared with itself) keeps the mask."""

    def f(x):
        return np.sum(np.where(x > 0, np.sqrt(x), 0.0))

    x = np.array([0.0, 4.0, -1.0])
    grad = gt.grad(f)(x)
    np.testing.assert_array_equal(grad, [0.0, 0.25, 0.0])


# --- compile's memo: the key of a transform's result --------------------------------------------
SCALE = 2.0


def scaled(x):
    return np.sum(x * SCALE)


def test_transformed_functions_are_keyed_by_transform_function_and_options(monkeypatch):
    memo.forget_all()
    vg = gt.compile(gt.value_and_grad(scaled), backend="numpy")
    assert gt.compile(gt.value_and_grad(scaled), backend="numpy") is vg
    assert gt.compile(gt.grad(scaled), backend="numpy") is not vg  # another transform
    assert gt.compile(gt.value_and_grad(scaled, argnums=(0,)), backend="numpy") is not vg
    assert gt.compile(gt.value_and_grad(lambda x: np.sum(x * SCALE)), backend="numpy") is not vg
    assert gt.compile(gt.value_and_grad(scaled), backend="numpy") is vg
    # a global the function reads, rebound: compiled afresh, with the new value
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    again = gt.compile(gt.value_and_grad(scaled), backend="numpy")
    assert again is not vg
    np.testing.assert_array_equal(again(np.ones(2))[1], [3.0, 3.0])
    # transforms of transforms
    twice = gt.compile(gt.grad(gt.grad(lambda x: x**3)), backend="numpy")
    assert gt.compile(gt.grad(gt.grad(lambda x: x**3)), backend="numpy") is not twice  # new code
    h = gt.grad(gt.grad(scaled_cube))
    assert gt.compile(h, backend="numpy") is gt.compile(gt.grad(gt.grad(scaled_cube)), "numpy")


def scaled_cube(x):
    return x**3 * SCALE


def test_a_key_holds_what_it_names_by_identity():
    """An entry keeps the transform it names by id alive: ids are not reused meanwhile."""
    keep: list = []
    key = memo._value_key(gt.grad(scaled), 0, keep)
    assert key[0] == "transformed" and any(k is gt.grad for k in keep)
    assert memo._value_key(gt.grad(scaled), 0, []) == key
    assert memo._value_key(gt.value_and_grad(scaled), 0, []) != key
