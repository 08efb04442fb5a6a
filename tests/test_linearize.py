"""The VJP and JVP of a recorded tape (transforms/linearize.py), the helper every loop rule and
custom_jvp's reverse rule go through: against gradtape's own grad/jvp of the same function and
against central differences, on a loop-body-like tape with a guard, a captured outer value and
an integer input."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad

import gradtape as gt
from gradtape.core.errors import GuardFailure
from gradtape.core.interpret import eval_tape, guards_by_var
from gradtape.core.tracing import LevelKind, Tracer, new_level
from gradtape.transforms.linearize import linearize, record_step_vjp

RNG = np.random.default_rng(7)


def step(x, k, w):
    """A loop body's step: a branch on the data (a guard), an integer input used as an index,
    an outer value `w`, a float output, a scalar output and an integer output."""
    if np.sum(x) > 0:
        y = np.sin(x) * w[k] + x * w
    else:
        y = x**2 * w - w[k]
    return [y, np.sum(y * w), k + 1]


def record_body(fn, inputs, caps):
    """`fn(*inputs, *caps)` recorded as a loop body: `caps` are traced values of an outer level,
    which the body level captures. Returns the tape (its inputs, then its captured values)."""
    with new_level(LevelKind.STAGE) as outer:
        outer_caps = [outer.new_input(np.asarray(c)) for c in caps]
        with new_level(LevelKind.LOOP_BODY) as level:
            traced = [level.new_input(np.asarray(x)) for x in inputs]
            outs = fn(*traced, *outer_caps)
        tape = level.tape
        tape.outputs = [
            o._var if type(o) is Tracer and o._level is level else level.capture(o)[0] for o in outs
        ]
    assert len(tape.captured) == len(caps)  # each outer value captured once, in order of use
    assert all(c[1] is o for c, o in zip(tape.captured, outer_caps))
    return tape


X0, K0, W0 = RNG.random(4) + 0.1, np.int64(2), RNG.random(4) + 0.5
TAPE = record_body(step, [X0, K0], [W0])
GUARDS = guards_by_var(TAPE)


def replay(x, k, w):
    """The recorded tape as a function of (input, integer input, captured value)."""
    return eval_tape(TAPE, [x, k], [w], GUARDS)


def test_the_tape_has_a_guard_and_a_capture():
    assert TAPE.guards and len(TAPE.captured) == 1
    with pytest.raises(GuardFailure):
        replay(-X0, K0, W0)


def test_values_are_the_step_outputs():
    x, w = RNG.random(4) + 0.2, RNG.random(4)
    lin = linearize(lambda *a: replay(*a), [x, K0, w])
    for got, want in zip(lin.values(), step(x, K0, w)):
        np.testing.assert_array_equal(got, want)


def _loss(gy, gs, k):
    """The scalar whose gradient is the VJP with cotangents (gy, gs) of the float outputs."""

    def loss(x, w):
        y, s, _ = step(x, k, w)
        return np.sum(gy * y) + gs * s

    return loss


@pytest.mark.parametrize("positive", [True, False])
def test_vjp_matches_grad_and_finite_differences(positive):
    tape = TAPE if positive else record_body(step, [-X0, K0], [W0])
    guards = guards_by_var(tape)
    x = (RNG.random(4) + 0.1) * (1 if positive else -1)
    w = RNG.random(4) + 0.5
    gy, gs = RNG.normal(size=4), RNG.normal()
    lin = linearize(lambda *a: eval_tape(tape, a[:2], a[2:], guards), [x, K0, w])
    g_x, g_k, g_w = lin.vjp([gy, gs, None])
    assert g_k is None  # an integer input is not differentiated
    loss = _loss(gy, gs, K0)
    want_x, want_w = gt.grad(loss, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(g_x, want_x, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(g_w, want_w, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(g_x, central_difference_grad(loss, [x, w], 0), rtol=1e-6)
    np.testing.assert_allclose(g_w, central_difference_grad(loss, [x, w], 1), rtol=1e-6)


def test_jvp_matches_jvp_and_finite_differences():
    x, w = RNG.random(4) + 0.1, RNG.random(4) + 0.5
    tx, tw = RNG.normal(size=4), RNG.normal(size=4)
    lin = linearize(lambda *a: replay(*a), [x, K0, w])
    t_y, t_s, t_k = lin.jvp([tx, None, tw])
    assert t_k is None  # the integer output has no tangent

    def float_outputs(x, w):
        y, s, _ = step(x, K0, w)
        return y, s

    _, (want_y, want_s) = gt.jvp(float_outputs, (x, w), (tx, tw))
    np.testing.assert_allclose(t_y, want_y, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(t_s, want_s, rtol=1e-14, atol=1e-15)
    h = 1e-6
    hi, lo = float_outputs(x + h * tx, w + h * tw), float_outputs(x - h * tx, w - h * tw)
    np.testing.assert_allclose(t_y, (hi[0] - lo[0]) / (2 * h), rtol=1e-6)
    np.testing.assert_allclose(t_s, (hi[1] - lo[1]) / (2 * h), rtol=1e-6)


def test_jvp_and_vjp_agree():
    """<vjp(ct), t> == <ct, jvp(t)>: both read the same recording."""
    x, w = RNG.random(4) + 0.1, RNG.random(4) + 0.5
    lin = linearize(lambda *a: replay(*a), [x, K0, w])
    tx, tw, gy, gs = RNG.normal(size=4), RNG.normal(size=4), RNG.normal(size=4), RNG.normal()
    g_x, _, g_w = lin.vjp([gy, gs, None])
    t_y, t_s, _ = lin.jvp([tx, None, tw])
    np.testing.assert_allclose(g_x @ tx + g_w @ tw, gy @ t_y + gs * t_s, rtol=1e-12)


def test_another_path_raises_guard_failure():
    with pytest.raises(GuardFailure):
        linearize(lambda *a: replay(*a), [-X0, K0, W0])


def test_differentiate_selects_the_inputs():
    x, w = RNG.random(4) + 0.1, RNG.random(4) + 0.5
    lin = linearize(lambda *a: replay(*a), [x, K0, w], differentiate=[False, False, True])
    g_x, g_k, g_w = lin.vjp([np.ones(4), 1.0, None])
    assert g_x is None and g_k is None
    want = gt.grad(_loss(np.ones(4), 1.0, K0), argnums=1)(x, w)
    np.testing.assert_allclose(g_w, want, rtol=1e-14)
    t_y, t_s, _ = lin.jvp([np.ones(4), None, None])  # x is a constant here: no tangent
    assert t_y is None and t_s is None


def test_no_output_depends_on_a_differentiated_input():
    lin = linearize(lambda x, k: [k * 2, np.zeros(3)], [np.ones(3), K0])
    assert lin.vjp([1.0, np.ones(3)]) == [None, None]
    assert lin.jvp([np.ones(3), None]) == [None, None]


def test_float32_cotangents_keep_the_dtype():
    x, w = (RNG.random(4) + 0.1).astype(np.float32), (RNG.random(4) + 0.5).astype(np.float32)
    lin = linearize(lambda *a: replay(*a), [x, K0, w])
    g_x, _, g_w = lin.vjp([np.ones(4, np.float32), np.float32(1), None])
    assert g_x.dtype == np.float32 and g_w.dtype == np.float32


def test_linearize_on_traced_inputs_is_differentiable_again():
    """On Tracers of an outer level the derivative rules are recorded there: the VJP itself
    has a gradient (a second derivative), checked against central differences."""
    w, gy = RNG.random(4) + 0.5, RNG.normal(size=4)

    def g_dot(x):
        g_x, _, _ = linearize(lambda *a: replay(*a), [x, K0, w]).vjp([gy, 0.0, None])
        return np.sum(g_x * np.cos(x))

    x = RNG.random(4) + 0.1
    np.testing.assert_allclose(gt.grad(g_dot)(x), central_difference_grad(g_dot, [x], 0), rtol=1e-6)


def test_a_call_that_writes_into_its_input_is_differentiated_at_that_input():
    def fn(x):
        y = 2.0 * x
        x[0] = 0.0  # x now names the written array
        return [y + x]

    x = np.array([1.0, 2.0, 3.0])
    lin = linearize(fn, [x])
    np.testing.assert_array_equal(lin.values()[0], [2.0, 6.0, 9.0])
    np.testing.assert_array_equal(x, [1.0, 2.0, 3.0])  # the caller's array is not written
    np.testing.assert_allclose(lin.vjp([np.ones(3)])[0], [2.0, 3.0, 3.0])
    np.testing.assert_allclose(lin.jvp([np.ones(3)])[0], [2.0, 3.0, 3.0])


def test_record_step_vjp_is_a_tape_of_the_vjp():
    x, w = RNG.random(4) + 0.1, RNG.random(4) + 0.5
    gy, gs = RNG.normal(size=4), RNG.normal()
    vjp_tape = record_step_vjp(TAPE, GUARDS, [x, K0], [w], [gy, gs, np.int64(0)])
    assert len(vjp_tape.inputs) == 2 + 1 + 3 and len(vjp_tape.outputs) == 3
    assert vjp_tape.guards  # the step's branch is checked by the VJP's replays too
    guards = guards_by_var(vjp_tape)
    # replayed at other values on the same path: the gradient there
    x2, w2 = RNG.random(4) + 0.1, RNG.random(4) + 0.5
    gy2, gs2 = RNG.normal(size=4), RNG.normal()
    g_x, g_k, g_w = eval_tape(vjp_tape, [x2, K0, w2, gy2, gs2, np.int64(0)], (), guards)
    want_x, want_w = gt.grad(_loss(gy2, gs2, K0), argnums=(0, 1))(x2, w2)
    np.testing.assert_allclose(g_x, want_x, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(g_w, want_w, rtol=1e-14, atol=1e-15)
    assert g_k.dtype == np.float64 and not np.any(g_k)  # the integer input: float zeros
    with pytest.raises(GuardFailure):
        eval_tape(vjp_tape, [-x2, K0, w2, gy2, gs2, np.int64(0)], (), guards)
    with pytest.raises(GuardFailure):  # an example on another path is not recorded
        record_step_vjp(TAPE, GUARDS, [-x, K0], [w], [gy, gs, np.int64(0)])
