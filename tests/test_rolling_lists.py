"""Rolled loops that read one array of a Python list per iteration, and the cost of the search.

`Qs[k]` in a loop over k, where `Qs` is a Python list of arrays (built from the input before
the loop, or closed over), is stacked once into one array before the loop, and iteration t
reads row t of it: the step tape a native driver runs takes the stack as one input, so such a
loop runs natively. Hypothesis generates list-reading bodies (items computed from x or
constant, scalar and matrix items, carried state, branches, nested loops, loops that stop
early); rolled, unrolled and eager results agree, and the step tape walked the way the native
driver walks it gives the rolled loop's results. A list whose items differ in shape stays
unrolled, with the same numbers.

The search's cost is checked by counting its work (instruction comparisons and body checks,
`_Roller.work`), not by timing: on a tape that repeats but does not roll (the backward pass
before the forward pass's values are stacked), the work per instruction does not grow with
the trip count.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_rolling import (  # (recording_backend: the module's autouse fixture, used here too)
    check_rolled_equals_unrolled,
    recording_backend,  # noqa: F401
    rolled_loops,
)
from test_rolling_native import check_native_agrees, rolled_loops_of, run_like_the_driver

import gradtape as gt
from gradtape import config
from gradtape.compile import memo, rolling


@pytest.fixture(autouse=True)
def roll_short_tapes(monkeypatch):
    """Every tape is searched (not only long ones): small cases suffice."""
    monkeypatch.setattr(rolling, "MIN_TAPE_LENGTH", 0)
    monkeypatch.setattr(rolling, "NATIVE_MIN_TAPE_LENGTH", 0)
    monkeypatch.setenv(config.ROLL, "1")
    memo.forget_all()


def check_steps_like_the_driver(f, x) -> int:
    """Every rolled loop of value_and_grad(f) at x has a step tape (no list read refuses it),
    and walking it as the native driver does gives the loop's results; returns how many
    loops were checked."""
    tape = rolling.roll_tape(gt.trace(gt.value_and_grad(f), x))
    checked = 0
    for ins in rolled_loops_of(tape):
        loop = ins.params["loop"]
        try:
            rolling.step_tape(loop, ins.args)
        except rolling.NotSteppable as exc:
            assert "Python scalar" in str(exc), exc  # (the one documented gap)
            continue
        for got, want in zip(run_like_the_driver(loop, ins.args), loop.run(ins.args)):
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
        checked += 1
    return checked


def make_list_loop(item_shape: tuple, n: int, from_x: bool, ops: list, nested: int, stop_at):
    """A function of x (length n + 4) whose loop over k reads items[k] of a Python list of
    n arrays of `item_shape` (computed from x before the loop, or constants closed over)."""
    rng = np.random.default_rng(n)
    constants = [rng.uniform(-1.0, 1.0, item_shape) for _ in range(n)]

    def f(x):
        if from_x:
            items = [np.exp(x[k] * 0.5) * constants[k] + x[k + 1] for k in range(n)]
        else:
            items = constants
        c = np.zeros(item_shape[-1:]) + x[0] if item_shape else x[0] * 1.0
        for k in range(n):
            if stop_at is not None and np.sum(c) > stop_at:
                break
            for op in ops:
                if op == "matvec" and len(item_shape) == 2:
                    c = np.tanh(items[k] @ c * 0.5) + x[k]
                elif op == "scale":
                    c = c * 0.5 + np.sum(items[k]) * x[k + 1]
                elif op == "twice":  # the same item read twice in one iteration
                    c = c + items[k] * items[k] * 0.1 if not item_shape[:-1] else c * 0.9
                elif op == "branch":
                    if np.sum(c) > 0.0:
                        c = c - 0.1 * np.sum(items[k])
                    else:
                        c = c + 0.2
            for j in range(nested):
                c = c + np.sin(c * x[j]) * 0.1
        return np.sum(c * c)

    return f


_SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@settings(max_examples=30, **_SETTINGS)
@given(
    item_shape=st.sampled_from([(), (3,), (2, 2), (3, 3)]),
    n=st.integers(5, 12),
    from_x=st.booleans(),
    ops=st.lists(st.sampled_from(["matvec", "scale", "twice", "branch"]), min_size=1, max_size=3),
    nested=st.integers(0, 2),
    stop_at=st.one_of(st.none(), st.floats(1.0, 20.0)),
    seed=st.integers(0, 2**16),
)
def test_list_reads_rolled_and_unrolled_agree_and_step_like_the_driver(
    item_shape, n, from_x, ops, nested, stop_at, seed, monkeypatch
):
    f = make_list_loop(item_shape, n, from_x, ops, nested, stop_at)
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, n + 4)
    check_rolled_equals_unrolled(f, x, monkeypatch)
    check_steps_like_the_driver(f, x)


def test_a_loop_reading_a_list_rolls_into_a_steppable_loop(monkeypatch):
    """The mixture's shape of loop: z = Qs[k] @ (d - means[k]) with lists built from x."""
    K, d = 12, 3

    def f(x):
        Qs = [np.diag(np.exp(x[k : k + d])) for k in range(K)]
        means = [x[k + 1 : k + 1 + d] for k in range(K)]
        data = np.linspace(-1.0, 1.0, d)
        terms = []
        for k in range(K):
            z = Qs[k] @ (data - means[k])
            terms.append(-0.5 * np.sum(z * z))
        t = np.stack(terms)
        return np.max(t) + np.log(np.sum(np.exp(t - np.max(t))))

    x = np.random.default_rng(0).uniform(-0.5, 0.5, K + d + 1)
    prog = check_rolled_equals_unrolled(f, x, monkeypatch, expect_rolled=True)
    assert any(ins.params["loop"].trips >= K - 1 for ins in rolled_loops(prog))
    assert check_steps_like_the_driver(f, x) >= 2  # (the forward and the backward loop)


@pytest.mark.native
def test_a_loop_reading_a_list_runs_on_the_native_driver(monkeypatch):
    items = [np.eye(3) * (1.0 + 0.1 * k) + 0.05 * k for k in range(16)]

    def f(x):
        c = x[:3] * 1.0
        for k in range(16):
            c = np.tanh(items[k] @ c) + x[k + 3] * 0.1
        return np.sum(c * c)

    check_native_agrees(f, np.linspace(-0.5, 0.7, 19), monkeypatch)


def test_a_list_whose_items_differ_in_shape_stays_unrolled(monkeypatch):
    sizes = [2, 3, 2, 3, 2, 3, 2, 3]
    constants = [np.linspace(0.5, 1.0, m) for m in sizes]

    def f(x):
        s = 0.0
        for k in range(len(sizes)):
            s = s + np.sum(np.sin(constants[k] * x[k]))
        return s

    x = np.linspace(0.1, 0.8, 8)
    prog = check_rolled_equals_unrolled(f, x, monkeypatch)
    for ins in rolled_loops(prog):  # (a loop of two iterations' worth may roll; never mixed)
        for row in ins.args:
            assert np.ndim(row) == 0 or np.shape(row)[1:] in ((), (2,), (3,), (8,))


# --- the search's cost ---------------------------------------------------------------------------
def time_steps(n: int):
    def f(x):
        theta, omega = x[:4] * 1.0, np.zeros(4)
        loss = 0.0
        for _ in range(n):
            omega = omega - 0.01 * np.sin(theta)
            theta = theta + 0.01 * omega
            loss = loss + (theta[0] - 0.5) ** 2
        return loss + np.sum(omega * omega)

    return f


def search_work(n: int) -> tuple[int, int]:
    """(work the search did over all its passes, instructions of the recorded tape)."""
    tape = gt.trace(gt.value_and_grad(time_steps(n)), np.linspace(0.1, 0.4, 4))
    work = 0
    original = rolling._Roller.run

    def counted(self):
        nonlocal work
        result = original(self)
        work += self.work
        return result

    rolling._Roller.run = counted
    try:
        rolled = rolling.roll_tape(tape)
    finally:
        rolling._Roller.run = original
    assert len(rolled.instructions) < 200  # (it rolls: forward and backward)
    return work, len(tape.instructions)


def test_the_search_does_work_linear_in_the_tape():
    """Each position of a region that repeats but does not roll used to cost a body check of
    p * MIN_TRIPS instructions; once every phase of a period is refused, the period is not
    tried again in that stretch."""
    small_work, small_length = search_work(100)
    large_work, large_length = search_work(800)
    assert large_length > 7 * small_length
    per_instruction_small = small_work / small_length
    per_instruction_large = large_work / large_length
    assert per_instruction_large <= 1.2 * per_instruction_small
    assert per_instruction_large < 8  # (a few comparisons per instruction, not a body each)
