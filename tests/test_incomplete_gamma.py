"""The derivative of scipy.special.gammainc/gammaincc in the shape parameter a (and through
them scipy.stats' gamma, chi2, and the inverses): against high-precision references (mpmath),
JAX's igamma_grad_a, central differences, forward against reverse mode, and its edges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.rules import incomplete_gamma

sp = pytest.importorskip("scipy.special")
stats = pytest.importorskip("scipy.stats")

# a from 1e-3 to 1e4, x on both sides of a and of 1 (series and continued fraction)
GRID = [
    (a, x)
    for a in (1e-3, 0.1, 0.5, 1.0, 2.5, 10.0, 50.0, 300.0, 1e3, 1e4)
    for x in (1e-4, 0.01, 0.5, 1.0, 2.0, 0.5 * a, 0.9 * a, a, 1.1 * a, 2 * a, a + 30 * a**0.5)
]


def test_it_matches_a_high_precision_reference():
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40

    def reference(a, x):  # the smaller of P and Q, so that the difference keeps its digits
        if x > a:
            q = lambda t: mp.gammainc(t, x, mp.inf, regularized=True)  # noqa: E731
            return -float(mp.diff(q, a))
        return float(mp.diff(lambda t: mp.gammainc(t, 0, x, regularized=True), a))

    a, x = (np.array(column) for column in zip(*GRID))
    got = incomplete_gamma.gammainc_da(a, x)
    for ai, xi, gi in zip(a, x, got):
        want = reference(ai, xi)
        assert abs(gi - want) <= 1e-10 * abs(want) + 1e-300, (ai, xi, gi, want)


def test_it_matches_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    a, x = (np.array(column) for column in zip(*GRID))
    keep = a <= 1e3  # (JAX's iteration cap stops short beyond)
    want = jax.vmap(jax.grad(jax.scipy.special.gammainc))(a[keep], x[keep])
    np.testing.assert_allclose(incomplete_gamma.gammainc_da(a, x)[keep], want, rtol=1e-9)


@settings(max_examples=60, deadline=None)
@given(a=st.floats(0.05, 200.0), x=st.floats(0.01, 400.0))
def test_gradients_in_a_match_central_differences_forward_and_reverse(a, x):
    h = 1e-6 * max(1.0, a)
    for f in (sp.gammainc, sp.gammaincc):
        fd = (f(a + h, x) - f(a - h, x)) / (2 * h)
        grad = gt.grad(lambda a: f(a, x))(a)
        assert abs(grad - fd) <= 1e-6 * max(1.0, abs(fd)), (f, a, x, grad, fd)
        _, tangent = gt.jvp(lambda a: f(a, x), (a,), (1.0,))
        assert tangent == pytest.approx(grad, rel=1e-12, abs=1e-300)


def test_the_inverses_and_scipy_stats_in_their_shape_parameters():
    cases = [
        (lambda a: sp.gammaincinv(a, 0.3), 1.5),
        (lambda a: sp.gammainccinv(a, 0.3), 1.5),
        (lambda d: stats.chi2.ppf(0.9, d), 3.0),
        (lambda d: stats.chi2.sf(2.0, d), 3.0),
        (lambda a: stats.gamma.logcdf(2.0, a, scale=1.5), 2.2),
        (lambda a: np.sum(stats.gamma.sf(np.array([0.5, 2.0, 9.0]), a)), 2.2),
        (lambda a: stats.gamma.ppf(0.4, a, scale=2.0), 2.0),
        (lambda a: stats.invgamma.cdf(0.7, a), 2.0),
        (lambda a: stats.invgamma.isf(0.2, a), 2.0),
    ]
    for f, a in cases:
        h = 1e-6
        fd = (f(a + h) - f(a - h)) / (2 * h)
        assert gt.grad(f)(a) == pytest.approx(fd, rel=1e-6)


def test_compiled_and_vectorized():
    x = np.array([0.3, 1.3, 4.0, 20.0])

    def f(a):
        return np.sum(sp.gammainc(a, x) * np.arange(1.0, 5.0))

    a = np.array([0.7, 2.5, 3.0, 11.0])
    compiled = gt.compile(gt.grad(f), backend="numpy")
    for shift in (0.0, 0.4):
        expected = incomplete_gamma.gammainc_da(a + shift, x) * np.arange(1.0, 5.0)
        np.testing.assert_allclose(compiled(a + shift), expected, rtol=1e-13)
        np.testing.assert_allclose(gt.grad(f)(a + shift), expected, rtol=1e-13)


def test_edges():
    da = incomplete_gamma.gammainc_da
    assert da(2.0, 0.0) == 0.0 and da(2.0, np.inf) == 0.0  # P is 0 and 1 for every a
    assert da(1e4, 1e-3) == 0.0  # x^a e^-x / Gamma(a) underflows
    for a, x in ((0.0, 1.0), (-1.0, 1.0), (1.0, -1.0), (np.nan, 1.0), (1.0, np.nan), (np.inf, 1)):
        assert np.isnan(da(a, x))
    assert np.shape(da(np.ones((2, 1)), np.ones(3))) == (2, 3)


def test_an_entry_that_does_not_converge_is_nan_not_a_number_that_is_off(monkeypatch):
    monkeypatch.setattr(incomplete_gamma, "MAX_TERMS", 5)
    got = incomplete_gamma.gammainc_da(np.array([50.0, 50.0]), np.array([50.0, 60.0]))
    assert np.isnan(got).all()


def test_second_order_in_a_is_refused_with_a_message():
    with pytest.raises(gt.GradtapeError, match="second derivative involving the shape"):
        gt.grad(gt.grad(lambda a: sp.gammainc(a, 2.0)))(1.5)
    # second order in x alone is still there
    second = gt.grad(gt.grad(lambda x: sp.gammainc(1.5, x)))(2.0)
    h = 1e-5
    d = lambda x: gt.grad(lambda x: sp.gammainc(1.5, x))(x)  # noqa: E731
    assert second == pytest.approx((d(2.0 + h) - d(2.0 - h)) / (2 * h), rel=1e-6)
