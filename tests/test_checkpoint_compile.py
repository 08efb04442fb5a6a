"""checkpoint under compile: the recomputation stays in the backward pass (program
simplification does not merge it into the forward pass), so a compiled gradient of a long
chain of checkpointed blocks needs less memory; prevent_cse=False lets them merge."""

from __future__ import annotations

import gc
import re
import tracemalloc

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile.numba import backend as numba_backend
from gradtape.transforms.toolbox import optimization_barrier_p

RNG = np.random.default_rng(20261125)
MIX = np.linalg.qr(RNG.normal(size=(48, 48)))[0]


def block(x):
    h = np.tanh(x @ MIX)
    return x + 0.1 * h * np.cos(x) - 0.05 * np.sin(h)


def chain(x, b, length=24):
    for _ in range(length):
        x = b(x)
    return np.sum(x * x)


def compiled_gradient(b, backend="numpy"):
    return gt.compile(gt.grad(lambda x: chain(x, b)), backend=backend)


def peak_of_one_call(compiled, x) -> int:
    """Peak bytes traced during one call that allocates its buffer set afresh."""
    compiled(x)
    compiled.lowered(x).pool.clear()
    gc.collect()
    tracemalloc.start()
    try:
        compiled(x)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def count(compiled, x, ufunc: str) -> int:
    """Calls of the ufunc named `ufunc` in the generated NumPy code (each ufunc is bound to
    a name `u_<ufunc>_<n>` there)."""
    return len(re.findall(rf"\bu_{ufunc}_\d+\(", compiled.lowered(x).source))


def test_compiled_checkpoint_keeps_its_memory_saving():
    x = RNG.normal(size=(32, 48))
    plain = compiled_gradient(block)
    checkpointed = compiled_gradient(gt.checkpoint(block))
    merged = compiled_gradient(gt.checkpoint(block, prevent_cse=False))
    expected = gt.grad(lambda x: chain(x, block))(x)
    for f in (plain, checkpointed, merged):
        np.testing.assert_allclose(f(x), expected, rtol=1e-12)
    peaks = {
        "plain": peak_of_one_call(plain, x),
        "checkpoint": peak_of_one_call(checkpointed, x),
        "merged": peak_of_one_call(merged, x),
    }
    assert peaks["checkpoint"] < 0.5 * peaks["plain"], peaks
    assert peaks["merged"] > 0.8 * peaks["plain"], peaks  # no barrier: merged, no saving


def test_the_recomputation_is_in_the_program_once_per_block():
    x = RNG.normal(size=(4, 48))
    checkpointed = compiled_gradient(gt.checkpoint(block))
    merged = compiled_gradient(gt.checkpoint(block, prevent_cse=False))
    checkpointed(x), merged(x)
    # the forward pass's tanh, and the recomputed one of every block but the last (its
    # outputs' backward reads the forward's values directly: DCE leaves one copy)
    assert count(checkpointed, x, "tanh") >= 2 * 24 - 1
    assert count(merged, x, "tanh") == 24
    assert count(checkpointed, x, "positive") == 24  # the barrier: a recorded copy
    assert count(merged, x, "positive") == 0


def test_barrier_is_differentiated_and_batched_as_the_identity():
    x = RNG.normal(size=5)
    v = RNG.normal(size=5)

    def f(x):
        return np.sum(np.sin(optimization_barrier_p(x)) * x)

    expected_grad = np.sin(x) + x * np.cos(x)
    np.testing.assert_allclose(gt.grad(f)(x), expected_grad, rtol=1e-13)
    expected_h = np.diag(2 * np.cos(x) - x * np.sin(x))
    np.testing.assert_allclose(gt.hessian(f)(x), expected_h, rtol=1e-12, atol=1e-14)
    _, tangent = gt.jvp(f, (x,), (v,))
    np.testing.assert_allclose(tangent, expected_grad @ v, rtol=1e-12)
    xs = RNG.normal(size=(3, 5))
    np.testing.assert_allclose(gt.vmap(gt.grad(f))(xs), np.sin(xs) + xs * np.cos(xs), rtol=1e-13)


@pytest.mark.parametrize("transform", ["hessian", "jacfwd of grad", "vmap of grad"])
def test_compiled_checkpoint_composes(transform):
    small = np.linalg.qr(RNG.normal(size=(6, 6)))[0]

    def b(x):
        return np.tanh(x @ small) * np.cos(x)

    def f(x, blk):
        for _ in range(3):
            x = blk(x)
        return np.sum(x**3)

    def make(blk):
        if transform == "hessian":
            return gt.hessian(lambda x: f(x, blk))
        if transform == "jacfwd of grad":
            return gt.jacfwd(gt.grad(lambda x: f(x, blk)))
        return gt.vmap(gt.grad(lambda x: f(x, blk)))

    x = RNG.normal(size=6) if transform != "vmap of grad" else RNG.normal(size=(4, 6))
    expected = make(b)(x)
    got = gt.compile(make(gt.checkpoint(b)), backend="numpy")(x)
    np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-13)


@pytest.mark.native
@pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed")
def test_barrier_fuses_in_native_loops():
    x = RNG.normal(size=(8, 48))
    native = compiled_gradient(gt.checkpoint(block), backend="numba")
    np.testing.assert_allclose(
        native(x), compiled_gradient(gt.checkpoint(block))(x), rtol=1e-11, atol=1e-13
    )
    plan = native.lowered(x).generated.plan
    assert not [s for s in plan.stages if s.kind == "python"]
