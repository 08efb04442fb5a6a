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
from dataclasses import replace
from pathlib import Path

from ... import config
from .. import llvm
from ..lengths import equal_constants, rebinding, remember_lowering, replaced
from ..program import Program
from . import drivers, fusion
from .fusion import OP, PYTHON
from .generator import Generated, Generator, Kernel, KernelArg
from .kernel import KernelWriter
from .lowering import lowerable
from .matmul import blas_matmul
from .scalar import BOOL, fusable
from .status import STATUS_LAYOUT
from .wrapper import wrapper_text

__all__ = [
    "GENERATOR_VERSION",
    "STATUS_LAYOUT",
    "Generated",
    "Generator",
    "arg_type_text",
    "generate",
]

GENERATOR_VERSION = "1"

# Numba compiles a function taking or returning a tuple of hundreds of arrays in minutes to
# hours (500 rows of a vmapped Hessian, each a separate value, did not compile in 15 minutes):
# a program that would need such a kernel runs on the numpy backend instead, with a warning.
MAX_KERNEL_VALUES = 256
# LLVM's generator (compile/llvm/) takes them as a call's arguments and returns them in one
# tuple, in linear time: a split fused loop hands hundreds of values to the next kernel. A
# module it refuses goes to Numba only within MAX_KERNEL_VALUES (check_numba_values).
LLVM_KERNEL_VALUES = 4096


def generate(
    program: Program, threads: int = 1, one_kernel: bool = False, numba_only: bool = False
) -> Generated:
    """Plan `program` and write its kernels' module and its wrapper (see the module docstring).

    With `threads` > 1, flat loops are written to run in parallel chunks (parallel.py).
    Kernels are bounded in length (fusion.limits): short for LLVM's generator, when it is
    on, long for Numba; `one_kernel`: no bound (a loop driver's step is one kernel);
    `numba_only`: the kernels are for Numba whatever GRADTAPE_LLVM says (native handles).

    A program written for another length from one generated before (compile/lengths.py)
    reuses that one's kernels, module and wrapper text: only the wrapper's constants (the
    results' shapes) change. That is done once a full generation for one new length has
    given exactly the rebound result; programs with native loop drivers are always
    generated in full.
    """
    direct = direct_llvm() and not numba_only
    bounds = fusion.limits(direct, one_kernel)
    rebind = rebinding(program, ("numba", threads, bounds))
    if rebind is not None:
        template, old, new = rebind
        return replace(
            template,
            wrapper_consts=_wrapper_consts_at(template, old, new),
            consts=[replaced(a, old, new) for a in template.consts],
        )
    generated = _generate(program, threads, bounds, direct)
    if not generated.loops:
        remember_lowering(program, ("numba", threads, bounds), generated, _same_at_length)
    return generated


def direct_llvm() -> bool:
    """Whether kernels go to LLVM's generator first (compile/llvm/: installed and not turned
    off by GRADTAPE_LLVM=0); they are planned for it then (fusion.limits)."""
    return config.llvm_enabled() and llvm.available()


def _wrapper_consts_at(generated: Generated, old: int, new: int) -> dict:
    return {name: replaced(value, old, new) for name, value in generated.wrapper_consts.items()}


def _same_at_length(template: Generated, old: int, new: int, generated: Generated) -> bool:
    """Whether `generated` is `template` with its length `old` replaced by `new`."""
    if (
        template.loops
        or generated.loops
        or template.key != generated.key
        or template.wrapper != generated.wrapper
        or len(template.consts) != len(generated.consts)
        or template.wrapper_consts.keys() != generated.wrapper_consts.keys()
    ):
        return False
    if not all(
        equal_constants(replaced(a, old, new), b) for a, b in zip(template.consts, generated.consts)
    ):
        return False
    rebound = _wrapper_consts_at(template, old, new)
    return all(equal_constants(v, generated.wrapper_consts[k]) for k, v in rebound.items())


def check_numba_values(kernels: list[Kernel], limit: int = MAX_KERNEL_VALUES) -> None:
    """Raise NotImplementedError when a kernel passes more than `limit` values in and out
    (Numba's compile time explodes on such tuples: the variant stays on the numpy backend)."""
    for k in kernels:
        if len(k.args) + len(k.returns) > limit:
            raise NotImplementedError(
                f"a kernel would pass {len(k.args) + len(k.returns)} values in and out (more "
                f"than {limit}: Numba's compile time explodes on such tuples)"
            )


def _generate(program: Program, threads: int, bounds: fusion.Limits, direct: bool) -> Generated:
    plan = fusion.plan(program, fusable, lowerable, bounds)
    if any(s.kind == OP and blas_matmul(s.members[0]) for s in plan.stages):
        # BLAS runs its own thread pool: with Numba's OpenMP threads spinning beside it, the
        # two pools take the cores from each other (measured: 10x slower on 2 cores)
        threads = 1
    gen = Generator(program, plan, threads)
    gen.loops = {
        id(s.members[0]): drivers.native_loop(s.members[0].prim)
        for s in plan.stages
        if s.kind == PYTHON and drivers.has_driver(s.members[0].prim)
    }
    kernels = []
    for segment in range(plan.segments):
        if any(s.segment == segment for s in plan.stages if s.kind != PYTHON) or (
            segment == 0 and not plan.stages
        ):
            kernels.append(KernelWriter(gen, segment).write())
    check_numba_values(kernels, LLVM_KERNEL_VALUES if direct else MAX_KERNEL_VALUES)
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
    int_max_step, int_min_step, is_c, max_step, min_step, nan_safe_product, ndtr,
    prefer_wide_vectors, reduce_add, reduce_mul, same_value, scatter_add_1d, scatter_add_1d_scalar,
    xlogy)
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
