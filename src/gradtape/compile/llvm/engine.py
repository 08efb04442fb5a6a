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
in native byte order, the number of axes, writeable when written; any alignment, as the
kernels' loads and stores assume none) and reads its data
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
    Builder,
    NotServed,
    Placeholder,
    Scope,
    Translator,
    Val,
    finish_ir,
    is_float,
    rebound_names,
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
    "Py_IncRef",
    "PyObject_CallFunctionObjArgs",
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
        cells = {
            "gradtape_ndarray_type": id(np.ndarray),
            "gradtape_np_empty": id(np.empty),
            "gradtape_none": id(None),
        }
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
def _base_name(e: ast.expr) -> str | None:
    """The array a target or an argument writes into: `a` of `a`, `a[i]`, `a[i, 2:5]`."""
    while isinstance(e, ast.Subscript):
        e = e.value
    return e.id if isinstance(e, ast.Name) else None


def _aliases(node: ast.FunctionDef) -> dict[str, str]:
    """Names bound to a view of another array (`u = a[:-1]`, `a.reshape(n)`, ...)."""
    aliases = {}
    for n in ast.walk(node):
        if not (isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)):
            continue
        value = n.value
        if isinstance(value, ast.Call) and (
            (isinstance(value.func, ast.Attribute) and value.func.attr == "reshape")
            or (isinstance(value.func, ast.Attribute) and value.func.attr == "ascontiguousarray")
        ):
            value = value.func.value if value.func.attr == "reshape" else value.args[0]
        base = _base_name(value) if isinstance(value, (ast.Subscript, ast.Name)) else None
        if base is not None:
            aliases[n.targets[0].id] = base
    return aliases


def _written_names(node: ast.FunctionDef, functions: dict, memo: dict | None = None) -> set:
    """The arrays a function writes into: subscript targets, copy_into's and add_into's
    first argument, the arguments of module functions it calls that they write, and the
    arrays these are views of."""
    memo = {} if memo is None else memo
    if node.name in memo:
        return memo[node.name]
    memo[node.name] = names = set()
    for n in ast.walk(node):
        targets = []
        if isinstance(n, ast.Assign):
            targets = [t for t in n.targets if isinstance(t, ast.Subscript)]
        elif isinstance(n, ast.AugAssign):
            targets = [n.target]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            if n.func.id in ("copy_into", "add_into") and n.args:
                targets = [n.args[0]]
            elif n.func.id in functions:
                callee = functions[n.func.id]
                written = _written_names(callee, functions, memo)
                params = [a.arg for a in callee.args.args]
                targets = [a for p, a in zip(params, n.args) if p in written]
        names.update(b for b in map(_base_name, targets) if b is not None)
    aliases = _aliases(node)
    grown = True
    while grown:
        more = {aliases[n] for n in names if n in aliases} - names
        names |= more
        grown = bool(more)
    return names


def _returned_names(node: ast.FunctionDef) -> set[str]:
    """Names in the tuples a kernel returns (arrays among them are allocated as ndarrays)."""
    return {
        e.id
        for n in ast.walk(node)
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
        for e in n.value.elts
        if isinstance(e, ast.Name)
    }


class _EntryWriter:
    """Writes one kernel's entry point: a METH_FASTCALL function that checks and unboxes
    its arguments, releases the GIL, runs the kernel's body (translate.Translator) and
    returns what it returns boxed: a tuple (the status, scalars and ndarrays), or one
    number (a loop driver's status)."""

    def __init__(self, module, node: ast.FunctionDef, kernel, functions: dict):
        from llvmlite import ir

        self.ir = ir
        self.module, self.node, self.kernel = module, node, kernel
        self.i8p = ir.IntType(8).as_pointer()
        self.i32, self.i64 = ir.IntType(32), ir.IntType(64)
        fnty = ir.FunctionType(self.i8p, [self.i8p, self.i8p.as_pointer(), self.i64])
        self.name = f"gradtape_{kernel.name}"
        self.fn = ir.Function(module, fnty, name=self.name)
        self.fn.attributes.add("nounwind")
        self.entry = Builder(self.fn.append_basic_block("entry"))
        self.b = Builder(self.fn.append_basic_block("unbox"))
        self.fail_block = self.fn.append_basic_block("fail")
        self.functions = functions
        self.written = _written_names(node, functions)
        self.py_objects: list = []  # slots of the ndarrays the kernel allocated
        self.translator = None
        self.null = ir.Constant(self.i8p, None)
        self.error_block = self.status_block = None

    def declare(self, symbol: str, ret, params: list, var_arg: bool = False):
        f = self.module.globals.get(symbol)
        if f is None:
            ftype = self.ir.FunctionType(ret, params, var_arg=var_arg)
            f = self.ir.Function(self.module, ftype, name=symbol)
        return f

    def cell(self, symbol: str):
        g = self.module.globals.get(symbol)
        if g is None:
            g = self.ir.GlobalVariable(self.module, self.i8p, name=symbol)
            g.linkage = "external"
        return g

    def field(self, ptr, offset: int, ty):
        address = self.b.gep(ptr, [self.ir.Constant(self.i64, offset)])
        return self.b.load(self.b.bitcast(address, ty.as_pointer()))

    def check(self, ok) -> None:
        good = self.fn.append_basic_block("ok")
        self.b.cbranch(ok, good, self.fail_block)
        self.b.position_at_end(good)

    def python_call(self, name: str, ret, params: list, args: list):
        return self.b.call(self.declare(name, ret, params), args)

    def unbox_scalar(self, obj, t: str, name: str):
        """A Python number as the kernel's scalar type (a failed conversion: fail)."""
        ir, b = self.ir, self.b
        if is_float(t):
            got = self.python_call("PyFloat_AsDouble", ir.DoubleType(), [self.i8p], [obj])
            failed = b.fcmp_ordered("==", got, ir.Constant(ir.DoubleType(), -1.0))
            value = got if t == F64 else b.fptrunc(got, LL[F32])
        elif t == I64:
            value = self.python_call("PyLong_AsLongLong", self.i64, [self.i8p], [obj])
            failed = b.icmp_signed("==", value, ir.Constant(self.i64, -1))
        else:
            truth = self.python_call("PyObject_IsTrue", self.i32, [self.i8p], [obj])
            self.check(b.icmp_signed(">=", truth, ir.Constant(self.i32, 0)))
            failed = None
            value = b.icmp_signed("!=", truth, ir.Constant(self.i32, 0))
        if failed is not None:
            with b.if_then(failed, likely=False):
                occurred = self.python_call("PyErr_Occurred", self.i8p, [], [])
                self.check(b.icmp_unsigned("==", occurred, self.null))
        slot = self.entry.alloca(LL[t], name=name)
        b.store(value, slot)
        return slot

    def unbox_array(self, obj, t: str, karg) -> ArrayArg:
        """An ndarray of exactly this dtype (native byte order) and axes, aligned, writeable
        if the kernel writes it (C-contiguous too for a kernel that does not check)."""
        ir, b = self.ir, self.b
        i8 = ir.IntType(8)
        self.check(b.icmp_unsigned("==", self.field(obj, 8, self.i8p), self.ndarray_type))
        self.check(
            b.icmp_signed("==", self.field(obj, _ND, self.i32), ir.Constant(self.i32, karg.ndim))
        )
        descr = self.field(obj, _DESCR, self.i8p)
        scalar_type = b.load(self.cell(f"gradtape_scalar_{t}"))
        self.check(b.icmp_unsigned("==", self.field(descr, _TYPEOBJ, self.i8p), scalar_type))
        order = self.field(descr, _BYTEORDER, i8)
        self.check(b.icmp_unsigned("!=", order, ir.Constant(i8, ord(">"))))
        flags = self.field(obj, _FLAGS, self.i32)
        need = _WRITEABLE if karg.name in self.written else 0  # (any alignment: align-1 loads)
        need |= 0 if self.checks_layout else _C_CONTIGUOUS
        need = ir.Constant(self.i32, need)
        self.check(b.icmp_unsigned("==", b.and_(flags, need), need))
        data = b.bitcast(self.field(obj, _DATA, self.i8p), STORE[t].as_pointer())
        dims_ptr = b.bitcast(self.field(obj, _DIMS, self.i8p), self.i64.as_pointer())
        dims = [b.load(b.gep(dims_ptr, [ir.Constant(self.i64, d)])) for d in range(karg.ndim)]
        return ArrayArg(data, dims, t, flags)

    def unbox(self, args, nargs) -> Scope:
        ir, b = self.ir, self.b
        params = [a.arg for a in self.node.args.args]
        if params != [a.name for a in self.kernel.args]:
            raise NotServed("kernel arguments differ from its signature")
        self.checks_layout = any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "is_c"
            for n in ast.walk(self.node)
        )
        self.check(b.icmp_signed("==", nargs, ir.Constant(self.i64, len(params))))
        scope = Scope({}, ())
        self.ndarray_type = b.load(self.cell("gradtape_ndarray_type"))
        for k, karg in enumerate(self.kernel.args):
            obj = b.load(b.gep(args, [ir.Constant(self.i64, k)]))
            t = DTYPE_TYPE.get(np.dtype(karg.dtype))
            if t is None:
                raise NotServed(f"an argument of dtype {karg.dtype}")
            if karg.ndim is None:
                scope.vars[karg.name] = (self.unbox_scalar(obj, t, karg.name), t)
            elif karg.ndim == 0:
                raise NotServed("a 0-d array argument")
            else:
                scope.values[karg.name] = self.unbox_array(obj, t, karg)
        return scope

    # --- ndarrays the kernel allocates (results it returns) ---
    def new_ndarray(self, t: str, dims: list):
        """np.empty(dims, dtype) called with the GIL held; NULL (an exception): the kernel
        frees what it holds and returns NULL."""
        ir, b = self.ir, self.b
        shape = self.python_call(
            "PyTuple_New", self.i8p, [self.i64], [ir.Constant(self.i64, len(dims))]
        )
        self.not_null(shape)
        for k, d in enumerate(dims):
            item = self.python_call("PyLong_FromLongLong", self.i8p, [self.i64], [d])
            self.not_null(item, shape)
            self.python_call(
                "PyTuple_SetItem",
                self.i32,
                [self.i8p, self.i64, self.i8p],
                [shape, ir.Constant(self.i64, k), item],
            )
        dtype = b.load(self.cell(f"gradtape_scalar_{t}"))
        call = self.declare("PyObject_CallFunctionObjArgs", self.i8p, [self.i8p], var_arg=True)
        empty = b.load(self.cell("gradtape_np_empty"))
        obj = b.call(call, [empty, shape, dtype, self.null])
        self.python_call("Py_DecRef", ir.VoidType(), [self.i8p], [shape])
        self.not_null(obj)
        return obj

    def not_null(self, value, *owned) -> None:
        """Continue if `value` is not NULL; else release `owned` and what the kernel holds,
        and return NULL (Python's exception is set; the GIL is held)."""
        ir, b = self.ir, self.b
        if self.error_block is None:
            self.error_block = self.fn.append_basic_block("error")
        failed = b.icmp_unsigned("==", value, self.null)
        if not owned:
            good = self.fn.append_basic_block("ok")
            b.cbranch(failed, self.error_block, good)
            b.position_at_end(good)
            return
        with b.if_then(failed, likely=False):
            for o in owned:
                self.python_call("Py_DecRef", ir.VoidType(), [self.i8p], [o])
            b.branch(self.error_block)

    def release(self) -> None:
        """Free the kernel's buffers and drop its ndarrays (at a return; the GIL held)."""
        if self.translator is not None:
            self.translator.free_buffers()
        for slot in self.py_objects:
            obj = self.b.load(slot)
            self.python_call("Py_DecRef", self.ir.VoidType(), [self.i8p], [obj])

    def allocate(self, t: str, dims: list) -> ArrayArg:
        """An ndarray the kernel fills and returns: allocated by NumPy (the GIL taken for
        the call), held in a slot until the return hands it over."""
        b = self.b
        restore = self.declare("PyEval_RestoreThread", self.ir.VoidType(), [self.i8p])
        b.call(restore, [b.load(self.thread_state)])
        obj = self.new_ndarray(t, dims)
        slot = self.entry.alloca(self.i8p, name="ndarray")
        self.entry.store(self.null, slot)
        self.py_objects.append(slot)
        b.store(obj, slot)
        data = b.bitcast(self.field(obj, _DATA, self.i8p), STORE[t].as_pointer())
        b.store(self.python_call("PyEval_SaveThread", self.i8p, [], []), self.thread_state)
        return ArrayArg(data, dims, t, None, pyobj=slot)

    # --- the whole entry point ---
    def write(self, large: list, compiled: dict) -> str:
        """Write the entry point; its symbol's name."""
        b = self.b
        _self_arg, args, nargs = self.fn.args
        self.scalar_return = any(
            isinstance(n, ast.Return) and n.value is not None and not isinstance(n.value, ast.Tuple)
            for n in ast.walk(self.node)
        )
        self.returns = []
        for _kind, var in self.kernel.returns:
            if var.dtype not in DTYPE_TYPE:
                raise NotServed(f"a result of dtype {var.dtype}")
            self.returns.append((DTYPE_TYPE[var.dtype], len(var.shape)))
        scope = self.unbox(args, nargs)
        self.thread_state = self.entry.alloca(self.i8p, name="thread_state")
        b.store(self.python_call("PyEval_SaveThread", self.i8p, [], []), self.thread_state)
        translator = self.translator = Translator(self.module, b, self.entry)
        translator.functions = self.functions
        translator.compiled = compiled
        translator.returned = _returned_names(self.node)
        translator.rebound = rebound_names(self.node)
        translator.allocator = self.allocate
        translator.top_block = b.block
        translator.on_return = self.on_return
        translator.status_exit = self.status_exit
        translator.body(self.node.body, scope, nested=False)
        if not b.block.is_terminated:
            raise NotServed("a kernel that may end without a return")
        if translator.wide_vectors:
            set.add(self.fn.attributes, '"prefer-vector-width"="512"')
        large[0] += translator.large_loops
        self.write_fail()
        self.write_exits()
        self.entry.branch(self.fn.blocks[1])
        return self.name

    def write_fail(self) -> None:
        """Arguments that fail a check: STATUS_CHECK (the numpy backend answers the call)."""
        ir, b = self.ir, self.b
        b.position_at_end(self.fail_block)
        self.python_call("PyErr_Clear", ir.VoidType(), [], [])
        status = Val(ir.Constant(self.i64, STATUS_CHECK), I64)
        if self.scalar_return:
            b.ret(self.box(status))
            return
        values = [status] + [
            Placeholder(t, ndim) if ndim else Val(ir.Constant(LL[t], 0), t)
            for t, ndim in self.returns
        ]
        b.ret(self.tuple_of(values, none_for_placeholders=True))

    def status_exit(self, builder, free_buffers) -> None:
        """Return STATUS_CHECK from here (a check Numba would raise on failed): the wrapper
        or the loop's caller answers the call another way (one block, written last)."""
        if self.status_block is None:
            self.status_block = self.fn.append_basic_block("status")
        builder.branch(self.status_block)

    def write_exits(self) -> None:
        """The blocks every failed check and every failed allocation branch to: they free
        all the buffers and ndarrays (those not made yet are NULL)."""
        b = self.b
        if self.status_block is not None:
            b.position_at_end(self.status_block)
            status = Val(self.ir.Constant(self.i64, STATUS_CHECK), I64)
            zeros = [
                Placeholder(t, ndim) if ndim else Val(self.ir.Constant(LL[t], 0), t)
                for t, ndim in self.returns
            ]
            self.on_return(status if self.scalar_return else (status, *zeros), b, None)
        if self.error_block is not None:
            b.position_at_end(self.error_block)
            self.release()
            b.ret(self.null)

    def on_return(self, value, builder, free_buffers) -> None:
        """A return of the kernel: take the GIL back, box the results, free the buffers,
        drop the ndarrays not returned, return."""
        ir = self.ir
        restore = self.declare("PyEval_RestoreThread", ir.VoidType(), [self.i8p])
        builder.call(restore, [builder.load(self.thread_state)])
        if self.scalar_return:
            if not isinstance(value, Val):
                raise NotServed("a kernel returning a scalar and a tuple")
            result = self.box(value)
            self.not_null(result)
        else:
            if not isinstance(value, tuple) or len(value) != len(self.returns) + 1:
                raise NotServed("a return of another length")
            values = [self.translator.convert(value[0], I64)]
            for v, (t, ndim) in zip(value[1:], self.returns):
                if isinstance(v, (ArrayArg, Placeholder)) != bool(ndim) or v.t != t:
                    raise NotServed("a return of another kind than the kernel's")
                values.append(v if ndim else self.translator.convert(v, t))
            result = self.tuple_of(values)
        self.release()
        builder.ret(result)

    def box(self, v: Val):
        ir = self.ir
        if v.t == I64:
            return self.python_call("PyLong_FromLongLong", self.i8p, [self.i64], [v.v])
        if v.t == BOOL:
            as_long = self.b.zext(v.v, self.i64)
            return self.python_call("PyBool_FromLong", self.i8p, [self.i64], [as_long])
        x = v.v if v.t == F64 else self.b.fpext(v.v, ir.DoubleType())
        return self.python_call("PyFloat_FromDouble", self.i8p, [ir.DoubleType()], [x])

    def boxed_array(self, v):
        """A returned array as an ndarray: the one the kernel allocated (a new reference),
        else a new ndarray with a copy of its elements (views, buffers, placeholders)."""
        ir, b = self.ir, self.b
        if isinstance(v, ArrayArg) and v.pyobj is not None:
            obj = b.load(v.pyobj)
            self.python_call("Py_IncRef", ir.VoidType(), [self.i8p], [obj])
            return obj
        if isinstance(v, Placeholder):
            return self.new_ndarray(v.t, [ir.Constant(self.i64, 0)] * v.ndim)
        obj = self.new_ndarray(v.t, v.dims)
        data = b.bitcast(self.field(obj, _DATA, self.i8p), STORE[v.t].as_pointer())
        self.translator.copy_data(ArrayArg(data, v.dims, v.t), v)
        return obj

    def tuple_of(self, values: list, none_for_placeholders: bool = False):
        """The tuple of `values` (scalars boxed, arrays as ndarrays)."""
        ir, b = self.ir, self.b
        n = ir.Constant(self.i64, len(values))
        tup = self.python_call("PyTuple_New", self.i8p, [self.i64], [n])
        self.not_null(tup)
        for k, v in enumerate(values):
            if isinstance(v, Val):
                item = self.box(v)
            elif none_for_placeholders:
                item = b.load(self.cell("gradtape_none"))
                self.python_call("Py_IncRef", ir.VoidType(), [self.i8p], [item])
            else:
                item = self.boxed_array(v)
            self.not_null(item, tup)
            args = [tup, ir.Constant(self.i64, k), item]
            self.python_call("PyTuple_SetItem", self.i32, [self.i8p, self.i64, self.i8p], args)
        return tup


def translate(module_text: str, kernels: list) -> tuple[str, list[str]]:
    """The LLVM IR of a module's kernels (text) and their entry points' names; NotServed for
    a module outside the translated subset."""
    from llvmlite import ir

    _init()
    if not kernels:
        raise NotServed("a module without kernels")
    tree = ast.parse(module_text)
    if any(
        isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id == "PARALLEL"
        and not (isinstance(n.value, ast.Constant) and n.value.value is False)
        for n in tree.body
    ):
        raise NotServed("parallel loops")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    llvm = _ready[0]
    module = ir.Module(name="gradtape_kernels")
    module.triple = llvm.get_process_triple()
    names = []
    large = [0]
    compiled: dict = {}  # the module functions the kernels call (translate.FunctionCalls)
    for kernel in kernels:
        node = functions.get(kernel.name)
        if node is None:
            raise NotServed(f"no function {kernel.name}")
        names.append(_EntryWriter(module, node, kernel, functions).write(large, compiled))
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
    builder run twice would call freed ones). The module pass manager is disposed of
    explicitly (`_dispose_pass_manager`): llvmlite never frees it, which kept about 120 KB
    per module compiled (its pipeline and what the run left in it).
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
        manager = pb.getModulePassManager()
        try:
            manager.run(mod, pb)
        finally:
            _dispose_pass_manager(llvm, manager)
        obj = tm.emit_object(mod)
        mod.close()
        context.close()
    return obj


def _dispose_pass_manager(llvm, manager) -> None:
    """Free a module pass manager. llvmlite's ModulePassManager inherits the no-op
    `_dispose` of its first base (ffi.ObjectRef) ahead of the one that frees it, so
    `close()` and the garbage collector leave the pipeline allocated; where that is so, the
    manager is freed through the function its own class would call."""
    if type(manager)._dispose is llvm.ffi.ObjectRef._dispose:
        llvm.ffi.lib.LLVMPY_DisposeNewModulePassManger(manager)
        manager.detach()
    else:
        manager.close()


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
