"""Fit an L2-regularised logistic regression with scipy.optimize.minimize and gradtape.

Run: python examples/optimize_logistic.py [n_samples] [n_features]

The objective is plain NumPy. ``gt.compile(gt.value_and_grad(f))`` gives the ``(value,
gradient)`` pair that ``minimize(fun, x0, jac=True, method="L-BFGS-B")`` wants; it is recorded
once and then replayed. The same fit is run with gradtape's eager gradient and with SciPy's own
finite differences (what ``minimize`` does when it has no gradient), and the three are compared
by function evaluations, time and the optimum they reach.
"""

from __future__ import annotations

import os

# One BLAS thread (set before NumPy loads): the comparison is about cost per evaluation, and on a
# busy machine a multi-threaded BLAS on these small products mostly waits for cores.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402
import scipy.special  # noqa: E402

import gradtape as gt  # noqa: E402

PENALTY = 1.0
"""Strength of the L2 penalty on the weights (the intercept is not penalised)."""


def negative_log_posterior(w: np.ndarray, X: np.ndarray, y: np.ndarray) -> Any:
    """Logistic loss plus an L2 penalty: what a user writes, in NumPy, with no gradient."""
    logits = X @ w
    return np.sum(np.logaddexp(0.0, logits) - y * logits) + 0.5 * PENALTY * np.sum(w[1:] ** 2)


def make_data(n_samples: int, n_features: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """A design matrix with an intercept column, true weights and 0/1 labels drawn from them."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n_samples), rng.standard_normal((n_samples, n_features))])
    true_w = rng.normal(scale=1.0 / np.sqrt(n_features), size=n_features + 1)
    y = (rng.random(n_samples) < scipy.special.expit(X @ true_w)).astype(float)
    return X, y, true_w


@dataclass
class Fit:
    """One minimisation: its result, how long it took and how often it evaluated ``f``."""

    method: str
    result: scipy.optimize.OptimizeResult
    seconds: float
    first_call_seconds: float = 0.0

    def line(self) -> str:
        status = "converged" if self.result.success else f"FAILED ({self.result.message})"
        return (f"{self.method:<28} {self.result.nfev:>6} {self.result.nit:>6} "
                f"{self.seconds * 1e3:>12.1f} ms  f* = {self.result.fun:.10f}  {status}")


def fit(method: str, fun: Callable[..., Any], jac: bool, x0: np.ndarray,
        args: tuple[Any, ...], repeats: int = 3) -> Fit:
    """``minimize`` with L-BFGS-B (``jac=False``: SciPy's finite differences); median time."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = scipy.optimize.minimize(fun, x0, args=args, jac=jac, method="L-BFGS-B",
                                         options={"maxiter": 1000, "ftol": 1e-15, "gtol": 1e-6})
        times.append(time.perf_counter() - started)
    return Fit(method, result, float(np.median(times)))


def main(n_samples: int = 5000, n_features: int = 30, seed: int = 0) -> dict[str, Any]:
    """Fit the model three ways and print the comparison; returns the fits and the data."""
    X, y, true_w = make_data(n_samples, n_features, seed)
    x0 = np.zeros(n_features + 1)
    args = (X, y)

    compiled = gt.compile(gt.value_and_grad(negative_log_posterior))
    started = time.perf_counter()
    compiled(x0, *args)  # the first call records and lowers; later calls replay
    first_call = time.perf_counter() - started

    fit("warm-up", negative_log_posterior, False, x0[:2], (X[:, :2], y), repeats=1)
    fits = [
        fit("gradtape compiled", compiled, True, x0, args),
        fit("gradtape eager", gt.value_and_grad(negative_log_posterior), True, x0, args),
        fit("scipy finite differences", negative_log_posterior, False, x0, args),
    ]
    fits[0].first_call_seconds = first_call
    best = fits[0].result.x
    grad_at_optimum = compiled(best, *args)[1]
    check = gt.check_grad(negative_log_posterior, true_w, X, y)

    print(f"L2-regularised logistic regression: {n_samples} samples, {n_features} features "
          "+ intercept, L-BFGS-B")
    print(f"{'gradient':<28} {'nfev':>6} {'nit':>6} {'time, median of 3':>18}")
    for one in fits:
        print(one.line())
    print(f"gradtape compiled: first call (records and lowers) {first_call * 1e3:.1f} ms, "
          "not in its time above")
    for one in fits[1:]:
        print(f"max |w - w(gradtape compiled)| with {one.method}: "
              f"{np.max(np.abs(one.result.x - best)):.2e}")
    print(f"max |gradient| at the optimum: {np.max(np.abs(grad_at_optimum)):.2e}; gradient at "
          f"the true weights vs central differences: {check.max_error_fd:.1e} (relative)")
    print(f"correlation of fitted and true weights: {np.corrcoef(best, true_w)[0, 1]:.3f}")
    return {"fits": {one.method: one for one in fits}, "true_w": true_w, "X": X, "y": y,
            "grad_at_optimum": grad_at_optimum, "check": check}


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:]))
