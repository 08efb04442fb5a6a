"""The generated Python wrapper around a variant's kernels.

`wrapper_text` writes `run(*leaves, O)`: it allocates the results, calls the kernels natively
and the python stages (primitives without a native translation, loops' drivers) between
them. A kernel returns a status first (status.py); anything but STATUS_OK goes to the
backend's `slow` path (backend.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...core.ir import Var
from ..program import tree_expr
from .fusion import PYTHON


def _unpatched(f):
    """NumPy's own function: gradtape replaces np.array, np.asarray, ... by pass-through
    dispatchers (process.py) that a compiled wrapper, which never sees a Tracer, need not pay."""
    return getattr(f, "__gradtape_original__", f)


def runtime_functions() -> dict:
    """The NumPy functions every generated wrapper calls by name, bound to NumPy's originals."""
    return {
        "empty": _unpatched(np.empty),
        "array": _unpatched(np.array),
        "asarray": _unpatched(np.asarray),
        "ascontiguous": _unpatched(np.ascontiguousarray),
    }


if TYPE_CHECKING:
    from .generator import Generated, Generator, Kernel


def wrapper_text(gen: Generator, kernels: list[Kernel], bound: bool) -> tuple[str, dict]:
    """Python source of `_build(C) -> run(*leaves, O)` for this variant (concrete shapes are
    fine here), and the constants `C` it reads.

    `run` allocates the result arrays (or unpacks `O`), calls each kernel (`k0`, `k1`, ...),
    runs the python stages between them, and returns the results. Unless `bound`, it reads
    the kernels from `state.kernels` on every call, and runs the numpy tier (`state.pending`)
    while they are None; a kernel's status other than STATUS_OK sends the call to
    `state.slow`.
    """
    return _WrapperWriter(gen, kernels).text(bound)


def bound_wrapper(generated: Generated) -> tuple[str, dict]:
    """The wrapper for kernels known before the first call (backend="numba"): they are
    closure constants k0, k1, ... instead of being read from the state on every call.

    Its constants are the unbound wrapper's (the same writer meets them in the same order):
    for a variant rebound to another length (codegen.py) those hold that length's shapes."""
    gen = generated.generator
    known = getattr(gen, "bound_wrapper", None)  # (written once per generator)
    if known is None or known[0] is not generated.kernels:
        text, consts = wrapper_text(gen, generated.kernels, bound=True)
        gen.bound_wrapper = known = (generated.kernels, text, consts.keys())
    _, text, names = known
    if names == generated.wrapper_consts.keys():
        return text, dict(generated.wrapper_consts)
    return wrapper_text(gen, generated.kernels, bound=True)


class _WrapperWriter:
    """The wrapper's lines and constants (`const` numbers them in the order they are met)."""

    def __init__(self, gen: Generator, kernels: list[Kernel]):
        self.gen, self.kernels = gen, kernels
        self.program = gen.program
        self.consts: dict = {}
        self.params = [f"x{k}" for k in range(len(self.program.inputs))]
        self.lines: list[str] = []
        self.written = {
            int(a.name[1:]) for k in kernels for a in k.args if a.name.startswith("o")
        }  # result leaves kernels write
        # 0-d inputs reach kernels as scalars
        self.scalar_inputs = {k for k, v in enumerate(self.program.inputs) if v.shape == ()}
        self.values: dict[int, str] = {}  # var id -> Python expression after its kernel / stage

    def const(self, value, hint: str) -> str:
        name = f"{hint}{len(self.consts)}"
        self.consts[name] = value
        return name

    def text(self, bound: bool) -> tuple[str, dict]:
        if not bound:
            self.lines += [
                "K = state.kernels",
                "if K is None:",
                f"    return state.pending({', '.join(self.params + ['O'])})",
            ]
            if self.kernels:
                self.lines.append(f"{', '.join(f'k{j}' for j in range(len(self.kernels)))}, = K")
        self.results_arrays()
        self.lines.extend(f"s_x{k} = x{k}[()]" for k in sorted(self.scalar_inputs))
        kernel_of_segment = {int(k.name[6:]): (j, k) for j, k in enumerate(self.kernels)}
        plan = self.gen.plan
        for segment in range(plan.segments):
            entry = kernel_of_segment.get(segment)
            if entry is not None:
                self.kernel_call(*entry)
                continue
            stage = next(
                (s for s in plan.stages if s.segment == segment and s.kind == PYTHON), None
            )
            if stage is not None:  # (else an empty segment between two python stages)
                self.python_stage(stage.members[0])
        self.results()
        src = ["def _build(C):"]
        names = sorted(self.consts) + ["state", "empty", "array", "asarray", "ascontiguous"]
        if bound:
            names += [f"k{j}" for j in range(len(self.kernels))]
        src.extend(f"    {n} = C[{n!r}]" for n in names)
        src.append(f"    def run({', '.join(self.params + ['O'])}):")
        src.extend("        " + line for line in self.lines)
        src.append("    return run")
        return "\n".join(src) + "\n", self.consts

    def results_arrays(self) -> None:
        """The result arrays kernels write: new ones, or the caller's `O`."""
        outputs = self.program.outputs
        self.lines.append("if O is None:")
        self.lines.extend(
            [
                f"    o{k} = empty({self.const(outputs[k].shape, 'shape')}, "
                f"{self.const(outputs[k].dtype, 'dt')})"
                for k in sorted(self.written)
            ]
            or ["    pass"]
        )
        if outputs:
            self.lines.append("else:")
            self.lines.append(f"    {', '.join(f'o{k}' for k in range(len(outputs)))}, = O")

    def py_value(self, v: Var | None, a) -> str:
        """A value in Python: a constant, an input, or what a kernel or stage produced."""
        if v is None:
            return self.const(a, "c")
        if v.id in self.gen.input_pos:
            k = self.gen.input_pos[v.id]
            return f"s_x{k}" if k in self.scalar_inputs else f"x{k}"
        return self.values[v.id]

    def kernel_call(self, j: int, kernel: Kernel) -> None:
        """Call kernel j; a status other than STATUS_OK hands the call to `state.slow`."""
        call_args = []
        for a in kernel.args:
            if a.name.startswith("x"):
                k = int(a.name[1:])
                call_args.append(f"s_x{k}" if k in self.scalar_inputs else a.name)
            elif a.name.startswith("c"):
                call_args.append(self.const(self.gen.consts.arrays[int(a.name[1:])], "kc"))
            elif a.name.startswith("w"):
                call_args.append(self.values[int(a.name[1:])])
            else:
                call_args.append(a.name)
        args_tuple = "(" + "".join(p + ", " for p in self.params) + ")"
        self.lines.append(f"r{j} = k{j}({', '.join(call_args)})")
        self.lines.append(f"if r{j}[0]:")
        self.lines.append(f"    return state.slow(r{j}[0], {args_tuple}, O)")
        for pos, (kind, v) in enumerate(kernel.returns, start=1):
            self.values[v.id] = f"r{j}[{pos}]"
            if kind == "carry":  # exact types for the python stages and kernels after
                self.lines.append(
                    f"w{v.id} = ascontiguous(r{j}[{pos}])"
                    if v.shape
                    else f"w{v.id} = {self.const(v.dtype.type, 'T')}(r{j}[{pos}])"
                )
                self.values[v.id] = f"w{v.id}"

    def python_stage(self, ins) -> None:
        """Call the primitive's implementation (a loop: its native driver)."""
        call_args = [self.py_value(v, a) for v, a in zip(ins.invars, ins.args)]
        call_args += [f"{k}={self.const(p, 'p')}" for k, p in ins.params.items()]
        function = self.gen.loops.get(id(ins), ins.prim.impl)  # a scan: its native loop
        call = f"{self.const(function, 'impl')}({', '.join(call_args)})"
        if ins.prim.multiple_results:
            names = [f"w{v.id}" for v in ins.outvars]
            self.lines.append(f"{', '.join(names)}, = {call}")
        else:
            names = [f"w{ins.outvars[0].id}"]
            self.lines.append(f"{names[0]} = {call}")
        for v, n in zip(ins.outvars, names):
            if v.shape == ():
                self.lines.append(f"{n} = asarray({n})[()]")
            else:
                # handed to a kernel (C-contiguous) or returned (a fresh array)
                self.lines.append(f"{n} = ascontiguous({n})")
            self.values[v.id] = n

    def results(self) -> None:
        """Return fresh results (O is None), or write them into O and return None."""
        const = self.const
        fresh, into = [], []
        first_leaf: dict[int, int] = {}
        for k, leaf in enumerate(self.program.outputs):
            v = leaf.var
            if v is None:
                c = const(leaf.const, "c")
                fresh.append(f"array({c})" if isinstance(leaf.const, np.ndarray) else c)
                into.append(f"o{k}[...] = {c}")
                continue
            if v.id in first_leaf and first_leaf[v.id] in self.written:
                src = f"o{first_leaf[v.id]}"
                fresh.append(f"array({src})" if not leaf.scalar else f"{src}[()]")
                into.append(f"o{k}[...] = {src}")
                continue
            first_leaf.setdefault(v.id, k)
            if k in self.written:
                fresh.append(f"o{k}[()]" if leaf.scalar else f"o{k}")
                continue
            src = self.py_value(v, None)
            if leaf.scalar:
                fresh.append(f"{const(leaf.dtype.type, 'T')}({src})")
            else:
                fresh.append(f"array({src}, {const(leaf.dtype, 'dt')})")
            into.append(f"o{k}[...] = {src}")
        result = tree_expr(self.program.out_tree, iter(fresh), const)
        self.lines += ["if O is None:", f"    return {result}", *into, "return None"]
