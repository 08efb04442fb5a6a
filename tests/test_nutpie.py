"""gradtape.nutpie: models nutpie samples through native handles; constraint helpers against
their Jacobians; clear errors for what a model cannot be."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gradtape as gt
from gradtape.core.errors import GradtapeError


def test_importing_without_nutpie_names_the_install_command():
    script = (
        "import sys; sys.modules['nutpie'] = None\n"
        "try:\n    import gradtape.nutpie\nexcept ImportError as e:\n    print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(gt.__file__).parents[1]))
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert 'pip install "gradtape[nutpie]"' in run.stdout, run.stdout + run.stderr


gtn = pytest.importorskip("gradtape.nutpie", exc_type=ImportError)
nutpie = pytest.importorskip("nutpie")


# --- constraint helpers against their closed-form Jacobians -------------------------------------
def _free_coordinates(c, value):
    """The coordinates of a constrained value the transform maps onto one to one."""
    value = np.asarray(value)
    if c.name.startswith("simplex"):
        return value[:-1]
    if c.name.startswith("corr_cholesky"):
        n = value.shape[0]
        return value[np.tril_indices(n, -1)]
    return value.reshape(-1)


CONSTRAINTS = [
    gtn.positive(),
    gtn.positive((2, 2)),
    gtn.interval(-1.0, 3.0, shape=3),
    gtn.interval(0.0, 1.0),
    gtn.simplex(2),
    gtn.simplex(5),
    gtn.corr_cholesky(2),
    gtn.corr_cholesky(4),
]


@pytest.mark.parametrize("c", CONSTRAINTS, ids=lambda c: f"{c.name}{c.shape}")
def test_log_jacobian_is_the_log_determinant_of_the_transform(c):
    rng = np.random.default_rng(7)
    for _ in range(3):
        u = rng.normal(size=c.size)

        def free(u):
            piece = u[0] if c.shape == () else u
            return np.reshape(_free_coordinates(c, c.transform(piece)[0]), -1)

        jac = gt.jacobian(free)(u)
        assert jac.shape == (c.size, c.size)
        expected = np.linalg.slogdet(jac)[1]
        piece = u[0] if c.shape == () else u
        value, log_jacobian = c.transform(piece)
        np.testing.assert_allclose(log_jacobian, expected, rtol=1e-10, atol=1e-10)
        # finite differences agree with the Jacobian gradtape computed
        eps = 1e-6
        fd = np.column_stack(
            [(free(u + eps * e) - free(u - eps * e)) / (2 * eps) for e in np.eye(c.size)]
        )
        np.testing.assert_allclose(jac, fd, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(c.inverse(value), u, rtol=1e-9, atol=1e-9)
        assert np.shape(value) == c.shape


def test_constrained_values_are_in_their_support():
    rng = np.random.default_rng(3)
    u = 3.0 * rng.normal(size=10)
    assert np.all(gtn.positive(10).transform(u)[0] > 0)
    v = gtn.interval(-2.0, 5.0, shape=10).transform(u)[0]
    assert np.all((v > -2.0) & (v < 5.0))
    w = gtn.simplex(11).transform(u)[0]
    assert np.all(w > 0) and math.isclose(np.sum(w), 1.0, rel_tol=1e-14)
    L = gtn.corr_cholesky(5).transform(u)[0]
    np.testing.assert_allclose(np.diag(L @ L.T), 1.0, rtol=1e-14)
    assert np.all(np.triu(L, 1) == 0) and np.all(np.diag(L) > 0)


def test_constraint_arguments_are_checked():
    with pytest.raises(ValueError, match="lower < upper"):
        gtn.interval(1.0, 1.0)
    with pytest.raises(ValueError, match="at least 2"):
        gtn.simplex(1)
    with pytest.raises(ValueError, match="at least 2"):
        gtn.corr_cholesky(1)


# --- models --------------------------------------------------------------------------------------
def test_model_errors_are_clear():
    with pytest.raises(GradtapeError, match="shapes= must be a dict"):
        gtn.from_logp(lambda p: 0.0, shapes=[("a", ())])
    with pytest.raises(GradtapeError, match="tuple of ints or a constraint"):
        gtn.from_logp(lambda p: 0.0, shapes={"a": "wide"})
    with pytest.raises(GradtapeError, match="must return a scalar"):
        gtn.from_logp(lambda p: p["a"] ** 2, shapes={"a": (3,)})
    with pytest.raises(KeyError, match="'b', which shapes= does not name"):
        gtn.from_logp(lambda p: np.sum(p["b"]), shapes={"a": (3,)})
    with pytest.raises(GradtapeError, match="init names"):
        gtn.from_logp(lambda p: -np.sum(p["a"] ** 2), shapes={"a": (3,)}, init={"c": 1.0})
    with pytest.raises(GradtapeError, match=r"has shape \(2,\)"):
        gtn.from_logp(lambda p: -np.sum(p["a"] ** 2), shapes={"a": (3,)}, init={"a": np.zeros(2)})


Y = np.random.default_rng(11).normal(1.5, 2.0, size=40)
SIGMA = 2.0  # known
PRIOR_MEAN, PRIOR_SD = 0.0, 3.0


def conjugate_logp(p):
    mu = p["mu"]
    return -0.5 * np.sum((Y - mu) ** 2) / SIGMA**2 - 0.5 * (mu - PRIOR_MEAN) ** 2 / PRIOR_SD**2


@pytest.mark.native
def test_a_short_run_recovers_a_conjugate_posterior():
    import arviz as az

    precision = Y.size / SIGMA**2 + 1 / PRIOR_SD**2
    post_mean = (Y.sum() / SIGMA**2 + PRIOR_MEAN / PRIOR_SD**2) / precision
    post_sd = precision**-0.5
    model = gtn.from_logp(conjugate_logp, shapes={"mu": ()})
    trace = nutpie.sample(model, chains=2, draws=1500, tune=500, seed=3, progress_bar=False)
    mu = trace.posterior["mu"]
    assert mu.shape == (2, 1500)
    ess = float(az.ess(trace, var_names=["mu"])["mu"])
    assert ess > 300
    error = 4.0 * post_sd / math.sqrt(ess)  # four Monte Carlo standard errors
    assert abs(float(mu.mean()) - post_mean) < error
    assert abs(float(mu.std()) - post_sd) < 0.1 * post_sd


@pytest.mark.native
def test_trace_names_shapes_and_constrained_values():
    data = np.random.default_rng(5).dirichlet([2.0, 3.0, 5.0], size=30)

    def logp(p):
        w, scale, beta, r = p["w"], p["scale"], p["beta"], p["r"]
        return (
            np.sum(np.log(data) @ (20.0 * w - 1.0))
            - np.sum(beta**2)
            - np.sum(scale)
            + np.sum(np.log(r) + np.log1p(-r))
            + 2.0 * (np.log(p["L"][1, 1]) + np.log(p["L"][2, 2]))
        )

    model = gtn.from_logp(
        logp,
        shapes={
            "w": gtn.simplex(3),
            "scale": gtn.positive(2),
            "beta": (2, 3),
            "r": gtn.interval(0.0, 1.0, shape=4),
            "L": gtn.corr_cholesky(3),
        },
    )
    assert model.n_dim == 2 + 2 + 6 + 4 + 3
    trace = nutpie.sample(model, chains=2, draws=200, tune=200, seed=1, progress_bar=False)
    post = trace.posterior
    assert post["w"].shape == (2, 200, 3)
    assert post["scale"].shape == (2, 200, 2)
    assert post["beta"].shape == (2, 200, 2, 3)
    assert post["r"].shape == (2, 200, 4)
    assert post["L"].shape == (2, 200, 3, 3)
    np.testing.assert_allclose(post["w"].sum("w_dim_0"), 1.0, rtol=1e-12)
    assert float(post["scale"].min()) > 0
    assert 0 < float(post["r"].min()) and float(post["r"].max()) < 1
    L = post["L"].values
    np.testing.assert_allclose(np.einsum("cdij,cdij->cdi", L, L), 1.0, rtol=1e-12)


@pytest.mark.native
def test_a_point_on_another_path_stops_the_sampler(capfd):
    def logp(p):
        if p["x"] > 1.0:  # a Python branch on a parameter: one path is recorded
            return -p["x"]
        return -0.5 * p["x"] ** 2

    model = gtn.from_logp(logp, shapes={"x": ()}, init={"x": 0.5})
    # nutpie stops with a Rust panic (a BaseException); its message names the status
    with pytest.raises(BaseException):  # noqa: B017, PT011
        nutpie.sample(model, chains=1, draws=2000, tune=500, seed=2, progress_bar=False)
    captured = capfd.readouterr()
    assert "ErrorCode(-2)" in captured.err + captured.out


S_KNOWN = np.array([[2.0, 0.6], [0.6, 1.0]])
Y2 = np.random.default_rng(12).multivariate_normal([1.0, -0.5], S_KNOWN, size=30)


def mvn_logp(p):
    r = Y2 - p["mu"]
    z = np.linalg.solve(S_KNOWN, r.T)  # a LAPACK solve: no native translation
    return -0.5 * np.sum(r.T * z) - 0.5 * np.sum(p["mu"] ** 2) / 100.0


def sorted_conjugate_logp(p):
    # np.sort has no native translation; a sum of squares does not depend on the order
    r = np.sort(Y - p["mu"])
    return -0.5 * np.sum(r**2) / SIGMA**2 - 0.5 * (p["mu"] - PRIOR_MEAN) ** 2 / PRIOR_SD**2 - p["s"]


@pytest.mark.native
def test_a_density_a_handle_cannot_hold_is_sampled_through_python_with_a_warning():
    import arviz as az

    with pytest.warns(gt.NativeFallbackWarning, match=r"sampling through Python.*'argsort'"):
        model = gtn.from_logp(sorted_conjugate_logp, shapes={"mu": (), "s": gtn.positive()})
    trace = nutpie.sample(model, chains=2, draws=1000, tune=500, seed=4, progress_bar=False)
    post = trace.posterior
    assert post["mu"].shape == (2, 1000)
    assert post["s"].shape == (2, 1000)
    assert float(post["s"].min()) > 0  # the trace holds constrained values
    precision = Y.size / SIGMA**2 + 1 / PRIOR_SD**2
    post_mean = (Y.sum() / SIGMA**2 + PRIOR_MEAN / PRIOR_SD**2) / precision
    ess = az.ess(trace, var_names=["mu", "s"])
    mu_ess, s_ess = float(ess["mu"]), float(ess["s"])
    assert min(mu_ess, s_ess) > 300
    assert abs(float(post["mu"].mean()) - post_mean) < 4.0 * precision**-0.5 / math.sqrt(mu_ess)
    # s has the density exp(-s) on s > 0 (an exponential): mean 1, sd 1
    assert abs(float(post["s"].mean()) - 1.0) < 4.0 / math.sqrt(s_ess)


@pytest.mark.native
def test_require_native_raises_the_refusal():
    from gradtape import NotExportableError

    with pytest.raises(NotExportableError, match=r"'lu_\w+'.*no native translation"):
        gtn.from_logp(mvn_logp, shapes={"mu": (2,)}, require_native=True)
