"""The derivatives of scipy.special.betainc/betaincc in the shape parameters a and b (and
through them their inverses, Student's t cdf and quantile in the degrees of freedom, and
scipy.stats' beta, f and nbinom in their shapes): against high-precision references (mpmath),
central differences, forward against reverse mode, and their edges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.rules import incomplete_beta

sp = pytest.importorskip("scipy.special")
stats = pytest.importorskip("scipy.stats")

GRID = [
    (a, b, x)
    for a in (0.01, 0.3, 1.0, 2.5, 10.0, 100.0, 1e3)
    for b in (0.02, 0.5, 1.0, 3.0, 40.0, 1e3)
    for x in (1e-6, 0.01, 0.3, 0.5, 0.7, 0.99, 1 - 1e-6, a / (a + b))
]


def test_it_matches_a_high_precision_reference():
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40

    def reference(a, b, x):  # the smaller of I and 1 - I, so the differences keep their digits
        if x > (a + 1) / (a + b + 2):
            f = lambda s, t: -mp.betainc(t, s, 0, 1 - x, regularized=True)  # noqa: E731
        else:
            f = lambda s, t: mp.betainc(s, t, 0, x, regularized=True)  # noqa: E731
        return float(mp.diff(lambda s: f(s, b), a)), float(mp.diff(lambda t: f(a, t), b))

    a, b, x = (np.array(column) for column in zip(*GRID))
    da, db = incomplete_beta.betainc_dab(a, b, x)
    assert not np.isnan(da).any() and not np.isnan(db).any()
    for i in range(len(GRID)):
        want_a, want_b = reference(a[i], b[i], x[i])
        assert abs(da[i] - want_a) <= 1e-10 * abs(want_a) + 1e-300, (GRID[i], da[i], want_a)
        assert abs(db[i] - want_b) <= 1e-10 * abs(want_b) + 1e-300, (GRID[i], db[i], want_b)


@settings(max_examples=60, deadline=None)
@given(a=st.floats(0.1, 50.0), b=st.floats(0.1, 50.0), x=st.floats(0.01, 0.99))
def test_gradients_match_central_differences_forward_and_reverse(a, b, x):
    for f in (sp.betainc, sp.betaincc):
        for i, h in ((0, 1e-6 * max(1.0, a)), (1, 1e-6 * max(1.0, b))):
            args = [a, b, x]

            def g(s, i=i):
                return f(*[s if j == i else v for j, v in enumerate(args)])

            fd = (g(args[i] + h) - g(args[i] - h)) / (2 * h)
            grad = gt.grad(g)(args[i])
            assert abs(grad - fd) <= 1e-6 * max(1.0, abs(fd)), (f, i, a, b, x, grad, fd)
            _, tangent = gt.jvp(g, (args[i],), (1.0,))
            assert tangent == pytest.approx(grad, rel=1e-12, abs=1e-300)


CASES = {
    "betaincinv a": (lambda a: sp.betaincinv(a, 2.0, 0.3), 1.5),
    "betaincinv b": (lambda b: sp.betaincinv(1.5, b, 0.3), 2.0),
    "betainccinv a": (lambda a: sp.betainccinv(a, 2.0, 0.3), 1.5),
    "beta cdf a": (lambda a: stats.beta.cdf(0.3, a, 2.0), 1.5),
    "beta logsf b": (lambda b: stats.beta.logsf(0.3, 1.5, b), 2.0),
    "beta ppf a": (lambda a: stats.beta.ppf(0.7, a, 2.0), 1.5),
    "t cdf df": (lambda df: stats.t.cdf(0.7, df), 3.0),
    "t cdf df, t < 0": (lambda df: stats.t.cdf(-1.3, df, loc=0.2), 5.5),
    "t logsf df": (lambda df: stats.t.logsf(2.0, df), 3.0),
    "t ppf df": (lambda df: stats.t.ppf(0.9, df), 4.0),
    "t isf df": (lambda df: stats.t.isf(0.2, df), 4.0),
    "f cdf dfn": (lambda d: stats.f.cdf(1.5, d, 7.0), 3.0),
    "f sf dfd": (lambda d: stats.f.sf(1.5, 3.0, d), 7.0),
    "nbinom cdf n": (lambda n: stats.nbinom.cdf(3, n, 0.4), 5.0),
    "stdtr vector": (lambda df: np.sum(sp.stdtr(df, np.array([-2.0, 0.0, 0.5, 3.0]))), 2.5),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_inverses_the_t_distribution_and_scipy_stats(name):
    f, v = CASES[name]
    h = 1e-6 * max(1.0, v)
    fd = (f(v + h) - f(v - h)) / (2 * h)
    assert gt.grad(f)(v) == pytest.approx(fd, rel=1e-6, abs=1e-10)


def test_compiled():
    x = np.array([0.05, 0.3, 0.6, 0.95])

    def f(ab):
        return np.sum(sp.betainc(ab[0], ab[1], x) * np.arange(1.0, 5.0))

    compiled = gt.compile(gt.grad(f), backend="numpy")
    for ab in (np.array([1.5, 2.0]), np.array([0.7, 9.0])):
        da, db = incomplete_beta.betainc_dab(ab[0], ab[1], x)
        expected = np.array([da @ np.arange(1.0, 5.0), db @ np.arange(1.0, 5.0)])
        np.testing.assert_allclose(compiled(ab), expected, rtol=1e-13)


def test_edges():
    dab = incomplete_beta.betainc_dab
    assert dab(2.0, 3.0, 0.0) == (0.0, 0.0) and dab(2.0, 3.0, 1.0) == (0.0, 0.0)
    for a, b, x in ((0.0, 1.0, 0.5), (1.0, -1.0, 0.5), (1.0, 1.0, 1.5), (np.nan, 1.0, 0.5)):
        assert np.isnan(dab(a, b, x)).all()
    da, db = dab(np.ones((2, 1)), 2.0, np.full(3, 0.4))
    assert da.shape == db.shape == (2, 3)
    # b = 1 ends the fraction (I = x^a): dI/da = x^a log x exactly
    np.testing.assert_allclose(dab(0.02, 1.0, 0.3)[0], 0.3**0.02 * np.log(0.3), rtol=1e-14)
    # the t cdf does not depend on df at t = 0, t = +-inf or df = inf
    for df, t in ((3.0, 0.0), (3.0, np.inf), (3.0, -np.inf), (np.inf, 1.0)):
        assert gt.grad(lambda d, t=t: sp.stdtr(d, t))(df) == 0.0


def test_an_entry_that_does_not_converge_is_nan_not_a_number_that_is_off(monkeypatch):
    monkeypatch.setattr(incomplete_beta, "MAX_TERMS", 3)
    assert np.isnan(incomplete_beta.betainc_dab(50.0, 60.0, 0.45)).all()


def test_second_order_in_a_shape_is_refused_with_a_message():
    with pytest.raises(gt.GradtapeError, match="second derivative involving the shape"):
        gt.grad(gt.grad(lambda a: sp.betainc(a, 2.0, 0.3)))(1.5)
    second = gt.grad(gt.grad(lambda x: sp.betainc(1.5, 2.0, x)))(0.3)  # in x: still there
    h = 1e-5
    d = lambda x: gt.grad(lambda x: sp.betainc(1.5, 2.0, x))(x)  # noqa: E731
    assert second == pytest.approx((d(0.3 + h) - d(0.3 - h)) / (2 * h), rel=1e-6)
