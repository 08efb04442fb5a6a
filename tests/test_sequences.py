"""Sequences and grids against NumPy's values, central differences, forward mode and compile:
diff, ediff1d, gradient, trapezoid, cumulative_sum/prod, linspace, logspace, geomspace,
meshgrid, interp, convolve, correlate, cross."""

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
VALUES = ((-3.0, 3.0),)


@given(data=st.data(), dtype=DTYPES)
def test_diff(data, dtype):
    shape = data.draw(st.sampled_from([(5,), (3, 4), (2, 3, 4)]), label="shape")
    x = data.draw(argument_strategy(shape, VALUES, dtype), label="x")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    n = data.draw(st.integers(0, 2), label="n")
    check_rule(lambda x: np.diff(x, n=n, axis=axis), x, compiled=dtype == np.float64)
    check_rule(
        lambda x: np.diff(x, axis=axis, prepend=0.5, append=x.take([0], axis=axis)),
        x,
        compiled=False,
    )


def test_diff_traced_prepend_and_errors():
    x = np.array([0.3, -1.2, 2.0, 1.5])
    check_rule(lambda p: np.diff(x, prepend=p), np.array([0.7]))
    with pytest.raises(ValueError, match="at least one dimensional"):
        traced_value(lambda x: np.diff(x[0]), x)
    with pytest.raises(ValueError, match="non-negative"):
        traced_value(lambda x: np.diff(x, n=-1), x)


def test_ediff1d():
    x = np.array([[0.3, -1.2], [2.0, 1.5]])
    check_rule(np.ediff1d, x)
    check_rule(lambda x: np.ediff1d(x, to_begin=-1.0, to_end=[2.0, 3.0]), x)
    check_rule(lambda e: np.ediff1d(x, to_end=e), np.array([0.5, 0.25]))


@given(data=st.data(), dtype=DTYPES, edge_order=st.sampled_from([1, 2]))
def test_gradient(data, dtype, edge_order):
    shape = data.draw(st.sampled_from([(5,), (3, 4), (4, 3, 3)]), label="shape")
    x = data.draw(argument_strategy(shape, VALUES, dtype), label="x")
    check_rule(lambda x: np.gradient(x, edge_order=edge_order), x, compiled=dtype == np.float64)
    check_rule(lambda x: np.gradient(x, 0.5, axis=0, edge_order=edge_order), x, compiled=False)


def test_gradient_with_coordinates():
    f = np.array([0.3, -1.2, 2.0, 1.5, 0.1, 0.9])
    uneven = np.array([0.0, 0.5, 1.5, 1.75, 3.0, 4.0])
    even = np.arange(6.0) * 0.5
    for edge_order in (1, 2):
        for coords in (uneven, even):
            check_rule(lambda f: np.gradient(f, coords, edge_order=edge_order), f)
            # differentiable in the coordinates too, also where they are evenly spaced
            check_rule(lambda c: np.gradient(f, c, edge_order=edge_order), coords)
    m = np.outer(f, f[:4])
    check_rule(lambda m: np.gradient(m, uneven, 2.0), m)
    check_rule(lambda s: np.gradient(m, 1.5, s)[1], np.float64(0.7))


def test_gradient_compiled_coordinates_switch_between_even_and_uneven():
    f = np.array([0.3, -1.2, 2.0, 1.5])
    cg = gt.compile(lambda c: np.gradient(f, c), backend="numpy")
    for c in (np.arange(4.0), np.array([0.0, 0.5, 1.5, 2.0]), np.arange(4.0) * 2):
        assert_same_value(cg(c), np.gradient(f, c))


@given(data=st.data(), dtype=DTYPES)
def test_trapezoid(data, dtype):
    shape = data.draw(st.sampled_from([(5,), (3, 4)]), label="shape")
    y = data.draw(argument_strategy(shape, VALUES, dtype), label="y")
    check_rule(lambda y: np.trapezoid(y, axis=0), y, compiled=dtype == np.float64)
    x = np.cumsum(np.linspace(0.5, 1.0, shape[-1]))
    check_rule(lambda y, x: np.trapezoid(y, x), y, x.astype(dtype), compiled=False)
    check_rule(lambda y: np.trapezoid(y, dx=0.25), y, compiled=False)


@pytest.mark.skipif(not hasattr(np, "cumulative_sum"), reason="NumPy 2")
def test_cumulative_sum_and_prod():
    x = np.array([[0.3, -1.2, 2.0], [1.5, 0.1, -0.7]])
    for f in (np.cumulative_sum, np.cumulative_prod):
        check_rule(lambda x: f(x, axis=1), x)
        check_rule(lambda x: f(x, axis=0, include_initial=True), x)
        check_rule(lambda x: f(x[0], include_initial=True), x)
        with pytest.raises(ValueError):
            traced_value(lambda x: f(x), x)


LINSPACE = {
    "linspace": lambda a, b: np.linspace(a, b, 7),
    "linspace_noend": lambda a, b: np.linspace(a, b, 5, endpoint=False),
    "linspace_one": lambda a, b: np.linspace(a, b, 1),
    "linspace_zero": lambda a, b: np.linspace(a, b, 0),
    "linspace_retstep": lambda a, b: np.linspace(a, b, 4, retstep=True),
    "linspace_axis": lambda a, b: np.linspace(a, b, 3, axis=-1),
    "logspace": lambda a, b: np.logspace(a, b, 6),
    "logspace_base": lambda a, b: np.logspace(a, b, 4, base=2.0),
    "geomspace": lambda a, b: np.geomspace(np.exp(a), np.exp(b), 6),
    "geomspace_negative": lambda a, b: np.geomspace(-np.exp(a), -np.exp(b), 5, endpoint=False),
    "geomspace_axis": lambda a, b: np.geomspace(np.exp(a), np.exp(b), 3, axis=-1),
}


@pytest.mark.parametrize("name", LINSPACE)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_spaces_with_traced_ends(name, shape):
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, shape) if shape else float(rng.uniform(-1, 1))
    b = rng.uniform(1.5, 2, shape) if shape else float(rng.uniform(1.5, 2))
    check_rule(LINSPACE[name], a, b)
    check_rule(lambda a: LINSPACE[name](a, 2.5), a)


def test_linspace_equal_ends_and_integer_dtype():
    check_rule(lambda a: np.linspace(a, a, 4), np.array([0.5, -1.0]))
    assert_same_value(
        traced_value(lambda a: np.linspace(a, 7.0, 4, dtype=int), 0.5),
        np.linspace(0.5, 7.0, 4, dtype=int),
    )
    check_rule(lambda a: np.linspace(a, 2.0, 5), np.float32(0.25))


@pytest.mark.parametrize("kwargs", [{}, {"indexing": "ij"}, {"sparse": True}])
def test_meshgrid(kwargs):
    x, y, z = np.array([0.3, -1.2, 2.0]), np.array([1.5, 0.1]), np.array([0.2, 0.4, 0.6, 0.8])
    check_rule(lambda x, y: np.meshgrid(x, y, **kwargs), x, y)
    check_rule(lambda x, z: np.meshgrid(x, y, z, **kwargs), x, z)
    check_rule(lambda x: np.meshgrid(x, **kwargs), x)


# --- interp -----------------------------------------------------------------------------------
XP = np.array([-2.0, -0.5, 0.0, 1.0, 3.0])
FP = np.array([1.0, 2.0, -0.5, 0.5, 0.25])


@given(x=argument_strategy((7,), ((-3.0, 4.0),), np.float64))
def test_interp(x):
    x = x + 1e-3 * (np.abs(x[:, None] - XP).min(axis=1) < 1e-4)  # no finite step over a knot
    check_rule(lambda x: np.interp(x, XP, FP), x)
    check_rule(lambda x, xp, fp: np.interp(x, xp, fp), x, XP, FP)
    check_rule(lambda x, fp: np.interp(x, XP, fp, left=-1.0, right=fp[2]), x, FP)


def test_interp_edges_and_periodic():
    x = np.array([-3.0, -2.0, -0.25, 0.0, 1.0, 3.0, 3.5, np.nan])
    assert_same_value(traced_value(lambda x: np.interp(x, XP, FP), x), np.interp(x, XP, FP))
    g = gt.grad(lambda x: np.sum(np.interp(x[:-1], XP, FP)))(x)
    # the slope of the segment to the right of a knot; 0 outside and at the last point
    np.testing.assert_allclose(g[:-1], [0.0, 2 / 3, -5.0, 1.0, -0.125, 0.0, 0.0])
    assert_same_value(
        traced_value(lambda x: np.interp(x, XP[:1], FP[:1]), x), np.interp(x, XP[:1], FP[:1])
    )
    xs = np.array([-180.0, -165.0, -185.0, 185.0, -12.0, -5.0, 0.5, 365.0])  # off the knots
    xp, fp = np.array([190.0, -190.0, 350.0, -350.0]), np.array([5.0, 10.0, 3.0, 4.0])
    check_rule(lambda x, xp, fp: np.interp(x, xp, fp, period=360), xs, xp, fp)
    with pytest.raises(ValueError, match="empty"):
        traced_value(lambda x: np.interp(x, XP[:0], FP[:0]), x)
    with pytest.raises(gt.GradtapeError, match="complex"):
        traced_value(lambda x: np.interp(x, XP, FP + 1j), x)


def test_interp_compiled_picks_segments_again():
    cf = gt.compile(gt.grad(lambda x: np.sum(np.interp(x, XP, FP) ** 2)), backend="numpy")
    ref = gt.grad(lambda x: np.sum(np.interp(x, XP, FP) ** 2))
    for x in (np.array([0.3, -1.2, 2.0]), np.array([-2.5, 0.7, 3.2])):
        np.testing.assert_allclose(cf(x), ref(x))


# --- convolve and correlate --------------------------------------------------------------------
@pytest.mark.parametrize("func", [np.convolve, np.correlate])
@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize("n, m", [(6, 3), (3, 6), (4, 4), (1, 3), (5, 1)])
def test_convolve_correlate(func, mode, n, m):
    rng = np.random.default_rng(n * 10 + m)
    a, v = rng.normal(size=n), rng.normal(size=m)
    check_rule(lambda a, v: func(a, v, mode), a, v, exact=True)
    check_rule(lambda a: func(a, v, mode), a.astype(np.float32), compiled=False)


def test_convolve_second_order_and_errors():
    a, v = np.array([0.3, -1.2, 2.0, 1.5]), np.array([1.0, 0.5, -0.25])
    h = gt.hessian(lambda a: np.sum(np.convolve(a, v) ** 3))(a)
    eps = 1e-6
    fd = np.stack(
        [
            (
                gt.grad(lambda a: np.sum(np.convolve(a, v) ** 3))(a + eps * e)
                - gt.grad(lambda a: np.sum(np.convolve(a, v) ** 3))(a - eps * e)
            )
            / (2 * eps)
            for e in np.eye(4)
        ]
    )
    np.testing.assert_allclose(h, fd, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="cannot be empty"):
        traced_value(lambda a: np.convolve(a[:0], v), a)


# --- cross --------------------------------------------------------------------------------------
@pytest.mark.parametrize("na, nb", [(3, 3), (2, 3), (3, 2), (2, 2)])
def test_cross(na, nb):
    rng = np.random.default_rng(na + nb)
    a, b = rng.normal(size=(4, na)), rng.normal(size=(nb,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        check_rule(lambda a, b: np.cross(a, b), a, b, exact=True)
        check_rule(lambda a, b: np.cross(a.T, b, axisa=0), a, b, exact=True)
    if na == nb == 3:
        check_rule(lambda a, b: np.cross(a, b, axisc=0), a, b, exact=True)
        check_rule(lambda a, b: np.linalg.cross(a, b), a, np.broadcast_to(b, a.shape).copy())
