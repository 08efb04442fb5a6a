"""Not a test module: code as a user writes it, checked by mypy (configured in pyproject.toml)
against gradtape's inline types. It pins what a user's type checker sees: the public names exist,
their signatures accept the documented arguments, and the results have the documented types."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import gradtape as gt


def loss(w: np.ndarray, x: np.ndarray) -> Any:
    return np.sum((x @ w) ** 2)


w, x = np.ones(3), np.ones((4, 3))
grad_fn: Callable = gt.grad(loss, argnums=0, has_aux=False, holomorphic=False)
both: Callable = gt.value_and_grad(loss, argnums=(0, 1))
jac: Callable = gt.jacobian(loss, mode="reverse")
forward: Callable = gt.jacfwd(loss)
reverse: Callable = gt.jacrev(loss)
hess: Callable = gt.hessian(loss)
product = gt.hvp(lambda v: loss(v, x), w, w)
out_and_vjp: tuple[Any, ...] = gt.vjp(loss, w, x)
tangent = gt.jvp(loss, (w, x), (w, x))
compiled: gt.CompiledFunction = gt.compile(loss, backend="numpy", static_argnums=1)
tape: gt.Tape = gt.trace(loss, w, x)
report: gt.GradCheck = gt.check_grad(loss, w, x, argnums=0, tolerance=1e-6)
ok: bool = report.ok
threads: int = gt.get_num_threads()
gt.set_num_threads(threads)
removed: int = gt.clear_cache()
constant = gt.stop_gradient(w)
carry, ys = gt.scan(lambda c, v: (c + v, c), 0.0, w, checkpoint=2)
looped = gt.fori_loop(0, 3, lambda i, v: v * 2.0, 1.0)
until = gt.while_loop(lambda v: v < 10.0, lambda v: v * 2.0, 1.0)
custom_reverse: gt.custom_vjp = gt.custom_vjp(np.sin)
custom_forward: gt.custom_jvp = gt.custom_jvp(np.exp)
errors: tuple[type[Exception], ...] = (gt.GradtapeError, gt.GuardFailure)
warning_classes: tuple[type[Warning], ...] = (gt.CompileWarning, gt.NativeFallbackWarning)
version: str = gt.__version__
