"""The lowering table: the primitives kernels compute between loops, keyed by Primitive.

Elementwise primitives fuse into loops through their declared scalar expressions
(scalar.py); every other primitive a kernel can compute has an entry here. An entry holds
both what it accepts and how it is written, so the two cannot disagree:

* `accepts(ins)`: whether a kernel can compute this instruction (its operands' dtypes,
  shapes, constant or traced); otherwise the instruction runs through NumPy between kernels
  (a python stage of the plan).
* `emit(w, ins, target, args) -> lines`: the statements computing it into `target`, given
  the operands' expressions `args` and the kernel writer `w` (kernel.py).
* `view`: the result may be a strided view of an operand (copied before a loop reads it by
  flat index).

`REDUCTIONS` says how each reduction accumulates: fused into a loop (fusion.py folds a
reduction over every axis, and the dot product of two vectors, into the loop over its
operand) or over some axes (an op here). `describe()` lists the primitives of each kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...core.ir import Instruction
from ...core.primitive import REGISTRY, Primitive
from ...rules import indexing as indexing_rules
from ...rules import linalg, reductions, shape
from . import indexing, matmul
from .scalar import SUPPORTED_DTYPES, cast, literal


@dataclass(frozen=True)
class Lowering:
    """One entry of the table (see the module docstring)."""

    accepts: Callable[[Instruction], bool]
    emit: Callable[..., list[str]]
    view: bool = False


@dataclass(frozen=True)
class Reduction:
    """How a reduction accumulates.

    start(dtype) -> (initial value, step template in {a} (the accumulator) and {b}): the
    accumulator of a loop (the template also adds up the partial results of parallel chunks).
    whole(ins): the instruction reduces every axis (fusion folds it into its operand's loop).
    partial(dtype) -> step template in {a} and {x}, for a reduction over some axes (an op);
    None: such reductions run through NumPy. truth: the operand counts as a bool (any, all);
    widen: float32 values are accumulated in float64; product: the dot product of two
    vectors (matmul), accumulated as a sum.
    """

    start: Callable[[np.dtype], tuple[str, str]]
    whole: Callable[[Instruction], bool] | None = None
    partial: Callable[[np.dtype], str] | None = None
    truth: bool = False
    widen: bool = False
    product: bool = False


def _dtype(v, a) -> np.dtype:
    return v.dtype if v is not None else np.asarray(a).dtype


def plain_operands(ins: Instruction, scalars: tuple | bool = ()) -> bool:
    """Operands of supported dtypes, none of them a 0-d traced value except at the positions
    `scalars` (True: anywhere)."""
    for k, (v, a) in enumerate(zip(ins.invars, ins.args)):
        if _dtype(v, a) not in SUPPORTED_DTYPES or (
            v is not None and v.shape == () and not (scalars is True or k in scalars)
        ):
            return False
    return True


# --- reductions ---------------------------------------------------------------------------------
def _every_axis(ins: Instruction) -> bool:
    return (
        len(ins.params["axes"]) == len(ins.invars[0].shape) and ins.outvars[0].dtype.kind in "iuf"
    )


def _no_axis(ins: Instruction) -> bool:
    """any / all with no axis and no keepdims: a 0-d result."""
    return (
        set(ins.params) <= {"axis", "keepdims"}
        and ins.params.get("axis") is None
        and not ins.params.get("keepdims")
        and ins.outvars[0].shape == ()
    )


def _extreme(kind: str) -> Reduction:
    def start(dt: np.dtype) -> tuple[str, str]:
        if dt.kind == "f":
            init = literal(-np.inf if kind == "max" else np.inf, dt)
            return init, f"{kind}_step({{a}}, {{b}})"
        info = np.iinfo(dt)
        init = literal(info.min if kind == "max" else info.max, dt)
        return init, f"int_{kind}_step({{a}}, {{b}})"

    def partial(dt: np.dtype) -> str:
        return f"{kind}_step({{a}}, {{x}})" if dt.kind == "f" else f"int_{kind}_step({{a}}, {{x}})"

    return Reduction(start, _every_axis, partial)


def _sum_start(dt: np.dtype) -> tuple[str, str]:
    return literal(0, dt), "reduce_add({a}, {b})" if dt.kind == "f" else "({a} + {b})"


def _prod_start(dt: np.dtype) -> tuple[str, str]:
    return literal(1, dt), "reduce_mul({a}, {b})" if dt.kind == "f" else "({a} * {b})"


REDUCTIONS: dict[Primitive, Reduction] = {
    reductions.reduce_sum: Reduction(_sum_start, _every_axis, lambda dt: "{a} + {x}", widen=True),
    reductions.reduce_prod: Reduction(_prod_start, _every_axis, lambda dt: "{a} * {x}", widen=True),
    reductions.reduce_max: _extreme("max"),
    reductions.reduce_min: _extreme("min"),
    REGISTRY["any"]: Reduction(lambda dt: ("False", "({a} | {b})"), _no_axis, truth=True),
    REGISTRY["all"]: Reduction(lambda dt: ("True", "({a} & {b})"), _no_axis, truth=True),
    linalg.matmul_p: Reduction(_sum_start, widen=True, product=True),
}


def _accepts_partial_reduction(ins: Instruction) -> bool:
    x = ins.invars[0]
    return x is not None and ins.outvars[0].dtype.kind in "iuf" and x.dtype.kind in "iuf"


def _emit_partial_reduction(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    """A reduction over some axes: explicit loops into a result of the kept axes."""
    x, out = ins.invars[0], ins.outvars[0]
    axes = tuple(a % len(x.shape) for a in ins.params["axes"])
    kept = tuple(d for k, d in enumerate(x.shape) if k not in axes)
    reduction = REDUCTIONS[ins.prim]
    init = reduction.start(out.dtype)[0]
    acc = f"p{out.id}"
    lines = [f"{acc} = np.full({w.shape_expr(kept)}, {init})"]
    indent = ""
    idx = [f"j{k}" for k in range(len(x.shape))]
    for k, d in enumerate(x.shape):
        lines.append(f"{indent}for {idx[k]} in range({w.dim(d)}):")
        indent += "    "
    kept_idx = [idx[k] for k in range(len(x.shape)) if k not in axes]
    a_ref = f"{acc}[{', '.join(kept_idx)}]" if kept_idx else f"{acc}[()]"
    value = f"{args[0]}[{', '.join(idx)}]"
    if x.dtype != out.dtype:
        value = cast(value, out.dtype)
    lines.append(f"{indent}{a_ref} = {reduction.partial(out.dtype).format(a=a_ref, x=value)}")
    if out.shape == ():
        lines.append(f"{target} = {acc}[()]")
    else:
        lines.append(f"{target} = {acc}.reshape({w.shape_expr(out.shape)})")
    return lines


def _accepts_scalar_reduction(ins: Instruction) -> bool:
    """A sum, product, max or min of a 0-d value (np.sum(np.sum(x))): the value itself."""
    x, out = ins.invars[0], ins.outvars[0]
    return (
        x is not None
        and x.shape == ()
        and out.shape == ()
        and x.dtype in SUPPORTED_DTYPES
        and x.dtype.kind in "biuf"
        and out.dtype.kind in "iuf"
    )


def _emit_scalar_reduction(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    x, out = ins.invars[0], ins.outvars[0]
    value = args[0] if x.dtype == out.dtype else cast(args[0], out.dtype)
    return w.assign(ins, target, value)


def _reduction_lowering() -> Lowering:
    """A reduction over some axes (explicit loops), or of a 0-d value (the value)."""
    partial = _checked(_accepts_partial_reduction)

    def accepts(ins: Instruction) -> bool:
        return _accepts_scalar_reduction(ins) or partial(ins)

    def emit(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
        if _accepts_scalar_reduction(ins):
            return _emit_scalar_reduction(w, ins, target, args)
        return _emit_partial_reduction(w, ins, target, args)

    return Lowering(accepts, emit)


# --- shapes, concatenation, cumulative ops -----------------------------------------------------
def _traced_first(ins: Instruction) -> bool:
    return ins.invars[0] is not None


def _emit_reshape(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    x, out = ins.invars[0], ins.outvars[0]
    if x.shape == ():
        return w.assign(ins, target, f"np.full({w.shape_expr(out.shape)}, {args[0]})")
    if out.shape == ():  # one element to a scalar (a 0-d array is not a kernel's scalar type)
        return w.assign(ins, target, f"{w.contiguous(x, args[0])}.ravel()[0]")
    return w.assign(ins, target, f"{w.contiguous(x, args[0])}.reshape({w.shape_expr(out.shape)})")


def _emit_transpose(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    return w.assign(ins, target, f"np.transpose({args[0]}, {tuple(ins.params['axes'])!r})")


def _emit_broadcast(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    out = ins.outvars[0]
    if ins.invars[0].shape == ():
        return w.assign(ins, target, f"np.full({w.shape_expr(out.shape)}, {args[0]})")
    return w.assign(ins, target, f"np.broadcast_to({args[0]}, {w.shape_expr(out.shape)})")


# Numba types np.concatenate of a tuple element by element, and LLVM's loop strength
# reduction on the result grows far faster than the tuple: 500 pieces (a vmap over 500
# members stacked) did not finish compiling in 15 minutes. Longer concatenations run
# through NumPy between kernels.
MAX_NATIVE_CONCATENATE = 32


def _accepts_concatenate(ins: Instruction) -> bool:
    if len(ins.args) > MAX_NATIVE_CONCATENATE:
        return False
    if ins.invars[0] is None:
        return True
    out = ins.outvars[0]
    return all(
        _dtype(v, a) == out.dtype and (v is not None or isinstance(a, np.ndarray))
        for v, a in zip(ins.invars, ins.args)
    )


def _emit_concatenate(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    parts = [w.contiguous(v, s) for v, s in zip(ins.invars, args)]
    return w.assign(
        ins, target, f"np.concatenate(({', '.join(parts)},), axis={ins.params['axis']})"
    )


def _accepts_cumulative(ins: Instruction) -> bool:
    x = ins.invars[0]
    return x is not None and len(x.shape) == 1 and ins.outvars[0].dtype == x.dtype


def _cumulative(function: str) -> Callable[..., list[str]]:
    return lambda w, ins, target, args: w.assign(ins, target, f"{function}({args[0]})")


# --- the table ----------------------------------------------------------------------------------
def _checked(accepts: Callable[[Instruction], bool], scalars: tuple | bool = ()):
    """`accepts` after plain_operands (the operand checks every op but dyn_* makes)."""
    return lambda ins: plain_operands(ins, scalars) and accepts(ins)


def _table() -> dict[Primitive, Lowering]:
    ix = indexing_rules
    table = {
        ix.getitem_p: Lowering(_checked(indexing.accepts_read), indexing.emit_read, view=True),
        ix.dyn_getitem_p: Lowering(
            indexing.accepts_dynamic(1), indexing.emit_dynamic_read, view=True
        ),
        ix.setitem_p: Lowering(
            _checked(indexing.accepts_write(False), (1,)), indexing.emit_write(False, dynamic=False)
        ),
        ix.scatter_add_p: Lowering(
            _checked(indexing.accepts_write(True), (1,)), indexing.emit_write(True, dynamic=False)
        ),
        ix.dyn_setitem_p: Lowering(
            indexing.accepts_dynamic(2), indexing.emit_write(False, dynamic=True)
        ),
        ix.dyn_scatter_add_p: Lowering(
            indexing.accepts_dynamic(2), indexing.emit_write(True, dynamic=True)
        ),
        shape.reshape_p: Lowering(_checked(_traced_first, True), _emit_reshape),
        shape.transpose_p: Lowering(_checked(_traced_first), _emit_transpose, view=True),
        shape.broadcast_p: Lowering(_checked(_traced_first, True), _emit_broadcast, view=True),
        shape.concatenate_p: Lowering(_checked(_accepts_concatenate), _emit_concatenate),
        reductions.cumsum_p: Lowering(_checked(_accepts_cumulative), _cumulative("np.cumsum")),
        reductions.cumprod_p: Lowering(_checked(_accepts_cumulative), _cumulative("np.cumprod")),
        linalg.matmul_p: Lowering(_checked(matmul.accepts_matmul), matmul.emit_matmul),
    }
    for prim, reduction in REDUCTIONS.items():
        if reduction.partial is not None:
            table[prim] = _reduction_lowering()
    return table


LOWERINGS: dict[Primitive, Lowering] = _table()


def lowering_for(ins: Instruction) -> Lowering | None:
    """The entry that computes this instruction in a kernel, or None (it runs through NumPy)."""
    if ins.prim.multiple_results or len(ins.outvars) != 1:
        return None
    if ins.outvars[0].dtype not in SUPPORTED_DTYPES:
        return None
    entry = LOWERINGS.get(ins.prim)
    return entry if entry is not None and entry.accepts(ins) else None


def lowerable(ins: Instruction) -> bool:
    """Whether a non-fused instruction has a Numba translation here (else: python stage)."""
    return lowering_for(ins) is not None


def is_view(prim: Primitive) -> bool:
    """Whether an op of this primitive may return a strided view of its operand."""
    entry = LOWERINGS.get(prim)
    return entry is not None and entry.view
