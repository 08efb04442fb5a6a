"""Loop rolling: a recorded Python loop becomes one loop instruction again.

A Python `for` loop over data points, mixture components or time steps is recorded once per
iteration, so the tape (and every backend's code and compile time) grows with the trip count.
`roll_tape` finds runs of instructions that repeat the same body over consecutive iterations
and replaces each run with one `rolled_loop` instruction that runs the body `trips` times.
It runs on the tape `build_program` simplifies, which under `compile(grad(f))` holds the
forward and the backward pass: both are rolled the same way, and nothing is differentiated
after rolling.

Two iterations are "the same body" when, instruction by instruction, they apply the same
primitive to values of the same shapes and dtypes with the same params, and every operand
comes from the same place:

* a value computed earlier in the same iteration (same offset in the body);
* a value computed in the previous iteration (a **carry**; the first iteration reads its
  initial value, computed before the run);
* one value computed before the run, read by every iteration (**invariant**), or one value
  per iteration computed before the run (a Python list of arrays indexed by the loop
  counter: they are stacked into one array before the loop, which iteration t reads row t
  of; items of one list read in one place have the same shape and dtype, as the readers'
  signatures are equal);
* a constant equal in every iteration, or a constant of one shape and dtype that differs
  per iteration (stacked into one array, one row per iteration);
* integer params that progress regularly (`x[i]`, `x[i + 1]`: `idx=(i,)` with `i = i0 + t*s`
  in iteration `t`), substituted per iteration.

A value of the run read after it is an output of the loop: the last iteration's value, or
(read for other iterations too) all of them stacked, one row per iteration; its readers then
read a row (`getitem` with a progressing index, which a later run rolls in turn: the backward
pass reads the forward pass's stacked values). Guards of values computed in the run become
one check of the stacked values (every iteration must take the recorded path; an iteration
that goes another way fails the check and is recorded as another variant). Anything else
(a value read from two iterations back, a shape check, params that do not progress, guards
that differ between iterations) ends the run: rolling refuses when unsure, and an unrolled
tape computes the same numbers. Runs are searched again on the rolled tape, so a loop nested
in a loop rolls into a loop whose body holds a loop.

Tapes shorter than MIN_TAPE_LENGTH instructions are left as they are (the numpy backend's
code for the unrolled program runs faster than a rolled body interpreted one primitive at a
time); where rolled loops run on native drivers (the numba backend: `step_tape` below, and
compile/numba/loops.py), from NATIVE_MIN_TAPE_LENGTH on. `GRADTAPE_ROLL=0` turns rolling off
(config.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core import collector
from ..core.ir import Guard, Instruction, Tape, Var
from ..core.primitive import Primitive
from ..rules import indexing, shape

MIN_TRIPS = 4  # shorter runs stay unrolled (nothing to gain)
# shorter tapes stay unrolled: a rolled body is evaluated one primitive call at a time,
# which costs more per instruction than either backend's code for the unrolled program
# (measured on a Gaussian mixture of 7,600 instructions: 55 ms against 3.9 ms a call on the
# numpy backend); beyond this, lowering and compiling the unrolled program costs more
MIN_TAPE_LENGTH = 20_000
# where rolled loops run on native drivers (the numba backend), from this length on (measured
# on compile(value_and_grad) of Python loops: below it, the unrolled program compiles in
# seconds and its calls are faster; from it on, the unrolled compile takes several times the
# rolled one's and keeps growing with the trip count, the rolled one does not; the guide's
# "Python loops" section has the table)
NATIVE_MIN_TAPE_LENGTH = 1_000
MAX_PERIOD = 4096  # the longest body searched for
# the longest body searched for in successive passes: inner loops (short bodies) roll first,
# so that the loop around them then repeats a body holding one loop instruction
PERIOD_LIMITS = (8, 32, 128, 512, MAX_PERIOD)
MAX_PASSES = 4  # passes per limit (a rolled tape is searched again: the backward pass
# reads the forward loop's stacked values through getitems a pass adds)
_CANDIDATES = 6  # periods tried at one position
_WORK_LIMIT = 40_000_000  # instruction comparisons per tape before the search gives up
# guards a rolled loop checks as one comparison of the stacked values: their kinds, and the
# dtype kinds of their operands for which the answer is the operand's value itself
# data movement only: a loop of these would copy rows that its readers can read themselves
_MOVES = (indexing.getitem_p, shape.reshape_p, shape.broadcast_p)
# how the `where` of a rolled loop's check ends (dispatch tries other variants when it fails)
ROLLED_CHECK = " (every iteration of a rolled loop)"
_GUARD_DTYPES = {"bool": "b", "int": "iu", "index": "iu", "item": "biufc"}


# --- the loop instruction -------------------------------------------------------------------------
@dataclass(frozen=True)
class BodyStep:
    """One instruction of a rolled body.

    refs: per argument, ("body", k, j) output j of body step k in this iteration, ("carry", c),
    ("in", m) input m of the loop, ("const", value), ("row", m, python) row t of loop input m
    (a constant that differs per iteration, the stack of a list read one item per iteration
    or a loop's stacked output; `python`: give it as a Python scalar).
    params: static params; `progress` maps a param name to (start, step) arrays over the flat
    integers of its value (`shape` rebuilds it).
    """

    prim: Primitive
    refs: tuple
    params: tuple  # sorted (name, value) of the static params
    progress: tuple  # (name, template, start, step)
    n_out: int

    def params_at(self, t: int) -> dict:
        params = dict(self.params)
        for name, template, start, step in self.progress:
            params[name] = _rebuild(template, [a + t * d for a, d in zip(start, step)])
        return params


@dataclass(eq=False)
class RolledLoop:
    """A rolled loop: its body, trip count, carries and outputs (see the module docstring).

    carries: (input index of the initial value, (k, j) of the value the next iteration reads).
    outputs: ("last", k, j) or ("stack", k, j), in the order of the instruction's outputs.
    """

    steps: tuple[BodyStep, ...]
    trips: int
    carries: tuple
    outputs: tuple
    key: Any = None

    def __post_init__(self):
        self.key = (
            self.trips,
            tuple(
                (id(s.prim), s.refs_key, s.params_key, s.progress, s.n_out)
                for s in (_Keyed(st) for st in self.steps)
            ),
            self.carries,
            self.outputs,
        )
        self._hash = hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, RolledLoop) and self._hash == other._hash and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"<{len(self.steps)} steps x {self.trips}>"

    def _plan(self) -> list:
        """Per step: (implementation, static params, the step if its params progress, its
        operands as (code, a, b)); built once (codes: 0 a single-result step's value, 1 one
        result of a multiple-result step, 2 carry, 3 input, 5 constant, 6 row)."""
        plan = getattr(self, "_steps_plan", None)
        if plan is not None:
            return plan
        codes = {"carry": 2, "in": 3}
        plan = []
        for step in self.steps:
            refs = []
            for ref in step.refs:
                kind = ref[0]
                if kind == "body":
                    single = step_single(self.steps[ref[1]])
                    refs.append((0, ref[1], 0) if single else (1, ref[1], ref[2]))
                elif kind in codes:
                    refs.append((codes[kind], ref[1], 0))
                elif kind == "const":
                    refs.append((5, ref[1], 0))
                else:  # "row"
                    refs.append((6, ref[1], ref[2]))
            impl = step.prim.python_impl or step.prim.impl
            plan.append((impl, dict(step.params), step if step.progress else None, tuple(refs)))
        self._steps_plan = plan
        return plan

    def _iterate(self, plan: list, inputs: tuple, carry: list, env: list, t: int) -> None:
        """Run iteration t of the body: env[k] becomes step k's value."""
        for k, (impl, params, progressing, refs) in enumerate(plan):
            args = []
            for code, a, b in refs:
                if code == 0:
                    args.append(env[a])
                elif code == 3:
                    args.append(inputs[a])
                elif code == 2:
                    args.append(carry[a])
                elif code == 1:
                    args.append(env[a][b])
                elif code == 5:
                    args.append(a)
                else:  # a constant that differs per iteration (b: as a Python scalar)
                    row = inputs[a][t]
                    args.append(row.item() if b else row)
            if progressing is not None:
                env[k] = impl(*args, **progressing.params_at(t))
            else:
                env[k] = impl(*args, **params)

    def first_iteration(self, inputs: tuple) -> list:
        """The value of every body step in the first iteration (an example for lowering)."""
        env: list = [None] * len(self.steps)
        self._iterate(self._plan(), inputs, [inputs[m] for m, _ in self.carries], env, 0)
        return env

    def run(self, inputs: tuple) -> tuple:
        """The loop's outputs for these inputs (NumPy values)."""
        steps = self.steps
        plan = self._plan()
        carry = [inputs[m] for m, _ in self.carries]
        stacked = [[] for _ in self.outputs]
        env: list = [None] * len(steps)
        last = self.trips - 1
        for t in range(self.trips):
            self._iterate(plan, inputs, carry, env, t)
            carry = [_pick(steps, env, kj) for _, kj in self.carries]
            for i, (kind, k, j) in enumerate(self.outputs):
                if kind == "stack" or t == last:
                    stacked[i].append(_pick(steps, env, (k, j)))
        results = []
        for (kind, _, _), values in zip(self.outputs, stacked):
            results.append(values[-1] if kind == "last" else np.stack(values))
        return tuple(results)


class _Keyed:
    """Hashable views of a step's refs and params (constants by value where possible)."""

    def __init__(self, step: BodyStep):
        self.prim = step.prim
        self.refs_key = tuple(
            ("const", _value_key(r[1])) if r[0] == "const" else r for r in step.refs
        )
        self.params_key = tuple((k, _value_key(v)) for k, v in step.params)
        self.progress = tuple((n, repr(tpl), tuple(a), tuple(d)) for n, tpl, a, d in step.progress)
        self.n_out = step.n_out


def step_single(step: BodyStep) -> bool:
    return not step.prim.multiple_results


def _pick(steps, env, kj):
    k, j = kj
    return env[k] if step_single(steps[k]) else env[k][j]


def _rolled_impl(*inputs, loop: RolledLoop):
    return loop.run(inputs)


def _not_differentiated(*args, **params):
    raise NotImplementedError(
        "rolled_loop is made by compile after differentiation and is never differentiated"
    )


rolled_loop_p = Primitive("rolled_loop", _rolled_impl, multiple_results=True, nondiff=True)
rolled_loop_p.vjp_all = _not_differentiated


# --- one iteration as a tape (what the numba backend's driver runs natively) ---------------------
class NotSteppable(Exception):
    """This rolled loop's body cannot be written as one step tape; the message says why."""


# primitives whose progressing index becomes the same primitive with traced integers in it
_DYNAMIC = {
    indexing.getitem_p: indexing.dyn_getitem_p,
    indexing.setitem_p: indexing.dyn_setitem_p,
    indexing.scatter_add_p: indexing.dyn_scatter_add_p,
}


@dataclass
class StepTape:
    """One iteration of a rolled loop as a tape, for a driver that walks the iterations.

    tape: inputs, instructions and outputs (the next value of each carry, then the value of
    each of the loop's outputs, in their orders); no guards (the loop's guards check its
    stacked outputs after it).
    sources: per tape input, where a driver reads it in iteration t: ("carry", c) the
    current value of carry c, ("in", m) loop input m, ("row", m) row t of loop input m,
    ("index", start, step) the integer start + t * step (a progressing index), ("view", m,
    parts) the view loop_input_m[parts] (see _view_parts).
    accumulators: carry c -> [(index parts, position among the tape's outputs)]: a carry
    that the body reads only to scatter-add into it (the backward pass's gradient of `x[i]`),
    which a driver adds into in place, after the step, the value at that position at that
    index (parts as in _view_parts); the first position is the carry's own slot, others
    follow the loop's outputs.
    """

    tape: Tape
    sources: list
    accumulators: dict


def step_tape(loop: RolledLoop, inputs: tuple) -> StepTape:
    """The body of `loop` as one step tape, recorded on these inputs' first iteration.

    Progressing integers of an index (`x[i]`, the backward pass's scatter into position i)
    become traced integers of dyn_getitem, dyn_setitem and dyn_scatter_add, read from the
    step's inputs. A loop rolled inside the body is unrolled into the step (its trip count is
    fixed; the outer loop is the long one), up to MAX_STEP_INSTRUCTIONS. Raises NotSteppable
    for a body longer than that or with other progressing params.
    """
    writer = _StepWriter()
    carry_vars = [
        (writer.add_input(inputs[m], ("carry", c)), inputs[m])
        for c, (m, _) in enumerate(loop.carries)
    ]
    accumulators = _accumulators(loop, inputs)
    shared: dict = {}  # ("in", m) | ("row", m) -> (Var, value)

    def operand(kind: str, m: int, step: BodyStep):
        key = (kind, m)
        if key not in shared:
            value = inputs[m] if kind == "in" else np.asarray(inputs[m])[0]
            shared[key] = (writer.add_input(value, key), value)
        return shared[key]

    skipped = {at for chain in accumulators.values() for at, _ in chain}
    env = writer.iteration(loop, operand, carry_vars, None, skipped=skipped)

    def value_of(pair):
        return pair[0] if pair[0] is not None else pair[1]

    added: list = []  # values added in place after the step, beyond the first of each carry
    adds: dict = {}  # carry -> [(index parts, position among the tape's outputs)]
    carried = []
    for c, (_, (k, j)) in enumerate(loop.carries):
        if c in accumulators:  # the values added: a step's, an input's or a constant
            adds[c] = []
            for n, (at, parts) in enumerate(accumulators[c]):
                ref = loop.steps[at].refs[1]
                pair = writer.resolve(ref, loop, operand, env, carry_vars, None, loop.steps[at])
                if n == 0:
                    carried.append(value_of(pair))
                    adds[c].append((parts, c))
                else:
                    adds[c].append((parts, len(added)))  # (shifted below)
                    added.append(value_of(pair))
        else:
            carried.append(value_of(_pick(loop.steps, env, (k, j))))
    producers = {kj: c for c, (_, kj) in enumerate(loop.carries)}
    outputs = []
    for kind, k, j in loop.outputs:
        if kind == "last" and (k, j) in producers:  # (a driver reads it after the loop)
            outputs.append(carried[producers[(k, j)]])
        else:
            outputs.append(value_of(_pick(loop.steps, env, (k, j))))
    base = len(carried) + len(outputs)
    adds = {
        c: [(parts, pos if n == 0 else base + pos) for n, (parts, pos) in enumerate(entries)]
        for c, entries in adds.items()
    }
    tape = Tape()
    tape.inputs = writer.inputs
    tape.instructions = writer.instructions
    tape.outputs = carried + outputs + added
    return StepTape(tape, writer.sources, adds)


MAX_STEP_INSTRUCTIONS = 4096  # a longer step (loops unrolled inside it) stays in Python


class _StepWriter:
    """Writes the instructions of one step tape (see step_tape); values are (Var, value)
    pairs, Var None for a constant."""

    def __init__(self):
        self.instructions: list[Instruction] = []
        self.inputs: list[Var] = []
        self.sources: list = []
        self._ids = iter(range(1, 1 << 62))

    def new_var(self, value) -> Var:
        a = np.asarray(value)
        return Var(next(self._ids), a.shape, a.dtype)

    def add_input(self, value, source) -> Var:
        v = self.new_var(value)
        self.inputs.append(v)
        self.sources.append(source)
        return v

    def emit(self, prim: Primitive, operands: list, params: dict, recorded=None):
        """Record prim on the operands; `recorded` = (prim, params, extra operands) to write
        instead (a dyn_* instruction computing the same value)."""
        values = [value for _, value in operands]
        out = (prim.python_impl or prim.impl)(*values, **params)
        if all(var is None for var, _ in operands) and recorded is None:
            outs = out if prim.multiple_results else (out,)
            pairs = [(None, o) for o in outs]  # (constants in, a constant out)
            return pairs if prim.multiple_results else pairs[0]
        if recorded is not None:
            prim, params, extra = recorded
            operands = list(operands) + list(extra)
        outs = out if prim.multiple_results else (out,)
        outvars = tuple(self.new_var(o) for o in outs)
        self.instructions.append(
            Instruction(
                prim,
                tuple(var for var, _ in operands),
                tuple(value for _, value in operands),
                params,
                outvars,
                out,
            )
        )
        if len(self.instructions) > MAX_STEP_INSTRUCTIONS:
            raise NotSteppable(
                f"its body, with the loops inside it unrolled, is longer than "
                f"{MAX_STEP_INSTRUCTIONS} instructions"
            )
        pairs = list(zip(outvars, outs))
        return pairs if prim.multiple_results else pairs[0]

    def resolve(self, ref, loop, operand, env, carry, t: int, step: BodyStep):
        """The (Var, value) pair of one operand reference in iteration t."""
        kind = ref[0]
        if kind == "body":
            return _pick(loop.steps, env, (ref[1], ref[2]))
        if kind == "carry":
            return carry[ref[1]]
        if kind == "const":
            return (None, ref[1])
        if kind == "in":
            return operand("in", ref[1], step)
        # a row of a constant that differs per iteration (the outer loop: a step input)
        return operand("row", ref[1], step) if t is None else self._row(operand, ref[1], t, step)

    def _row(self, operand, m: int, t: int, step: BodyStep):
        var, value = operand("value", m, step)
        if var is None:
            return (None, np.asarray(value)[t])
        return self.emit(indexing.getitem_p, [(var, value)], {"idx": (t,)})

    def iteration(self, loop, operand, carry, t, skipped=frozenset()) -> list:
        """Emit iteration t of loop's body (t None: the outer loop, whose progressing
        indices are read from the step's inputs); returns its env of pairs."""
        env: list = []
        for k, step in enumerate(loop.steps):
            if k in skipped:  # (a driver adds its value in place)
                env.append(None)
                continue
            operands = [self.resolve(r, loop, operand, env, carry, t, step) for r in step.refs]
            _check_python_rows(step, operands)
            if step.prim is rolled_loop_p:
                inner = dict(step.params)["loop"]
                env.append(tuple(self.unrolled(inner, operands)))
                continue
            if not step.progress:
                env.append(self.emit(step.prim, operands, dict(step.params)))
            elif t is not None:
                env.append(self.emit(step.prim, operands, step.params_at(t)))
            elif step.prim is indexing.getitem_p and step.refs[0][0] == "in":
                # a window of a loop input (x[i], x[i:i + 3], data[i, :]): the driver
                # passes the view as a step input
                value = (step.prim.python_impl or step.prim.impl)(
                    operands[0][1], **step.params_at(0)
                )
                parts = _view_parts(step, np.ndim(operands[0][1]))
                env.append((self.add_input(value, ("view", step.refs[0][1], parts)), value))
            else:
                dynamic = _dynamic_index(step, self.add_input)
                env.append(self.emit(step.prim, operands, step.params_at(0), dynamic))
        return env

    def unrolled(self, loop: RolledLoop, operands: list) -> list:
        """A loop inside the body, unrolled: its outputs as pairs."""

        def operand(kind, m, step):
            return operands[m]

        carry = [operands[m] for m, _ in loop.carries]
        stacked: list[list] = [[] for _ in loop.outputs]
        for t in range(loop.trips):
            env = self.iteration(loop, operand, carry, t)
            carry = [_pick(loop.steps, env, kj) for _, kj in loop.carries]
            for i, (kind, k, j) in enumerate(loop.outputs):
                if kind == "stack" or t == loop.trips - 1:
                    stacked[i].append(_pick(loop.steps, env, (k, j)))
        results = []
        for (kind, _, _), pairs in zip(loop.outputs, stacked):
            if kind == "last":
                results.append(pairs[-1])
                continue
            first = np.asarray(pairs[0][1])
            buffer = (None, np.zeros((len(pairs), *first.shape), first.dtype))
            for t, pair in enumerate(pairs):
                buffer = self.emit(indexing.setitem_p, [buffer, pair], {"idx": (t,)})
            results.append(buffer)
        return results


def _accumulators(loop: RolledLoop, inputs: tuple) -> dict:
    """The carries the body reads only to scatter-add into them (one scatter-add after
    another: the gradient of x[i] and of x[i + 1]), with basic indices (see StepTape):
    carry c -> [(body step, index parts)] in order."""
    found = {}
    for c, (m, (k, _)) in enumerate(loop.carries):
        base = np.asarray(inputs[m])
        if base.ndim == 0 or sum(1 for _, kj in loop.carries if kj[0] == k) != 1:
            continue
        readers: dict = {}
        for i, s in enumerate(loop.steps):
            for a, r in enumerate(s.refs):
                if r[0] == "body" or r[0] == "carry":
                    readers.setdefault(r[:2], []).append((i, a))
        stacked = {o[1] for o in loop.outputs if o[0] == "stack"}
        chain = []
        at = k
        while True:
            step = loop.steps[at]
            if (
                step.prim is not indexing.scatter_add_p
                or (step.refs[1][0] == "row" and step.refs[1][2])
                or at in stacked
            ):
                chain = None
                break
            parts = _scatter_parts(step, base.ndim)
            if parts is None:
                chain = None
                break
            chain.append((at, parts))
            source = step.refs[0]
            if readers.get(source[:2]) != [(at, 0)]:
                chain = None
                break
            if source == ("carry", c):
                break
            if source[0] != "body":
                chain = None
                break
            at = source[1]
        if chain and not readers.get(("body", k)):
            found[c] = chain[::-1]
    return found


def _scatter_parts(step: BodyStep, ndim: int) -> list | None:
    """A scatter-add's index as a driver writes it (see _view_parts), or None."""
    if step.progress:
        try:
            return _view_parts(step, ndim)
        except NotSteppable:
            return None
    idx = dict(step.params).get("idx")
    if not isinstance(idx, tuple):
        return None
    parts: list = []
    for i in idx:
        if isinstance(i, slice):
            parts.append(("slice", i.start, i.stop, i.step))
        elif isinstance(i, int) or i is None or i is Ellipsis:
            parts.append(i)
        else:
            return None
    return _expand_ellipsis(parts, ndim)


def _expand_ellipsis(parts: list, ndim: int) -> list:
    """Index parts with an Ellipsis replaced by the full slices it stands for."""
    used = sum(1 for p in parts if p is not None and p is not Ellipsis)
    expanded: list = []
    for p in parts:
        if p is Ellipsis:
            expanded.extend([("slice", None, None, None)] * (ndim - used))
        else:
            expanded.append(p)
    return expanded


def _check_python_rows(step: BodyStep, operands: list) -> None:
    """A per-iteration constant the body gave as a Python scalar becomes a 0-d array in a
    step: refuse where NumPy's promotion would then differ (float32 * 0.5 stays float32)."""
    python = [a for a, r in enumerate(step.refs) if r[0] == "row" and r[2]]
    if not python:
        return
    others = [
        np.asarray(value).dtype
        for a, (_, value) in enumerate(operands)
        if a not in python and step.refs[a][0] != "const"
    ]
    for a in python:
        row = np.asarray(operands[a][1])
        if np.result_type(*others, row.item()) != np.result_type(*others, row.dtype):
            raise NotSteppable("a per-iteration Python scalar changes a dtype")


def _view_parts(step: BodyStep, ndim: int) -> list:
    """The index of a getitem whose params progress, as parts a driver writes: ints, None,
    ("index", start, step) for a progressing integer, ("slice", start, stop, step) with
    such integers or None in it; Ellipsis expanded."""
    if [p[0] for p in step.progress] != ["idx"]:
        raise NotSteppable(
            f"{step.prim.name} has params that change from one iteration to the next"
        )
    _, template, start, stride = step.progress[0]
    if template[0] != "t":
        raise NotSteppable("an index that is not a tuple changes per iteration")
    ints = iter(zip(start, stride))

    def integer():
        a, d = next(ints)
        return ("index", a, d) if d else a

    parts: list = []
    for part in template[1]:
        if part[0] == "i":
            parts.append(integer())
        elif part[0] == "s":
            bounds = [integer() if x[0] == "i" else x[1] for x in part[1]]
            if isinstance(bounds[2], tuple) or (bounds[2] is not None and bounds[2] <= 0):
                raise NotSteppable("a window with a changing or negative step")
            if any(isinstance(b, int) and b < 0 for b in bounds[:2]) or any(
                isinstance(b, tuple) and b[1] < 0 for b in bounds[:2]
            ):
                raise NotSteppable("a window counted from the end changes per iteration")
            parts.append(("slice", *bounds))
        elif part[0] == "v" and (part[1] is None or part[1] is Ellipsis):
            parts.append(part[1])
        else:
            raise NotSteppable("an index part a driver cannot write changes per iteration")
    return _expand_ellipsis(parts, ndim)


def _dynamic_index(step: BodyStep, add_input) -> tuple:
    """(dyn primitive, its params, index operands) of a step whose `idx` progresses in
    top-level integers (x[i, 2], not x[i:i + 2])."""
    dynamic = _DYNAMIC.get(step.prim)
    if dynamic is None or [p[0] for p in step.progress] != ["idx"]:
        raise NotSteppable(
            f"{step.prim.name} has params that change from one iteration to the next"
        )
    _, template, start, stride = step.progress[0]
    if template[0] != "t":
        raise NotSteppable("an index that is not a tuple changes per iteration")
    idx = list(_rebuild(template, list(start)))
    flat = 0
    positions, index_vars, index_values = [], [], []
    for position, part in enumerate(template[1]):
        if part[0] == "i":
            if stride[flat] != 0:
                positions.append(position)
                index_values.append(np.int64(start[flat]))
                index_vars.append(
                    add_input(np.int64(start[flat]), ("index", start[flat], stride[flat]))
                )
                idx[position] = indexing._SLOT
            flat += 1
        elif part[0] == "s":
            n = sum(1 for x in part[1] if x[0] == "i")
            if any(stride[flat + i] != 0 for i in range(n)):
                raise NotSteppable("a slice whose bounds change per iteration")
            flat += n
        elif part[0] == "t":
            raise NotSteppable("a nested index changes per iteration")
    params = {"template": tuple(idx), "positions": tuple(positions)}
    return dynamic, params, list(zip(index_vars, index_values))


# --- params: flat integers and a template -------------------------------------------------------
def _flat_ints(value) -> tuple[Any, list] | None:
    """(template, integers) of a param built of ints, slices of ints, tuples and constants."""
    ints: list = []

    def walk(v):
        if isinstance(v, (bool, np.bool_)):
            return ("v", v)
        if isinstance(v, (int, np.integer)):
            ints.append(int(v))
            return ("i",)
        if isinstance(v, tuple):
            return ("t", tuple(walk(x) for x in v))
        if isinstance(v, slice):
            parts = []
            for x in (v.start, v.stop, v.step):
                if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
                    ints.append(int(x))
                    parts.append(("i",))
                else:
                    parts.append(("v", x))
            return ("s", tuple(parts))
        try:
            hash(v)
        except TypeError:
            return None
        if isinstance(v, np.ndarray):
            return None
        return ("v", v)

    template = walk(value)
    if template is None or _has_none(template):
        return None
    return template, ints


def _has_none(tpl) -> bool:
    if tpl is None:
        return True
    if tpl[0] in ("t", "s"):
        return any(_has_none(x) for x in tpl[1])
    return False


def _rebuild(template, ints: list):
    it = iter(ints)

    def build(tpl):
        kind = tpl[0]
        if kind == "i":
            return next(it)
        if kind == "v":
            return tpl[1]
        if kind == "t":
            return tuple(build(x) for x in tpl[1])
        start, stop, step = (build(x) for x in tpl[1])
        if stop is not None and stop < 0 and (step or 1) < 0 and start is not None:
            stop = None if stop == -1 else stop  # (a negative stop counts from the end)
        return slice(start, stop, step)

    return build(template)


def _value_key(v):
    """A hashable key of a constant: by value for scalars and small arrays, else identity."""
    if isinstance(v, np.ndarray):
        if v.size <= 16:
            return ("array", v.shape, v.dtype.str, v.tobytes())
        return ("id", id(v))
    if isinstance(v, float) and math.isnan(v):
        return ("nan",)
    if isinstance(v, (float, np.floating)) and v == 0:
        return (type(v).__name__, math.copysign(1.0, float(v)))
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    return (type(v).__name__, v)


# --- signatures: what must be equal between iterations -----------------------------------------
def _param_signature(value):
    if isinstance(value, RolledLoop):
        return ("loop", value.key)
    flat = _flat_ints(value)
    if flat is not None:
        return ("ints", repr(flat[0]), len(flat[1]))
    return ("id", id(value))


_PYTHON_FLOAT = ("c", "float", (), np.dtype(float).str)


def _structure(value):
    """A hashable key of a param made of ints, None, bools, slices and tuples of them, equal
    for two values exactly when their `_param_signature`s are (None for other values)."""
    kind = type(value)
    if kind is int:
        return "i"
    if value is None:
        return "n"
    if kind is bool:
        return value
    if kind is tuple:
        parts = []
        for x in value:
            key = _structure(x)
            if key is None:
                return None
            parts.append(key)
        return tuple(parts)
    if kind is slice:
        parts = []
        for x in (value.start, value.stop, value.step):
            if type(x) is int:
                parts.append("i")
            elif x is None or type(x) is bool:
                parts.append(x)
            else:
                return None
        return ("s", *parts)
    return None


class _Signatures:
    """Each instruction's code: equal codes for instructions that are the same body step (the
    same primitive; operands of the same shapes and dtypes, constants of the same types;
    params with the same structure, their integers abstracted; outputs of the same shapes
    and dtypes), None for an instruction that is never one (a shape computed from data, a
    trip count, a user's rule). Computed once per instruction for all the passes
    over one tape (kept on the instruction, `Instruction.signature_code`, with this search's
    serial), as one flat tuple of the parts (the primitive, each operand's shape and dtype or
    its constant's kind, each param's signature, a None, each output's shape and dtype), with
    the params' signatures memoized by structure: the signature is the search's largest cost
    per instruction."""

    _serials = iter(range(1, 1 << 62))

    def __init__(self):
        self.serial = next(self._serials)
        self.interned: dict = {}  # signature -> code
        self.params: dict = {}  # structure -> a param's signature
        self.computed = 0  # signatures computed (for the tests: once per instruction)

    def code(self, ins: Instruction):
        known = ins.signature_code
        if known is not None and known[0] == self.serial:
            return known[1]
        self.computed += 1
        sig = self.signature(ins)
        code = None
        if sig is not None:
            interned = self.interned
            try:
                code = interned.get(sig)
                if code is None:
                    code = interned[sig] = len(interned)
            except TypeError:  # an unhashable part: never a body step
                code = None
        ins.signature_code = (self.serial, code)
        return code

    def signature(self, ins: Instruction):
        """A tuple equal to another instruction's exactly when they are the same body step
        (None: never). Unambiguous as one flat tuple: an operand is a shape (a tuple of ints)
        then a dtype, or one constant's part (a tuple starting with "c"); a param is its name
        (a str) then its signature; None separates the outputs."""
        prim = ins.prim
        if prim.shape_from_data or prim.reads_trip_count or prim.user_rule:
            return None
        parts = [id(prim)]
        append = parts.append
        for v, a in zip(ins.invars, ins.args):
            if v is not None:
                append(v.shape)
                append(v.dtype)
            elif type(a) is float:
                append(_PYTHON_FLOAT)
            elif type(a) is np.ndarray:
                append(("c", "ndarray", a.shape, a.dtype.str))
            else:
                append(("c", type(a).__name__, np.shape(a), np.result_type(a).str))
        params = ins.params
        if params:
            for k in sorted(params) if len(params) > 1 else params:
                append(k)
                append(self.param(params[k]))
        append(None)
        for v in ins.outvars:
            append(v.shape)
            append(v.dtype)
        return tuple(parts)

    def param(self, value):
        structure = _structure(value)
        if structure is None:
            return _param_signature(value)
        known = self.params.get(structure)
        if known is None:
            known = self.params[structure] = _param_signature(value)
        return known


# --- the search -----------------------------------------------------------------------------------
class _TapeIndex:
    """What a pass of the search reads of a tape's instructions: where each var is computed
    and read, the concatenates, each instruction's code and the next position with the same
    code. Kept while passes roll nothing: the next pass searches the same instructions with
    longer periods."""

    def __init__(self, instructions: list, signatures: _Signatures):
        self.instructions = instructions
        self.signatures = signatures
        self.defpos, self.first_reader, self.last_reader, self.concatenations = _index(instructions)
        self.codes, self.next = _codes_and_next(instructions, signatures)


def _codes_and_next(instructions: list, signatures: _Signatures) -> tuple[list, list]:
    """Each instruction's code (equal codes: equal signatures; an instruction that is never a
    body step has a negative code equal to no other) and the position of the next
    instruction with the same code (or None)."""
    code_of = signatures.code
    codes = [code_of(x) for x in instructions]
    n = len(codes)
    nxt = [None] * n
    last: dict = {}
    for pos in range(n - 1, -1, -1):
        code = codes[pos]
        if code is None:
            codes[pos] = -1 - pos
            continue
        nxt[pos] = last.get(code)
        last[code] = pos
    return codes, nxt


class _Differs(Exception):
    """A run's iterations are not one body: `first` is the number of leading iterations that
    are (at least MIN_TRIPS), or None."""

    def __init__(self, first: int | None = None):
        super().__init__(first)
        self.first = first if first is not None and first >= MIN_TRIPS else None


class _RunBuilder:
    """One rolled loop being built from the run of `trips` iterations of period p at s
    (see _Roller.build): its body steps, inputs, carries and stacked constants."""

    def __init__(self, roller: _Roller, s: int, p: int, trips: int, probe: bool):
        self.roller = roller
        self.ins = roller.ins
        self.s, self.p, self.limit, self.probe = s, p, trips, probe
        self.inputs: list[Var] = []  # invariant vars and carry inits
        self.input_values: list = []  # their recorded values
        self.input_index: dict[int, int] = {}
        self.const_rows: list[np.ndarray] = []  # constants that differ per iteration, stacked
        self.carries: dict[tuple[int, int], int] = {}  # producer (k, j) -> carry index
        self.carry_init: list = []  # (Var, recorded value) of each carry's initial value
        self.gathered: list[Instruction] = []  # the stacks of lists read one item an iteration
        self.stacks: dict[tuple, tuple] = {}  # the lists' var ids -> (stacked Var, value)
        self.new_stacks: list[tuple] = []  # (those stacked by this run)
        self.steps: list = []  # [prim, refs, static params, progressing params, outputs]

    def at(self, t: int, k: int) -> Instruction:
        return self.ins[self.s + t * self.p + k]

    def input_of(self, v: Var, value) -> int:
        m = self.input_index.get(v.id)
        if m is None:
            m = self.input_index[v.id] = len(self.inputs)
            self.inputs.append(v)
            self.input_values.append(value)
        return m

    def add_step(self, k: int) -> None:
        """Body step k: where each operand comes from and how each param progresses (raises
        _Differs when the iterations disagree)."""
        first = self.at(0, k)
        refs = []
        for a, v0 in enumerate(first.invars):
            refs.append(self.constant(k, a) if v0 is None else self.operand(k, a, first))
        static, progress = self.params(k, first)
        self.steps.append([first.prim, refs, static, progress, len(first.outvars)])

    def constant(self, k: int, a: int) -> tuple:
        """The ref of constant operand a of step k: equal in every iteration, or stacked."""
        values = [self.at(t, k).args[a] for t in range(self.limit)]
        key0 = _value_key(values[0])
        if all(_value_key(x) == key0 for x in values[1:]):
            return ("const", values[0])
        # a constant that differs per iteration: stacked
        arrs = [np.asarray(x) for x in values]
        if any(x.dtype != arrs[0].dtype or x.shape != arrs[0].shape for x in arrs):
            raise _Differs
        stacked = np.stack(arrs)
        stacked.flags.writeable = False
        python_scalar = isinstance(values[0], (bool, int, float, complex))
        self.const_rows.append(stacked)
        return ("crow", len(self.const_rows) - 1, python_scalar)

    def operand(self, k: int, a: int, first: Instruction) -> tuple:
        """The ref of traced operand a of step k (see _Roller.classify)."""
        ref, bad = self.roller.classify(self.s, self.p, k, a, self.limit)
        if ref is None or bad is not None:
            raise _Differs(bad)
        kind = ref[0]
        if kind == "invariant":
            return ("in", self.input_of(ref[1], first.args[a]))
        if kind == "gather":  # one array of a list per iteration: stacked once
            return self.gather(k, a, ref[1])
        if kind == "rows":  # rows 0, 1, ... of a loop's stacked output
            return ("row", self.input_of(ref[1], ref[2]), False)
        if kind == "carry":
            kj = ref[1]
            if kj not in self.carries:
                self.carries[kj] = len(self.carry_init)
                self.carry_init.append((ref[2], first.args[a]))
            elif self.carry_init[self.carries[kj]][0] is not ref[2]:
                raise _Differs
            return ("carry", self.carries[kj])
        return ref

    def gather(self, k: int, a: int, vs: list) -> tuple:
        """The ref of operand a of step k, one item of a list per iteration: a row of the
        list's stack (stacked before the run, or by it)."""
        if self.probe:
            return ("row", -1, False)
        key = tuple(v.id for v in vs)
        stacks = self.stacks
        if key not in stacks:
            stacks[key] = self.roller.stack_before(key, self.s)
        if stacks[key] is None:
            values = [self.at(t, k).args[a] for t in range(len(vs))]
            stacks[key] = self.roller.stacked(vs, values, self.gathered)
            self.new_stacks.append(key)
        return ("row", self.input_of(*stacks[key]), False)

    def params(self, k: int, first: Instruction) -> tuple[tuple, tuple]:
        """(static params, progressing params) of step k."""
        static, progress = [], []
        for name in sorted(first.params):
            values = [self.at(t, k).params[name] for t in range(self.limit)]
            v0 = values[0]
            if all(_param_equal(v, v0) for v in values[1:]):
                static.append((name, v0))
            else:
                progress.append((name, *_progression(values, self.limit)))
        return tuple(static), tuple(progress)

    def finish(self, hoisted: set, guards: list) -> list:
        """The loop instruction, after the instructions it needs before it (stacks of lists,
        hoisted steps); the readers after the run and its guards are redirected to it."""
        roller = self.roller
        at = self.at
        for k in hoisted:
            for j, v in enumerate(at(0, k).outvars):
                m = self.input_of(v, _value(at(0, k), j))
                for t in range(1, self.limit):
                    roller.subst[at(t, k).outvars[j].id] = ("var", v)
                for step in self.steps:
                    step[1] = [
                        ("in", m) if r[:2] == ("body", k) and r[2] == j else r for r in step[1]
                    ]
        renumber = {}
        for k in range(self.p):
            if k not in hoisted:
                renumber[k] = len(renumber)
        outputs, out_vars, out_values, later = self.outputs(hoisted, guards)
        new = roller.capture(self.instruction(hoisted, renumber, outputs, out_vars, out_values))
        pre = [roller.capture(x) for x in self.gathered]
        for key in self.new_stacks:  # (a later run reading the same list reads the same stack)
            roller.stacks[key] = (-1, *self.stacks[key])
        pre += [roller.capture(at(0, k)) for k in sorted(hoisted)]
        # readers after the run read the loop's outputs
        for i, (kind, k, j) in enumerate(outputs):
            if kind == "last":
                roller.subst[at(self.limit - 1, k).outvars[j].id] = ("var", out_vars[i])
        for v, i, t in later:
            pos, j = roller.defpos[v.id]
            value = _value(self.ins[pos], j)
            roller.subst[v.id] = ("row", out_vars[i], t, out_values[i], value)
        # the run's guards become one check of the stacked values
        for gis, (k, j), first_guard, answers in guards:
            i = outputs.index(("stack", k, j))
            for gi in gis:
                roller.guard_plan[gi] = None
            where = f"{first_guard.where}{ROLLED_CHECK}"
            roller.guard_plan[gis[0]] = Guard(out_vars[i], "value", answers, where)
        return pre + [new]

    def outputs(self, hoisted: set, guards: list) -> tuple:
        """The loop's outputs: the values of the run read after it (or by guards, or outputs
        of the tape), as ("last", k, j) or ("stack", k, j); their vars and values; and
        (var, output index, iteration) of each stacked value read after the run."""
        at, limit, roller = self.at, self.limit, self.roller
        end = self.s + self.p * limit
        guarded = [g[1] for g in guards]
        outputs: list[tuple] = []
        out_vars: list[Var] = []
        out_values: list = []
        later: list[tuple] = []
        for k in range(self.p):
            if k in hoisted:
                continue
            for j, v0 in enumerate(at(0, k).outvars):
                read_after = self.read_after(k, j, end)
                if not read_after and (k, j) not in guarded:
                    continue
                if read_after == [limit - 1] and (k, j) not in guarded:
                    outputs.append(("last", k, j))
                    out_vars.append(at(limit - 1, k).outvars[j])
                    out_values.append(_value(at(limit - 1, k), j))
                    continue
                outputs.append(("stack", k, j))
                out_vars.append(roller.new_var((limit, *v0.shape), v0.dtype))
                values = [_value(at(t, k), j) for t in range(limit)]
                out_values.append(np.stack([np.asarray(x) for x in values]))
                for t in read_after:
                    later.append((at(t, k).outvars[j], len(outputs) - 1, t))
        return outputs, out_vars, out_values, later

    def read_after(self, k: int, j: int, end: int) -> list:
        """The iterations whose output j of step k is read outside the run: by an output
        of the tape (or a capture), a guard, or an instruction before or after the run."""
        roller = self.roller
        outside = roller.output_ids
        guarded, first_reader, last_reader = roller.guarded, roller.first_reader, roller.last_reader
        ins, s, p = self.ins, self.s, self.p
        read = []
        for t in range(self.limit):
            vid = ins[s + t * p + k].outvars[j].id
            if vid in outside or vid in guarded:
                read.append(t)
                continue
            first = first_reader.get(vid)
            if first is not None and (first < s or last_reader[vid] >= end):
                read.append(t)
        return read

    def instruction(self, hoisted, renumber, outputs, out_vars, out_values) -> Instruction:
        """The rolled_loop instruction: invariants and carry inits (vars), then the stacked
        constants (constants), as its inputs."""
        init_index = [self.input_of(var, value) for var, value in self.carry_init]
        row_base = len(self.inputs)
        body_steps = []
        for k, (prim, refs, static, progress, n_out) in enumerate(self.steps):
            if k in hoisted:
                continue
            refs = tuple(
                ("row", row_base + r[1], r[2])
                if r[0] == "crow"
                else ("body", renumber[r[1]], r[2])
                if r[0] == "body"
                else r
                for r in refs
            )
            body_steps.append(BodyStep(prim, refs, static, progress, n_out))
        carries_t = tuple(
            (init_index[c], (renumber[kj[0]], kj[1]))
            for kj, c in sorted(self.carries.items(), key=lambda e: e[1])
        )
        loop_outputs = tuple((kind, renumber[k], j) for kind, k, j in outputs)
        loop = RolledLoop(tuple(body_steps), self.limit, carries_t, loop_outputs)
        invars = tuple(self.inputs) + (None,) * len(self.const_rows)
        args = tuple(self.input_values) + tuple(self.const_rows)
        return Instruction(
            rolled_loop_p, invars, args, {"loop": loop}, tuple(out_vars), tuple(out_values)
        )


def _progression(values: list, limit: int) -> tuple:
    """(template, starts, steps) of a param whose integers progress arithmetically over the
    iterations (raises _Differs otherwise)."""
    flat0 = _flat_ints(values[0])
    if flat0 is None:
        raise _Differs
    template = repr(flat0[0])
    # (a value made of ints, None, bools, slices and tuples has the template of its
    # structure: compared as keys, without building and printing each template)
    structure = _structure(values[0])
    flat1 = _template_ints(values[1], template, structure)
    if flat1 is None:
        raise _Differs
    step = [b - a for a, b in zip(flat0[1], flat1)]
    for t in range(2, limit):
        ft = _template_ints(values[t], template, structure)
        if ft is None or any(x != a + t * d for x, a, d in zip(ft, flat0[1], step)):
            raise _Differs(t)
    if not _progression_valid(flat0[0], flat0[1], step, limit):
        raise _Differs
    return flat0[0], tuple(flat0[1]), tuple(step)


def _template_ints(value, template: str, structure) -> list | None:
    """The integers of a param whose template prints as `template` (its structure's key is
    `structure`, or None), or None when its template differs."""
    if structure is not None:
        mine = _structure(value)
        if mine is not None:
            if mine != structure:
                return None
            ints: list = []
            _structure_ints(value, ints)
            return ints
    flat = _flat_ints(value)
    if flat is None or repr(flat[0]) != template:
        return None
    return flat[1]


def _structure_ints(value, ints: list) -> None:
    """Append the integers of a value `_structure` describes, in `_flat_ints`'s order."""
    kind = type(value)
    if kind is int:
        ints.append(value)
    elif kind is tuple:
        for x in value:
            _structure_ints(x, ints)
    elif kind is slice:
        for x in (value.start, value.stop, value.step):
            if type(x) is int:
                ints.append(x)


def _index(instructions: list) -> tuple[dict, dict, dict, list]:
    """(var id -> (position, output index) of the instruction computing it, var id -> first
    position reading it, var id -> last position reading it, positions of concatenates),
    in one walk over the instructions."""
    defpos: dict[int, tuple[int, int]] = {}
    first_reader: dict[int, int] = {}
    last_reader: dict[int, int] = {}
    concatenations = []
    concatenate = shape.concatenate_p
    first_of = first_reader.setdefault
    for pos, ins in enumerate(instructions):
        for v in ins.invars:
            if v is not None:
                first_of(v.id, pos)
                last_reader[v.id] = pos
        outvars = ins.outvars
        if len(outvars) == 1:
            defpos[outvars[0].id] = (pos, 0)
        else:
            for j, v in enumerate(outvars):
                defpos[v.id] = (pos, j)
        if ins.prim is concatenate:
            concatenations.append(pos)
    return defpos, first_reader, last_reader, concatenations


class _Roller:
    """One pass over a tape's instructions (see roll_tape)."""

    def __init__(
        self,
        tape: Tape,
        next_id: int,
        capture,
        max_period: int,
        gathers: bool,
        index: _TapeIndex,
    ):
        self.tape = tape
        self.signatures = index.signatures
        self.max_period = max_period
        self.gathers = gathers
        self.ins = tape.instructions
        self.next_id = next_id
        self.capture = capture
        self.work = 0
        # where each var is computed (position, output index); the first and last positions
        # reading it; the guards of each var; outputs
        self.index = index
        self.defpos, self.first_reader = index.defpos, index.first_reader
        self.last_reader = index.last_reader
        self.guarded: dict[int, list[int]] = {}
        for gi, g in enumerate(tape.guards):
            self.guarded.setdefault(g.var.id, []).append(gi)
        self.output_ids = {v.id for v in tape.outputs if isinstance(v, Var)}
        self.output_ids.update(c[0].id for c in tape.captured)
        # stacks of lists (see stacked): the lists' var ids -> (position, Var, value); a list
        # read one item per iteration by several loops is stacked once
        self.stacks: dict[tuple, tuple] = {}
        for pos in index.concatenations:
            self.stack_of_rows(pos)
        self.rolled_any = False
        self.match_end: dict[int, tuple[int, int]] = {}
        # period -> (end of its stretch, first position refused in it); period -> the
        # position before which it is not tried again (see refused)
        self.refusals: dict[int, tuple[int, int]] = {}
        self.refused_until: dict[int, int] = {}

    def stack_of_rows(self, pos: int) -> None:
        """Note the concatenate at `pos` in `stacks` when it stacks reshaped rows (as
        `stacked` writes them)."""
        ins = self.ins[pos]
        if ins.params.get("axis") != 0:
            return
        sources = []
        for v in ins.invars:
            at = self.defpos.get(v.id) if v is not None else None
            row = self.ins[at[0]] if at is not None else None
            if (
                row is None
                or row.prim is not shape.reshape_p
                or row.invars[0] is None
                or row.outvars[0].shape != (1, *row.invars[0].shape)
            ):
                return
            sources.append(row.invars[0].id)
        self.stacks[tuple(sources)] = (pos, ins.outvars[0], ins.out)

    def new_var(self, shape, dtype) -> Var:
        v = Var(self.next_id, tuple(shape), np.dtype(dtype))
        self.next_id += 1
        return v

    def run(self) -> list:
        ins = self.ins
        n = len(ins)
        codes, nxt = self.index.codes, self.index.next
        self.codes = codes
        max_period = self.max_period
        out: list = []
        self.subst: dict[int, tuple] = {}  # var id -> (stacked var, row) | ("var", Var)
        self.guard_plan: dict[int, Any] = {}  # guard index -> None (dropped) | Guard
        subst = self.subst
        pos = 0
        while pos < n:
            j = nxt[pos]
            # (try_roll finds no candidate where the signature does not recur within reach)
            if j is not None and j - pos <= max_period and self.work < _WORK_LIMIT:
                found = self.try_roll(pos, nxt)
                if found is not None:
                    new_instructions, length = found
                    for new_ins in new_instructions:
                        out.extend(self.materialized(new_ins))
                    pos += length
                    self.rolled_any = True
                    continue
            x = ins[pos]
            if subst:
                out.extend(self.materialized(x))
            else:
                out.append(x)
            pos += 1
        return out

    # --- reading rows of stacked outputs ---
    def materialized(self, ins: Instruction) -> list:
        """`ins` with its reads of rolled values replaced; rows of stacked outputs are read by
        new getitem instructions right before it."""
        pre = []
        if not any(v is not None and v.id in self.subst for v in ins.invars):
            return [ins]
        invars = list(ins.invars)
        for i, v in enumerate(invars):
            if v is not None and v.id in self.subst:
                invars[i] = self.resolve(v, pre)
        return pre + [
            Instruction(ins.prim, tuple(invars), ins.args, ins.params, ins.outvars, ins.out)
        ]

    def resolve(self, v: Var, pre: list) -> Var:
        entry = self.subst[v.id]
        if entry[0] == "var":
            return entry[1]
        _, stacked, row, stacked_value, value = entry
        w = self.new_var(v.shape, v.dtype)
        pre.append(
            Instruction(
                indexing.getitem_p, (stacked,), (stacked_value,), {"idx": (row,)}, (w,), value
            )
        )
        self.subst[v.id] = ("var", w)
        return w

    # --- finding and checking one run ---
    def try_roll(self, s: int, nxt: list):
        codes = self.codes
        if codes[s] < 0:
            return None
        j, tries = nxt[s], 0
        candidates = []
        n = len(codes)
        refused_until = self.refused_until
        while j is not None and j - s <= self.max_period and tries < _CANDIDATES:
            p = j - s
            tries += 1
            if refused_until.get(p, -1) > s:  # (refused in this stretch: see refused)
                j = nxt[j]
                continue
            # matching length: codes[k] == codes[k + p] (a scan from an earlier position with
            # this period already knows where its run ends)
            known = self.match_end.get(p)
            if known is not None and known[0] <= s < known[1]:
                k = known[1]
            else:
                k = s
                while k + p < n and codes[k] == codes[k + p] and codes[k] >= 0:
                    k += 1
                self.work += k - s + 1
                self.match_end[p] = (s, k)
            trips = 1 + (k - s) // p
            if trips >= MIN_TRIPS:
                candidates.append((p, trips, k))
            j = nxt[j]
        # the candidate covering the most instructions first (the shortest body on ties)
        candidates.sort(key=lambda c: (-c[0] * c[1], c[0]))
        for p, trips, k in candidates:
            # a cheap look at the first iterations before the whole run is checked
            if self.build(s, p, MIN_TRIPS, probe=True) is not None:
                while trips >= MIN_TRIPS:
                    result = self.build(s, p, trips)
                    if isinstance(result, int):  # the first iteration that differs
                        trips = result
                        continue
                    if result is not None:
                        self.refusals.pop(p, None)
                        return result, p * trips
                    break
            self.refused(s, p, k)
        return None

    def refused(self, s: int, p: int, match_end: int) -> None:
        """Period p did not roll at s. Inside a stretch where the signatures repeat with
        period p, the run at s + p has the same structure as the run at s, one iteration
        later: once the period has been refused at every position of one whole period of the
        stretch, it is not tried again before the stretch ends. Without this, each position
        of a region that repeats but does not roll (a backward pass reading the forward
        pass's values before these are stacked) costs a probe of p * MIN_TRIPS
        instructions."""
        stretch, first = self.refusals.get(p, (None, s))
        if stretch != match_end:
            first = s
        self.refusals[p] = (match_end, first)
        if s - first + 1 >= p:
            self.refused_until[p] = match_end

    def build(self, s: int, p: int, trips: int, probe: bool = False):
        """The rolled instruction for the run at s, or the number of leading iterations
        that do form a loop (when a later one does not); None when none do. `probe`: only
        check (True when these iterations form a loop), change nothing."""
        self.work += p * trips
        if probe and not self.operands_classified(s, p, trips):
            return None
        run = _RunBuilder(self, s, p, trips, probe)
        try:
            for k in range(p):
                run.add_step(k)
        except _Differs as differs:
            return differs.first
        # guards on values of the run
        guards = self.run_guards(s, p, trips)
        if guards is None:
            return None
        # steps computing the same value in every iteration run once, before the loop
        hoisted = self.invariant_steps(run.steps, run.carries, guards)
        if len(hoisted) == p or all(
            step[0] in _MOVES for k, step in enumerate(run.steps) if k not in hoisted
        ):
            return None  # nothing to loop over, or a loop that only copies rows
        if probe:
            return True
        return run.finish(hoisted, guards)

    def operands_classified(self, s: int, p: int, trips: int) -> bool:
        """Whether every traced operand of the first `trips` iterations at s comes from one
        place (see classify): the check that refuses most probes, made before the constants
        and params are compared (a probe's answer is the same whichever check refuses)."""
        classify = self.classify
        for k in range(p):
            for a, v in enumerate(self.ins[s + k].invars):
                if v is not None:
                    ref, bad = classify(s, p, k, a, trips)
                    if ref is None or bad is not None:
                        return False
        return True

    @staticmethod
    def invariant_steps(steps: list, carries: dict, guards: list) -> set:
        """Body steps whose value is the same in every iteration: invariant operands,
        constants and static params only (not carried, not guarded)."""
        kept = {kj[0] for kj in carries} | {g[1][0] for g in guards}
        hoisted: set = set()
        for k, (_, refs, _, progress, _) in enumerate(steps):
            if progress or k in kept:
                continue
            if all(r[0] in ("in", "const") or (r[0] == "body" and r[1] in hoisted) for r in refs):
                hoisted.add(k)
        return hoisted

    def stack_before(self, key: tuple, s: int) -> tuple | None:
        """(Var, value) of a stack of the vars whose ids are `key` (see stacked) that the
        tape computes before position s, or None."""
        found = self.stacks.get(key)
        if found is None:
            return None
        pos, var, value = found
        if pos >= s or var.id in self.subst:  # (-1: stacked earlier in this pass)
            return None
        return var, value

    def stacked(self, vs: list, values: list, emitted: list) -> tuple:
        """(Var, value) of the values of `vs` stacked along a new first axis; the
        instructions that stack them (a reshape of each and one concatenate) are appended to
        `emitted`. Every item has the same shape and dtype: their readers' signatures are
        equal."""
        first = np.asarray(values[0])
        rows = []
        for v, value in zip(vs, values):
            row = np.reshape(value, (1, *first.shape))
            w = self.new_var(row.shape, v.dtype)
            emitted.append(
                Instruction(
                    shape.reshape_p, (v,), (value,), {"shape": (1, *first.shape)}, (w,), row
                )
            )
            rows.append((w, row))
        stacked_value = np.concatenate([row for _, row in rows], axis=0)
        stacked_var = self.new_var(stacked_value.shape, stacked_value.dtype)
        emitted.append(
            Instruction(
                shape.concatenate_p,
                tuple(w for w, _ in rows),
                tuple(row for _, row in rows),
                {"axis": 0},
                (stacked_var,),
                stacked_value,
            )
        )
        return stacked_var, stacked_value

    def classify(self, s: int, p: int, k: int, a: int, limit: int):
        """(where operand a of body step k comes from, first iteration that disagrees)."""
        ins = self.ins
        vs = [ins[s + t * p + k].invars[a] for t in range(limit)]
        defs = [self.defpos.get(v.id, (-1, 0)) for v in vs]
        base = [s + t * p for t in range(limit)]
        # same iteration
        off0 = defs[0][0] - base[0]
        if 0 <= off0 < k:
            for t in range(1, limit):
                if defs[t][0] - base[t] != off0 or defs[t][1] != defs[0][1]:
                    return ("body", off0, defs[0][1]), t
            return ("body", off0, defs[0][1]), None
        # invariant
        if defs[0][0] < s and all(v is vs[0] for v in vs[1:]):
            return ("invariant", vs[0]), None
        # carry from the previous iteration
        if defs[0][0] < s and limit > 1:
            off1 = defs[1][0] - base[0]
            if 0 <= off1 < p:
                kj = (off1, defs[1][1])
                for t in range(2, limit):
                    if defs[t][0] - base[t - 1] != off1 or defs[t][1] != defs[1][1]:
                        return ("carry", kj, vs[0]), t
                return ("carry", kj, vs[0]), None
        if defs[0][0] < s and all(v is vs[0] for v in vs[1:2]):
            # invariant for a while, then not
            t = next(t for t in range(1, limit) if vs[t] is not vs[0])
            return ("invariant", vs[0]), t
        # one value computed before the run per iteration (a list of arrays indexed by the
        # loop counter): the loop reads row t of their stack in iteration t
        if not self.gathers:
            return None, None
        if any(v.id in self.subst for v in vs):
            # values of a loop rolled in this pass: rows 0, 1, ... of its stacked output are
            # read as they are; anything else waits for the next pass, which reads their
            # rows inside the loop through getitems whose index progresses
            entries = [self.subst[v.id] for v in vs if v.id in self.subst]
            if len(entries) == len(vs) and all(
                e[0] == "row" and e[1] is entries[0][1] and e[2] == t for t, e in enumerate(entries)
            ):
                return ("rows", entries[0][1], entries[0][3]), None
            return None, None
        if all(d[0] < s for d in defs):
            return ("gather", vs), None
        t = next((t for t in range(limit) if defs[t][0] >= s), 0)
        if t and all(d[0] < s for d in defs[:t]) and t >= MIN_TRIPS:
            return ("gather", vs[:t]), t
        return None, None

    def run_guards(self, s: int, p: int, limit: int):
        """[(guard indices, (k, j), first guard, stacked answers)] of the run, or None when
        its guards are not the same in every iteration."""
        if not self.guarded:
            return []
        ins = self.ins
        per_offset: dict[tuple, list] = {}
        for t in range(limit):
            for k in range(p):
                for j, v in enumerate(ins[s + t * p + k].outvars):
                    gis = self.guarded.get(v.id)
                    if gis:
                        per_offset.setdefault((k, j), []).append((t, gis))
        result = []
        guards = self.tape.guards
        for kj, entries in per_offset.items():
            if len(entries) != limit or any(len(g) != 1 for _, g in entries):
                return None
            gs = [guards[g[0]] for _, g in entries]
            kinds = {g.kind for g in gs}
            dtype_kind = gs[0].var.dtype.kind
            if (
                len(kinds) != 1
                or gs[0].var.shape != ()
                or gs[0].kind not in _GUARD_DTYPES
                or dtype_kind not in _GUARD_DTYPES[gs[0].kind]
            ):
                return None
            answers = np.array([_answer_scalar(g.answer) for g in gs], dtype=gs[0].var.dtype)
            if gs[0].kind != "bool" and any(
                not np.array_equal(np.asarray(_answer_scalar(g.answer)), a)
                for g, a in zip(gs, answers)
            ):
                return None  # answers the operand's dtype cannot hold exactly
            result.append(([g[0] for _, g in entries], kj, gs[0], answers))
        return result


def _answer_scalar(answer):
    if isinstance(answer, (np.ndarray, np.generic)):
        return answer.item()
    return answer


def _param_equal(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, RolledLoop) or isinstance(b, RolledLoop):
        return a == b
    try:
        return type(a) is type(b) and bool(a == b) and _value_key(a) == _value_key(b)
    except Exception:
        return False


def _progression_valid(template, start, step, trips) -> bool:
    """Integers of a progressing param keep their sign over the run (negative indices count
    from the end: -1, 0, 1 is not a progression of positions)."""
    for a, d in zip(start, step):
        last = a + (trips - 1) * d
        if (a < 0) != (last < 0):
            return False
    return True


def _value(ins: Instruction, j: int):
    return ins.out[j] if ins.prim.multiple_results else ins.out


def min_tape_length(native_loops: bool) -> int:
    """The shortest tape searched for loops: NATIVE_MIN_TAPE_LENGTH where rolled loops run
    on native drivers (the numba backend), MIN_TAPE_LENGTH where they are interpreted."""
    return NATIVE_MIN_TAPE_LENGTH if native_loops else MIN_TAPE_LENGTH


def roll_tape(tape: Tape, capture=lambda ins: ins, min_length: int | None = None) -> Tape:
    """The tape with its repeated runs rolled (see the module docstring); the tape itself
    when nothing rolls or it is shorter than `min_length` instructions (MIN_TAPE_LENGTH by
    default). `capture(ins)` is applied to each new loop instruction (the program snapshots
    constant arrays with it)."""
    if min_length is None:
        min_length = MIN_TAPE_LENGTH
    if len(tape.instructions) < max(2 * MIN_TRIPS, min_length):
        return tape
    with collector.collector_paused():  # (its full collections would traverse the tape)
        return _roll_long_tape(tape, capture)


def _roll_long_tape(tape: Tape, capture) -> Tape:
    ids = [v.id for v in tape.inputs] + [c[0].id for c in tape.captured]
    ids += [v.id for ins in tape.instructions for v in ins.outvars]
    next_id = max(ids, default=0) + 1
    current = tape
    # bodies that read one value per iteration from a list (gathers) are accepted only in the
    # last passes: a body found without them (in another phase, or longer) is better
    passes = [
        (limit, gathers)
        for gathers in (False, True)
        for limit in PERIOD_LIMITS
        for _ in range(MAX_PASSES)
    ]
    skip = None
    signatures = _Signatures()
    index = None
    for limit, gathers in passes:
        if (limit, gathers) == skip:
            continue  # (this limit's last pass rolled nothing)
        if index is None or index.instructions is not current.instructions:
            index = _TapeIndex(current.instructions, signatures)
        roller = _Roller(current, next_id, capture, limit, gathers, index)
        instructions = roller.run()
        if not roller.rolled_any:
            skip = (limit, gathers)
            continue
        rolled = Tape()
        rolled.inputs = current.inputs
        rolled.captured = current.captured
        rolled.instructions = instructions
        pre: list = []
        rolled.outputs = [
            roller.resolve(o, pre) if isinstance(o, Var) and o.id in roller.subst else o
            for o in current.outputs
        ]
        rolled.instructions.extend(pre)
        guards = []
        for gi, g in enumerate(current.guards):
            if gi in roller.guard_plan:
                if roller.guard_plan[gi] is not None:
                    guards.append(roller.guard_plan[gi])
            elif g.var.id in roller.subst:
                var = roller.resolve(g.var, rolled.instructions)
                guards.append(Guard(var, g.kind, g.answer, g.where))
            else:
                guards.append(g)
        rolled.guards = guards
        next_id = roller.next_id
        current = rolled
    return current
