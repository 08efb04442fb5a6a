"""Benchmark workloads: each is a scalar function of a vector, written once, with hand gradients.

A workload's ``body(xp, x, *consts)`` is written against an array namespace ``xp`` so the very
same code runs as plain NumPy (``xp=numpy``, what gradtape sees), ``jax.numpy``,
``autograd.numpy`` and ``torch``.  Constants are closed over by the method adapters, never
differentiated.  Each workload also carries a hand-written NumPy value-and-gradient (the
reference every method is checked against) and a plain-Python loop kernel that the
``hand_numba`` method compiles with ``numba.njit`` (the "fused loop" a person would write).

A workload built on a loop primitive (``rnn_scan``) also provides ``variants``: the same model
written with a system's own loop (``gradtape.scan``, ``jax.lax.scan``), keyed by system.  Methods
of that system run the variant; every other method runs ``body``, the plain Python loop.

To add a workload, write its three small functions and one ``Workload`` entry in ``WORKLOADS``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

LOG_2PI = math.log(2.0 * math.pi)

__all__ = [
    "GRADTAPE",
    "JAX",
    "PLANNED_WORKLOADS",
    "WORKLOADS",
    "Problem",
    "Workload",
    "select_workloads",
]

GRADTAPE, JAX = "gradtape", "jax"
"""Keys of ``Workload.variants``: the systems that have a loop primitive of their own."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """Inputs of one workload at one size: the point ``x`` and the closed-over constants."""

    x: np.ndarray
    consts: tuple[Any, ...] = ()
    size: int = 0
    """The benchmark's N: len(x), or the constant's length for closure_const."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark function with its references; see the module docstring."""

    name: str
    description: str
    body: Callable[..., Any]
    hand_value_and_grad: Callable[..., tuple[float, np.ndarray]]
    loop_kernel: Callable[..., tuple[float, np.ndarray]]
    make_problem: Callable[[int, np.random.Generator], Problem]
    quick_sizes: tuple[int, ...]
    full_sizes: tuple[int, ...]
    size_meaning: str = "len(x)"
    max_size: int | None = None
    variants: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    """System name -> ``body`` written with that system's loop primitive (same signature)."""

    def body_for(self, system: str | None) -> Callable[..., Any]:
        """The body a method of ``system`` runs: its own variant if any, else the shared one."""
        return self.variants.get(system, self.body) if system else self.body

    def numpy_function(
        self, problem: Problem, system: str | None = None
    ) -> Callable[[np.ndarray], Any]:
        """The workload as the plain NumPy function ``f(x)`` a user would write (of ``system``)."""
        body, consts = self.body_for(system), problem.consts
        return lambda x: body(np, x, *consts)

    def problem(self, size: int, seed: int = 0) -> Problem:
        """Deterministic inputs for ``size`` (same seed and size give the same arrays)."""
        problem = self.make_problem(size, np.random.default_rng([seed, size]))
        return dataclasses.replace(problem, size=size)

    def sizes(self, quick: bool) -> tuple[int, ...]:
        """The default size set of a quick or a full run."""
        return self.quick_sizes if quick else self.full_sizes


# --- normal_logpdf: sum of the normal log-density of data mu around x, scale sigma (seed 003) ---


def normal_logpdf(xp: Any, x: Any, mu: Any, sigma: Any) -> Any:
    return xp.sum(-0.5 * ((x - mu) / sigma) ** 2 - xp.log(sigma) - 0.5 * LOG_2PI)


def normal_logpdf_hand(x: np.ndarray, mu: np.ndarray, sigma: float) -> tuple[float, np.ndarray]:
    z = (x - mu) / sigma
    value = np.sum(-0.5 * z**2) - x.size * (math.log(sigma) + 0.5 * LOG_2PI)
    return float(value), -z / sigma


def normal_logpdf_loop(x: np.ndarray, mu: np.ndarray, sigma: float) -> tuple[float, np.ndarray]:
    inv_var = 1.0 / (sigma * sigma)
    per_term = -math.log(sigma) - 0.5 * LOG_2PI
    grad = np.empty_like(x)
    value = 0.0
    for i in range(x.size):
        d = x[i] - mu[i]
        value += -0.5 * d * d * inv_var + per_term
        grad[i] = -d * inv_var
    return value, grad


def normal_logpdf_problem(n: int, rng: np.random.Generator) -> Problem:
    return Problem(rng.standard_normal(n), (rng.normal(2.0, 1.0, n), 1.5))


# --- eam: embedded-atom-like energy rho^2 + rho^3 + rho^4/4 (seed 004) ---


def eam(xp: Any, x: Any) -> Any:
    rho = xp.sum(xp.exp(-3.0 * (x + 1.0)))
    return rho**2 + rho**3 + 0.25 * rho**4


def eam_hand(x: np.ndarray) -> tuple[float, np.ndarray]:
    e = np.exp(-3.0 * (x + 1.0))
    rho = e.sum()
    return float(rho**2 + rho**3 + 0.25 * rho**4), -3.0 * (2 * rho + 3 * rho**2 + rho**3) * e


def eam_loop(x: np.ndarray) -> tuple[float, np.ndarray]:
    grad = np.empty_like(x)
    rho = 0.0
    for i in range(x.size):
        e = math.exp(-3.0 * (x[i] + 1.0))
        grad[i] = e
        rho += e
    scale = -3.0 * (2.0 * rho + 3.0 * rho**2 + rho**3)
    for i in range(x.size):
        grad[i] *= scale
    return rho**2 + rho**3 + 0.25 * rho**4, grad


# --- sum_exp: sum(exp(x)) (seed 000) ---


def sum_exp(xp: Any, x: Any) -> Any:
    return xp.sum(xp.exp(x))


def sum_exp_hand(x: np.ndarray) -> tuple[float, np.ndarray]:
    e = np.exp(x)
    return float(e.sum()), e


def sum_exp_loop(x: np.ndarray) -> tuple[float, np.ndarray]:
    grad = np.empty_like(x)
    value = 0.0
    for i in range(x.size):
        e = math.exp(x[i])
        grad[i] = e
        value += e
    return value, grad


# --- closure_const: p -> c[0] * p with a large closed-over constant c (seed 002) ---


def closure_const(xp: Any, p: Any, c: Any) -> Any:
    return xp.sum(c[0] * p)


def closure_const_hand(p: np.ndarray, c: np.ndarray) -> tuple[float, np.ndarray]:
    return float(np.sum(c[0] * p)), np.full_like(p, c[0])


def closure_const_loop(p: np.ndarray, c: np.ndarray) -> tuple[float, np.ndarray]:
    grad = np.empty_like(p)
    value = 0.0
    for i in range(p.size):
        value += c[0] * p[i]
        grad[i] = c[0]
    return value, grad


def closure_const_problem(n: int, rng: np.random.Generator) -> Problem:
    return Problem(rng.standard_normal(1), (rng.standard_normal(n),))


# --- scalar_loop: a Python loop of scalar operations s += i * x[i] (seed 001) ---


def scalar_loop(xp: Any, x: Any) -> Any:
    s = 0.0
    for i in range(len(x)):
        s = s + i * x[i]
    return s


def scalar_loop_hand(x: np.ndarray) -> tuple[float, np.ndarray]:
    weights = np.arange(x.size, dtype=x.dtype)
    return float(weights @ x), weights


def scalar_loop_loop(x: np.ndarray) -> tuple[float, np.ndarray]:
    grad = np.empty_like(x)
    value = 0.0
    for i in range(x.size):
        value += i * x[i]
        grad[i] = i
    return value, grad


# --- branching: data-dependent Python branch (seed 001) ---


def branching(xp: Any, x: Any) -> Any:
    s = xp.sum(x)
    return s**3 if s > 1 else s**2


def branching_hand(x: np.ndarray) -> tuple[float, np.ndarray]:
    s = x.sum()
    value, slope = (s**3, 3 * s**2) if s > 1 else (s**2, 2 * s)
    return float(value), np.full_like(x, slope)


def branching_loop(x: np.ndarray) -> tuple[float, np.ndarray]:
    s = 0.0
    for i in range(x.size):
        s += x[i]
    value, slope = (s**3, 3.0 * s**2) if s > 1.0 else (s**2, 2.0 * s)
    return value, np.full_like(x, slope)


# --- rnn_scan: a tanh recurrent network over T steps, gradient w.r.t. its recurrent weights ---

RNN_HIDDEN, RNN_INPUTS = 32, 4


def rnn_loss(
    xp: Any, scan: Callable[..., Any], x: Any, xs: Any, targets: Any, U: Any, v: Any, h0: Any
) -> Any:
    """The model once for every system; ``scan(step, init, (drive, targets))`` is its loop."""
    W = xp.reshape(x, (RNN_HIDDEN, RNN_HIDDEN))
    drive = xs @ U.T

    def step(h: Any, inputs: Any) -> tuple[Any, Any]:
        drive_t, target_t = inputs
        h = xp.tanh(W @ h + drive_t)
        return h, (v @ h - target_t) ** 2

    _, squared_errors = scan(step, h0, (drive, targets))
    return 0.5 * xp.sum(squared_errors)


def python_scan(xp: Any, step: Callable[..., Any], carry: Any, xs: tuple[Any, ...]) -> Any:
    """``scan`` as the plain Python loop (what torch, autograd and NumPy users write)."""
    ys = []
    for t in range(len(xs[0])):
        carry, y = step(carry, tuple(leaf[t] for leaf in xs))
        ys.append(y)
    return carry, xp.stack(ys)


def _gradtape_scan(step: Callable[..., Any], init: Any, xs: Any) -> Any:
    import gradtape

    return gradtape.scan(step, init, xs)


def _jax_scan(step: Callable[..., Any], init: Any, xs: Any) -> Any:
    from jax import lax

    return lax.scan(step, init, xs)


def rnn_scan_python(xp: Any, x: Any, *consts: Any) -> Any:
    return rnn_loss(xp, functools.partial(python_scan, xp), x, *consts)


def rnn_scan_gradtape(xp: Any, x: Any, *consts: Any) -> Any:
    return rnn_loss(xp, _gradtape_scan, x, *consts)


def rnn_scan_jax(xp: Any, x: Any, *consts: Any) -> Any:
    return rnn_loss(xp, _jax_scan, x, *consts)


def rnn_scan_hand(
    x: np.ndarray,
    xs: np.ndarray,
    targets: np.ndarray,
    U: np.ndarray,
    v: np.ndarray,
    h0: np.ndarray,
) -> tuple[float, np.ndarray]:
    """Backpropagation through time by hand: store the hidden states, walk them back."""
    W = x.reshape(RNN_HIDDEN, RNN_HIDDEN)
    drive = xs @ U.T
    steps = len(targets)
    hidden = np.empty((steps + 1, RNN_HIDDEN))
    hidden[0] = h0
    for t in range(steps):
        hidden[t + 1] = np.tanh(W @ hidden[t] + drive[t])
    residuals = hidden[1:] @ v - targets
    pre_activation_grads = np.empty((steps, RNN_HIDDEN))
    dh = np.zeros(RNN_HIDDEN)
    for t in range(steps - 1, -1, -1):
        da = (dh + residuals[t] * v) * (1.0 - hidden[t + 1] ** 2)
        pre_activation_grads[t] = da
        dh = W.T @ da
    grad_W = pre_activation_grads.T @ hidden[:-1]
    return float(0.5 * residuals @ residuals), grad_W.ravel()


def rnn_scan_loop(
    x: np.ndarray,
    xs: np.ndarray,
    targets: np.ndarray,
    U: np.ndarray,
    v: np.ndarray,
    h0: np.ndarray,
) -> tuple[float, np.ndarray]:
    n, (steps, n_inputs) = h0.size, xs.shape
    hidden = np.empty((steps + 1, n))
    hidden[0, :] = h0
    residuals = np.empty(steps)
    value = 0.0
    for t in range(steps):
        for i in range(n):
            a = 0.0
            for j in range(n):
                a += x[i * n + j] * hidden[t, j]
            for k in range(n_inputs):
                a += U[i, k] * xs[t, k]
            hidden[t + 1, i] = math.tanh(a)
        r = -targets[t]
        for i in range(n):
            r += v[i] * hidden[t + 1, i]
        residuals[t] = r
        value += 0.5 * r * r
    grad = np.zeros_like(x)
    dh, da = np.zeros(n), np.empty(n)
    for t in range(steps - 1, -1, -1):
        for i in range(n):
            da[i] = (dh[i] + residuals[t] * v[i]) * (1.0 - hidden[t + 1, i] ** 2)
            for j in range(n):
                grad[i * n + j] += da[i] * hidden[t, j]
        for j in range(n):
            s = 0.0
            for i in range(n):
                s += x[i * n + j] * da[i]
            dh[j] = s
    return value, grad


def rnn_scan_problem(steps: int, rng: np.random.Generator) -> Problem:
    """W with spectral radius about 0.9 (neither saturating nor vanishing), random inputs."""
    W = rng.normal(scale=0.9 / math.sqrt(RNN_HIDDEN), size=RNN_HIDDEN * RNN_HIDDEN)
    xs = rng.standard_normal((steps, RNN_INPUTS))
    targets = 0.5 * rng.standard_normal(steps)
    U = rng.normal(scale=1.0 / math.sqrt(RNN_INPUTS), size=(RNN_HIDDEN, RNN_INPUTS))
    v = rng.normal(scale=1.0 / math.sqrt(RNN_HIDDEN), size=RNN_HIDDEN)
    return Problem(W, (xs, targets, U, v, np.zeros(RNN_HIDDEN)))


# --- gp_marginal: a Gaussian process's negative log marginal likelihood (Cholesky, solves) ---

GP_DIMS = 3
"""Input dimensions of the GP's data: x holds GP_DIMS log length scales, then the log signal
variance and the log noise variance."""


def _gp_solve_lower(xp: Any, chol: Any, b: Any) -> Any:
    """L^-1 b for a lower triangular L, with the triangular solve of each system."""
    name = getattr(xp, "__name__", "")
    if name == "torch":
        return xp.linalg.solve_triangular(chol, b[:, None], upper=False)[:, 0]
    if name.startswith("jax"):
        from jax.scipy.linalg import solve_triangular
    elif name.startswith("autograd"):
        from autograd.scipy.linalg import solve_triangular
    else:
        from scipy.linalg import solve_triangular
    return solve_triangular(chol, b, lower=True)


def _complex_step_cholesky(k: np.ndarray) -> np.ndarray:
    """L with L L^T = k, without conjugation: the analytic continuation the complex-step
    reference differentiates (LAPACK's complex Cholesky is the Hermitian one, L L^H)."""
    n = k.shape[0]
    low = np.zeros_like(k)
    for j in range(n):
        low[j, j] = np.sqrt(k[j, j] - low[j, :j] @ low[j, :j])
        low[j + 1 :, j] = (k[j + 1 :, j] - low[j + 1 :, :j] @ low[j, :j]) / low[j, j]
    return low


def gp_marginal(xp: Any, x: Any, sqdist: Any, y: Any) -> Any:
    """Negative log marginal likelihood of a GP with an ARD squared-exponential kernel:
    K = s exp(-r^2 / 2) + noise I, L = chol(K), 0.5 |L^-1 y|^2 + sum(log diag L) + n/2 log 2pi."""
    r2 = xp.exp(-2.0 * x[0]) * sqdist[0]
    for k in range(1, GP_DIMS):
        r2 = r2 + xp.exp(-2.0 * x[k]) * sqdist[k]
    n = y.shape[0]
    kernel = xp.exp(x[GP_DIMS]) * xp.exp(-0.5 * r2) + xp.exp(x[GP_DIMS + 1]) * xp.eye(
        n, dtype=y.dtype
    )
    if xp is np and np.iscomplexobj(kernel):  # only the complex-step reference gets here
        chol = _complex_step_cholesky(kernel)
    else:
        chol = xp.linalg.cholesky(kernel)
    z = _gp_solve_lower(xp, chol, y)
    return 0.5 * xp.sum(z * z) + xp.sum(xp.log(xp.diag(chol))) + 0.5 * n * LOG_2PI


def gp_marginal_hand(x: np.ndarray, sqdist: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """dL/dK = (K^-1 - a a^T) / 2 with a = K^-1 y; K^-1 from the Cholesky factor (potri)."""
    from scipy.linalg import cho_solve, lapack

    scales = np.exp(-2.0 * x[:GP_DIMS])
    signal, noise = math.exp(x[GP_DIMS]), math.exp(x[GP_DIMS + 1])
    rbf = signal * np.exp(-0.5 * np.tensordot(scales, sqdist, axes=1))
    kernel = rbf + noise * np.eye(y.size)
    chol = np.linalg.cholesky(kernel)
    alpha = cho_solve((chol, True), y)
    inverse, _ = lapack.dpotri(chol, lower=1)
    inverse = np.tril(inverse) + np.tril(inverse, -1).T
    w = inverse - np.outer(alpha, alpha)
    wr = w * rbf
    grad = np.empty_like(x)
    for k in range(GP_DIMS):
        grad[k] = 0.5 * scales[k] * np.vdot(wr, sqdist[k])
    grad[GP_DIMS] = 0.5 * np.sum(wr)
    grad[GP_DIMS + 1] = 0.5 * noise * np.trace(w)
    value = 0.5 * y @ alpha + np.sum(np.log(np.diag(chol))) + 0.5 * y.size * LOG_2PI
    return float(value), grad


def gp_marginal_loop(x: np.ndarray, sqdist: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    n = y.size
    scales = np.empty(GP_DIMS)
    for k in range(GP_DIMS):
        scales[k] = math.exp(-2.0 * x[k])
    signal, noise = math.exp(x[GP_DIMS]), math.exp(x[GP_DIMS + 1])
    rbf = np.empty((n, n))
    low = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            r2 = 0.0
            for k in range(GP_DIMS):
                r2 += scales[k] * sqdist[k, i, j]
            rbf[i, j] = signal * math.exp(-0.5 * r2)
    for j in range(n):  # Cholesky, column by column
        s = rbf[j, j] + noise
        for p in range(j):
            s -= low[j, p] * low[j, p]
        low[j, j] = math.sqrt(s)
        for i in range(j + 1, n):
            s = rbf[i, j]
            for p in range(j):
                s -= low[i, p] * low[j, p]
            low[i, j] = s / low[j, j]
    z = np.empty(n)  # L z = y, then L^T alpha = z
    for i in range(n):
        s = y[i]
        for p in range(i):
            s -= low[i, p] * z[p]
        z[i] = s / low[i, i]
    alpha = np.empty(n)
    for i in range(n - 1, -1, -1):
        s = z[i]
        for p in range(i + 1, n):
            s -= low[p, i] * alpha[p]
        alpha[i] = s / low[i, i]
    value = 0.5 * n * LOG_2PI
    for i in range(n):
        value += 0.5 * z[i] * z[i] + math.log(low[i, i])
    inv_low = np.zeros((n, n))  # L^-1, column by column; K^-1 = L^-T L^-1
    for j in range(n):
        inv_low[j, j] = 1.0 / low[j, j]
        for i in range(j + 1, n):
            s = 0.0
            for p in range(j, i):
                s -= low[i, p] * inv_low[p, j]
            inv_low[i, j] = s / low[i, i]
    grad = np.zeros(GP_DIMS + 2)
    for i in range(n):
        for j in range(n):
            kinv = 0.0
            for p in range(max(i, j), n):
                kinv += inv_low[p, i] * inv_low[p, j]
            w = 0.5 * (kinv - alpha[i] * alpha[j])
            for k in range(GP_DIMS):
                grad[k] += w * rbf[i, j] * sqdist[k, i, j] * scales[k]
            grad[GP_DIMS] += w * rbf[i, j]
            if i == j:
                grad[GP_DIMS + 1] += w * noise
    return value, grad


def gp_marginal_problem(n: int, rng: np.random.Generator) -> Problem:
    """n points in [0, 3]^3 with y = sin(sum of the coordinates) + noise; hyperparameters near
    the data's own (length scales about 1, signal 1, noise 0.1)."""
    points = rng.uniform(0.0, 3.0, (n, GP_DIMS))
    sqdist = np.stack([(points[:, k, None] - points[None, :, k]) ** 2 for k in range(GP_DIMS)])
    y = np.sin(points.sum(axis=1)) + 0.3 * rng.standard_normal(n)
    x = np.concatenate([np.log(rng.uniform(0.7, 1.4, GP_DIMS)), [0.0, math.log(0.1)]])
    return Problem(x, (sqdist, y))


def standard_normal_problem(n: int, rng: np.random.Generator) -> Problem:
    return Problem(rng.standard_normal(n))


def unit_uniform_problem(n: int, rng: np.random.Generator) -> Problem:
    return Problem(rng.random(n))


_MEDIUM_FULL = (10, 100, 1_000, 10_000, 100_000, 1_000_000)

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "normal_logpdf",
            "sum(-0.5*((x-mu)/sigma)**2 - log(sigma) - 0.5*log(2pi)), grad w.r.t. x",
            normal_logpdf,
            normal_logpdf_hand,
            normal_logpdf_loop,
            normal_logpdf_problem,
            quick_sizes=(100, 10_000),
            full_sizes=_MEDIUM_FULL,
        ),
        Workload(
            "eam",
            "rho = sum(exp(-3*(x+1))); rho**2 + rho**3 + 0.25*rho**4",
            eam,
            eam_hand,
            eam_loop,
            unit_uniform_problem,
            quick_sizes=(100, 10_000),
            full_sizes=(100, 1_000, 10_000, 100_000),
        ),
        Workload(
            "sum_exp",
            "sum(exp(x))",
            sum_exp,
            sum_exp_hand,
            sum_exp_loop,
            standard_normal_problem,
            quick_sizes=(100, 10_000),
            full_sizes=_MEDIUM_FULL,
        ),
        Workload(
            "closure_const",
            "p -> sum(c[0]*p), p of length 1, c a closed-over constant; N = len(c)",
            closure_const,
            closure_const_hand,
            closure_const_loop,
            closure_const_problem,
            quick_sizes=(1_000, 100_000),
            full_sizes=(1_000, 10_000, 100_000, 1_000_000, 10_000_000),
            size_meaning="len(c)",
        ),
        Workload(
            "scalar_loop",
            "Python loop s = s + i*x[i] (scalar ops; small N only)",
            scalar_loop,
            scalar_loop_hand,
            scalar_loop_loop,
            standard_normal_problem,
            quick_sizes=(10, 100),
            full_sizes=(10, 100, 1_000),
            max_size=1_000,
        ),
        Workload(
            "branching",
            "s = sum(x); s**3 if s > 1 else s**2 (Python branch on a traced value)",
            branching,
            branching_hand,
            branching_loop,
            unit_uniform_problem,
            quick_sizes=(100, 10_000),
            full_sizes=_MEDIUM_FULL,
        ),
        Workload(
            "rnn_scan",
            "tanh RNN, hidden 32: h = tanh(W h + U x_t), loss = 0.5*sum_t (v.h_t - z_t)**2; "
            "grad w.r.t. W (x = W.ravel()); gradtape and JAX run their scan, the others a loop",
            rnn_scan_python,
            rnn_scan_hand,
            rnn_scan_loop,
            rnn_scan_problem,
            quick_sizes=(10, 100),
            full_sizes=(10, 100, 1_000),
            size_meaning="T, the sequence length (len(x) = 32*32 at every T)",
            variants={GRADTAPE: rnn_scan_gradtape, JAX: rnn_scan_jax},
        ),
        Workload(
            "gp_marginal",
            "GP negative log marginal likelihood, ARD squared-exponential kernel in 3-D: "
            "K = s exp(-r^2/2) + noise I, L = chol(K), 0.5 |L^-1 y|^2 + sum(log diag L); "
            "grad w.r.t. the 5 log hyperparameters",
            gp_marginal,
            gp_marginal_hand,
            gp_marginal_loop,
            gp_marginal_problem,
            quick_sizes=(100, 500),
            full_sizes=(100, 200, 500, 1_000),
            max_size=2_000,
            size_meaning="N, the number of data points (len(x) = 5 at every N)",
        ),
    )
}

PLANNED_WORKLOADS: dict[str, str] = {}
"""Workloads announced but not written yet (name -> why): the CLI says so instead of faking them."""


def select_workloads(names: Sequence[str] | None) -> list[Workload]:
    """The registry entries named (all when ``names`` is empty), in registry order."""
    if not names:
        return list(WORKLOADS.values())
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise KeyError(", ".join(unknown))
    return [w for w in WORKLOADS.values() if w.name in names]


# =============================================================================================
# Batched workloads (vmap): a per-example transform over a batch, timed by
# ``python -m gradtape.bench.transforms``. Each is a function of one example written against
# ``xp``, the transform applied per example, and the arguments: gradtape runs
# ``compile(vmap(transform(f)))``, JAX ``jit(vmap(transform(f)))``, and a Python loop of the
# un-batched gradtape transform is the baseline vmap replaces. Every method's result is
# checked against the loop's before it is timed.
# =============================================================================================
@dataclasses.dataclass(frozen=True)
class BatchedWorkload:
    """One batched benchmark: ``transform`` ("grad" or "hessian") of ``body(xp, *args)`` per
    example, mapped over the arguments with ``in_axes``."""

    name: str
    description: str
    body: Callable[..., Any]
    transform: str
    in_axes: tuple[int | None, ...]
    make_args: Callable[[np.random.Generator], tuple[np.ndarray, ...]]


def logistic_loss(xp: Any, w: Any, x: Any, y: Any) -> Any:
    """The logistic loss of one example (x, y) at weights w."""
    return xp.log1p(xp.exp(-y * (x @ w)))


def logistic_batch(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    n, d = 1_000, 20
    x = rng.standard_normal((n, d))
    return 0.1 * rng.standard_normal(d), x, np.sign(rng.standard_normal(n))


_RNN_HIDDEN, _RNN_INPUTS, _RNN_STEPS = 8, 3, 20


def sequence_loss(xp: Any, w: Any, x: Any, y: Any) -> Any:
    """The squared error of a small recurrent network on one sequence x (steps x inputs),
    its weights flattened into w; the recurrence is a scan (``gradtape.scan`` for NumPy,
    ``jax.lax.scan`` for JAX)."""
    n_h = _RNN_HIDDEN * _RNN_HIDDEN
    w_h = w[:n_h].reshape(_RNN_HIDDEN, _RNN_HIDDEN)
    w_x = w[n_h:].reshape(_RNN_INPUTS, _RNN_HIDDEN)
    if xp is np:
        from gradtape import scan
    else:
        from jax.lax import scan

    def step(h, x_t):
        h = xp.tanh(h @ w_h + x_t @ w_x)
        return h, xp.sum(h)

    h, ys = scan(step, xp.zeros(_RNN_HIDDEN), x)
    return (xp.sum(h) - y) ** 2 + 0.01 * xp.sum(ys)


def sequence_batch(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    n = 256
    w = 0.3 * rng.standard_normal(_RNN_HIDDEN * _RNN_HIDDEN + _RNN_INPUTS * _RNN_HIDDEN)
    x = rng.standard_normal((n, _RNN_STEPS, _RNN_INPUTS))
    return w, x, rng.standard_normal(n)


def softplus_quadratic(xp: Any, x: Any) -> Any:
    """A smooth non-separable scalar function of a short vector (its Hessian is dense)."""
    return xp.sum(xp.log1p(xp.exp(x))) + 0.5 * xp.sum(x * x) * xp.sum(xp.sin(x))


def hessian_batch(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return (rng.standard_normal((1_000, 5)),)


BATCHED_WORKLOADS: dict[str, BatchedWorkload] = {
    w.name: w
    for w in (
        BatchedWorkload(
            "per_example_grad",
            "per-example gradients of the logistic loss, 1000 examples x 20 features "
            "(vmap(grad(loss), in_axes=(None, 0, 0)))",
            logistic_loss,
            "grad",
            (None, 0, 0),
            logistic_batch,
        ),
        BatchedWorkload(
            "per_example_scan_grad",
            "per-example gradients of a recurrent network, a scan of 20 steps, 256 sequences "
            "(vmap(grad(loss), in_axes=(None, 0, 0)))",
            sequence_loss,
            "grad",
            (None, 0, 0),
            sequence_batch,
        ),
        BatchedWorkload(
            "batched_hessian",
            "Hessians of a dense 5-dimensional function at 1000 points (vmap(hessian(f)))",
            softplus_quadratic,
            "hessian",
            (0,),
            hessian_batch,
        ),
    )
}


# =============================================================================================
# Python-loop workloads: code written with plain Python `for` loops over data points, mixture
# components, observations and time steps, as people write likelihoods and simulations.
# gradtape records one iteration per pass of the loop and compile rolls them back into loops
# (compile/rolling.py). Each workload is `body(x, *consts)` in plain NumPy (no `xp`: the point
# is the loop as written), a vectorized NumPy objective giving the same value (the reference
# the Python-loop body is checked against), and a problem at size n. `python -m
# gradtape.bench.loop_workloads` is not a separate tool: `measure_loop_workload` below times
# one workload at one size, and benchmarks/loop_bench.py prints the table.
# =============================================================================================
def _lower_triangle(params: np.ndarray, d: int) -> np.ndarray:
    """The strictly lower triangle of a d x d matrix from d(d-1)/2 parameters, row by row."""
    rows, cols = np.tril_indices(d, -1)
    L = np.zeros((d, d), dtype=params.dtype)
    L[rows, cols] = params
    return L


def mixture_loglik_loops(x: Any, data: np.ndarray, n_components: int) -> Any:
    """Gaussian-mixture log-likelihood with Python loops over points and components.

    x packs, per component k: the weight logit alpha_k, the mean mu_k (d values), the log
    diagonal of the inverse Cholesky factor (d values) and its strictly lower triangle
    (d(d-1)/2 values), as the ADBench GMM objective parametrises full covariances:
    Q_k = diag(exp(q_k)) + L_k, log N(x_i | mu_k, (Q_k^T Q_k)^-1) up to constants.
    """
    n, d = data.shape
    K = n_components
    width = 1 + 2 * d + d * (d - 1) // 2
    rows, cols = np.tril_indices(d, -1)
    Qs, log_dets, alphas, means = [], [], [], []
    for k in range(K):
        p = x[k * width : (k + 1) * width]
        alphas.append(p[0])
        means.append(p[1 : 1 + d])
        q = p[1 + d : 1 + 2 * d]
        Q = np.diag(np.exp(q))
        Q[rows, cols] = p[1 + 2 * d :]
        Qs.append(Q)
        log_dets.append(np.sum(q))
    alpha = np.stack(alphas)
    log_weights = alpha - (np.max(alpha) + np.log(np.sum(np.exp(alpha - np.max(alpha)))))
    total = 0.0
    for i in range(n):
        terms = []
        for k in range(K):
            z = Qs[k] @ (data[i] - means[k])
            terms.append(log_weights[k] + log_dets[k] - 0.5 * np.sum(z * z))
        t = np.stack(terms)
        m = np.max(t)
        total = total + m + np.log(np.sum(np.exp(t - m)))
    return total - 0.5 * n * d * LOG_2PI


def mixture_loglik_vectorized(x: np.ndarray, data: np.ndarray, n_components: int) -> float:
    """The same log-likelihood with no Python loop over points or components (NumPy)."""
    n, d = data.shape
    K = n_components
    width = 1 + 2 * d + d * (d - 1) // 2
    p = x.reshape(K, width)
    alpha, mu, q = p[:, 0], p[:, 1 : 1 + d], p[:, 1 + d : 1 + 2 * d]
    rows, cols = np.tril_indices(d, -1)
    Q = np.zeros((K, d, d))
    Q[:, np.arange(d), np.arange(d)] = np.exp(q)
    Q[:, rows, cols] = p[:, 1 + 2 * d :]
    diff = data[None, :, :] - mu[:, None, :]  # (K, n, d)
    z = np.einsum("kab,knb->kna", Q, diff)
    log_weights = alpha - (alpha.max() + np.log(np.sum(np.exp(alpha - alpha.max()))))
    t = log_weights[:, None] + q.sum(axis=1)[:, None] - 0.5 * np.sum(z * z, axis=2)  # (K, n)
    m = t.max(axis=0)
    return float(np.sum(m + np.log(np.sum(np.exp(t - m), axis=0))) - 0.5 * n * d * LOG_2PI)


def mixture_problem(n: int, rng: np.random.Generator, d: int = 10, K: int = 25) -> Problem:
    width = 1 + 2 * d + d * (d - 1) // 2
    x = rng.normal(0.0, 0.1, K * width)
    return Problem(x, (rng.standard_normal((n, d)), K), n)


def _rotate(r: Any, point: Any) -> Any:
    """Rodrigues' rotation of a 3-vector by the angle-axis vector r (|r| > 0)."""
    theta = np.sqrt(np.sum(r * r))
    axis = r / theta
    c, s = np.cos(theta), np.sin(theta)
    cross = np.stack(
        [
            axis[1] * point[2] - axis[2] * point[1],
            axis[2] * point[0] - axis[0] * point[2],
            axis[0] * point[1] - axis[1] * point[0],
        ]
    )
    return point * c + cross * s + axis * (np.sum(axis * point) * (1.0 - c))


def reprojection_loops(x: Any, points: np.ndarray, observed: np.ndarray) -> Any:
    """Sum of squared reprojection residuals with a Python loop over observations.

    x = (angle-axis rotation r (3), translation (3), focal length, radial distortion k1, k2):
    one camera sees each 3-D point; the projection is distorted radially, as in bundle
    adjustment's residual per observation.
    """
    r, translation, f, k1, k2 = x[0:3], x[3:6], x[6], x[7], x[8]
    total = 0.0
    for i in range(points.shape[0]):
        p = _rotate(r, points[i]) + translation
        u = -p[:2] / p[2]
        r2 = np.sum(u * u)
        distortion = 1.0 + k1 * r2 + k2 * r2 * r2
        residual = f * distortion * u - observed[i]
        total = total + np.sum(residual * residual)
    return total


def reprojection_vectorized(x: np.ndarray, points: np.ndarray, observed: np.ndarray) -> float:
    """The same sum with no Python loop (NumPy)."""
    r, translation, f, k1, k2 = x[0:3], x[3:6], x[6], x[7], x[8]
    theta = np.sqrt(np.sum(r * r))
    axis = r / theta
    c, s = np.cos(theta), np.sin(theta)
    rotated = points * c + np.cross(axis, points) * s + np.outer(points @ axis, axis) * (1.0 - c)
    p = rotated + translation
    u = -p[:, :2] / p[:, 2:3]
    r2 = np.sum(u * u, axis=1, keepdims=True)
    residual = f * (1.0 + k1 * r2 + k2 * r2 * r2) * u - observed
    return float(np.sum(residual * residual))


def reprojection_problem(n: int, rng: np.random.Generator) -> Problem:
    x = np.array([0.1, -0.2, 0.05, 0.1, 0.2, 5.0, 1.2, -0.05, 0.01])
    points = rng.uniform(-1.0, 1.0, (n, 3))
    observed = rng.normal(0.0, 0.3, (n, 2))
    return Problem(x, (points, observed), n)


def time_stepping_loops(x: Any, steps: int, dt: float) -> Any:
    """Explicit time stepping of a damped pendulum chain (8 masses), 'steps' Euler steps with
    a Python loop; x = (initial angles (8), damping, stiffness); the loss is the final energy
    plus the tracked angle's squared deviation summed over the steps."""
    theta, omega = x[:8] * 1.0, np.zeros(8)
    damping, stiffness = x[8], x[9]
    loss = 0.0
    for _ in range(steps):
        difference = theta[1:] - theta[:-1]  # spring forces between neighbours
        coupling = np.concatenate((difference, [0.0])) - np.concatenate(([0.0], difference))
        accel = -np.sin(theta) + stiffness * coupling - damping * omega
        omega = omega + dt * accel
        theta = theta + dt * omega
        loss = loss + dt * (theta[0] - 0.5) ** 2
    return loss + 0.5 * np.sum(omega * omega)


def time_stepping_vectorized(x: np.ndarray, steps: int, dt: float) -> float:
    """The same simulation in NumPy (a loop over steps is inherent; this is the plain run)."""
    return float(time_stepping_loops(x, steps, dt))


def time_stepping_problem(n: int, rng: np.random.Generator) -> Problem:
    x = np.concatenate([rng.uniform(-0.5, 0.5, 8), [0.1, 0.5]])
    return Problem(x, (n, 1e-3), n)


@dataclasses.dataclass(frozen=True)
class LoopWorkload:
    """A Python-loop workload (see the block's comment)."""

    name: str
    description: str
    body: Callable[..., Any]
    vectorized: Callable[..., float]
    make_problem: Callable[[int, np.random.Generator], Problem]
    size_meaning: str


LOOP_WORKLOADS: dict[str, LoopWorkload] = {
    w.name: w
    for w in (
        LoopWorkload(
            "mixture_loops",
            "Gaussian-mixture log-likelihood, d=10, K=25, full covariances through a "
            "triangular parametrisation, Python loops over points and components",
            mixture_loglik_loops,
            mixture_loglik_vectorized,
            mixture_problem,
            "n, the number of points",
        ),
        LoopWorkload(
            "reprojection_loops",
            "squared reprojection residuals of n observations of 3-D points by one camera "
            "(angle-axis rotation, translation, focal length, radial distortion), a Python "
            "loop over observations",
            reprojection_loops,
            reprojection_vectorized,
            reprojection_problem,
            "n, the number of observations",
        ),
        LoopWorkload(
            "time_stepping_loops",
            "explicit Euler steps of a damped chain of 8 pendulums, a Python loop over steps",
            time_stepping_loops,
            time_stepping_vectorized,
            time_stepping_problem,
            "n, the number of time steps",
        ),
    )
}
