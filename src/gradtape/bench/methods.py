"""Benchmark methods: ways to get ``(value, gradient)`` of a workload, one registry entry each.

A method's ``prepare(workload, problem)`` does all one-time setup (imports, conversions of the
constants and of ``x`` to the system's arrays, building the transformed function) and returns a
zero-argument callable; each call of it computes the value and the gradient at ``problem.x`` and
is what gets timed.  Heavy systems (jax, torch, numba, autograd) are imported here lazily, on
first use, so the CLI can pin their threads first.  A system that cannot be imported, or a
gradtape function that does not exist yet, raises ``Absent`` and the method is reported absent.

gradtape's and JAX's methods run a workload's variant written with their own loop primitive
when it has one (``Workload.body_for``); ``gradtape_unrolled`` runs the plain Python loop under
gradtape instead, and only on such workloads (``Method.needs_variant``).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradtape.bench.workloads import GRADTAPE, JAX, Problem, Workload

ValueAndGrad = tuple[Any, Any]
PreparedCall = Callable[[], ValueAndGrad]

SMALL_INPUT_LIMIT = 1_000
"""finite_diff and complex_step cost len(x) evaluations of f; they run only up to this size."""

FINITE_DIFF_STEP = float(np.finfo(np.float64).eps) ** (1 / 3)
COMPLEX_STEP = 1e-20


class Absent(Exception):
    """The method's system is not installed, or the gradtape feature it needs does not exist."""


@dataclass(frozen=True)
class Method:
    """One way of computing (value, gradient); see the module docstring."""

    name: str
    description: str
    prepare: Callable[[Workload, Problem], PreparedCall]
    peer: bool = False
    """A peer is another AD system or the hand gradient: 'ratio to best peer' uses the best one."""
    max_input_size: int | None = None
    systems: tuple[str, ...] = ()
    """Distributions whose versions the report lists when this method ran."""
    rtol: float = 1e-6
    """Tolerance of the check against the hand gradient (relative to the largest entry)."""
    needs_variant: str | None = None
    """Run only on workloads with a variant for this system (a comparison meaningless elsewhere)."""
    interleaved_with: str | None = None
    """Another method this one is compared with: where both run, their samples are taken in
    turn (one of each, repeated), so the machine's drift falls on both alike."""

    def applies_to(self, workload: Workload) -> bool:
        """Whether this method is measured on ``workload`` at all."""
        return self.needs_variant is None or self.needs_variant in workload.variants


def require(module: str) -> Any:
    """Import ``module`` or raise ``Absent`` saying why it cannot be used."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise Absent(f"cannot import {module}: {exc}") from exc


def gradtape_function(name: str) -> Callable[..., Any]:
    """``gradtape.<name>``, or ``Absent`` while the core library does not provide it yet."""
    function = getattr(require("gradtape"), name, None)
    if not callable(function):
        raise Absent(f"gradtape.{name} does not exist yet")
    return function


# --- baseline and hand-written gradients ---


def prepare_numpy(workload: Workload, problem: Problem) -> PreparedCall:
    f, x = workload.numpy_function(problem), problem.x
    return lambda: (f(x), None)


def prepare_hand_numpy(workload: Workload, problem: Problem) -> PreparedCall:
    return lambda: workload.hand_value_and_grad(problem.x, *problem.consts)


@functools.cache
def _njit(kernel: Callable[..., ValueAndGrad]) -> Callable[..., ValueAndGrad]:
    return require("numba").njit(cache=False)(kernel)


def prepare_hand_numba(workload: Workload, problem: Problem) -> PreparedCall:
    kernel = _njit(workload.loop_kernel)
    return lambda: kernel(problem.x, *problem.consts)


# --- gradtape ---


def prepare_gradtape(workload: Workload, problem: Problem) -> PreparedCall:
    f = workload.numpy_function(problem, GRADTAPE)
    value_and_grad = gradtape_function("value_and_grad")(f)
    return lambda: value_and_grad(problem.x)


def prepare_gradtape_unrolled(workload: Workload, problem: Problem) -> PreparedCall:
    value_and_grad = gradtape_function("value_and_grad")(workload.numpy_function(problem))
    return lambda: value_and_grad(problem.x)


def _prepare_gradtape_compiled(backend: str) -> Callable[[Workload, Problem], PreparedCall]:
    def prepare(workload: Workload, problem: Problem) -> PreparedCall:
        compile_ = gradtape_function("compile")
        f = workload.numpy_function(problem, GRADTAPE)
        value_and_grad = gradtape_function("value_and_grad")(f)
        try:
            compiled = compile_(value_and_grad, backend=backend)
        except ValueError as exc:  # compile rejects a backend it does not have (yet)
            if "backend" in str(exc):
                raise Absent(f"gradtape.compile backend {backend!r}: {exc}") from exc
            raise
        return lambda: compiled(problem.x)

    return prepare


def _prepare_gradtape_plain_products(backend: str) -> Callable[[Workload, Problem], PreparedCall]:
    """The compiled gradient on ``backend`` built with GRADTAPE_NAN_SAFE=0: beside the same
    build with the setting on, what the NaN-safe products cost."""
    prepare_compiled = _prepare_gradtape_compiled(backend)

    def prepare(workload: Workload, problem: Problem) -> PreparedCall:
        previous = os.environ.get("GRADTAPE_NAN_SAFE")
        os.environ["GRADTAPE_NAN_SAFE"] = "0"
        try:  # the setting is read while the first call records and builds
            call = prepare_compiled(workload, problem)
            call()
        finally:
            if previous is None:
                del os.environ["GRADTAPE_NAN_SAFE"]
            else:
                os.environ["GRADTAPE_NAN_SAFE"] = previous
        return call

    return prepare


# --- peers ---


def _import_jax() -> Any:
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


def _prepare_jax(jit: bool) -> Callable[[Workload, Problem], PreparedCall]:
    def prepare(workload: Workload, problem: Problem) -> PreparedCall:
        jax = _import_jax()
        jnp = jax.numpy
        consts = tuple(jnp.asarray(c) for c in problem.consts)
        body = workload.body_for(JAX)
        value_and_grad = jax.value_and_grad(lambda x: body(jnp, x, *consts))
        if jit:
            value_and_grad = jax.jit(value_and_grad)
        x = jax.device_put(problem.x)
        return lambda: jax.block_until_ready(value_and_grad(x))

    return prepare


def _import_torch() -> Any:
    torch = require("torch")
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # settable once only, before torch's first parallel work
        pass
    return torch


def prepare_torch(workload: Workload, problem: Problem) -> PreparedCall:
    torch = _import_torch()
    consts = tuple(torch.as_tensor(np.asarray(c)) for c in problem.consts)
    x = torch.from_numpy(problem.x)

    def call() -> ValueAndGrad:
        leaf = x.detach().requires_grad_(True)
        value = workload.body(torch, leaf, *consts)
        (grad,) = torch.autograd.grad(value, leaf)
        return value.item(), grad.numpy()

    return call


def prepare_autograd(workload: Workload, problem: Problem) -> PreparedCall:
    autograd = require("autograd")
    anp = require("autograd.numpy")
    value_and_grad = autograd.value_and_grad(lambda x: workload.body(anp, x, *problem.consts))
    return lambda: value_and_grad(problem.x)


# --- numerical differentiation (small inputs only) ---


def central_difference(f: Callable[[np.ndarray], Any], x: np.ndarray) -> ValueAndGrad:
    """Value and central-difference gradient: 2*len(x) evaluations, error O(h^2)."""
    shifted = x.copy()
    grad = np.empty_like(x)
    for k in range(x.size):
        step = FINITE_DIFF_STEP * max(1.0, abs(x[k]))
        shifted[k] = x[k] + step
        upper = f(shifted)
        shifted[k] = x[k] - step
        lower = f(shifted)
        shifted[k] = x[k]
        grad[k] = (upper - lower) / (2 * step)
    return f(x), grad


def complex_step(f: Callable[[np.ndarray], Any], x: np.ndarray) -> ValueAndGrad:
    """Value and complex-step gradient Im f(x + ih e_k) / h: exact to rounding, needs analytic f."""
    shifted = x.astype(np.complex128)
    grad = np.empty_like(x)
    for k in range(x.size):
        shifted[k] = complex(x[k], COMPLEX_STEP)
        grad[k] = np.imag(f(shifted)) / COMPLEX_STEP
        shifted[k] = x[k]
    return f(x), grad


def _prepare_numerical(
    differentiate: Callable[[Callable[[np.ndarray], Any], np.ndarray], ValueAndGrad],
) -> Callable[[Workload, Problem], PreparedCall]:
    def prepare(workload: Workload, problem: Problem) -> PreparedCall:
        f = workload.numpy_function(problem)
        return lambda: differentiate(f, problem.x)

    return prepare


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "numpy",
            "the plain NumPy function, value only (baseline)",
            prepare_numpy,
            systems=("numpy",),
        ),
        Method(
            "hand_numpy",
            "hand-written NumPy gradient",
            prepare_hand_numpy,
            peer=True,
            systems=("numpy",),
        ),
        Method(
            "hand_numba",
            "hand-written fused loop, numba.njit",
            prepare_hand_numba,
            systems=("numba", "llvmlite"),
        ),
        Method(
            "gradtape",
            "gradtape.value_and_grad(f)(x), eager",
            prepare_gradtape,
            systems=("gradtape",),
        ),
        Method(
            "gradtape_compiled",
            "gradtape.compile(value_and_grad(f), backend='numpy')",
            _prepare_gradtape_compiled("numpy"),
            systems=("gradtape",),
        ),
        Method(
            "gradtape_compiled_plain",
            "gradtape_compiled built with GRADTAPE_NAN_SAFE=0: plain products in derivative "
            "rules (gradtape_compiled / this = what the NaN-safe products cost)",
            _prepare_gradtape_plain_products("numpy"),
            systems=("gradtape",),
            interleaved_with="gradtape_compiled",
        ),
        Method(
            "gradtape_numba",
            "gradtape.compile(value_and_grad(f), backend='numba')",
            _prepare_gradtape_compiled("numba"),
            systems=("gradtape", "numba"),
        ),
        Method(
            "gradtape_numba_plain",
            "gradtape_numba built with GRADTAPE_NAN_SAFE=0: plain products in derivative rules "
            "(gradtape_numba / this = what the NaN-safe products cost)",
            _prepare_gradtape_plain_products("numba"),
            systems=("gradtape", "numba"),
            interleaved_with="gradtape_numba",
        ),
        Method(
            "gradtape_unrolled",
            "gradtape.value_and_grad(f), eager, on the plain Python loop "
            "(loop workloads only; gradtape runs their scan)",
            prepare_gradtape_unrolled,
            systems=("gradtape",),
            needs_variant=GRADTAPE,
        ),
        Method(
            "jax_jit",
            "jax.jit(jax.value_and_grad(f)), float64",
            _prepare_jax(jit=True),
            peer=True,
            systems=("jax", "jaxlib"),
        ),
        Method(
            "jax",
            "jax.value_and_grad(f) without jit, float64",
            _prepare_jax(jit=False),
            peer=True,
            systems=("jax", "jaxlib"),
        ),
        Method(
            "torch", "torch eager autograd, float64", prepare_torch, peer=True, systems=("torch",)
        ),
        Method(
            "autograd",
            "HIPS autograd.value_and_grad with autograd.numpy",
            prepare_autograd,
            peer=True,
            systems=("autograd",),
        ),
        Method(
            "finite_diff",
            "central differences, 2N evaluations of f",
            _prepare_numerical(central_difference),
            max_input_size=SMALL_INPUT_LIMIT,
            systems=("numpy",),
        ),
        Method(
            "complex_step",
            "complex-step derivative, N complex evaluations of f",
            _prepare_numerical(complex_step),
            max_input_size=SMALL_INPUT_LIMIT,
            systems=("numpy",),
        ),
    )
}


def select_methods(names: Sequence[str] | None) -> list[Method]:
    """The registry entries named (all when ``names`` is empty), in registry order."""
    if not names:
        return list(METHODS.values())
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise KeyError(", ".join(unknown))
    return [m for m in METHODS.values() if m.name in names]
