"""Every elementwise rule (NumPy and scipy.special ufuncs) against numerical derivatives.

The list of functions is the rule table itself (`gradtape.core.routes.UFUNCS`), so a new
ufunc rule without a domain in tests/conftest.py fails `test_every_rule_has_a_domain`.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.special as sp
from conftest import (
    BINARY_SHAPES,
    DOMAINS,
    TERNARY_SHAPES,
    UNARY_SHAPES,
    argument_strategy,
    assert_grad_matches,
    differentiable_ufuncs,
    ufunc_id,
    weights_like,
)
from hypothesis import given
from hypothesis import strategies as st

# the way users import them: copied before any gradient is taken
from scipy.special import log_softmax, logsumexp, polygamma, softmax, zeta

import gradtape as gt
from gradtape.core.tracing import current_levels

UFUNCS = differentiable_ufuncs()
DTYPES = st.sampled_from([np.float64, np.float32])


def test_every_rule_has_a_domain():
    names = {uf.__name__ for uf in UFUNCS}
    assert names - set(DOMAINS) == set(), "add a domain for these rules in tests/conftest.py"
    assert set(DOMAINS) - names == set(), "these domains name no differentiable rule"


def _output_shape(args) -> tuple:
    return np.broadcast_shapes(*(np.shape(a) for a in args))


@pytest.mark.parametrize("ufunc", UFUNCS, ids=ufunc_id)
@given(data=st.data(), dtype=DTYPES)
def test_ufunc_gradient(ufunc, data, dtype):
    """sum(w * ufunc(*args)) over generated shapes, broadcasting, Python floats and dtypes."""
    domain = DOMAINS[ufunc.__name__]
    shapes = data.draw(
        st.sampled_from(
            UNARY_SHAPES
            if domain.arity == 1
            else BINARY_SHAPES
            if domain.arity == 2
            else TERNARY_SHAPES
        )
    )
    shapes = (shapes,) if domain.arity == 1 else shapes
    args = tuple(
        data.draw(argument_strategy(shape, intervals, dtype), label=f"arg{i}")
        for i, (shape, intervals) in enumerate(zip(shapes, domain.args))
    )
    weights = weights_like(_output_shape(args), dtype)

    def objective(*a):
        return np.sum(weights * ufunc(*a))

    with np.errstate(all="ignore"):  # the complex step of e.g. power may warn
        has_complex_loop = "D" * ufunc.nin + "->D" in ufunc.types
        assert_grad_matches(
            objective,
            *args,
            argnums=domain.diff_args,
            complex_step=domain.analytic,
            require_complex_step=domain.analytic and has_complex_loop,
        )


def test_float32_stays_float32_through_a_chain():
    x = np.linspace(0.1, 2.0, 6, dtype=np.float32)

    def f(x):
        y = np.exp(-x) * np.sin(3.0 * x) + np.sqrt(x) / (1 + x**2)
        return np.sum(np.log1p(y * y) + sp.gammaln(x + 1))

    g = assert_grad_matches(f, x)
    assert g.dtype == np.float32
    assert gt.value_and_grad(f)(x)[0].dtype == np.float32


ROUNDING = [np.floor, np.ceil, np.trunc, np.rint, np.sign, np.round, np.around]


@pytest.mark.parametrize("func", ROUNDING, ids=lambda f: f.__name__)
def test_rounding_has_zero_derivative_and_is_not_recorded(func):
    x = np.array([-1.7, -0.2, 0.4, 2.5])
    levels = []

    def f(x):
        levels.append(current_levels()[-1])
        return np.sum(func(x) * x + 3.0 * func(x))

    g = gt.grad(f)(x)
    np.testing.assert_array_equal(g, func(x))  # d/dx [r(x) x + 3 r(x)] = r(x)
    recorded = [ins.prim.name for ins in levels[0].tape.instructions]
    assert func.__name__ not in recorded and "rint" not in recorded
    staged = gt.trace(f, x)  # a staging level records them (compile replays them)
    assert any(ins.prim.name in (func.__name__, "rint") for ins in staged.instructions)


def test_floor_divide_and_comparisons_have_zero_derivative():
    x = np.array([1.3, 4.2, 7.9])

    def f(x):
        return np.sum(x // 2.0 + (x > 2) * x + np.equal(x, 4.2) * 5.0)

    np.testing.assert_allclose(gt.grad(f)(x), (x > 2).astype(float))


@pytest.mark.parametrize(
    "func", [np.maximum, np.minimum, np.fmax, np.fmin], ids=lambda f: f.__name__
)
def test_ties_split_the_gradient(func):
    """At x == y each side gets half (the central difference there, too)."""
    x, y = np.array([1.0, 2.0, -1.0]), np.array([1.0, 0.0, 3.0])
    gx, gy = assert_grad_matches(
        lambda x, y: np.sum(func(x, y)), x, y, argnums=(0, 1), complex_step=False
    )
    assert gx[0] == gy[0] == 0.5


@pytest.mark.parametrize("func", [np.fmax, np.fmin], ids=lambda f: f.__name__)
def test_fmax_fmin_take_the_gradient_of_the_non_nan_side(func):
    x, y = np.array([np.nan, 2.0, 1.0]), np.array([3.0, np.nan, 0.5])
    gx, gy = gt.grad(lambda x, y: np.sum(func(x, y)), argnums=(0, 1))(x, y)
    expected_x = [0.0, 1.0, 1.0 if func is np.fmax else 0.0]
    np.testing.assert_array_equal(gx, expected_x)
    np.testing.assert_array_equal(gy, 1.0 - np.array(expected_x))


MASKED_BRANCHES = {
    "sqrt": (lambda x: x > 0, np.sqrt),
    "log": (lambda x: x > 0, np.log),
    "pow_half": (lambda x: x > 0, lambda x: x**0.5),
    "log1p": (lambda x: x > 0, lambda x: np.log1p(x - 1)),
    "arcsin": (lambda x: np.abs(x) < 1, np.arcsin),
    "arccosh": (lambda x: x > 1, np.arccosh),
    "xlogy": (lambda x: x > 0, lambda x: sp.xlogy(x, x)),
    "logit": (lambda x: (x > 0) & (x < 1), sp.logit),
    "divide": (lambda x: x != 0, lambda x: 1.0 / x),
    "reciprocal": (lambda x: x != 0, np.reciprocal),
}


@pytest.mark.parametrize("name", MASKED_BRANCHES)
@pytest.mark.parametrize("fill", [0.0, 0], ids=["float_fill", "int_fill"])
def test_masked_branch_gives_finite_gradient(name, fill):
    """np.where(cond, f(x), 0): a zero cotangent times an infinite local derivative is zero."""
    condition, func = MASKED_BRANCHES[name]
    x = np.array([-2.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0])
    inside = condition(x)
    with np.errstate(all="ignore"):
        g = gt.grad(lambda x: np.sum(np.where(condition(x), func(x), fill)))(x)
        h = 1e-6
        fd = (func(x + h) - func(x - h)) / (2 * h)
    assert np.all(np.isfinite(g)), g
    np.testing.assert_array_equal(g[~inside], 0.0)
    np.testing.assert_allclose(g[inside], fd[inside], rtol=1e-5)


def test_masked_product_with_an_infinite_factor():
    p = np.array([0.0, 0.5, 1.0])
    f = lambda p: np.sum(np.where(p > 0, p * np.log(p), 0.0))  # noqa: E731
    expected = [0.0, np.log(0.5) + 1.0, 1.0]
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(gt.grad(f)(p), expected, rtol=1e-14)
        np.testing.assert_allclose(gt.jvp(f, (p,), (np.array([1.0, 0, 0]),))[1], 0.0)
        np.testing.assert_allclose(gt.jvp(f, (p,), (np.ones(3),))[1], sum(expected))
        compiled = gt.compile(gt.grad(f), backend="numpy")
        np.testing.assert_allclose(compiled(p), expected, rtol=1e-14)
        # second order: d/dp (log p + 1) = 1/p, and 0 where the branch is masked
        np.testing.assert_allclose(np.diag(gt.hessian(f)(p)), [0.0, 2.0, 1.0], rtol=1e-14)


# --- scipy.special functions written in Python (wrapped by gradtape) -------------------------
X = np.array([[0.3, -1.2, 2.0], [1.5, 0.1, -0.7]])


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp(axis, keepdims):
    w = weights_like(logsumexp(X, axis=axis, keepdims=keepdims).shape, np.float64)
    assert_grad_matches(lambda x: np.sum(w * logsumexp(x, axis=axis, keepdims=keepdims)), X)


def test_logsumexp_with_b_and_large_values():
    b = np.array([[1.0, 2.0, 0.5], [0.3, 1.0, 1.0]])
    assert_grad_matches(lambda x: logsumexp(x, b=b), X)
    big = X * 300.0  # overflows a naive exp
    g = gt.grad(lambda x: logsumexp(x))(big)
    np.testing.assert_allclose(g, softmax(big), rtol=1e-12)


@pytest.mark.parametrize("func", [softmax, log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_softmax(func, axis):
    w = weights_like(X.shape, np.float64)
    assert_grad_matches(lambda x: np.sum(w * func(x, axis=axis)), X)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_polygamma(n):
    x = np.array([0.4, 1.3, 2.5, 6.0])
    assert_grad_matches(lambda x: np.sum(polygamma(n, x)), x, complex_step=False)


def test_zeta_python_function():
    q = np.array([0.7, 1.5, 3.0])
    assert_grad_matches(lambda q: np.sum(zeta(2.5, q)), q)


SCIPY_IMPORT_ORDERS = {
    "gradtape_first": "import gradtape as gt\nfrom scipy.special import logsumexp, softmax",
    "scipy_first": "import scipy.special\nimport gradtape as gt\n"
    "from scipy.special import logsumexp, softmax",
}


@pytest.mark.parametrize("order", SCIPY_IMPORT_ORDERS)
def test_from_scipy_special_import_in_a_fresh_process(order):
    """The user's `from scipy.special import logsumexp` copies the function: it must work."""
    code = SCIPY_IMPORT_ORDERS[order] + (
        "\nimport numpy as np\nx = np.array([0.5, -1.0, 2.0])\n"
        "g = gt.grad(lambda x: logsumexp(x))(x)\n"
        "assert np.allclose(g, softmax(x)), g\nprint('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_scipy_functions_still_work_on_plain_arrays():
    """gradtape's wrappers send calls without Tracers to SciPy unchanged."""
    gt.grad(lambda x: logsumexp(x))(X)  # installs the wrappers
    assert logsumexp(X) == pytest.approx(np.log(np.sum(np.exp(X))))
    np.testing.assert_allclose(softmax(X, axis=1).sum(axis=1), 1.0)
    assert polygamma(1, 2.0) == pytest.approx(np.pi**2 / 6 - 1)
