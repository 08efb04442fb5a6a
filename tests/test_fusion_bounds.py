"""Bounded kernels (compile/numba/fusion.py `limits`): the kernels LLVM's generator compiles are
cut by their length in operations (a loop's members, OP_COST per other stage), Numba's by
instructions at far larger bounds, a loop driver's step stays one kernel; the values a split
program hands on are the unsplit program's."""

from __future__ import annotations

import numpy as np
import pytest

import gradtape as gt
from gradtape import config
from gradtape.compile import BACKENDS, llvm, memo, register_backend
from gradtape.compile.numba import codegen, fusion, lowering, scalar

_PROGRAMS: list = []
RNG = np.random.default_rng(3)
W = RNG.normal(size=(6, 6)) / 3.0


def _recording_lower(prog):
    _PROGRAMS.append(prog)
    return BACKENDS["numpy"](prog)


@pytest.fixture(scope="module", autouse=True)
def recording_backend():
    register_backend("record-bounds", _recording_lower)
    yield
    del BACKENDS["record-bounds"]


def many_stages(x):
    """Short loops, slices and small products one after another: many stages, few members."""
    total = 0.0
    h = x
    for i in range(12):
        h = np.tanh(W @ h) + x[i % 6] * h
        total = total + np.sum(h[1:4] * h[2:5])
    return total


def long_chain(x):
    y = x
    for i in range(150):
        y = np.sin(y) * 1.0001 if i % 2 else y + 0.5 * x
    return np.sum(y)


def program_of(f, x, monkeypatch):
    monkeypatch.setenv(config.ROLL, "0")
    memo.forget_all()
    cf = gt.compile(gt.value_and_grad(f), backend="record-bounds")
    before = len(_PROGRAMS)
    cf(x)
    (prog,) = _PROGRAMS[before:]
    return prog


def segment_lengths(plan, weighed: bool) -> list[int]:
    measure = fusion.stage_cost if weighed else (lambda s: len(s.members))
    return [sum(measure(s) for s in plan.stages_of(k)) for k in range(plan.segments)]


@pytest.mark.parametrize("f", [many_stages, long_chain])
def test_llvm_kernels_are_bounded_by_their_cost(f, monkeypatch):
    prog = program_of(f, np.linspace(0.1, 0.9, 6), monkeypatch)
    monkeypatch.setattr(fusion, "LLVM_KERNEL_COST", 40)
    monkeypatch.setattr(fusion, "MAX_LOOP_MEMBERS", 16)
    # a program below LLVM_WHOLE_BELOW stays whole
    whole = fusion.plan(prog, scalar.fusable, lowering.lowerable, fusion.limits(True))
    assert whole.segments == 1
    monkeypatch.setattr(fusion, "LLVM_WHOLE_BELOW", 0)
    bounds = fusion.limits(True)
    assert bounds == fusion.Limits(16, 40, weighed=True, whole_below=0)
    plan = fusion.plan(prog, scalar.fusable, lowering.lowerable, bounds)
    lengths = segment_lengths(plan, weighed=True)
    assert plan.segments > 2
    longest_stage = max(fusion.stage_cost(s) for s in plan.stages)
    assert max(lengths) <= 40 + longest_stage
    assert all(len(s.members) <= 16 for s in plan.stages if s.kind == fusion.LOOP)
    # Numba's bounds (instructions, far larger) keep this program in one kernel
    monkeypatch.setattr(fusion, "MAX_LOOP_MEMBERS", 8192)
    assert fusion.plan(prog, scalar.fusable, lowering.lowerable).segments == 1
    # and a plan that must stay one kernel (a loop's step) is never cut
    one = fusion.plan(prog, scalar.fusable, lowering.lowerable, fusion.limits(True, True))
    assert one.segments == 1


def test_the_bounds_follow_the_generator(monkeypatch):
    monkeypatch.setenv(config.LLVM, "0")
    assert not codegen.direct_llvm()
    monkeypatch.setenv(config.LLVM, "1")
    assert codegen.direct_llvm() == llvm.available()
    numba_bounds = fusion.limits(False)
    assert numba_bounds.kernel == fusion.MAX_KERNEL_MEMBERS and not numba_bounds.weighed
    # a test that shrinks Numba's bounds shrinks LLVM's too
    monkeypatch.setattr(fusion, "MAX_KERNEL_MEMBERS", 8)
    assert fusion.limits(True).kernel == 8


def test_a_kernel_passing_too_many_values_is_refused_for_numba():
    from gradtape.compile.numba.generator import Kernel, KernelArg

    f64 = np.dtype(np.float64)
    kernel = Kernel("kernel0", [KernelArg(f"x{k}", f64, 1) for k in range(300)], [])
    codegen.check_numba_values([kernel], limit=codegen.LLVM_KERNEL_VALUES)
    with pytest.raises(NotImplementedError, match="300 values"):
        codegen.check_numba_values([kernel])


@pytest.mark.parametrize("f", [many_stages, long_chain])
def test_a_program_split_for_llvm_gives_the_eager_numbers(f, monkeypatch):
    """The split program on the numba backend (LLVM's kernels where llvmlite is installed)
    against eager evaluation; the module holds several kernels."""
    pytest.importorskip("numba")
    monkeypatch.setenv(config.ROLL, "0")
    monkeypatch.setattr(fusion, "LLVM_KERNEL_COST", 40)
    monkeypatch.setattr(fusion, "LLVM_WHOLE_BELOW", 0)
    monkeypatch.setattr(fusion, "MAX_KERNEL_MEMBERS", 40)
    monkeypatch.setattr(fusion, "MAX_LOOP_MEMBERS", 16)
    memo.forget_all()
    # a module of the same text built earlier in this process (with Numba) is not reused
    from gradtape.compile.numba import backend as nb

    monkeypatch.setattr(nb, "_REGISTRY", type(nb._REGISTRY)())
    refused_before = len(llvm.refusals)
    x = np.linspace(0.1, 0.9, 6)
    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    value, grad = cf(x)
    want = gt.value_and_grad(f)(x)
    np.testing.assert_allclose(value, want[0], rtol=1e-12)
    np.testing.assert_allclose(grad, want[1], rtol=1e-10, atol=1e-14)
    assert cf.source(x).count("\ndef kernel") > 2
    if llvm.available():
        why = llvm.refusals[refused_before:] or llvm.refusals[-1:]
        assert cf.lowered(x).native.generator == "llvm", why


test_a_program_split_for_llvm_gives_the_eager_numbers = pytest.mark.native(
    test_a_program_split_for_llvm_gives_the_eager_numbers
)


def test_a_kernel_is_not_cut_where_many_values_are_live(monkeypatch):
    """A forward and backward pass whose fused loops hand hundreds of values on is not cut
    between them: the cut waits for a stage before which at most LLVM_MAX_HANDED are live."""
    prog = program_of(long_chain, np.linspace(0.1, 0.9, 6), monkeypatch)
    monkeypatch.setattr(fusion, "LLVM_KERNEL_COST", 40)
    monkeypatch.setattr(fusion, "LLVM_WHOLE_BELOW", 0)
    monkeypatch.setattr(fusion, "MAX_LOOP_MEMBERS", 100)
    cut = fusion.plan(prog, scalar.fusable, lowering.lowerable, fusion.limits(True))
    assert cut.segments > 1
    monkeypatch.setattr(fusion, "LLVM_MAX_HANDED", 2)
    kept = fusion.plan(prog, scalar.fusable, lowering.lowerable, fusion.limits(True))
    assert kept.segments < cut.segments
    live = fusion._live_across(kept.stages, kept.defined_in, kept.last_use)
    for stage in kept.stages[1:]:
        if stage.segment != kept.stages[stage.index - 1].segment:
            assert live[stage.index] <= 2
