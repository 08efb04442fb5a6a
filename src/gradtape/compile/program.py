"""The program a backend lowers: a recorded tape, simplified, with its checks placed.

`build_program` turns one recorded variant (a stage-level Tape and its output
structure) into a `Program`: common subexpressions merged, multiplications by
one and selections on constant conditions forwarded, constant-valued ops folded,
dead instructions dropped. Guards and shape checks become `Check`s placed right
after the value they test (and never before an earlier check), so a replay
verifies its assumptions in the order the recording made them. Backends share
this module; it knows nothing about how code is generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import config
from ..core.ir import Instruction, Tape, Var
from ..core.primitive import Primitive
from ..core.pytree import TreeDef
from ..core.routes import lookup_ufunc
from ..rules import elementwise, indexing, shape
from . import rolling

# What a replay can check: the guards the Tracer records, and the shapes of the outputs of
# primitives declared `shape_from_data` (their shape depends on the input's values). Other
# facts this module reads from the declarations: `constant_valued` (folded), `identity`
# (forwarded), `reads_trip_count` (see _shape_checks).
CHECK_KINDS = frozenset({"bool", "int", "index", "item", "value", "shape"})


@dataclass
class Check:
    """A guard (or a shape check) the replay verifies right after `position`.

    position: index into Program.instructions of the instruction after which it runs
    (-1: before the first). kind: bool/int/index/item/value (guards), shape (checks of
    data-dependent shapes). `operand` is a Var, or a constant when the value was folded.
    """

    operand: Any
    kind: str
    answer: Any
    where: str
    position: int = -1
    rolled: bool = False  # the check of every iteration of a rolled loop (rolling.py)


@dataclass
class OutputLeaf:
    """One leaf of the result: a Var (computed) or a constant; `scalar`: return a NumPy scalar."""

    var: Var | None
    const: Any
    scalar: bool
    shape: tuple
    dtype: np.dtype


@dataclass
class Program:
    """A straight-line program for one variant of one signature.

    A backend reads each instruction's prim, invars, params, outvars and, where invars[i]
    is None, the constant args[i]. Values seen while recording (args of traced inputs,
    `out`) are dropped once the variant is lowered.
    """

    inputs: list[Var]
    instructions: list[Instruction]
    checks: list[Check]
    outputs: list[OutputLeaf]
    out_tree: TreeDef
    tape: Tape = field(repr=False, default=None)
    # (program, old length, new length): this program is that one with the length replaced
    # (compile/lengths.py); backends may rebind what they derived from it
    origin: tuple | None = field(repr=False, default=None, compare=False)
    # what backends derived from this program, by their own keys, to rebind for other lengths
    lowerings: dict = field(repr=False, default_factory=dict, compare=False)

    def __post_init__(self):
        # what an out= structure must hold: one (shape, dtype) per result leaf
        self.out_spec = [(leaf.shape, leaf.dtype) for leaf in self.outputs]
        td = self.out_tree
        self.out_is_flat_tuple = td.kind == "tuple" and all(c.kind == "leaf" for c in td.children)


def answer_key(kind: str, answer) -> Any:
    """A hashable, NaN-safe key for a check's answer (keys the tree of variants)."""
    if kind in ("value", "item") and isinstance(answer, (np.ndarray, np.generic)):
        a = np.asarray(answer)
        return ("array", a.shape, a.dtype.str, a.tobytes())
    if isinstance(answer, float):
        return ("float", answer.hex())
    if isinstance(answer, complex):
        return ("complex", answer.real.hex(), answer.imag.hex())
    if isinstance(answer, list):  # tolist() of a 0-d array is a scalar; of others a list
        return ("list", repr(answer))
    return (type(answer).__name__, answer)


def output_leaf(value, var: Var | None) -> OutputLeaf:
    """Describe a result leaf from the value seen while recording."""
    if var is not None:
        return OutputLeaf(var, None, not isinstance(value, np.ndarray), var.shape, var.dtype)
    return OutputLeaf(
        None,
        value,
        False,
        np.shape(value),
        np.result_type(value) if _is_array_like(value) else np.dtype(object),
    )


def _is_array_like(value) -> bool:
    return isinstance(value, (np.ndarray, np.generic, bool, int, float, complex))


# --- building ------------------------------------------------------------------------------
def build_program(
    tape: Tape,
    outputs: list[OutputLeaf],
    out_tree: TreeDef,
    roll: bool | None = None,
    native_loops: bool = False,
) -> Program:
    """Simplify a recorded tape into the Program a backend lowers (see the module docstring).
    `roll`: search it for Python loops to roll (None: GRADTAPE_ROLL now; False for a loop's
    step: a native driver runs it as one kernel); `native_loops`: the backend runs rolled
    loops natively, so rolling starts at shorter programs (rolling.min_tape_length)."""
    snapshots: dict[int, np.ndarray] = {}
    if roll is None:
        roll = config.roll_enabled()
    if roll:  # Python loops recorded once per iteration: one loop each
        tape = rolling.roll_tape(
            tape, lambda ins: _captured(ins, snapshots), rolling.min_tape_length(native_loops)
        )
        outputs = _rolled_outputs(tape, outputs)
    checks = _ordered_checks(tape)
    subst: dict[int, tuple] = {}  # var id -> ("var", Var) | ("const", value)
    cse: dict = {}
    kept: list[tuple[int, Instruction]] = []
    defs: dict[int, Instruction] = {}  # var id -> the kept instruction that computes it
    for pos, ins in enumerate(tape.instructions):
        ins = _forward_broadcasts(_substituted(_captured(ins, snapshots), subst), defs)
        replacement = _peephole(ins)
        if replacement is not None:
            subst[ins.outvars[0].id] = replacement
            continue
        key = _cse_key(ins)
        if key is not None:
            prev = cse.get(key)
            if prev is not None:
                for mine, theirs in zip(ins.outvars, prev.outvars):
                    subst[mine.id] = ("var", theirs)
                continue
            cse[key] = ins
        kept.append((pos, ins))
        for v in ins.outvars:
            defs[v.id] = ins

    for c in checks:
        c.operand = _resolve_operand(c.operand, subst)
    outs = []
    for leaf in outputs:
        if leaf.var is None:
            leaf = OutputLeaf(
                None, _snapshot(leaf.const, snapshots), leaf.scalar, leaf.shape, leaf.dtype
            )
        else:
            r = _resolve_operand(leaf.var, subst)
            if not isinstance(r, Var):
                leaf = OutputLeaf(None, r, leaf.scalar, leaf.shape, leaf.dtype)
            else:
                leaf = OutputLeaf(r, None, leaf.scalar, leaf.shape, leaf.dtype)
        outs.append(leaf)

    kept = _dead_code_eliminated(kept, checks, outs)
    # map each check from a position in the recorded tape to one in the kept instructions
    orig_positions = [pos for pos, _ in kept]
    j = 0
    for c in checks:
        while j < len(orig_positions) and orig_positions[j] <= c.position:
            j += 1
        c.position = j - 1
    return Program(list(tape.inputs), [ins for _, ins in kept], checks, outs, out_tree, tape)


def _rolled_outputs(tape: Tape, outputs: list[OutputLeaf]) -> list[OutputLeaf]:
    """The result leaves after rolling: a leaf computed in a rolled loop reads its output."""
    if len(tape.outputs) != len(outputs):
        return outputs
    return [
        OutputLeaf(o, None, leaf.scalar, leaf.shape, leaf.dtype)
        if leaf.var is not None and isinstance(o, Var) and o is not leaf.var
        else leaf
        for leaf, o in zip(outputs, tape.outputs)
    ]


def _ordered_checks(tape: Tape) -> list[Check]:
    """Guards and shape checks in replay order, positioned in the recorded tape."""
    produced_at = {}
    shape_checks = []
    readers: dict[int, set[Primitive]] = {}
    for ins in tape.instructions:
        for v in ins.invars:
            if v is not None:
                readers.setdefault(v.id, set()).add(ins.prim)
    output_ids = {v.id for v in tape.outputs if isinstance(v, Var)}
    for pos, ins in enumerate(tape.instructions):
        for v in ins.outvars:
            produced_at[v.id] = pos
        for v, o in _shape_checks(ins, readers, output_ids):
            shape_checks.append(
                Check(
                    v, "shape", tuple(np.shape(o)), f"data-dependent shape of {ins.prim.name}", pos
                )
            )
    guards = []
    last = -1
    for g in tape.guards:
        last = max(last, produced_at.get(g.var.id, -1))
        guards.append(
            Check(
                g.var,
                g.kind,
                _normalized_answer(g.kind, g.answer),
                g.where,
                last,
                g.where.endswith(rolling.ROLLED_CHECK),
            )
        )
    # stable merge: at equal positions the shape check (right after its instruction) comes first
    merged, i = [], 0
    for sc in shape_checks:
        while i < len(guards) and guards[i].position < sc.position:
            merged.append(guards[i])
            i += 1
        merged.append(sc)
    merged.extend(guards[i:])
    return merged


def _shape_checks(ins: Instruction, readers: dict, output_ids: set) -> list[tuple[Var, object]]:
    """(output var, recorded value) of the outputs whose shape a replay checks.

    `shape_from_data=True` (nonzero): every output. A function of the params selecting some
    outputs (a while loop's stored carries, one per iteration): those that the result or an
    instruction other than one that reads the trip count from them (`reads_trip_count`, the
    backward loop) reads; that instruction was recorded for one trip count.
    """
    fact = ins.prim.shape_from_data
    if not fact:
        return []
    outs = ins.out if ins.prim.multiple_results else (ins.out,)
    pairs = list(zip(ins.outvars, outs))
    if fact is True:
        return pairs
    return [
        (v, o)
        for v, o in pairs[fact(ins.params)]
        if v.id in output_ids or any(not p.reads_trip_count for p in readers.get(v.id, ()))
    ]


def _snapshot(value, memo: dict):
    """A read-only copy of a writable array constant: the program keeps the values it was
    recorded with, even if the caller later changes an array the function closed over."""
    if isinstance(value, np.ndarray) and value.flags.writeable:
        copy = memo.get(id(value))
        if copy is None:
            copy = memo[id(value)] = value.copy()
            copy.flags.writeable = False
        return copy
    if type(value) is tuple and any(isinstance(v, np.ndarray) for v in value):
        return tuple(_snapshot(v, memo) for v in value)
    return value


def _captured(ins: Instruction, memo: dict) -> Instruction:
    """The instruction with its array constants (arguments and params) snapshotted."""
    args = tuple(_snapshot(a, memo) if v is None else a for v, a in zip(ins.invars, ins.args))
    params = {k: _snapshot(p, memo) for k, p in ins.params.items()}
    if all(a is b for a, b in zip(args, ins.args)) and all(
        params[k] is ins.params[k] for k in params
    ):
        return ins
    return Instruction(ins.prim, ins.invars, args, params, ins.outvars, ins.out)


def _normalized_answer(kind: str, answer):
    """Python scalars for bool/int/index guards (indexing records them as 0-d arrays)."""
    if kind in ("bool", "int", "index") and isinstance(answer, (np.ndarray, np.generic)):
        return answer.item()
    return answer


def unreplayable_reason(program: Program) -> str | None:
    """Why a replay could not check this program's guards (None when it can)."""
    for c in program.checks:
        if c.kind not in CHECK_KINDS:
            return f"a guard of kind {c.kind!r} ({c.where}) that compile cannot check"
        if c.kind == "item" and isinstance(c.operand, Var) and math.prod(c.operand.shape) != 1:
            return (
                f"x.item(i) on an array of shape {c.operand.shape} ({c.where}) cannot be "
                "checked on replay; write x[i].item() instead"
            )
    return None


def _resolve_operand(x, subst):
    if isinstance(x, Var):
        r = subst.get(x.id)
        if r is not None:
            return r[1]
    return x


def _substituted(ins: Instruction, subst: dict) -> Instruction:
    if not subst or not any(v is not None and v.id in subst for v in ins.invars):
        return ins
    invars, args = list(ins.invars), list(ins.args)
    for i, v in enumerate(ins.invars):
        if v is not None and v.id in subst:
            kind, val = subst[v.id]
            if kind == "var":
                invars[i] = val
            else:
                invars[i], args[i] = None, val
    return Instruction(ins.prim, tuple(invars), tuple(args), ins.params, ins.outvars, ins.out)


def _is_elementwise(prim) -> bool:
    """Broadcasting elementwise ops (not generalized ufuncs such as matmul, with core dims)."""
    impl = prim.impl
    return (
        prim.partials is not None
        or prim is indexing.where_p
        or (isinstance(impl, np.ufunc) and impl.signature is None)
    )


def _strip_ones(shape: tuple) -> tuple:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]


def _broadcast_source(ins: Instruction | None) -> Var | None:
    """The input of a broadcast_to, or of a reshape that only adds or drops leading 1s."""
    if ins is None or ins.invars[0] is None:
        return None
    prim = ins.prim
    src = ins.invars[0]
    if prim is shape.broadcast_p or (
        prim is shape.reshape_p and _strip_ones(src.shape) == _strip_ones(ins.outvars[0].shape)
    ):
        return src
    return None


def _uniform_constant(a):
    """A 0-d array for a constant array whose elements are all equal (e.g. a broadcast seed)."""
    if isinstance(a, np.ndarray) and a.ndim and a.size and a.dtype.kind in "biufc":
        first = a.reshape(-1)[0] if a.flags.c_contiguous else a.flat[0]
        if (a == first).all():
            return np.array(first, dtype=a.dtype)
    return None


def _forward_broadcasts(ins: Instruction, defs: dict) -> Instruction:
    """Elementwise ops broadcast by themselves: read the unbroadcast value (same numbers).

    Applies to traced inputs made by broadcast_to (or a reshape adding leading 1s), and to
    constant arrays holding one repeated value, whenever the output shape stays the same.
    """
    if len(ins.outvars) != 1 or not _is_elementwise(ins.prim):
        return ins
    invars, args = list(ins.invars), list(ins.args)
    out_shape = ins.outvars[0].shape

    def keeps_shape(i: int, shape: tuple) -> bool:
        shapes = [
            shape if j == i else w.shape if w is not None else np.shape(b)
            for j, (w, b) in enumerate(zip(invars, args))
        ]
        return np.broadcast_shapes(*shapes) == out_shape

    changed = False
    for i, v in enumerate(invars):
        if v is None:
            small = _uniform_constant(args[i])
            if small is not None and keeps_shape(i, ()):
                args[i] = small
                changed = True
        while v is not None:
            src = _broadcast_source(defs.get(v.id))
            if src is None or not keeps_shape(i, src.shape):
                break
            v = invars[i] = src
            changed = True
    if not changed:
        return ins
    return Instruction(ins.prim, tuple(invars), tuple(args), ins.params, ins.outvars, ins.out)


def _same_type(v: Var, other: Var) -> bool:
    return v.shape == other.shape and v.dtype == other.dtype


def _is_one(c) -> bool:
    if isinstance(c, (bool, int, float, complex, np.generic)):
        return c == 1
    if isinstance(c, np.ndarray) and c.dtype.kind in "biufc":
        return bool(np.all(c == 1))
    return False


def _constant_truth(c):
    """True/False when a constant condition is all true/all false, else None."""
    if isinstance(c, (bool, np.bool_, np.ndarray)) and np.asarray(c).dtype == bool:
        a = np.asarray(c)
        if a.all():
            return True
        if not a.any():
            return False
    return None


# boolean ops with a constant operand: the value that decides the result alone
_BOOLEAN_FOLDS = {
    lookup_ufunc(np.logical_and): False,
    lookup_ufunc(np.bitwise_and): False,
    lookup_ufunc(np.logical_or): True,
    lookup_ufunc(np.bitwise_or): True,
}


def _peephole(ins: Instruction):
    """A replacement for an instruction's single output that needs no computation, or None."""
    if len(ins.outvars) != 1:
        return None
    out = ins.outvars[0]
    prim = ins.prim
    if prim.constant_valued:
        return ("const", ins.out)
    if prim.identity and ins.invars[0] is not None and _same_type(ins.invars[0], out):
        return ("var", ins.invars[0])
    if prim is elementwise.multiply and len(ins.invars) == 2:
        for mine, other in ((0, 1), (1, 0)):
            v = ins.invars[mine]
            if (
                v is not None
                and ins.invars[other] is None
                and _is_one(ins.args[other])
                and _same_type(v, out)
                # a complex product is computed in full: (inf + 1j) * 1 is inf + nanj
                and v.dtype.kind != "c"
            ):
                return ("var", v)
    if prim in _BOOLEAN_FOLDS and out.dtype == bool and len(ins.invars) == 2:
        absorbing = _BOOLEAN_FOLDS[prim]  # False for and, True for or
        for mine, other in ((0, 1), (1, 0)):
            if ins.invars[mine] is None:
                truth = _constant_truth(ins.args[mine])
                if truth is absorbing:
                    return ("const", ins.out)
                v = ins.invars[other]
                if truth is (not absorbing) and v is not None and _same_type(v, out):
                    return ("var", v)
    if prim is indexing.where_p and ins.invars[0] is None:
        truth = _constant_truth(ins.args[0])
        if truth is not None:
            pick = 1 if truth else 2
            v = ins.invars[pick]
            if v is None:
                return ("const", ins.out)
            if _same_type(v, out):
                return ("var", v)
    return None


def _const_key(c):
    if isinstance(c, (bool, int, float, complex, np.generic, str)) or c is None:
        if isinstance(c, float) and math.isnan(c):
            return ("nan", id(c))
        if isinstance(c, (float, np.floating)) and c == 0:
            return (type(c), c, math.copysign(1.0, c))  # 0.0 == -0.0, but 1/x differs
        if isinstance(c, (complex, np.complexfloating)):
            return (type(c), c, math.copysign(1.0, c.real), math.copysign(1.0, c.imag))
        return (type(c), c)
    return ("id", id(c))


def _cse_key(ins: Instruction):
    try:
        key = (
            id(ins.prim),
            tuple(
                ("v", v.id) if v is not None else _const_key(a)
                for v, a in zip(ins.invars, ins.args)
            ),
            tuple(ins.params.items()),
        )
        hash(key)
    except TypeError:
        return None
    return key


def _dead_code_eliminated(kept, checks, outputs):
    live = {leaf.var.id for leaf in outputs if leaf.var is not None}
    live.update(c.operand.id for c in checks if isinstance(c.operand, Var))
    result = []
    for pos, ins in reversed(kept):
        if any(v.id in live for v in ins.outvars):
            result.append((pos, ins))
            live.update(v.id for v in ins.invars if v is not None)
    result.reverse()
    return result


def tree_expr(td, leaves, const) -> str:
    """Source text rebuilding the pytree `td` from leaf expressions; `const(value, hint)` names
    a constant the generated code refers to (dict keys, named-tuple types). Shared by the
    code generators of every backend."""
    if td.kind == "leaf":
        return next(leaves)
    if td.kind == "none":
        return "None"
    parts = [tree_expr(c, leaves, const) for c in td.children]
    if td.kind == "tuple":
        return "(" + "".join(p + ", " for p in parts) + ")"
    if td.kind == "list":
        return "[" + ", ".join(parts) + "]"
    if td.kind == "namedtuple":
        return f"{const(td.meta, 'namedtuple')}(" + ", ".join(parts) + ")"
    if td.kind == "custom":  # a registered pytree node or a dataclass
        return f"{const(td.rebuild, 'node')}([" + ", ".join(parts) + "])"
    return "{" + ", ".join(f"{const(k, 'key')}: {p}" for k, p in zip(td.meta, parts)) + "}"
