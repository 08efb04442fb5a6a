"""NumPy's Python-level functions against NumPy and central differences: sinc, i0, nan_to_num,
fix, angle, imag, piecewise, polynomials (np.polyval and np.polynomial's evaluation,
Polynomial(c)(x)), apply_along_axis."""

from __future__ import annotations

import numpy as np
import pytest
from breadth import assert_same_value, check_rule, traced_value
from conftest import argument_strategy, central_difference_grad
from hypothesis import given
from hypothesis import strategies as st

import gradtape as gt

DTYPES = st.sampled_from([np.float64, np.float32])


@given(x=argument_strategy((6,), ((-3.0, 3.0),), np.float64))
def test_sinc(x):
    check_rule(np.sinc, x)


def test_sinc_at_and_near_zero_to_every_order():
    """d/dx sinc = 0 at 0, d2/dx2 = -pi^2/3, d4/dx4 = pi^4/5; smooth across |x| = 0.1."""
    d = gt.grad(np.sinc)
    assert d(0.0) == 0.0
    np.testing.assert_allclose(gt.grad(d)(0.0), -(np.pi**2) / 3, rtol=1e-12)
    np.testing.assert_allclose(gt.grad(gt.grad(gt.grad(d)))(0.0), np.pi**4 / 5, rtol=1e-9)
    for x in (1e-8, 0.05, 0.0999999, 0.1, 0.1000001, 0.7):
        fd = (np.sinc(x + 1e-7) - np.sinc(x - 1e-7)) / 2e-7
        np.testing.assert_allclose(d(x), fd, rtol=1e-6, atol=1e-8)
    check_rule(np.sinc, np.array([0.0, 0.05, -0.1, 0.3], np.float32))


@given(x=argument_strategy((5,), ((-6.0, 6.0),), np.float64))
def test_i0(x):
    check_rule(np.i0, x)
    check_rule(lambda x: gt.grad(lambda y: np.sum(np.i0(y)))(x), x)  # i1 and its derivative


def test_nan_to_num_fix_angle_imag():
    x = np.array([1.5, np.nan, np.inf, -np.inf, -0.5])
    for kwargs in ({}, {"nan": 2.0, "posinf": 9.0, "neginf": -9.0}):
        assert_same_value(
            traced_value(lambda x: np.nan_to_num(x, **kwargs), x), np.nan_to_num(x, **kwargs)
        )
        g = gt.grad(lambda x: np.sum(np.nan_to_num(x, **kwargs) * 2.0))(x)
        np.testing.assert_array_equal(g, [2.0, 0.0, 0.0, 0.0, 2.0])
    y = np.array([-1.5, -0.0, 0.0, 2.5])
    for f in (
        np.fix,
        np.angle,
        lambda y: np.angle(y, deg=True),
        np.imag,
        np.isreal,
        np.iscomplex,
        np.real_if_close,
        np.isposinf,
        np.isneginf,
    ):
        assert_same_value(traced_value(f, y), f(y))
    # complex values: np.angle is arctan2(imag, real), as NumPy's
    assert_same_value(traced_value(lambda y: np.angle(y + 1j), y), np.angle(y + 1j))


PIECEWISE = {
    "two": lambda x: np.piecewise(x, [x < 0, x >= 0], [lambda v: v**2, lambda v: 3 * v]),
    "otherwise": lambda x: np.piecewise(x, [x < -1, x > 1], [np.sin, np.exp, lambda v: -v]),
    "scalars": lambda x: np.piecewise(x, [x < 0], [0.5, lambda v: v * v]),
    "plain_mask": lambda x: np.piecewise(x, [np.array([True, False] * 3)], [np.cos, np.sin]),
}


@pytest.mark.parametrize("name", PIECEWISE)
def test_piecewise(name):
    x = np.array([-2.3, -0.4, 0.6, 1.7, -1.2, 2.2])
    check_rule(PIECEWISE[name], x)


def test_piecewise_compiled_masks_are_guarded():
    f = gt.compile(PIECEWISE["otherwise"], backend="numpy")
    for x in (np.array([-2.0, 0.5, 2.0]), np.array([2.0, 2.5, -0.5]), np.array([-2.0, 0.5, 2.0])):
        assert_same_value(f(x), PIECEWISE["otherwise"](x))


# --- polynomials -------------------------------------------------------------------------------
P = np.array([0.5, -1.2, 2.0, 0.3])
XS = np.array([-1.5, -0.2, 0.4, 1.3])


@given(dtype=DTYPES)
def test_polyval(dtype):
    check_rule(
        lambda p, x: np.polyval(p, x),
        P.astype(dtype),
        XS.astype(dtype),
        compiled=dtype == np.float64,
    )
    check_rule(lambda p: np.polyval(p, 0.7), P.astype(dtype), compiled=False)


POLY_FUNCS = {
    "polyder": lambda p: np.polyder(p),
    "polyder_2": lambda p: np.polyder(p, 2),
    "polyint": lambda p: np.polyint(p),
    "polyint_k": lambda p: np.polyint(p, 2, k=[1.0, -2.0]),
    "polyadd": lambda p: np.polyadd(p, p[:2]),
    "polysub": lambda p: np.polysub(p[1:], p),
    "polymul": lambda p: np.polymul(p, p[:3]),
    "polydiv_q": lambda p: np.polydiv(p, np.array([1.0, 0.5]))[0],
    "polydiv_r": lambda p: np.polydiv(p, p[1:3])[1],
    "poly": lambda p: np.poly(p),
}


@pytest.mark.parametrize("name", POLY_FUNCS)
def test_poly_functions(name):
    check_rule(POLY_FUNCS[name], P)


@pytest.mark.parametrize(
    "module, name",
    [
        ("polynomial", "polyval"),
        ("chebyshev", "chebval"),
        ("legendre", "legval"),
        ("hermite", "hermval"),
        ("hermite_e", "hermeval"),
        ("laguerre", "lagval"),
    ],
)
@pytest.mark.parametrize("ncoef", [1, 2, 5])
def test_np_polynomial_evaluation(module, name, ncoef):
    f = getattr(getattr(np.polynomial, module), name)
    c = np.linspace(-1.0, 1.5, ncoef)
    check_rule(lambda x, c: f(x, c), XS, c)
    check_rule(lambda x: f(x, c), XS)
    check_rule(lambda c: f(0.3, c), c)
    m = np.stack([c, c[::-1] * 0.5], axis=1)  # several polynomials: tensor=True and False
    check_rule(lambda x, m: f(x, m), XS, m)
    check_rule(lambda x, m: f(x[:2], m, tensor=False), XS, m)


@pytest.mark.parametrize(
    "cls",
    [
        np.polynomial.Polynomial,
        np.polynomial.Chebyshev,
        np.polynomial.Legendre,
        np.polynomial.Hermite,
    ],
)
def test_polynomial_objects_called_on_traced_points(cls):
    p = cls([0.5, -1.0, 2.0], domain=[-2.0, 3.0])
    check_rule(lambda x: p(x), XS)


def test_apply_along_axis():
    x = np.arange(12.0).reshape(3, 4) / 5 - 1
    check_rule(lambda x: np.apply_along_axis(lambda v: np.sum(v**2), 1, x), x)
    check_rule(lambda x: np.apply_along_axis(lambda v: v[::-1] * v, 0, x), x)
    check_rule(lambda x: np.apply_along_axis(lambda v: np.outer(v, v), 1, x), x)


def test_np_polynomial_functions_are_routed_as_soon_as_imported():
    """numpy.polynomial's modules import each other: each is wrapped when its own import ends
    (a module still executing when another one finished was marked done and never wrapped)."""
    import subprocess
    import sys

    code = (
        "import gradtape, numpy as np\n"
        "mods = [np.polynomial.polynomial.polyval, np.polynomial.chebyshev.chebval,\n"
        "        np.polynomial.legendre.legval, np.polynomial.hermite.hermval,\n"
        "        np.polynomial.hermite_e.hermeval, np.polynomial.laguerre.lagval,\n"
        "        np.polynomial.polyutils.mapdomain]\n"
        "assert all(hasattr(f, '__gradtape_original__') for f in mods), mods\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_select_refuses_non_boolean_conditions_as_numpy_does():
    x = np.array([-1.0, 0.5, 2.0])
    check_rule(lambda x: np.select([x < 0, x > 1], [x**2, 2 * x], 7.0), x)
    with pytest.raises(TypeError, match="boolean"):
        np.select([x], [x])
    with pytest.raises(TypeError, match="boolean"):
        traced_value(lambda x: np.select([x], [x]), x)


@pytest.mark.parametrize("deg", [0, 1, 3])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("two_d", [False, True])
def test_polyfit_in_x_y_and_w(deg, weighted, two_d):
    x = np.linspace(-1.0, 2.0, 9) + 0.05 * np.sin(np.arange(9.0))
    y = np.cos(x) if not two_d else np.stack([np.cos(x), np.exp(0.3 * x)], axis=1)
    w = 1.0 + 0.2 * np.cos(np.arange(9.0))
    weights = np.sin(np.arange(np.size(np.polyfit(x, y, deg))) + 1.0).reshape(
        np.shape(np.polyfit(x, y, deg))
    )

    def loss(x, y, w):
        return np.sum(weights * np.polyfit(x, y, deg, w=w if weighted else None))

    args = (x, y, w)
    value, grads = gt.value_and_grad(loss, argnums=(0, 1, 2))(*args)
    np.testing.assert_allclose(value, loss(*args), rtol=1e-12)
    for i, g in enumerate(grads):
        np.testing.assert_allclose(
            g, central_difference_grad(loss, args, i), rtol=1e-6, atol=1e-8, err_msg=f"arg {i}"
        )


def test_polyfit_full_and_refusals():
    x, y = np.linspace(0.0, 1.0, 6), np.exp(np.linspace(0.0, 1.0, 6))
    _, residuals, _, _, _ = np.polyfit(x, y, 2, full=True)
    got = gt.value_and_grad(lambda y: np.sum(np.polyfit(x, y, 2, full=True)[1]))(y)[0]
    np.testing.assert_allclose(got, np.sum(residuals), rtol=1e-10)
    with pytest.raises(gt.GradtapeError, match="cov="):
        gt.grad(lambda y: np.sum(np.polyfit(x, y, 2, cov=True)[0]))(y)
