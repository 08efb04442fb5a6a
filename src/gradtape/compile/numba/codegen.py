"""Source generation for the numba backend: a fusion plan becomes Numba kernels and a wrapper.

`generate(program)` plans the program (fusion.py) and writes

* one module of plain Python functions, `kernel0`, `kernel1`, ... (one per segment between
  python stages), that the backend compiles with `numba.njit`. A kernel takes the program's
  inputs, the array constants, the result arrays it writes and the values handed over from
  earlier segments; it returns a status (0: done, 1: an array argument is not C-contiguous,
  2: a check failed), the 0-d results and the values later segments need. Sizes are read
  from the argument arrays (`d0 = x0.shape[0]`), never written into the source, so another
  length that records the same program produces the same text and reuses the compiled
  kernel; the text is also the cache key. The argument types are listed in the text.
* the source of the Python wrapper `run(*leaves, O)` of this variant (it allocates results,
  calls the kernels, runs python stages, and hands unusual calls to the numpy backend).

Nothing here imports Numba: generating source is cheap and happens in the caller's thread.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...core.ir import Instruction, Var
from ..program import Program, tree_expr
from . import fusion, indexing, matmul
from .fusion import CHECK, HELD_ARRAY, HELD_LOOP, HELD_SCALAR, LOOP, OP, PYTHON, SCALAR, Plan
from .lowering import LOWERINGS, REDUCTIONS, is_view, lowerable
from .matmul import PARALLEL_MIN_CHUNK, blas_matmul, matrix_member
from .scalar import (
    BOOL,
    F32,
    F64,
    cast,
    fusable,
    literal,
    loop_dtypes,
    scalar_expression,
)
from .scalar import numpy_type as _numpy_type
from .wrapper import STATUS_CHECK, STATUS_LAYOUT, STATUS_OK

GENERATOR_VERSION = "1"


# --- the generator ---------------------------------------------------------------------------
@dataclass
class KernelArg:
    """One argument of a kernel: its name, dtype and ndim (None: a scalar)."""

    name: str
    dtype: np.dtype
    ndim: int | None


@dataclass
class Kernel:
    name: str
    args: list[KernelArg]
    returns: list[tuple[str, Var]]  # ("scalar", var) 0-d results, ("carry", var) handed on
    lines: list[str] = field(default_factory=list)


@dataclass
class Generated:
    """What `generate` produces; `module` is compiled, `key` names it in caches."""

    module: str
    key: str
    kernels: list[Kernel]
    wrapper: str
    wrapper_consts: dict
    consts: list[np.ndarray]  # kernel constant arrays c0, c1, ... (C-contiguous)
    plan: Plan
    generator: _Generator = field(repr=False, default=None)
    loops: dict = field(default_factory=dict)  # id(instruction) -> its native_loops.NativeLoop

    def bound_wrapper(self) -> tuple[str, dict]:
        """The wrapper for kernels known before the first call (backend="numba"): they are
        closure constants k0, k1, ... instead of being read from the state on every call."""
        return _wrapper_text(self.generator, self.kernels, bound=True)


class _Consts:
    """Array constants passed to kernels as c0, c1, ... (by identity)."""

    def __init__(self):
        self.arrays: list[np.ndarray] = []
        self._by_id: dict[int, str] = {}

    def name(self, a: np.ndarray) -> str:
        key = id(a)
        n = self._by_id.get(key)
        if n is None:
            n = self._by_id[key] = f"c{len(self.arrays)}"
            self.arrays.append(np.ascontiguousarray(a))
        return n


class _KernelWriter:
    """Writes the kernel of one segment."""

    def __init__(self, gen: _Generator, segment: int):
        self.gen = gen
        self.program = gen.program
        self.plan = gen.plan
        self.segment = segment
        self.lines: list[str] = []
        self.args: list[KernelArg] = []
        self.arg_names: set[str] = set()
        self.dims: dict[int, str] = {}
        self.dim_lines: list[str] = []
        self.tmp = 0
        self.returns: list[tuple[str, Var]] = []

    # --- names ---
    def add_arg(self, name: str, dtype: np.dtype, ndim: int | None, shape: tuple = ()) -> str:
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
        return self.dims.get(d, str(d))

    def shape_expr(self, shape: tuple) -> str:
        parts = [self.dim(d) for d in shape]
        return "(" + "".join(p + ", " for p in parts) + ")" if parts else "()"

    def size_expr(self, shape: tuple) -> str:
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
        return self._zeros_index(self.array_name(v), v.shape)

    @staticmethod
    def _zeros_index(name: str, shape: tuple) -> str:
        return f"{name}[{', '.join('0' for _ in shape)}]" if shape else f"{name}"

    # --- stages ---
    def write(self) -> Kernel:
        """The kernel; written twice, so that every size is read from an argument: the first
        pass finds the arguments, the second uses their shapes from the first line on."""
        self._write()
        self.tmp = 0
        return self._write()

    def _write(self) -> Kernel:
        stages = self.plan.stages_of(self.segment)
        body: list[str] = []
        # buffers of this segment
        for n, (shape, dtype, seg) in enumerate(self.plan.buffers):
            if seg == self.segment:
                body.append(f"b{n} = np.empty({self.shape_expr(shape)}, {_numpy_type(dtype)})")
        for stage in stages:
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
        kernel = Kernel(f"kernel{self.segment}", self.args, returns, lines)
        return kernel

    def segment_returns(self) -> list[tuple[str, Var]]:
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

    def _ret_expr(self, kind: str, v: Var) -> str:
        if v.shape == ():
            return self.scalar_ref(v)
        name = self.array_name(v)
        return name

    def result_tuple(self) -> str:
        parts = [str(STATUS_OK)] + [self._ret_expr(k, v) for k, v in self.returns]
        return "(" + ", ".join(parts) + ",)"

    def status_tuple(self, status: int) -> str:
        parts = [str(status)]
        for _, v in self.returns:
            if v.shape == ():
                parts.append(literal(0, v.dtype))
            else:
                parts.append(f"np.empty({(0,) * len(v.shape)!r}, {_numpy_type(v.dtype)})")
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
                lines.append(f"{self._zeros_index(o, v.shape)} = s{vid}")
            else:
                lines.extend(indexing.assign_loops(self, o, v.shape, f"a{vid}", v.shape, v.dtype,
                                                   v.dtype))
        return lines

    # --- scalar statements ---
    def operand_exprs(self, ins: Instruction, access, const_access) -> list[str]:
        """Operands converted to the loop's input dtypes; `access(var)` reads a Var,
        `const_access(array)` a constant array of several elements."""
        in_dts, _ = loop_dtypes(ins)
        out = []
        for k, (v, a) in enumerate(zip(ins.invars, ins.args)):
            want = in_dts[k] if k < len(in_dts) else None
            if v is None and np.size(a) == 1:
                out.append(literal(np.asarray(a).reshape(-1)[0],
                                   want if want is not None else np.asarray(a).dtype))
                continue
            expr, dtype = (access(v), v.dtype) if v is not None else (
                const_access(np.asarray(a)), np.asarray(a).dtype)
            out.append(expr if want is None or dtype == want else cast(expr, want))
        return out

    def scalar_stage(self, ins: Instruction) -> list[str]:
        args = self.operand_exprs(ins, self.scalar_ref, None)
        return [f"s{ins.outvars[0].id} = {scalar_expression(ins, args)}"]

    # --- loops ---
    def loop(self, stage: fusion.Stage) -> list[str]:
        shape = stage.shape
        nested = stage.nested
        idx_names = [f"i{k}" for k in range(len(shape))] if nested else ["i"]
        members = stage.members
        pre: list[str] = []
        loads: dict[str, str] = {}  # access text -> temp name
        body: list[str] = []
        flat_views: dict[str, str] = {}
        size = self.size_expr(shape)

        def indexed(name: str, vshape: tuple) -> str:
            if math.prod(vshape) == 1:
                return self._zeros_index(name, vshape)
            if not nested:
                if len(vshape) > 1:
                    view = flat_views.get(name)
                    if view is None:
                        view = flat_views[name] = f"f{len(flat_views)}_{self.tmp}"
                        pre.append(f"{view} = {name}.reshape({size})")
                    name = view
                return f"{name}[i]"
            offset = len(shape) - len(vshape)
            parts = ["0" if d == 1 and shape[offset + k] != 1 else idx_names[offset + k]
                     for k, d in enumerate(vshape)]
            return f"{name}[{', '.join(parts)}]"

        def load(text: str) -> str:
            t = loads.get(text)
            if t is None:
                t = loads[text] = f"t{self.tmp}_{len(loads)}"
            return t

        def access(v: Var) -> str:
            held = self.held(v)
            if held == HELD_LOOP and self.plan.defined_in[v.id] is stage:
                return f"v{v.id}"
            if held == HELD_SCALAR:
                return self.scalar_name(v)
            return load(indexed(self.array_name(v), v.shape))

        def const_access(a: np.ndarray) -> str:
            return load(indexed(self.const_array(a), a.shape))

        stores: list[str] = []
        accumulators: list[tuple[str, str, str]] = []  # (acc, init, finish)
        products = matmul.LoopProducts()
        for ins in members:
            out = ins.outvars[0]
            if matrix_member(ins):
                body.append(matmul.matrix_step(self, ins, access, pre, products))
            elif out.id in self.plan.reductions:
                body.extend(self.reduction_step(ins, access, accumulators, pre))
                continue
            else:
                args = self.operand_exprs(ins, access, const_access)
                body.append(f"v{out.id} = {scalar_expression(ins, args, in_loop=True)}")
            if out.id in self.plan.stored:
                kind, k = self.plan.storage[out.id]
                target = self.add_arg(f"o{k}", out.dtype, len(out.shape), out.shape) \
                    if kind == "out" else f"b{k}"
                stores.append(f"{indexed(target, out.shape)} = v{out.id}")
        self.tmp += 1
        load_lines = [f"{t} = {text}" for text, t in loads.items()]
        inner = load_lines + body + stores
        lines = list(pre)
        if products.rows or products.columns:
            lines.extend(matmul.blocked_loop(self, size, inner, accumulators, products))
        elif nested:
            indent = ""
            for k, d in enumerate(shape):
                lines.append(f"{indent}for {idx_names[k]} in range({self.dim(d)}):")
                indent += "    "
            lines.extend(indent + s for s in inner)
        elif self.gen.threads > 1:
            lines.extend(self.parallel_loop(size, inner, accumulators))
        else:
            lines.append(f"for i in range({size}):")
            lines.extend("    " + s for s in inner)
        lines.extend(acc[2] for acc in accumulators)
        lines.extend(products.finish)
        return lines

    def parallel_loop(self, size: str, inner: list[str], accumulators: list) -> list[str]:
        """The flat loop split into `nch` fixed chunks run by `prange` (when large enough).

        Chunk c covers [size * c // nch, size * (c + 1) // nch); each has its own partial
        reductions, added in chunk order afterwards: the result depends on the size and the
        thread setting only, never on which thread ran what.
        """
        n = f"n{self.tmp}"
        nch = f"nch{self.tmp}"
        lines = [f"{n} = {size}",
                 f"{nch} = min({self.gen.threads}, {n} // {PARALLEL_MIN_CHUNK})",
                 f"if {nch} <= 1:",
                 f"    for i in range({n}):"]
        lines.extend("        " + s for s in inner)
        lines.append("else:")
        renamed = inner
        for acc, *_ in accumulators:
            renamed = [re.sub(rf"\b{acc}\b", f"{acc}_c", s) for s in renamed]
        for acc, _, _, _, dt in accumulators:
            lines.append(f"    {acc}_p = np.empty({nch}, {_numpy_type(dt)})")
        lines.append(f"    for c in prange({nch}):")
        lines.append("        prefer_wide_vectors()")
        # unsigned bounds: Numba then skips the negative-index wraparound (which would keep
        # LLVM from vectorizing the chunk's loop)
        lines.append(f"        lo = np.uint64(({n} * c) // {nch})")
        lines.append(f"        hi = np.uint64(({n} * (c + 1)) // {nch})")
        for acc, init, *_ in accumulators:
            lines.append(f"        {acc}_c = {init}")
        lines.append("        for i in range(lo, hi):")
        lines.extend("            " + s for s in renamed)
        for acc, *_ in accumulators:
            lines.append(f"        {acc}_p[c] = {acc}_c")
        for acc, _, _, step, _ in accumulators:
            lines.append(f"    for c in range({nch}):")
            lines.append(f"        {acc} = {step.format(a=acc, b=f'{acc}_p[c]')}")
        return lines

    def reduction_step(self, ins: Instruction, access, accumulators: list, pre: list) -> list[str]:
        """The accumulator update of a fused reduction (or vector dot) inside its loop.

        Appends (accumulator, init, finish, step template) to `accumulators`; the template
        `{a}`, `{b}` also combines the partial results of parallel chunks.
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
        if v is None:
            return self.const_array(a) if np.ndim(a) else literal(a, np.asarray(a).dtype)
        if v.shape == ():
            return self.scalar_ref(v)
        return self.array_name(v)

    def const_array(self, a) -> str:
        a = np.asarray(a)
        name = self.gen.consts.name(a)
        return self.add_arg(name, a.dtype, a.ndim, a.shape)

    def contiguous(self, v: Var | None, expr: str) -> str:
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
        if out.shape != () and self.gen.read_by_loop(out) and self.gen.maybe_strided(
                out, self.segment):
            expr = f"np.ascontiguousarray({expr})"
        return list(pre) + [f"{target} = {expr}"]

    # --- checks ---
    def check(self, index: int) -> list[str]:
        c = self.program.checks[index]
        fail = f"return {self.status_tuple(STATUS_CHECK)}"
        operand = c.operand
        if c.kind == "value":
            if not isinstance(operand, Var):
                return []
            ans = self.const_array(np.asarray(c.answer)) if np.ndim(c.answer) else None
            if ans is None or operand.shape == ():
                value = self.scalar_ref(operand) if isinstance(operand, Var) else None
                a = np.asarray(c.answer)
                if a.dtype.kind == "f" and a != a:
                    return [f"if not ({value} != {value}):", f"    {fail}"]
                return [f"if not ({value} == {literal(a, a.dtype)}):", f"    {fail}"]
            arr = self.array_name(operand)
            return [f"if not same_value({arr}, {ans}):", f"    {fail}"]
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


class _Generator:
    def __init__(self, program: Program, plan: Plan, threads: int):
        self.program = program
        self.plan = plan
        self.threads = threads
        self.loops: dict = {}  # id(instruction) -> NativeLoop (set by generate)
        self.input_pos = {v.id: k for k, v in enumerate(program.inputs)}
        self.consts = _Consts()
        self.var_of: dict[int, Var] = {v.id: v for v in program.inputs}
        for ins in program.instructions:
            for v in ins.outvars:
                self.var_of[v.id] = v
        self.readers: dict[int, list[fusion.Stage]] = {}
        for s in plan.stages:
            for ins in s.members:
                for v in fusion.operands(ins):
                    self.readers.setdefault(v.id, []).append(s)
        # values defined in one segment and read by a later one (or by the wrapper)
        self.carried_from: dict[int, list[int]] = {}
        self.carried: set[int] = set()
        for vid, stages in self.readers.items():
            home = plan.defined_in.get(vid)
            if home is None:
                continue
            if any(s.segment != home.segment for s in stages):
                self._carry(vid, home)
        for c_stage in (s for s in plan.stages if s.kind == CHECK):
            operand = program.checks[c_stage.check].operand
            if isinstance(operand, Var):
                home = plan.defined_in.get(operand.id)
                if home is not None and home.segment != c_stage.segment:
                    self._carry(operand.id, home)

    def _carry(self, vid: int, home: fusion.Stage) -> None:
        if vid in self.carried or home.kind == PYTHON:
            return
        self.carried.add(vid)
        self.carried_from.setdefault(home.segment, []).append(vid)

    def read_by_loop(self, v: Var) -> bool:
        """Whether a loop reads `v` by flat index (matrix products index any layout)."""
        return any(s.kind == LOOP and any(
            not matrix_member(ins) and any(u.id == v.id for u in fusion.operands(ins))
            for ins in s.members) for s in self.readers.get(v.id, ()))

    def maybe_strided(self, v: Var, segment: int) -> bool:
        """Whether `v` may be a non-contiguous array in this segment (a view)."""
        home = self.plan.defined_in.get(v.id)
        if home is None or home.segment != segment or home.kind != OP:
            return False
        return is_view(home.members[0].prim)


def generate(program: Program, threads: int = 1) -> Generated:
    """Plan `program` and write its kernels' module and its wrapper (see the module docstring).

    With `threads` > 1, flat loops are written to run in parallel chunks (`parallel_loop`).
    """
    plan = fusion.plan(program, fusable, lowerable)
    if any(s.kind == OP and blas_matmul(s.members[0]) for s in plan.stages):
        # BLAS runs its own thread pool: with Numba's OpenMP threads spinning beside it, the
        # two pools take the cores from each other (measured: 10x slower on 2 cores)
        threads = 1
    gen = _Generator(program, plan, threads)
    from .loops import NativeLoop, has_driver

    gen.loops = {id(s.members[0]): NativeLoop(s.members[0].prim) for s in plan.stages
                 if s.kind == PYTHON and has_driver(s.members[0].prim)}
    kernels = []
    for segment in range(plan.segments):
        if any(s.segment == segment for s in plan.stages if s.kind != PYTHON) or (
                segment == 0 and not plan.stages):
            kernels.append(_KernelWriter(gen, segment).write())
    module = _module_text(kernels, threads > 1 and any(
        "prange(" in line for k in kernels for line in k.lines))
    key = hashlib.sha256(module.encode()).hexdigest()[:32]
    wrapper, wconsts = _wrapper_text(gen, kernels, bound=False)
    return Generated(module, key, kernels, wrapper, wconsts, gen.consts.arrays, plan, gen,
                     gen.loops)


def _runtime_digest() -> str:
    """A digest of the helpers kernels inline (_numba_rt.py, fastmath.py). It is part of every
    module's text, hence of its cache key: Numba's disk cache checks a kernel's own file only,
    and would otherwise serve kernels built against older helpers after an upgrade."""
    digest = hashlib.sha256()
    for name in ("runtime.py", "fastmath.py"):
        digest.update((Path(__file__).with_name(name)).read_bytes())
    return digest.hexdigest()[:16]


_HEADER = f"""# generated by gradtape's numba backend (generator {GENERATOR_VERSION}, runtime \
{_runtime_digest()}); do not edit
import math

import numpy as np

from gradtape.compile.numba.runtime import (
    int_max_step, int_min_step, is_c, max_step, min_step, ndtr, prefer_wide_vectors, reduce_add,
    reduce_mul, same_value, scatter_add_1d, scatter_add_1d_scalar, xlogy)
from gradtape.compile.numba.fastmath import (
    fast_exp, fast_expit, fast_expm1, fast_log, fast_log1p, fast_log_expit, fast_logaddexp,
    fast_tanh)
"""


def arg_type_text(arg: KernelArg) -> str:
    """The Numba type of an argument, as text (it is part of the cached source)."""
    base = "boolean" if arg.dtype == BOOL else arg.dtype.name
    if arg.ndim is None:
        return base
    return f"{base}[{', '.join([':'] * (arg.ndim - 1) + ['::1'])}]"


def _module_text(kernels: list[Kernel], parallel: bool) -> str:
    parts = [_HEADER + ("from numba import prange\n\nPARALLEL = True\n" if parallel else
                        "PARALLEL = False\n")]
    sigs = []
    for k in kernels:
        sigs.append(f"    {k.name!r}: ({', '.join(repr(arg_type_text(a)) for a in k.args)}"
                    f"{',' if len(k.args) == 1 else ''}),")
    parts.append("SIGNATURES = {\n" + "\n".join(sigs) + "\n}\n")
    for k in kernels:
        parts.append(f"\ndef {k.name}({', '.join(a.name for a in k.args)}):")
        parts.extend("    " + line for line in k.lines)
        parts.append("")
    return "\n".join(parts) + "\n"


# --- the wrapper ---------------------------------------------------------------------------------
def _wrapper_text(gen: _Generator, kernels: list[Kernel], bound: bool) -> tuple[str, dict]:
    """Python source of `run(*leaves, O)` for this variant (concrete shapes are fine here).

    Unless `bound`, it reads the kernels from `state.kernels` on every call, and runs the
    numpy tier (`state.pending`) while they are None.
    """
    program, plan = gen.program, gen.plan
    consts: dict = {}

    def const(value, hint: str) -> str:
        name = f"{hint}{len(consts)}"
        consts[name] = value
        return name

    n_in = len(program.inputs)
    params = [f"x{k}" for k in range(n_in)]
    outputs = program.outputs
    lines: list[str] = []
    if not bound:
        lines.append("K = state.kernels")
        lines.append("if K is None:")
        lines.append(f"    return state.pending({', '.join(params + ['O'])})")
        if kernels:
            lines.append(f"{', '.join(f'k{j}' for j in range(len(kernels)))}, = K")
    # result arrays written by kernels
    written = {}  # leaf index -> var
    for k in kernels:
        for a in k.args:
            if a.name.startswith("o"):
                written[int(a.name[1:])] = None
    alloc = []
    for leaf_k in sorted(written):
        leaf = outputs[leaf_k]
        alloc.append(f"    o{leaf_k} = empty({const(leaf.shape, 'shape')}, "
                     f"{const(leaf.dtype, 'dt')})")
    lines.append("if O is None:")
    lines.extend(alloc or ["    pass"])
    if outputs:
        lines.append("else:")
        lines.append(f"    {', '.join(f'o{k}' for k in range(len(outputs)))}, = O")
    # 0-d inputs reach kernels as scalars
    scalar_inputs = {k for k, v in enumerate(program.inputs) if v.shape == ()}
    for k in sorted(scalar_inputs):
        lines.append(f"s_x{k} = x{k}[()]")
    values: dict[int, str] = {}  # var id -> Python expression after its kernel / stage
    kernel_of_segment = {int(k.name[6:]): (j, k) for j, k in enumerate(kernels)}
    args_tuple = "(" + "".join(p + ", " for p in params) + ")"

    def py_value(v: Var | None, a) -> str:
        if v is None:
            return const(a, "c")
        if v.id in gen.input_pos:
            k = gen.input_pos[v.id]
            return f"s_x{k}" if k in scalar_inputs else f"x{k}"
        return values[v.id]

    for segment in range(plan.segments):
        entry = kernel_of_segment.get(segment)
        if entry is not None:
            j, kernel = entry
            call_args = []
            for a in kernel.args:
                if a.name.startswith("x"):
                    k = int(a.name[1:])
                    call_args.append(f"s_x{k}" if k in scalar_inputs else a.name)
                elif a.name.startswith("c"):
                    call_args.append(const(gen.consts.arrays[int(a.name[1:])], "kc"))
                elif a.name.startswith("w"):
                    call_args.append(values[int(a.name[1:])])
                else:
                    call_args.append(a.name)
            lines.append(f"r{j} = k{j}({', '.join(call_args)})")
            lines.append(f"if r{j}[0]:")
            lines.append(f"    return state.slow(r{j}[0], {args_tuple}, O)")
            for pos, (kind, v) in enumerate(kernel.returns, start=1):
                values[v.id] = f"r{j}[{pos}]"
                if kind == "carry":  # exact types for the python stages and kernels after
                    lines.append(f"w{v.id} = ascontiguous(r{j}[{pos}])" if v.shape else
                                 f"w{v.id} = {const(v.dtype.type, 'T')}(r{j}[{pos}])")
                    values[v.id] = f"w{v.id}"
            continue
        stage = next((s for s in plan.stages if s.segment == segment and s.kind == PYTHON), None)
        if stage is None:
            continue  # an empty segment between two python stages
        ins = stage.members[0]
        call_args = [py_value(v, a) for v, a in zip(ins.invars, ins.args)]
        call_args += [f"{k}={const(p, 'p')}" for k, p in ins.params.items()]
        function = gen.loops.get(id(ins), ins.prim.impl)  # a scan: its native loop
        call = f"{const(function, 'impl')}({', '.join(call_args)})"
        if ins.prim.multiple_results:
            names = [f"w{v.id}" for v in ins.outvars]
            lines.append(f"{', '.join(names)}, = {call}")
        else:
            names = [f"w{ins.outvars[0].id}"]
            lines.append(f"{names[0]} = {call}")
        for v, n in zip(ins.outvars, names):
            if v.shape == ():
                lines.append(f"{n} = asarray({n})[()]")
            else:
                # handed to a kernel (C-contiguous) or returned (a fresh array)
                lines.append(f"{n} = ascontiguous({n})")
            values[v.id] = n

    # results
    fresh, into = [], []
    first_leaf: dict[int, int] = {}
    for k, leaf in enumerate(outputs):
        v = leaf.var
        if v is None:
            c = const(leaf.const, "c")
            fresh.append(f"array({c})" if isinstance(leaf.const, np.ndarray) else c)
            into.append(f"o{k}[...] = {c}")
            continue
        if v.id in first_leaf and first_leaf[v.id] in written:
            src = f"o{first_leaf[v.id]}"
            fresh.append(f"array({src})" if not leaf.scalar else f"{src}[()]")
            into.append(f"o{k}[...] = {src}")
            continue
        first_leaf.setdefault(v.id, k)
        if k in written:
            fresh.append(f"o{k}[()]" if leaf.scalar else f"o{k}")
            continue
        src = py_value(v, None)
        if leaf.scalar:
            fresh.append(f"{const(leaf.dtype.type, 'T')}({src})")
        else:
            fresh.append(f"array({src}, {const(leaf.dtype, 'dt')})")
        into.append(f"o{k}[...] = {src}")
    result = tree_expr(program.out_tree, iter(fresh), const)
    lines.append("if O is None:")
    lines.append(f"    return {result}")
    lines.extend(into)
    lines.append("return None")

    src = ["def _build(C):"]
    names = sorted(consts) + ["state", "empty", "array", "asarray", "ascontiguous"]
    if bound:
        names += [f"k{j}" for j in range(len(kernels))]
    src.extend(f"    {n} = C[{n!r}]" for n in names)
    src.append(f"    def run({', '.join(params + ['O'])}):")
    src.extend("        " + line for line in lines)
    src.append("    return run")
    return "\n".join(src) + "\n", consts
