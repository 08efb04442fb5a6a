"""scipy.special, the long tail: forward against reverse mode, second derivatives, JAX as an
oracle, and the arguments without a derivative (a clear error, never a number).

The first derivatives of every ufunc rule are checked against central differences and the
complex step in test_elementwise.py (the domains are in conftest.py).
"""

from __future__ import annotations

import math
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
    central_difference_grad,
    compile_backends,
    weights_like,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.core.tracing import current_levels

NEW_UFUNCS = [
    "jv",
    "yv",
    "iv",
    "kv",
    "ive",
    "kve",
    "yn",
    "kn",
    "j0",
    "j1",
    "y0",
    "y1",
    "i0",
    "i1",
    "i0e",
    "i1e",
    "k0",
    "k1",
    "k0e",
    "k1e",
    "gammainc",
    "gammaincc",
    "betainc",
    "betaincc",
    "beta",
    "rgamma",
    "erfcinv",
    "rel_entr",
    "kl_div",
    "huber",
    "pseudo_huber",
    "spence",
    "gammaincinv",
    "gammainccinv",
    "betaincinv",
    "betainccinv",
    "stdtr",
    "stdtrit",
    "pdtr",
    "pdtrc",
    "bdtr",
    "bdtrc",
]


def _args(data, name, dtype=np.float64):
    domain = DOMAINS["psi" if name == "digamma" else name]
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
        data.draw(argument_strategy(shape, intervals, dtype))
        for shape, intervals in zip(shapes, domain.args)
    )
    return domain, args


@pytest.mark.parametrize("name", NEW_UFUNCS)
@settings(max_examples=10)
@given(data=st.data())
def test_forward_mode_agrees_with_reverse(name, data):
    ufunc = getattr(sp, name)
    domain, args = _args(data, name)
    out_shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    weights = weights_like(out_shape, np.float64)
    i = domain.diff_args[0]

    def f(x):
        a = list(args)
        a[i] = x
        return np.sum(weights * ufunc(*a))

    with np.errstate(all="ignore"):
        g = gt.grad(f)(args[i])
        direction = np.cos(np.arange(np.size(args[i])) + 1.0).reshape(np.shape(args[i]))
        _, t = gt.jvp(f, (args[i],), (direction if np.ndim(args[i]) else float(direction),))
    np.testing.assert_allclose(t, np.sum(np.asarray(g) * direction), rtol=1e-9, atol=1e-12)


SECOND_ORDER = {  # name: (args, index of the differentiated argument)
    "jv": ((1.3, 2.1), 1),
    "iv": ((0.5, 1.7), 1),
    "kv": ((2.0, 0.9), 1),
    "ive": ((1.5, 1.2), 1),
    "kve": ((0.5, 2.5), 1),
    "yn": ((2, 1.5), 1),
    "j1": ((0.7,), 0),
    "y1": ((1.1,), 0),
    "i1e": ((-0.8,), 0),
    "k1e": ((1.4,), 0),
    "gammainc": ((2.5, 1.3), 1),
    "betainc": ((2.0, 3.0, 0.4), 2),
    "beta": ((1.5, 2.5), 0),
    "rgamma": ((-1.5,), 0),
    "erfcinv": ((0.3,), 0),
    "kl_div": ((0.7, 1.9), 1),
    "pseudo_huber": ((0.8, 1.7), 0),
    "spence": ((2.5,), 0),
    "gammaincinv": ((2.0, 0.3), 1),
    "betaincinv": ((2.0, 3.0, 0.6), 2),
    "stdtr": ((4.5, 0.8), 1),
    "stdtrit": ((3.5, 0.8), 1),
    "pdtr": ((3, 2.5), 1),
    "bdtr": ((3, 8, 0.4), 2),
}


@pytest.mark.parametrize("name", SECOND_ORDER)
def test_second_derivative_against_differences_of_the_first(name):
    args, i = SECOND_ORDER[name]
    ufunc = getattr(sp, name)

    def f(x):
        a = list(args)
        a[i] = x
        return ufunc(*a)

    x = float(args[i])
    h = gt.grad(gt.grad(f))(x)
    step = 1e-5
    fd = (gt.grad(f)(x + step) - gt.grad(f)(x - step)) / (2 * step)
    assert h == pytest.approx(fd, rel=1e-6, abs=1e-9)
    assert gt.hessian(f)(x) == pytest.approx(h, rel=1e-10)


# --- removable singularities: exact to every order at the point itself ----------------------------
def test_sinc_at_zero_to_the_fourth_order():
    d = [np.sinc]
    for _ in range(4):
        d.append(gt.grad(d[-1]))
    expected = [1.0, 0.0, -(math.pi**2) / 3, 0.0, math.pi**4 / 5]
    for k, (f, e) in enumerate(zip(d, expected)):
        assert f(0.0) == pytest.approx(e, abs=1e-12), f"derivative {k}"
    # away from 0: the derivative of sin(pi x)/(pi x)
    x = np.array([-1.3, 0.4, 2.2])
    assert_grad_matches(lambda x: np.sum(np.sinc(x) ** 2), x)
    assert gt.grad(lambda x: np.sum(np.sinc(x)))(np.float32(0.5)).dtype == np.float32


def test_spence_at_one_to_the_third_order():
    d1 = gt.grad(sp.spence)
    d2 = gt.grad(d1)
    d3 = gt.grad(d2)
    assert d1(1.0) == pytest.approx(-1.0)
    assert d2(1.0) == pytest.approx(0.5)
    assert d3(1.0) == pytest.approx(-2.0 / 3.0)
    for f in (d1, d2):  # continuous through 1
        assert f(1.0) == pytest.approx(f(1.0 + 1e-7), rel=1e-5)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_rgamma_through_the_poles_of_gamma(n):
    x = -float(n)
    assert gt.grad(sp.rgamma)(x) == pytest.approx((-1) ** n * math.factorial(n))
    second = -2 * (-1) ** n * math.factorial(n) * sp.digamma(n + 1.0)
    assert gt.grad(gt.grad(sp.rgamma))(x) == pytest.approx(second, rel=1e-9)


def test_huber_and_pseudo_huber_at_their_edges():
    # pseudo_huber at delta = 0 (one-sided): |r| in delta, 0 in r; at (0, 0) zero
    gd, gr = gt.grad(sp.pseudo_huber, argnums=(0, 1))(0.0, -1.5)
    assert (gd, gr) == (1.5, 0.0)
    h = gt.grad(gt.grad(sp.pseudo_huber))(1e-300, 2.0)
    assert h == pytest.approx(-2.0)  # d2/d delta2 of delta sqrt(delta^2 + r^2) - delta^2
    assert gt.grad(sp.pseudo_huber, argnums=(0, 1))(0.0, 0.0) == (0.0, 0.0)
    assert gt.grad(sp.huber, argnums=(0, 1))(1.0, 3.0) == (2.0, 1.0)
    assert gt.grad(sp.huber, argnums=(0, 1))(1.0, 0.5) == (0.0, 0.5)


# --- Python-level scipy.special functions --------------------------------------------------------
def test_lambertw_real_branches():
    z = np.array([-0.3, 0.0, 0.5, 4.0])
    w = sp.lambertw(z).real
    g = gt.grad(lambda z: np.sum(sp.lambertw(z)))(z)
    np.testing.assert_allclose(g, np.exp(-w) / (1 + w), rtol=1e-12)
    assert_grad_matches(lambda z: np.sum(sp.lambertw(z, 0).real ** 2), z, complex_step=False)
    zm = np.array([-0.3, -0.1])
    assert_grad_matches(lambda z: np.sum(sp.lambertw(z, -1).real), zm, complex_step=False)
    with pytest.raises(gt.GradtapeError, match="complex"):
        gt.grad(lambda z: np.sum(sp.lambertw(z)))(np.array([-1.0, 0.5]))
    with pytest.raises(gt.GradtapeError, match="complex"):
        gt.grad(lambda z: np.sum(sp.lambertw(z, 1)))(np.array([0.5]))
    assert current_levels() == []


def test_multigammaln_and_array_orders_of_polygamma():
    a = np.array([2.5, 4.0])
    assert_grad_matches(lambda a: np.sum(sp.multigammaln(a, 3)), a)
    n = np.array([0, 1, 3])
    x = np.array([0.7, 1.9, 3.1])
    assert_grad_matches(lambda x: np.sum(sp.polygamma(n, x)), x)
    with pytest.raises(ValueError, match="condition a"):
        gt.grad(lambda a: np.sum(sp.multigammaln(a, 3)))(np.array([0.9]))


def test_logsumexp_variants_against_jax():
    jsp = pytest.importorskip("jax.scipy.special")
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    a = np.array([[0.3, -1.2, 2.0], [1.0, 0.5, -0.7]])
    b = np.array([[1.0, 0.5, 2.0], [0.2, -0.3, 1.5]])
    for axis in (None, 0, 1):
        for keepdims in (False, True):

            def f(a, b):
                return np.sum(
                    np.sin(sp.logsumexp(a, axis=axis, b=b, keepdims=keepdims, return_sign=True)[0])
                )

            def jf(a, b):
                return jax.numpy.sum(
                    jax.numpy.sin(
                        jsp.logsumexp(a, axis=axis, b=b, keepdims=keepdims, return_sign=True)[0]
                    )
                )

            got = gt.grad(f, argnums=(0, 1))(a, np.abs(b))
            want = jax.grad(jf, argnums=(0, 1))(a, np.abs(b))
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-12)
            value, sign = sp.logsumexp(a, axis=axis, b=b, return_sign=True)
            tv = gt.jvp(
                lambda a: sp.logsumexp(a, axis=axis, b=b, return_sign=True)[0],
                (a,),
                (np.ones_like(a),),
            )[0]
            np.testing.assert_allclose(tv, value)
    for f, jf in ((sp.softmax, jax.nn.softmax), (sp.log_softmax, jax.nn.log_softmax)):
        w = np.arange(6.0).reshape(2, 3)
        got = gt.grad(lambda a: np.sum(w * f(a, axis=1)))(a)
        want = jax.grad(lambda a: jax.numpy.sum(w * jf(a, axis=1)))(a)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


JAX_ORACLE = {  # gradtape's gradient in the differentiated argument against JAX's
    "gammainc": ((2.5, np.array([0.3, 1.3, 4.0])), 1),
    "gammaincc": ((0.7, np.array([0.3, 1.3, 4.0])), 1),
    "betainc": ((2.0, 3.5, np.array([0.1, 0.5, 0.9])), 2),
    "i0e": ((np.array([-2.0, 0.5, 3.0]),), 0),
    "i1e": ((np.array([-2.0, 0.5, 3.0]),), 0),
    "i0": ((np.array([-2.0, 0.5, 3.0]),), 0),
    "i1": ((np.array([-2.0, 0.5, 3.0]),), 0),
    "erfcinv": ((np.array([0.2, 1.0, 1.7]),), 0),
    "spence": ((np.array([0.2, 0.9, 3.0]),), 0),  # (at 1 JAX's gives 0; the limit is -1)
    "kl_div": ((np.array([0.2, 1.0, 3.0]), np.array([1.5, 0.3, 2.0])), 0),
    "rel_entr": ((np.array([0.2, 1.0, 3.0]), np.array([1.5, 0.3, 2.0])), 1),
    "beta": ((np.array([0.5, 2.0]), np.array([1.5, 3.0])), 0),
}


@pytest.mark.parametrize("name", JAX_ORACLE)
def test_against_jax(name):
    jax = pytest.importorskip("jax")
    jsp = pytest.importorskip("jax.scipy.special")
    jax.config.update("jax_enable_x64", True)
    jf = getattr(jsp, name, None)
    if jf is None:
        pytest.skip(f"jax.scipy.special has no {name}")
    args, i = JAX_ORACLE[name]
    f = getattr(sp, name)

    def ours(x):
        a = list(args)
        a[i] = x
        return np.sum(f(*a))

    def theirs(x):
        a = list(args)
        a[i] = x
        return jax.numpy.sum(jf(*a))

    np.testing.assert_allclose(gt.grad(ours)(args[i]), jax.grad(theirs)(args[i]), rtol=1e-9)


# --- no derivative: a clear error naming the argument -------------------------------------------
REFUSED = {
    "Bessel order": (lambda v: sp.jv(v, 1.5), "order"),
    "Bessel order, scaled": (lambda v: sp.kve(v, 1.5), "order"),
    "gammainc, second order in a": (
        lambda a: gt.grad(lambda a: sp.gammainc(a, 1.5))(a),
        "second derivative involving the shape parameter",
    ),
    "betainc, second order in b": (
        lambda b: gt.grad(lambda b: sp.betainc(2.0, b, 0.5))(b),
        "second derivative involving the shape parameter a or b",
    ),
    "Riemann zeta": (lambda x: sp.zeta(x), "zeta.*x"),
    "Hurwitz zeta in x": (lambda x: sp.zeta(x, 2.0), "argument 0"),
    "t cdf, second order in df": (lambda df: gt.grad(lambda df: sp.stdtr(df, 0.5))(df), "a or b"),
    "a count": (lambda k: sp.pdtr(k, 2.0), "count"),
}


@pytest.mark.parametrize("case", REFUSED)
@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_arguments_without_a_derivative_are_refused(case, mode):
    f, phrase = REFUSED[case]
    with pytest.raises(gt.GradtapeError, match=phrase) as info:
        if mode == "reverse":
            gt.grad(f)(2.5)
        else:
            gt.jvp(f, (2.5,), (1.0,))
    assert "stop_gradient" in str(info.value) or "custom_vjp" in str(info.value)
    assert current_levels() == []
    # the other argument, or a constant order, is fine
    assert np.isfinite(gt.grad(lambda z: sp.jv(2.5, z))(1.5))


def _bessel_of_sine(order, x):
    y = np.sin(x)
    return np.sum(sp.jv(order, y))  # the line a refusal names


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, v, x: gt.grad(f, argnums=(0, 1))(v, x),
        lambda f, v, x: gt.jvp(f, (v, x), (np.ones_like(v), np.ones_like(x))),
        lambda f, v, x: gt.compile(gt.grad(f, argnums=(0, 1)), backend="numpy")(v, x),
        lambda f, v, x: gt.grad(lambda v, x: gt.grad(f, argnums=(0, 1))(v, x)[1].sum())(v, x),
    ],
    ids=["grad", "jvp", "compiled grad", "grad of grad"],
)
def test_a_refusal_in_the_derivative_names_the_users_line(transform):
    v, x = np.array([1.0, 2.0]), np.array([0.3, 0.4])
    with pytest.raises(gt.GradtapeError) as info:
        transform(_bessel_of_sine, v, x)
    message = str(info.value)
    assert "order" in message
    assert "test_scipy_special.py:" in message
    assert "np.sum(sp.jv(order, y))  # the line a refusal names" in message
    assert message.count("recorded at") == 1
    assert current_levels() == []


def test_an_error_of_another_type_in_a_rule_gets_the_line_as_a_note(monkeypatch):
    from gradtape.rules.linalg import inv_p

    def f(a):
        return np.sum(np.linalg.inv(a))  # inv's derivative meets an error

    def failing_rule(g, ans, a):
        raise ValueError("a failing rule")

    monkeypatch.setattr(inv_p, "vjps", (failing_rule,))
    with pytest.raises(ValueError, match="a failing rule") as info:
        gt.grad(f)(np.eye(2) * 2.0)
    if sys.version_info >= (3, 11):  # exception notes
        assert any("inv's derivative meets an error" in note for note in info.value.__notes__)


def test_gammasgn_has_zero_derivative_and_compiles():
    f = gt.compile(gt.grad(lambda x: np.sum(sp.gammasgn(x) * x)))
    np.testing.assert_array_equal(f(np.array([-1.5, 2.0])), [1.0, 1.0])


def test_compiled_matches_eager():
    def f(x):
        return np.sum(sp.jv(1.5, x) + sp.i1e(x) + sp.gammainc(2.0, x) + sp.rgamma(x)) + np.sum(
            sp.spence(x) + np.sinc(x) + sp.lambertw(x)
        )

    x = np.array([0.3, 1.0, 2.5])
    for backend in compile_backends():
        cf = gt.compile(gt.value_and_grad(f), backend=backend)
        for y in (x, x + 0.25):
            v, g = cf(y)
            ve, ge = gt.value_and_grad(f)(y)
            np.testing.assert_allclose(v, ve, rtol=1e-12)
            np.testing.assert_allclose(g, ge, rtol=1e-10)
    fd = central_difference_grad(f, [x], 0)
    np.testing.assert_allclose(gt.grad(f)(x), fd, rtol=1e-6)


# --- native scalar forms: the numba backend computes these in its fused loops ------------------
_EDGES = [0.0, -0.0, 1.0, -1.0, -2.0, 0.5, 0.3, 0.65, np.inf, -np.inf, np.nan, 1e-300, -1e-300]
_EDGES += [5e-324, 1e300, -1e300, 1.4616321449683622, -2.5, 10.0, -37.0, -38.5, -40.0]
NATIVE_SPECIAL = {  # name: (function, the interval of its random sample per argument)
    "digamma": (sp.psi, [(-30.0, 30.0)]),
    "log_ndtr": (sp.log_ndtr, [(-60.0, 12.0)]),
    "logit": (sp.logit, [(0.0, 1.0)]),
    "entr": (sp.entr, [(-1.0, 5.0)]),
    "xlog1py": (sp.xlog1py, [(-2.0, 5.0), (-1.0, 5.0)]),
    "rel_entr": (sp.rel_entr, [(-1.0, 5.0), (-1.0, 5.0)]),
    "kl_div": (sp.kl_div, [(-1.0, 5.0), (-1.0, 5.0)]),
    "huber": (sp.huber, [(-1.0, 3.0), (-5.0, 5.0)]),
    "pseudo_huber": (sp.pseudo_huber, [(-1.0, 3.0), (-5.0, 5.0)]),
}


def _native_samples(intervals, dtype):
    """A random sample of each argument's interval, then the edge values (every pair of them
    for two arguments); for float32, the edges float32 represents (no overflow to inf)."""
    rng = np.random.default_rng(7)
    edges = np.array(_EDGES)
    if dtype == np.float32:
        finfo = np.finfo(np.float32)
        magnitude = np.abs(edges)
        edges = edges[
            ~np.isfinite(edges)
            | (edges == 0)
            | ((magnitude < finfo.max) & (magnitude > finfo.tiny))
        ]
    samples = [rng.uniform(lo, hi, 4000) for lo, hi in intervals]
    if len(intervals) == 1:
        return [np.concatenate([samples[0], edges]).astype(dtype)]
    pairs = np.meshgrid(edges, edges)
    return [np.concatenate([s, e.ravel()]).astype(dtype) for s, e in zip(samples, pairs)]


@pytest.mark.native
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", NATIVE_SPECIAL)
def test_native_forms_compute_scipys_values(name, dtype):
    from gradtape.compile.numba.backend import lowered
    from gradtape.compile.numba.fusion import PYTHON

    function, intervals = NATIVE_SPECIAL[name]
    args = _native_samples(intervals, dtype)
    compiled = gt.compile(lambda *a: function(*a) * 1.0, backend="numba")
    with np.errstate(all="ignore"):
        ours, expected = compiled(*args), function(*args)
    low = lowered(compiled, *args)
    assert low.tier == "native", name
    assert all(stage.kind != PYTHON for stage in low.generated.plan.stages), name
    assert ours.dtype == expected.dtype
    same = (ours == expected) | (np.isnan(ours) & np.isnan(expected))
    scale = np.maximum(1.0, np.abs(expected))
    rtol = 1e-13 if dtype == np.float64 else 1e-6
    with np.errstate(invalid="ignore"):
        close = np.abs(ours.astype(float) - expected) <= rtol * scale
    assert np.all(same | close), list(zip(*(a[~(same | close)][:5] for a in args)))


@pytest.mark.native
@pytest.mark.parametrize("name", NATIVE_SPECIAL)
def test_native_forms_differentiate_like_the_numpy_backend(name):
    from gradtape.compile.numba.backend import lowered

    function = NATIVE_SPECIAL[name][0]
    domain = DOMAINS["psi" if name == "digamma" else name]
    rng = np.random.default_rng(3)
    args = [rng.uniform(*intervals[0], 40) for intervals in domain.args]

    def loss(*a):
        return np.sum(function(*a) * weights_like((40,), np.float64))

    argnums = tuple(range(len(args)))
    native = gt.compile(gt.value_and_grad(loss, argnums=argnums), backend="numba")
    value, grads = native(*args)
    reference_value, reference_grads = gt.value_and_grad(loss, argnums=argnums)(*args)
    np.testing.assert_allclose(value, reference_value, rtol=1e-13)
    for g, r in zip(grads, reference_grads):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-14)
    assert lowered(native, *args).tier == "native"


COMBINATORICS = {
    "comb in k": (lambda k: sp.comb(10.0, k), np.array([3.2, 4.4, 5.7])),
    "comb in N": (lambda n: sp.comb(n, 3.0), np.array([6.2, 7.4, 9.7])),
    "comb outside the range": (
        lambda k: sp.comb(np.array([3.0, -1.0, 2.0]), k),
        np.array([0.2, 1.4, 2.7]),
    ),
    "comb with repetition": (lambda n: sp.comb(n, 3.0, repetition=True), np.array([6.2, 7.4])),
    "comb with repetition, k = 0": (
        lambda n: sp.comb(n, np.array([0.0, 5.0]), repetition=True),
        np.array([2.2, 3.4]),
    ),
    "perm": (lambda k: sp.perm(10.0, k), np.array([2.2, 3.4, 4.7])),
}


@pytest.mark.parametrize("name", sorted(COMBINATORICS))
def test_comb_and_perm(name):
    from breadth import check_rule

    f, x = COMBINATORICS[name]
    check_rule(f, x, rtol=1e-6)


def test_exact_counts_are_refused():
    with pytest.raises(gt.GradtapeError, match="exact=True"):
        gt.grad(lambda k: sp.comb(10, k, exact=True))(3.0)
