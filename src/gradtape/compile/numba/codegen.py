"""Source generation for the numba backend: a program becomes Numba kernels and a wrapper.

`generate(program)` plans the program (fusion.py) and writes

* one module of plain Python functions, `kernel0`, `kernel1`, ... (one per segment between
  python stages, kernel.py), that the backend compiles with `numba.njit`. The argument types
  are listed in the text, and the text is the cache key: sizes are read from the arguments,
  so another length that records the same program produces the same text and reuses the
  compiled kernel.
* the source of the Python wrapper `run(*leaves, O)` of this variant (wrapper.py: it
  allocates results, calls the kernels, runs python stages, and hands unusual calls to the
  numpy backend).

Nothing here imports Numba: generating source is cheap and happens in the caller's thread.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...core.ir import Var
from ..program import Program
from . import fusion
from .fusion import CHECK, LOOP, OP, PYTHON, Plan
from .kernel import Consts, Kernel, KernelArg, KernelWriter
from .lowering import is_view, lowerable
from .matmul import blas_matmul, matrix_member
from .scalar import BOOL, fusable
from .wrapper import STATUS_LAYOUT, wrapper_text

__all__ = [
    "GENERATOR_VERSION",
    "STATUS_LAYOUT",
    "Generated",
    "Generator",
    "arg_type_text",
    "generate",
]

GENERATOR_VERSION = "1"


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

    def bound_wrapper(self) -> tuple[str, dict]:
        """The wrapper for kernels known before the first call (backend="numba"): they are
        closure constants k0, k1, ... instead of being read from the state on every call."""
        return wrapper_text(self.generator, self.kernels, bound=True)


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


def generate(program: Program, threads: int = 1) -> Generated:
    """Plan `program` and write its kernels' module and its wrapper (see the module docstring).

    With `threads` > 1, flat loops are written to run in parallel chunks (parallel.py).
    """
    plan = fusion.plan(program, fusable, lowerable)
    if any(s.kind == OP and blas_matmul(s.members[0]) for s in plan.stages):
        # BLAS runs its own thread pool: with Numba's OpenMP threads spinning beside it, the
        # two pools take the cores from each other (measured: 10x slower on 2 cores)
        threads = 1
    gen = Generator(program, plan, threads)
    from .loops import NativeLoop, has_driver

    gen.loops = {
        id(s.members[0]): NativeLoop(s.members[0].prim)
        for s in plan.stages
        if s.kind == PYTHON and has_driver(s.members[0].prim)
    }
    kernels = []
    for segment in range(plan.segments):
        if any(s.segment == segment for s in plan.stages if s.kind != PYTHON) or (
            segment == 0 and not plan.stages
        ):
            kernels.append(KernelWriter(gen, segment).write())
    module = _module_text(
        kernels, threads > 1 and any("prange(" in line for k in kernels for line in k.lines)
    )
    key = hashlib.sha256(module.encode()).hexdigest()[:32]
    wrapper, wconsts = wrapper_text(gen, kernels, bound=False)
    return Generated(
        module, key, kernels, wrapper, wconsts, gen.consts.arrays, plan, gen, gen.loops
    )


def _runtime_digest() -> str:
    """A digest of the helpers kernels inline (runtime.py, fastmath.py, special.py). It is part
    of every module's text, hence of its cache key: Numba's disk cache checks a kernel's own
    file only, and would otherwise serve kernels built against older helpers after an upgrade."""
    digest = hashlib.sha256()
    for name in ("runtime.py", "fastmath.py", "special.py"):
        digest.update((Path(__file__).with_name(name)).read_bytes())
    return digest.hexdigest()[:16]


_HEADER = f"""# generated by gradtape's numba backend (generator {GENERATOR_VERSION}, runtime \
{_runtime_digest()}); do not edit
import math

import numpy as np

from gradtape.compile.numba.runtime import (
    int_max_step, int_min_step, is_c, max_step, min_step, ndtr, prefer_wide_vectors, reduce_add,
    reduce_mul, same_value, scatter_add_1d, scatter_add_1d_scalar, xlogy)
from gradtape.compile.numba.special import (
    digamma, entr, huber, kl_div, log_ndtr, logit, pseudo_huber, rel_entr, xlog1py)
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
    parts = [
        _HEADER
        + ("from numba import prange\n\nPARALLEL = True\n" if parallel else "PARALLEL = False\n")
    ]
    sigs = []
    for k in kernels:
        sigs.append(
            f"    {k.name!r}: ({', '.join(repr(arg_type_text(a)) for a in k.args)}"
            f"{',' if len(k.args) == 1 else ''}),"
        )
    parts.append("SIGNATURES = {\n" + "\n".join(sigs) + "\n}\n")
    for k in kernels:
        parts.append(f"\ndef {k.name}({', '.join(a.name for a in k.args)}):")
        parts.extend("    " + line for line in k.lines)
        parts.append("")
    return "\n".join(parts) + "\n"
