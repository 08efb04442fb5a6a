"""scipy.interpolate.CubicSpline on traced values (and PPoly evaluation): SciPy's values,
gradients in the values y and in the evaluation points against central differences, every
end condition, extrapolation modes, derivatives, stacked values along any axis, compiled
against eager, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad, compile_backends
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt

si = pytest.importorskip("scipy.interpolate")

BC_TYPES = ["not-a-knot", "natural", "clamped", ((1, 0.5), (2, -1.0)), "periodic"]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(3, 8),
    bc=st.sampled_from(range(len(BC_TYPES))),
    extrapolate=st.sampled_from([None, False, True]),
    nu=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_values_and_gradients_in_y(n, bc, extrapolate, nu, seed):
    rng = np.random.default_rng(seed)
    knots = np.cumsum(rng.uniform(0.3, 1.0, n))
    y = rng.normal(size=n)
    bc_type = BC_TYPES[bc]
    if bc_type == "periodic":
        y[-1] = y[0]
    points = rng.uniform(knots[0] - 0.5, knots[-1] + 0.5, 7)

    def f(y):
        if bc_type == "periodic":  # the last value is the first
            y = np.concatenate([y[:-1], y[:1]])
        spline = si.CubicSpline(knots, y, bc_type=bc_type, extrapolate=extrapolate)
        return np.nansum(np.sin(spline(points, nu)))

    value, grad = gt.value_and_grad(f)(y)
    np.testing.assert_allclose(value, f(y), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(grad, central_difference_grad(f, (y,), 0), rtol=1e-5, atol=1e-7)
    _, tangent = gt.jvp(f, (y,), (np.ones_like(y),))
    np.testing.assert_allclose(tangent, np.sum(grad), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_stacked_values_along_an_axis_and_traced_points(axis):
    rng = np.random.default_rng(1)
    knots = np.array([0.0, 0.7, 1.5, 2.0, 3.1])
    y = rng.normal(size=(3, 5)) if axis != 0 else rng.normal(size=(5, 3))
    points = np.array([[-0.2, 0.9], [2.5, 3.4]])

    def f(y, p):
        return np.sum(si.CubicSpline(knots, y, axis=axis)(p) ** 2)

    expected = si.CubicSpline(knots, y, axis=axis)(points)
    got = gt.jvp(lambda y: si.CubicSpline(knots, y, axis=axis)(points), (y,), (y,))[0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert got.shape == expected.shape
    grads = gt.grad(f, argnums=(0, 1))(y, points)
    for i, g in enumerate(grads):
        np.testing.assert_allclose(
            g, central_difference_grad(f, (y, points), i), rtol=1e-5, atol=1e-8
        )


@pytest.mark.parametrize("backend", compile_backends())
def test_compiled(backend):
    knots = np.linspace(0.0, 2.0, 6)
    points = np.linspace(-0.1, 2.1, 9)

    def f(y):
        return np.sum(si.CubicSpline(knots, y)(points) ** 2)

    compiled = gt.compile(gt.value_and_grad(f), backend=backend)
    for y in (np.sin(knots), np.cos(knots)):
        value, grad = compiled(y)
        np.testing.assert_allclose(value, f(y), rtol=1e-12)
        np.testing.assert_allclose(grad, gt.grad(f)(y), rtol=1e-11)


def test_refusals_say_what_to_do():
    knots, y = np.arange(4.0), np.array([0.0, 1.0, 0.5, 2.0])
    with pytest.raises(gt.GradtapeError, match="traced knots"):
        gt.grad(lambda k: np.sum(si.CubicSpline(k, y)(0.5)))(knots)
    with pytest.raises(gt.GradtapeError, match="traced derivative value in bc_type"):
        gt.grad(lambda d: np.sum(si.CubicSpline(knots, y, bc_type=((1, d), (1, 0.0)))(0.5)))(0.3)
    with pytest.raises(gt.GradtapeError, match="antiderivative"):
        gt.grad(lambda y: np.sum(si.CubicSpline(knots, y)(0.5, -1)))(y)
    with pytest.raises(ValueError, match="must be identical"):
        gt.grad(lambda y: np.sum(si.CubicSpline(knots, y, bc_type="periodic")(0.5)))(y)


def test_plain_splines_are_scipys_own():
    knots, y = np.arange(4.0), np.array([0.0, 1.0, 0.5, 2.0])
    spline = si.CubicSpline(knots, y)
    assert type(spline._c) is np.ndarray
    np.testing.assert_array_equal(spline([0.5, 1.5]), si.CubicSpline(knots, y)([0.5, 1.5]))
