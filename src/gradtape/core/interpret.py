"""Evaluate a recorded tape on new inputs by binding its instructions again.

On plain arrays this runs NumPy directly; on Tracers every instruction is
recorded at their level, so an evaluated tape can itself be differentiated.
Guards are checked as soon as the value they name is computed.
"""

from __future__ import annotations

import operator

import numpy as np

from .errors import GradtapeError, GuardFailure
from .ir import Guard, Tape, Var
from .tracing import bind, differentiated


def _concrete(x):
    while hasattr(x, "_level"):
        x = x._value
    return x


_ASK = {
    "bool": bool,
    "int": int,
    "index": operator.index,
    "item": lambda v: v.item(),
}


def guard_holds(guard: Guard, value) -> tuple[bool, object]:
    """Ask `value` what the guard asked while recording; True if it answers the same.

    Raises GradtapeError when the guard turned a float value into Python numbers (`.item()`,
    `.tolist()` in a loop body) and that value is now being differentiated: the recorded
    body used the numbers as constants, so its derivative would miss their part."""
    if guard.kind in ("item", "value") and guard.var.dtype.kind in "fc" and differentiated(value):
        call = ".item()" if guard.kind == "item" else ".tolist()"
        raise GradtapeError(
            f"{call} turned a traced value into Python numbers in a loop body that is now "
            f"differentiated ({guard.where}): the gradient through them would be cut silently. "
            "Keep it an array (index it, x[0], instead of x[0].item()), or make the constant "
            "explicit with gradtape.stop_gradient(x)."
        )
    if guard.kind == "value":
        if getattr(getattr(value, "_level", None), "batch_size", None) is not None:
            value = np.asarray(value.tolist())  # a member of a vmap batch: the same for all
        got = np.asarray(_concrete(value))
        answer = np.asarray(guard.answer)
        same = got.shape == answer.shape and bool(
            np.array_equal(got, answer, equal_nan=answer.dtype.kind in "fc")
        )
        return same, got
    got = _ASK[guard.kind](value)
    answer = guard.answer
    return got == answer or (got != got and answer != answer), got  # NaN answers NaN


def guards_by_var(tape: Tape) -> dict:
    out: dict = {}
    for g in tape.guards:
        out.setdefault(g.var.id, []).append(g)
    return out


def eval_tape(tape: Tape, inputs, captured=(), guards: dict | None = None) -> list:
    """The tape's outputs for new `inputs` (and new values of its captured outer values)."""
    env: dict = {}
    for v, x in zip(tape.inputs, inputs):
        env[v.id] = x
    for (v, _, _), x in zip(tape.captured, captured):
        env[v.id] = x
    if guards is None:
        guards = guards_by_var(tape)
    if guards:
        for v in tape.inputs:
            _check(guards, v, env[v.id])
    for ins in tape.instructions:
        args = tuple(a if v is None else env[v.id] for v, a in zip(ins.invars, ins.args))
        out = bind(ins.prim, args, ins.params)
        if ins.prim.multiple_results:
            for v, o in zip(ins.outvars, out):
                env[v.id] = o
                if guards:
                    _check(guards, v, o)
        else:
            v = ins.outvars[0]
            env[v.id] = out
            if guards:
                _check(guards, v, out)
    return [env[o.id] if isinstance(o, Var) else o for o in tape.outputs]


def _check(guards: dict, var: Var, value) -> None:
    for g in guards.get(var.id, ()):
        ok, got = guard_holds(g, value)
        if not ok:
            raise GuardFailure(g, got)
