"""Native handles: a compiled function that Numba code and C callers call directly.

`CompiledFunction.as_native(x)` records the function for the signature of `x` (one float64
array), writes the program's kernels (codegen.generate, one thread) and, after them, entry
points that call the kernels with no Python in between:

* `core(x, value, grad, data) -> int32`, a Numba function (`handle.numba`) that `@njit` code
  calls in its own loops; x, value, grad are C-contiguous float64 vectors, data the handle's
  int64 descriptor (`handle.data`).
* `c_entry`, a C function (`handle.cfunc`, `handle.address`) with the stable signature

      int32_t f(int64_t n, const double *x, double *value, double *grad, void *data)

  for ctypes, cffi, scipy.LowLevelCallable, Rust or C.
* `nutpie_logp` / `nutpie_expand`: the same computation in the argument order nutpie's
  sampler calls (gradtape.nutpie).

Results: `value` receives the function's first result, `grad` its second (a value_and_grad:
the value and the gradient), each flattened in C order; a function of one result leaves
`grad` alone (it may be NULL, `grad_size` is 0). Statuses: 0 done; positive, computed but
not finite (STATUS_NONFINITE: a sampler treats it as a rejected point); negative, nothing
computed (a wrong length, a point on another path than the recorded one, a bad data
pointer, a non-contiguous buffer). `status_message` explains each.

Data: the arrays the program reads as constants (closed-over arrays) are bound once, by
address, in `handle.data` ([tag, address, address, ...]); the handle keeps them alive. Their
shapes are written into the entry points' source; the tag (a digest of that source) makes an
entry point refuse another handle's data instead of reading it with the wrong shapes.

What cannot be exported is refused when the handle is made, with the operation named: a
primitive without a native translation (it runs through NumPy between kernels), loops that
run through a driver (`scan`, `while_loop`: their step is recorded on the first call), more
than one traced argument, results that are not float64, more than two results.

Caching: the module (kernels + entry points) is keyed by a hash of its text and written to
the kernel cache (cache.py); Numba's cache files beside it let a second process load the
machine code of every entry point instead of compiling it.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import math
import threading
import time
from pathlib import Path

import numpy as np

from ...core.errors import GradtapeError
from ...core.pytree import tree_unflatten
from ..dispatch import register_native_exporter
from ..program import Program
from . import cache, codegen
from .fusion import PYTHON
from .generator import Generated
from .status import STATUS_CHECK

STATUS_OK = 0
STATUS_NONFINITE = 3
STATUS_WRONG_SIZE = -1
STATUS_OTHER_PATH = -2
STATUS_BAD_DATA = -3
STATUS_LAYOUT = -4

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
}


def status_message(status: int) -> str:
    """What a native handle's status code means."""
    return _MESSAGES.get(int(status), f"unknown status {status}")


C_SIGNATURE = "int32_t f(int64_t n, const double *x, double *value, double *grad, void *data)"

_JIT_OPTIONS = {"error_model": "numpy", "nogil": True, "boundscheck": False}


# --- checking what can be exported -------------------------------------------------------------
def _refuse(name: str, what: str) -> GradtapeError:
    return GradtapeError(f"as_native: {name} cannot be exported as a native handle: {what}")


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
                f"the loop {ins.prim.name!r} runs through a driver that is "
                "built on its first call; inside a handle only straight-line code and "
                "vectorized operations are native (unroll a short loop in Python, or call "
                "the compiled function)",
            )
        raise _refuse(
            name,
            f"the operation {ins.prim.name!r} has no native translation "
            "(compiled functions run it through NumPy between native kernels); the "
            "compiled function itself computes it",
        )


# --- the entry points' source --------------------------------------------------------------------
def _runtime_digest() -> str:
    return hashlib.sha256(Path(__file__).with_name("export_runtime.py").read_bytes()).hexdigest()[
        :16
    ]


def _dtype_expr(dtype: np.dtype) -> str:
    return "np.bool_" if dtype == np.bool_ else f"np.{dtype.name}"


class _EntryWriter:
    """Writes `inner(x, value, grad, data_address)` and the entry points around it."""

    def __init__(self, program: Program, generated: Generated):
        self.program = program
        self.gen = generated.generator
        self.kernels = generated.kernels
        self.consts: list[np.ndarray] = list(generated.consts)
        self.lines: list[str] = []
        self.values: dict[int, str] = {}
        (x,) = program.inputs
        self.x = x
        self.n = math.prod(x.shape)
        self.sizes = [math.prod(leaf.shape) for leaf in program.outputs]
        self.value_size = self.sizes[0]
        self.grad_size = self.sizes[1] if len(self.sizes) > 1 else 0

    def const_array(self, a: np.ndarray) -> str:
        self.consts.append(np.ascontiguousarray(a))
        return f"kc{len(self.consts) - 1}"

    def text(self) -> tuple[str, list[np.ndarray]]:
        body = self._body()
        k = len(self.consts)
        head = [
            "def inner(x, value, grad, data_address):",
            f"    if x.shape[0] != {self.n} or value.shape[0] != {self.value_size} "
            f"or grad.shape[0] != {self.grad_size}:",
            f"        return np.int32({STATUS_WRONG_SIZE})",
        ]
        if k:
            head += [
                "    if data_address == 0:",
                f"        return np.int32({STATUS_BAD_DATA})",
                f"    data = carray(address_to_voidptr(data_address), ({k + 1},), np.int64)",
                "    if data[0] != TAG:",
                f"        return np.int32({STATUS_BAD_DATA})",
            ]
            for j, c in enumerate(self.consts):
                head.append(
                    f"    kc{j} = carray(address_to_voidptr(data[{j + 1}]), {tuple(c.shape)!r}, "
                    f"{_dtype_expr(c.dtype)})"
                )
        source = "\n".join(head + ["    " + line for line in body]) + "\n"
        source += _ENTRIES.format(
            n=self.n, value_size=self.value_size, grad_size=self.grad_size, bad=STATUS_BAD_DATA
        )
        return source, self.consts

    def _body(self) -> list[str]:
        lines = self.lines
        x = self.x
        if x.shape == ():
            lines.append("s_x0 = x[0]")
        elif len(x.shape) == 1:
            lines.append("x0 = x")
        else:
            lines.append(f"x0 = x.reshape({tuple(x.shape)!r})")
        buffers = ["value", "grad"]
        written = {int(a.name[1:]) for kr in self.kernels for a in kr.args if a.name[0] == "o"}
        for k in sorted(written):
            shape = self.program.outputs[k].shape
            lines.append(
                f"o{k} = {buffers[k]}"
                if len(shape) == 1
                else f"o{k} = {buffers[k]}.reshape({shape!r})"
            )
        for j, kernel in enumerate(self.kernels):
            self._kernel_call(j, kernel)
        done: dict[int, int] = {}
        for k, leaf in enumerate(self.program.outputs):
            buf = buffers[k]
            v = leaf.var
            if v is None:
                self._copy(buf, self.const_array(np.asarray(leaf.const, np.float64)), leaf.shape)
                continue
            if v.id in done:
                self._copy(buf, buffers[done[v.id]], (self.sizes[k],))
                continue
            done[v.id] = k
            if k in written:
                continue
            self._copy(buf, self._value(v), leaf.shape)
        for k in range(len(self.program.outputs)):
            lines += [
                f"for i in range({self.sizes[k]}):",
                f"    if not np.isfinite({buffers[k]}[i]):",
                f"        return np.int32({STATUS_NONFINITE})",
            ]
        lines.append(f"return np.int32({STATUS_OK})")
        return lines

    def _value(self, v) -> str:
        if v.id in self.gen.input_pos:
            return "s_x0" if self.x.shape == () else "x0"
        return self.values[v.id]

    def _copy(self, buf: str, src: str, shape: tuple) -> None:
        if shape == ():
            self.lines.append(f"{buf}[0] = {src}")
        else:
            self.lines += [
                f"src_ = np.ravel({src})",
                f"for i in range({buf}.shape[0]):",
                f"    {buf}[i] = src_[i]",
            ]

    def _kernel_call(self, j: int, kernel) -> None:
        args = []
        for a in kernel.args:
            kind, rest = a.name[0], a.name[1:]
            if kind == "x":
                args.append("s_x0" if self.x.shape == () else "x0")
            elif kind == "c":
                args.append(f"kc{rest}")
            elif kind == "w":
                args.append(self.values[int(rest)])
            else:
                args.append(a.name)
        self.lines += [
            f"r{j} = {kernel.name}({', '.join(args)})",
            f"if r{j}[0] != 0:",
            f"    return np.int32({STATUS_OTHER_PATH} if r{j}[0] == {STATUS_CHECK} "
            f"else {STATUS_LAYOUT})",
        ]
        for pos, (_kind, v) in enumerate(kernel.returns, start=1):
            self.lines.append(f"w{v.id} = r{j}[{pos}]")
            self.values[v.id] = f"w{v.id}"


_ENTRIES = """

def core(x, value, grad, data):
    return inner(x, value, grad, np.int64(data.ctypes.data))


def c_entry(n, x_, value_, grad_, data_):
    if n != {n}:
        return np.int32(-1)
    x = carray(x_, ({n},))
    value = carray(value_, ({value_size},))
    grad = carray(grad_, ({grad_size},))
    return inner(x, value, grad, voidptr_to_address(data_))


def nutpie_logp(dim, x_, grad_, logp_, data_):
    if np.int64(dim) != {n}:
        return np.int32(-1)
    if voidptr_to_address(data_) == 0:
        return np.int32({bad})
    pair = carray(data_, (2,), np.int64)
    x = carray(x_, ({n},))
    value = carray(logp_, ({value_size},))
    grad = carray(grad_, ({grad_size},))
    return inner(x, value, grad, pair[0])


def nutpie_copy(dim, expanded, x_, out_, data_):
    if np.int64(dim) != {n} or np.int64(expanded) != {n}:
        return np.int32(-1)
    x = carray(x_, ({n},))
    out = carray(out_, ({n},))
    for i in range({n}):
        out[i] = x[i]
    return np.int32(0)


def nutpie_expand(dim, expanded, x_, out_, data_):
    if np.int64(dim) != {n} or np.int64(expanded) != {value_size}:
        return np.int32(-1)
    if voidptr_to_address(data_) == 0:
        return np.int32({bad})
    pair = carray(data_, (2,), np.int64)
    x = carray(x_, ({n},))
    value = carray(out_, ({value_size},))
    grad = carray(out_, (0,))
    return inner(x, value, grad, pair[1])
"""

_ENTRY_HEADER = """
# --- native entry points (export runtime {digest}) ---
from numba import carray

from gradtape.compile.numba.export_runtime import address_to_voidptr, voidptr_to_address

TAG = {tag}

"""


def entry_module_text(program: Program, name: str) -> tuple[str, list[np.ndarray], dict]:
    """The module of kernels and entry points of `program`, its constant arrays (in data
    order) and the sizes (n, value_size, grad_size, value_shape, grad_shape)."""
    generated = codegen.generate(program, threads=1)
    _check_exportable(program, generated, name)
    writer = _EntryWriter(program, generated)
    entries, consts = writer.text()
    body = generated.module + entries
    tag = int(hashlib.sha256(body.encode()).hexdigest()[:15], 16)
    text = generated.module + _ENTRY_HEADER.format(digest=_runtime_digest(), tag=tag) + entries
    sizes = {
        "n": writer.n,
        "value_size": writer.value_size,
        "grad_size": writer.grad_size,
        "tag": tag,
    }
    return text, consts, sizes


# --- compiling the entry points (imports Numba) ---------------------------------------------
class _EntryModule:
    """One imported module of entry points; its compiled functions, built on first use."""

    def __init__(self, key: str, text: str):
        self.key = key
        self.text = text
        self.lock = threading.Lock()
        self.module = None
        self.use_cache = False
        self.compiled: dict[str, object] = {}
        self.compile_seconds = 0.0
        self.cache_hits: dict[str, bool] = {}

    def _load(self):
        import numba

        from . import fastmath  # noqa: F401  (registers the fast functions with Numba)
        from .backend import _numba_startup

        _numba_startup()
        directory = cache.kernel_dir()
        name = f"gradtape_native_{self.key}"
        if directory is None:
            module = cache.import_source(self.text, name)
        else:
            path = cache.module_file(directory, self.key, self.text)
            module = cache.import_file(path, name)
            self.use_cache = True
        # Numba's cache files only in gradtape's directory, checksummed (never NUMBA_CACHE_DIR)
        numba = cache._jit_namespace(
            numba, None if directory is None else directory / "__pycache__"
        )
        for helper in getattr(module, "HELPERS", ()):
            setattr(
                module,
                helper,
                numba.njit(cache=self.use_cache, **_JIT_OPTIONS)(getattr(module, helper)),
            )
        for fname in getattr(module, "SIGNATURES", {}):
            setattr(
                module,
                fname,
                numba.njit(cache=self.use_cache, **_JIT_OPTIONS)(getattr(module, fname)),
            )
        module.inner = numba.njit(cache=self.use_cache, **_JIT_OPTIONS)(module.inner)
        self.module = module

    def get(self, entry: str):
        """The compiled entry point `entry` ("core", "c_entry", "nutpie_logp", "nutpie_expand",
        "nutpie_copy")."""
        with self.lock:
            found = self.compiled.get(entry)
            if found is not None:
                return found
            from .backend import _numba_work, numba_usable_here

            numba_usable_here()  # (before importing Numba: it may be half-imported here)
            start = time.perf_counter()
            with _numba_work():
                compiled, hits = self._compile(entry)
            self.cache_hits[entry] = bool(hits)
            self.compile_seconds += time.perf_counter() - start
            self.compiled[entry] = compiled
            return compiled

    def _compile(self, entry: str) -> tuple:
        """Compile the entry point `entry`: (its Numba function, its cache hits)."""
        import numba
        from numba import types

        if self.module is None:
            self._load()
        function = getattr(self.module, entry)
        f64p = types.CPointer(types.float64)
        if entry == "core":
            array = types.Array(types.float64, 1, "C")
            signature = types.int32(array, array, array, types.Array(types.int64, 1, "C"))
            compiled = numba.njit(signature, cache=self.use_cache, **_JIT_OPTIONS)(function)
            return compiled, sum(compiled.stats.cache_hits.values())
        if entry == "c_entry":
            signature = types.int32(types.int64, f64p, f64p, f64p, types.voidptr)
        elif entry == "nutpie_logp":
            signature = types.int32(types.uint64, f64p, f64p, f64p, types.voidptr)
        else:
            signature = types.int32(types.uint64, types.uint64, f64p, f64p, types.voidptr)
        compiled = numba.cfunc(
            signature, cache=self.use_cache, error_model="numpy", boundscheck=False
        )(function)
        return compiled, compiled.cache_hits


_MODULES: dict[str, _EntryModule] = {}
_modules_lock = threading.Lock()


def reset_after_fork() -> None:
    """In a forked child: new locks (a thread of the parent may have held them)."""
    global _modules_lock
    _modules_lock = threading.Lock()
    for module in list(_MODULES.values()):
        module.lock = threading.Lock()


def _entry_module(text: str) -> _EntryModule:
    key = "n" + hashlib.sha256(text.encode()).hexdigest()[:31]
    with _modules_lock:
        found = _MODULES.get(key)
        if found is None:
            found = _MODULES[key] = _EntryModule(key, text)
        return found


# --- the handle --------------------------------------------------------------------------------
class NativeHandle:
    """A compiled function's native entry points for one argument shape (see `as_native`).

    Attributes: `n` (elements of x), `input_shape`, `value_size` / `grad_size` (elements of
    the first / second result; 0 when there is no second), `value_shape` / `grad_shape`,
    `data` (the int64 descriptor to pass as the data argument), `data_address`.
    Properties compile on first use: `numba` (a Numba function for `@njit` code),
    `cfunc` (a Numba CFunc: `.address`, `.ctypes`), `address` (the C function pointer),
    `ctypes_function`.
    """

    def __init__(self, program: Program, name: str):
        if importlib.util.find_spec("numba") is None:
            raise ImportError('as_native needs Numba: pip install "gradtape[numba]"')
        text, consts, sizes = entry_module_text(program, name)
        self.name = name
        self._module = _entry_module(text)
        self.key = self._module.key
        self.constants = tuple(consts)  # kept alive: `data` holds their addresses
        self.n = sizes["n"]
        self.input_shape = tuple(program.inputs[0].shape)
        outputs = program.outputs
        self.value_size = sizes["value_size"]
        self.grad_size = sizes["grad_size"]
        self.value_shape = tuple(outputs[0].shape)
        self.grad_shape = tuple(outputs[1].shape) if len(outputs) > 1 else None
        self._scalar = [leaf.scalar or leaf.shape == () for leaf in outputs]
        self._out_tree = program.out_tree
        self.data = np.array(
            [sizes["tag"], *(c.ctypes.data for c in self.constants)], dtype=np.int64
        )
        self.data_address = self.data.ctypes.data
        self.checks = [c.where for c in program.checks]

    # --- compiled entry points ---
    @property
    def numba(self):
        """`status = f(x, value, grad, data)`, a Numba function `@njit` code calls: x, value,
        grad are C-contiguous float64 vectors of n, value_size and grad_size elements (an
        empty array when grad_size is 0), data is `handle.data`; returns an int32 status."""
        return self._module.get("core")

    @property
    def cfunc(self):
        """The C entry point (a numba CFunc): `int32_t f(int64_t n, const double *x,
        double *value, double *grad, void *data)` with data = `handle.data_address`."""
        return self._module.get("c_entry")

    @property
    def address(self) -> int:
        """The address of the C entry point (see `cfunc`)."""
        return self.cfunc.address

    @property
    def ctypes_function(self):
        """The C entry point as a ctypes function (argtypes set)."""
        return self.cfunc.ctypes

    def nutpie_logp(self):
        """The entry point in the order of nutpie's log-density, `int32_t logp(uint64_t n,
        const double *x, double *grad, double *logp, void *pair)`, where pair points to two
        data addresses and this one reads the first (gradtape.nutpie)."""
        return self._module.get("nutpie_logp")

    def nutpie_copy(self):
        """An expand entry point for nutpie that copies x (a model without constraints)."""
        return self._module.get("nutpie_copy")

    def nutpie_expand(self):
        """The entry point in the order of nutpie's expand function, `int32_t expand(uint64_t
        n, uint64_t m, const double *x, double *out, void *pair)`; it reads the second data
        address of the pair (gradtape.nutpie)."""
        return self._module.get("nutpie_expand")

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling (or loading from the cache) this handle's entry points."""
        return self._module.compile_seconds

    @property
    def from_cache(self) -> bool:
        """Whether every entry point compiled so far was loaded from the disk cache."""
        hits = self._module.cache_hits
        return bool(hits) and all(hits.values())

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
        grad = np.empty(self.grad_size)
        status = int(self.numba(x.reshape(-1), value, grad, self.data))
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
