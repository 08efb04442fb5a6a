"""Benchmarks of the transform toolbox: batched transforms (vmap) and checkpointing.

``python -m gradtape.bench.transforms`` times each batched workload (bench/workloads.py,
``BATCHED_WORKLOADS``) with gradtape's ``compile(vmap(...))`` on the numba backend, with
``jax.jit(jax.vmap(...))`` when JAX is installed, and with a Python loop of the un-batched
gradtape transform; every result is checked against the loop's first. It then measures the
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
    parser.add_argument("--skip-memory", action="store_true", help="only the batched workloads")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    for workload in BATCHED_WORKLOADS.values():
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
