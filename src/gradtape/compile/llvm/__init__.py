"""Native kernels from LLVM IR directly (llvmlite), without Numba's compiler or its import.

The numba backend writes each variant's kernels as Python source (compile/numba/codegen.py).
`translate` turns that source, for the subset most kernels are written in (fused elementwise
loops and full reductions over float64/float32/int64/boolean arrays, with the helpers of
runtime.py and fastmath.py), into LLVM IR with Numba's semantics; `engine` compiles it, caches
the object code on disk and loads it into an execution engine of its own, whose entry points
the generated wrapper calls as it calls Numba's. A module outside the subset is compiled by
Numba, as before. Importing this package imports neither llvmlite nor Numba.
"""

from __future__ import annotations

import importlib.util

__all__ = ["build_or_none", "available"]

_off: list[str] = []  # [reason] once this process found the generator unusable
refusals: list[str] = []  # why the last modules went to Numba (the latest 16; diagnostics)


def available() -> bool:
    """Whether llvmlite is installed (checked without importing it)."""
    return importlib.util.find_spec("llvmlite") is not None


def build_or_none(key: str, module_text: str, kernels: list) -> tuple[tuple, bool] | None:
    """The entry points of a numba-backend module's kernels built by LLVM directly, and whether
    they came from the disk cache; None when the module is outside the translated subset (or
    llvmlite is missing, or this process's NumPy has another array layout): Numba builds it."""
    if _off or not available():
        return None
    from . import engine  # (imports llvmlite: only when a kernel is built)

    try:
        return engine.build(key, module_text, kernels)
    except engine.Unusable as exc:
        _off.append(str(exc))
        return None
    except Exception as exc:  # NotServed: outside the subset; anything else: Numba's turn
        refusals.append(f"{type(exc).__name__}: {exc}")
        del refusals[:-16]
        return None
