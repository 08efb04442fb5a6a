"""The routes from NumPy's names to gradtape: what a Tracer does when NumPy code calls something.

Rules fill these tables when they are declared; the Tracer (core/tracing.py) reads them.

* `UFUNCS`: a NumPy or scipy.special ufunc -> its elementwise primitive (`np.exp(t)`,
  and the operators: `t + u` is `np.add`, as for an ndarray).
* `FUNCTIONS`: a NumPy function -> its implementation for Tracer arguments, reached through
  `__array_function__` (`np.sum`, `np.linalg.solve`, ...). ndarray methods that are NumPy
  functions (`t.sum()`, `t.reshape(...)`) go the same way.
* `METHODS`: the few ndarray methods with no NumPy function behind them (`__getitem__`,
  `__setitem__`, `astype`, ...): method name -> implementation.
* `UFUNC_METHODS`: (ufunc, method) -> implementation, for `np.add.reduce`, `np.add.at`, ...
* `ARRAY_LIKE`: the one function that turns a list or tuple holding Tracers into a Tracer
  where NumPy takes an array-like (`np.mean([a, b])`, `np.add([a, 1.0], t)`).
* `MODULE_FUNCTIONS`: functions written in Python in other libraries (scipy.special.logsumexp
  converts its input with np.asarray first): module name -> {attribute -> implementation for
  Tracer arguments}. gradtape/process.py wraps those attributes when the module is imported;
  a call without Tracer arguments goes to the library unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

# ufunc object -> primitive (filled by rules/elementwise.py); scipy's are added lazily
UFUNCS: dict = {}
# ufunc name -> primitive, for scipy.special ufuncs registered the first time one is seen
SCIPY_UFUNCS: dict = {}
# numpy function (the public API object) -> implementation for Tracer arguments
FUNCTIONS: dict = {}
# ndarray method name -> implementation for a Tracer `self`
METHODS: dict = {}
# (ufunc, method name) -> implementation
UFUNC_METHODS: dict = {}
# module name -> {attribute name -> implementation for Tracer arguments}
MODULE_FUNCTIONS: dict = {}
# (obj, name) -> Tracer: a list or tuple holding Tracers, stacked where NumPy takes an array
# (`np.mean([a, b])`); set by rules/conversion.py
ARRAY_LIKE: list = [None]


def lookup_ufunc(ufunc):
    """The primitive for a NumPy or scipy.special ufunc, or None."""
    prim = UFUNCS.get(ufunc)
    if prim is None and "scipy.special" in sys.modules and SCIPY_UFUNCS:
        special = sys.modules["scipy.special"]
        private = getattr(special, "_ufuncs", None)
        for name, p in SCIPY_UFUNCS.items():
            uf = getattr(special, name, None)
            if not _is_ufunc(uf):
                uf = getattr(private, name, None)
            if uf is not None:
                UFUNCS.setdefault(uf, p)
        SCIPY_UFUNCS.clear()
        prim = UFUNCS.get(ufunc)
    return prim


def _is_ufunc(f) -> bool:
    return f is not None and type(f).__name__ == "ufunc"


def implements(*numpy_functions) -> Callable:
    """Register a Tracer implementation of NumPy functions (used by `__array_function__`).

    A None among `numpy_functions` is skipped: `getattr(np.linalg, "matmul", None)` names a
    function that only newer NumPy versions have.

    Example::

        @implements(np.sum)
        def sum_(a, axis=None, dtype=None, out=None, keepdims=False): ...
    """

    def deco(fn):
        for f in numpy_functions:
            if f is not None:
                FUNCTIONS[f] = fn
        return fn

    return deco


def implements_method(*names: str) -> Callable:
    """Register the Tracer implementation of ndarray methods with no NumPy function behind them."""

    def deco(fn):
        for name in names:
            METHODS[name] = fn
        return fn

    return deco


def implements_ufunc_method(ufunc, method: str) -> Callable:
    """Register the Tracer implementation of `ufunc.method` (`np.add.reduce`, `np.add.at`)."""

    def deco(fn):
        UFUNC_METHODS[(ufunc, method)] = fn
        return fn

    return deco


def implements_module_function(module: str, *names: str) -> Callable:
    """Register the Tracer implementation of Python functions of another library.

    Example::

        @implements_module_function("scipy.special", "logsumexp")
        def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False): ...
    """

    def deco(fn):
        table = MODULE_FUNCTIONS.setdefault(module, {})
        for name in names:
            table[name] = fn
        return fn

    return deco
