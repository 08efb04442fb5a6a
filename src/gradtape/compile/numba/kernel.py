"""The kernel of one segment of a plan: Numba source computing its loops, scalar statements,
ops and checks.

A kernel takes the program's inputs, the array constants, the result arrays it writes and
the values handed over from earlier segments (`x<k>`, `c<k>`, `o<k>`, `w<var>`); it returns a
status (wrapper.py), the 0-d results and the values later segments need. Sizes are read from
the argument arrays (`d0 = x0.shape[0]`), never written into the source, so another length
that records the same program produces the same text. Local names: `a<var>` an op's array,
`s<var>` a scalar, `v<var>` a loop's value of the current element, `b<k>` a buffer, `t..` a
load hoisted in a loop body, `r<var>` an accumulator.

Elementwise members are written by scalar.py, ops by their lowering table entry
(lowering.py), matrix products in loops by matmul.py, parallel chunks by parallel.py.
"""

from __future__ import annotations

import math

import numpy as np

from ...core.ir import Instruction, Var
from . import indexing, matmul
from .fusion import (
    CHECK,
    HELD_ARRAY,
    HELD_LOOP,
    HELD_SCALAR,
    LOOP,
    OP,
    SCALAR,
    Stage,
    reshaped_operand,
    trailing_reduction,
)
from .generator import Generator, Kernel, KernelArg
from .lowering import LOWERINGS, REDUCTIONS
from .parallel import parallel_loop
from .scalar import BOOL, F32, F64, cast, literal, loop_dtypes, numpy_type, scalar_expression
from .status import STATUS_CHECK, STATUS_LAYOUT, STATUS_OK


# Scalar constants are kernel arguments, so that functions differing only in a constant (200
# closures over another value of a parameter) share one kernel: its text, and so its key and
# machine code, do not depend on the value. The constants of one dtype are one array argument
# (a long unrolled loop has one per iteration). Small whole numbers, halves and non-finite values
# stay literals (x * 2.0, x ** 3, x - 1: written in code, not parameters, and LLVM folds them).
def baked_constant(value, dtype: np.dtype) -> bool:
    """Whether the scalar constant `value` is written into the kernel's text."""
    if dtype.kind not in "iuf":
        return True
    x = float(value)
    return not math.isfinite(x) or (x.is_integer() and abs(x) <= 16) or abs(x) == 0.5


def zeros_index(name: str, shape: tuple) -> str:
    """The first element of an array of `shape` (the array itself for 0-d)."""
    return f"{name}[{', '.join('0' for _ in shape)}]" if shape else f"{name}"


class KernelWriter:
    """Writes the kernel of one segment (`write`)."""

    def __init__(self, gen: Generator, segment: int):
        self.gen = gen
        self.program = gen.program
        self.plan = gen.plan
        self.segment = segment
        self.lines: list[str] = []
        self.args: list[KernelArg] = []
        self.arg_names: set[str] = set()
        self._scalar_locals: set[str] = set()  # scalar constants read at the kernel's start
        self.dims: dict[int, str] = {}
        self.dim_lines: list[str] = []
        self.tmp = 0
        self.returns: list[tuple[str, Var]] = []

    # --- names ---
    def add_arg(self, name: str, dtype: np.dtype, ndim: int | None, shape: tuple = ()) -> str:
        """Make `name` an argument (once); its axes longer than 1 name sizes d0, d1, ..."""
        if name not in self.arg_names:
            self.arg_names.add(name)
            self.args.append(KernelArg(name, dtype, ndim))
            if ndim:
                for k, d in enumerate(shape):
                    if d > 1 and d not in self.dims:
                        self.dims[d] = f"d{len(self.dims)}"
                        self.dim_lines.append(f"{self.dims[d]} = {name}.shape[{k}]")
        return name

    def dim(self, d: int) -> str:
        """A size as source: the name read from an argument's shape, else the number."""
        return self.dims.get(d, str(d))

    def shape_expr(self, shape: tuple) -> str:
        """A shape tuple as source."""
        parts = [self.dim(d) for d in shape]
        return "(" + "".join(p + ", " for p in parts) + ")" if parts else "()"

    def size_expr(self, shape: tuple) -> str:
        """The number of elements of `shape` as source."""
        return " * ".join(self.dim(d) for d in shape) if shape else "1"

    def held(self, v: Var) -> str:
        """How `v` is available in this kernel."""
        home = self.plan.defined_in.get(v.id)
        if home is None or home.segment != self.segment:
            return HELD_SCALAR if v.shape == () else HELD_ARRAY
        return self.plan.held[v.id]

    def array_name(self, v: Var) -> str:
        """The array holding `v` here (an argument, a stored loop value or an op's result)."""
        gen = self.gen
        if v.id in gen.input_pos:
            return self.add_arg(f"x{gen.input_pos[v.id]}", v.dtype, len(v.shape), v.shape)
        home = self.plan.defined_in[v.id]
        if home.segment != self.segment:
            return self.add_arg(f"w{v.id}", v.dtype, len(v.shape), v.shape)
        if self.plan.held[v.id] == HELD_LOOP:
            kind, k = self.plan.storage[v.id]
            if kind == "out":
                return self.add_arg(f"o{k}", v.dtype, len(v.shape), v.shape)
            return f"b{k}"
        if self.plan.held[v.id] == HELD_SCALAR:  # a size-1 array computed as a scalar
            return f"np.full({self.shape_expr(v.shape)}, s{v.id})"
        return f"a{v.id}"

    def scalar_name(self, v: Var) -> str:
        """The scalar holding `v` here (an argument or a local)."""
        gen = self.gen
        if v.id in gen.input_pos:
            return self.add_arg(f"x{gen.input_pos[v.id]}", v.dtype, None)
        home = self.plan.defined_in[v.id]
        if home.segment != self.segment:
            return self.add_arg(f"w{v.id}", v.dtype, None)
        return f"s{v.id}"

    def scalar_ref(self, v: Var) -> str:
        """`v` (of size 1) as a scalar expression."""
        if self.held(v) == HELD_SCALAR:
            return self.scalar_name(v)
        return zeros_index(self.array_name(v), v.shape)

    # --- the kernel ---
    def write(self) -> Kernel:
        """The kernel; written twice, so that every size is read from an argument: the first
        pass finds the arguments, the second uses their shapes from the first line on."""
        self._write()
        self.tmp = 0
        return self._write()

    def _write(self) -> Kernel:
        body: list[str] = []
        for n, (shape, dtype, seg) in enumerate(self.plan.buffers):  # this segment's buffers
            if seg == self.segment:
                body.append(f"b{n} = np.empty({self.shape_expr(shape)}, {numpy_type(dtype)})")
        for stage in self.plan.stages_of(self.segment):
            if stage.kind == LOOP:
                body.extend(self.loop(stage))
            elif stage.kind == SCALAR:
                body.extend(self.scalar_stage(stage.members[0]))
            elif stage.kind == OP:
                body.extend(self.op(stage.members[0]))
            elif stage.kind == CHECK:
                body.extend(self.check(stage.check))
        body.extend(self.outputs_of_segment())
        returns = self.segment_returns()
        # argument checks first: the kernel indexes C-contiguous arrays by shape alone
        head = ["prefer_wide_vectors()"] + self.dim_lines
        arrays = [a.name for a in self.args if a.ndim and not a.name.startswith("c")]
        if arrays:
            head.append(f"if not ({' and '.join(f'is_c({a})' for a in arrays)}):")
            head.append(f"    return {self.status_tuple(STATUS_LAYOUT)}")
        lines = head + body + [f"return {self.result_tuple()}"]
        return Kernel(f"kernel{self.segment}", self.args, returns, lines)

    def segment_returns(self) -> list[tuple[str, Var]]:
        """What the kernel returns after its status: 0-d results computed here, then the
        values later segments read."""
        rets = []
        seen = set()
        for leaf in self.program.outputs:
            v = leaf.var
            if v is None or v.id in seen:
                continue
            home = self.plan.defined_in.get(v.id)
            if home is not None and home.segment == self.segment and v.shape == ():
                rets.append(("scalar", v))
                seen.add(v.id)
        for vid in self.gen.carried_from.get(self.segment, ()):
            rets.append(("carry", self.gen.var_of[vid]))
        self.returns = rets
        return rets

    def result_tuple(self) -> str:
        """The returned tuple of a kernel that ran to the end."""
        parts = [str(STATUS_OK)] + [
            self.scalar_ref(v) if v.shape == () else self.array_name(v) for _, v in self.returns
        ]
        return "(" + ", ".join(parts) + ",)"

    def status_tuple(self, status: int) -> str:
        """The returned tuple of a kernel that stops with `status` (placeholders of the
        returned values' types)."""
        parts = [str(status)]
        for _, v in self.returns:
            if v.shape == ():
                parts.append(literal(0, v.dtype))
            else:
                parts.append(f"np.empty({(0,) * len(v.shape)!r}, {numpy_type(v.dtype)})")
        return "(" + ", ".join(parts) + ",)"

    def outputs_of_segment(self) -> list[str]:
        """Results computed in this segment that no loop stored: copy into the result arrays."""
        lines = []
        for vid, k in self.plan.output_of.items():
            v = self.gen.var_of.get(vid)
            home = self.plan.defined_in.get(vid)
            if v is None or home is None or home.segment != self.segment or v.shape == ():
                continue
            held = self.plan.held[vid]
            if held == HELD_LOOP:
                continue  # the loop wrote it
            o = self.add_arg(f"o{k}", v.dtype, len(v.shape), v.shape)
            if held == HELD_SCALAR:
                lines.append(f"{zeros_index(o, v.shape)} = s{vid}")
            else:
                lines.extend(
                    indexing.assign_loops(self, o, v.shape, f"a{vid}", v.shape, v.dtype, v.dtype)
                )
        return lines

    # --- elementwise statements ---
    def operand_exprs(self, ins: Instruction, access, const_access) -> list[str]:
        """Operands converted to the loop's input dtypes; `access(var)` reads a Var,
        `const_access(array)` a constant array of several elements."""
        in_dts, _ = loop_dtypes(ins)
        out = []
        for k, (v, a) in enumerate(zip(ins.invars, ins.args)):
            want = in_dts[k] if k < len(in_dts) else None
            if v is None and np.size(a) == 1:
                out.append(
                    self.scalar_constant(
                        np.asarray(a).reshape(-1)[0],
                        want if want is not None else np.asarray(a).dtype,
                    )
                )
                continue
            expr, dtype = (
                (access(v), v.dtype)
                if v is not None
                else (const_access(np.asarray(a)), np.asarray(a).dtype)
            )
            out.append(expr if want is None or dtype == want else cast(expr, want))
        return out

    def scalar_stage(self, ins: Instruction) -> list[str]:
        """An elementwise instruction on size-1 values: one statement."""
        args = self.operand_exprs(ins, self.scalar_ref, None)
        return [f"s{ins.outvars[0].id} = {scalar_expression(ins, args)}"]

    def loop(self, stage: Stage) -> list[str]:
        """A loop stage: its members' statements per element, the stores of the values needed
        after it, its reductions and matrix products around it."""
        reads = LoopReads(self, stage)
        body, stores, accumulators = [], [], []
        products = matmul.LoopProducts()
        for ins in stage.members:
            out = ins.outvars[0]
            small = matmul.small_product(ins)
            if small is not None and small.kind == "column":
                body.extend(matmul.small_column_step(self, ins, small, reads, accumulators))
                continue
            if small is not None:
                body.append(matmul.small_row_step(self, ins, small, reads))
            elif matmul.matrix_member(ins):
                body.append(matmul.matrix_step(self, ins, reads.access, reads.pre, products))
            elif trailing_reduction(ins):
                body.append(reads.trailing_reduction_step(ins))
                continue
            elif out.id in self.plan.reductions:
                body.extend(self.reduction_step(ins, reads.access, accumulators, reads.pre))
                continue
            elif reshaped_operand(ins) is not None:  # the same element under another shape
                body.append(f"v{out.id} = {reads.access(reshaped_operand(ins))}")
            else:
                args = self.operand_exprs(ins, reads.access, reads.const_access)
                body.append(f"v{out.id} = {scalar_expression(ins, args, in_loop=True)}")
            if out.id in self.plan.stored:
                kind, k = self.plan.storage[out.id]
                target = (
                    self.add_arg(f"o{k}", out.dtype, len(out.shape), out.shape)
                    if kind == "out"
                    else f"b{k}"
                )
                stores.append(f"{reads.indexed(target, out.shape)} = v{out.id}")
        self.tmp += 1
        inner = reads.load_lines() + body + stores
        lines = list(reads.pre)
        if products.rows or products.columns:
            lines.extend(matmul.blocked_loop(self, reads.size, inner, accumulators, products))
        elif stage.nested:
            lines.extend(reads.nested_loop(inner))
        elif self.gen.threads > 1:
            lines.extend(parallel_loop(self.tmp, self.gen.threads, reads.size, inner, accumulators))
        else:
            lines.append(f"for i in range({reads.size}):")
            lines.extend("    " + s for s in inner)
        lines.extend(acc[2] for acc in accumulators)
        lines.extend(products.finish)
        lines.extend(reads.after)
        return lines

    def reduction_step(self, ins: Instruction, access, accumulators: list, pre: list) -> list[str]:
        """The accumulator update of a fused reduction (or vector dot) inside its loop.

        Appends (accumulator, init, finish, step template, dtype) to `accumulators`; the
        template `{a}`, `{b}` also combines the partial results of parallel chunks.
        """
        out = ins.outvars[0]
        acc = f"r{out.id}"
        dtype = out.dtype
        reduction = REDUCTIONS[ins.prim]
        if reduction.product:
            a, b = (access(v) for v in ins.invars)  # two traced vectors (fusion.vector_dot)
            term = f"({a} * {b})"
        elif reduction.truth:
            v = ins.invars[0]
            term = access(v) if v.dtype == BOOL else f"({access(v)} != 0)"
        else:
            v = ins.invars[0]
            term = access(v) if v.dtype == dtype else cast(access(v), dtype)
        acc_dt = F64 if dtype == F32 and reduction.widen else dtype
        if acc_dt != dtype:
            term = cast(term, acc_dt)
        init, step = reduction.start(acc_dt)
        pre.append(f"{acc} = {init}")
        finish = f"s{out.id} = {acc if acc_dt == dtype else cast(acc, dtype)}"
        accumulators.append((acc, init, finish, step, acc_dt))
        return [f"{acc} = {step.format(a=acc, b=term)}"]

    # --- ops ---
    def op_operand(self, v: Var | None, a) -> str:
        """An op's operand: an array, a scalar, a constant array argument or a literal."""
        if v is None:
            return (
                self.const_array(a) if np.ndim(a) else self.scalar_constant(a, np.asarray(a).dtype)
            )
        if v.shape == ():
            return self.scalar_ref(v)
        return self.array_name(v)

    def scalar_constant(self, value, dtype: np.dtype) -> str:
        """A scalar constant as source: a literal (see baked_constant), else a local read once
        at the kernel's start from its one-element argument."""
        if baked_constant(value, dtype):
            return literal(value, dtype)
        name, position = self.gen.consts.scalar(value, dtype)
        local = f"{name}s{position}"
        if local not in self._scalar_locals:
            self._scalar_locals.add(local)
            self.add_arg(name, dtype, 1)
            self.dim_lines.append(f"{local} = {name}[{position}]")
        return local

    def const_array(self, a) -> str:
        """The argument holding the constant array `a`."""
        a = np.asarray(a)
        name = self.gen.consts.name(a)
        return self.add_arg(name, a.dtype, a.ndim, a.shape)

    def contiguous(self, v: Var | None, expr: str) -> str:
        """`expr` (the array of `v`), copied if it may be a strided view here."""
        if v is None:
            return expr
        if self.gen.maybe_strided(v, self.segment):
            return f"np.ascontiguousarray({expr})"
        return expr

    def op(self, ins: Instruction) -> list[str]:
        """The statements of an op (its entry of the lowering table)."""
        out = ins.outvars[0]
        target = f"s{out.id}" if out.shape == () else f"a{out.id}"
        args = [self.op_operand(v, a) for v, a in zip(ins.invars, ins.args)]
        return LOWERINGS[ins.prim].emit(self, ins, target, args)

    def assign(self, ins: Instruction, target: str, expr: str, pre: list[str] = ()) -> list[str]:
        """`target = expr` after the lines `pre`; a strided result that a loop reads by flat
        index is made contiguous."""
        out = ins.outvars[0]
        if (
            out.shape != ()
            and self.gen.read_by_loop(out)
            and self.gen.maybe_strided(out, self.segment)
        ):
            expr = f"np.ascontiguousarray({expr})"
        return list(pre) + [f"{target} = {expr}"]

    # --- checks ---
    def check_failed(self) -> str:
        """The statement leaving the kernel when a check fails (STATUS_CHECK)."""
        return f"return {self.status_tuple(STATUS_CHECK)}"

    def check(self, index: int) -> list[str]:
        """Check `index` of the program: a failed one returns STATUS_CHECK."""
        c = self.program.checks[index]
        fail = self.check_failed()
        operand = c.operand
        if c.kind == "value":
            return self.value_check(c, fail) if isinstance(operand, Var) else []
        if not isinstance(operand, Var):
            return []  # a folded constant: the answer cannot change
        if c.kind == "shape":
            arr = self.array_name(operand)
            return [f"if {arr}.shape != {tuple(c.answer)!r}:", f"    {fail}"]
        value = self.scalar_ref(operand)
        if c.kind == "bool":
            cond = f"({value} != 0)" if operand.dtype != BOOL else value
            return [f"if {'not ' if c.answer else ''}{cond}:", f"    {fail}"]
        if c.kind in ("int", "index"):
            conv = f"int({value})"
            return [f"if {conv} != {int(c.answer)}:", f"    {fail}"]
        if c.kind == "item":
            a = c.answer
            if isinstance(a, float) and a != a:
                return [f"if not ({value} != {value}):", f"    {fail}"]
            if isinstance(a, (bool, int, float)):
                return [f"if not ({value} == {literal(a, operand.dtype)}):", f"    {fail}"]
            raise NotImplementedError("item check")
        raise NotImplementedError(c.kind)

    def value_check(self, c, fail: str) -> list[str]:
        """A check of the whole value of an array the function read (NaN equal to NaN)."""
        operand = c.operand
        ans = self.const_array(np.asarray(c.answer)) if np.ndim(c.answer) else None
        if ans is None or operand.shape == ():
            value = self.scalar_ref(operand)
            a = np.asarray(c.answer)
            if a.dtype.kind == "f" and a != a:
                return [f"if not ({value} != {value}):", f"    {fail}"]
            return [f"if not ({value} == {literal(a, a.dtype)}):", f"    {fail}"]
        arr = self.array_name(operand)
        return [f"if not same_value({arr}, {ans}):", f"    {fail}"]


class LoopReads:
    """How the body of one loop reads its operands: each distinct read is loaded once into a
    temporary (`t<loop>_<k>`), by the flat index `i` (through a flattened view for arrays of
    several axes) or, in a nested loop, by one index per axis (0 on a broadcast axis); a
    nested loop reads the values of its other shapes (reshapes, fusion.py) by the flat index,
    computed from the axes' indices. `pre` collects the statements before the loop (views,
    and the products' and reductions' set-up)."""

    def __init__(self, w: KernelWriter, stage: Stage):
        self.w = w
        self.stage = stage
        self.shape = stage.shape
        self.nested = stage.nested
        self.index_names = [f"i{k}" for k in range(len(self.shape))] if self.nested else ["i"]
        self.size = w.size_expr(self.shape)
        self.pre: list[str] = []
        self.loads: dict[str, str] = {}  # access text -> temporary
        self.flat_views: dict[str, str] = {}
        self.flat_used = False  # a nested loop's body reads by the flat index
        # reductions over trailing axes: (kept axes, accumulator, initial value, store)
        self.row_accumulators: list[tuple[int, str, str, str]] = []
        self.after: list[str] = []  # statements after the loop

    def trailing_reduction_step(self, ins: Instruction) -> str:
        """The accumulator update of a reduction over the trailing axes of a value of this
        nested loop (fusion.trailing_reduction): the accumulator starts before the loop over
        the first reduced axis and is stored after it, into the array of the kept axes."""
        x, out = ins.invars[0], ins.outvars[0]
        kept = len(x.shape) - len(ins.params["axes"])
        init, step = REDUCTIONS[ins.prim].start(out.dtype)
        acc, partial = f"r{out.id}", f"p{out.id}"
        self.pre.append(
            f"{partial} = np.empty({self.w.shape_expr(x.shape[:kept])}, {numpy_type(out.dtype)})"
        )
        store = f"{partial}[{', '.join(self.index_names[:kept])}] = {acc}"
        self.row_accumulators.append((kept, acc, init, store))
        self.after.append(f"a{out.id} = {partial}.reshape({self.w.shape_expr(out.shape)})")
        return f"{acc} = {step.format(a=acc, b=self.access(x))}"

    def flat_index(self) -> str:
        """The flat index of the current element (in a nested loop, computed from the axes'
        indices)."""
        self.flat_used = True
        return "i"

    def nested_loop(self, inner: list[str]) -> list[str]:
        """The loops over each axis of the shape around `inner` (and the flat index `i` first
        in the innermost body when something reads by it)."""
        w, lines, indent = self.w, [], ""
        for k, d in enumerate(self.shape):
            lines += [
                indent + f"{acc} = {init}"
                for kept, acc, init, _ in self.row_accumulators
                if kept == k
            ]
            lines.append(f"{indent}for {self.index_names[k]} in range({w.dim(d)}):")
            indent += "    "
        if self.flat_used:
            flat = self.index_names[0]
            for k in range(1, len(self.shape)):
                flat = f"({flat}) * {w.dim(self.shape[k])} + {self.index_names[k]}"
            lines.append(f"{indent}i = {flat}")
        lines += [indent + s for s in inner]
        for k in reversed(range(len(self.shape))):
            lines += [
                "    " * k + store for kept, _, _, store in self.row_accumulators if kept == k
            ]
        return lines

    def indexed(self, name: str, vshape: tuple) -> str:
        """The current element of array `name` (of shape `vshape`) in this loop, read through
        a flat view: by the flat index when it has the loop's size, else (in a nested loop, an
        operand that broadcasts partially) by the offset of the axes it does not broadcast
        (measured on a nested loop of 50 x 40: 1.4x faster than indexing by axes, whose
        index arithmetic and wraparound checks LLVM repeats per element)."""
        if math.prod(vshape) == 1:
            return zeros_index(name, vshape)
        if len(vshape) > 1:
            view = self.flat_views.get(name)
            if view is None:
                view = self.flat_views[name] = f"f{len(self.flat_views)}_{self.w.tmp}"
                self.pre.append(f"{view} = {name}.reshape({self.w.size_expr(vshape)})")
            name = view
        if not self.nested or math.prod(vshape) == math.prod(self.shape):
            return f"{name}[{self.flat_index()}]"
        return f"{name}[{self.broadcast_offset(vshape)}]"

    def broadcast_offset(self, vshape: tuple) -> str:
        """The flat offset, in an array of `vshape`, of the nested loop's current element
        (0 on the axes the array broadcasts along)."""
        offset = len(self.shape) - len(vshape)
        terms, stride = [], []
        for k in reversed(range(len(vshape))):
            d = vshape[k]
            if not (d == 1 and self.shape[offset + k] != 1) and d != 1:
                terms.append(" * ".join([self.index_names[offset + k], *stride]))
            if d != 1:
                stride.append(self.w.dim(d))
        return " + ".join(reversed(terms)) if terms else "0"

    def load(self, text: str) -> str:
        """The temporary holding the read `text` (one per distinct read)."""
        t = self.loads.get(text)
        if t is None:
            t = self.loads[text] = f"t{self.w.tmp}_{len(self.loads)}"
        return t

    def access(self, v: Var) -> str:
        """`v` at the current element: a value of this loop, a scalar, or a load."""
        w = self.w
        held = w.held(v)
        if held == HELD_LOOP and w.plan.defined_in[v.id] is self.stage:
            return f"v{v.id}"
        if held == HELD_SCALAR:
            return w.scalar_name(v)
        return self.load(self.indexed(w.array_name(v), v.shape))

    def const_access(self, a: np.ndarray) -> str:
        """A constant array's current element (the array becomes a kernel argument)."""
        return self.load(self.indexed(self.w.const_array(a), a.shape))

    def load_lines(self) -> list[str]:
        """The loads, first in the loop's body."""
        return [f"{t} = {text}" for text, t in self.loads.items()]
