"""Benchmark workloads: each is a scalar function of a vector, written once, with hand gradients.

A workload's ``body(xp, x, *consts)`` is written against an array namespace ``xp`` so the very
same code runs as plain NumPy (``xp=numpy``, what gradtape sees), ``jax.numpy``,
``autograd.numpy`` and ``torch``.  Constants are closed over by the method adapters, never
differentiated.  Each workload also carries a hand-written NumPy value-and-gradient (the
reference every method is checked against) and a plain-Python loop kernel that the
``hand_numba`` method compiles with ``numba.njit`` (the "fused loop" a person would write).

To add a workload, write its three small functions and one ``Workload`` entry in ``WORKLOADS``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

LOG_2PI = math.log(2.0 * math.pi)

__all__ = ["PLANNED_WORKLOADS", "WORKLOADS", "Problem", "Workload", "select_workloads"]


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

    def numpy_function(self, problem: Problem) -> Callable[[np.ndarray], Any]:
        """The workload as the plain NumPy function ``f(x)`` a user would write."""
        consts = problem.consts
        return lambda x: self.body(np, x, *consts)

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
            normal_logpdf, normal_logpdf_hand, normal_logpdf_loop, normal_logpdf_problem,
            quick_sizes=(100, 10_000), full_sizes=_MEDIUM_FULL,
        ),
        Workload(
            "eam",
            "rho = sum(exp(-3*(x+1))); rho**2 + rho**3 + 0.25*rho**4",
            eam, eam_hand, eam_loop, unit_uniform_problem,
            quick_sizes=(100, 10_000), full_sizes=(100, 1_000, 10_000, 100_000),
        ),
        Workload(
            "sum_exp",
            "sum(exp(x))",
            sum_exp, sum_exp_hand, sum_exp_loop, standard_normal_problem,
            quick_sizes=(100, 10_000), full_sizes=_MEDIUM_FULL,
        ),
        Workload(
            "closure_const",
            "p -> sum(c[0]*p), p of length 1, c a closed-over constant; N = len(c)",
            closure_const, closure_const_hand, closure_const_loop, closure_const_problem,
            quick_sizes=(1_000, 100_000),
            full_sizes=(1_000, 10_000, 100_000, 1_000_000, 10_000_000),
            size_meaning="len(c)",
        ),
        Workload(
            "scalar_loop",
            "Python loop s = s + i*x[i] (scalar ops; small N only)",
            scalar_loop, scalar_loop_hand, scalar_loop_loop, standard_normal_problem,
            quick_sizes=(10, 100), full_sizes=(10, 100, 1_000), max_size=1_000,
        ),
        Workload(
            "branching",
            "s = sum(x); s**3 if s > 1 else s**2 (Python branch on a traced value)",
            branching, branching_hand, branching_loop, unit_uniform_problem,
            quick_sizes=(100, 10_000), full_sizes=_MEDIUM_FULL,
        ),
        # HOOK rnn_scan: add the recurrent-network workload here once gradtape's scan exists.
        # It needs a body written with that scan (and the peers' equivalents: jax.lax.scan,
        # a torch loop), a hand-written backward-through-time gradient and a loop kernel.
        # Until then it is listed in PLANNED_WORKLOADS only, never faked.
    )
}

PLANNED_WORKLOADS: dict[str, str] = {
    "rnn_scan": "planned: waits for gradtape's scan (not written yet)",
}


def select_workloads(names: Sequence[str] | None) -> list[Workload]:
    """The registry entries named (all when ``names`` is empty), in registry order."""
    if not names:
        return list(WORKLOADS.values())
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise KeyError(", ".join(unknown))
    return [w for w in WORKLOADS.values() if w.name in names]
