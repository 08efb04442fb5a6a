"""Writes follow NumPy's memory semantics: views, in-place operators, out=, copyto, fill.

Every case runs the same function on plain NumPy and under gradtape: the value must be
NumPy's, the gradient must match central differences, forward mode must match reverse mode,
and the compiled function must match the eager one. Writes NumPy may or may not send through
to the viewed array (x.T, reshape) raise instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad

import gradtape as gt
from gradtape import GradtapeError


def chained_index(x):
    y = x.copy()
    y[0][0] = 0.0
    return np.sum(y * y)


def in_place_through_view(x):
    y = x * 1.0
    v = y[1:]
    v *= 2.0
    return np.sum(y * y)


def in_place_seen_by_alias(x):
    y = x * 1.0
    z = y
    y += x[0, 0]
    return np.sum(z * x)


def view_sees_later_write(x):
    y = x * 1.0
    v = y[:, 1]
    y[0, 1] = 10.0 * x[1, 2]
    return np.sum(v * x[:, 0])


def transpose_sees_later_write(x):
    y = x * 1.0
    t = y.T
    y[0, 0] = 5.0 * x[1, 1]
    return np.sum(t[0] * x[:, 0])


def ufunc_out(x):
    y = np.zeros_like(x)
    np.multiply(x, x, out=y)
    return np.sum(y)


def ufunc_out_where(x):
    y = x * 2.0
    np.exp(x, out=y, where=x > 3.0)
    return np.sum(y)


def copyto(x):
    y = np.zeros_like(x)
    np.copyto(y, x * 3.0)
    return np.sum(y * x)


def copyto_where(x):
    y = x * 1.0
    np.copyto(y, x**2, where=x > 2.5)
    return np.sum(y * x)


def fill_a_row(x):
    y = x * 2.0
    y[1].fill(x[0, 0])
    return np.sum(y * x)


def view_of_a_view(x):
    y = x * 1.0
    a = y[1]
    b = a[1:]
    b[0] = 100.0 * x[0, 0]
    return np.sum(y * y)


def element_is_not_a_view(x):
    y = x.ravel() * 1.0
    s = y[0]
    s += 5.0  # y[0] of a 1-d array is a scalar copy in NumPy: y is unchanged
    return np.sum(y) + s


def add_at_seen_by_view(x):
    y = x * 1.0
    v = y[0]
    np.add.at(y, (0, 1), 5.0 * x[1, 1])
    return np.sum(v * x[0])


def write_into_argument(x):
    x[0, 0] = 0.0
    return np.sum(x * x)


def in_place_power_then_slice_write(x):
    y = x + 0.0
    y **= 2
    y[:, ::2] -= x[:, ::2]
    return np.sum(np.sin(y))


CASES = [
    chained_index,
    in_place_through_view,
    in_place_seen_by_alias,
    view_sees_later_write,
    transpose_sees_later_write,
    ufunc_out,
    ufunc_out_where,
    copyto,
    copyto_where,
    fill_a_row,
    view_of_a_view,
    element_is_not_a_view,
    add_at_seen_by_view,
    write_into_argument,
    in_place_power_then_slice_write,
]

X = np.arange(1.0, 7.0).reshape(2, 3) * 0.7


@pytest.mark.parametrize("f", CASES, ids=lambda f: f.__name__)
def test_value_and_gradient_match_numpy(f):
    value, grad = gt.value_and_grad(f)(X.copy())
    assert value == pytest.approx(f(X.copy()), rel=1e-12)
    np.testing.assert_allclose(
        grad, central_difference_grad(lambda x: f(x.copy()), [X], 0), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("f", CASES, ids=lambda f: f.__name__)
def test_forward_mode_matches_reverse_mode(f):
    grad = gt.grad(f)(X.copy())
    direction = np.cos(np.arange(X.size)).reshape(X.shape)
    _, tangent = gt.jvp(f, (X.copy(),), (direction,))
    assert tangent == pytest.approx(np.sum(grad * direction), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("f", CASES, ids=lambda f: f.__name__)
def test_compiled_matches_eager(f):
    compiled = gt.compile(gt.value_and_grad(f), backend="numpy")
    for shift in (0.0, 0.3):
        x = X + shift
        value, grad = compiled(x.copy())
        expected_value, expected_grad = gt.value_and_grad(f)(x.copy())
        assert value == pytest.approx(expected_value, rel=1e-12)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-12)


def test_writes_through_uncertain_views_raise_at_the_users_line():
    def f(x):
        y = x * 1.0
        y.T[0] = 1.0
        return np.sum(y)

    with pytest.raises(GradtapeError, match=r"test_writes.py:\d+: .*result of transpose"):
        gt.grad(f)(X)

    def g(x):
        r = (x * 1.0).reshape(-1)
        r[0] = 0.0
        return np.sum(r)

    with pytest.raises(GradtapeError, match="result of reshape"):
        gt.grad(g)(X)


def test_in_place_keeps_numpys_casting_and_shape_rules():
    def widen(x):
        y = x * 1.0
        y += np.ones((2, 2, 3))
        return np.sum(y)

    with pytest.raises(ValueError, match="non-broadcastable output"):
        gt.grad(widen)(X)

    def downcast(x):
        y = (x * 1.0).astype(np.float32)
        y *= x  # float64 into float32: same_kind allows it, the result stays float32
        assert y.dtype == np.float32
        return np.sum(y)

    np.testing.assert_allclose(gt.grad(downcast)(X), 2 * X, rtol=1e-6)


def test_out_into_a_plain_array_is_refused():
    def f(x):
        y = np.zeros(x.shape)
        np.exp(x, out=y)
        return np.sum(y)

    with pytest.raises(GradtapeError, match="plain ndarray"):
        gt.grad(f)(X)


def test_matrix_transpose_and_builtin_divmod():
    a = np.arange(1.0, 13.0).reshape(2, 2, 3)

    def f(a):
        q, r = divmod(a, 2.3)  # no element sits on a jump of the quotient
        return np.sum(a.mT * a.mT) + np.sum(r * a) + np.sum(q)

    value, grad = gt.value_and_grad(f)(a)
    assert value == pytest.approx(f(a), rel=1e-12)
    np.testing.assert_allclose(grad, central_difference_grad(f, [a], 0), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="ndim < 2"):
        gt.grad(lambda x: np.sum(x.mT))(np.ones(3))


def test_a_write_into_a_zero_dimensional_value():
    """A 0-d traced value (held as a NumPy scalar) written through [()] and a 0-d mask, as
    SciPy's array-API helpers do (xpx.at(out, cond).set(...))."""

    def f(x):
        y = np.asarray(np.sum(x) * 1.0)
        y[()] = y * 3.0
        z = np.array(np.sum(x**2))
        z[np.array(True)] = z + 1.0
        return y + z

    x = np.array([0.5, -1.0, 2.0])
    assert gt.grad(f)(x).tolist() == pytest.approx((3.0 + 2 * x).tolist())
    value, _ = gt.value_and_grad(f)(x)
    assert value == pytest.approx(f(x)) == pytest.approx(3 * x.sum() + (x**2).sum() + 1.0)
