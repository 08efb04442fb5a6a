"""Kernels as machine code from LLVM directly (llvmlite), called from Python with no Numba.

`build(key, module_text, kernels)` translates each kernel of a numba-backend module
(translate.py), wraps it in a Python entry point, optimizes the module (O3, loop and SLP
vectorization, the host CPU's features, as Numba does), emits an object file and loads it
into an MCJIT engine of its own. The entry points take and return what Numba's entry points
do (arrays, Python numbers; a tuple with the status first), so the generated wrapper calls
them unchanged.

An entry point is a CPython builtin function (`METH_FASTCALL`, built with
`PyCFunction_NewEx`): Python calls it as directly as Numba's compiled entry point, with no
ctypes conversion per argument. It checks each array (exactly an ndarray, the expected dtype
in native byte order, the number of axes, aligned, writeable when written) and reads its data
pointer and shape from NumPy's array struct, whose field offsets are verified against a real
array when the process first uses this module; an argument that fails a check makes the call
return the status STATUS_CHECK, answered by the numpy backend. The GIL is released while the
loops run.

The object file is cached in gradtape's per-user kernel cache (cache.py: owner-only
directories, refused when shared), beside the module's text, with a SHA-256 checksum
verified before it is loaded: a damaged file is deleted and the kernels compiled again. Its
name holds a digest of the translator's sources, LLVM's version and the host CPU, so code
for another CPU or translator is never loaded. A second process loads the object file with
llvmlite alone: Numba is not imported.

Each module gets its own execution engine, kept alive by its entry points (their `self`):
when the last variant using them goes (the kernel cache drops them), the engine and its
machine code are freed.
"""

from __future__ import annotations

import ast
import ctypes
import ctypes.util
import hashlib
import os
import sys
import threading
from pathlib import Path

import numpy as np

from ..numba import cache
from ..numba.status import STATUS_CHECK
from .translate import (
    BOOL,
    DTYPE_TYPE,
    F32,
    F64,
    I64,
    LL,
    STORE,
    ArrayArg,
    NotServed,
    Scope,
    Translator,
    finish_ir,
    is_float,
)

__all__ = ["build", "NotServed", "Unusable", "available", "translator_digest"]


class Unusable(Exception):
    """This process cannot use the generator (NumPy's array struct is not the expected one)."""


_lock = threading.Lock()
_ready: list = []  # [llvm binding module] once initialized
_cells: dict[str, ctypes.c_void_p] = {}  # process addresses the object code reads by name
OPT_LEVEL = 3

# NumPy's array and descriptor struct fields (numpy/ndarraytypes.h), checked at startup
_DATA, _ND, _DIMS, _DESCR, _FLAGS = 16, 24, 32, 56, 64
_TYPEOBJ, _BYTEORDER = 16, 26
_C_CONTIGUOUS, _ALIGNED, _WRITEABLE = 0x1, 0x100, 0x400
_METH_FASTCALL = 0x80
_SCALAR_TYPES = {F64: np.float64, F32: np.float32, I64: np.int64, BOOL: np.bool_}
_LIBM = ("sin", "cos", "tan", "erf", "erfc", "pow", "sinf", "cosf", "tanf", "erff", "erfcf", "powf")
_LIBC = ("malloc", "free", "memset", "memcpy", "memmove")
_PYTHON_API = (
    "PyTuple_New",
    "PyTuple_SetItem",
    "PyFloat_FromDouble",
    "PyFloat_AsDouble",
    "PyLong_FromLongLong",
    "PyLong_AsLongLong",
    "PyBool_FromLong",
    "PyObject_IsTrue",
    "PyErr_Occurred",
    "PyErr_Clear",
    "PyEval_SaveThread",
    "PyEval_RestoreThread",
    "Py_DecRef",
)


def available() -> bool:
    """Whether llvmlite is installed and this process's NumPy has the expected array layout
    (checked once; imports llvmlite)."""
    try:
        _init()
    except Exception:
        return False
    return True


def _layout_ok() -> bool:
    """NumPy's struct offsets, checked on real arrays (a mismatch: this generator is off)."""
    read_ptr = lambda a: ctypes.c_void_p.from_address(a).value or 0  # noqa: E731
    a = np.zeros((3, 4), np.float32)
    big = np.zeros(2, np.dtype(">f8"))
    addr = id(a)
    dims = read_ptr(addr + _DIMS)
    descr = read_ptr(addr + _DESCR)
    flags = ctypes.c_int32.from_address(addr + _FLAGS).value
    big_descr = read_ptr(id(big) + _DESCR)
    return (
        read_ptr(addr + 8) == id(np.ndarray)
        and read_ptr(addr + _DATA) == a.ctypes.data
        and ctypes.c_int32.from_address(addr + _ND).value == 2
        and ctypes.c_int64.from_address(dims).value == 3
        and ctypes.c_int64.from_address(dims + 8).value == 4
        and read_ptr(descr + _TYPEOBJ) == id(np.float32)
        and flags & (_C_CONTIGUOUS | _ALIGNED | _WRITEABLE)
        == (_C_CONTIGUOUS | _ALIGNED | _WRITEABLE)
        and ctypes.c_int32.from_address(id(a.T) + _FLAGS).value & _C_CONTIGUOUS == 0
        and ctypes.c_char.from_address(big_descr + _BYTEORDER).value == b">"
        and ctypes.c_char.from_address(descr + _BYTEORDER).value in (b"=", b"<", b"|")
        and sys.byteorder == "little"
        and ctypes.sizeof(ctypes.c_void_p) == 8
    )


def _init():
    """Initialize LLVM's native target and the symbols the object code uses (once)."""
    if _ready:
        return _ready[0]
    with _lock:
        if _ready:
            return _ready[0]
        import llvmlite.binding as llvm

        if not _layout_ok():
            raise Unusable("NumPy's array struct is not the expected one")
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        libm = ctypes.CDLL(ctypes.util.find_library("m"))
        libc = ctypes.CDLL(None)
        for name in _LIBM:
            llvm.add_symbol(name, ctypes.cast(getattr(libm, name), ctypes.c_void_p).value)
        for name in _LIBC:
            llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
        for name in _PYTHON_API:
            function = getattr(ctypes.pythonapi, name)
            llvm.add_symbol(name, ctypes.cast(function, ctypes.c_void_p).value)
        cells = {"gradtape_ndarray_type": id(np.ndarray)}
        cells.update({f"gradtape_scalar_{t}": id(s) for t, s in _SCALAR_TYPES.items()})
        for name, address in cells.items():
            cell = _cells[name] = ctypes.c_void_p(address)
            llvm.add_symbol(name, ctypes.addressof(cell))
        _ready.append(llvm)
        return llvm


def _host() -> tuple[str, str]:
    llvm = _init()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def _target_machine():
    llvm = _init()
    cpu, features = _host()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(
        cpu=cpu, features=features, opt=OPT_LEVEL, reloc="static", codemodel="jitdefault", jit=True
    )


_digest: list[str] = []


def translator_digest() -> str:
    """A digest of what the machine code depends on besides the module's text: this
    package's sources, the helpers' sources it translates, LLVM's version and the host CPU."""
    if not _digest:
        h = hashlib.sha256()
        here = Path(__file__).resolve().parent
        for path in sorted(here.glob("*.py")):
            h.update(path.read_bytes())
        for name in ("runtime.py", "fastmath.py", "status.py"):
            h.update((here.parent / "numba" / name).read_bytes())
        llvm = _init()
        h.update(repr((llvm.llvm_version_info, _host(), OPT_LEVEL, np.__version__)).encode())
        _digest.append(h.hexdigest()[:16])
    return _digest[0]


# --- the entry points -----------------------------------------------------------------------
def _written_names(node: ast.FunctionDef) -> set[str]:
    names = set()
    for n in ast.walk(node):
        targets = []
        if isinstance(n, ast.Assign):
            targets = n.targets
        elif isinstance(n, ast.AugAssign):
            targets = [n.target]
        for t in targets:
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                names.add(t.value.id)
    return names


def _entry(module, node: ast.FunctionDef, kernel, large: list) -> str:
    """Write kernel `kernel`'s entry point (its Python function `node`) into `module`."""
    from llvmlite import ir

    i8p = ir.IntType(8).as_pointer()
    i32, i64 = ir.IntType(32), ir.IntType(64)
    fnty = ir.FunctionType(i8p, [i8p, i8p.as_pointer(), i64])
    name = f"gradtape_{kernel.name}"
    fn = ir.Function(module, fnty, name=name)
    fn.attributes.add("nounwind")
    entry_block = fn.append_basic_block("entry")
    body_block = fn.append_basic_block("unbox")
    fail_block = fn.append_basic_block("fail")
    exit_block = fn.append_basic_block("exit")
    entry = ir.IRBuilder(entry_block)
    b = ir.IRBuilder(body_block)
    self_arg, args, nargs = fn.args

    def declare(symbol, ret, params):
        f = module.globals.get(symbol)
        if f is None:
            f = ir.Function(module, ir.FunctionType(ret, params), name=symbol)
        return f

    def cell(symbol):
        g = module.globals.get(symbol)
        if g is None:
            g = ir.GlobalVariable(module, i8p, name=symbol)
            g.linkage = "external"
        return g

    def field(ptr, offset, ty):
        address = b.gep(ptr, [ir.Constant(i64, offset)])
        return b.load(b.bitcast(address, ty.as_pointer()))

    def check(ok):
        good = fn.append_basic_block("ok")
        b.cbranch(ok, good, fail_block)
        b.position_at_end(good)

    returns = []
    for _kind, var in kernel.returns:
        if var.shape != () or var.dtype not in DTYPE_TYPE:
            raise NotServed("a kernel handing an array to a later one")
        returns.append(DTYPE_TYPE[var.dtype])
    params = [a.arg for a in node.args.args]
    if params != [a.name for a in kernel.args]:
        raise NotServed("kernel arguments differ from its signature")
    written = _written_names(node)

    check(b.icmp_signed("==", nargs, ir.Constant(i64, len(params))))
    scope = Scope({}, ())
    ndarray_type = b.load(cell("gradtape_ndarray_type"))
    for k, karg in enumerate(kernel.args):
        obj = b.load(b.gep(args, [ir.Constant(i64, k)]))
        t = DTYPE_TYPE.get(np.dtype(karg.dtype))
        if t is None:
            raise NotServed(f"an argument of dtype {karg.dtype}")
        if karg.ndim is None:
            if is_float(t):
                got = b.call(declare("PyFloat_AsDouble", ir.DoubleType(), [i8p]), [obj])
                failed = b.fcmp_ordered("==", got, ir.Constant(ir.DoubleType(), -1.0))
                with b.if_then(failed, likely=False):
                    occurred = b.call(declare("PyErr_Occurred", i8p, []), [])
                    check(b.icmp_unsigned("==", occurred, ir.Constant(i8p, None)))
                value = got if t == F64 else b.fptrunc(got, LL[F32])
            elif t == I64:
                value = b.call(declare("PyLong_AsLongLong", i64, [i8p]), [obj])
                failed = b.icmp_signed("==", value, ir.Constant(i64, -1))
                with b.if_then(failed, likely=False):
                    occurred = b.call(declare("PyErr_Occurred", i8p, []), [])
                    check(b.icmp_unsigned("==", occurred, ir.Constant(i8p, None)))
            else:
                truth = b.call(declare("PyObject_IsTrue", i32, [i8p]), [obj])
                check(b.icmp_signed(">=", truth, ir.Constant(i32, 0)))
                value = b.icmp_signed("!=", truth, ir.Constant(i32, 0))
            slot = entry.alloca(LL[t], name=karg.name)
            b.store(value, slot)
            scope.vars[karg.name] = (slot, t)
            continue
        if karg.ndim == 0:
            raise NotServed("a 0-d array argument")
        check(b.icmp_unsigned("==", field(obj, 8, i8p), ndarray_type))
        check(b.icmp_signed("==", field(obj, _ND, i32), ir.Constant(i32, karg.ndim)))
        descr = field(obj, _DESCR, i8p)
        scalar_type = b.load(cell(f"gradtape_scalar_{t}"))
        check(b.icmp_unsigned("==", field(descr, _TYPEOBJ, i8p), scalar_type))
        check(
            b.icmp_unsigned(
                "!=", field(descr, _BYTEORDER, ir.IntType(8)), ir.Constant(ir.IntType(8), ord(">"))
            )
        )
        flags = field(obj, _FLAGS, i32)
        need = _ALIGNED | (_WRITEABLE if karg.name in written else 0)
        check(b.icmp_unsigned("==", b.and_(flags, ir.Constant(i32, need)), ir.Constant(i32, need)))
        data = b.bitcast(field(obj, _DATA, i8p), STORE[t].as_pointer())
        dims_ptr = b.bitcast(field(obj, _DIMS, i8p), i64.as_pointer())
        dims = [b.load(b.gep(dims_ptr, [ir.Constant(i64, d)])) for d in range(karg.ndim)]
        scope.values[karg.name] = ArrayArg(data, dims, t, flags)
    thread_state = b.call(declare("PyEval_SaveThread", i8p, []), [])

    # the kernel's returns store into these slots and branch to exit (the GIL is taken back
    # there and the tuple built)
    slots = [entry.alloca(LL[t]) for t in [I64] + returns]

    def on_return(values: list, builder) -> None:
        if len(values) != len(slots):
            raise NotServed("a return of another length")
        for v, slot, t in zip(values, slots, [I64] + returns):
            builder.store(translator.convert(v, t).v, slot)
        builder.branch(exit_block)

    translator = Translator(module, b, entry)
    translator.top_block = b.block
    translator.on_return = on_return
    translator.body(node.body, scope, nested=False)
    if not b.block.is_terminated:
        raise NotServed("a kernel that may end without a return")
    if translator.wide_vectors:
        set.add(fn.attributes, '"prefer-vector-width"="512"')
    large[0] += translator.large_loops
    b.position_at_end(exit_block)
    b.call(declare("PyEval_RestoreThread", ir.VoidType(), [i8p]), [thread_state])
    _box(b, declare, fn, [b.load(s) for s in slots], [I64] + returns)
    # arguments that fail a check: (STATUS_CHECK, placeholders), the numpy backend answers
    b.position_at_end(fail_block)
    b.call(declare("PyErr_Clear", ir.VoidType(), []), [])
    placeholders = [ir.Constant(i64, STATUS_CHECK)] + [
        ir.Constant(LL[t], 0.0 if is_float(t) else 0) for t in returns
    ]
    _box(b, declare, fn, placeholders, [I64] + returns)
    entry.branch(body_block)
    return name


def _box(b, declare, fn, values: list, types: list) -> None:
    """Return the tuple of `values` (NULL with Python's error set if an allocation fails)."""
    from llvmlite import ir

    i8p = ir.IntType(8).as_pointer()
    i32, i64 = ir.IntType(32), ir.IntType(64)
    null = ir.Constant(i8p, None)
    tup = b.call(declare("PyTuple_New", i8p, [i64]), [ir.Constant(i64, len(values))])
    with b.if_then(b.icmp_unsigned("==", tup, null), likely=False):
        b.ret(null)
    for k, (v, t) in enumerate(zip(values, types)):
        if t == I64:
            item = b.call(declare("PyLong_FromLongLong", i8p, [i64]), [v])
        elif t == BOOL:
            item = b.call(declare("PyBool_FromLong", i8p, [i64]), [b.zext(v, i64)])
        else:
            v = v if t == F64 else b.fpext(v, ir.DoubleType())
            item = b.call(declare("PyFloat_FromDouble", i8p, [ir.DoubleType()]), [v])
        with b.if_then(b.icmp_unsigned("==", item, null), likely=False):
            b.call(declare("Py_DecRef", ir.VoidType(), [i8p]), [tup])
            b.ret(null)
        b.call(declare("PyTuple_SetItem", i32, [i8p, i64, i8p]), [tup, ir.Constant(i64, k), item])
    b.ret(tup)


def translate(module_text: str, kernels: list) -> tuple[str, list[str]]:
    """The LLVM IR of a module's kernels (text) and their entry points' names; NotServed for
    a module outside the translated subset."""
    from llvmlite import ir

    _init()
    tree = ast.parse(module_text)
    if any(
        isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id in ("PARALLEL", "HELPERS")
        and not (
            n.targets[0].id == "PARALLEL"
            and isinstance(n.value, ast.Constant)
            and n.value.value is False
        )
        for n in tree.body
    ):
        raise NotServed("parallel loops or native loop helpers")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    llvm = _ready[0]
    module = ir.Module(name="gradtape_kernels")
    module.triple = llvm.get_process_triple()
    names = []
    large = [0]
    for kernel in kernels:
        node = functions.get(kernel.name)
        if node is None:
            raise NotServed(f"no function {kernel.name}")
        names.append(_entry(module, node, kernel, large))
    text = finish_ir(str(module))
    if large[0]:
        text = _NO_SLP + text
    return text, names


# a module with a loop too large to vectorize is compiled without the SLP vectorizer too
# (translate.LARGE_LOOP_COST); the mark is in the text, so it is part of what is compiled
_NO_SLP = "; gradtape: no SLP vectorizer\n"


_machine: list = []  # the target machine objects are emitted with (one per process)
_machine_lock = threading.Lock()


def compile_object(ir_text: str) -> bytes:
    """Optimize the IR (O3, vectorizers on, host CPU) and emit an object file.

    A pass builder is made per module, as Numba does: llvmlite registers instrumentation
    callbacks into the builder on every run, which reference objects of that run only (a
    builder run twice would call freed ones). Those callbacks are never freed: about 120 KB
    per module compiled (measured), against about 1.1 MB that Numba keeps per program.
    """
    llvm = _init()
    pto = llvm.create_pipeline_tuning_options()
    pto.speed_level = OPT_LEVEL
    pto.loop_vectorization = True
    pto.slp_vectorization = not ir_text.startswith(_NO_SLP)
    with _machine_lock:  # (LLVM's objects are not used by two threads at once)
        if not _machine:
            _machine.append(_target_machine())
        tm = _machine[0]
        # a context of its own: LLVM's global context keeps every constant, name and
        # metadata node it ever saw; this one goes with the module
        context = llvm.create_context()
        mod = llvm.parse_assembly(ir_text, context)
        mod.verify()
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        obj = tm.emit_object(mod)
        mod.close()
        context.close()
    return obj


class _Holder:
    """What the entry points keep alive (their `self`): the engine and the method defs."""

    def __init__(self, engine, defs):
        self.engine = engine
        self.defs = defs

    def __del__(self):
        try:
            self.engine.close()
        except Exception:
            pass


class _MethodDef(ctypes.Structure):
    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


_new_function = None


def load(obj: bytes, names: list[str]) -> tuple:
    """Load an object file into an engine of its own; its entry points, by `names`."""
    global _new_function
    llvm = _init()
    if _new_function is None:
        f = ctypes.pythonapi.PyCFunction_NewEx
        f.argtypes = [ctypes.POINTER(_MethodDef), ctypes.py_object, ctypes.py_object]
        f.restype = ctypes.py_object
        _new_function = f
    with _machine_lock:  # (one thread in LLVM's JIT at a time)
        tm = _target_machine()
        empty = llvm.parse_assembly("", llvm.create_context())
        engine = llvm.create_mcjit_compiler(empty, tm)
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        addresses = [engine.get_function_address(name) for name in names]
    if not all(addresses):
        engine.close()
        raise NotServed("an entry point is missing from the object file")
    defs = [
        _MethodDef(name.encode(), address, _METH_FASTCALL, None)
        for name, address in zip(names, addresses)
    ]
    holder = _Holder(engine, defs)
    return tuple(_new_function(ctypes.byref(d), holder, None) for d in defs)


def build(key: str, module_text: str, kernels: list) -> tuple[tuple, bool]:
    """The entry points of a module's kernels: (functions, loaded from the disk cache).
    Raises NotServed when the module is outside what this generator translates."""
    directory = cache.kernel_dir()
    path = None
    names = [f"gradtape_{k.name}" for k in kernels]
    if directory is not None:
        cache.module_file(directory, key, module_text)  # the entry's text (pruning, clear)
        path = directory / "__pycache__" / f"k_{key}.llvm-{translator_digest()}.o"
        try:
            payload = cache._read_verified(str(path))
        except FileNotFoundError:
            payload = None
        except OSError:
            payload = None
        if payload is not None:
            return load(payload, names), True
    ir_text, names = translate(module_text, kernels)
    obj = compile_object(ir_text)
    functions = load(obj, names)
    if path is not None:
        try:
            _write_bytes(path, cache.frame(obj))
        except OSError:
            pass  # (a full disk: the next process compiles again)
        cache.prune_once(directory)
    return functions, False


def _write_bytes(path: Path, data: bytes) -> None:
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".o")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
