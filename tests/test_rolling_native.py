"""Rolled Python loops on the numba backend's native drivers (compile/rolling.py step_tape,
compile/numba/loops.py rolled_spec).

The fast tier checks the step tape itself: one iteration of a rolled loop written as a tape,
run iteration by iteration the way the native driver runs it (carries, rows, progressing
indices, accumulators), gives the rolled loop's own results. The native tier compiles
generated loop bodies with the numba backend and compares the native driver's values and
gradients with the unrolled program, the numpy backend's rolled interpreter and eager
gradtape; it also checks that the driver really runs (no Python fallback), that guarded
branches inside the body send other paths to other variants, and that another trip count
of the same body reuses the driver's module.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape import config
from gradtape.compile import memo, rolling
from gradtape.compile.numpy_backend import NumpyLowered
from gradtape.compile.step import step_program


@pytest.fixture(autouse=True)
def roll_short_tapes(monkeypatch):
    """Every tape is searched (not only long ones): small cases suffice."""
    monkeypatch.setattr(rolling, "MIN_TAPE_LENGTH", 0)
    monkeypatch.setattr(rolling, "NATIVE_MIN_TAPE_LENGTH", 0)
    monkeypatch.setenv(config.ROLL, "1")
    memo.forget_all()


# --- generated loop bodies -----------------------------------------------------------------------
OPS = ("sin", "mul_x", "add_const", "tanh", "square", "branch", "window", "stride", "where", "set")


def make_loop(ops: list, n: int, vector: bool, nested: int):
    """A function of x (length 3n + 6) with a Python loop of n iterations running `ops`,
    and `nested` iterations of an inner loop in each."""

    def step(c, x, i):
        for op in ops:
            if op == "sin":
                c = np.sin(c) + x[i]
            elif op == "mul_x":
                c = c * x[i + 1]
            elif op == "add_const":
                c = c + 0.25 * (i % 2 + 1)  # (two constants: the run is a loop of two)
            elif op == "tanh":
                c = np.tanh(c * 0.5)
            elif op == "square":
                c = c * c * 0.1 + x[i]
            elif op == "branch":
                if np.all(c > 0.0):  # a value-dependent branch: guarded per iteration
                    c = c * 0.9
                else:
                    c = c + 1.0
            elif op == "window":
                c = c + np.sum(x[i : i + 3]) * 0.1
            elif op == "stride":
                c = c + x[2 * i] * 0.2
            elif op == "where":
                c = np.where(c > x[i], c - x[i], c * x[i])
            elif op == "set":
                y = np.zeros(3) + c
                y[1] = x[i] * 2.0
                c = c + np.sum(y) * 0.1
        return c

    def f(x):
        c = x[:3] * 1.0 if vector else x[0] * 1.0
        for i in range(n):
            c = step(c, x, i)
            for j in range(nested):
                c = c + np.cos(c * x[j]) * 0.1
        return np.sum(c * c)

    return f


def rolled_loops_of(tape) -> list:
    return [ins for ins in tape.instructions if ins.prim is rolling.rolled_loop_p]


def index_at(parts: list, t: int) -> tuple:
    """A driver's index parts in iteration t."""

    def at(x):
        return x[1] + t * x[2] if isinstance(x, tuple) else x

    return tuple(
        slice(*(at(b) for b in p[1:])) if isinstance(p, tuple) and p[0] == "slice" else at(p)
        for p in parts
    )


def run_like_the_driver(loop: rolling.RolledLoop, args: tuple) -> tuple:
    """The loop's outputs computed as the native driver computes them, with the step tape's
    program on the numpy backend instead of a Numba kernel."""
    stepped = rolling.step_tape(loop, args)
    run = NumpyLowered(step_program(stepped.tape, stepped.tape.inputs, roll=False)).run
    n_carry = len(loop.carries)
    carry = [np.array(args[m], copy=True) for m, _ in loop.carries]
    stacked: list[list] = [[] for _ in loop.outputs]
    for t in range(loop.trips):
        inputs = []
        for source in stepped.sources:
            kind = source[0]
            if kind == "carry":
                inputs.append(carry[source[1]])
            elif kind == "in":
                inputs.append(args[source[1]])
            elif kind == "row":
                inputs.append(np.asarray(args[source[1]])[t])
            elif kind == "view":
                inputs.append(np.asarray(args[source[1]])[index_at(source[2], t)])
            else:
                inputs.append(np.int64(source[1] + t * source[2]))
        results = run(*inputs, None)
        results = results if isinstance(results, tuple) else (results,)
        for c in range(n_carry):
            if c not in stepped.accumulators:
                carry[c] = np.array(results[c], copy=True)
        for c, entries in stepped.accumulators.items():
            for parts, position in entries:
                carry[c][index_at(parts, t)] += results[position]
        for i, value in enumerate(results[n_carry : n_carry + len(loop.outputs)]):
            stacked[i].append(np.array(value, copy=True))
    producers = {kj: c for c, (_, kj) in enumerate(loop.carries)}
    outputs = []
    for i, (kind, k, j) in enumerate(loop.outputs):
        if kind == "last" and (k, j) in producers:
            outputs.append(carry[producers[(k, j)]])
        elif kind == "last":
            outputs.append(stacked[i][-1])
        else:
            outputs.append(np.stack(stacked[i]))
    return tuple(outputs)


_SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@settings(max_examples=40, **_SETTINGS)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=4),
    n=st.integers(4, 10),
    vector=st.booleans(),
    nested=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_the_step_tape_walked_like_the_driver_gives_the_loop_results(ops, n, vector, nested, seed):
    f = make_loop(ops, n, vector, nested)
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, 3 * n + 6)
    tape = rolling.roll_tape(gt.trace(gt.value_and_grad(f), x))
    loops = rolled_loops_of(tape)
    if n >= 8:
        assert loops
    for ins in loops:
        try:
            rolling.step_tape(ins.params["loop"], ins.args)
        except rolling.NotSteppable as exc:
            assert "Python scalar" in str(exc), exc  # (the documented gap)
            continue
        want = ins.params["loop"].run(ins.args)
        got = run_like_the_driver(ins.params["loop"], ins.args)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_gradients_of_indexed_reads_are_added_in_place():
    """The backward pass's scatter into x's gradient at position i is an accumulator: the
    driver adds into one buffer instead of copying the gradient every iteration."""

    def f(x):
        s = 0.0
        for i in range(12):
            s = s + np.sin(x[i]) * x[i + 1]
        return s

    x = np.linspace(0.1, 1.0, 14)
    tape = rolling.roll_tape(gt.trace(gt.value_and_grad(f), x))
    found = 0
    for ins in rolled_loops_of(tape):
        stepped = rolling.step_tape(ins.params["loop"], ins.args)
        found += len(stepped.accumulators)
        assert not any(
            i.prim.name in ("scatter_add", "dyn_scatter_add") for i in stepped.tape.instructions
        )
    assert found >= 1


def test_a_nested_loop_is_unrolled_inside_the_step():
    def f(x):
        s = 0.0
        for i in range(10):
            for j in range(5):
                s = s + np.sin(x[i] * x[j])
        return s

    x = np.linspace(0.1, 1.0, 12)
    tape = rolling.roll_tape(gt.trace(gt.value_and_grad(f), x))
    outer = [
        ins
        for ins in rolled_loops_of(tape)
        if any(s.prim is rolling.rolled_loop_p for s in ins.params["loop"].steps)
    ]
    assert outer
    for ins in outer:
        stepped = rolling.step_tape(ins.params["loop"], ins.args)
        assert not any(i.prim is rolling.rolled_loop_p for i in stepped.tape.instructions)
        for a, b in zip(
            run_like_the_driver(ins.params["loop"], ins.args), ins.params["loop"].run(ins.args)
        ):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_a_body_too_long_to_unroll_is_refused(monkeypatch):
    monkeypatch.setattr(rolling, "MAX_STEP_INSTRUCTIONS", 10)

    def f(x):
        s = 0.0
        for i in range(10):
            for j in range(6):
                s = s + np.sin(x[i] * x[j])
        return s

    x = np.linspace(0.1, 1.0, 12)
    tape = rolling.roll_tape(gt.trace(gt.value_and_grad(f), x))
    with pytest.raises(rolling.NotSteppable, match="longer than 10"):
        for ins in rolled_loops_of(tape):
            rolling.step_tape(ins.params["loop"], ins.args)


# --- the native driver -------------------------------------------------------------------------
def native_loops(cf, x) -> list:
    lowered = cf.lowered(x)
    return [
        loop
        for ins_id, loop in lowered.generated.loops.items()
        if loop.prim is rolling.rolled_loop_p
    ]


def compiled(f, x, backend: str, roll: bool, monkeypatch):
    monkeypatch.setenv(config.ROLL, "1" if roll else "0")
    memo.forget_all()  # (compile remembers f: the setting is read when a program is built)
    cf = gt.compile(f, backend=backend)
    return cf, cf(x)


def check_native_agrees(f, x, monkeypatch, expect_native: bool = True):
    vg = gt.value_and_grad(f)
    eager = vg(x)
    cf, native = compiled(vg, x, "numba", True, monkeypatch)
    _, interpreted = compiled(vg, x, "numpy", True, monkeypatch)
    _, unrolled = compiled(vg, x, "numpy", False, monkeypatch)
    tol = 1e-12 if np.asarray(eager[1]).dtype == np.float64 else 1e-5
    for results in (native, interpreted, unrolled):
        for a, b in zip(results, eager):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)
            assert np.asarray(a).dtype == np.asarray(b).dtype
    loops = native_loops(cf, x)
    if expect_native:
        assert loops
        assert all(loop.native for loop in loops), [loop.reason for loop in loops]
    return cf


@pytest.mark.native
@settings(max_examples=12, **_SETTINGS)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=3),
    n=st.integers(8, 12),
    vector=st.booleans(),
    nested=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_generated_loops_native_rolled_unrolled_and_numpy_agree(
    ops, n, vector, nested, seed, monkeypatch
):
    f = make_loop(ops, n, vector, nested)
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, 3 * n + 6)
    check_native_agrees(f, x, monkeypatch, expect_native="branch" not in ops)


@pytest.mark.native
def test_carried_vector_state_and_float32(monkeypatch):
    def f(x):
        h = x[:4] * np.float32(1.0)
        for i in range(16):
            h = np.tanh(h * x[i] + np.float32(0.1)) + x[i + 4 : i + 8] * np.float32(0.5)
        return np.sum(h * h)

    check_native_agrees(f, np.linspace(0.1, 0.9, 24, dtype=np.float32), monkeypatch)


@pytest.mark.native
def test_value_dependent_branches_take_other_variants(monkeypatch):
    """A branch on a value inside the body is checked for every iteration after the native
    loop: an input whose iterations go another way is recorded as another variant."""

    def f(x):
        s = 0.0
        for i in range(12):
            if x[i] > 0:
                s = s + np.sin(x[i])
            else:
                s = s - x[i] * x[i]
        return s

    rng = np.random.default_rng(3)
    monkeypatch.setenv(config.ROLL, "1")
    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    for x in (np.abs(rng.standard_normal(14)), -np.abs(rng.standard_normal(14))):
        for _ in range(2):
            for a, b in zip(cf(x), gt.value_and_grad(f)(x)):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        assert all(loop.native for loop in native_loops(cf, x))
    mixed = rng.standard_normal(14)
    for a, b in zip(cf(mixed), gt.value_and_grad(f)(mixed)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.native
def test_a_new_trip_count_reuses_the_driver(monkeypatch):
    def loop_of(n):
        def f(x):
            s = 0.0
            for i in range(n):
                s = s + np.sin(x[i]) * x[i + 1]
            return s

        return f

    modules = []
    for n in (20, 33):
        x = np.linspace(0.1, 1.0, n + 1)
        cf = check_native_agrees(loop_of(n), x, monkeypatch)
        modules.append(sorted(loop.spec.module for loop in native_loops(cf, x)))
    assert modules[0] == modules[1]
