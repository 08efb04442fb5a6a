"""SciPy code as people write it: integrate and optimize helpers inside losses, and a few
representative models (a scipy.stats log-likelihood, a Gaussian process with
scipy.stats.multivariate_normal, a Rosenbrock minimisation with jac=gt.grad(f))."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate as si
import scipy.optimize as so
import scipy.stats as st
from conftest import assert_grad_matches, central_difference_grad

import gradtape as gt

X = np.linspace(0.0, 2.0, 9)

HELPERS = {
    "trapezoid": lambda y: si.trapezoid(np.sin(y) * y, X),
    "trapezoid dx": lambda y: si.trapezoid(y**3, dx=0.25),
    "simpson": lambda y: si.simpson(np.exp(y), x=X),
    "cumulative_trapezoid": lambda y: np.sum(si.cumulative_trapezoid(y**2, X, initial=0) ** 2),
    "rosen": so.rosen,
    "rosen_der": lambda y: np.sum(so.rosen_der(y) ** 2),
    "rosen_hess": lambda y: np.sum(so.rosen_hess(y) * np.arange(81.0).reshape(9, 9)),
    "rosen_hess_prod": lambda y: np.sum(so.rosen_hess_prod(y, np.cos(X)) ** 2),
}


@pytest.mark.parametrize("name", HELPERS)
def test_helpers(name):
    f = HELPERS[name]
    y = np.sin(X) + 0.5
    assert_grad_matches(f, y)
    _, t = gt.jvp(f, (y,), (np.ones_like(y),))
    assert t == pytest.approx(np.sum(gt.grad(f)(y)), rel=1e-10)
    cf = gt.compile(gt.grad(f), backend="numpy")
    np.testing.assert_allclose(cf(y + 0.1), gt.grad(f)(y + 0.1), rtol=1e-12)


def test_rosen_hessian_is_rosen_hess():
    y = np.array([1.3, 0.7, 0.8, 1.9, 1.2])
    np.testing.assert_allclose(gt.hessian(so.rosen)(y), so.rosen_hess(y), rtol=1e-12)
    np.testing.assert_allclose(gt.jacobian(so.rosen_der)(y), so.rosen_hess(y), rtol=1e-12)


def test_minimize_with_gradtape_jacobian():
    res = so.minimize(so.rosen, np.array([-1.2, 1.0, 0.5]), jac=gt.grad(so.rosen), method="BFGS")
    assert res.success
    np.testing.assert_allclose(res.x, 1.0, atol=1e-5)
    vg = gt.compile(gt.value_and_grad(so.rosen))
    res = so.minimize(vg, np.array([-1.2, 1.0, 0.5]), jac=True, method="L-BFGS-B")
    np.testing.assert_allclose(res.x, 1.0, atol=1e-4)


def test_a_stats_log_likelihood_fitted_with_minimize():
    rng = np.random.default_rng(0)
    data = st.t.rvs(4.0, loc=1.5, scale=0.7, size=200, random_state=rng)

    def nll(theta):
        loc, log_scale = theta
        return -np.sum(st.t.logpdf(data, 4.0, loc=loc, scale=np.exp(log_scale)))

    theta = np.array([0.0, 0.0])
    np.testing.assert_allclose(
        gt.grad(nll)(theta), central_difference_grad(nll, (theta,), 0), rtol=1e-6
    )
    res = so.minimize(gt.compile(gt.value_and_grad(nll)), theta, jac=True)
    assert res.success
    assert abs(res.x[0] - 1.5) < 0.2 and abs(np.exp(res.x[1]) - 0.7) < 0.2


def test_gaussian_process_marginal_likelihood():
    rng = np.random.default_rng(1)
    x = np.sort(rng.uniform(0, 5, 12))
    y = np.sin(x) + 0.1 * rng.normal(size=12)

    def neg_log_marginal(params):
        log_ell, log_sf, log_sn = params
        d = x[:, None] - x[None, :]
        k = np.exp(2 * log_sf) * np.exp(-0.5 * d**2 / np.exp(2 * log_ell))
        k = k + np.exp(2 * log_sn) * np.eye(len(x))
        return -st.multivariate_normal.logpdf(y, np.zeros(len(x)), k)

    p = np.array([0.1, 0.2, -1.5])
    np.testing.assert_allclose(
        gt.grad(neg_log_marginal)(p), central_difference_grad(neg_log_marginal, (p,), 0), rtol=1e-6
    )
    res = so.minimize(neg_log_marginal, p, jac=gt.grad(neg_log_marginal), method="L-BFGS-B")
    assert res.fun < neg_log_marginal(p)


def test_odeint_is_refused_naming_the_users_line():
    t = np.linspace(0.0, 1.0, 3)

    def final_state(y0):
        return np.sum(si.odeint(lambda y, s: -y, y0, t))  # the integration a user writes

    with pytest.raises(gt.GradtapeError, match="scipy.integrate.odeint") as info:
        gt.grad(final_state)(np.ones(2))
    message = str(info.value)
    assert "test_scipy_real_code.py:" in message and "the integration a user writes" in message
    assert "fori_loop" in message
    np.testing.assert_allclose(final_state(np.ones(2)), 2 * np.sum(np.exp(-t)), rtol=1e-6)
