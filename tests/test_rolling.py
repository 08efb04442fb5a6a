"""compile/rolling.py: Python loops recorded once per iteration, rolled back into loops.

Every case compiles the same function twice, with rolling on and off (GRADTAPE_ROLL), and
compares both with the eager result: rolled and unrolled programs give the same values and
gradients. Hypothesis generates loop bodies (carried state, scalar and vector carries,
windows and strided slices, value-dependent branches, nested loops, loops that stop early);
explicit cases check that rolling happens where it should (the program's length does not
grow with the trip count) and that a loop whose iterations differ stays unrolled.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape import config
from gradtape.compile import BACKENDS, memo, register_backend, rolling
from gradtape.compile.numba import fusion

_PROGRAMS: list = []


def _recording_lower(prog):
    _PROGRAMS.append(prog)
    return BACKENDS["numpy"](prog)


@pytest.fixture(autouse=True)
def roll_short_tapes(monkeypatch):
    """Every tape is searched (not only those beyond MIN_TAPE_LENGTH): small cases suffice."""
    monkeypatch.setattr(rolling, "MIN_TAPE_LENGTH", 0)
    monkeypatch.setattr(rolling, "NATIVE_MIN_TAPE_LENGTH", 0)


@pytest.fixture(scope="module", autouse=True)
def recording_backend():
    register_backend("record-rolled", _recording_lower)
    yield
    del BACKENDS["record-rolled"]


def compiled_program(f, x, roll: bool, monkeypatch):
    """(result of compile(f)(x) with rolling on or off, the Program it lowered)."""
    monkeypatch.setenv(config.ROLL, "1" if roll else "0")
    memo.forget_all()  # compile remembers f: the setting is read when a program is built
    cf = gt.compile(f, backend="record-rolled")
    before = len(_PROGRAMS)
    result = cf(x)
    assert len(_PROGRAMS) == before + 1
    return result, _PROGRAMS[-1]


def rolled_loops(prog) -> list:
    return [ins for ins in prog.instructions if ins.prim is rolling.rolled_loop_p]


def assert_same(a, b):
    for u, v in zip(a, b):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-12, atol=1e-12)


def check_rolled_equals_unrolled(f, x, monkeypatch, expect_rolled: bool | None = None):
    """value_and_grad of f: compiled rolled == compiled unrolled == eager; returns the
    rolled Program."""
    vg = gt.value_and_grad(f)
    eager = vg(x)
    rolled, prog = compiled_program(vg, x, True, monkeypatch)
    unrolled, prog_off = compiled_program(vg, x, False, monkeypatch)
    assert_same(rolled, eager)
    assert_same(unrolled, eager)
    assert not rolled_loops(prog_off)
    if expect_rolled is not None:
        assert bool(rolled_loops(prog)) == expect_rolled
    return prog


# --- explicit cases ------------------------------------------------------------------------------
def sum_of_products(n):
    def f(x):
        s = 0.0
        for i in range(n):
            s = s + np.sin(x[i]) * x[i + 1]
        return s

    return f


def test_a_loop_rolls_and_its_program_does_not_grow_with_the_trip_count(monkeypatch):
    sizes = []
    for n in (10, 40, 160):
        x = np.linspace(0.1, 2.0, n + 2)
        prog = check_rolled_equals_unrolled(sum_of_products(n), x, monkeypatch, True)
        sizes.append(len(prog.instructions))
    assert sizes[0] == sizes[1] == sizes[2], sizes
    # the unrolled program grows with n
    _, prog = compiled_program(gt.value_and_grad(sum_of_products(40)), x[:42], False, monkeypatch)
    assert len(prog.instructions) > 4 * 40


def test_the_backward_pass_rolls_too(monkeypatch):
    x = np.linspace(0.1, 2.0, 32)
    prog = check_rolled_equals_unrolled(sum_of_products(30), x, monkeypatch, True)
    loops = rolled_loops(prog)
    assert len(loops) >= 2  # the forward loop and the backward one
    assert all(ins.params["loop"].trips >= 20 for ins in loops)


def test_value_dependent_branches_stay_guarded(monkeypatch):
    def f(x):
        s = 0.0
        for i in range(12):
            if x[i] > 0:
                s = s + x[i] ** 2
            else:
                s = s - np.sin(x[i])
        return s

    x = np.linspace(0.5, 2.0, 12)  # every iteration takes the first branch: one rolled run
    check_rolled_equals_unrolled(f, x, monkeypatch, True)
    monkeypatch.setenv(config.ROLL, "1")
    cf = gt.compile(gt.value_and_grad(f), backend="record-rolled")
    cf(x)
    # iteration 7 goes the other way: the stacked check fails, another variant is recorded
    y = x.copy()
    y[7] = -1.0
    assert_same(cf(y), gt.value_and_grad(f)(y))
    assert_same(cf(x), gt.value_and_grad(f)(x))


def test_a_loop_that_stops_early(monkeypatch):
    def f(x):
        s = 0.0
        for i in range(len(x)):
            if s > 3.0:
                break
            s = s + x[i] * x[i]
        return s

    x = np.full(40, 0.3)
    check_rolled_equals_unrolled(f, x, monkeypatch, True)
    monkeypatch.setenv(config.ROLL, "1")
    cf = gt.compile(gt.value_and_grad(f), backend="record-rolled")
    cf(x)
    for y in (np.full(40, 0.5), np.full(40, 0.2), np.full(40, 0.3)):
        assert_same(cf(y), gt.value_and_grad(f)(y))


def test_constants_that_differ_per_iteration_keep_their_types(monkeypatch):
    def f(x):
        s = x[0] * 0
        for i in range(10):
            s = s + x * (0.5 * i) + float(i)
        return np.sum(s**2)

    x = np.linspace(0.1, 1.0, 5).astype(np.float32)
    prog = check_rolled_equals_unrolled(f, x, monkeypatch, True)
    assert prog.outputs[0].dtype == np.float32


def test_iterations_that_differ_stay_unrolled(monkeypatch):
    def f(x):
        s = 0.0
        for i in range(8):
            s = s + (np.sin(x[i]) if i % 3 else np.cos(x[i]))
        return s

    x = np.linspace(0.1, 2.0, 8)
    check_rolled_equals_unrolled(f, x, monkeypatch)


def test_nested_loops_roll_into_a_loop_of_loops(monkeypatch):
    def f(x):
        total = 0.0
        for i in range(6):
            acc = x[i] * 0.0
            for j in range(5):
                acc = acc + np.tanh(x[i] * x[j] + 0.1 * j)
            total = total + acc * acc
        return total

    x = np.linspace(-1.0, 1.0, 6)
    prog = check_rolled_equals_unrolled(f, x, monkeypatch, True)
    nested = [
        s
        for ins in rolled_loops(prog)
        for s in ins.params["loop"].steps
        if s.prim is rolling.rolled_loop_p
    ]
    assert nested, "the outer loop's body holds the inner loop"


def test_read_of_two_iterations_back_is_not_rolled_wrongly(monkeypatch):
    def f(x):
        a, b = x[0], x[1]
        for i in range(10):
            a, b = b, a * 0.5 + b * 0.25 + x[i]
        return a * b

    check_rolled_equals_unrolled(f, np.linspace(0.1, 1.0, 10), monkeypatch)


def test_rolling_turned_off_leaves_the_program_as_recorded(monkeypatch):
    x = np.linspace(0.1, 2.0, 22)
    _, prog = compiled_program(gt.value_and_grad(sum_of_products(20)), x, False, monkeypatch)
    assert not rolled_loops(prog)
    monkeypatch.setenv(config.ROLL, "off")
    assert not config.roll_enabled()
    monkeypatch.setenv(config.ROLL, "1")
    assert config.roll_enabled()


# --- generated loop bodies ---------------------------------------------------------------------
OPS = ("sin", "mul_x", "add_const", "tanh", "square", "branch", "window", "stride", "where")


def make_loop(ops: list, n: int, vector: bool, nested: int, stop_at: float | None):
    """A function of x (length 3n + 6) with a Python loop of n iterations running `ops`."""

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
                if np.all(c > 0.0):
                    c = c * 0.9
                else:
                    c = c + 1.0
            elif op == "window":
                c = c + np.sum(x[i : i + 3]) * 0.1
            elif op == "stride":
                c = c + x[2 * i] * 0.2
            elif op == "where":
                c = np.where(c > x[i], c - x[i], c * x[i])
        return c

    def f(x):
        c = x[:3] * 1.0 if vector else x[0] * 1.0
        for i in range(n):
            if stop_at is not None and np.sum(c) > stop_at:
                break
            c = step(c, x, i)
            for j in range(nested):
                c = c + np.cos(c * x[j]) * 0.1
        return np.sum(c * c)

    return f


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=4),
    n=st.integers(4, 12),
    vector=st.booleans(),
    nested=st.integers(0, 3),
    stop_at=st.one_of(st.none(), st.floats(0.5, 20.0)),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([np.float64, np.float32]),
)
def test_generated_loops_rolled_and_unrolled_agree(
    ops, n, vector, nested, stop_at, seed, dtype, monkeypatch
):
    f = make_loop(ops, n, vector, nested, stop_at)
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, 3 * n + 6).astype(dtype)
    vg = gt.value_and_grad(f)
    eager = vg(x)
    rolled, prog = compiled_program(vg, x, True, monkeypatch)
    unrolled, _ = compiled_program(vg, x, False, monkeypatch)
    if n >= 10 and stop_at is None:
        assert rolled_loops(prog)  # (a long enough loop that runs to its end always rolls)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for a, b, c in zip(rolled, unrolled, eager):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=tol, atol=tol)
        np.testing.assert_allclose(np.asarray(b), np.asarray(c), rtol=tol, atol=tol)
        assert np.asarray(a).dtype == np.asarray(c).dtype


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_generated_loops_replay_on_new_inputs(ops, seed, monkeypatch):
    """A rolled program replayed on other inputs (other branches, other stopping points)
    gives the eager numbers: its checks send new paths to new variants."""
    f = make_loop(ops, 8, False, 1, 4.0)
    rng = np.random.default_rng(seed)
    monkeypatch.setenv(config.ROLL, "1")
    cf = gt.compile(gt.value_and_grad(f), backend="record-rolled")
    for _ in range(3):
        x = rng.uniform(-1.0, 1.0, 30)
        got, want = cf(x), gt.value_and_grad(f)(x)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_the_search_refuses_ambiguous_params():
    """Negative indices that cross zero are not a progression of positions."""
    assert not rolling._progression_valid(("t", (("i",),)), [-2], [1], 4)
    assert rolling._progression_valid(("t", (("i",),)), [0], [1], 4)
    assert rolling._progression_valid(("t", (("i",),)), [-4], [1], 4)


# --- bounded kernels ---------------------------------------------------------------------------
def long_chain(k):
    def f(x):
        y = x
        for i in range(k):
            y = np.sin(y) * 1.0001 if i % 2 else y + 0.5 * x
        return np.sum(y)

    return f


def test_the_plan_of_a_long_program_has_bounded_loops_and_kernels(monkeypatch):
    monkeypatch.setenv(config.ROLL, "0")
    x = np.linspace(0.1, 1.0, 50)
    _, prog = compiled_program(gt.value_and_grad(long_chain(200)), x, False, monkeypatch)
    monkeypatch.setattr(fusion, "MAX_LOOP_MEMBERS", 16)
    monkeypatch.setattr(fusion, "MAX_KERNEL_MEMBERS", 40)
    from gradtape.compile.numba import codegen, lowering, scalar

    plan = fusion.plan(prog, scalar.fusable, lowering.lowerable)
    loops = [s for s in plan.stages if s.kind == fusion.LOOP]
    assert len(loops) > 1
    assert all(len(s.members) <= 16 for s in loops)
    assert plan.segments > 1
    for segment in range(plan.segments):
        members = sum(len(s.members) for s in plan.stages_of(segment))
        assert members <= 40 + 16
    generated = codegen.generate(prog)
    assert len(generated.kernels) == generated.plan.segments


@pytest.mark.native
def test_a_long_program_compiles_natively_in_bounded_kernels(monkeypatch):
    monkeypatch.setenv(config.ROLL, "0")
    monkeypatch.setattr(fusion, "MAX_LOOP_MEMBERS", 16)
    monkeypatch.setattr(fusion, "MAX_KERNEL_MEMBERS", 48)
    f = gt.value_and_grad(long_chain(60))
    x = np.linspace(0.1, 1.0, 50)
    cf = gt.compile(f, backend="numba")
    got, want = cf(x), f(x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    assert cf.source(x).count("\ndef kernel") > 1


@pytest.mark.native
def test_a_rolled_program_runs_on_the_numba_backend(monkeypatch):
    monkeypatch.setenv(config.ROLL, "1")
    f = gt.value_and_grad(sum_of_products(30))
    x = np.linspace(0.1, 2.0, 32)
    cf = gt.compile(f, backend="numba")
    got, want = cf(x), f(x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_short_tapes_stay_unrolled(monkeypatch):
    monkeypatch.setattr(rolling, "MIN_TAPE_LENGTH", 10_000)
    x = np.linspace(0.1, 2.0, 32)
    _, prog = compiled_program(gt.value_and_grad(sum_of_products(30)), x, True, monkeypatch)
    assert not rolled_loops(prog)


def test_backends_with_native_loops_roll_shorter_programs(monkeypatch):
    """A backend whose lower function says `native_loops` (the numba backend) gets programs
    rolled from NATIVE_MIN_TAPE_LENGTH on; the others from MIN_TAPE_LENGTH."""
    monkeypatch.setattr(rolling, "MIN_TAPE_LENGTH", 10_000)
    monkeypatch.setattr(rolling, "NATIVE_MIN_TAPE_LENGTH", 100)
    monkeypatch.setenv(config.ROLL, "1")

    def native_lower(prog):
        _PROGRAMS.append(prog)
        return BACKENDS["numpy"](prog)

    native_lower.native_loops = True
    register_backend("record-native-loops", native_lower)
    try:
        x = np.linspace(0.1, 2.0, 32)
        vg = gt.value_and_grad(sum_of_products(30))
        memo.forget_all()
        cf = gt.compile(vg, backend="record-native-loops")
        assert_same(cf(x), vg(x))
        assert rolled_loops(_PROGRAMS[-1])
        _, prog = compiled_program(vg, x, True, monkeypatch)
        assert not rolled_loops(prog)
    finally:
        del BACKENDS["record-native-loops"]


def test_the_collector_pause_is_shared_by_searches_and_leaves_the_users_setting():
    import gc

    from gradtape.core import collector

    assert gc.isenabled()
    with collector.collector_paused():
        assert not gc.isenabled()
        with collector.collector_paused():  # a second search (another thread) ends first
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.collector_paused():
            pass
        assert not gc.isenabled()  # the user's choice stands
    finally:
        gc.enable()
    # a forked child has none of the parent's searching threads: it resumes the collector
    collector._searches, collector._resume_collector = 1, True  # as another thread left it
    gc.disable()
    collector.renew_locks_after_fork()
    assert gc.isenabled() and collector._searches == 0


def test_full_collections_wait_while_a_staged_recording_runs_and_the_users_threshold_stands():
    import gc

    import gradtape as gt
    from gradtape.core import collector

    user = gc.get_threshold()
    seen = []

    def f(x):
        seen.append(gc.get_threshold())
        with collector.full_collections_paused():  # (a nested recording ends first)
            pass
        seen.append(gc.get_threshold())
        return np.sum(x * x)

    gt.trace(f, np.ones(3))
    assert seen[0][:2] == user[:2] and seen[0][2] > 10**6 and seen[1] == seen[0]
    assert gc.get_threshold() == user
    gt.grad(f)(np.ones(3))  # an eager gradient keeps every collection
    assert seen[-1] == user
    # a threshold the user sets during a recording stands
    with collector.full_collections_paused():
        gc.set_threshold(500, 10, 20)
    try:
        assert gc.get_threshold() == (500, 10, 20)
    finally:
        gc.set_threshold(*user)
    # a forked child restores the threshold the recordings of other threads had raised
    collector.pause_full_collections()
    collector.renew_locks_after_fork()
    assert gc.get_threshold() == user and collector._recordings == 0
    collector.resume_full_collections()  # (the parent's recording ending in the child)
    assert gc.get_threshold() == user


def test_a_forked_child_gets_a_new_lock_for_every_native_loop():
    from gradtape.compile.numba import loops
    from gradtape.core.primitive import Primitive

    loop = loops.NativeLoop(Primitive("a_loop", lambda x: x))
    held = loop._lock
    held.acquire()
    try:
        loops.renew_locks_after_fork()
        assert loop._lock is not held and loop._lock.acquire(blocking=False)
        loop._lock.release()
    finally:
        held.release()
