"""Which primitives the backends compute with their own code, and which they do not.

Walks `core.primitive.REGISTRY` (the primitives gradtape declares; user rules, custom_vjp
and custom_jvp, are left out) and asks each backend's tables:

* `native_gaps()`: the primitives the numba backend never computes natively. An elementwise
  primitive fuses when it declares a native form (scalar.py); other primitives need an entry
  of the lowering table (lowering.py), a fused reduction (REDUCTIONS) or a loop driver
  (loops.py); identities and constant-valued primitives never reach a backend (the program
  forwards or folds them). A gap runs through NumPy between kernels (exact, slower), with a
  NativeFallbackWarning.
* `numpy_fallbacks()`: the primitives the numpy backend computes only through its generic
  fallback (a call of the primitive's implementation, returning a fresh array, instead of
  code writing into a reused buffer).

`report()` is the text `python -m gradtape.compile.coverage` prints. tests/test_registry.py
asserts both lists, so a new gap shows in review.
"""

from __future__ import annotations

import importlib.util

from ..core.primitive import REGISTRY, Primitive
from . import numpy_backend


def primitives() -> list[Primitive]:
    """gradtape's primitives (REGISTRY without user rules), by name (importing gradtape has
    declared them all); scipy.special is imported if installed, so that its ufuncs are known."""
    if importlib.util.find_spec("scipy") is not None:
        import scipy.special  # noqa: F401  (the ufuncs of the scipy primitives)
    return [REGISTRY[name] for name in sorted(REGISTRY) if not REGISTRY[name].user_rule]


def _before_backends(prim: Primitive) -> bool:
    """Forwarded or folded by the program (compile/program.py): no backend sees it."""
    return bool(prim.identity or prim.constant_valued)


def native_gaps() -> list[str]:
    """Names of the primitives the numba backend runs through NumPy (see the module
    docstring)."""
    from .numba.drivers import has_driver
    from .numba.lowering import LOWERINGS, REDUCTIONS
    from .numba.scalar import alternatives

    gaps = []
    for prim in primitives():
        if (
            _before_backends(prim)
            or alternatives(prim)
            or prim in LOWERINGS
            or prim in REDUCTIONS
            or has_driver(prim)
        ):
            continue
        gaps.append(prim.name)
    return gaps


def numpy_fallbacks() -> list[str]:
    """Names of the primitives the numpy backend computes only through its generic fallback."""
    fallbacks = []
    for prim in primitives():
        if _before_backends(prim) or (
            not prim.multiple_results and (prim in numpy_backend.EMITTERS or _single_ufunc(prim))
        ):
            continue
        fallbacks.append(prim.name)
    return fallbacks


def _single_ufunc(prim: Primitive) -> bool:
    uf = numpy_backend.ufunc_of(prim)
    return uf is not None and uf.nout == 1


def report() -> str:
    """Both lists, as text."""
    gaps, fallbacks = native_gaps(), numpy_fallbacks()
    return "\n".join(
        [
            f"numba backend: {len(gaps)} primitives run through NumPy between kernels:",
            *_wrapped(gaps),
            f"numpy backend: {len(fallbacks)} primitives call their own implementation:",
            *_wrapped(fallbacks),
        ]
    )


def _wrapped(names: list[str], width: int = 96) -> list[str]:
    lines, line = [], "   "
    for name in names:
        if len(line) + len(name) + 1 > width:
            lines.append(line)
            line = "   "
        line += " " + name
    return lines + [line] if names else lines + ["    (none)"]


if __name__ == "__main__":
    print(report())
