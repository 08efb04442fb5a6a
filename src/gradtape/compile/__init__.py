"""Compilation: record a function once per signature, lower the tape, replay it fast.

`dispatch` keys calls by signature and keeps the guarded variants; `program`
simplifies a recorded tape into what a backend lowers; `numpy_backend` generates
NumPy code. Other backends register themselves with `register_backend`.
"""

from .dispatch import (
    BACKENDS,
    CompiledFunction,
    CompileWarning,
    compile,
    register_backend,
)
from .numba import backend as _numba_backend  # noqa: F401  (registers "numba"; lazy Numba)
from .numba import export as _native_export  # noqa: F401  (registers as_native's handles)
from .numba.notices import NativeFallbackWarning

__all__ = [
    "BACKENDS",
    "CompileWarning",
    "CompiledFunction",
    "NativeFallbackWarning",
    "compile",
    "register_backend",
]
