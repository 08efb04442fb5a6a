"""The interpreter: a recorded tape evaluated again on new inputs (plain arrays or Tracers).

References are the traced functions themselves, called on the new inputs, and closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradtape as gt
from gradtape import GradtapeError
from gradtape.core import interpret, ir

F64 = np.dtype(np.float64)


def model(x, w):
    h = np.tanh(x @ w)
    sign, logdet = np.linalg.slogdet(np.eye(2) + np.outer(h[:2], h[:2]))
    return np.sum(h**2) * sign + logdet, 3.0


def test_a_tape_replays_on_new_inputs():
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=3)
    tape = gt.trace(model, x, w)
    assert any(len(ins.outvars) == 2 for ins in tape.instructions)  # slogdet: two results
    for _ in range(3):
        x2, w2 = rng.normal(size=(4, 3)), rng.normal(size=3)
        value, const = interpret.eval_tape(tape, [x2, w2])
        expected, _ = model(x2, w2)
        assert value == pytest.approx(expected, rel=1e-14)
        assert const == 3.0  # a constant output is passed through


def test_an_evaluated_tape_is_recorded_again_by_an_outer_level():
    x = np.linspace(0.1, 0.9, 4)
    tape = gt.trace(lambda x: np.sum(np.sin(x) * x), x)

    def replayed(x):
        return interpret.eval_tape(tape, [x])[0]

    x2 = np.linspace(-1.0, 1.0, 4)
    np.testing.assert_allclose(gt.grad(replayed)(x2), np.cos(x2) * x2 + np.sin(x2), rtol=1e-14)
    again = gt.trace(replayed, x2)
    assert [i.prim.name for i in again.instructions] == [i.prim.name for i in tape.instructions]
    assert again.instructions[-1].out == pytest.approx(np.sum(np.sin(x2) * x2), rel=1e-15)


def branching(x):
    if np.sum(x) > 1.0:
        return np.sum(x**2)
    return np.sum(x)


def test_a_failed_guard_names_the_guard_and_what_it_got():
    high, low = np.array([0.8, 0.9]), np.array([0.1, 0.2])
    tape = gt.trace(branching, high)
    assert interpret.eval_tape(tape, [np.array([2.0, 3.0])]) == [13.0]
    with pytest.raises(interpret.GuardFailure) as failure:
        interpret.eval_tape(tape, [low])
    assert failure.value.check is tape.guards[0]
    assert failure.value.actual is False
    assert "guard bool(" in str(failure.value) and "got False" in str(failure.value)


def test_guards_on_inputs_are_checked_before_any_instruction_runs():
    tape = gt.trace(lambda x, n: np.sin(x) * int(n), np.ones(2), np.array(2.0))
    assert tape.guards[0].var is tape.inputs[1]
    # an x no instruction can take: the guard on n must fail first
    with pytest.raises(interpret.GuardFailure):
        interpret.eval_tape(tape, ["not an array", np.array(3.0)])
    with pytest.raises(TypeError):
        interpret.eval_tape(tape, ["not an array", np.array(2.5)])
    np.testing.assert_allclose(interpret.eval_tape(tape, [np.zeros(2), np.array(2.9)])[0], 0.0)


def test_guards_can_be_grouped_once_and_reused():
    tape = gt.trace(lambda x: x * int(x[0]) + int(x[0] > 0) + x[1].item(), np.array([2.5, 1.0]))
    grouped = interpret.guards_by_var(tape)
    assert sorted(len(g) for g in grouped.values()) == [1, 1, 1]
    assert sum(map(len, grouped.values())) == len(tape.guards) == 3
    np.testing.assert_allclose(
        interpret.eval_tape(tape, [np.array([2.25, 1.0])], guards=grouped)[0], [6.5, 4.0]
    )
    with pytest.raises(interpret.GuardFailure):  # x[1].item() was 1.0
        interpret.eval_tape(tape, [np.array([2.25, 2.0])], guards=grouped)
    # without guards (an empty grouping) nothing is checked: the recorded path runs, with the
    # Python values it was given (2 * x + 1 + 1.0)
    np.testing.assert_allclose(
        interpret.eval_tape(tape, [np.array([-3.5, 2.0])], guards={})[0], [-5.0, 6.0]
    )


def test_captured_values_are_bound_like_inputs():
    sin = gt.trace(np.sin, np.ones(2)).instructions[0].prim
    add = gt.trace(np.add, np.ones(2), np.ones(2)).instructions[0].prim
    t = ir.Tape()
    a, c, b, d = (ir.Var(i, (2,), F64) for i in range(4))
    t.inputs, t.captured = [a], [(c, None, None)]
    t.instructions = [
        ir.Instruction(sin, (a,), (None,), {}, (b,), None),
        ir.Instruction(add, (b, c), (None, None), {}, (d,), None),
    ]
    t.outputs = [d]
    x, captured = np.array([0.5, 1.0]), np.array([10.0, 20.0])
    (out,) = interpret.eval_tape(t, [x], captured=[captured])
    np.testing.assert_allclose(out, np.sin(x) + captured, rtol=1e-15)


def guard(kind, answer, shape=()):
    return ir.Guard(ir.Var(0, shape, F64), kind, answer, "here")


@pytest.mark.parametrize(
    "g, value, holds",
    [
        (guard("bool", True), np.array(2.0), True),
        (guard("bool", True), np.array(0.0), False),
        (guard("int", 3), np.array(3.9), True),
        (guard("int", 3), np.array(4.0), False),
        (guard("index", 2), np.array(2), True),
        (guard("index", 2), np.array(1), False),
        (guard("item", 0.5), np.array(0.5), True),
        (guard("item", 0.5), np.array(0.25), False),
        (guard("value", np.array([1.0, 2.0]), (2,)), np.array([1.0, 2.0]), True),
        (guard("value", np.array([1.0, 2.0]), (2,)), np.array([1.0, 2.5]), False),
        (guard("value", np.array([1.0, 2.0]), (2,)), np.array([[1.0, 2.0]]), False),  # shape
    ],
)
def test_guard_holds_asks_the_value_what_the_recording_asked(g, value, holds):
    ok, got = interpret.guard_holds(g, value)
    assert ok is holds
    if g.kind == "value":
        np.testing.assert_array_equal(got, value)
    else:
        assert got == {"bool": bool, "int": int, "index": int, "item": float}[g.kind](value)


def test_a_nan_answer_holds_for_nan():
    assert interpret.guard_holds(guard("item", float("nan")), np.array(np.nan))[0]
    nan_pair = np.array([np.nan, 1.0])
    assert interpret.guard_holds(guard("value", nan_pair, (2,)), nan_pair.copy())[0]


def test_a_scan_whose_body_reads_a_nan_item_replays_its_path():
    # the NaN guard holds at every step, so the one recorded path is replayed
    def f(c0, xs):
        return gt.scan(lambda c, x: (c * 2.0 + x.item(), None), c0, xs)[0]

    assert np.isnan(f(1.0, np.full(3, np.nan)))
    assert f(1.0, np.ones(3)) == 15.0


def test_item_in_a_loop_body_that_is_differentiated_is_refused():
    def f(xs):
        return gt.scan(lambda c, x: (c + x * x.item(), None), 0.0, xs)[0]

    assert f(np.array([1.0, 2.0])) == 5.0  # not differentiated: fine
    with pytest.raises(GradtapeError, match=r"\.item\(\).*loop body.*x \* x\.item\(\)"):
        gt.grad(f)(np.array([1.0, 2.0]))
    # the loop's backward pass differentiates every step input, so an item of data that is
    # not differentiated is refused too; stop_gradient says the constant on purpose
    with pytest.raises(GradtapeError, match="stop_gradient"):
        gt.grad(lambda c0, xs: gt.scan(lambda c, x: (c * x.item(), None), c0, xs)[0])(
            1.0, np.array([2.0, 3.0])
        )
    g = gt.grad(lambda c0, xs: gt.scan(lambda c, x: (c * gt.stop_gradient(x), None), c0, xs)[0])
    assert g(1.0, np.array([2.0, 3.0])) == 6.0
