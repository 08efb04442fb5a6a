"""Hamiltonian Monte Carlo for a Bayesian logistic regression, driven by gradtape's gradients.

Run: python examples/hmc_logistic.py [n_draws]

The log-density is written once against an array module ``xp`` (NumPy for gradtape, and
``autograd.numpy`` / ``jax.numpy`` for the peers). The sampler is plain NumPy: leapfrog steps
with a step size tuned during warm-up towards 80 % acceptance (jittered by ±20 % per draw) and a
fixed number of steps per draw. Every available backend samples the same model from the same
seed, so the chains agree, and the draws per second compare only the gradients: gradtape
compiled (``gt.compile(gt.value_and_grad(f))``), gradtape eager, HIPS autograd and JAX
(``jit(value_and_grad(f))``), each if installed.
"""

from __future__ import annotations

import os

# One BLAS thread (set before NumPy loads): the comparison is about cost per gradient, and on a
# busy machine a multi-threaded BLAS on these small products mostly waits for cores.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy.special  # noqa: E402

import gradtape as gt  # noqa: E402

PRIOR_SCALE = 2.0
TARGET_ACCEPTANCE = 0.8
ValueAndGrad = Callable[[np.ndarray], tuple[float, np.ndarray]]


def log_density(xp: Any, w: Any, X: Any, y: Any) -> Any:
    """Log posterior of logistic-regression weights under a N(0, PRIOR_SCALE^2) prior."""
    logits = X @ w
    return xp.sum(y * logits - xp.logaddexp(0.0, logits)) - 0.5 * xp.sum(w**2) / PRIOR_SCALE**2


def make_data(n_samples: int, n_features: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """A design matrix with an intercept column, true weights and 0/1 labels drawn from them."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n_samples), rng.standard_normal((n_samples, n_features))])
    true_w = rng.normal(scale=1.0, size=n_features + 1)
    y = (rng.random(n_samples) < scipy.special.expit(X @ true_w)).astype(float)
    return X, y, true_w


# --- backends: each returns w -> (log density, gradient) as a float and a NumPy array ---


def gradtape_compiled(X: np.ndarray, y: np.ndarray) -> ValueAndGrad:
    value_and_grad = gt.compile(gt.value_and_grad(functools.partial(log_density, np)))
    return lambda w: value_and_grad(w, X, y)


def gradtape_eager(X: np.ndarray, y: np.ndarray) -> ValueAndGrad:
    value_and_grad = gt.value_and_grad(functools.partial(log_density, np))
    return lambda w: value_and_grad(w, X, y)


def hips_autograd(X: np.ndarray, y: np.ndarray) -> ValueAndGrad:
    import autograd
    import autograd.numpy as anp

    return autograd.value_and_grad(lambda w: log_density(anp, w, X, y))


def jax_jit(X: np.ndarray, y: np.ndarray) -> ValueAndGrad:
    import jax

    jax.config.update("jax_enable_x64", True)
    X_device, y_device = jax.device_put(X), jax.device_put(y)
    value_and_grad = jax.jit(jax.value_and_grad(
        lambda w: log_density(jax.numpy, w, X_device, y_device)))

    def call(w: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = value_and_grad(w)
        return float(value), np.asarray(grad)

    return call


BACKENDS: dict[str, Callable[[np.ndarray, np.ndarray], ValueAndGrad]] = {
    "gradtape compiled": gradtape_compiled,
    "gradtape eager": gradtape_eager,
    "autograd": hips_autograd,
    "jax jit": jax_jit,
}


# --- the sampler ---


@dataclass
class Chain:
    """The draws after warm-up and what it cost to get them."""

    draws: np.ndarray
    acceptance_rate: float
    step_size: float
    n_leapfrog: int
    first_call_seconds: float
    sampling_seconds: float

    @property
    def draws_per_second(self) -> float:
        return len(self.draws) / self.sampling_seconds


def leapfrog(value_and_grad: ValueAndGrad, w: np.ndarray, momentum: np.ndarray, grad: np.ndarray,
             step: float, n_steps: int) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """``n_steps`` leapfrog steps of the Hamiltonian -log p(w) + |momentum|^2 / 2."""
    momentum = momentum + 0.5 * step * grad
    for i in range(n_steps):
        w = w + step * momentum
        logp, grad = value_and_grad(w)
        if i < n_steps - 1:
            momentum = momentum + step * grad
    momentum = momentum + 0.5 * step * grad
    return w, momentum, logp, grad


def hmc(value_and_grad: ValueAndGrad, w0: np.ndarray, n_draws: int, n_warmup: int,
        n_leapfrog: int = 10, seed: int = 1) -> Chain:
    """Sample with HMC; the warm-up tunes the step size (Robbins-Monro on acceptance)."""
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    logp, grad = value_and_grad(w0)
    first_call = time.perf_counter() - started
    w, log_step, warmup_log_steps = w0, np.log(0.1), []
    draws, accepted = np.empty((n_draws, w0.size)), 0
    for i in range(n_warmup + n_draws):
        if i == n_warmup:  # fix the step at the average of the second half of the warm-up
            log_step = float(np.mean(warmup_log_steps[len(warmup_log_steps) // 2:]))
            sampling_started = time.perf_counter()
        step = np.exp(log_step) * rng.uniform(0.8, 1.2)
        momentum = rng.standard_normal(w.size)
        w_new, momentum_new, logp_new, grad_new = leapfrog(
            value_and_grad, w, momentum, grad, step, n_leapfrog)
        log_ratio = (logp_new - 0.5 * momentum_new @ momentum_new) - (
            logp - 0.5 * momentum @ momentum)
        accept_probability = float(np.exp(min(0.0, log_ratio))) if np.isfinite(log_ratio) else 0.0
        if rng.random() < accept_probability:
            w, logp, grad = w_new, logp_new, grad_new
            accepted += i >= n_warmup
        if i < n_warmup:
            log_step += (accept_probability - TARGET_ACCEPTANCE) / np.sqrt(i + 1.0)
            warmup_log_steps.append(log_step)
        else:
            draws[i - n_warmup] = w
    return Chain(draws, accepted / n_draws, float(np.exp(log_step)), n_leapfrog, first_call,
                 time.perf_counter() - sampling_started)


def main(n_draws: int = 1000, n_warmup: int = 500, n_samples: int = 500, n_features: int = 5,
         backends: Sequence[str] = tuple(BACKENDS), seed: int = 0) -> dict[str, Any]:
    """Sample the posterior with every installed backend; print draws per second."""
    X, y, true_w = make_data(n_samples, n_features, seed)
    w0 = np.zeros(n_features + 1)
    chains, absent = {}, {}
    for name in backends:
        try:
            value_and_grad = BACKENDS[name](X, y)
        except ImportError as exc:
            absent[name] = str(exc)
            continue
        chains[name] = hmc(value_and_grad, w0, n_draws, n_warmup, seed=seed + 1)

    print(f"Bayesian logistic regression: {n_samples} samples, {n_features} features + "
          f"intercept; HMC, {n_warmup} warm-up + {n_draws} draws, 10 leapfrog steps per draw")
    reference = next(iter(chains.values()))
    print(f"{'backend':<18} {'draws/s':>9} {'gradients/s':>12} {'1st call':>10} {'accept':>7} "
          f"{'step':>7}  max |mean - {next(iter(chains))} mean|")
    for name, chain in chains.items():
        mean_difference = np.max(np.abs(chain.draws.mean(0) - reference.draws.mean(0)))
        print(f"{name:<18} {chain.draws_per_second:>9.0f} "
              f"{chain.draws_per_second * chain.n_leapfrog:>12.0f} "
              f"{chain.first_call_seconds * 1e3:>7.1f} ms {chain.acceptance_rate:>7.2f} "
              f"{chain.step_size:>7.4f}  {mean_difference:.1e}")
    for name, reason in absent.items():
        print(f"{name}: not installed ({reason})")
    mean, sd = reference.draws.mean(0), reference.draws.std(0)
    print("weight:         " + " ".join(f"{k:>7d}" for k in range(len(mean))))
    print("true:           " + " ".join(f"{v:>7.3f}" for v in true_w))
    print("posterior mean: " + " ".join(f"{v:>7.3f}" for v in mean))
    print("posterior sd:   " + " ".join(f"{v:>7.3f}" for v in sd))
    return {"chains": chains, "absent": absent, "true_w": true_w, "X": X, "y": y}


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:2]))
