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
import importlib.util
import math
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable

import numpy as np

from ... import config
from .. import rolling
from ..numpy_backend import NumpyLowered
from ..program import Program
from . import cache, codegen
from .kernel import KernelArg
from .parallel import PARALLEL_MIN_CHUNK
from .wrapper import STATUS_LAYOUT

NEW, QUEUED, COMPILING, READY, FAILED = "new", "queued", "compiling", "ready", "failed"


class NativeFallbackWarning(UserWarning):
    """Part of a compiled function runs through NumPy (a primitive without native code, or a
    kernel Numba could not compile): results are exact, only slower."""


_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(message: str) -> None:
    with _warn_lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, NativeFallbackWarning, stacklevel=4)


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
    kernels run until then).
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
    """The number of threads fused loops use (see set_num_threads)."""
    return _threads[0]


# --- compiled kernels, shared by key -----------------------------------------------------------
class NativeKernels:
    """The compiled kernels of one generated module; variants with the same text share it."""

    def __init__(self, generated: codegen.Generated):
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

    def compile_now(self) -> None:
        """Compile in this thread (or wait for the background compiler doing it)."""
        with self.lock:
            mine = self.state in (NEW, QUEUED)
            if mine:
                self.state = COMPILING
        if mine:
            self._compile()
        else:
            self.ready.wait()

    def _compile(self) -> None:
        start = time.perf_counter()
        try:
            startup = _numba_startup()
            start += startup
            functions, from_cache = _build_kernels(self)
            error = None
        except Exception as exc:  # Numba rejected the generated code: stay on numpy
            functions, from_cache = None, False
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
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


_REGISTRY: dict[str, NativeKernels] = {}
_registry_lock = threading.Lock()


def kernels_for(generated: codegen.Generated) -> NativeKernels:
    with _registry_lock:
        nk = _REGISTRY.get(generated.key)
        if nk is None:
            nk = _REGISTRY[generated.key] = NativeKernels(generated)
        return nk


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

    def _work(self) -> None:
        while True:
            nk = self.queue.get()
            try:
                with nk.lock:
                    mine = nk.state == QUEUED and not self.stopping
                    if mine:
                        nk.state = COMPILING
                if mine:
                    nk._compile()
            finally:
                with self.idle:
                    self.busy -= 1
                    self.idle.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.busy == 0, timeout)


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


# --- building kernels (imports Numba) ------------------------------------------------------------
_started: list[bool] = []
_startup_lock = threading.Lock()


def _numba_startup() -> float:
    """Import Numba and initialize its CPU target, once per process; returns the seconds it
    took (0 if it was done). Reported apart from compiling: a process pays it once, whether
    its kernels come from the disk cache or from the compiler (it imports scipy.linalg)."""
    with _startup_lock:
        if _started:
            return 0.0
        start = time.perf_counter()
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target

        from . import fastmath, runtime  # noqa: F401  (fastmath registers its functions)

        # under Numba's compiler lock: another thread may be compiling (refreshing the
        # registries while it types a function leaves it without array attributes)
        with global_compiler_lock:
            cpu_target.target_context.refresh()
            cpu_target.typing_context.refresh()
        _started.append(True)
        return time.perf_counter() - start


_JIT_OPTIONS = {"error_model": "numpy", "nogil": True, "boundscheck": False}


def _numba_type(arg: KernelArg):
    from numba import from_dtype, types

    scalar = from_dtype(arg.dtype)
    if arg.ndim is None:
        return scalar
    return types.Array(scalar, arg.ndim, "C")


def _build_kernels(nk: NativeKernels) -> tuple[tuple, bool]:
    """Compile (or load) every kernel of a module; returns (entry points, loaded from cache)."""
    import numba

    from . import fastmath  # noqa: F401  (registers the fast functions with Numba)

    directory = cache.kernel_dir()
    name = f"gradtape_kernel_{nk.key}"
    if directory is None:
        module = cache.import_source(nk.module_text, name)
        return _jit_all(numba, module, nk, use_cache=False)
    path = cache.module_file(directory, nk.key, nk.module_text)
    module = cache.import_file(path, name)
    try:
        built = _jit_all(numba, module, nk, use_cache=True)
    except Exception:
        # Numba's cache files of this module failed to load: delete them, compile again
        cache.discard(directory, nk.key)
        module = cache.import_file(path, name)
        built = _jit_all(numba, module, nk, use_cache=True)
    cache.prune_once(directory)  # if this process wrote a new entry; here, off the call path
    return built


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
            if not state.requested:
                state.requested = True
                nk.request()

    def slow(status, args, O):
        if (
            status != STATUS_LAYOUT
            or all(type(a) is not np.ndarray or a.flags.c_contiguous for a in args)
            and (O is None or all(o.flags.c_contiguous for o in O))
        ):
            return numpy_run(*args, O)  # (a layout the kernel rejects however it is copied)
        args = tuple(np.ascontiguousarray(a) if type(a) is np.ndarray else a for a in args)
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


def _generated(program: Program, threads: int) -> codegen.Generated | None:
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
    for stage in generated.plan.stages:
        if (
            stage.kind == "python"
            and id(stage.members[0]) not in generated.loops
            and stage.members[0].prim is not rolling.rolled_loop_p  # (a rolled Python loop)
        ):
            name = stage.members[0].prim.name
            warn_once(
                f"numba backend: primitive {name!r} has no native translation; it "
                "runs through NumPy between the native kernels (exact, slower)"
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
        self.generated = generated
        self.source = generated.module + "\n# --- wrapper ---\n" + generated.wrapper
        nk = self.native = kernels_for(generated)
        state = self._state = _state(nk, self.numpy.run)
        if not generated.kernels:
            state.kernels = ()
        elif wait:
            nk.compile_now()
            self._ready(nk)
        else:
            nk.when_ready(self._ready)
        self._bound = wait and state.kernels is not None
        if self._bound:
            # the kernels are known now: bind them into the wrapper (no per-call lookup)
            source, extra = generated.bound_wrapper()
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
        consts.update(
            state=self._state,
            empty=np.empty,
            array=np.array,
            asarray=np.asarray,
            ascontiguous=np.ascontiguousarray,
        )
        namespace: dict = {}
        exec(compile(source, f"<gradtape numba wrapper {self.generated.key}>", "exec"), namespace)
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


def _register() -> None:
    from ..dispatch import register_backend

    if not config.numba_enabled():
        return
    if available():
        register_backend("numba", lower_waiting)
        register_backend("numba-tiered", lower_tiered, auto=True)


_register()
