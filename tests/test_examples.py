"""The examples run (in-process, small sizes) and reach what they claim, checked independently."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.optimize
import scipy.special

import gradtape as gt

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str) -> dict[str, Any]:
    """The example's module namespace, without running its ``__main__`` block."""
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name=f"example_{name}")


def logistic_hand_gradient(w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d/dw of sum(logaddexp(0, Xw) - y * Xw): X^T (expit(Xw) - y)."""
    return X.T @ (scipy.special.expit(X @ w) - y)


def test_optimize_logistic_converges_with_fewer_evaluations(capsys: pytest.CaptureFixture) -> None:
    example = load("optimize_logistic")
    out = example["main"](n_samples=400, n_features=5)
    fits, X, y = out["fits"], out["X"], out["y"]
    compiled = fits["gradtape compiled"].result
    assert all(fit.result.success for fit in fits.values())

    # the optimum: the hand-written gradient of the objective vanishes there
    penalty_grad = example["PENALTY"] * np.concatenate([[0.0], compiled.x[1:]])
    assert np.max(np.abs(logistic_hand_gradient(compiled.x, X, y) + penalty_grad)) < 1e-5
    np.testing.assert_allclose(fits["gradtape eager"].result.x, compiled.x, rtol=0, atol=1e-10)
    np.testing.assert_allclose(fits["scipy finite differences"].result.x, compiled.x, atol=1e-4)
    assert 5 * compiled.nfev < fits["scipy finite differences"].result.nfev
    assert out["check"].max_error_fd < 1e-6
    assert np.corrcoef(compiled.x, out["true_w"])[0, 1] > 0.8
    assert "gradtape compiled" in capsys.readouterr().out


def laplace_approximation(
    X: np.ndarray, y: np.ndarray, prior_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mode and the sd of the Gaussian at it, from hand-written derivatives."""

    def negative_log_posterior(w: np.ndarray) -> tuple[float, np.ndarray]:
        logits = X @ w
        value = np.sum(np.logaddexp(0.0, logits) - y * logits) + 0.5 * w @ w / prior_scale**2
        return value, logistic_hand_gradient(w, X, y) + w / prior_scale**2

    mode = scipy.optimize.minimize(
        negative_log_posterior,
        np.zeros(X.shape[1]),
        jac=True,
        method="BFGS",
        options={"gtol": 1e-10},
    ).x
    p = scipy.special.expit(X @ mode)
    hessian = X.T @ (X * (p * (1 - p))[:, None]) + np.eye(X.shape[1]) / prior_scale**2
    return mode, np.sqrt(np.diag(np.linalg.inv(hessian)))


def test_hmc_samples_the_posterior() -> None:
    example = load("hmc_logistic")
    out = example["main"](
        n_draws=400,
        n_warmup=200,
        n_samples=300,
        n_features=3,
        backends=("gradtape compiled", "gradtape eager"),
    )
    compiled, eager = out["chains"]["gradtape compiled"], out["chains"]["gradtape eager"]
    assert 0.6 < compiled.acceptance_rate < 0.97
    assert compiled.draws_per_second > 0

    mode, laplace_sd = laplace_approximation(out["X"], out["y"], example["PRIOR_SCALE"])
    mean, sd = compiled.draws.mean(axis=0), compiled.draws.std(axis=0)
    assert np.all(np.abs(mean - mode) < 0.35 * laplace_sd)
    assert np.all((0.7 < sd / laplace_sd) & (sd / laplace_sd < 1.35))
    assert np.all(np.abs(mean - out["true_w"]) < 4 * sd)
    # same model, same seed: the eager chain is the compiled one
    np.testing.assert_allclose(eager.draws, compiled.draws, rtol=0, atol=1e-8)


@pytest.mark.parametrize("backend", ["autograd", "jax jit"])
def test_hmc_peer_backends_agree_with_the_hand_gradient(backend: str) -> None:
    pytest.importorskip({"autograd": "autograd", "jax jit": "jax"}[backend])
    example = load("hmc_logistic")
    X, y, true_w = example["make_data"](50, 3)
    value, grad = example["BACKENDS"][backend](X, y)(true_w)
    expected_grad = -logistic_hand_gradient(true_w, X, y) - true_w / example["PRIOR_SCALE"] ** 2
    assert value == pytest.approx(float(example["log_density"](np, true_w, X, y)), rel=1e-12)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-10)


def test_rnn_training_brings_the_loss_down(capfd: pytest.CaptureFixture) -> None:
    example = load("rnn_scan")
    out = example["main"](n_steps=150, sequence_length=40, print_every=50)
    history = out["history"]
    assert np.mean(history[-20:]) < 0.1 * history[0]
    assert out["test_loss"] < 0.5 * out["persistence_loss"]
    assert "step  149: training loss" in capfd.readouterr().out

    # the gradient the training used, against central differences along a random direction
    rng = np.random.default_rng(1)
    params, (inputs, targets) = out["params"], example["noisy_sine"](15, rng)
    grads = gt.grad(example["loss"])(params, inputs, targets)
    step = 1e-6
    for key, value in params.items():
        direction = rng.standard_normal(np.shape(value))

        def loss_along(t: float, key: str = key, direction: np.ndarray = direction) -> float:
            shifted = {**params, key: params[key] + t * direction}
            return float(example["loss"](shifted, inputs, targets))

        numeric = (loss_along(step) - loss_along(-step)) / (2 * step)
        assert np.sum(grads[key] * direction) == pytest.approx(numeric, rel=1e-6, abs=1e-9)


@pytest.mark.cluster
def test_dask_hmc_on_a_cluster_draws_the_in_memory_chain(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("distributed")
    example = load("dask_hmc")
    out = example["main"](n_rows=3000, n_features=3, n_blocks=3, n_draws=40, n_warmup=40)
    on_cluster, in_memory = out["dask_chain"], out["memory_chain"]
    # the block sums are added in another order than the in-memory sum: rounding only
    np.testing.assert_allclose(on_cluster.draws, in_memory.draws, rtol=0, atol=1e-8)
    assert 0.5 < on_cluster.acceptance_rate < 1.0
    mean, sd = on_cluster.draws.mean(axis=0), on_cluster.draws.std(axis=0)
    assert np.all(np.abs(mean - out["true_w"]) < 5 * sd + 0.1)
    assert "gradtape.dask" in capsys.readouterr().out
