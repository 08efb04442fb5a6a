"""The VJP and JVP of one recorded call, for rules whose derivative is itself a tape.

A loop's step, the backward loop of a scan and a custom_jvp rule are differentiated the
same way: open a differentiating level, wrap the inputs that have a derivative as its
Tracers, run the code (a recorded tape evaluated again, or a user's rule), then run that
level's tape backwards from output cotangents or push input tangents through it, and read
off the values of this level. `linearize` does it once for all of them. `record_step_vjp`
stages the VJP of a loop body's step as a tape of its own, which the backends lower.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..core.interpret import eval_tape
from ..core.ir import Tape
from ..core.tracing import Level, LevelKind, Tracer, new_level
from ..rules._util import dtype_of, shape_of
from .forward import forward
from .reverse import backward


class Linearized:
    """A call recorded on its own differentiating level, ready for its VJP and JVP.

    `level` is that (closed) level; `invars` holds, per input, its Var at `level` (None when
    the input is not differentiated), taken when the input was wrapped: a call that writes
    into an input is differentiated with respect to the value it was given. `outputs` is
    what the call returned.
    """

    __slots__ = ("level", "invars", "outputs")

    def __init__(self, level: Level, invars: list, outputs: list):
        self.level = level
        self.invars = invars
        self.outputs = outputs

    def values(self) -> list:
        """The outputs as the caller sees them: the values one level below `level`."""
        level = self.level
        return [o._value if type(o) is Tracer and o._level is level else o for o in self.outputs]

    def vjp(self, cotangents: Sequence) -> list:
        """The cotangent of each input given one cotangent per output (None: zero).

        An entry is None where the input is not differentiated or gets no cotangent (it does
        not reach a differentiated output).
        """
        level = self.level
        outvars = [
            o._var if type(o) is Tracer and o._level is level else None for o in self.outputs
        ]
        if all(v is None for v in outvars):  # no output depends on a differentiated input
            return [None] * len(self.invars)
        got = backward(level.tape, outvars, cotangents)
        return [None if v is None else got.get(v.id) for v in self.invars]

    def jvp(self, tangents: Sequence) -> list:
        """The tangent of each output given one tangent per input (None: zero).

        An entry is None where the output does not depend on a differentiated input with a
        tangent. Tangents of inputs that are not differentiated are ignored.
        """
        level = self.level
        seeds = {v.id: t for v, t in zip(self.invars, tangents) if v is not None and t is not None}
        got = forward(level.tape, seeds)
        return [
            got.get(o._var.id) if type(o) is Tracer and o._level is level else None
            for o in self.outputs
        ]


def linearize(
    fn: Callable, inputs: Sequence, differentiate: Sequence[bool] | None = None
) -> Linearized:
    """Record `fn(*inputs)` on a new differentiating level.

    Args:
        fn: called once with the inputs (differentiated ones as Tracers of the new level);
            returns a sequence of outputs (arrays, Tracers or constants).
        inputs: the values to call `fn` at; they may be Tracers of outer levels (the
            derivative rules are then recorded there, so the result can be differentiated or
            compiled again).
        differentiate: per input, whether it gets a derivative; by default the float and
            complex inputs do, and the others (integers, booleans) are passed as they are.

    Returns:
        A `Linearized`: `.values()` are the outputs, `.vjp(cotangents)` and `.jvp(tangents)`
        the derivatives.

    Raises:
        Whatever `fn` raises (a `GuardFailure` when a recorded tape takes another path).
    """
    if differentiate is None:
        differentiate = [dtype_of(x).kind in "fc" for x in inputs]
    with new_level(LevelKind.DIFFERENTIATE) as level:
        traced = [level.new_input(x) if d else x for x, d in zip(inputs, differentiate)]
        invars = [t._var if d else None for t, d in zip(traced, differentiate)]
        outputs = list(fn(*traced))
    return Linearized(level, invars, outputs)


def _zero_cotangent(x) -> np.ndarray:
    """Zeros shaped like `x`: its dtype for floats, float64 for integers and booleans."""
    dt = dtype_of(x)
    return np.zeros(shape_of(x), dt if dt.kind in "fc" else np.float64)


def record_step_vjp(
    tape: Tape, guards: dict, inputs: Sequence, caps: Sequence, cts: Sequence
) -> Tape:
    """The VJP of one step of a loop body, recorded as a tape on a staging level.

    Args:
        tape: the body's recorded tape (inputs, then the outer values it captured).
        guards: its guards by var id (`core.interpret.guards_by_var`).
        inputs, caps, cts: example values of the step's inputs, its captured values and the
            cotangents of its outputs; the recording is made at them.

    Returns:
        A tape from (inputs, caps, output cotangents) to (input cotangents, capture
        cotangents), carrying the step's guards; a cotangent that is identically zero is a
        constant output (float64 zeros for integer and boolean inputs).

    Raises:
        GuardFailure: the example takes another path through the body than `tape`.
    """
    with new_level(LevelKind.STAGE) as stage:
        s_in = [stage.new_input(np.asarray(x)) for x in inputs]
        s_caps = [stage.new_input(np.asarray(c)) for c in caps]
        s_cts = [stage.new_input(np.asarray(g)) for g in cts]
        n = len(s_in)
        step = linearize(lambda *a: eval_tape(tape, a[:n], a[n:], guards), s_in + s_caps)
        results = [
            g if g is not None else _zero_cotangent(x)
            for g, x in zip(step.vjp(s_cts), s_in + s_caps)
        ]
    stage.tape.outputs = [
        o._var if type(o) is Tracer and o._level is stage else np.asarray(o) for o in results
    ]
    return stage.tape
