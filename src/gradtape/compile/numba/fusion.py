"""Fusion planning for native backends: which instructions share a loop, what is stored.

`plan(program, ...)` turns a Program into a list of stages, in execution order:

* a **loop** runs once over the flattened iteration space of one shape; its members are
  elementwise instructions of that output shape (operands of that shape, size-1 values, or
  values that broadcast to it) and full reductions (sum, max, min, prod over every axis, and
  the dot product of two vectors) of such values, which become scalar accumulators;
* a **scalar** stage is an elementwise instruction on size-1 values (a plain statement);
* an **op** is any other instruction the backend can lower (matmul, reshape, slices, ...);
* a **python** stage is an instruction it cannot: the program is split there into segments,
  and the wrapper calls the primitive's NumPy implementation between native kernels;
* a **check** is a guard of the Program, placed after the stages that compute its operand.

An elementwise instruction joins the latest loop of its shape in which all its operands are
available (computed inside that loop, or before it); otherwise it opens a new loop at the end.
Under `compile(grad(f))` this puts the backward pass into the forward pass's loop unless it
depends on a reduction of that loop (`eam`: `rho = sum(exp(...))` needs a second loop).
A loop value needed outside its loop (by another loop, an op, a check or an output) is
stored, once, by the loop that computes it: into the output array when it is a result, into
an output array or an earlier buffer whose contents are dead by then (the loops read all
their operands before writing), or into a new buffer. Values are always stored, never
recomputed: the values a later loop needs are typically the expensive ones (`exp` in eam,
whose second loop then reads the stored exponentials from the gradient array itself, as a
hand-written loop does); a cheap value (a difference) used by a later loop costs one write
and one read per element where recomputing it could be cheaper at sizes beyond the caches —
not done, as none of the seeds' workloads has such a value.

Matrix-vector products join loops too. A **row product** `M @ v` (M of shape (N, k), v of
shape (k,), both computed before the loop) is a member of a loop over (N,): each element is
the dot product of a row of M with v. A **column accumulation** `g @ M` (g of shape (N,),
M of shape (N, k)), or `M.T @ g` with M.T a transpose of such an M (or with g a value of a
loop and M.T of at most MAX_COLUMN_STREAMS rows), folds into the loop over (N,) that
produces g, like a reduction: its result of shape (k,) is an array available after the loop.
`X @ w` followed by elementwise work and `X.T @ r` (a regression's gradient) thus reads X in
one pass. A product with a constant matrix of few columns (matmul.small_product) is a plain
member of the loop instead (an expression per element, or accumulators like a reduction's):
the loop stays unblocked and may iterate by axes.

**Reshapes inside loops.** A reshape of a loop's value (`reshape`, or an index that only
adds unit axes, `v[:, None]`) is the same elements in the same order: it joins that loop, and
the loop then also takes the instructions of the new shape, so `(X @ b).reshape(G, R) +
a[:, None]` and the backward pass that reshapes the gradient back run in one loop. A loop
holds values of several shapes of one size; it iterates by the axes of the one shape whose
members read operands that broadcast partially (at most one such shape per loop, and then
no blocked matrix product in it), and reads every value of another shape by the flat index.
A sum (product, max, min) over the trailing axes of a value of a loop that iterates by that
value's axes is accumulated in the loop too, one accumulator per element of the kept axes
(`(y - exp(eta)).sum(axis=1)`, the gradient of a per-group intercept): its result, like a full
reduction's, is an array available after the loop.

**Bounded kernels.** Numba's compile time grows faster than the size of one function (a
fused loop of 4000 elementwise instructions: about 25 s of CPU; Numba's own passes, before
LLVM, are superlinear in a function's length). No loop takes more than MAX_LOOP_MEMBERS
instructions (the next one opens another loop of the same shape, which reads the stored
values it needs), and a segment ends after MAX_KERNEL_MEMBERS instructions, so that no kernel
is larger than that: a longer program becomes several kernels called one after another,
values handed over as between the segments that python stages separate. No program is too
long to compile natively; its compile time grows linearly once its kernels reach the bound.
Numba's bounds are large because a split costs at run time (values that one loop kept in
registers are stored and read back) and, in Numba, compile time too (every value handed
over is returned from one kernel and passed to the next); Python loops, the usual source
of very long programs, are rolled before they get here (compile/rolling.py). The kernels
LLVM's generator compiles (compile/llvm/) are bounded far shorter (`limits`): LLVM's
optimization and code generation are superlinear in one function's length, and there a
value handed on costs an argument. Their length is weighed by `stage_cost`: a loop's
members, and OP_COST for each other stage (a slice or a small product writes loops of its
own), so a kernel of many short stages is cut as early as one long loop; a kernel is cut
between stages only, never inside a loop (see LLVM_KERNEL_COST), and a program whose whole
cost is below LLVM_WHOLE_BELOW is not cut (each kernel costs a call its own entry). A loop driver's
step is planned as one kernel (`limits(..., one_kernel=True)`): its length is bounded where
it is rolled (rolling.MAX_STEP_INSTRUCTIONS).

This module knows nothing about code generation: the backend passes predicates saying which
instructions it can express as scalar expressions (`fusable`) and as ops (`lowerable`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...core.ir import Instruction, Var
from ...rules.indexing import getitem_p
from ...rules.linalg import matmul_p
from ...rules.shape import reshape_p, transpose_p
from ..program import Program
from .lowering import REDUCTIONS
from .matmul import small_product

LOOP, SCALAR, OP, PYTHON, CHECK = "loop", "scalar", "op", "python", "check"
MAX_COLUMN_STREAMS = 16  # rows of M for which M @ g may read M by columns (see plan)
# bounded kernels (see the module docstring): instructions per fused loop, and per kernel
# (measured: a straight-line program of 4000 elementwise instructions compiled in 25 s of CPU
# as one loop, in 205 s as four loops of 1024 in two kernels: values handed from loop to
# loop cost Numba more than the length of one loop)
MAX_LOOP_MEMBERS = 8192
MAX_KERNEL_MEMBERS = 16384
# the kernels LLVM compiles directly (compile/llvm/) are far shorter: LLVM's optimization
# and code generation are superlinear in one function's length, Numba's own passes are not
# in the way, and a value handed to the next kernel costs an argument. A kernel's length is
# its cost: a loop's members and OP_COST for each other stage, so many short stages (slices,
# small products, each its own loops) count as what LLVM sees. Loops keep Numba's bound: a
# fused loop cut in two stores every value the second part reads, and a loop storing into
# hundreds of arrays is what LLVM compiles slowest (its vectorizer checks every pair of
# them for overlap; a straight line of 1,000 operations cut into loops of 1,024 took over
# 300 s, against 0.5 s as one loop)
LLVM_KERNEL_COST = 256
OP_COST = 4
# a program whose whole cost is below this is not cut at all: LLVM compiles it in about a
# second whole, and every further kernel costs each call its own entry (a scalar loop of
# 100 steps, cost 600, took 1.13 us per call as 3 kernels against 0.70 us as one)
LLVM_WHOLE_BELOW = 4096
# nor is a program cut where more values than this would be handed to the next kernel (a
# fused forward and backward pass split between its loops hands on hundreds: a straight
# line of 4,000 operations cut there compiled far slower than whole)
LLVM_MAX_HANDED = 256


@dataclass(frozen=True)
class Limits:
    """How long one loop and one kernel may be (see the module docstring): `loop_members`
    instructions per loop; `kernel` per kernel, counted by `weighed` (each stage's members, or
    its cost), None for no bound (a loop driver's step is one kernel)."""

    loop_members: int
    kernel: int | None
    weighed: bool = False
    whole_below: int = 0  # (weighed) a program of a smaller cost stays one kernel


def limits(direct_llvm: bool, one_kernel: bool = False) -> Limits:
    """The bounds of a plan: for Numba, or for the kernels LLVM compiles directly
    (`direct_llvm`); `one_kernel`: no bound on a kernel's length (the plan's stages must stay
    in one kernel). Read when called, so that tests can make the bounds small."""
    if one_kernel:
        return Limits(MAX_LOOP_MEMBERS, None)
    if not direct_llvm:
        return Limits(MAX_LOOP_MEMBERS, MAX_KERNEL_MEMBERS)
    return Limits(
        MAX_LOOP_MEMBERS,
        min(MAX_KERNEL_MEMBERS, LLVM_KERNEL_COST),
        weighed=True,
        whole_below=min(MAX_KERNEL_MEMBERS, LLVM_WHOLE_BELOW),
    )


# where a value lives in generated code
HELD_SCALAR, HELD_ARRAY, HELD_LOOP = "scalar", "array", "loop"


@dataclass
class Stage:
    """One step of the schedule (see the module docstring); `index` is its position."""

    kind: str
    index: int
    members: list[Instruction] = field(default_factory=list)
    shape: tuple = ()  # loops: the iteration shape
    nested: bool = False  # loops: some operand broadcasts partially (index per axis)
    shapes: set = field(default_factory=set)  # loops: the shapes of its values (one size)
    nest: tuple | None = None  # loops: the shape whose members broadcast partially
    blocked: bool = False  # loops: a blocked matrix product is a member (never nested)
    check: int = -1  # checks: index into program.checks
    segment: int = 0


@dataclass
class Plan:
    """The schedule and where every value lives."""

    stages: list[Stage]
    held: dict[int, str]  # var id -> HELD_SCALAR / HELD_ARRAY / HELD_LOOP
    defined_in: dict[int, Stage]  # var id -> the stage that computes it (not for inputs)
    reductions: dict[int, Stage]  # var id of a fused reduction -> its loop
    stored: set[int]  # loop values also written to an array
    storage: dict[int, tuple[str, int]]  # stored var id -> ("out", leaf) | ("buf", number)
    buffers: list[tuple[tuple, np.dtype, int]]  # buffer number -> (shape, dtype, segment)
    last_use: dict[int, int]  # var id -> last stage index that reads it
    segments: int  # number of kernel segments (python stages separate them)
    output_of: dict[int, int] = field(default_factory=dict)  # var id -> first leaf writing it

    def stages_of(self, segment: int) -> list[Stage]:
        """The native stages (not python) of one segment, in order."""
        return [s for s in self.stages if s.segment == segment and s.kind != PYTHON]


def size_of(shape: tuple) -> int:
    return math.prod(shape)


def full_reduction(ins: Instruction) -> bool:
    """A reduction over every axis of a non-trivial operand (it folds into a loop; which
    primitives reduce, and when over every axis, is the backend's REDUCTIONS table)."""
    if len(ins.invars) != 1 or ins.invars[0] is None or len(ins.outvars) != 1:
        return False
    v = ins.invars[0]
    if size_of(v.shape) <= 1 or v.dtype.kind not in "iubf":
        return False
    reduction = REDUCTIONS.get(ins.prim)
    return reduction is not None and reduction.whole is not None and reduction.whole(ins)


def vector_dot(ins: Instruction) -> bool:
    """matmul of two traced vectors of one length: a multiply folded into a sum."""
    if ins.prim is not matmul_p or any(v is None for v in ins.invars):
        return False
    a, b = ins.invars
    return (
        len(a.shape) == 1
        and a.shape == b.shape
        and size_of(a.shape) > 1
        and a.dtype == b.dtype
        and a.dtype.kind == "f"
    )


def _float_matmul(ins: Instruction) -> tuple | None:
    """The operand shapes of a matmul of two floating arrays of one dtype (traced or constant)."""
    if ins.prim is not matmul_p or len(ins.outvars) != 1:
        return None
    dtypes = {
        v.dtype if v is not None else np.asarray(a).dtype for v, a in zip(ins.invars, ins.args)
    }
    if len(dtypes) != 1 or dtypes != {ins.outvars[0].dtype} or ins.outvars[0].dtype.kind != "f":
        return None
    if any(v is None and not isinstance(a, np.ndarray) for v, a in zip(ins.invars, ins.args)):
        return None
    return tuple(v.shape if v is not None else np.shape(a) for v, a in zip(ins.invars, ins.args))


def row_product(ins: Instruction) -> bool:
    """matmul of a (N, k) matrix by a (k,) vector with N > 1: one dot product per loop element."""
    shapes = _float_matmul(ins)
    return shapes is not None and len(shapes[0]) == 2 and len(shapes[1]) == 1 and (shapes[0][0] > 1)


def accumulated_vector(ins: Instruction) -> Var | None:
    """The (N,) operand of `g @ M` or `M @ g` (M 2-d, N > 1) when the product could be a
    column accumulation in a loop over g's shape (see the module docstring), else None."""
    shapes = _float_matmul(ins)
    if shapes is None or sorted(map(len, shapes)) != [1, 2]:
        return None
    vector_first = len(shapes[0]) == 1
    g = ins.invars[0 if vector_first else 1]
    if g is None or g.shape[0] <= 1:
        return None
    return g


def operands(ins: Instruction) -> list[Var]:
    return [v for v in ins.invars if v is not None]


def operand_shapes(ins: Instruction) -> list[tuple]:
    """Shapes of the array operands: traced values and constant arrays of several elements."""
    return [
        v.shape if v is not None else np.shape(a)
        for v, a in zip(ins.invars, ins.args)
        if v is not None or np.size(a) > 1
    ]


def broadcasts_partially(shape: tuple, target: tuple) -> bool:
    """An operand of `shape` read by a loop over `target` needs an index per axis."""
    return shape != target and size_of(shape) != 1


def nest_shape(ins: Instruction, shape: tuple) -> tuple | None:
    """`shape` when a member of that shape reads an operand that broadcasts partially (the
    loop must then iterate by its axes), else None."""
    if ins.prim is matmul_p:
        return None
    return shape if any(broadcasts_partially(s, shape) for s in operand_shapes(ins)) else None


def reshaped_operand(ins: Instruction) -> Var | None:
    """The traced operand of a reshape (or of an index adding only unit axes, `v[:, None]`)
    that keeps the elements in order, else None."""
    v = ins.invars[0] if ins.invars else None
    if v is None or len(ins.outvars) != 1 or ins.outvars[0].dtype != v.dtype:
        return None
    if ins.prim is reshape_p:
        return v
    if ins.prim is getitem_p:
        idx = ins.params.get("idx")
        if (
            isinstance(idx, tuple)
            and all(i is None or (isinstance(i, slice) and i == slice(None)) for i in idx)
            and sum(i is not None for i in idx) == len(v.shape)
        ):
            return v
    return None


def trailing_reduction(ins: Instruction) -> bool:
    """A floating reduction over the trailing axes (not all) of one traced value, into its
    own dtype (fused into a loop iterating by that value's axes, see the module docstring)."""
    reduction = REDUCTIONS.get(ins.prim)
    if reduction is None or reduction.partial is None or reduction.truth:
        return False
    if len(ins.invars) != 1 or ins.invars[0] is None or len(ins.outvars) != 1:
        return False
    x, out = ins.invars[0], ins.outvars[0]
    axes = sorted(a % len(x.shape) for a in ins.params.get("axes", ())) if x.shape else []
    return (
        x.dtype == out.dtype
        and x.dtype.kind == "f"
        and 0 < len(axes) < len(x.shape)
        and axes == list(range(len(x.shape) - len(axes), len(x.shape)))
    )


def plan(
    program: Program,
    fusable: Callable[[Instruction], bool],
    lowerable: Callable[[Instruction], bool],
    bounds: Limits | None = None,
) -> Plan:
    """Schedule a Program into loops, scalar statements, ops, python stages and checks.

    `fusable(ins)`: the backend has a scalar expression for this elementwise instruction;
    `lowerable(ins)`: it can compute this other instruction in a kernel (else: python stage);
    `bounds`: how long loops and kernels may be (default: Numba's, `limits(False)`).
    """
    bounds = bounds or limits(False)
    planner = _Planner(program, fusable, lowerable, bounds.loop_members)
    planner.schedule()
    stages = planner.stages
    for stage in stages:
        if stage.kind == LOOP and stage.nest is not None:
            stage.nested, stage.shape = True, stage.nest
    last_use, stored, read_by_op, output_of = planner.reads()
    live = _live_across(stages, planner.defined_in, last_use) if bounds.weighed else None
    nsegments = _number_segments(stages, bounds, live)
    storage, buffers = _assign_storage(
        program, stages, planner.defined_in, stored, last_use, output_of, read_by_op
    )
    return Plan(
        stages,
        planner.held,
        planner.defined_in,
        planner.reductions,
        stored,
        storage,
        buffers,
        last_use,
        nsegments,
        output_of,
    )


class _Planner:
    """The schedule while it is built: stages in order, where each value is defined and how
    it is held (see the module docstring)."""

    def __init__(self, program: Program, fusable, lowerable, loop_members: int):
        self.program, self.fusable, self.lowerable = program, fusable, lowerable
        self.loop_members = loop_members  # a loop holding as many is full
        self.stages: list[Stage] = []
        self.held: dict[int, str] = {}
        self.defined_in: dict[int, Stage] = {}
        self.reductions: dict[int, Stage] = {}
        for v in program.inputs:
            self.held[v.id] = HELD_SCALAR if v.shape == () else HELD_ARRAY
        self.checks_after: dict[int, list[int]] = {}
        for k, c in enumerate(program.checks):
            self.checks_after.setdefault(c.position, []).append(k)

    def new_stage(self, kind: str, ins: Instruction | None = None, **kw) -> Stage:
        stage = Stage(kind, len(self.stages), [ins] if ins is not None else [], **kw)
        if kind == LOOP:
            stage.shapes.add(stage.shape)
        self.stages.append(stage)
        return stage

    def usable_in(self, var: Var, loop: Stage) -> bool:
        """Whether a loop at `loop.index` can read `var` (computed inside it or before it)."""
        stage = self.defined_in.get(var.id)
        if stage is None:
            return True
        if var.id in self.reductions:
            return stage.index < loop.index
        return stage.index < loop.index or stage is loop

    def join_loop(
        self,
        ins: Instruction,
        shape: tuple,
        reads: list[Var],
        before: tuple[Var, ...] = (),
        blocked: bool = False,
    ) -> Stage:
        """The latest loop holding values of `shape` that can read `reads` (and `before`,
        which must be computed before it) and iterate as `ins` needs, or a new one; `blocked`:
        `ins` is a blocked matrix product."""
        nest = nest_shape(ins, shape)
        for stage in reversed(self.stages):
            if (
                stage.kind == LOOP
                and shape in stage.shapes
                and len(stage.members) < self.loop_members  # full: another loop after it
                and (nest is None or (stage.nest in (None, nest) and not stage.blocked))
                and not (blocked and stage.nest is not None)
                and all(self.usable_in(v, stage) for v in reads)
                and all(self.defined_in.get(v.id) is not stage for v in before)
            ):
                stage.members.append(ins)
                break
        else:
            stage = self.new_stage(LOOP, ins, shape=shape)
        stage.nest = stage.nest or nest
        stage.blocked = stage.blocked or blocked
        return stage

    def reduce_in_loop(self, ins: Instruction) -> Stage | None:
        """The loop a reduction over trailing axes joins: the one that computes its operand,
        when it iterates by the operand's axes (see the module docstring), else None."""
        if not trailing_reduction(ins):
            return None
        v = ins.invars[0]
        stage = self.defined_in.get(v.id)
        if (
            self.held.get(v.id) != HELD_LOOP
            or stage is None
            or stage.nest != v.shape
            or len(stage.members) >= self.loop_members
        ):
            return None
        stage.members.append(ins)
        return stage

    def reshape_in_loop(self, ins: Instruction) -> Stage | None:
        """The loop a reshape of one of its values joins (see the module docstring), or None."""
        v = reshaped_operand(ins)
        if v is None or self.held.get(v.id) != HELD_LOOP:
            return None
        stage = self.defined_in[v.id]
        if stage.kind != LOOP or len(stage.members) >= self.loop_members:
            return None
        stage.members.append(ins)
        stage.shapes.add(ins.outvars[0].shape)
        return stage

    def transposed(self, v: Var | None) -> bool:
        """Whether `v` is a transpose of a matrix (its rows are the matrix's columns)."""
        stage = self.defined_in.get(v.id) if v is not None else None
        return stage is not None and stage.kind == OP and stage.members[0].prim is transpose_p

    def column_accumulation(self, ins: Instruction) -> bool:
        g = accumulated_vector(ins)
        if g is None:
            return False
        if ins.invars[0] is g:  # g @ M: M's rows are read in order
            return True
        # M @ g: M's columns are read in order, k = len(M) strided streams; fine when M is a
        # transpose, worth it for few rows when g is computed by a loop this product joins
        # (for many, a row product after that loop reads M's rows: 2000 x 2000, 2.3x faster)
        rows = ins.invars[0].shape[0] if ins.invars[0] is not None else np.shape(ins.args[0])[0]
        return self.transposed(ins.invars[0]) or (
            self.held.get(g.id) == HELD_LOOP and rows <= MAX_COLUMN_STREAMS
        )

    def place_checks(self, position: int) -> None:
        for k in self.checks_after.get(position, ()):
            self.new_stage(CHECK, check=k)

    def schedule(self) -> None:
        """Every instruction into a loop, a scalar statement, an op or a python stage."""
        self.place_checks(-1)
        for pos, ins in enumerate(self.program.instructions):
            self.place(ins)
            self.place_checks(pos)

    def place(self, ins: Instruction) -> None:
        held, defined_in = self.held, self.defined_in
        outs = ins.outvars
        small = small_product(ins)
        loop = None if small is not None else self.reshape_in_loop(ins)
        if small is not None and small.kind == "row":
            vector = (ins.invars[small.vector],)
            loop = self.join_loop(ins, outs[0].shape, list(vector), before=vector)
            held[outs[0].id] = HELD_LOOP
            defined_in[outs[0].id] = loop
        elif small is not None:  # a column accumulation: accumulators of the loop over g
            g = ins.invars[small.vector]
            loop = self.join_loop(ins, g.shape, [g])
            self.reductions[outs[0].id] = loop
            held[outs[0].id] = HELD_ARRAY
            defined_in[outs[0].id] = loop
        elif loop is not None:  # a reshape of the loop's value: a value of the loop
            held[outs[0].id] = HELD_LOOP
            defined_in[outs[0].id] = loop
        elif (loop := self.reduce_in_loop(ins)) is not None:  # accumulated per kept element
            self.reductions[outs[0].id] = loop
            held[outs[0].id] = HELD_ARRAY
            defined_in[outs[0].id] = loop
        elif full_reduction(ins) or vector_dot(ins):
            loop = self.join_loop(ins, ins.invars[0].shape, operands(ins))
            self.reductions[outs[0].id] = loop
            held[outs[0].id] = HELD_SCALAR
            defined_in[outs[0].id] = loop
        elif self.column_accumulation(ins):
            loop = self.join_loop(ins, accumulated_vector(ins).shape, operands(ins), blocked=True)
            self.reductions[outs[0].id] = loop
            held[outs[0].id] = HELD_ARRAY
            defined_in[outs[0].id] = loop
        elif row_product(ins):
            ops = tuple(operands(ins))
            loop = self.join_loop(ins, outs[0].shape, list(ops), before=ops, blocked=True)
            held[outs[0].id] = HELD_LOOP
            defined_in[outs[0].id] = loop
        elif len(outs) == 1 and self.fusable(ins):
            out = outs[0]
            if size_of(out.shape) == 1:
                stage = self.new_stage(SCALAR, ins)
                held[out.id] = HELD_SCALAR
            else:
                stage = self.join_loop(ins, out.shape, operands(ins))
                held[out.id] = HELD_LOOP
            defined_in[out.id] = stage
        else:
            stage = self.new_stage(OP if self.lowerable(ins) else PYTHON, ins)
            for v in outs:
                held[v.id] = HELD_SCALAR if v.shape == () else HELD_ARRAY
                defined_in[v.id] = stage

    def reads(self) -> tuple[dict, set, set, dict]:
        """(last stage reading each value, the loop values that must be stored, the values an
        op or python stage reads, var id -> first result leaf)."""
        last_use: dict[int, int] = {}
        stored: set[int] = set()
        read_by_op: set[int] = set()

        def read(var: Var, stage: Stage) -> None:
            last_use[var.id] = max(last_use.get(var.id, -1), stage.index)
            if stage.kind in (OP, PYTHON):
                read_by_op.add(var.id)
            home = self.defined_in.get(var.id)
            if self.held.get(var.id) == HELD_LOOP and home is not stage:
                stored.add(var.id)

        for stage in self.stages:
            if stage.kind == CHECK:
                operand = self.program.checks[stage.check].operand
                if isinstance(operand, Var):
                    read(operand, stage)
                continue
            for ins in stage.members:
                for v in operands(ins):
                    read(v, stage)
        output_of: dict[int, int] = {}
        for k, leaf in enumerate(self.program.outputs):
            if leaf.var is not None:
                last_use[leaf.var.id] = len(self.stages)
                output_of.setdefault(leaf.var.id, k)
                if self.held.get(leaf.var.id) == HELD_LOOP:
                    stored.add(leaf.var.id)
        return last_use, stored, read_by_op, output_of


def stage_cost(stage: Stage) -> int:
    """What a stage adds to a kernel's length for LLVM (see LLVM_KERNEL_COST): a loop's
    members, OP_COST for an op, one for a scalar statement, nothing for a check."""
    if stage.kind == LOOP:
        return len(stage.members)
    if stage.kind == OP:
        return OP_COST
    return 1 if stage.kind == SCALAR else 0


def _live_across(stages: list[Stage], defined_in: dict, last_use: dict) -> list[int]:
    """For each stage index i, how many values computed before stage i are read at or
    after it (what a kernel ending before stage i would hand on)."""
    change = [0] * (len(stages) + 2)
    for vid, stage in defined_in.items():
        last = last_use.get(vid, -1)
        if last > stage.index:
            change[stage.index + 1] += 1
            change[min(last, len(stages)) + 1] -= 1
    live, running = [], 0
    for i in range(len(stages)):
        running += change[i]
        live.append(running)
    return live


def _number_segments(stages: list[Stage], bounds: Limits, live: list[int] | None = None) -> int:
    """Python stages separate native kernels: each gets a segment of its own. A segment
    also ends once it holds `bounds.kernel` instructions (or that cost: bounded kernels),
    at the first stage before which at most LLVM_MAX_HANDED values are live (`live`)."""
    segment = 0
    length = 0
    limit = bounds.kernel
    if bounds.weighed and sum(stage_cost(s) for s in stages) < bounds.whole_below:
        limit = None
    for stage in stages:
        if stage.kind == PYTHON:
            segment += 1
            stage.segment = segment
            segment += 1
            length = 0
            continue
        if (
            limit is not None
            and length >= limit
            and stage.kind != CHECK
            and (live is None or live[stage.index] <= LLVM_MAX_HANDED)
        ):
            segment += 1
            length = 0
        stage.segment = segment
        length += stage_cost(stage) if bounds.weighed else len(stage.members)
    return segment + 1


@dataclass
class _Array:
    """One array of a plan's storage: the values it can hold (shape, dtype, segment) and the
    intervals of stage indices over which it holds them."""

    shape: tuple
    dtype: np.dtype
    segment: int
    spans: list[tuple[int, int]] = field(default_factory=list)


def _live_interval(vid: int, stages: list[Stage], defined_in, last_use, read_by_op) -> tuple:
    """The stage indices over which value `vid` must stay in its array."""
    start = defined_in[vid].index
    stop = last_use.get(vid, start)
    segment = defined_in[vid].segment
    # read from a later segment (handed over) or by an op (maybe through a view): the array
    # stays live to the end
    if (
        vid in read_by_op
        or stop >= len(stages)
        or any(s.segment != segment for s in stages if s.index == stop)
    ):
        stop = len(stages) + 1
    return start, stop


def _fits(spans: list[tuple[int, int]], start: int, stop: int, stages: list[Stage]) -> bool:
    """Whether an array holding values over `spans` can hold one more over [start, stop]."""
    for a, b in spans:
        if stop < a or b < start:
            continue
        if stop == a and stages[a].kind == LOOP and stop != start:
            continue  # last read in the loop that writes the other value
        if b == start and stages[b].kind == LOOP and a != b:
            continue
        return False
    return True


def _assign_storage(
    program: Program,
    stages: list[Stage],
    defined_in: dict,
    stored: set,
    last_use: dict,
    output_of: dict,
    read_by_op: set,
):
    """Arrays for stored loop values: the result array, a dead one of the same type, or new.

    A storage holds values over intervals of stage indices. Two intervals may touch at a
    loop: its loads all come before its stores, element by element, so a loop may read a
    value and write another one into the same array. Values read by a later segment (they
    cross a python stage), values read by an op (its result may be a view of them: a slice,
    a reshape) and results keep their array to the end.
    """
    var_of = {v.id: v for s in stages for ins in s.members for v in ins.outvars}
    storage: dict[int, tuple[str, int]] = {}
    arrays: dict[tuple[str, int], _Array] = {}
    buffers: list[tuple[tuple, np.dtype, int]] = []
    for vid, leaf in output_of.items():  # results first: their arrays are fixed
        if vid in stored:
            v, home = var_of[vid], defined_in[vid]
            storage[vid] = ("out", leaf)
            arrays[("out", leaf)] = _Array(
                v.shape, v.dtype, home.segment, [(home.index, len(stages) + 1)]
            )
    for vid in sorted((v for v in stored if v not in storage), key=lambda v: defined_in[v].index):
        v, segment = var_of[vid], defined_in[vid].segment
        start, stop = _live_interval(vid, stages, defined_in, last_use, read_by_op)
        key = next(
            (
                k
                for k, a in arrays.items()
                if (a.shape, a.dtype, a.segment) == (v.shape, v.dtype, segment)
                and _fits(a.spans, start, stop, stages)
            ),
            None,
        )
        if key is None:
            key = ("buf", len(buffers))
            buffers.append((v.shape, v.dtype, segment))
            arrays[key] = _Array(v.shape, v.dtype, segment)
        arrays[key].spans.append((start, stop))
        storage[vid] = key
    return storage, buffers
