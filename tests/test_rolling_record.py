"""Recording a Python loop and rolling it: runs broken by a different iteration, uneven
slices, and the recorder's work per instruction counted (never timed).

* Hypothesis generates loops whose iterations repeat one body except where they do not: an
  iteration in the middle applies another operation, reads a slice whose length grows with
  the counter, or branches on a value. Rolled and unrolled programs give the eager values and
  gradients, and a run on either side of the different iteration still rolls when it is long.
* The recorder's work per recorded instruction (Python function calls, and the Instruction,
  Var and Tracer objects it creates) is the same at 100 and 2,000 iterations, and the
  search's signature of each instruction is computed once for all its passes.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape import config
from gradtape.compile import BACKENDS, memo, register_backend, rolling
from gradtape.core import ir, tracing

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
    register_backend("record-rolled-2", _recording_lower)
    yield
    del BACKENDS["record-rolled-2"]


def compiled(f, x, roll: bool, monkeypatch):
    """(compile(f)(x) with rolling on or off, the Program it lowered)."""
    monkeypatch.setenv(config.ROLL, "1" if roll else "0")
    memo.forget_all()  # compile remembers f: the setting is read when a program is built
    before = len(_PROGRAMS)
    result = gt.compile(f, backend="record-rolled-2")(x)
    assert len(_PROGRAMS) == before + 1
    return result, _PROGRAMS[-1]


def loop_trips(prog) -> list[int]:
    return [
        ins.params["loop"].trips for ins in prog.instructions if ins.prim is rolling.rolled_loop_p
    ]


# --- runs broken by a different iteration ---------------------------------------------------
BREAKS = ("other_op", "growing_slice", "branch", "extra_op")


def broken_loop(n: int, at: int, kind: str, vector: bool):
    """A loop of n iterations of one body, except iteration `at` (see BREAKS)."""

    def f(x):
        c = x[:3] * 1.0 if vector else x[0] * 1.0
        for i in range(n):
            if i == at and kind == "other_op":
                c = np.cos(c) * x[i + 1]
            elif i == at and kind == "growing_slice":  # x[: i + 1]: a length of its own
                c = np.sin(c) * x[i + 1] + np.sum(x[: i + 1]) * 0.01
            elif i == at and kind == "extra_op":
                c = np.tanh(np.sin(c) * x[i + 1])
            else:
                c = np.sin(c) * x[i + 1]
            if kind == "branch" and np.all(c > 0.0):  # a guard in every iteration
                c = c + 0.5
            else:
                c = c - 0.25 * x[i]
        return np.sum(c * c)

    return f


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n=st.integers(9, 24),
    where=st.floats(0.0, 1.0),
    kind=st.sampled_from(BREAKS),
    vector=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_run_broken_by_a_different_iteration_rolls_around_it_and_agrees(
    n, where, kind, vector, seed, monkeypatch
):
    at = min(n - 1, int(where * n))
    f = broken_loop(n, at, kind, vector)
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, n + 3)
    vg = gt.value_and_grad(f)
    want = vg(x)
    rolled, prog = compiled(vg, x, True, monkeypatch)
    unrolled, prog_off = compiled(vg, x, False, monkeypatch)
    for got in (rolled, unrolled):
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)
    assert not loop_trips(prog_off)
    if kind != "branch" and max(at, n - 1 - at) >= 2 * rolling.MIN_TRIPS:
        # the longer side of the different iteration is a run of one body: it rolls (the
        # forward and the backward pass), and no loop spans the different iteration
        trips = loop_trips(prog)
        assert trips, (n, at, kind)
        assert max(trips) < n


@pytest.mark.parametrize("kind", BREAKS)
def test_a_rolled_program_with_a_broken_run_replays_on_new_inputs(kind, monkeypatch):
    """The program rolled around the different iteration, replayed on other inputs, gives the
    eager numbers (its checks send another path to another variant)."""
    f = broken_loop(16, 7, kind, True)
    monkeypatch.setenv(config.ROLL, "1")
    cf = gt.compile(gt.value_and_grad(f), backend="record-rolled-2")
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.uniform(-1.0, 1.0, 19)
        for a, b in zip(cf(x), gt.value_and_grad(f)(x)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


# --- the recorder's work per instruction -------------------------------------------------
def _pendulum_loop(steps: int):
    def f(x):
        theta, omega = x[:4] * 1.0, np.zeros(4)
        for _ in range(steps):
            difference = theta[1:] - theta[:-1]
            coupling = np.concatenate((difference, [0.0])) - np.concatenate(([0.0], difference))
            omega = omega + 0.01 * (-np.sin(theta) + x[4] * coupling)
            theta = theta + 0.01 * omega
        return np.sum(theta * theta)

    return f


_COUNTED = {
    "instructions": ir.Instruction.__init__.__code__,
    "vars": ir.Var.__init__.__code__,
    "tracers": tracing.Tracer.__init__.__code__,
    "binds": tracing.bind.__code__,
}


def _recording_work(steps: int) -> dict:
    """Per instruction of the staged tape of value_and_grad of the loop: Python function calls
    made while recording it, and the calls of the constructors and of bind among them."""
    x = np.linspace(0.1, 0.9, 5)
    f = gt.value_and_grad(_pendulum_loop(steps))
    gt.trace(gt.value_and_grad(_pendulum_loop(2)), x)  # (imports and caches filled first)
    counts = dict.fromkeys(["calls", *_COUNTED], 0)
    counted = {code: name for name, code in _COUNTED.items()}

    def note(frame, event, arg):
        if event == "call":
            counts["calls"] += 1
            name = counted.get(frame.f_code)
            if name is not None:
                counts[name] += 1

    sys.setprofile(note)
    try:
        tape = gt.trace(f, x)
    finally:
        sys.setprofile(None)
    length = len(tape.instructions)
    return {name: count / length for name, count in counts.items()}


def test_the_recorder_does_the_same_work_per_instruction_from_100_to_2000_iterations():
    small, large = _recording_work(100), _recording_work(2000)
    for what, per_instruction in large.items():
        assert per_instruction <= small[what] * 1.02 + 0.01, (what, small, large)
    # one Instruction and one Var per recorded instruction at the staged level, and about as
    # many again for the differentiated level's forward pass (not more: nothing is copied)
    assert 1.0 <= large["instructions"] < 2.0, large
    assert large["vars"] < 2.1, large


def test_each_signature_is_computed_once_and_kept_on_its_instruction():
    x = np.linspace(0.1, 0.9, 5)
    tape = gt.trace(gt.value_and_grad(_pendulum_loop(40)), x)
    signatures = rolling._Signatures()
    codes = [signatures.code(ins) for ins in tape.instructions]
    assert signatures.computed == len(tape.instructions)
    assert [signatures.code(ins) for ins in tape.instructions] == codes
    assert signatures.computed == len(tape.instructions)  # (read back, not computed again)
    # another search computes its own codes: a code is kept with its search's serial
    other = rolling._Signatures()
    other_codes = [other.code(ins) for ins in tape.instructions]
    assert other.computed == len(tape.instructions)
    assert len(set(codes)) == len(set(other_codes))
