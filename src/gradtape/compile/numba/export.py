"""Native handles: a compiled function that Numba code and C callers call directly.

`CompiledFunction.as_native(x)` records the function for the signature of `x` (one float64
array), generates the program's kernels (codegen.generate, one thread) and plans the entry
points around them (`_EntryPlan`: where each kernel argument comes from, where each result
goes). On first use the kernels are compiled once, with their signatures, through the kernel
cache (numba_cache.build_kernels), and export_runtime writes the entry points directly as LLVM IR
that calls each kernel through its native address: nothing is typed again, and the entry
points cost milliseconds on top of the kernels' compile. They are:

* `c_entry`, a C function (`handle.cfunc`, `handle.address`) with the stable signature

      int32_t f(int64_t n, const double *x, double *value, double *grad, void *data)

  for ctypes, cffi, scipy.LowLevelCallable, Rust or C;
* `nutpie_logp` / `nutpie_expand` / `nutpie_copy`: the same computation in the argument
  order nutpie's sampler calls (gradtape.nutpie);
* `handle.numba`, `f(x, value, grad, data) -> int32`, a small Numba function that `@njit`
  code calls in its own loops: it checks sizes and layouts and calls the C entry point.

Results: `value` receives the function's first result, `grad` its second (a value_and_grad:
the value and the gradient), each flattened in C order; a function of one result leaves
`grad` alone (it may be NULL, `grad_size` is 0). Statuses: 0 done; positive, computed but
not finite (STATUS_NONFINITE: a sampler treats it as a rejected point); negative, nothing
computed (a wrong length, a point on another path than the recorded one, a bad data
pointer, a non-contiguous buffer, an error raised in native code). `status_message`
explains each.

Data: the arrays the program reads as constants (closed-over arrays) are bound once, by
address, in `handle.data` ([tag, address, address, ...]); the handle keeps them alive. Their
shapes are written into the entry points; the tag (a digest of the kernels' text and the
plan) makes an entry point refuse another handle's data instead of reading it with the
wrong shapes.

What cannot be exported is refused when the handle is made, with the operation named: a
primitive without a native translation (it runs through NumPy between kernels), loops that
run through a driver (`scan`, `while_loop`: their step is recorded on the first call), more
than one traced argument, results that are not float64, more than two results.

Caching: the kernels' module is keyed by a hash of its text and compiled through the kernel
cache (checksummed files in gradtape's directory only), so a second process loads the
kernels' machine code. The entry points call the kernels by symbol (the JIT links them), so
their object code is cached too, beside the kernels' files, checksummed, with what it was
built for (versions, the plan's tag, the kernels' symbols): a damaged or stale file is
deleted and the entry points written again.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core.errors import GradtapeError, NotExportableError
from ...core.ir import source_text
from ...core.pytree import tree_unflatten
from ..dispatch import register_native_exporter
from ..program import Program
from . import cache, codegen
from .fusion import PYTHON
from .generator import Generated
from .handle_status import (  # (the codes a handle returns; export_runtime writes them)
    STATUS_BAD_DATA,
    STATUS_LAYOUT,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_OTHER_PATH,
    STATUS_RAISED,
    STATUS_WRONG_SIZE,
)

_MESSAGES = {
    STATUS_OK: "done",
    STATUS_NONFINITE: "computed, but a result is NaN or infinite",
    STATUS_WRONG_SIZE: "a buffer has the wrong number of elements (x, value or grad)",
    STATUS_OTHER_PATH: (
        "this point takes another path through the function than the one recorded "
        "(a Python branch on a traced value): the handle computes only the recorded path; "
        "use np.where for data-dependent selection, or make a handle at a point of the "
        "other path"
    ),
    STATUS_BAD_DATA: "data is NULL or belongs to another handle (pass handle.data)",
    STATUS_LAYOUT: "a buffer is not C-contiguous",
    STATUS_RAISED: "the native code raised an error (out of memory)",
}


def status_message(status: int) -> str:
    """What a native handle's status code means."""
    return _MESSAGES.get(int(status), f"unknown status {status}")


C_SIGNATURE = "int32_t f(int64_t n, const double *x, double *value, double *grad, void *data)"

_JIT_OPTIONS = {"error_model": "numpy", "nogil": True, "boundscheck": False}


# --- checking what can be exported -------------------------------------------------------------
def _refuse(name: str, what: str, advice: str = "") -> NotExportableError:
    reason = f"{name} cannot be exported as a native handle: {what}"
    return NotExportableError(f"as_native: {reason}{advice}", reason)


def _where(ins) -> str:
    """` (at file.py:12: the user's line)` for an instruction recorded from user code, else ''."""
    text = source_text(ins.source)
    return f" (at {text})" if text else ""


def _check_exportable(program: Program, generated: Generated, name: str) -> None:
    if len(program.inputs) != 1:
        raise _refuse(
            name,
            f"it takes {len(program.inputs)} traced arguments; a handle takes one float64 "
            "array (bind the others with a closure or functools.partial: closed-over arrays "
            "are bound as data, without a copy per call)",
        )
    (x,) = program.inputs
    if x.dtype != np.float64:
        raise _refuse(name, f"its argument is {x.dtype}; a handle takes a float64 array")
    if not program.outputs or len(program.outputs) > 2:
        raise _refuse(
            name,
            f"it returns {len(program.outputs)} results; a handle writes one (value) or "
            "two (value, grad)",
        )
    for k, leaf in enumerate(program.outputs):
        if leaf.dtype != np.float64:
            raise _refuse(name, f"result {k} is {leaf.dtype}; a handle writes float64 results only")
    for stage in generated.plan.stages:
        if stage.kind != PYTHON:
            continue
        ins = stage.members[0]
        if id(ins) in generated.loops:
            raise _refuse(
                name,
                f"the loop {ins.prim.name!r}{_where(ins)} runs through a driver that is "
                "built on its first call; inside a handle only straight-line code and "
                "vectorized operations are native (unroll a short loop in Python, or call "
                "the compiled function)",
            )
        raise _refuse(
            name,
            f"the operation {ins.prim.name!r}{_where(ins)} has no native translation "
            "(compiled functions run it through NumPy between native kernels)",
            "; call the compiled function from Python instead (gradtape.nutpie.from_logp "
            "does this by itself, with a warning)",
        )


def _runtime_digest() -> str:
    """A digest of the entry points' writer (a new version makes new tags)."""
    return hashlib.sha256(Path(__file__).with_name("export_runtime.py").read_bytes()).hexdigest()[
        :16
    ]


# --- the entry points' plan --------------------------------------------------------------------
@dataclass
class _Call:
    """One kernel call of an entry point: where each argument comes from ("x", "const" j,
    "out" k, "value" var id), the arguments' dtype and ndim, and which returned members
    (position in the returned tuple) are which values."""

    name: str
    args: list[tuple[str, int | None]]
    arg_kinds: list[tuple[np.dtype, int | None]]
    returns: list[tuple[int, int]]


@dataclass
class _EntryPlan:
    """What the entry points do, as data (export_runtime writes it as LLVM IR): the kernel
    calls in order, then each result: "written" (a kernel wrote it in place), "value" (a value
    a kernel returned), "input" (x itself), "const" j, or "same" k (an earlier result)."""

    n: int
    input_shape: tuple
    output_shapes: list[tuple]
    output_sizes: list[int]
    consts: list[np.ndarray]
    calls: list[_Call]
    outputs: list[tuple[str, int | None]]
    tag: int = 0

    def describe(self) -> str:
        """A text of everything the entry points depend on (hashed into the tag)."""
        return repr(
            (
                self.n,
                self.input_shape,
                self.output_shapes,
                [(c.shape, c.dtype.str) for c in self.consts],
                [
                    (c.name, c.args, [(d.str, k) for d, k in c.arg_kinds], c.returns)
                    for c in self.calls
                ],
                self.outputs,
            )
        )


def _entry_plan(program: Program, generated: Generated) -> _EntryPlan:
    (x,) = program.inputs
    consts = [np.ascontiguousarray(c) for c in generated.consts]
    inputs = generated.generator.input_pos
    calls, returned = [], set()
    for kernel in generated.kernels:
        args, kinds = [], []
        for a in kernel.args:
            kind, rest = a.name[0], a.name[1:]
            if kind == "x":
                args.append(("x", None))
            elif kind == "c":
                args.append(("const", int(rest)))
            elif kind == "w":
                args.append(("value", int(rest)))
            elif kind == "o":
                args.append(("out", int(rest)))
            else:  # pragma: no cover - the generator names no other arguments
                raise NotImplementedError(f"kernel argument {a.name!r}")
            kinds.append((np.dtype(a.dtype), a.ndim))
        returns = [(pos, v.id) for pos, (_kind, v) in enumerate(kernel.returns, start=1)]
        returned.update(v for _, v in returns)
        calls.append(_Call(kernel.name, args, kinds, returns))
    written = {ref for c in calls for kind, ref in c.args if kind == "out"}
    outputs: list[tuple[str, int | None]] = []
    done: dict[int, int] = {}
    for k, leaf in enumerate(program.outputs):
        v = leaf.var
        if v is None:
            consts.append(np.ascontiguousarray(np.asarray(leaf.const, np.float64)))
            outputs.append(("const", len(consts) - 1))
        elif v.id in done:
            outputs.append(("same", done[v.id]))
        elif k in written:
            done[v.id] = k
            outputs.append(("written", None))
        elif v.id in inputs:
            done[v.id] = k
            outputs.append(("input", None))
        elif v.id in returned:
            done[v.id] = k
            outputs.append(("value", v.id))
        else:  # pragma: no cover - _check_exportable refused what runs outside the kernels
            raise _refuse("this function", f"result {k} is computed outside the native kernels")
    return _EntryPlan(
        n=math.prod(x.shape),
        input_shape=tuple(x.shape),
        output_shapes=[tuple(leaf.shape) for leaf in program.outputs],
        output_sizes=[math.prod(leaf.shape) for leaf in program.outputs],
        consts=consts,
        calls=calls,
        outputs=outputs,
    )


def entry_plan(program: Program, name: str) -> tuple[str, str, _EntryPlan]:
    """The kernels' module text of `program`, its cache key and the plan of its entry
    points (its constants in data order); refuses what cannot be exported."""
    generated = codegen.generate(program, threads=1, numba_only=True)
    _check_exportable(program, generated, name)
    plan = _entry_plan(program, generated)
    text = generated.module
    key = "x" + hashlib.sha256(text.encode()).hexdigest()[:31]
    plan.tag = int(
        hashlib.sha256((text + plan.describe() + _runtime_digest()).encode()).hexdigest()[:15], 16
    )
    return text, key, plan


# --- compiling the kernels and writing the entry points (imports Numba) -------------------------
class _EntryModule:
    """The compiled kernels of one module and the entry points of one plan, built once, on
    first use (`addresses`)."""

    def __init__(self, key: str, text: str, plan: _EntryPlan):
        self.key = key
        self.text = text
        self.plan = plan
        self.lock = threading.Lock()
        self.library = None
        self.addresses: dict[str, int] = {}
        self.kernel_seconds = 0.0
        self.entry_seconds = 0.0
        self.from_cache = False
        self.entries_from_cache = False
        self.stale_entries = False
        self.kernels: dict[str, tuple] = {}
        self._numba = None

    def build(self) -> dict[str, int]:
        """The entry points' addresses (compiling or loading the kernels the first time)."""
        with self.lock:
            if self.library is not None:
                return self.addresses
            from .backend import _numba_startup, _numba_work, numba_usable_here

            numba_usable_here()  # (before importing Numba: it may be half-imported here)
            _numba_startup()
            with _numba_work():
                start = time.perf_counter()
                from . import numba_cache

                kernels, self.from_cache = numba_cache.build_kernels(
                    self.key, self.text, self._jit_all
                )
                self.kernel_seconds = time.perf_counter() - start
                start = time.perf_counter()
                from . import export_runtime

                self.kernels = {}  # name -> (address, return type, argument types)
                for name, (dispatcher, signature) in kernels.items():
                    compiled = dispatcher.overloads[signature]
                    compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
                    self.kernels[name] = (
                        compiled.fndesc.llvm_func_name,
                        compiled.signature.return_type,
                        signature,
                    )
                keep_alive = tuple(kernels.values())
                library = self._cached_entries(keep_alive)
                if library is None:
                    library = export_runtime.build_entries(self.plan, self.kernels, keep_alive)
                    self._save_entries(library)
                self.entry_seconds = time.perf_counter() - start
            self.addresses = library.addresses
            self.library = library
            return self.addresses

    # the entry points' object code in the kernel cache, beside the kernels' files (pruned
    # and cleared with them), checksummed as they are
    def _entries_path(self) -> Path | None:
        directory = cache.kernel_dir()
        if directory is None:
            return None
        return directory / "__pycache__" / f"k_{self.key}.entries-{self.plan.tag:x}.nbe"

    def _identity(self) -> dict:
        import llvmlite
        import numba

        return {
            "format": _ENTRY_CACHE_FORMAT,
            "numba": numba.__version__,
            "llvmlite": llvmlite.__version__,
            "tag": self.plan.tag,
            "kernels": {name: symbol for name, (symbol, _, _) in self.kernels.items()},
        }

    def _cached_entries(self, keep_alive: tuple):
        """The entry points from the disk cache, or None: missing, damaged (a checksum that
        fails: deleted, with a warning), or stale (another version, other kernel symbols,
        an entry point missing: deleted); they are then written again."""
        import pickle

        from . import export_runtime

        path = self._entries_path()
        if path is None:
            return None
        try:
            payload = cache._read_verified(str(path))
        except (FileNotFoundError, OSError):
            return None
        library = None
        try:
            identity, serialized = pickle.loads(payload)
            if identity == self._identity():
                library = export_runtime.load_entries(serialized, keep_alive)
        except Exception:  # an unreadable entry: written again below
            library = None
        if library is None:
            self.stale_entries = True
            try:
                path.unlink()
            except OSError:
                pass
            return None
        self.entries_from_cache = True
        return library

    def _save_entries(self, library) -> None:
        import pickle

        path = self._entries_path()
        if path is None:
            return
        try:
            payload = pickle.dumps((self._identity(), library.serialize()), protocol=-1)
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(descriptor, "wb") as f:
                f.write(cache.frame(payload))
            os.replace(temporary, path)
        except (OSError, ValueError, RuntimeError):  # a full disk, no object code: not cached
            pass

    def _jit_all(self, jit, module, use_cache: bool) -> tuple[dict, bool]:
        from . import (
            export_runtime,
            fastmath,  # noqa: F401  (registers the fast functions with Numba)
        )

        for helper in getattr(module, "HELPERS", ()):
            setattr(
                module, helper, jit.njit(cache=use_cache, **_JIT_OPTIONS)(getattr(module, helper))
            )
        kernels, loaded = {}, True
        for call in self.plan.calls:
            dispatcher = jit.njit(cache=use_cache, **_JIT_OPTIONS)(getattr(module, call.name))
            signature = tuple(export_runtime.numba_type(d, k) for d, k in call.arg_kinds)
            before = _cache_hits(dispatcher)
            dispatcher.compile(signature)
            loaded = loaded and use_cache and _cache_hits(dispatcher) > before
            kernels[call.name] = (dispatcher, signature)
        return kernels, loaded

    def numba_function(self):
        """The Numba function of the C entry point (see NativeHandle.numba)."""
        address = self.build()["c_entry"]
        with self.lock:
            if self._numba is None:
                from . import export_runtime

                sizes = self.plan.output_sizes
                self._numba = export_runtime.numba_entry(
                    address, self.plan.n, sizes[0], sizes[1] if len(sizes) > 1 else 0
                )
            return self._numba


def _cache_hits(dispatcher) -> int:
    try:
        return sum(dispatcher.stats.cache_hits.values())
    except AttributeError:
        return 0


_ENTRY_CACHE_FORMAT = 1
_MODULES: dict[str, _EntryModule] = {}
_modules_lock = threading.Lock()


def reset_after_fork() -> None:
    """In a forked child: new locks (a thread of the parent may have held them)."""
    global _modules_lock
    _modules_lock = threading.Lock()
    for module in list(_MODULES.values()):
        module.lock = threading.Lock()


def _entry_module(key: str, text: str, plan: _EntryPlan) -> _EntryModule:
    with _modules_lock:
        found = _MODULES.get(f"{key}:{plan.tag}")
        if found is None:
            found = _MODULES[f"{key}:{plan.tag}"] = _EntryModule(key, text, plan)
        return found


def numba_startup() -> float:
    """Import Numba and initialize its CPU target, once per process; returns the seconds it
    took (0 when it was done before). A process pays this once, whether its kernels come
    from the disk cache or from the compiler: a measurement of compile time calls it first.

    Example:
        >>> numba_startup()  # doctest: +SKIP
        0.84
    """
    from .backend import _numba_startup

    return _numba_startup()


@contextlib.contextmanager
def kernel_cache_at(directory: str | os.PathLike | None):
    """Within the block, the kernel cache is `directory` (an empty one: everything is
    compiled, as in a new installation; None: no disk cache); the previous setting is
    restored after it, also when the block raises.

    Example:
        >>> with tempfile.TemporaryDirectory() as empty, kernel_cache_at(empty):  # doctest: +SKIP
        ...     handle = gt.compile(f).as_native(x); handle.cfunc
    """
    previous = list(cache._override)
    cache.set_cache_dir(directory)
    try:
        yield
    finally:
        cache._override[:] = previous


_EXPANDS: dict = {}  # (n, segments) -> its library (kept: nutpie holds the address)


def elementwise_expand(n: int, segments: list[tuple]) -> CFunction:
    """nutpie's expand function for `n` values whose constraints act element by element
    (segments of (kind, start, size, lower, width), kind "copy", "exp" or "interval"): LLVM
    writes it in milliseconds, no kernel is compiled (gradtape.nutpie)."""
    from .backend import _numba_startup, _numba_work, numba_usable_here

    key = (int(n), tuple(tuple(s) for s in segments))
    library = _EXPANDS.get(key)
    if library is None:
        numba_usable_here()
        _numba_startup()
        with _numba_work():
            from . import export_runtime

            library = _EXPANDS[key] = export_runtime.build_elementwise_expand(*key)
    return CFunction(library.addresses["nutpie_expand"])


@dataclass(frozen=True)
class CFunction:
    """A native function pointer: `address`, and `ctypes` (a ctypes function of the entry
    point's C signature)."""

    address: int
    signature: str = C_SIGNATURE

    @property
    def ctypes(self):
        """The function as a ctypes function (argtypes set)."""
        return pointer_type()(self.address)


# --- the handle --------------------------------------------------------------------------------
class NativeHandle:
    """A compiled function's native entry points for one argument shape (see `as_native`).

    Attributes: `n` (elements of x), `input_shape`, `value_size` / `grad_size` (elements of
    the first / second result; 0 when there is no second), `value_shape` / `grad_shape`,
    `data` (the int64 descriptor to pass as the data argument), `data_address`.
    Built on first use (the kernels compiled or loaded from the disk cache, then the entry
    points written): `numba` (a Numba function for `@njit` code), `cfunc` (the C entry point:
    `.address`, `.ctypes`), `address` (the C function pointer), `ctypes_function`.
    """

    def __init__(self, program: Program, name: str):
        if importlib.util.find_spec("numba") is None:
            raise ImportError('as_native needs Numba: pip install "gradtape[numba]"')
        text, key, plan = entry_plan(program, name)
        self.name = name
        self._module = _entry_module(key, text, plan)
        self.key = key
        self.constants = tuple(plan.consts)  # kept alive: `data` holds their addresses
        self.n = plan.n
        self.input_shape = plan.input_shape
        outputs = program.outputs
        self.value_size = plan.output_sizes[0]
        self.grad_size = plan.output_sizes[1] if len(outputs) > 1 else 0
        self.value_shape = tuple(outputs[0].shape)
        self.grad_shape = tuple(outputs[1].shape) if len(outputs) > 1 else None
        self._scalar = [leaf.scalar or leaf.shape == () for leaf in outputs]
        self._out_tree = program.out_tree
        self.data = np.array([plan.tag, *(c.ctypes.data for c in self.constants)], dtype=np.int64)
        self.data_address = self.data.ctypes.data
        self.checks = [c.where for c in program.checks]
        self._ctypes = None

    def _entry(self, name: str) -> CFunction:
        address = self._module.build().get(name)
        if address is None:
            raise GradtapeError(
                f"native handle of {self.name}: no {name} entry point (nutpie's expand "
                "function writes one result: make the handle of a function of one result)"
            )
        return CFunction(address)

    # --- entry points ---
    @property
    def numba(self):
        """`status = f(x, value, grad, data)`, a Numba function `@njit` code calls: x, value,
        grad are C-contiguous float64 vectors of n, value_size and grad_size elements (an
        empty array when grad_size is 0), data is `handle.data`; returns an int32 status
        (-1 for wrong sizes, -4 for a buffer that is not C-contiguous)."""
        return self._module.numba_function()

    @property
    def cfunc(self) -> CFunction:
        """The C entry point: `int32_t f(int64_t n, const double *x, double *value,
        double *grad, void *data)` with data = `handle.data_address` (`.address`,
        `.ctypes`)."""
        return self._entry("c_entry")

    @property
    def address(self) -> int:
        """The address of the C entry point (see `cfunc`)."""
        return self.cfunc.address

    @property
    def ctypes_function(self):
        """The C entry point as a ctypes function (argtypes set)."""
        if self._ctypes is None:
            self._ctypes = self.cfunc.ctypes
        return self._ctypes

    def nutpie_logp(self) -> CFunction:
        """The entry point in the order of nutpie's log-density, `int32_t logp(uint64_t n,
        const double *x, double *grad, double *logp, void *pair)`, where pair points to two
        data addresses and this one reads the first (gradtape.nutpie)."""
        return self._entry("nutpie_logp")

    def nutpie_copy(self) -> CFunction:
        """An expand entry point for nutpie that copies x (a model without constraints)."""
        return self._entry("nutpie_copy")

    def nutpie_expand(self) -> CFunction:
        """The entry point in the order of nutpie's expand function, `int32_t expand(uint64_t
        n, uint64_t m, const double *x, double *out, void *pair)`; it reads the second data
        address of the pair (gradtape.nutpie). Only a handle of one result has it."""
        return self._entry("nutpie_expand")

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling (or loading from the cache) the kernels and writing the
        entry points (`kernel_seconds` + `entry_seconds`)."""
        return self._module.kernel_seconds + self._module.entry_seconds

    @property
    def kernel_seconds(self) -> float:
        """Seconds spent compiling the kernels, or loading them from the disk cache."""
        return self._module.kernel_seconds

    @property
    def entry_seconds(self) -> float:
        """Seconds spent writing and compiling the entry points around the kernels."""
        return self._module.entry_seconds

    @property
    def from_cache(self) -> bool:
        """Whether the kernels and the entry points were loaded from the disk cache (nothing
        was compiled)."""
        module = self._module
        return module.library is not None and module.from_cache and module.entries_from_cache

    # --- calling from Python (checks, conversions) ---
    def __call__(self, x):
        """Call the native code from Python: returns what the compiled function returns.

        Raises GradtapeError for an argument of another size or dtype, a non-contiguous
        array, or a status other than 0 or STATUS_NONFINITE (NaN and inf are returned, as
        the compiled function returns them).
        """
        if not isinstance(x, np.ndarray):
            x = np.asarray(x, dtype=np.float64)
        if x.dtype != np.float64:
            raise GradtapeError(
                f"native handle of {self.name}: x has dtype {x.dtype}; pass float64"
            )
        if x.size != self.n:
            raise GradtapeError(
                f"native handle of {self.name}: x has {x.size} elements, the handle was made "
                f"for {self.n} (shape {self.input_shape})"
            )
        if not x.flags.c_contiguous:
            raise GradtapeError(
                f"native handle of {self.name}: x is not C-contiguous; pass np.ascontiguousarray(x)"
            )
        value = np.empty(self.value_size)
        grad = np.empty(max(self.grad_size, 1))
        status = int(
            self.ctypes_function(
                self.n,
                x.ctypes.data_as(_DOUBLE_P),
                value.ctypes.data_as(_DOUBLE_P),
                grad.ctypes.data_as(_DOUBLE_P),
                ctypes.c_void_p(self.data_address),
            )
        )
        if status not in (STATUS_OK, STATUS_NONFINITE):
            raise GradtapeError(
                f"native handle of {self.name}: status {status}: {status_message(status)}"
                + (f" (checks recorded at {', '.join(self.checks)})" if self.checks else "")
            )
        leaves = [self._leaf(value, 0)]
        if self.grad_shape is not None:
            leaves.append(self._leaf(grad, 1))
        return tree_unflatten(self._out_tree, leaves)

    def _leaf(self, buf: np.ndarray, k: int):
        shape = self.value_shape if k == 0 else self.grad_shape
        if shape == () and self._scalar[k]:
            return np.float64(buf[0])
        return buf.reshape(shape)

    def __repr__(self) -> str:
        return (
            f"<native handle of {self.name}: n={self.n}, value_size={self.value_size}, "
            f"grad_size={self.grad_size}>"
        )


_DOUBLE_P = ctypes.POINTER(ctypes.c_double)


def pointer_type():
    """ctypes prototype of the C entry point (for callers that build it themselves)."""
    return ctypes.CFUNCTYPE(
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_double),
        ctypes.POINTER(ctypes.c_double),
        ctypes.POINTER(ctypes.c_double),
        ctypes.c_void_p,
    )


register_native_exporter(NativeHandle)
