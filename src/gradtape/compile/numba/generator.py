"""What the writers of one variant share (kernel.py, wrapper.py, codegen.py) and what they
produce: the generator's state (program, plan, constants, values crossing segments), the
kernels' descriptions, and the generated result. Plain data: it imports no writer."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ...core.ir import Var
from ..program import Program
from . import fusion
from .fusion import CHECK, LOOP, OP, PYTHON, Plan
from .lowering import is_view
from .matmul import matrix_member

__all__ = ["Consts", "Generated", "Generator", "Kernel", "KernelArg"]


@dataclass
class KernelArg:
    """One argument of a kernel: its name, dtype and ndim (None: a scalar)."""

    name: str
    dtype: np.dtype
    ndim: int | None


@dataclass
class Kernel:
    """A kernel's name, arguments, returned values and body (lines, without the def)."""

    name: str
    args: list[KernelArg]
    returns: list[tuple[str, Var]]  # ("scalar", var) 0-d results, ("carry", var) handed on
    lines: list[str] = field(default_factory=list)


class Consts:
    """Array constants passed to kernels as c0, c1, ... (by identity)."""

    def __init__(self):
        self.arrays: list[np.ndarray] = []
        self._by_id: dict[int, str] = {}
        self._by_contents: dict[tuple, str] = {}
        self._by_value: dict[tuple, tuple[str, int]] = {}
        self._tables: dict[str, tuple[str, int, list]] = {}  # dtype -> scalars of that dtype

    def name(self, a: np.ndarray) -> str:
        """The argument name of constant `a` (C-contiguous copies are kept in `arrays`).
        Equal arrays are one argument (the backward pass often holds a copy of a forward
        constant: a loop then reads one stream, not two)."""
        key = id(a)
        n = self._by_id.get(key)
        if n is None:
            a = np.asarray(a)
            contents = (
                (a.shape, a.dtype.str, hashlib.sha256(np.ascontiguousarray(a)).digest())
                if not a.dtype.hasobject
                else key
            )
            n = self._by_contents.get(contents)
            if n is None:
                n = self._by_contents[contents] = f"c{len(self.arrays)}"
                self.arrays.append(np.ascontiguousarray(a))
            self._by_id[key] = n
        return n

    def scalar(self, value, dtype: np.dtype) -> tuple[str, int]:
        """(argument name, position) of the scalar constant `value` as `dtype`: the scalars
        of one dtype are one array argument (a program of a thousand distinct constants,
        s + i * x[i] unrolled, passes one array, not a thousand arguments)."""
        held = np.array([value], dtype=dtype)
        key = (dtype.str, held.tobytes())
        found = self._by_value.get(key)
        if found is not None:
            return found
        table = self._tables.get(dtype.str)
        if table is None:
            table = self._tables[dtype.str] = (f"c{len(self.arrays)}", len(self.arrays), [])
            self.arrays.append(held)
        name, slot, values = table
        values.append(held[0])
        self.arrays[slot] = np.array(values, dtype=dtype)
        found = self._by_value[key] = (name, len(values) - 1)
        return found


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
    generator: Generator = field(repr=False, default=None)
    loops: dict = field(default_factory=dict)  # id(instruction) -> its loops.NativeLoop


class Generator:
    """What the kernels and the wrapper of one variant share: the program, its plan, the
    thread count, the constants, and which values cross from one segment to another."""

    def __init__(self, program: Program, plan: Plan, threads: int):
        self.program = program
        self.plan = plan
        self.threads = threads
        self.loops: dict = {}  # id(instruction) -> NativeLoop (set by generate)
        self.input_pos = {v.id: k for k, v in enumerate(program.inputs)}
        self.consts = Consts()
        self.small_columns: dict = {}  # a small product's constant as columns (matmul.py)
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
        return any(
            s.kind == LOOP
            and any(
                not matrix_member(ins) and any(u.id == v.id for u in fusion.operands(ins))
                for ins in s.members
            )
            for s in self.readers.get(v.id, ())
        )

    def maybe_strided(self, v: Var, segment: int) -> bool:
        """Whether `v` may be a non-contiguous array in this segment (a view)."""
        home = self.plan.defined_in.get(v.id)
        if home is None or home.segment != segment or home.kind != OP:
            return False
        return is_view(home.members[0].prim)
