"""scipy.stats distributions on traced values: SciPy's values (also outside the support and for
invalid parameters), gradients in the data and the parameters against central differences,
forward against reverse mode, compiled against eager, JAX as an oracle, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
from conftest import central_difference_grad, compile_backends
from hypothesis import given, settings
from hypothesis import strategies as st_
from hypothesis.extra import numpy as hnp

import gradtape as gt
from gradtape.core.tracing import current_levels

# name: (shape parameters, points inside the support (standardized), can its cdf be
# differentiated in the shapes: all can since gammainc's and betainc's shape derivatives)
CONTINUOUS = {
    "norm": ((), [-1.5, 0.2, 2.0], True),
    "t": ((3.5,), [-1.5, 0.2, 2.0], True),
    "cauchy": ((), [-1.5, 0.2, 2.0], True),
    "laplace": ((), [-1.5, 0.2, 2.0], True),
    "logistic": ((), [-1.5, 0.2, 2.0], True),
    "expon": ((), [0.2, 1.0, 2.5], True),
    "gamma": ((2.5,), [0.2, 1.0, 2.5], True),
    "invgamma": ((2.5,), [0.2, 1.0, 2.5], True),
    "beta": ((2.0, 3.5), [0.1, 0.4, 0.8], True),
    "lognorm": ((0.7,), [0.2, 1.0, 2.5], True),
    "chi2": ((3.0,), [0.2, 1.0, 2.5], True),
    "halfnorm": ((), [0.2, 1.0, 2.5], True),
    "uniform": ((), [0.1, 0.5, 0.8], True),
    "weibull_min": ((1.7,), [0.2, 1.0, 2.5], True),
    "pareto": ((2.5,), [1.2, 2.0, 4.0], True),
    "gumbel_r": ((), [-1.5, 0.2, 2.0], True),
    "gumbel_l": ((), [-1.5, 0.2, 2.0], True),
    "rayleigh": ((), [0.2, 1.0, 2.5], True),
    "maxwell": ((), [0.2, 1.0, 2.5], True),
    "halfcauchy": ((), [0.2, 1.0, 2.5], True),
    "halflogistic": ((), [0.2, 1.0, 2.5], True),
    "lomax": ((1.8,), [0.2, 1.0, 2.5], True),
    "fisk": ((2.2,), [0.2, 1.0, 2.5], True),
    "powerlaw": ((1.7,), [0.1, 0.4, 0.8], True),
    "gompertz": ((0.8,), [0.2, 1.0, 2.5], True),
    "invweibull": ((2.3,), [0.4, 1.0, 2.5], True),
    "nakagami": ((1.4,), [0.2, 1.0, 2.5], True),
    "betaprime": ((2.0, 3.5), [0.2, 1.0, 2.5], True),
    "f": ((4.0, 6.5), [0.2, 1.0, 2.5], True),
}
METHODS = ["logpdf", "pdf", "cdf", "sf", "logcdf", "logsf"]
LOC, SCALE = 0.1, 1.3


def _points(name):
    shapes, inside, _ = CONTINUOUS[name]
    return LOC + SCALE * np.array(inside)


@pytest.mark.parametrize("method", METHODS + ["ppf", "isf"])
@pytest.mark.parametrize("name", CONTINUOUS)
def test_continuous_gradients(name, method):
    shapes, _, shapes_differentiable = CONTINUOUS[name]
    dist = getattr(st, name)
    # (laplace's ppf has a kink in its second derivative at 1/2)
    x = np.array([0.15, 0.45, 0.85]) if method in ("ppf", "isf") else _points(name)
    diff_shapes = method in ("logpdf", "pdf") or shapes_differentiable

    def f(x, loc, scale, *shapes):
        return np.sum(getattr(dist, method)(x, *shapes, loc=loc, scale=scale))

    args = (x, LOC, SCALE) + tuple(shapes)
    np.testing.assert_allclose(f(*args), gt.value_and_grad(f)(*args)[0], rtol=1e-12)
    argnums = tuple(range(len(args) if diff_shapes else 3))
    grads = gt.grad(f, argnums=argnums)(*args)
    for i, g in zip(argnums, grads):
        fd = central_difference_grad(f, args, i)
        np.testing.assert_allclose(g, fd, rtol=2e-6, atol=1e-8, err_msg=f"argument {i}")
    # forward mode agrees with reverse
    _, t = gt.jvp(lambda x: f(x, *args[1:]), (x,), (np.ones_like(x),))
    np.testing.assert_allclose(t, np.sum(grads[0]), rtol=1e-10)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", CONTINUOUS)
def test_continuous_values_everywhere_are_scipys(name, method):
    """Outside the support, at its ends, NaN data, invalid parameters: SciPy's values."""
    shapes, _, _ = CONTINUOUS[name]
    dist = getattr(st, name)
    a, b = dist.support(*shapes)
    ends = [v for v in (a, b) if np.isfinite(v)]
    x = np.array([-3.0, -0.5, 0.0, 0.5, 1.0, 1.5, 7.0, np.nan] + ends)
    at_end = np.isin(x, ends)
    for scale in (1.0, 2.0, -1.0, 0.0):
        bad_shapes = [tuple(-abs(s) for s in shapes)] if shapes else []
        for sh in [shapes] + bad_shapes:
            expected = getattr(dist, method)(x, *sh, loc=0.0, scale=scale)
            with np.errstate(all="ignore"):
                value, tangent = gt.jvp(
                    lambda x: getattr(dist, method)(x, *sh, loc=0.0, scale=scale),
                    (x,),
                    (np.ones_like(x),),
                )
            np.testing.assert_array_equal(np.isnan(value), np.isnan(expected))
            # (a log of a probability near 1 moves by 1e-16 with an ulp of the probability)
            np.testing.assert_allclose(value, expected, rtol=1e-12, atol=1e-15)
            finite = np.isfinite(expected) & ~at_end
            assert np.all(np.isfinite(tangent[finite])), (name, method, sh, scale, tangent)


@pytest.mark.parametrize("name", ["norm", "gamma", "beta", "t"])
def test_frozen_distributions(name):
    shapes, _, _ = CONTINUOUS[name]
    x = _points(name)

    def f(loc, scale):
        d = getattr(st, name)(*shapes, loc=loc, scale=scale)
        return np.sum(d.logpdf(x)) + np.sum(d.pdf(x))

    grads = gt.grad(f, argnums=(0, 1))(LOC, SCALE)
    for i, g in enumerate(grads):
        assert g == pytest.approx(central_difference_grad(f, (LOC, SCALE), i), rel=1e-6)
    frozen = getattr(st, name)(*shapes, loc=LOC, scale=SCALE)  # constant parameters
    g = gt.grad(lambda x: np.sum(frozen.logpdf(x)))(x)
    np.testing.assert_allclose(
        g, central_difference_grad(lambda x: np.sum(frozen.logpdf(x)), (x,), 0), rtol=1e-6
    )


@settings(max_examples=15)
@given(data=st_.data())
def test_broadcasting_shapes_and_float32(data):
    shape_x, shape_p = data.draw(
        st_.sampled_from([((3,), ()), ((2, 3), (3,)), ((2, 1), (1, 4)), ((), (2,))])
    )
    dtype = data.draw(st_.sampled_from([np.float64, np.float32]))
    x = data.draw(hnp.arrays(dtype, shape_x, elements=st_.floats(0.25, 3.0, width=32)))
    a = data.draw(hnp.arrays(np.float64, shape_p, elements=st_.floats(0.5, 4.0)))

    def f(x, a):
        return np.sum(st.gamma.logpdf(x, a, scale=1.5))

    gx, ga = gt.grad(f, argnums=(0, 1))(x, a)
    assert np.shape(gx) == np.shape(x) and np.shape(ga) == np.shape(a)
    np.testing.assert_allclose(ga, central_difference_grad(f, (x, a), 1), rtol=1e-5, atol=1e-6)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(gx, central_difference_grad(f, (x64, a), 0), rtol=1e-4, atol=1e-5)


DISCRETE = {  # name: (shape parameters, their indices that can be differentiated, counts)
    "poisson": ((2.5,), (0,), [0, 1, 3, 7]),
    "binom": ((9, 0.35), (1,), [0, 1, 3, 8]),
    "nbinom": ((4.5, 0.35), (0, 1), [0, 1, 3, 12]),
    "geom": ((0.3,), (0,), [1, 2, 5]),
    "bernoulli": ((0.3,), (0,), [0]),  # (its logsf at 1 is -inf)
}


@pytest.mark.parametrize("method", ["logpmf", "pmf", "cdf", "sf", "logcdf", "logsf"])
@pytest.mark.parametrize("name", DISCRETE)
def test_discrete_gradients_and_values(name, method):
    shapes, diff, k = DISCRETE[name]
    dist = getattr(st, name)
    k = np.array(k, dtype=float)
    if method not in ("logpmf", "pmf") and name == "nbinom":
        diff = (1,)  # the cdf of nbinom has no closed-form derivative in n

    def f(*shapes):
        return np.sum(getattr(dist, method)(k, *shapes))

    np.testing.assert_allclose(
        gt.value_and_grad(f, argnums=diff)(*shapes)[0], f(*shapes), rtol=1e-10
    )
    grads = gt.grad(f, argnums=diff)(*shapes)
    for i, g in zip(diff, grads):
        assert g == pytest.approx(central_difference_grad(f, shapes, i), rel=1e-5, abs=1e-8)
    # everywhere: outside the support, non-integers, invalid parameters
    kk = np.array([-2.0, -0.5, 0.0, 0.5, 1.0, 2.0, 30.0, np.nan])
    bad = tuple(-1.0 if i in diff else s for i, s in enumerate(shapes))
    for sh in (shapes, bad):
        expected = getattr(dist, method)(kk, *sh)
        value = gt.value_and_grad(
            lambda p: np.sum(np.nan_to_num(getattr(dist, method)(kk, *sh[:-1], p), neginf=0.0))
        )(float(sh[-1]))
        got = getattr(dist, method)(kk, *sh)
        np.testing.assert_allclose(got, expected, rtol=1e-10)
        assert np.isfinite(value[1]) or name == "geom"


def test_discrete_ppf_is_scipys_with_zero_derivative():
    q = np.array([0.1, 0.5, 0.9])
    f = lambda mu: np.sum(st.poisson.ppf(q, mu) * mu)  # noqa: E731
    v, g = gt.value_and_grad(f)(2.5)
    assert v == pytest.approx(np.sum(st.poisson.ppf(q, 2.5)) * 2.5)
    assert g == pytest.approx(np.sum(st.poisson.ppf(q, 2.5)))
    cf = gt.compile(gt.value_and_grad(f), backend="numpy")
    for mu in (2.5, 7.0):
        np.testing.assert_allclose(cf(mu), gt.value_and_grad(f)(mu))


# --- multivariate -----------------------------------------------------------------------------
def _spd(d, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    return a @ a.T + d * np.eye(d)


@pytest.mark.parametrize("x_shape", [(3,), (5, 3), (2, 4, 3)])
def test_multivariate_normal_in_x_mean_and_cov(x_shape):
    rng = np.random.default_rng(1)
    x = rng.normal(size=x_shape)
    mean = rng.normal(size=3)
    cov = _spd(3)

    def f(x, mean, cov):
        return np.sum(st.multivariate_normal.logpdf(x, mean, cov))

    np.testing.assert_allclose(gt.value_and_grad(f)(x, mean, cov)[0], f(x, mean, cov))
    grads = gt.grad(f, argnums=(0, 1, 2))(x, mean, cov)
    for i, g in enumerate(grads):
        np.testing.assert_allclose(
            g, central_difference_grad(f, (x, mean, cov), i), rtol=1e-5, atol=1e-7
        )
    # frozen, with traced parameters and with constant ones
    g = gt.grad(lambda m: np.sum(st.multivariate_normal(m, cov).pdf(x)))(mean)
    fd = central_difference_grad(
        lambda m: np.sum(st.multivariate_normal(m, cov).pdf(x)), (mean,), 0
    )
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-10)
    frozen = st.multivariate_normal(mean, cov)
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(frozen.logpdf(x)))(x), grads[0], rtol=1e-10)


def test_multivariate_normal_scalar_and_diagonal_cov_and_errors():
    x = np.array([0.3, -0.2])
    for cov in (1.7, np.array([1.5, 0.5])):

        def f(c):
            return st.multivariate_normal.logpdf(x, np.zeros(2), c)

        assert f(cov) == pytest.approx(gt.value_and_grad(f)(cov)[0])
        np.testing.assert_allclose(
            gt.grad(f)(cov), central_difference_grad(f, (cov,), 0), rtol=1e-6
        )
    with pytest.raises(gt.GradtapeError, match="positive"):
        gt.grad(lambda c: st.multivariate_normal.logpdf(x, np.zeros(2), c))(-np.eye(2))
    with pytest.raises(gt.GradtapeError, match="cdf"):
        gt.grad(lambda m: st.multivariate_normal.cdf(x, m, np.eye(2)))(np.zeros(2))


def test_dirichlet_and_multinomial():
    x = np.array([0.2, 0.3, 0.5])
    alpha = np.array([1.5, 2.0, 3.0])

    def f(x, alpha):
        return st.dirichlet.logpdf(x, alpha) + st.dirichlet(alpha).logpdf(x)

    gx, ga = gt.grad(f, argnums=(0, 1))(x, alpha)
    np.testing.assert_allclose(ga, central_difference_grad(f, (x, alpha), 1), rtol=1e-6)
    # (SciPy refuses x off the simplex: no central differences in x)
    np.testing.assert_allclose(gx, 2 * (alpha - 1) / x, rtol=1e-12)
    counts = np.array([1, 2, 3])
    p = np.array([0.2, 0.3, 0.5])
    g = gt.grad(lambda p: st.multinomial.logpmf(counts, 6, p))(p)
    np.testing.assert_allclose(g, counts / p)  # the unconstrained formula (as JAX's)
    with pytest.raises(ValueError):
        gt.grad(lambda x: st.dirichlet.logpdf(x, alpha))(np.array([0.2, 0.3, 0.6]))


# --- against JAX -----------------------------------------------------------------------------
JAX_CASES = {
    "norm.logpdf": (lambda m, mu, s: m.norm.logpdf(X, mu, s), (0.3, 1.4)),
    "t.logpdf": (lambda m, df: m.t.logpdf(X, df, 0.2, 1.1), (3.5,)),
    "gamma.logpdf": (lambda m, a: m.gamma.logpdf(XP, a, 0.0, 1.5), (2.5,)),
    "beta.logpdf": (lambda m, a, b: m.beta.logpdf(XU, a, b), (2.0, 3.5)),
    "laplace.cdf": (lambda m, s: m.laplace.cdf(X, 0.1, s), (1.3,)),
    "logistic.cdf": (lambda m, s: m.logistic.cdf(X, 0.1, s), (1.3,)),
    "cauchy.logpdf": (lambda m, s: m.cauchy.logpdf(X, 0.1, s), (1.3,)),
    "expon.logpdf": (lambda m, s: m.expon.logpdf(XP, 0.0, s), (1.3,)),
    "chi2.logpdf": (lambda m, df: m.chi2.logpdf(XP, df), (3.0,)),
    "pareto.logpdf": (lambda m, b: m.pareto.logpdf(XP + 1, b), (2.5,)),
    "poisson.logpmf": (lambda m, mu: m.poisson.logpmf(K, mu), (2.5,)),
    "nbinom.logpmf": (lambda m, n, p: m.nbinom.logpmf(K, n, p), (4.5, 0.35)),
    "geom.logpmf": (lambda m, p: m.geom.logpmf(K + 1, p), (0.3,)),
    "bernoulli.logpmf": (lambda m, p: m.bernoulli.logpmf(K % 2, p), (0.3,)),
    "norm.ppf": (lambda m, s: m.norm.ppf(XU, 0.1, s), (1.3,)),
}
X = np.array([-1.5, 0.2, 2.0])
XP = np.array([0.2, 1.0, 2.5])
XU = np.array([0.1, 0.4, 0.8])
K = np.array([0.0, 1.0, 3.0, 6.0])


@pytest.mark.parametrize("case", JAX_CASES)
def test_against_jax(case):
    jax = pytest.importorskip("jax")
    jst = pytest.importorskip("jax.scipy.stats")
    jax.config.update("jax_enable_x64", True)
    f, params = JAX_CASES[case]
    argnums = tuple(range(len(params)))
    ours = gt.grad(lambda *p: np.sum(f(st, *p)), argnums=argnums)(*params)
    theirs = jax.grad(lambda *p: jax.numpy.sum(f(jst, *p)), argnums=argnums)(*params)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)


def test_multivariate_against_jax():
    jax = pytest.importorskip("jax")
    jst = pytest.importorskip("jax.scipy.stats")
    jax.config.update("jax_enable_x64", True)
    x = np.random.default_rng(2).normal(size=(4, 3))
    mean, cov = np.array([0.1, -0.2, 0.3]), _spd(3, 3)
    ours = gt.grad(
        lambda x, m, c: np.sum(st.multivariate_normal.logpdf(x, m, c)), argnums=(0, 1, 2)
    )(x, mean, cov)
    theirs = jax.grad(
        lambda x, m, c: jax.numpy.sum(jst.multivariate_normal.logpdf(x, m, c)), argnums=(0, 1, 2)
    )(x, mean, cov)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-9)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-9)
    # JAX's covariance gradient is symmetric; ours sits on the triangle cholesky reads:
    # they agree on symmetric perturbations
    sym = np.array([[1.0, 0.5, 0.0], [0.5, 0.0, -0.3], [0.0, -0.3, 2.0]])
    assert np.sum(ours[2] * sym) == pytest.approx(float(np.sum(theirs[2] * sym)), rel=1e-9)
    alpha, p = np.array([1.5, 2.0, 3.0]), np.array([0.2, 0.3, 0.5])
    xd = np.array([0.2, 0.3, 0.5])
    np.testing.assert_allclose(
        gt.grad(lambda a: st.dirichlet.logpdf(xd, a))(alpha),
        jax.grad(lambda a: jst.dirichlet.logpdf(xd, a))(alpha),
        rtol=1e-9,
    )
    counts = np.array([1, 2, 3])
    np.testing.assert_allclose(
        gt.grad(lambda p: st.multinomial.logpmf(counts, 6, p))(p),
        jax.grad(lambda p: jst.multinomial.logpmf(counts, 6, p))(p),
        rtol=1e-9,
    )


# --- compiled and nested ----------------------------------------------------------------------
def test_compiled_and_second_order():
    x = np.array([0.3, 1.2, 2.5, -0.4])

    def loglik(theta):
        mu, log_s = theta[0], theta[1]
        return (
            np.sum(st.norm.logpdf(x, mu, np.exp(log_s)))
            + np.sum(st.t.logpdf(x, 4.0, mu, np.exp(log_s)))
            + st.gamma.logpdf(np.exp(log_s), 2.0)
            + np.sum(st.norm(mu, 1.0).logcdf(x))
        )

    theta = np.array([0.2, -0.1])
    for backend in compile_backends():
        cf = gt.compile(gt.value_and_grad(loglik), backend=backend)
        for th in (theta, theta + 0.3):
            v, g = cf(th)
            ve, ge = gt.value_and_grad(loglik)(th)
            assert v == pytest.approx(ve, rel=1e-12)
            np.testing.assert_allclose(g, ge, rtol=1e-10)
    h = gt.hessian(loglik)(theta)
    fd = np.stack(
        [central_difference_grad(lambda t: gt.grad(loglik)(t)[i], (theta,), 0) for i in range(2)]
    )
    np.testing.assert_allclose(h, fd, rtol=1e-5, atol=1e-7)


# --- refused ----------------------------------------------------------------------------------
REFUSED = {
    "poisson k": (lambda k: st.poisson.logpmf(k, 2.0), 3.0, "k has no derivative"),
    "binom n": (lambda n: st.binom.logpmf(2.0, n, 0.3), 5.0, "shape 0 has no derivative"),
    "gamma cdf, second order in a": (
        lambda a: gt.grad(lambda a: st.gamma.cdf(1.0, a))(a),
        2.0,
        "gammainc.*second derivative involving the shape parameter",
    ),
    "t cdf, second order in df": (
        lambda df: gt.grad(lambda df: st.t.cdf(1.0, df))(df),
        2.0,
        "t distribution.*second derivative",
    ),
    "no rule": (lambda x: st.rice.logpdf(x, 2.0), 1.0, "rice.logpdf has no gradtape rule"),
    "no cdf rule": (lambda x: st.vonmises.cdf(x, 2.0), 1.0, "vonmises.cdf has no gradtape rule"),
    "no rule, discrete": (
        lambda p: st.betabinom.logpmf(2, 5, p, 1.0),
        1.0,
        "betabinom.logpmf has no gradtape rule",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused(case):
    f, x, phrase = REFUSED[case]
    with pytest.raises(gt.GradtapeError, match=phrase):
        gt.grad(f)(x)
    assert current_levels() == []


# scipy.stats functions written with SciPy's array-API helpers (which ask a value for its
# .device and __array_namespace__, and write through xpx.at)
ARRAY_API_HELPERS = {
    "zscore": (lambda x: st.zscore(x), (np.array([0.3, -1.2, 2.0, 0.7, 1.1]),)),
    "zscore axis": (lambda x: st.zscore(x, axis=1, ddof=1), (np.arange(8.0).reshape(2, 4) ** 1.5,)),
    "skew": (lambda x: st.skew(x), (np.array([0.3, -1.2, 2.0, 0.7, 1.1, 4.0]),)),
    "kurtosis": (lambda x: st.kurtosis(x, fisher=False), (np.array([0.3, -1.2, 2.0, 0.7, 1.1]),)),
    "moment": (lambda x: st.moment(x, order=3), (np.array([0.3, -1.2, 2.0, 0.7, 1.1]),)),
    "variation": (lambda x: st.variation(x), (np.array([1.3, 2.2, 2.0, 0.7, 1.1]),)),
}


@pytest.mark.parametrize("name", sorted(ARRAY_API_HELPERS))
def test_scipy_stats_functions_on_array_api_helpers(name):
    from breadth import check_rule

    f, args = ARRAY_API_HELPERS[name]
    check_rule(f, *args, rtol=1e-6)


def test_a_traced_value_answers_the_array_api_questions_as_an_ndarray():
    def f(x):
        assert x.device == "cpu" and x.to_device("cpu") is x
        assert x.__array_namespace__() is np
        with pytest.raises(ValueError, match="cpu"):
            x.to_device("cuda")
        return np.sum(x**2)

    np.testing.assert_allclose(gt.grad(f)(np.array([1.0, 2.0])), [2.0, 4.0])


def test_pearsonr_through_scipys_array_api_clip():
    from breadth import check_rule

    x, y = np.array([0.3, -1.2, 2.0, 0.7, 1.1]), np.array([1.0, 0.2, 2.5, 0.4, 0.9])
    check_rule(lambda x, y: st.pearsonr(x, y)[0], x, y, rtol=1e-6, compiled=False)


def test_a_write_into_a_plain_array_names_the_line():
    def f(x):
        out = np.empty(2)
        out[0] = x[0]  # the line the error names
        return np.sum(out)

    for transform in (gt.grad, gt.compile, lambda f: gt.compile(gt.grad(f))):
        with pytest.raises(gt.GradtapeError, match=r"test_scipy_stats.py:\d+: +out\[0\] ="):
            transform(f)(np.ones(2))


def test_von_mises_density():
    """vonmises: logpdf and pdf (its cdf is a series in kappa: refused by name)."""
    x = np.array([4.0, -4.0, 3.0, 0.5, -0.2])
    kappa = np.array([2.0, 0.0, 1e-8, 800.0, 5.0])
    for method in ("logpdf", "pdf"):
        f = getattr(st.vonmises, method)
        got = gt.compile(f, backend="numpy")(x, kappa)
        np.testing.assert_allclose(got, f(x, kappa), rtol=1e-13)  # (exp: x |logpdf| ~ 95)
        np.testing.assert_array_equal(
            np.isnan(gt.compile(f, backend="numpy")(x, -kappa)), np.isnan(f(x, -kappa))
        )
    args = (x, np.array([2.0, 0.5, 1.0, 8.0, 5.0]), 0.3)

    def total(x, kappa, loc):
        return np.sum(st.vonmises.logpdf(x, kappa, loc=loc))

    for i, g in enumerate(gt.grad(total, argnums=(0, 1, 2))(*args)):
        np.testing.assert_allclose(g, central_difference_grad(total, args, i), rtol=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda p: st.gamma.logpdf([0.5, 2.0], a=np.exp(p[0]), scale=np.exp(p[1])),
        lambda p: st.beta.cdf([0.2, 0.7], np.exp(p[0]), [2.0, 3.0]),
        lambda p: st.norm(p[0], [1.0, 2.0]).logsf([0.1, 0.3]),
        lambda p: st.t.pdf(1.5, [3.0, 5.0], loc=p[0], scale=np.exp(p[1])),
        lambda p: st.binom.logpmf([0, 3, 7], 10, np.exp(-(p[0] ** 2)) * 0.5),
        lambda p: st.nbinom.logpmf([0, 3, 7], np.exp(p[0]), 0.4),
        lambda p: st.poisson.logcdf([0, 3, 7], np.exp(p[1]) * 2.0),
    ],
    ids=["gamma", "beta_cdf", "frozen_norm", "t_pdf", "binom", "nbinom", "poisson_cdf"],
)
def test_lists_and_python_numbers_are_taken_as_scipy_takes_them(call):
    p = np.array([0.3, -0.2])

    def f(p):
        return np.sum(call(p))

    value, grad = gt.value_and_grad(f)(p)
    np.testing.assert_allclose(value, f(p), rtol=1e-12)
    np.testing.assert_allclose(grad, central_difference_grad(f, (p,), 0), rtol=1e-5, atol=1e-8)


# distributions with a part of the methods: (shape parameters, the methods with rules)
PARTIAL = {
    "truncnorm": ((-1.0, 2.0), METHODS),
    "skewnorm": ((1.5,), ["logpdf", "pdf"]),
    "genextreme": ((0.2,), METHODS),
    "genextreme ": ((-0.3,), METHODS),  # the other side of c = 0 (support bounded below)
}


@pytest.mark.parametrize("name", PARTIAL)
def test_distributions_with_some_methods(name):
    shapes, methods = PARTIAL[name]
    dist = getattr(st, name.strip())
    x = np.array([-0.8, 0.1, 0.9, 1.7])
    for method in methods:

        def f(x, loc, log_scale, *shapes):
            return np.sum(getattr(dist, method)(x, *shapes, loc=loc, scale=np.exp(log_scale)))

        args = (x, 0.1, 0.2) + shapes
        value, grads = gt.value_and_grad(f, argnums=tuple(range(len(args))))(*args)
        np.testing.assert_allclose(value, f(*args), rtol=1e-12)
        for i, g in enumerate(grads):
            fd = central_difference_grad(f, args, i)
            np.testing.assert_allclose(g, fd, rtol=2e-6, atol=1e-8, err_msg=f"{method} {i}")
        _, t = gt.jvp(lambda x: f(x, *args[1:]), (x,), (np.ones_like(x),))
        np.testing.assert_allclose(t, np.sum(grads[0]), rtol=1e-10)
        # outside the support, NaN data, invalid scales and shapes: SciPy's values
        xs = np.array([-30.0, -3.0, -1.0, 0.0, 0.5, 2.0, 5.0, 40.0, np.nan])
        bad = tuple(-abs(s) - 5.0 for s in shapes) if name == "truncnorm" else ()
        for sh in [shapes] + ([bad] if bad else []):
            for scale in (1.0, 2.0, -1.0, 0.0):
                with np.errstate(all="ignore"):
                    expected = getattr(dist, method)(xs, *sh, loc=0.0, scale=scale)
                    got = gt.jvp(
                        lambda x: getattr(dist, method)(x, *sh, loc=0.0, scale=scale),
                        (xs,),
                        (np.ones_like(xs),),
                    )[0]
                np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    unruled = sorted(set(METHODS) - set(methods)) + ["ppf"]
    with pytest.raises(gt.GradtapeError, match="has no gradtape rule"):
        gt.grad(lambda s: np.sum(getattr(dist, unruled[0])(0.3, *shapes, scale=s)))(1.0)


def test_truncnorm_far_in_a_tail_and_genextreme_at_c_zero():
    # ends at 8 and 9 standard deviations: the mass between them is ~6e-16 (no cancellation)
    f = lambda p: np.sum(st.truncnorm.logpdf([8.2, 8.7], p[0], p[1]))  # noqa: E731
    p = np.array([8.0, 9.0])
    np.testing.assert_allclose(gt.value_and_grad(f)(p)[0], f(p), rtol=1e-12)
    np.testing.assert_allclose(gt.grad(f)(p), central_difference_grad(f, (p,), 0), rtol=1e-5)
    # c = 0 is the Gumbel distribution; the derivative in c there is the limit's
    g = lambda c: np.sum(st.genextreme.logpdf([-0.8, 0.1, 0.9, 1.7], c))  # noqa: E731
    assert gt.grad(g)(0.0) == pytest.approx((g(1e-6) - g(-1e-6)) / 2e-6, rel=1e-7)
    assert gt.grad(g)(0.0) == pytest.approx(gt.grad(g)(1e-9), rel=1e-7)
