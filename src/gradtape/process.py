"""Everything gradtape does to the process beyond its own objects, in one place.

`install()` runs once, when gradtape is imported. What it sets up:

1. **Library functions written in Python** (scipy.special.logsumexp, ...) convert their
   inputs with `np.asarray`, so a Tracer cannot reach them through NumPy's protocols. Rules
   register Tracer implementations in `core.routes.MODULE_FUNCTIONS`; the attribute in the
   library's module is replaced by a dispatcher, as soon as that module is imported (an import
   hook on `sys.meta_path`, so `from scipy.special import logsumexp` written after
   `import gradtape` gets it too). A call with no Tracer argument goes to the library's own
   function unchanged; the original stays reachable as `__gradtape_original__`.
2. **The allocator** (Linux/glibc, first trace): eager reverse mode keeps a function's
   intermediates alive until the backward pass; when they are freed, glibc returns the memory
   to the OS and the next call page-faults its working set again (3.6x the gradient's time at
   N=10^5). Raising glibc's mmap and trim thresholds keeps freed blocks for reuse, as the
   caching allocators of JAX and PyTorch do. `GRADTAPE_MALLOC_TUNE=0` leaves it alone.

The native backend's compiler thread and its kernel cache are documented with the backend.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys

from .core import routes, tracing

_wrapped_modules: set = set()


# --- library functions written in Python ------------------------------------------------------
def _has_tracer(args, kwargs) -> bool:
    tracer = tracing.Tracer
    return any(type(a) is tracer for a in args) or any(
        type(v) is tracer for v in kwargs.values())


def _dispatcher(original, traced):
    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        if _has_tracer(args, kwargs):
            return traced(*args, **kwargs)
        return original(*args, **kwargs)

    dispatch.__gradtape_original__ = original
    return dispatch


def wrap_loaded_modules(finished: str | None = None) -> None:
    """Wrap the registered functions of every registered module that is already imported
    (`finished`: the module whose execution just ended; others still executing wait)."""
    for name, table in routes.MODULE_FUNCTIONS.items():
        module = sys.modules.get(name)
        if module is None or name in _wrapped_modules:
            continue
        if name != finished and getattr(getattr(module, "__spec__", None), "_initializing",
                                        False):
            continue  # still executing (it imports another registered module): wrapped after
        for attr, traced in table.items():
            original = getattr(module, attr, None)
            if original is not None and not hasattr(original, "__gradtape_original__"):
                setattr(module, attr, _dispatcher(original, traced))
        _wrapped_modules.add(name)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: makes the loader of a registered module wrap its functions after."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in routes.MODULE_FUNCTIONS or fullname in _wrapped_modules:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_wrap(module):
            exec_module(module)
            wrap_loaded_modules(fullname)

        loader.exec_module = exec_then_wrap
        return spec


# --- the allocator ----------------------------------------------------------------------------
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_malloc_tuned = False


def keep_freed_memory() -> None:
    """Raise glibc's mmap and trim thresholds, once (see the module docstring)."""
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    if not sys.platform.startswith("linux") or os.environ.get("GRADTAPE_MALLOC_TUNE") == "0":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024 * 1024)
        libc.mallopt(_M_TRIM_THRESHOLD, 256 * 1024 * 1024)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def _on_new_level() -> None:
    """Run as each trace starts: cheap once everything is in place."""
    if not _malloc_tuned:
        keep_freed_memory()
    if len(_wrapped_modules) < len(routes.MODULE_FUNCTIONS):
        wrap_loaded_modules()  # a module imported by a path the import hook did not see


_installed = False


def install() -> None:
    """Set up the process-wide pieces above, once."""
    global _installed
    if _installed:
        return
    _installed = True
    tracing.level_hooks.append(_on_new_level)
    wrap_loaded_modules()
    if not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())
