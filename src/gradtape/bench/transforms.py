"""Benchmarks of the transform toolbox: batched transforms (vmap) and checkpointing.

``python -m gradtape.bench.transforms`` times each batched workload (bench/workloads.py,
``BATCHED_WORKLOADS``) with gradtape's ``compile(vmap(...))`` on the numba backend, with
``jax.jit(jax.vmap(...))`` when JAX is installed, and with a Python loop of the un-batched
gradtape transform; every result is checked against the loop's first. It times a dense
Jacobian (100 -> 100) by jacfwd and jacrev and a Hessian (n = 50) by hessian and
jacfwd(grad), eager and compiled on both backends, with ``jax.jit`` of JAX's transforms. It
then measures the
peak memory of the gradient of a long chain of blocks with and without ``gradtape.checkpoint``,
eager and under ``compile(backend="numpy")``. Uses the public face of gradtape only.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import gradtape as gt
from gradtape.bench.workloads import BATCHED_WORKLOADS, BatchedWorkload


def _median_seconds(call: Callable[[], Any], repeat: int, budget_s: float = 0.2) -> float:
    """The median over `repeat` rounds of the time per call (calls per round fill budget_s)."""
    call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(budget_s / once / repeat))
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            call()
        rounds.append((time.perf_counter() - start) / number)
    return statistics.median(rounds)


def _warm_native(compiled: Callable, args: tuple) -> None:
    """Record, then wait for the numba backend's kernels compiling in the background, so the
    timing measures the native loops."""
    from gradtape.compile.numba import backend as numba_backend

    compiled(*args)
    if numba_backend.available():
        numba_backend.wait_for_kernels(120)
    compiled(*args)


def run_batched(workload: BatchedWorkload, repeat: int, rng: np.random.Generator) -> list:
    """[(method, seconds per call or None, max abs difference from the loop, note)]."""
    args = workload.make_args(rng)
    gt_transform = getattr(gt, workload.transform)(lambda *a: workload.body(np, *a))
    sizes = {a.shape[ax] for a, ax in zip(args, workload.in_axes) if ax is not None}
    (size,) = sizes

    def loop():
        outs = []
        for i in range(size):
            member = [
                a if ax is None else np.take(a, i, axis=ax) for a, ax in zip(args, workload.in_axes)
            ]
            outs.append(gt_transform(*member))
        return np.stack(outs)

    reference = loop()
    rows = []
    compiled = gt.compile(gt.vmap(gt_transform, in_axes=workload.in_axes), backend="numba")
    _warm_native(compiled, args)
    got = compiled(*args)
    rows.append(
        (
            "gradtape compile(vmap) numba",
            _median_seconds(lambda: compiled(*args), repeat),
            float(np.max(np.abs(got - reference))),
            "",
        )
    )
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        rows.append(("jax jit(vmap)", None, float("nan"), "jax is not installed"))
    else:
        jax.config.update("jax_enable_x64", True)
        jf = jax.jit(
            jax.vmap(
                getattr(jax, workload.transform)(lambda *a: workload.body(jnp, *a)),
                in_axes=workload.in_axes,
            )
        )
        got = np.asarray(jf(*args))
        rows.append(
            (
                "jax jit(vmap)",
                _median_seconds(lambda: jf(*args).block_until_ready(), repeat),
                float(np.max(np.abs(got - reference))),
                "",
            )
        )
    rows.append(("gradtape Python loop", _median_seconds(loop, max(1, repeat // 3), 0.5), 0.0, ""))
    return rows


# --- Jacobians and Hessians: which way of batching the directions is faster -----------------
_J_RNG = np.random.default_rng(2)
_J_WEIGHTS = _J_RNG.standard_normal((100, 100)) / 10.0
_H_WEIGHTS = _J_RNG.standard_normal((50, 50)) / 7.0


def dense_map(xp, x):
    """A dense map from 100 values to 100 values (every output depends on every input)."""
    h = xp.tanh(_J_WEIGHTS @ x)
    return h * xp.cos(x) + 0.1 * (_J_WEIGHTS.T @ h) ** 2


def dense_scalar(xp, x):
    """A scalar function of 50 values with a dense Hessian."""
    y = xp.tanh(_H_WEIGHTS @ x)
    return xp.sum(xp.log1p(xp.exp(y)) * x) + 0.5 * xp.sum((_H_WEIGHTS @ y) ** 2)


def _jacobian_methods() -> list:
    """[(case, method, gradtape function of x, JAX transform name or None)]."""
    jmap = lambda x: dense_map(np, x)  # noqa: E731
    scalar = lambda x: dense_scalar(np, x)  # noqa: E731
    return [
        ("dense Jacobian, 100 -> 100", "jacfwd (batched tangents)", gt.jacfwd(jmap), "jacfwd"),
        ("dense Jacobian, 100 -> 100", "jacrev (vmap of the pullback)", gt.jacrev(jmap), "jacrev"),
        (
            "Hessian, n = 50",
            "hessian (vmap of the pullback)",
            gt.hessian(scalar),
            "hessian",
        ),
        (
            "Hessian, n = 50",
            "jacfwd(grad) (forward over reverse)",
            gt.jacfwd(gt.grad(scalar)),
            None,
        ),
    ]


def run_jacobians(repeat: int) -> list:
    """[(case, method, tier, seconds per call or None, max abs difference, note)], the
    reference being each case's first method, eager."""
    rows = []
    points = {
        "dense Jacobian, 100 -> 100": np.random.default_rng(3).standard_normal(100),
        "Hessian, n = 50": np.random.default_rng(4).standard_normal(50),
    }
    references: dict = {}
    for case, method, fn, _ in _jacobian_methods():
        x = points[case]
        reference = references.setdefault(case, fn(x))
        for tier in ("eager", "numpy", "numba"):
            call = fn if tier == "eager" else gt.compile(fn, backend=tier)
            if tier == "numba":
                _warm_native(call, (x,))
            got = call(x)
            seconds = _median_seconds(lambda c=call: c(x), repeat)
            rows.append((case, method, tier, seconds, float(np.max(np.abs(got - reference))), ""))
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        rows.append(("-", "jax jit", "-", None, float("nan"), "jax is not installed"))
        return rows
    jax.config.update("jax_enable_x64", True)
    bodies = {"dense Jacobian, 100 -> 100": dense_map, "Hessian, n = 50": dense_scalar}
    for case, _, _, name in _jacobian_methods():
        if name is None:
            continue
        x = points[case]
        jf = jax.jit(getattr(jax, name)(lambda x, b=bodies[case]: b(jnp, x)))
        got = np.asarray(jf(x))
        seconds = _median_seconds(lambda: jf(x).block_until_ready(), repeat)
        rows.append(
            (
                case,
                f"jax jit({name})",
                "xla",
                seconds,
                float(np.max(np.abs(got - references[case]))),
                "",
            )
        )
    return rows


# --- checkpointing: peak memory of a long chain of blocks --------------------------------------
_WIDTH = 128
_MIX = np.linalg.qr(np.random.default_rng(1).standard_normal((_WIDTH, _WIDTH)))[0]


def _block(x):
    """A residual block: a rotation, a nonlinearity and a few full-size intermediates."""
    h = np.tanh(x @ _MIX)
    return x + 0.1 * h * np.cos(x) - 0.05 * np.sin(h)


def chain_loss(x, blocks: int, checkpointed: bool):
    """A chain of `blocks` blocks, each with a few full-size intermediates."""
    block = gt.checkpoint(_block) if checkpointed else _block
    for _ in range(blocks):
        x = block(x)
    return np.sum(x * x)


def checkpoint_peak_memory(blocks: int = 64, rows: int = 32, compiled: bool = False) -> list:
    """[(variant, peak bytes traced by tracemalloc during one gradient, gradient norm)].

    compiled=True: the gradient under ``compile(backend="numpy")``. Its generated code keeps
    a set of preallocated buffers between calls; the set is dropped before the measured call,
    so the peak includes allocating it: the memory one call needs.
    """
    x = np.random.default_rng(0).standard_normal((rows, _WIDTH))
    rows = []
    for checkpointed in (False, True):
        grad = gt.grad(lambda x, c=checkpointed: chain_loss(x, blocks, c))
        if compiled:
            grad = gt.compile(grad, backend="numpy")
        grad(x)  # warm: caches, lazily imported modules, the recorded program
        if compiled:
            grad.lowered(x).pool.clear()
        gc.collect()
        tracemalloc.start()
        g = grad(x)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        name = "checkpoint(block)" if checkpointed else "plain block"
        rows.append((name, peak, float(np.linalg.norm(g))))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timing rounds (median reported)")
    parser.add_argument("--skip-batched", action="store_true", help="no batched workloads")
    parser.add_argument(
        "--workload",
        action="append",
        choices=sorted(BATCHED_WORKLOADS),
        help="only these batched workloads (repeatable; default: all)",
    )
    parser.add_argument("--skip-jacobians", action="store_true", help="no Jacobian cases")
    parser.add_argument("--skip-memory", action="store_true", help="no checkpoint memory")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    chosen = [w for w in BATCHED_WORKLOADS.values() if not args.workload or w.name in args.workload]
    for workload in () if args.skip_batched else chosen:
        print(f"{workload.name}: {workload.description}")
        rows = run_batched(workload, args.repeat, rng)
        base = next(s for m, s, _, _ in rows if m.startswith("gradtape compile"))
        for method, seconds, err, note in rows:
            if seconds is None:
                print(f"  {method:32s} {'-':>12s}  ({note})")
                continue
            print(
                f"  {method:32s} {seconds * 1e6:12.1f} us  {seconds / base:9.1f}x gradtape  "
                f"max |diff| vs loop {err:.1e}"
            )
    if not args.skip_jacobians:
        rows = run_jacobians(args.repeat)
        for case in dict.fromkeys(r[0] for r in rows if r[0] != "-"):
            print(f"{case}: seconds per call (median of {args.repeat}), max |diff| vs the first")
            for _, method, tier, seconds, err, _ in (r for r in rows if r[0] == case):
                print(f"  {method:44s} {tier:6s} {seconds * 1e6:10.1f} us  max |diff| {err:.1e}")
        for r in rows:
            if r[0] == "-":
                print(f"  {r[1]}: {r[5]}")
    if not args.skip_memory:
        for compiled in (False, True):
            where = 'compile(grad, backend="numpy")' if compiled else "eager grad"
            print(
                f"gradient of a chain of 64 blocks (32 x {_WIDTH} values each), {where}: "
                "peak traced memory"
            )
            for name, peak, norm in checkpoint_peak_memory(compiled=compiled):
                print(f"  {name:32s} {peak / 2**20:10.1f} MiB   |grad| = {norm:.6g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
