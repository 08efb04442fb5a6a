"""Indexing in kernels: reads (`x[idx]`) and functional writes (`setitem`, `scatter_add`), with
constant indices or with traced integers (a loop counter: the `dyn_*` primitives).

An index is a tuple of ints, slices, None, Ellipsis and integer arrays (rules/indexing.py's
normalized form). The kernels take basic indices (and one integer array among full slices for
reads, a 1-d scatter-add); writes are explicit loops over the written view. A traced integer
is bounds-checked first: out of range, the kernel returns a failed check and the numpy
backend's code raises NumPy's IndexError. The functions here take the kernel writer `w`
(kernel.py) for names and arguments.
"""

from __future__ import annotations

import numpy as np

from ...core.ir import Instruction, Var
from .scalar import SUPPORTED_DTYPES, cast, literal, numpy_type


class _Slot:
    """A traced integer's place in an index template (filled by dynamic_parts)."""

    def __repr__(self) -> str:
        return "?"


SLOT = _Slot()


def index_parts(idx: tuple, ndim: int) -> list | None:
    """The index with Ellipsis expanded (Numba rejects `...` in reads), or None if unusable."""
    if not isinstance(idx, tuple):
        return None
    used = sum(1 for i in idx if i is not None and i is not Ellipsis)
    parts = []
    for i in idx:
        if i is Ellipsis:
            parts.extend([slice(None)] * (ndim - used))
        else:
            parts.append(i)
    return parts


def template_parts(ins: Instruction, ndim: int) -> list | None:
    """index_parts of a dyn_* instruction's template, SLOT where a traced integer goes."""
    template = list(ins.params["template"])
    for position in ins.params["positions"]:
        template[position] = SLOT
    return index_parts(tuple(template), ndim)


def basic_index(idx) -> bool:
    """Ints, slices, None and Ellipsis only."""
    return all(isinstance(i, (int, slice)) or i is None or i is Ellipsis for i in idx)


def one_int_array(parts: list) -> int | None:
    """The position of the single integer-array index among full slices, or None."""
    found = None
    for k, i in enumerate(parts):
        if isinstance(i, np.ndarray):
            if found is not None or i.dtype.kind not in "iu" or i.ndim != 1:
                return None
            found = k
        elif not (isinstance(i, slice) and i == slice(None)):
            return None
    return found


def paired_int_arrays(parts: list) -> tuple[int, int, int] | None:
    """(first position, count, length) of two or more adjacent 1-d integer arrays of one
    length among full slices (a diagonal: `x[i, i]`, `x[..., i, i + 1]`), or None. NumPy puts
    the arrays' common axis where they stand, so each element of it reads one element."""
    positions = [k for k, i in enumerate(parts) if isinstance(i, np.ndarray)]
    if len(positions) < 2 or positions[-1] - positions[0] + 1 != len(positions):
        return None
    arrays = [parts[k] for k in positions]
    if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays):
        return None
    if len({a.shape[0] for a in arrays}) != 1:
        return None
    if not all(
        isinstance(i, slice) and i == slice(None) for k, i in enumerate(parts) if k not in positions
    ):
        return None
    return positions[0], len(positions), arrays[0].shape[0]


def written_base(ins: Instruction) -> Var | None:
    """The array a write copies: its Var, a stand-in for a constant array, or None."""
    base = ins.invars[0]
    if base is None and isinstance(ins.args[0], np.ndarray) and ins.args[0].ndim:
        base = Var(-1, ins.args[0].shape, ins.args[0].dtype)  # a constant base: copied
    return base


# --- which instructions the kernels take -------------------------------------------------------
def accepts_read(ins: Instruction) -> bool:
    """x[idx] on a traced x: a basic index, or one integer array among full slices."""
    x = ins.invars[0]
    if x is None:
        return False
    parts = index_parts(ins.params["idx"], len(x.shape))
    if parts is None:
        return False
    return (
        basic_index(parts)
        or one_int_array(parts) is not None
        or paired_int_arrays(parts) is not None
    )


def accepts_write(accumulate: bool):
    """setitem (accumulate False) or scatter_add: a basic index; a scatter-add also by one
    integer array into a 1-d array."""

    def accepts(ins: Instruction) -> bool:
        base = written_base(ins)
        if base is None:
            return False
        parts = index_parts(ins.params["idx"], len(base.shape))
        if parts is None:
            return False
        if basic_index(parts) or paired_int_arrays(parts) is not None:
            return True
        return accumulate and len(base.shape) == 1 and len(parts) == 1 and one_int_array(parts) == 0

    return accepts


def accepts_dynamic(n: int):
    """A dyn_* instruction whose indices follow its `n` leading arguments: basic indices once
    the slots are filled, 0-d integer values in them."""

    def accepts(ins: Instruction) -> bool:
        base, out = ins.invars[0], ins.outvars[0]
        if base is None and n == 2:
            base = written_base(ins)
        if (
            base is None
            or not base.shape
            or base.dtype not in SUPPORTED_DTYPES
            or (out.dtype != base.dtype)
        ):
            return False
        if (
            n == 2
            and (
                ins.invars[1].dtype if ins.invars[1] is not None else np.asarray(ins.args[1]).dtype
            )
            not in SUPPORTED_DTYPES
        ):
            return False
        if any(v is None or v.shape != () or v.dtype.kind not in "iu" for v in ins.invars[n:]):
            return False
        parts = template_parts(ins, len(base.shape))
        return parts is not None and all(
            isinstance(p, (int, slice)) or p is SLOT or p is None for p in parts
        )

    return accepts


# --- source ------------------------------------------------------------------------------------
def index_text(w, parts: list) -> str:
    """An index as source: constant arrays become kernel arguments, slots' expressions stay."""
    out = []
    for i in parts:
        if i is None:
            out.append("None")
        elif isinstance(i, slice):
            out.append(
                ":".join("" if x is None else str(x) for x in (i.start, i.stop, i.step))
                if i.step is not None
                else ":".join("" if x is None else str(x) for x in (i.start, i.stop))
            )
        elif isinstance(i, np.ndarray):
            out.append(w.const_array(i))
        elif isinstance(i, str):  # a traced integer's expression (dynamic_parts)
            out.append(i)
        else:
            out.append(str(int(i)))
    return ", ".join(out) if out else ""


def dynamic_parts(w, ins: Instruction, base: str, n: int) -> tuple[list[str], list]:
    """(bounds checks, index parts) of a dyn_* instruction: each slot becomes its integer's
    expression; an index out of range fails a check, and NumPy then raises IndexError."""
    values = iter(ins.invars[n:])
    lines, parts, axis = [], [], 0
    ndim = np.ndim(ins.args[0]) if ins.invars[0] is None else len(ins.invars[0].shape)
    for p in template_parts(ins, ndim):
        if p is SLOT:
            i = w.scalar_ref(next(values))
            lines.append(f"if not (-{base}.shape[{axis}] <= {i} < {base}.shape[{axis}]):")
            lines.append(f"    {w.check_failed()}")
            p = i
        if p is not None:
            axis += 1
        parts.append(p)
    return lines, parts


def emit_read(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    """x[idx] with a constant index."""
    parts = index_parts(ins.params["idx"], len(ins.invars[0].shape))
    if paired_int_arrays(parts) is not None:
        return paired_read_lines(w, ins, target, args[0], parts)
    return w.assign(ins, target, f"{args[0]}[{index_text(w, parts)}]")


def _paired_source_index(w, parts: list, out_index: tuple[str, ...]) -> str:
    """The source element of result element `out_index` for an index of paired integer
    arrays (paired_int_arrays): each array reads its entry at the shared axis's position."""
    start, count, _ = paired_int_arrays(parts)
    shared = out_index[start]
    source = list(out_index[:start])
    source += [f"{w.const_array(parts[start + k])}[{shared}]" for k in range(count)]
    source += list(out_index[start + 1 :])
    return ", ".join(source)


def paired_read_lines(w, ins: Instruction, target: str, x: str, parts: list) -> list[str]:
    """x[..., i, j, ...] with paired integer arrays: explicit loops over the result."""
    out = ins.outvars[0]
    idx = tuple(f"j{k}" for k in range(len(out.shape)))
    lines = [f"{target} = np.empty({w.shape_expr(out.shape)}, {numpy_type(out.dtype)})"]
    indent = ""
    for k, d in enumerate(out.shape):
        lines.append(f"{indent}for {idx[k]} in range({w.dim(d)}):")
        indent += "    "
    value = f"{x}[{_paired_source_index(w, parts, idx)}]"
    if ins.invars[0].dtype != out.dtype:
        value = cast(value, out.dtype)
    lines.append(f"{indent}{target}[{', '.join(idx)}] = {value}")
    return lines


def emit_dynamic_read(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    """x[idx] with traced integers in the index (checked first)."""
    pre, parts = dynamic_parts(w, ins, args[0], 1)
    return w.assign(ins, target, f"{args[0]}[{index_text(w, parts)}]", pre)


def emit_write(accumulate: bool, dynamic: bool):
    """setitem or scatter_add (`accumulate`), with a constant index or traced integers."""

    def emit(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
        if dynamic:
            pre, parts = dynamic_parts(w, ins, args[0], 2)
        else:
            x = ins.invars[0]
            ndim = len(x.shape) if x is not None else np.ndim(ins.args[0])
            pre, parts = [], index_parts(ins.params["idx"], ndim)
        return pre + write_lines(w, ins, target, args, parts, accumulate)

    return emit


def write_lines(
    w, ins: Instruction, target: str, args: list[str], parts: list, accumulate: bool
) -> list[str]:
    """A copy of the base, then the written elements: loops over the view the index selects,
    or a scatter-add helper for an integer-array index."""
    out, v = ins.outvars[0], ins.invars[1]
    value = args[1]
    if v is None and not np.ndim(ins.args[1]):
        value = literal(ins.args[1], out.dtype)
    lines = [f"{target} = {args[0]}.copy()"]
    shape_parts = tuple(0 if isinstance(p, str) else p for p in parts)
    if paired_int_arrays(parts) is not None:
        view_shape = np.broadcast_to(np.zeros((), bool), out.shape)[tuple(parts)].shape
        value_shape = (
            None
            if (v is None and not np.ndim(ins.args[1])) or (v is not None and v.shape == ())
            else (v.shape if v is not None else np.shape(ins.args[1]))
        )
        value_dtype = v.dtype if v is not None else np.asarray(ins.args[1]).dtype
        idx = tuple(f"j{k}" for k in range(len(view_shape)))
        indent = ""
        for k, d in enumerate(view_shape):
            lines.append(f"{indent}for {idx[k]} in range({w.dim(d)}):")
            indent += "    "
        lines.append(
            f"{indent}{target}[{_paired_source_index(w, parts, idx)}] "
            f"{'+=' if accumulate else '='} "
            f"{element(value, value_shape, idx, value_dtype, out.dtype)}"
        )
    elif not accumulate or basic_index(shape_parts):
        view_shape = np.broadcast_to(np.zeros((), bool), out.shape)[shape_parts].shape
        value_shape = (
            None
            if (v is None and not np.ndim(ins.args[1])) or (v is not None and v.shape == ())
            else (v.shape if v is not None else np.shape(ins.args[1]))
        )
        value_dtype = v.dtype if v is not None else np.asarray(ins.args[1]).dtype
        op = "+=" if accumulate else "="
        if view_shape == ():
            lines.append(
                f"{target}[{index_text(w, parts)}] {op} "
                f"{element(value, value_shape, (), value_dtype, out.dtype)}"
            )
            return lines
        view = f"u{out.id}"
        lines.append(f"{view} = {target}[{index_text(w, parts)}]")
        lines.extend(
            assign_loops(w, view, view_shape, value, value_shape, value_dtype, out.dtype, op)
        )
    else:
        helper = (
            "scatter_add_1d"
            if v is not None and v.shape != () or (v is None and np.ndim(ins.args[1]))
            else "scatter_add_1d_scalar"
        )
        lines.append(f"{helper}({target}, {w.const_array(parts[0])}, {value})")
    return lines


def element(
    value: str,
    value_shape: tuple | None,
    index: tuple[str, ...],
    value_dtype: np.dtype,
    dtype: np.dtype,
) -> str:
    """Element `index` (of the target) of a value broadcast against it (None: a scalar)."""
    if value_shape is None:
        expr = value
    else:
        offset = len(index) - len(value_shape)
        parts = ["0" if d == 1 else index[offset + k] for k, d in enumerate(value_shape)]
        expr = f"{value}[{', '.join(parts)}]" if parts else value
    return expr if value_dtype == dtype else cast(expr, dtype)


def assign_loops(
    w,
    target: str,
    shape: tuple,
    value: str,
    value_shape: tuple | None,
    value_dtype: np.dtype,
    dtype: np.dtype,
    op: str = "=",
) -> list[str]:
    """`target[...] op value` as explicit loops (Numba's broadcasting assignment builds
    error messages whose compilation costs seconds)."""
    idx = tuple(f"j{k}" for k in range(len(shape)))
    lines, indent = [], ""
    for k, d in enumerate(shape):
        lines.append(f"{indent}for {idx[k]} in range({w.dim(d)}):")
        indent += "    "
    lines.append(
        f"{indent}{target}[{', '.join(idx)}] {op} "
        f"{element(value, value_shape, idx, value_dtype, dtype)}"
    )
    return lines
