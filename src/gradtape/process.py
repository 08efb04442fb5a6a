"""Everything gradtape does to the process beyond its own objects, in one place.

`install()` runs once, when gradtape is imported. What it sets up:

1. **Library functions written in Python** (scipy.special.logsumexp, the methods of
   scipy.stats' distributions, ...) that gradtape gives rules of their own. Rules register
   Tracer implementations in `core.routes.MODULE_FUNCTIONS` (an attribute of the module, or
   `"Class.method"` for a method of one of its classes); the attribute is replaced by a
   dispatcher (a Tracer among the arguments, or in a list or tuple among them, selects the
   rule), as soon as that module is imported (an import
   hook on `sys.meta_path`, so `from scipy.special import logsumexp` written after
   `import gradtape` gets it too). A call with no Tracer argument goes to the library's own
   function unchanged; the original stays reachable as `__gradtape_original__`.
2. **The allocator** (Linux/glibc, first trace): eager reverse mode keeps a function's
   intermediates alive until the backward pass; when they are freed, glibc returns the memory
   to the OS and the next call page-faults its working set again (3.6x the gradient's time at
   N=10^5). Raising glibc's mmap and trim thresholds keeps freed blocks for reuse, as the
   caching allocators of JAX and PyTorch do. `GRADTAPE_MALLOC_TUNE=0` leaves it alone.

3. **NumPy's array constructors** (`np.asarray`, `np.array`, `np.asanyarray`,
   `np.ascontiguousarray`, `np.asfortranarray`; and `np.asarray_chkfinite`, which calls
   `asarray` first) are functions that NumPy does not dispatch through `__array_function__`:
   given a Tracer they would call `__array__` and copy the numbers out, cutting the gradient.
   Library code calls them first thing (every scipy.stats distribution, scipy.optimize.rosen,
   scipy.integrate.trapezoid, users' own defensive `x = np.asarray(x)`), so the attributes of
   the `numpy` module are replaced, when gradtape is imported, by small Python dispatchers
   (rules/conversion.py registers them as `MODULE_FUNCTIONS["numpy"]`). A dispatcher looks at
   its first argument only: a Tracer, or (while this thread is tracing) a list or tuple holding
   one, goes to gradtape's version (the Tracer itself, a dtype change recorded as a cast, a
   list stacked); anything else goes to NumPy's function unchanged, with the same arguments.

   * Cost for code that never traces: one Python call around the C function, about 80 ns per
     call on an ndarray (`process.constructor_overhead()` measures it); a list is
     scanned for Tracers only while the calling thread is tracing.
   * `from numpy import asarray` bindings made before gradtape was imported (SciPy's modules
     when SciPy is imported first, users' modules) are rebound in every loaded module outside
     NumPy and Numba, once, at install; modules imported later read the dispatcher from `numpy`.
     SciPy's array-API layer (`scipy._lib.array_api_compat.numpy.asarray`, what `xp.asarray`
     is when SCIPY_ARRAY_API is off, the default) calls `np.array` through the `numpy` module.
   * Numba types `np.asarray` & co. by the function object: when Numba was imported first, the
     dispatchers are registered with it as aliases of NumPy's functions (its overloads were
     keyed by them); imported later, its overloads are keyed by the dispatchers themselves.
   * Threads: the dispatchers hold no state; tracing is per thread.
   * NumPy's own functions are left bound to the originals (they dispatch a Tracer through
     `__array_function__` before their bodies run). ndarray methods of a *plain* array given a
     Tracer (`X.dot(w)`) have no hook at all: `__array__` raises an error naming `X @ w`.
   * Each original stays reachable as `__gradtape_original__`; `GRADTAPE_PATCH_NUMPY=0`
     (read at import) leaves NumPy alone, and `np.asarray` on a Tracer raises instead.
4. **fork**: a child created by `os.fork` (or multiprocessing's fork start method) has only
   the forking thread, and every lock as it was at the fork. A lock another thread held then
   (recording a variant of a compiled function, a path of a loop body, updating a cache) would
   never be released in the child, whose next use of it would wait forever. The fork handler
   installed here gives the child a new lock for every lock of gradtape's: the module-level
   ones of every gradtape module, and those of the objects a module keeps in a registry (its
   `renew_locks_after_fork`: compiled functions, recorded loop bodies). The numba backend's
   own handler (compile/numba/backend.py) also renews its locks and its compiler thread, and
   decides whether the child may use Numba.

The native backend's compiler thread and its kernel cache are documented with the backend.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
import threading

from .core import routes, tracing

_wrapped_modules: set = set()


# --- library functions written in Python ------------------------------------------------------
def _has_tracer(args, kwargs) -> bool:
    tracer = tracing.Tracer
    for a in args:
        t = type(a)
        if t is tracer or ((t is list or t is tuple) and _holds_tracer(a)):
            return True
    for a in kwargs.values():
        t = type(a)
        if t is tracer or ((t is list or t is tuple) and _holds_tracer(a)):
            return True
    return False


def _dispatcher(original, traced, method: bool = False):
    """`traced` for a call with a Tracer argument, else `original`; for a method (`method`),
    also when a trace is running and the instance holds a Tracer in an attribute (a
    gaussian_kde built from traced data)."""
    if method:
        state = tracing._state

        @functools.wraps(original)
        def dispatch(*args, **kwargs):
            if _has_tracer(args, kwargs) or (
                args and getattr(state, "stack", None) and _instance_holds_tracer(args[0])
            ):
                return traced(*args, **kwargs)
            return original(*args, **kwargs)

    else:

        @functools.wraps(original)
        def dispatch(*args, **kwargs):
            if _has_tracer(args, kwargs):
                return traced(*args, **kwargs)
            return original(*args, **kwargs)

    dispatch.__gradtape_original__ = original
    return dispatch


def _instance_holds_tracer(obj) -> bool:
    """Whether an attribute of `obj` (in its dictionary or its slots) is a Tracer."""
    tracer = tracing.Tracer
    if any(type(v) is tracer for v in getattr(obj, "__dict__", {}).values()):
        return True
    return any(type(getattr(obj, name, None)) is tracer for name in _slot_names(type(obj)))


@functools.cache
def _slot_names(cls) -> tuple:
    return tuple(
        name
        for klass in cls.__mro__
        for name in (lambda s: (s,) if isinstance(s, str) else s)(
            klass.__dict__.get("__slots__", ())
        )
    )


def wrap_loaded_modules() -> bool:
    """Wrap the registered functions of every registered module that is already imported.

    A module still being imported (a registered module imported by another one's import) is
    left for later: its functions may not be defined yet. Returns whether one was left."""
    left = False
    for name in routes.MODULE_FUNCTIONS:
        module = sys.modules.get(name)
        if module is None or name in _wrapped_modules:
            continue
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            left = True
            continue
        _wrap_module(name, module)
    return left


def _wrap_module(name: str, module) -> None:
    table = routes.MODULE_FUNCTIONS[name]
    if name == "numpy":
        _patch_numpy(table)
    else:
        replaced = {}  # id(original) -> (original, dispatcher)
        for attr, traced in table.items():
            # "Class.method": a method of a class of the module (scipy.stats' rv_continuous)
            *path, last = attr.split(".")
            owner = module
            for part in path:
                owner = getattr(owner, part, None)
            original = getattr(owner, last, None)
            if original is not None and not hasattr(original, "__gradtape_original__"):
                dispatch = _dispatcher(original, traced, method=bool(path))
                setattr(owner, last, dispatch)
                if not path:
                    replaced[id(original)] = (original, dispatch)
        if replaced:
            # `from scipy.special import logsumexp` run before gradtape was imported
            _rebind_imported(replaced)
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
            if fullname not in _wrapped_modules:
                _wrap_module(fullname, module)
            wrap_loaded_modules()

        loader.exec_module = exec_then_wrap
        return spec


# --- NumPy's array constructors -------------------------------------------------------------
# positional parameters of each constructor (the rest are keyword-only in NumPy 2)
_NUMPY_POSITIONAL = {
    "asarray": 3,
    "asanyarray": 3,
    "array": 2,
    "ascontiguousarray": 2,
    "asfortranarray": 2,
    "asarray_chkfinite": 3,
}
# modules whose bindings of the originals are left alone (see the module docstring)
_KEEP_ORIGINALS = ("numpy", "numba", "llvmlite", "gradtape")


def _holds_tracer(seq) -> bool:
    """Whether a (nested) list or tuple holds a Tracer."""
    tracer = tracing.Tracer
    for e in seq:
        t = type(e)
        if t is tracer or ((t is list or t is tuple) and _holds_tracer(e)):
            return True
    return False


def _constructor_dispatcher(original, traced, npos: int):
    """`original`, unless its first argument is a Tracer or (while tracing) a list holding one.

    Written out per arity: forwarding `*args` costs twice the wrapper itself."""
    tracer = tracing.Tracer
    state = tracing._state

    if npos == 3:

        def dispatch(a, dtype=None, order=None, **kwargs):
            t = type(a)
            if t is tracer or (
                (t is list or t is tuple) and getattr(state, "stack", None) and _holds_tracer(a)
            ):
                return traced(a, dtype, order, **kwargs)
            if kwargs:
                return original(a, dtype, order, **kwargs)
            return original(a, dtype, order)
    else:

        def dispatch(a, dtype=None, **kwargs):
            t = type(a)
            if t is tracer or (
                (t is list or t is tuple) and getattr(state, "stack", None) and _holds_tracer(a)
            ):
                return traced(a, dtype, **kwargs)
            if kwargs:
                return original(a, dtype, **kwargs)
            return original(a, dtype)

    functools.update_wrapper(dispatch, original)
    dispatch.__gradtape_original__ = original
    return dispatch


def _patch_numpy(table: dict) -> None:
    """Replace NumPy's array constructors by dispatchers, and rebind earlier imports of them."""
    if os.environ.get("GRADTAPE_PATCH_NUMPY") == "0":
        return
    import numpy

    replaced = {}  # id(original) -> (original, dispatcher)
    for attr, traced in table.items():
        original = getattr(numpy, attr, None)
        if original is None or hasattr(original, "__gradtape_original__"):
            continue
        dispatch = _constructor_dispatcher(original, traced, _NUMPY_POSITIONAL[attr])
        setattr(numpy, attr, dispatch)
        replaced[id(original)] = (original, dispatch)
    if replaced:
        _rebind_imported(replaced)
        _alias_in_numba(replaced)


def _rebind_imported(replaced: dict) -> None:
    """`from numpy import asarray` (or `from scipy.special import logsumexp`) run before
    gradtape was imported: rebind those module-level names to the dispatcher."""
    ids = replaced.keys()
    for name, module in list(sys.modules.items()):
        if name.split(".", 1)[0] in _KEEP_ORIGINALS:
            continue
        d = getattr(module, "__dict__", None)
        if type(d) is not dict or ids.isdisjoint(map(id, d.values())):
            continue
        for attr, value in list(d.items()):
            hit = replaced.get(id(value))
            if hit is not None and hit[0] is value:
                d[attr] = hit[1]


def _alias_in_numba(replaced: dict) -> None:
    """Numba imported before gradtape keyed its overloads by NumPy's functions: alias them."""
    templates = sys.modules.get("numba.core.typing.templates")
    registry = getattr(templates, "builtin_registry", None)
    if registry is None:
        return  # not imported (yet): Numba's overloads will be keyed by the dispatchers
    for value, typ in list(registry.globals):
        hit = replaced.get(id(value))
        if hit is not None and hit[0] is value:
            registry.globals.append((hit[1], typ))


# --- lists and tuples of traced values where NumPy takes an array ---------------------------
# NumPy dispatches a function through `__array_function__` when one of the arguments its
# dispatcher names (the array-likes: `a` of np.mean, every item of np.concatenate's sequence)
# has the method; it does not look inside a list, so `np.mean([a, b])` with traced `a`, `b`
# would reach NumPy's implementation, which copies the Tracers out. Each dispatcher (a small
# Python function NumPy calls first) gets a wrapper, at the first trace: while the calling
# thread traces, a list or tuple holding a Tracer among the array-likes makes NumPy dispatch
# to the Tracer, and `Tracer.__array_function__` stacks exactly those lists (rules/conversion.py).
_dispatchers_wrapped = False
_dispatchers_lock = threading.Lock()
_WRAPPED_DISPATCHERS: list = []  # the functions whose code was replaced (for tests)


def _first_tracer(seq):
    tracer = tracing.Tracer
    for e in seq:
        t = type(e)
        if t is tracer:
            return e
        if t is list or t is tuple:
            found = _first_tracer(e)
            if found is not None:
                return found
    return None


def _array_likes_with_tracers(relevant):
    """NumPy's relevant arguments, plus a Tracer found in a list or tuple among them (while
    this thread traces); the lists are left for `Tracer.__array_function__` to stack."""
    state = tracing._state
    relevant = tuple(relevant)
    lists = None
    found = None
    for a in relevant:
        t = type(a)
        if t is list or t is tuple:
            inner = _first_tracer(a)
            if inner is not None:
                found = inner
                lists = (a,) if lists is None else lists + (a,)
    state.array_like_lists = lists
    return relevant if found is None else relevant + (found,)


def _numpy_dispatcher_functions() -> list:
    """NumPy's `__array_function__` dispatchers: the Python functions that name a function's
    array-like arguments (`_mean_dispatcher`, and the ones of its C functions in multiarray.py,
    which only the dispatcher objects reference)."""
    import gc
    import types

    import numpy

    root = os.path.dirname(os.path.abspath(numpy.__file__)) + os.sep
    multiarray = sys.modules.get("numpy._core.multiarray")
    found = []
    for obj in gc.get_objects():
        if type(obj) is not types.FunctionType:
            continue
        code = obj.__code__
        if not code.co_filename.startswith(root) or obj.__closure__ is not None:
            continue
        name = obj.__name__
        if name.endswith("_dispatcher") or (
            code.co_filename.endswith("multiarray.py")
            and type(getattr(multiarray, name, None)).__name__ == "_ArrayFunctionDispatcher"
        ):
            found.append(obj)
    return found


def _dispatcher_template(
    *args,
    _gradtape_original_dispatcher=None,
    _gradtape_array_likes=None,
    _gradtape_thread=None,
    **kwargs,
):
    # the code every wrapped dispatcher runs: its own original (a copy, in the keyword
    # defaults) answers; while this thread traces, lists holding Tracers are added
    if _gradtape_thread.__dict__.get("stack"):
        return _gradtape_array_likes(_gradtape_original_dispatcher(*args, **kwargs))
    return _gradtape_original_dispatcher(*args, **kwargs)


def _wrap_dispatcher(fn) -> bool:
    """Replace `fn`'s code by `_dispatcher_template`'s, which calls a copy of the original
    and passes its result through `_array_likes_with_tracers` (the function object stays:
    NumPy's C dispatcher holds it). The original copy checks the arguments as before."""
    import types

    code = fn.__code__
    if "_gradtape_original_dispatcher" in code.co_varnames:
        return True  # wrapped by an earlier attempt (one a KeyboardInterrupt cut short)
    if code.co_freevars:
        return False  # (a closure: its code cannot be swapped)
    original = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__)
    original.__kwdefaults__ = fn.__kwdefaults__
    kwdefaults = dict(fn.__kwdefaults__ or {})
    kwdefaults["_gradtape_original_dispatcher"] = original
    kwdefaults["_gradtape_array_likes"] = _array_likes_with_tracers
    kwdefaults["_gradtape_thread"] = tracing._state  # while its levels stack is not empty
    # the defaults first: the old code ignores keyword defaults it does not name, so an
    # interrupt between the two assignments leaves a working function either way
    fn.__kwdefaults__ = kwdefaults
    fn.__code__ = _dispatcher_template.__code__.replace(
        co_name=code.co_name, co_qualname=code.co_qualname, co_filename=code.co_filename
    )
    return True


def wrap_numpy_dispatchers() -> None:
    """Wrap NumPy's dispatchers once (see above); `GRADTAPE_PATCH_NUMPY=0` leaves them alone."""
    global _dispatchers_wrapped
    if _dispatchers_wrapped:
        return
    with _dispatchers_lock:
        if _dispatchers_wrapped:
            return
        if os.environ.get("GRADTAPE_PATCH_NUMPY") != "0":
            for fn in _numpy_dispatcher_functions():
                if _wrap_dispatcher(fn):
                    _WRAPPED_DISPATCHERS.append(fn)
        _dispatchers_wrapped = True


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


_modules_seen = 0  # len(sys.modules) at the last scan for registered modules


def _on_new_level() -> None:
    """Run as each trace starts: cheap once everything is in place."""
    global _modules_seen
    if not _malloc_tuned:
        keep_freed_memory()
    if not _dispatchers_wrapped:
        wrap_numpy_dispatchers()
    if len(_wrapped_modules) < len(routes.MODULE_FUNCTIONS) and len(sys.modules) != _modules_seen:
        # a module imported by a path the import hook did not see; scanned again only after
        # an import, or at every trace while a registered module is still initialising
        _modules_seen = len(sys.modules)
        if wrap_loaded_modules():
            _modules_seen = 0


# --- fork ---------------------------------------------------------------------------------------
_LOCK_TYPE = type(threading.Lock())
_RLOCK_TYPE = type(threading.RLock())


def renew_locks_in_forked_child() -> None:
    """In a forked child: a new lock in place of every lock of gradtape's (see the module
    docstring). The old ones are dropped, not released: a `with` block the forking thread is in
    releases the lock it took."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "gradtape" or name.startswith("gradtape.")):
            continue
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is not dict:
            continue
        for attr, value in list(namespace.items()):
            kind = type(value)
            if kind is _LOCK_TYPE:
                namespace[attr] = threading.Lock()
            elif kind is _RLOCK_TYPE:
                namespace[attr] = threading.RLock()
        renew = namespace.get("renew_locks_after_fork")
        if callable(renew):
            renew()


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
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=renew_locks_in_forked_child)


def constructor_overhead(repeat: int = 7, number: int = 200_000) -> dict:
    """Nanoseconds per call on a small ndarray of each constructor: (NumPy's, the dispatcher's).

    `python -c "from gradtape import process; print(process.constructor_overhead())"`
    """
    import timeit

    import numpy

    x = numpy.ones(3)
    out = {}
    for attr in _NUMPY_POSITIONAL:
        f = getattr(numpy, attr)
        original = getattr(f, "__gradtape_original__", f)
        out[attr] = tuple(
            round(
                min(timeit.repeat("f(x)", globals={"f": g, "x": x}, number=number, repeat=repeat))
                / number
                * 1e9,
                1,
            )
            for g in (original, f)
        )
    return out
