"""The numba backend: a compiled tape as fused native loops (`compile(f, backend="numba")`).

Lowering a Program (cheap, in the caller's thread, no Numba import):
`codegen.generate` plans it (fusion.py: elementwise instructions and full reductions of
one shape share a loop; matmul, slices, reshapes ... are calls between the loops; primitives
without a native translation run through their NumPy implementation between kernels) and
writes the kernels' module and this variant's Python wrapper. The numpy backend's lowering
of the same Program is built too: it is the first tier, and the reference for rare calls.

Compiling (Numba, seconds): the module is keyed by a hash of its text, so variants whose text
is equal (the same program at another length) share one `NativeKernels`. With
`backend="numba"` the kernels are compiled before `lower` returns. With `backend="auto"` (the
default where Numba is installed) a new variant runs on the numpy backend at once; after its
first call, a background thread compiles its kernels, and the calls after that run native
code. No call waits for the compiler. With the disk cache (cache.py), a second process loads
the machine code instead of compiling.

Calling: `run(*leaves, O)` is generated Python: read the kernels (None while compiling: numpy
tier), allocate the result arrays (or unpack `O`), call each kernel's native entry point
directly (Numba's own dispatcher would type every argument again: about 0.1 us each), return
the results. A kernel's status other than 0 sends the call to `slow`: arguments that are not
C-contiguous are copied and the call is repeated; a failed check (or anything unusual) is
answered by the numpy backend's code, which raises the same `GuardFailure` (or returns the
result when, a few ulps apart, its check passes), so dispatch's variants work unchanged.

Kernels are re-entrant: every buffer is allocated inside the kernel (glibc keeps freed
blocks, see gradtape/process.py), the result arrays per call, and the native code releases the GIL
(`nogil`), so threads run compiled calls in parallel.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import math
import os
import queue
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ... import config
from .. import llvm, rolling
from ..numpy_backend import NumpyLowered, compiled_source
from ..program import Program
from . import cache, codegen, notices
from .generator import Generated, KernelArg
from .notices import NativeFallbackWarning, warn_once  # noqa: F401  (the warning: re-exported)
from .parallel import PARALLEL_MIN_CHUNK
from .status import STATUS_CHECK, STATUS_LAYOUT
from .wrapper import bound_wrapper, runtime_functions

NEW, QUEUED, COMPILING, READY, FAILED = "new", "queued", "compiling", "ready", "failed"


def available() -> bool:
    """Whether Numba is installed (checked without importing it)."""
    return importlib.util.find_spec("numba") is not None


# --- settings ----------------------------------------------------------------------------------
_threads = [1]
_threads_lock = threading.Lock()
# variants large enough for parallel loops: set_num_threads gives them kernels for the new count
_thread_dependent: weakref.WeakSet = weakref.WeakSet()


def set_num_threads(n: int) -> None:
    """Threads for the fused loops (default 1), from the next call of every compiled function.

    With more than one thread, a loop over at least 2 * `PARALLEL_MIN_CHUNK` elements is
    split into min(n, size // PARALLEL_MIN_CHUNK) fixed chunks run in parallel (Numba's
    threading layer, at most NUMBA_NUM_THREADS threads); per-chunk partial reductions are
    added in chunk order, so results do not depend on thread timing. Variants already
    compiled with such loops get kernels for `n` threads: compiled before this returns on
    backend="numba" (or loaded from the cache), in the background on "auto" (their current
    kernels run until then). Without Numba the setting is kept and has no effect.

    Parameters
    ----------
    n : int
        The number of threads, at least 1.

    Raises
    ------
    ValueError
        When `n` is less than 1.

    Examples
    --------
    >>> import gradtape as gt
    >>> gt.set_num_threads(1)
    >>> gt.get_num_threads()
    1
    """
    n = int(n)
    if n < 1:
        raise ValueError("set_num_threads: n must be at least 1")
    with _threads_lock:
        changed = n != _threads[0]
        _threads[0] = n
        variants = list(_thread_dependent) if changed else []
    for variant in variants:
        variant.use_threads(n)


def get_num_threads() -> int:
    """The number of threads fused loops use (see `set_num_threads`).

    Returns
    -------
    int
        The current count (default 1).

    Examples
    --------
    >>> import gradtape as gt
    >>> gt.get_num_threads() >= 1
    True
    """
    return _threads[0]


# --- compiled kernels, shared by key -----------------------------------------------------------
class NativeKernels:
    """The compiled kernels of one generated module; variants with the same text share it."""

    def __init__(self, generated: Generated):
        self.key = generated.key
        self.module_text = generated.module
        self.kernels = generated.kernels
        self.parallel = "PARALLEL = True" in generated.module
        self.state = NEW
        self.functions: tuple | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.listeners: list[Callable[[NativeKernels], None]] = []
        self.lock = threading.Lock()
        self.compile_seconds = 0.0  # building or loading these kernels (startup excluded)
        self.startup_seconds = 0.0  # Numba's import and initialization, if this paid for it
        self.from_cache = False
        # a variant's kernels or a loop driver's module: the llvmlite generator may build
        # them (compile/llvm; it refuses what it does not translate); "llvm" or "numba"
        # once built
        self.llvm_candidate = True
        self.generator: str | None = None

    def when_ready(self, callback: Callable[[NativeKernels], None]) -> None:
        """Call `callback(self)` once compiled (now, if it is)."""
        with self.lock:
            if self.state not in (READY, FAILED):
                self.listeners.append(callback)
                return
        callback(self)

    def request(self) -> None:
        """Queue for the background compiler (once)."""
        with self.lock:
            if self.state != NEW:
                return
            self.state = QUEUED
        _compiler().put(self)

    def compile_now(self, timeout: float | None = None) -> bool:
        """Compile in this thread (or wait for the thread doing it; if that compile is
        interrupted, this thread takes over). Returns True once compiled (or failed); False
        when Numba stayed busy with other work (or another thread with this compile) for
        `timeout` seconds: nothing was built, and the kernels are NEW again."""
        deadline = None if timeout is None or timeout == math.inf else time.monotonic() + timeout
        while True:
            with self.lock:
                mine = self.state in (NEW, QUEUED)
                if mine:
                    self.state = COMPILING
                ready = self.ready
            if mine:
                return self._compile(deadline)
            if not ready.wait(_remaining(deadline)):
                return False
            with self.lock:
                if self.state in (READY, FAILED):
                    return True

    def _compile(self, deadline: float | None = None) -> bool:
        start = time.perf_counter()
        startup = 0.0
        try:
            with _numba_work():  # (LLVM's state, like Numba's, is not for a forked child)
                built = _build_with_llvm(self)
            if built is None:
                codegen.check_numba_values(self.kernels)  # (planned for LLVM's generator)
                startup = _numba_startup()
                start += startup
                with _numba_work(), _numba_compiler_free(deadline) as free:
                    if not free:  # another thread's compile holds Numba's lock past the deadline
                        self._interrupted()
                        return False
                    _admit_numba_module(self.key)
                    functions, from_cache = _build_kernels(self)
                self.generator = "numba"
            else:
                functions, from_cache = built
                self.generator = "llvm"
            error = None
        except Exception as exc:  # Numba rejected the generated code: stay on numpy
            functions, from_cache = None, False
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        except BaseException:
            # KeyboardInterrupt (or SystemExit) in the middle of a compile: nothing was
            # built; the next request compiles again, and threads waiting are woken to do it
            self._interrupted()
            raise
        with self.lock:
            self.functions = functions
            self.error = error
            self.from_cache = from_cache
            self.compile_seconds = time.perf_counter() - start
            self.startup_seconds = startup if error is None else 0.0
            self.state = READY if functions is not None else FAILED
            listeners, self.listeners = self.listeners, []
        self.ready.set()
        for callback in listeners:
            callback(self)
        return True

    def _interrupted(self) -> None:
        with self.lock:
            self.state = NEW
            woken, self.ready = self.ready, threading.Event()
        woken.set()

    def _reset_after_fork(self) -> None:
        """In a forked child: fresh locks; a compile the parent had queued or running is
        requested again by the next call (no thread of the parent exists here)."""
        self.lock = threading.Lock()
        if self.state in (QUEUED, COMPILING):
            self.state = NEW
            self.ready = threading.Event()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class _numba_compiler_free:
    """Holds Numba's global compiler lock, taken within the deadline (None: no deadline,
    nothing taken here: Numba takes its lock itself). `as free`: whether it was taken.
    Numba compiles one function at a time in a process; a compile that takes minutes in
    another thread would otherwise hold up this one, without bound, inside Numba."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline
        self.held = None

    def __enter__(self) -> bool:
        numba_lock = _numba_compiler_lock() if self.deadline is not None else None
        lock = getattr(numba_lock, "_lock", None)
        if lock is None:
            return True
        timeout = _remaining(self.deadline)
        if not lock.acquire(timeout=timeout):
            return False
        self.held = lock
        return True

    def __exit__(self, *exc):
        if self.held is not None:
            self.held.release()
        return False


# kernels by module key, shared by the variants whose generated text is equal; at most
# config.max_kernels() (GRADTAPE_MAX_KERNELS), least recently used dropped first (the
# variants still using dropped kernels keep them; the next variant with that text compiles
# again, or loads them from the disk cache)
_REGISTRY: OrderedDict[str, NativeKernels] = OrderedDict()
_registry_lock = threading.Lock()
_ALL_KERNELS: weakref.WeakSet = weakref.WeakSet()  # every live NativeKernels (fork reset)


def kernels_for(generated: Generated) -> NativeKernels:
    with _registry_lock:
        nk = _REGISTRY.get(generated.key)
        if nk is None:
            nk = _REGISTRY[generated.key] = NativeKernels(generated)
            _ALL_KERNELS.add(nk)
            # once dropped and no longer used, its module leaves sys.modules too (so the
            # module, its functions and Numba's dispatchers of them can be freed)
            weakref.finalize(nk, _forget_module, generated.key)
            limit = config.max_kernels()
            while len(_REGISTRY) > limit:
                _REGISTRY.popitem(last=False)
        else:
            _REGISTRY.move_to_end(generated.key)
        return nk


def _forget_module(key: str) -> None:
    """Remove the imported module of kernels `key` unless the registry holds kernels of that
    text again (they share the module name). (No lock: a finalizer may run inside
    kernels_for, which holds the registry's; a membership test and a pop are atomic.)"""
    if key not in _REGISTRY:
        sys.modules.pop(cache.module_name(key), None)


class _Compiler:
    """One background thread compiling queued kernels in order.

    At interpreter exit, queued work is dropped and a compilation in progress is given a few
    seconds to finish (a daemon thread inside LLVM while the interpreter shuts down is not
    safe); the variants that wanted it simply never leave the numpy tier.
    """

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        self.idle = threading.Condition()
        self.busy = 0
        self.stopping = False
        self.thread = threading.Thread(
            target=self._work, name="gradtape-numba-compiler", daemon=True
        )
        self.thread.start()
        atexit.register(self._stop)

    def _stop(self) -> None:
        self.stopping = True
        self.wait(timeout=10.0)

    def put(self, nk: NativeKernels) -> None:
        with self.idle:
            self.busy += 1
        self.queue.put(nk)

    def put_startup(self) -> None:
        """Start Numba's import and initialization in the compiler thread."""
        with self.idle:
            self.busy += 1
        self.queue.put(None)

    def _work(self) -> None:
        while True:
            nk = self.queue.get()
            try:
                with _short_switch_interval():
                    if nk is None:
                        _numba_startup()
                        continue
                    with nk.lock:
                        mine = nk.state == QUEUED and not self.stopping
                        if mine:
                            nk.state = COMPILING
                    if mine:
                        nk._compile()
            except BaseException:  # (_compile reset the kernels; this thread keeps serving)
                pass
            finally:
                with self.idle:
                    self.busy -= 1
                    self.idle.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.busy == 0, timeout)


# While the compiler thread works, Python switches threads every COMPILING_SWITCH_INTERVAL
# seconds instead of every 5 ms: Numba's import and compiler run Python code holding the GIL,
# and a caller that never pauses would otherwise wait up to one interval at every switch
COMPILING_SWITCH_INTERVAL = 0.0005
_switch_lock = threading.Lock()
_switch_saved: list[float] = []  # the interval before the compiler shortened it


class _short_switch_interval:
    def __enter__(self):
        with _switch_lock:
            if not _switch_saved:
                _switch_saved.append(sys.getswitchinterval())
                sys.setswitchinterval(min(_switch_saved[0], COMPILING_SWITCH_INTERVAL))

    def __exit__(self, *exc):
        with _switch_lock:
            if _switch_saved:
                # (a value the program set meanwhile is left alone)
                if sys.getswitchinterval() == min(_switch_saved[0], COMPILING_SWITCH_INTERVAL):
                    sys.setswitchinterval(_switch_saved[0])
                _switch_saved.clear()
        return False


_compiler_instance: list[_Compiler] = []
_compiler_lock = threading.Lock()


def _compiler() -> _Compiler:
    with _compiler_lock:
        if not _compiler_instance:
            _compiler_instance.append(_Compiler())
        return _compiler_instance[0]


def wait_for_kernels(timeout: float | None = None) -> bool:
    """Block until the background compiler has nothing left to do (tests, benchmarks)."""
    if not _compiler_instance:
        return True
    return _compiler_instance[0].wait(timeout)


def wait_for_native(timeout: float | None = None) -> bool:
    """Wait until the native code being compiled in the background is ready.

    With `backend="auto"` a compiled function answers its first calls on the numpy backend
    while a background thread compiles its native kernels (and eager loops get native
    drivers after a few calls); this blocks until that thread has nothing left to do, so
    the next calls run native code. Useful before timing, or before forking workers.

    Parameters
    ----------
    timeout : float, optional
        The longest wait in seconds (None: as long as it takes).

    Returns
    -------
    bool
        True when nothing is left to compile (also when Numba is not installed or turned
        off), False when the timeout expired first.

    Examples
    --------
    >>> import numpy as np, gradtape as gt
    >>> f = gt.compile(gt.grad(lambda x: np.sum(np.sin(x))))
    >>> _ = f(np.ones(3))
    >>> gt.wait_for_native(60)
    True
    """
    return wait_for_kernels(timeout)


# --- fork safety -----------------------------------------------------------------------------
# A child created by os.fork (or multiprocessing's fork start method) has only the forking
# thread, and every lock as it was at the fork.
#
# Imports: Numba's import and initialization (a second or so, in the compiler thread) hold
# Python's per-module import locks of what they import; a child forked then, importing one of
# those modules (`import numba`, or scipy.linalg, which Numba imports), would wait forever for
# a thread it does not have. So that import runs under `_import_lock`, and the fork waits for
# it: at most FORK_IMPORT_WAIT seconds, which only a deadlock would reach (the wait's handler
# is registered after logging's, which Numba imports, so it runs before logging's takes its
# lock). Imports a compile would make are made here too, so no other Numba work imports.
#
# Compiles: the fork never waits for one (a compile can take minutes). Instead it records
# whether Numba work (a compile or a load from the cache) was in progress in any thread. In
# the child every lock of the backend is new and the compiler thread is started again when
# needed. When no Numba work was in progress, the child compiles as any process does, and
# kernels the parent had queued are requested again by their next call. When some was,
# Numba's and LLVM's state (their locks) was being changed by a thread the child does not
# have: the child never calls Numba. Kernels compiled before the fork keep running; everything
# else runs on the numpy backend, and one NativeFallbackWarning says why and what to do.
FORK_IMPORT_WAIT = 30.0
_import_lock = threading.Lock()  # held by the thread importing and initializing Numba
_fork_import_held: list[bool] = []  # [True] while a fork holds _import_lock (parent side)
_fork_import_handler: list[bool] = []  # [True] once its handlers are registered
last_fork_import_wait = [0.0]  # seconds the last fork of this process waited for an import


_fork_pending = [False]  # a fork is waiting for `_import_lock` (Numba work must not start)


def _before_fork_wait_for_import() -> None:
    start = time.perf_counter()
    _fork_pending[0] = True
    got = _import_lock.acquire(timeout=FORK_IMPORT_WAIT)
    last_fork_import_wait[0] = time.perf_counter() - start
    _fork_import_held[:] = [got]


def _after_fork_import_in_parent() -> None:
    _fork_pending[0] = False
    if _fork_import_held and _fork_import_held[0]:
        _import_lock.release()
    _fork_import_held.clear()


def _after_fork_import_in_child() -> None:
    global _import_lock
    _fork_pending[0] = False
    if _fork_import_held and not _fork_import_held[0]:
        # the wait timed out: an import is still half done here; Numba is never called
        _forked_during_numba_work[:] = [True]
    _fork_import_held.clear()
    _import_lock = threading.Lock()


def _register_import_fork_handler() -> None:
    """Register the fork's wait for `_import_lock`, once per process, after logging's
    handler (see above; a forked child inherits the registration)."""
    if _fork_import_handler or not hasattr(os, "register_at_fork"):
        return
    import logging  # noqa: F401  (its fork handler first, so that ours runs before it)

    os.register_at_fork(
        before=_before_fork_wait_for_import,
        after_in_parent=_after_fork_import_in_parent,
        after_in_child=_after_fork_import_in_child,
    )
    _fork_import_handler.append(True)


FORKED_DURING_NUMBA_WORK = (
    "this process was forked while gradtape was compiling native code in another thread, so "
    "Numba cannot be used in it; call gradtape.wait_for_native() before forking to keep "
    "native code in forked workers"
)
_numba_work_count = [0]  # threads doing Numba work now
_numba_work_lock = threading.Lock()  # held only to change the count, and across a fork
_forked_during_numba_work: list[bool] = []  # [True] in a child forked during Numba work
_fork_snapshot: list[int] = []  # the count the fork saw


class _numba_work:
    """Marks Numba work in progress in this thread (the fork handlers read the count).

    Work starts only while no fork is waiting for Numba's import (`_import_lock`, taken and
    released at once): a compile queued behind the import then starts after the fork, whose
    child sees no work in progress and uses Numba. `holding_import_lock`: the caller (Numba's
    import) holds it already."""

    def __init__(self, holding_import_lock: bool = False):
        self.gate = not holding_import_lock

    def __enter__(self):
        while self.gate:  # (the count changes under the import lock, when no fork is pending:
            with _import_lock:  # a lock released by an import may go back to this thread
                if not _fork_pending[0]:  # before the fork waiting for it wakes up)
                    with _numba_work_lock:
                        _numba_work_count[0] += 1
                    return
            time.sleep(0.001)
        with _numba_work_lock:
            _numba_work_count[0] += 1

    def __exit__(self, *exc):
        with _numba_work_lock:
            _numba_work_count[0] -= 1
        return False


def numba_usable_here() -> None:
    """Raise RuntimeError when this process was forked during Numba work (Numba's state in it
    may be half-changed: calling Numba could hang)."""
    if _forked_during_numba_work:
        raise RuntimeError(FORKED_DURING_NUMBA_WORK)


def _numba_compiler_lock():
    """Numba's global compiler lock (an RLock inside it), if Numba has been imported."""
    module = sys.modules.get("numba.core.compiler_lock")
    return getattr(module, "global_compiler_lock", None)


def _before_fork() -> None:
    # (held for a count update only, never while waiting on anything else: cannot deadlock)
    _numba_work_lock.acquire()
    _fork_snapshot[:] = [_numba_work_count[0]]


def _after_fork_in_parent() -> None:
    _fork_snapshot.clear()
    _numba_work_lock.release()


def _after_fork_in_child() -> None:
    global _startup_lock, _registry_lock, _compiler_lock, _threads_lock
    global _switch_lock, _numba_work_lock
    busy = bool(_fork_snapshot and _fork_snapshot[0])
    _fork_snapshot.clear()
    _numba_work_lock = threading.Lock()
    _numba_work_count[0] = 0
    if busy:
        _forked_during_numba_work[:] = [True]
    _startup_lock = threading.Lock()
    _registry_lock = threading.Lock()
    _compiler_lock = threading.Lock()
    notices.reset_after_fork()
    _threads_lock = threading.Lock()
    _switch_lock = threading.Lock()
    cache.reset_after_fork()
    export = sys.modules.get(__package__ + ".export")
    if export is not None:
        export.reset_after_fork()
    numba_lock = _numba_compiler_lock()
    if numba_lock is not None and not busy:
        numba_lock._lock = threading.RLock()
    _compiler_instance.clear()  # its thread is the parent's
    if _switch_saved:  # the parent's compiler thread was working: the usual interval here
        sys.setswitchinterval(_switch_saved.pop())
    for nk in list(_ALL_KERNELS):
        nk._reset_after_fork()
    if _threads[0] > 1 and _gnu_openmp_started():
        # GNU OpenMP kills a forked child that starts a parallel region ("fork() called from
        # a process already using GNU OpenMP"): the child runs its loops in one thread
        _threads[0] = 1
        for variant in list(_thread_dependent):
            variant._single_thread_after_fork()


def _gnu_openmp_started() -> bool:
    """Whether Numba's threading layer has started, and is GNU OpenMP (not fork-safe)."""
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if parallel is None or not getattr(parallel, "_is_initialized", False):
        return False
    try:
        if parallel.threading_layer() != "omp":
            return False
        omppool = sys.modules.get("numba.np.ufunc.omppool")
        return getattr(omppool, "openmp_vendor", "GNU") == "GNU"
    except Exception:
        return True  # unknown: one thread is always safe


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


# --- building kernels (imports Numba) ------------------------------------------------------------
_started: list[bool] = []
_startup_lock = threading.Lock()


def _numba_startup() -> float:
    """Import Numba and initialize its CPU target, once per process; returns the seconds it
    took (0 if it was done). Reported apart from compiling: a process pays it once, whether
    its kernels come from the disk cache or from the compiler (it imports scipy.linalg)."""
    numba_usable_here()
    with _startup_lock:
        if _started:
            return 0.0
        start = time.perf_counter()
        _register_import_fork_handler()
        # (the work count inside the import lock: a fork that got the lock sees it at zero)
        with _import_lock, _numba_work(holding_import_lock=True):
            numba_usable_here()  # (a fork that timed out waiting for this lock)
            from numba.core.compiler_lock import global_compiler_lock
            from numba.core.registry import cpu_target

            from . import fastmath, runtime, special  # noqa: F401  (fastmath registers)

            # under Numba's compiler lock: another thread may be compiling (refreshing the
            # registries while it types a function leaves it without array attributes)
            with global_compiler_lock:
                cpu_target.target_context.refresh()
                cpu_target.typing_context.refresh()
            # what the first compile would import otherwise (outside this lock)
            importlib.import_module("numba.core.boxing")
            importlib.import_module("numba.core.runtime.context")
        _started.append(True)
        return time.perf_counter() - start


_JIT_OPTIONS = {"error_model": "numpy", "nogil": True, "boundscheck": False}


def _numba_type(arg: KernelArg):
    from numba import from_dtype, types

    scalar = from_dtype(arg.dtype)
    if arg.ndim is None:
        return scalar
    return types.Array(scalar, arg.ndim, "C")


def _build_with_llvm(nk: NativeKernels) -> tuple[tuple, bool] | None:
    """The kernels built by the llvmlite generator (compile/llvm), or None for Numba: a module
    outside what it translates, or the generator turned off (GRADTAPE_LLVM=0)."""
    numba_usable_here()
    if not nk.llvm_candidate or not config.llvm_enabled():
        return None
    return llvm.build_or_none(nk.key, nk.module_text, nk.kernels)


_numba_modules: set = set()  # keys of the modules Numba built in this process
_numba_modules_lock = threading.Lock()


def _admit_numba_module(key) -> None:
    """Count a module Numba is about to build (its machine code stays for the process's
    life); beyond GRADTAPE_MAX_NUMBA_MODULES distinct modules, refuse it: the variant stays on
    the numpy backend, and the warning says why."""
    limit = config.max_numba_modules()
    with _numba_modules_lock:
        if key in _numba_modules:
            return
        if len(_numba_modules) >= limit:
            raise RuntimeError(
                f"this process already holds {limit} kernel modules built by Numba, whose "
                "machine code Numba never frees (GRADTAPE_MAX_NUMBA_MODULES); this one runs "
                "on the numpy backend"
            )
        _numba_modules.add(key)


def _build_kernels(nk: NativeKernels) -> tuple[tuple, bool]:
    """Compile (or load) every kernel of a module; returns (entry points, loaded from cache).
    The cache decides where the module lives and how Numba caches it (numba_cache.build_kernels)."""
    from . import fastmath, numba_cache  # noqa: F401  (fastmath registers the fast functions)

    return numba_cache.build_kernels(
        nk.key, nk.module_text, lambda jit, module, use_cache: _jit_all(jit, module, nk, use_cache)
    )


def _jit_all(numba, module, nk: NativeKernels, use_cache: bool) -> tuple[tuple, bool]:
    functions = []
    loaded = True
    for name in getattr(module, "HELPERS", ()):  # functions the kernels call (native loops)
        setattr(module, name, numba.njit(cache=use_cache, **_JIT_OPTIONS)(getattr(module, name)))
    for kernel in nk.kernels:
        dispatcher = numba.njit(cache=use_cache, parallel=nk.parallel, **_JIT_OPTIONS)(
            getattr(module, kernel.name)
        )
        signature = tuple(_numba_type(a) for a in kernel.args)
        before = _cache_hits(dispatcher)
        dispatcher.compile(signature)
        loaded = loaded and use_cache and _cache_hits(dispatcher) > before
        functions.append(dispatcher.overloads[signature].entry_point)
    return tuple(functions), loaded


def _cache_hits(dispatcher) -> int:
    try:
        return sum(dispatcher.stats.cache_hits.values())
    except AttributeError:
        return 0


# --- a lowered variant ---------------------------------------------------------------------------
class _State:
    """What the generated wrapper reads on every call."""

    __slots__ = ("kernels", "pending", "slow", "run", "numpy_run", "requested")


def _state(nk: NativeKernels, numpy_run: Callable) -> _State:
    """A variant's state: no kernels yet; `pending` runs the numpy tier and requests the
    kernels (once); `slow` answers a call a kernel returned a status other than 0 for."""
    state = _State()
    state.kernels = None
    state.numpy_run = numpy_run
    state.requested = False

    def pending(*args):
        try:
            return numpy_run(*args)
        finally:
            if nk.state is NEW:  # (again after an interrupted compile or in a forked child)
                state.requested = True
                nk.request()

    def slow(status, args, O):
        if (
            status != STATUS_LAYOUT
            or all(type(a) is not np.ndarray or a.flags.c_contiguous for a in args)
            and (O is None or all(o.flags.c_contiguous for o in O))
        ):
            return numpy_run(*args, O)  # (a layout the kernel rejects however it is copied)
        # (np.ascontiguousarray would make a 0-d argument 1-d: only the strided are copied)
        args = tuple(
            np.ascontiguousarray(a) if type(a) is np.ndarray and not a.flags.c_contiguous else a
            for a in args
        )
        if O is None:
            return state.run(*args, None)
        contiguous = [o if o.flags.c_contiguous else np.empty(o.shape, o.dtype) for o in O]
        state.run(*args, contiguous)
        for o, c in zip(O, contiguous):
            if o is not c:
                o[...] = c
        return None

    state.pending = pending
    state.slow = slow
    return state


def _generated(program: Program, threads: int) -> Generated | None:
    """The kernels and wrapper of `program`, or None when the numpy backend's code is what
    should run (nothing native to do, or what the generator cannot write: a warning says so).
    No program is too long: long ones are split into bounded kernels (fusion.py)."""
    try:
        generated = codegen.generate(program, threads)
    except NotImplementedError as exc:
        warn_once(f"numba backend: {exc}; this variant runs on the numpy backend")
        return None
    if not (
        generated.loops or any(s.kind in ("loop", "scalar", "op") for s in generated.plan.stages)
    ):
        return None  # nothing native to do: the numpy backend's code is better
    complex_names: list = []
    for stage in generated.plan.stages:
        if (
            stage.kind == "python"
            and id(stage.members[0]) not in generated.loops
            and stage.members[0].prim is not rolling.rolled_loop_p  # (a rolled Python loop)
        ):
            ins = stage.members[0]
            name = ins.prim.name
            if any(v is not None and v.dtype.kind == "c" for v in (*ins.invars, *ins.outvars)):
                if name not in complex_names:
                    complex_names.append(name)
                continue
            warn_once(
                f"numba backend: primitive {name!r} has no native translation; it "
                "runs through NumPy between the native kernels (exact, slower)"
            )
    if complex_names:
        warn_once(
            "numba backend: complex values are not lowered to native code ("
            + ", ".join(complex_names)
            + " of complex values); they run through NumPy between the native kernels "
            "(exact, slower)"
        )
    return generated


class NumbaLowered:
    """A variant lowered to native kernels (see the module docstring).

    `run(*leaves, out_leaves)` as for the numpy backend; `source` is the kernels' module and
    the wrapper; `native` the shared NativeKernels (None when the whole variant runs on the
    numpy backend); `tier` says what the last calls ran: "numpy" or "native".
    """

    def __init__(self, program: Program, wait: bool):
        self.numpy = NumpyLowered(program)
        self.native: NativeKernels | None = None
        threads = get_num_threads()
        generated = _generated(program, threads)
        if generated is None:
            self.run = self.numpy.run
            self.source = self.numpy.source
            return
        for loop in generated.loops.values():
            loop.wait = wait
        for ins in program.instructions:  # rolled Python loops: their drivers start now, on
            # the recorded values (the numpy tier, which answers the first calls under
            # backend="auto", runs them in Python and would not start them)
            loop = generated.loops.get(id(ins))
            if loop is not None and ins.prim is rolling.rolled_loop_p:
                loop.prepare(ins.args, ins.params)
        self.generated = generated
        self.source = generated.module + "\n# --- wrapper ---\n" + generated.wrapper
        nk = self.native = kernels_for(generated)
        state = self._state = _state(nk, self.numpy.run)
        if not generated.kernels:
            state.kernels = ()
        elif wait:
            if nk.compile_now(config.native_wait()):
                self._ready(nk)
            else:
                # Numba stayed busy with another compile for GRADTAPE_NATIVE_WAIT seconds:
                # this variant runs on the numpy backend until its kernels, queued now, are
                # compiled in the background
                warn_once(
                    f"numba backend: Numba has been compiling other code for more than "
                    f"{config.native_wait():g} s (GRADTAPE_NATIVE_WAIT); a variant compiled "
                    'with backend="numba" runs on the numpy backend until its native kernels '
                    "are compiled in the background (gradtape.wait_for_native() waits for them)"
                )
                state.requested = True
                nk.request()
                nk.when_ready(self._ready)
        else:
            nk.when_ready(self._ready)
        self._bound = wait and state.kernels is not None
        if self._bound:
            # the kernels are known now: bind them into the wrapper (no per-call lookup)
            source, extra = bound_wrapper(generated)
            extra.update({f"k{j}": k for j, k in enumerate(state.kernels)})
            state.run = self.run = self._build(source, extra)
        else:
            state.run = self.run = self._build(generated.wrapper, generated.wrapper_consts)
        if generated.kernels and _large_enough_for_threads(program):
            self._program, self._wait, self._threads_wanted = program, wait, threads
            with _threads_lock:
                _thread_dependent.add(self)
                current = get_num_threads()
            if current != threads:  # set_num_threads ran while this was being lowered
                self.use_threads(current)

    def _ready(self, nk: NativeKernels) -> None:
        if nk.functions is not None:
            self._state.kernels = nk.functions
        else:
            warn_once(
                f"numba backend: Numba could not compile a kernel ({nk.error}); "
                "that variant runs on the numpy backend"
            )

    def _build(self, source: str, extra: dict) -> Callable:
        """The wrapper's `run`, from its source and constants."""
        consts = dict(extra)
        consts.update(runtime_functions(), state=self._state)
        namespace: dict = {}
        exec(compiled_source(source, f"<gradtape numba wrapper {self.generated.key}>"), namespace)
        return namespace["_build"](consts)

    def use_threads(self, n: int) -> None:
        """Switch to the kernels generated for `n` threads (see set_num_threads): they take the
        same arguments, so the wrapper stays and only the kernels it calls change."""
        self._threads_wanted = n
        generated = codegen.generate(self._program, n)
        if generated.key == self.native.key:
            return
        if generated.wrapper != self.generated.wrapper:  # (not expected) keep the kernels
            warn_once(
                "numba backend: a variant's kernels for another thread count take other "
                "arguments; it keeps its thread count"
            )
            return
        nk = kernels_for(generated)

        def swap(nk: NativeKernels) -> None:
            if nk.functions is None:
                warn_once(
                    f"numba backend: Numba could not compile a kernel for {n} threads "
                    f"({nk.error}); that variant keeps its kernels"
                )
                return
            if self._threads_wanted != n:
                return  # another count was set since
            self.native, self.generated = nk, generated
            self.source = generated.module + "\n# --- wrapper ---\n" + generated.wrapper
            if self._bound:
                _rebind(self.run, nk.functions)
            else:
                self._state.kernels = nk.functions

        if self._wait:
            nk.compile_now()
            swap(nk)
        else:
            nk.request()
            nk.when_ready(swap)

    def _single_thread_after_fork(self) -> None:
        """In a forked child whose parallel loops would be killed by GNU OpenMP: the kernels
        run become stand-ins that, at their first call, switch this variant to its kernels
        for one thread (compiled then, or loaded from the cache) and call those."""
        if self.native is None or not self.native.parallel or self.native.functions is None:
            return
        switched: list = []

        def stand_in(j: int) -> Callable:
            def kernel(*args):
                if not switched:
                    self._wait = True  # this child compiles in the calling thread
                    self.use_threads(1)
                    # (None: no kernels for one thread, Numba is not usable in this child)
                    switched.append(None if self.native.parallel else self.native.functions)
                if switched[0] is None:
                    return (STATUS_CHECK,)  # the wrapper answers with the numpy backend
                return switched[0][j](*args)

            return kernel

        stand_ins = tuple(stand_in(j) for j in range(len(self.native.functions)))
        if self._bound:
            _rebind(self.run, stand_ins)
        else:
            self._state.kernels = stand_ins

    @property
    def tier(self) -> str:
        """ "native" once the kernels run, else "numpy"."""
        if self.native is None or getattr(self, "_state", None) is None:
            return "numpy"
        return "native" if self._state.kernels is not None else "numpy"

    def wait(self, timeout: float | None = None) -> bool:
        """Request the kernels now and wait until they run (False on timeout or failure)."""
        if self.native is None:
            return False
        self._state.requested = True
        self.native.request()
        if not self.native.ready.wait(timeout):
            return False
        return self._state.kernels is not None


def _large_enough_for_threads(program: Program) -> bool:
    """Whether some value of `program` has enough elements for a loop in parallel chunks."""
    least = 2 * PARALLEL_MIN_CHUNK
    return any(math.prod(v.shape) >= least for v in program.inputs) or any(
        math.prod(v.shape) >= least for ins in program.instructions for v in ins.outvars
    )


def _rebind(run: Callable, kernels: tuple) -> None:
    """Point a bound wrapper's kernels k0, k1, ... (closure cells) at other kernels."""
    cells = dict(zip(run.__code__.co_freevars, run.__closure__))
    for j, kernel in enumerate(kernels):
        cells[f"k{j}"].cell_contents = kernel


def lowered(compiled, *args, **kwargs):
    """The lowered variant that `compiled(*args, **kwargs)` replays (recorded if needed): a
    NumbaLowered for the numba backends; for tests, benchmarks and curious users."""
    return compiled.lowered(*args, **kwargs)


def lower_waiting(program: Program) -> NumbaLowered:
    """backend="numba": the kernels are compiled before the first call."""
    return NumbaLowered(program, wait=True)


def lower_tiered(program: Program) -> NumbaLowered:
    """backend="auto": numpy tier first, kernels compiled in the background."""
    return NumbaLowered(program, wait=False)


# rolled Python loops run on native drivers (loops.py): compile rolls shorter programs
lower_waiting.native_loops = lower_tiered.native_loops = True


# Numba's import is not started early (when a compiled function is created): an import of Numba
# in the compiler thread racing one in the caller's thread (`from numba import njit` after
# `gt.compile(...)`) can fail with Python's import deadlock error, as Numba's modules import
# each other. It starts with the first compile, as before.


def _register() -> None:
    from ..dispatch import register_backend

    if not config.numba_enabled():
        return
    if available():
        register_backend("numba", lower_waiting)
        register_backend("numba-tiered", lower_tiered, auto=True)


_register()
