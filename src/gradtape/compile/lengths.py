"""A new input length that records the same program: its program and lowered code reused.

A compiled function called with arrays of a length it has not seen records the function again
(Python may branch on the length, so the recording is what decides). When that recording is
the program recorded for another length with one length replaced by the other, everything
after the recording is the same too: the simplified Program, the buffer plan, the generated
source and the native kernels. This module decides that sameness and writes the Program for
the new length; the backends rebind their lowered code to it (`at_length`).

The rule that makes the replacement exact: every integer of the recording (each dimension of
each value, each integer in an operation's parameters, in a constant's shape and in a check's
answer) is either the old length, and then the new recording has the new length there, or
another number, and then the new recording has the same number there and that number is
neither length. So "equal to the length" means the same thing in both recordings, and every
decision made from shapes (a broadcast, an in-place buffer, a fused loop) comes out the same.
Lengths 0 and 1 are never replaced (broadcasting treats them apart). Constant arrays and
check answers must be equal element for element; a constant operand holding one repeated
value (a cotangent seed broadcast to the input's shape) may have the length in its shape,
since the Program, which is compared in full, folds it to one value.

Whether a program's lowering depends on the length in some other way is checked once per
program and length: the first new length is recorded, simplified and lowered in full and
compared with the rebinding (`matches`); only then are later lengths rebound.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.ir import Instruction, Tape, Var
from .program import Check, OutputLeaf, Program, answer_key


def length_change(key_a, key_b) -> tuple[int, int] | None:
    """(old, new) when signature `key_b` is `key_a` with one length replaced, else None.

    Keys are `dispatch` signature keys; only the positional-arrays form (a tuple of
    (shape, dtype) per argument) is considered."""
    if type(key_a) is not tuple or type(key_b) is not tuple or len(key_a) != len(key_b):
        return None
    old = new = None
    fixed: set = set()
    for leaf_a, leaf_b in zip(key_a, key_b):
        if type(leaf_a) is not tuple or type(leaf_b) is not tuple or len(leaf_a) != 2:
            return None
        (shape_a, dtype_a), (shape_b, dtype_b) = leaf_a, leaf_b
        if type(shape_a) is not tuple or dtype_a != dtype_b or len(shape_a) != len(shape_b):
            return None
        for da, db in zip(shape_a, shape_b):
            if da == db:
                fixed.add(da)
            elif old is None:
                old, new = da, db
            elif (da, db) != (old, new):
                return None  # two lengths changed
    if old is None or old < 2 or new < 2 or old in fixed or new in fixed:
        return None
    return old, new


def family_key(key):
    """What signatures that may differ by one length share: every dimension left out."""
    try:
        return tuple((len(shape), dtype) for shape, dtype in key)
    except (TypeError, ValueError):
        return None


# --- comparing two recordings ---------------------------------------------------------------
def _same_int(x: int, y: int, old: int, new: int, symbolic: bool) -> bool:
    if x == old:
        return symbolic and y == new
    return x == y and x != new


def _same_array(x: np.ndarray, y: np.ndarray, old: int, new: int) -> bool:
    if x.shape != y.shape or x.dtype != y.dtype or old in x.shape or new in x.shape:
        return False
    if x is y:
        return True
    return bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))


def same_value(x, y, old: int, new: int, symbolic: bool = True) -> bool:
    """Whether `y` (recorded at length `new`) is `x` (at `old`) with the length replaced:
    integers by the rule of the module docstring (`symbolic=False`: none replaced), arrays
    equal, anything else equal and of the same type."""
    t = type(x)
    if t is not type(y):
        return False
    if t is int or (isinstance(x, np.integer) and t is not np.bool_):
        return _same_int(int(x), int(y), old, new, symbolic)
    if t is tuple or t is list:
        return len(x) == len(y) and all(same_value(a, b, old, new, symbolic) for a, b in zip(x, y))
    if t is np.ndarray:
        return _same_array(x, y, old, new)
    if t is slice:
        return (
            same_value(x.start, y.start, old, new, symbolic)
            and same_value(x.stop, y.stop, old, new, symbolic)
            and same_value(x.step, y.step, old, new, symbolic)
        )
    if t is dict:
        return x.keys() == y.keys() and all(same_value(x[k], y[k], old, new, symbolic) for k in x)
    if t is float or isinstance(x, (np.floating, np.complexfloating)) or t is complex:
        return answer_key("item", x) == answer_key("item", y) and (x == y or (x != x and y != y))
    if x is y:
        return True
    try:
        return bool(x == y)
    except Exception:  # (an object whose == is not a truth value)
        return False


def _same_constant(x, y, old: int, new: int) -> bool:
    """Constant operands: equal, or arrays of one repeated value whose shapes differ by the
    length (a cotangent seed broadcast to the input's shape)."""
    if same_value(x, y, old, new, symbolic=False):
        return True
    return (
        type(x) is np.ndarray
        and type(y) is np.ndarray
        and x.dtype == y.dtype
        and x.size > 1
        and y.size > 1
        and same_value(x.shape, y.shape, old, new)
        and _one_value(x) is not None
        and answer_key("item", _one_value(x)) == answer_key("item", _one_value(y))
    )


def _one_value(a: np.ndarray):
    """The value every element of `a` holds, or None."""
    first = a.flat[0]
    if a.dtype.kind in "fc" and first != first:
        return first if np.isnan(a).all() else None
    return first if (a == first).all() else None


def _same_shape(xs: tuple, ys: tuple, old: int, new: int) -> bool:
    if xs == ys:  # (most values: no dimension is the length, or it did not change)
        return old not in xs and new not in xs
    if len(xs) != len(ys):
        return False
    for a, b in zip(xs, ys):
        if a == old:
            if b != new:
                return False
        elif a != b or a == new:
            return False
    return True


def _same_var(x: Var | None, y: Var | None, old: int, new: int) -> bool:
    if x is None or y is None:
        return x is y
    return x.id == y.id and x.dtype == y.dtype and _same_shape(x.shape, y.shape, old, new)


def _same_instructions(xs: list[Instruction], ys: list[Instruction], old: int, new: int) -> bool:
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if x.prim is not y.prim or len(x.invars) != len(y.invars):
            return False
        if len(x.outvars) != len(y.outvars):
            return False
        for vx, vy, ax, ay in zip(x.invars, y.invars, x.args, y.args):
            if vx is not None:
                if (
                    vy is None
                    or vx.id != vy.id
                    or vx.dtype != vy.dtype
                    or not _same_shape(vx.shape, vy.shape, old, new)
                ):
                    return False
            elif vy is not None:
                return False
            elif type(ax) is float and type(ay) is float and ax == ay and ax != 0.0:
                continue  # (the common constant: a nonzero float; 0.0 and -0.0 differ)
            elif not _same_constant(ax, ay, old, new):
                return False
        for vx, vy in zip(x.outvars, y.outvars):
            if (
                vx.id != vy.id
                or vx.dtype != vy.dtype
                or not _same_shape(vx.shape, vy.shape, old, new)
            ):
                return False
        if (x.params or y.params) and not same_value(x.params, y.params, old, new):
            return False
    return True


def _same_operand(x, y, old: int, new: int) -> bool:
    if isinstance(x, Var) or isinstance(y, Var):
        return isinstance(x, Var) and isinstance(y, Var) and _same_var(x, y, old, new)
    return same_value(x, y, old, new, symbolic=False)


def same_tape(x: Tape, y: Tape, old: int, new: int) -> bool:
    """Whether recording `y` (length `new`) is recording `x` (length `old`) with the length
    replaced (module docstring): the same operations on the same values, the same guards."""
    if x.captured or y.captured or len(x.inputs) != len(y.inputs):
        return False
    if len(x.guards) != len(y.guards) or len(x.outputs) != len(y.outputs):
        return False
    if not all(_same_var(a, b, old, new) for a, b in zip(x.inputs, y.inputs)):
        return False
    if not _same_instructions(x.instructions, y.instructions, old, new):
        return False
    for gx, gy in zip(x.guards, y.guards):
        if gx.kind != gy.kind or not _same_var(gx.var, gy.var, old, new):
            return False
        if not same_value(gx.answer, gy.answer, old, new, symbolic=False):
            return False
    return all(_same_operand(a, b, old, new) for a, b in zip(x.outputs, y.outputs))


def same_outputs(x: list[OutputLeaf], y: list[OutputLeaf], old: int, new: int) -> bool:
    """Whether the result leaves of two recordings agree up to the length."""
    return len(x) == len(y) and all(
        a.scalar == b.scalar
        and a.dtype == b.dtype
        and _same_operand(a.var, b.var, old, new)
        and (a.var is not None or _same_constant(a.const, b.const, old, new))
        and same_value(a.shape, b.shape, old, new)
        for a, b in zip(x, y)
    )


def same_program(x: Program, y: Program, old: int, new: int) -> bool:
    """Whether Program `y` (built for length `new`) is `x` with the length replaced."""
    if len(x.inputs) != len(y.inputs) or len(x.checks) != len(y.checks):
        return False
    if x.out_tree != y.out_tree or not same_outputs(x.outputs, y.outputs, old, new):
        return False
    if not all(_same_var(a, b, old, new) for a, b in zip(x.inputs, y.inputs)):
        return False
    for cx, cy in zip(x.checks, y.checks):
        if (cx.kind, cx.position, cx.rolled) != (cy.kind, cy.position, cy.rolled):
            return False
        if not _same_operand(cx.operand, cy.operand, old, new):
            return False
        if not same_value(cx.answer, cy.answer, old, new, symbolic=False):
            return False
    return _same_instructions(x.instructions, y.instructions, old, new)


# --- writing the program for another length ---------------------------------------------------
def equal_constants(x, y) -> bool:
    """Whether two constants of a lowering are the same value (arrays by shape, dtype and
    bytes): a rebound lowering is checked against one built in full with this."""
    if x is y:
        return True
    if type(x) is not type(y):
        return False
    if type(x) is np.ndarray:
        return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
    try:
        return bool(x == y)
    except Exception:  # (an object whose == is not a truth value)
        return False


def replaced(value, old: int, new: int):
    """`value` with every integer equal to `old` replaced by `new` (in tuples, lists, slices
    and dicts; other values as they are)."""
    t = type(value)
    if t is int:
        return new if value == old else value
    if t is tuple:
        return tuple([replaced(v, old, new) for v in value])
    if t is list:
        return [replaced(v, old, new) for v in value]
    if t is slice:
        return slice(
            replaced(value.start, old, new),
            replaced(value.stop, old, new),
            replaced(value.step, old, new),
        )
    if t is dict:
        return {k: replaced(v, old, new) for k, v in value.items()}
    if isinstance(value, np.integer) and t is not np.bool_:
        return t(new) if value == old else value
    if t is np.ndarray and old in value.shape and value.size > 1:
        # a constant of one repeated value shaped like the input (a zero gradient to add
        # into): the same value at the new shape
        one = _one_value(value)
        if one is not None:
            resized = np.full(_shape(value.shape, old, new), one, value.dtype)
            resized.flags.writeable = False
            return resized
    return value


def _shape(shape: tuple, old: int, new: int) -> tuple:
    return tuple([new if d == old else d for d in shape]) if old in shape else shape


def program_at_length(program: Program, tape: Tape, old: int, new: int) -> Program:
    """`program` (built for length `old`) written for length `new`; `tape` is the recording
    at the new length that `same_tape` matched."""
    vars_: dict[int, Var] = {}

    def var(v: Var) -> Var:
        got = vars_.get(v.id)
        if got is None:
            got = vars_[v.id] = Var(v.id, _shape(v.shape, old, new), v.dtype)
        return got

    instructions = [
        Instruction(
            ins.prim,
            tuple([None if v is None else var(v) for v in ins.invars]),
            ins.args
            if not any(type(a) is np.ndarray for a in ins.args)
            else tuple(
                [
                    replaced(a, old, new) if v is None and type(a) is np.ndarray else a
                    for v, a in zip(ins.invars, ins.args)
                ]
            ),
            replaced(ins.params, old, new) if ins.params else ins.params,
            [var(v) for v in ins.outvars],
            None,
        )
        for ins in program.instructions
    ]
    checks = [
        Check(
            var(c.operand) if isinstance(c.operand, Var) else c.operand,
            c.kind,
            c.answer,
            c.where,
            c.position,
            c.rolled,
        )
        for c in program.checks
    ]
    outputs = [
        OutputLeaf(
            None if leaf.var is None else var(leaf.var),
            leaf.const if leaf.var is not None else replaced(leaf.const, old, new),
            leaf.scalar,
            _shape(leaf.shape, old, new),
            leaf.dtype,
        )
        for leaf in program.outputs
    ]
    return Program(
        [var(v) for v in program.inputs],
        instructions,
        checks,
        outputs,
        program.out_tree,
        tape,
        origin=(program, old, new),
    )


def rebinding(program: Program, backend_key) -> tuple | None:
    """(what the backend derived from the program `program` was written from, old length,
    new length) when the backend checked that rebinding it for that old length is exact;
    None when it must lower `program` in full."""
    origin = program.origin
    if origin is None:
        return None
    template, old, new = origin
    entry = template.lowerings.get(backend_key)
    if entry is None or old not in entry[1]:
        return None
    return entry[0], old, new


def remember_lowering(program: Program, backend_key, derived, same: Callable) -> None:
    """Keep what a backend derived from `program` in full. For a program written for another
    length, `same(template's derived, old, new, derived)` says whether rebinding the
    template's for the new length gives exactly `derived`; if so, later lengths of that
    template are rebound (`rebinding`)."""
    origin = program.origin
    if origin is None:
        program.lowerings[backend_key] = (derived, set())
        return
    template, old, new = origin
    entry = template.lowerings.get(backend_key)
    if entry is not None and old not in entry[1] and same(entry[0], old, new, derived):
        entry[1].add(old)
