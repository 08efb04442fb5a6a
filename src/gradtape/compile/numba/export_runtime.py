"""The native entry points of exported handles (export.py), written directly as LLVM IR.

An entry point turns C arguments (a length, pointers, a data descriptor) into the kernels'
arguments, calls each already-compiled kernel by its symbol (Numba's calling convention, the
call Numba itself would emit; the JIT links the symbol to the kernel's machine code in this
process), hands the values one kernel returns to the next, writes the results and checks
them. Nothing is typed again: the kernels were compiled once (numba_cache.build_kernels, with the
disk cache), and the entry points are a few hundred LLVM instructions that LLVM compiles in
milliseconds; their object code refers to the kernels by name only, so it can be cached
(`EntryLibrary.serialize`, `load_entries`). Numba-compiled callers (`@njit` code) reach the
same C entry point through `call_c_entry`, an intrinsic typed once.

Importing this module imports Numba: only export.py imports it, lazily.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
from llvmlite import ir
from numba import from_dtype, types
from numba.core import cgutils
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import cpu_target
from numba.core.runtime import rtsys
from numba.extending import intrinsic

from ...core.errors import GradtapeError

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_I8P = ir.IntType(8).as_pointer()
_F64 = ir.DoubleType()
_F64P = _F64.as_pointer()

# the C signature every exported entry point has:
# int32_t f(int64_t n, const double *x, double *value, double *grad, void *data)
C_ENTRY_TYPE = ir.FunctionType(_I32, [_I64, _F64P, _F64P, _F64P, _I8P])
# nutpie's: int32_t logp(uint64_t n, const double *x, double *grad, double *logp, void *pair)
NUTPIE_LOGP_TYPE = C_ENTRY_TYPE
# and int32_t expand(uint64_t n, uint64_t m, const double *x, double *out, void *pair)
NUTPIE_EXPAND_TYPE = ir.FunctionType(_I32, [_I64, _I64, _F64P, _F64P, _I8P])


def _unique(prefix: str) -> str:
    """A symbol name no other library uses, in this process or in a cached object another
    process wrote (the JIT links them all)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def numba_type(dtype: np.dtype, ndim: int | None):
    """The Numba type of a kernel argument (C-contiguous arrays, as the kernels are compiled)."""
    scalar = from_dtype(np.dtype(dtype))
    return scalar if ndim is None else types.Array(scalar, ndim, "C")


class EntryLibrary:
    """A finalized library of entry points: `addresses` by entry name; it keeps the kernels
    alive. `serialize()` is its object code and symbol names, for the disk cache."""

    def __init__(self, library, names: dict[str, str], keep_alive: tuple):
        self._library = library
        self.names = names
        self._keep_alive = keep_alive
        self.addresses = {
            entry: library.get_pointer_to_function(symbol) for entry, symbol in names.items()
        }

    def serialize(self) -> tuple:
        """(symbol names, Numba's object-code serialization of the library)."""
        return dict(self.names), self._library.serialize_using_object_code()


def load_entries(serialized: tuple, keep_alive: tuple) -> EntryLibrary | None:
    """The entry points of a cached object (see EntryLibrary.serialize), linked to the
    kernels already in this process; None when an entry point is missing from it."""
    names, state = serialized
    codegen = cpu_target.target_context.codegen()
    with global_compiler_lock:
        library = codegen.unserialize_library(state)
        loaded = EntryLibrary(library, names, keep_alive)
    if not all(loaded.addresses.values()):
        return None
    return loaded


# --- the body shared by every entry point -------------------------------------------------------
class _Body:
    """Writes `inner(x, value, grad, data) -> i32` for one plan (see export._EntryPlan)."""

    def __init__(self, context, module, plan, kernels: dict):
        self.context = context
        self.module = module
        self.plan = plan
        self.kernels = kernels  # name -> (symbol, return type, argument types)
        self.name = _unique("gradtape_inner")
        self.function = ir.Function(
            module, ir.FunctionType(_I32, [_F64P, _F64P, _F64P, _I64.as_pointer()]), self.name
        )
        self.function.linkage = "internal"
        self.function.attributes.add("noinline")  # one body, optimized once
        self.builder = ir.IRBuilder(self.function.append_basic_block("entry"))
        self.owned: list[tuple] = []  # (Numba type, value) returned by kernels: decref'd on exit

    # helpers
    def _const(self, value: int, bits: int = 64):
        return ir.Constant(ir.IntType(bits), value)

    def _return(self, code) -> None:
        b = self.builder
        for ty, value in self.owned:
            self.context.nrt.decref(b, ty, value)
        b.ret(code if isinstance(code, ir.Value) else self._const(code, 32))

    def _return_if(self, condition, code) -> None:
        with self.builder.if_then(condition, likely=False):
            self._return(code)

    def _pointer_at(self, data, index: int, dtype):
        b = self.builder
        address = b.load(b.gep(data, [self._const(index)]))
        llty = self.context.get_data_type(from_dtype(np.dtype(dtype)))
        return b.inttoptr(address, llty.as_pointer())

    def _array(self, ty, pointer, shape: tuple):
        """A Numba array struct over `pointer` with the C layout of `shape`."""
        context, b = self.context, self.builder
        itemsize = context.get_abi_sizeof(context.get_data_type(ty.dtype))
        strides, step = [], itemsize
        for d in reversed(shape):
            strides.append(step)
            step *= d
        strides.reverse()
        ary = context.make_array(ty)(context, b)
        intp = context.get_value_type(types.intp)
        context.populate_array(
            ary,
            data=b.bitcast(pointer, context.get_data_type(ty.dtype).as_pointer()),
            shape=[intp(d) for d in shape],
            strides=[intp(s) for s in strides],
            itemsize=intp(itemsize),
            meminfo=None,
        )
        return ary._getvalue()

    def _copy_array(self, ty, value, destination) -> None:
        """Copy the float64 elements of array `value` (any layout) into `destination`, in C
        order."""
        context, b = self.context, self.builder
        ary = context.make_array(ty)(context, b, value)
        shape = cgutils.unpack_tuple(b, ary.shape, ty.ndim)
        strides = cgutils.unpack_tuple(b, ary.strides, ty.ndim)
        intp = context.get_value_type(types.intp)
        counter = cgutils.alloca_once_value(b, intp(0))
        with cgutils.loop_nest(b, shape, intp) as indices:
            source = cgutils.get_item_pointer2(
                context, b, ary.data, shape, strides, ty.layout, indices
            )
            element = context.cast(b, b.load(source), ty.dtype, types.float64)
            position = b.load(counter)
            b.store(element, b.gep(destination, [position]))
            b.store(b.add(position, intp(1)), counter)

    def _memcpy(self, destination, source, count: int) -> None:
        if count:
            cgutils.memcpy(self.builder, destination, source, self._const(count))

    def _not_finite(self, buffer, count: int):
        """An i1: some element of buffer[:count] is NaN or infinite."""
        b = self.builder
        if count == 0:
            return ir.Constant(ir.IntType(1), 0)
        found = cgutils.alloca_once_value(b, ir.Constant(ir.IntType(1), 0))
        fabs = self.module.declare_intrinsic("llvm.fabs", [_F64])
        infinity = ir.Constant(_F64, math.inf)
        with cgutils.for_range(b, self._const(count)) as loop:
            element = b.load(b.gep(buffer, [loop.index]))
            finite = b.fcmp_ordered("<", b.call(fabs, [element]), infinity)
            b.store(b.or_(b.load(found), b.not_(finite)), found)
        return b.load(found)

    # the body
    def write(self):
        """The body: the data descriptor checked, each kernel called, the results written
        and checked for NaN and infinity; returns the LLVM function."""
        x, value, grad, data = self.function.args
        buffers = [value, grad]
        self._check_data(data)
        values: dict[int, tuple] = {}  # var id -> (Numba type, LLVM value)
        for call in self.plan.calls:
            self._call_kernel(call, x, data, buffers, values)
        self._write_results(x, data, buffers, values)
        self._return_checked(buffers)
        return self.function

    def _check_data(self, data) -> None:
        """A NULL descriptor, or one whose tag is another plan's, returns STATUS_BAD_DATA
        (a plan without constants reads no data)."""
        from .handle_status import STATUS_BAD_DATA

        if not self.plan.consts:
            return
        b = self.builder
        self._return_if(cgutils.is_null(b, data), STATUS_BAD_DATA)
        tag = b.load(data)
        self._return_if(b.icmp_signed("!=", tag, self._const(self.plan.tag)), STATUS_BAD_DATA)

    def _kernel_arg(self, call, kind: str, ref, ty, x, data, buffers, values: dict):
        """One argument of a kernel call: x, a constant of the data, a result buffer, or a
        value an earlier kernel returned."""
        context, b, plan = self.context, self.builder, self.plan
        if kind == "x":
            if isinstance(ty, types.Array):
                return self._array(ty, x, plan.input_shape)
            return context.cast(b, b.load(x), types.float64, ty)
        if kind == "const":
            array = plan.consts[ref]
            pointer = self._pointer_at(data, ref + 1, array.dtype)
            if isinstance(ty, types.Array):
                return self._array(ty, pointer, array.shape)
            return b.load(pointer)
        if kind == "out":
            return self._array(ty, buffers[ref], plan.output_shapes[ref])
        vty, v = values[ref]  # a value an earlier kernel returned
        if vty == ty:
            return v
        if isinstance(ty, types.Array) or isinstance(vty, types.Array):
            raise GradtapeError(
                f"as_native: kernel {call.name} takes {ty} where the kernel "
                f"before it returns {vty}; this program cannot be exported (call "
                "the compiled function instead)"
            )
        return context.cast(b, v, vty, ty)

    def _call_kernel(self, call, x, data, buffers, values: dict) -> None:
        """Call one kernel by its symbol; an error raised in it returns STATUS_RAISED, a
        failed check STATUS_OTHER_PATH, a layout it refuses STATUS_LAYOUT. Its returned
        values are kept in `values` (arrays are released on return)."""
        from .handle_status import STATUS_LAYOUT, STATUS_OTHER_PATH, STATUS_RAISED
        from .status import STATUS_CHECK

        context, b = self.context, self.builder
        symbol, restype, argtypes = self.kernels[call.name]
        args = [
            self._kernel_arg(call, kind, ref, ty, x, data, buffers, values)
            for (kind, ref), ty in zip(call.args, argtypes)
        ]
        fnty = context.call_conv.get_function_type(restype, argtypes)
        # the compiled kernel, by its symbol: the JIT links it to the kernel's machine code
        # (loaded or compiled) in this process, so this code can be cached
        callee = self.module.globals.get(symbol) or ir.Function(self.module, fnty, symbol)
        status, result = context.call_conv.call_function(b, callee, restype, argtypes, args)
        self._return_if(status.is_error, STATUS_RAISED)
        members = list(restype)
        kernel_status = b.extract_value(result, 0)
        for pos, var_id in call.returns:
            mty = members[pos]
            member = b.extract_value(result, pos)
            values[var_id] = (mty, member)
            if isinstance(mty, types.Array):
                self.owned.append((mty, member))
        failed = b.icmp_signed("!=", kernel_status, ir.Constant(kernel_status.type, 0))
        with b.if_then(failed, likely=False):
            other_path = b.icmp_signed(
                "==", kernel_status, ir.Constant(kernel_status.type, STATUS_CHECK)
            )
            self._return(
                b.select(
                    other_path,
                    self._const(STATUS_OTHER_PATH, 32),
                    self._const(STATUS_LAYOUT, 32),
                )
            )

    def _write_results(self, x, data, buffers, values: dict) -> None:
        """Each result not written in place by a kernel: copied from another result, x, a
        constant or a value a kernel returned."""
        context, b, plan = self.context, self.builder, self.plan
        for k, (kind, ref) in enumerate(plan.outputs):
            buffer, size = buffers[k], plan.output_sizes[k]
            if kind == "written":
                continue
            if kind == "same":
                self._memcpy(b.bitcast(buffer, _I8P), b.bitcast(buffers[ref], _I8P), 8 * size)
            elif kind == "input":
                self._memcpy(b.bitcast(buffer, _I8P), b.bitcast(x, _I8P), 8 * size)
            elif kind == "const":
                source = self._pointer_at(data, ref + 1, np.float64)
                self._memcpy(b.bitcast(buffer, _I8P), b.bitcast(source, _I8P), 8 * size)
            else:
                vty, v = values[ref]
                if isinstance(vty, types.Array):
                    self._copy_array(vty, v, buffer)
                else:
                    b.store(context.cast(b, v, vty, types.float64), buffer)

    def _return_checked(self, buffers) -> None:
        """Return STATUS_NONFINITE when a result holds NaN or infinity, else STATUS_OK."""
        from .handle_status import STATUS_NONFINITE, STATUS_OK

        b = self.builder
        bad = ir.Constant(ir.IntType(1), 0)
        for k, size in enumerate(self.plan.output_sizes):
            bad = b.or_(bad, self._not_finite(buffers[k], size))
        self._return(b.select(bad, self._const(STATUS_NONFINITE, 32), self._const(STATUS_OK, 32)))


def _define(module, fnty, prefix: str):
    function = ir.Function(module, fnty, _unique(prefix))
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    return function, builder


def _check_or_return(builder, condition, code: int) -> None:
    with builder.if_then(condition, likely=False):
        builder.ret(ir.Constant(_I32, code))


def build_entries(plan, kernels: dict, keep_alive: tuple) -> EntryLibrary:
    """Compile the entry points of `plan` (export._EntryPlan) calling `kernels` (name ->
    (symbol, return type, argument types), each compiled in this process): "c_entry",
    "nutpie_logp", "nutpie_expand" (a function of one result) and "nutpie_copy"."""
    from .handle_status import STATUS_BAD_DATA, STATUS_WRONG_SIZE

    context = cpu_target.target_context.subtarget(enable_nrt=True)
    codegen = context.codegen()
    library = codegen.create_library(_unique("gradtape_entries"))
    library.enable_object_caching()  # (its object code is what the disk cache keeps)
    module = library.create_ir_module("gradtape_entries")
    body = _Body(context, module, plan, kernels)
    inner = body.write()
    names = {}

    def data_words(builder, pointer):
        return builder.bitcast(pointer, _I64.as_pointer())

    # c_entry(n, x, value, grad, data)
    function, b = _define(module, C_ENTRY_TYPE, "gradtape_c_entry")
    n, x, value, grad, data = function.args
    _check_or_return(b, b.icmp_signed("!=", n, ir.Constant(_I64, plan.n)), STATUS_WRONG_SIZE)
    b.ret(b.call(inner, [x, value, grad, data_words(b, data)]))
    names["c_entry"] = function.name

    # nutpie_logp(dim, x, grad, logp, pair): data = pair[0]
    function, b = _define(module, NUTPIE_LOGP_TYPE, "gradtape_nutpie_logp")
    n, x, grad, value, pair = function.args
    _check_or_return(b, b.icmp_unsigned("!=", n, ir.Constant(_I64, plan.n)), STATUS_WRONG_SIZE)
    _check_or_return(b, cgutils.is_null(b, pair), STATUS_BAD_DATA)
    words = data_words(b, pair)
    data = b.inttoptr(b.load(words), _I64.as_pointer())
    b.ret(b.call(inner, [x, value, grad, data]))
    names["nutpie_logp"] = function.name

    if len(plan.output_sizes) == 1:
        # nutpie_expand(dim, expanded, x, out, pair): the value into out, data = pair[1]
        function, b = _define(module, NUTPIE_EXPAND_TYPE, "gradtape_nutpie_expand")
        n, m, x, out, pair = function.args
        wrong = b.or_(
            b.icmp_unsigned("!=", n, ir.Constant(_I64, plan.n)),
            b.icmp_unsigned("!=", m, ir.Constant(_I64, plan.output_sizes[0])),
        )
        _check_or_return(b, wrong, STATUS_WRONG_SIZE)
        _check_or_return(b, cgutils.is_null(b, pair), STATUS_BAD_DATA)
        words = data_words(b, pair)
        data = b.inttoptr(b.load(b.gep(words, [ir.Constant(_I64, 1)])), _I64.as_pointer())
        b.ret(b.call(inner, [x, out, ir.Constant(_F64P, None), data]))
        names["nutpie_expand"] = function.name

    # nutpie_copy(dim, expanded, x, out, pair): out = x
    function, b = _define(module, NUTPIE_EXPAND_TYPE, "gradtape_nutpie_copy")
    n, m, x, out, _pair = function.args
    wrong = b.or_(
        b.icmp_unsigned("!=", n, ir.Constant(_I64, plan.n)),
        b.icmp_unsigned("!=", m, ir.Constant(_I64, plan.n)),
    )
    _check_or_return(b, wrong, STATUS_WRONG_SIZE)
    cgutils.memcpy(b, b.bitcast(out, _I8P), b.bitcast(x, _I8P), ir.Constant(_I64, 8 * plan.n))
    b.ret(ir.Constant(_I32, 0))
    names["nutpie_copy"] = function.name

    with global_compiler_lock:
        library.add_ir_module(module)
        if body.owned:  # NRT_decref of the arrays kernels return
            library.add_linking_library(rtsys.library)
        library.finalize()
    return EntryLibrary(library, names, keep_alive)


# --- calling the C entry point from Numba-compiled code -----------------------------------------
@intrinsic
def call_c_entry(typingctx, address, x, value, grad, data):
    """`status = call_c_entry(address, x, value, grad, data)`: call the C entry point at
    `address` with the arrays' data pointers and x's length (the caller checks sizes and
    layouts)."""
    arrays = (x, value, grad)
    if not (
        isinstance(address, types.Integer)
        and all(isinstance(a, types.Array) and a.dtype == types.float64 for a in arrays)
        and isinstance(data, types.Array)
        and data.dtype == types.int64
    ):
        return None

    def codegen(context, builder, signature, args):
        pointers = [
            context.make_array(ty)(context, builder, v)
            for ty, v in zip(signature.args[1:], args[1:])
        ]
        n = pointers[0].nitems
        function = builder.inttoptr(args[0], C_ENTRY_TYPE.as_pointer())
        return builder.call(
            function,
            [
                n,
                builder.bitcast(pointers[0].data, _F64P),
                builder.bitcast(pointers[1].data, _F64P),
                builder.bitcast(pointers[2].data, _F64P),
                builder.bitcast(pointers[3].data, _I8P),
            ],
        )

    return types.int32(address, x, value, grad, data), codegen


def numba_entry(address: int, n: int, value_size: int, grad_size: int):
    """The Numba function `status = f(x, value, grad, data)` of one handle: it checks sizes
    and layouts (statuses -1 and -4) and calls the C entry point at `address`."""
    from numba import njit

    def core(x, value, grad, data):
        if x.size != n or value.size != value_size or grad.size != grad_size:
            return np.int32(-1)
        if not (
            x.flags.c_contiguous
            and value.flags.c_contiguous
            and grad.flags.c_contiguous
            and data.flags.c_contiguous
        ):
            return np.int32(-4)
        return call_c_entry(address, x, value, grad, data)

    return njit(error_model="numpy", nogil=True, boundscheck=False)(core)


# --- nutpie's expand function of elementwise constraints -----------------------------------------
def build_elementwise_expand(n: int, segments: list[tuple]) -> EntryLibrary:
    """nutpie's `expand(n, m, x, out, pair)` for a vector of `n` values whose constraints act
    element by element: each segment (kind, start, size, lower, width) maps x[start:start +
    size] onto out[start:start + size] by "copy", "exp" (positive) or "interval" (lower +
    width * expit(x), the logistic function computed without overflow). No kernel, no data."""
    from .handle_status import STATUS_WRONG_SIZE

    context = cpu_target.target_context
    library = context.codegen().create_library(_unique("gradtape_expand"))
    module = library.create_ir_module("gradtape_expand")
    function, b = _define(module, NUTPIE_EXPAND_TYPE, "gradtape_nutpie_expand")
    dim, m, x, out, _pair = function.args
    wrong = b.or_(
        b.icmp_unsigned("!=", dim, ir.Constant(_I64, n)),
        b.icmp_unsigned("!=", m, ir.Constant(_I64, n)),
    )
    _check_or_return(b, wrong, STATUS_WRONG_SIZE)
    exp = module.declare_intrinsic("llvm.exp", [_F64])
    one = ir.Constant(_F64, 1.0)
    for kind, start, size, lower, width in segments:
        begin = ir.Constant(_I64, start)
        if kind == "copy":
            source = b.bitcast(b.gep(x, [begin]), _I8P)
            target = b.bitcast(b.gep(out, [begin]), _I8P)
            cgutils.memcpy(b, target, source, ir.Constant(_I64, 8 * size))
            continue
        with cgutils.for_range(b, ir.Constant(_I64, size)) as loop:
            i = b.add(begin, loop.index)
            u = b.load(b.gep(x, [i]))
            if kind == "exp":
                y = b.call(exp, [u])
            else:  # expit(u): 1 / (1 + exp(-u)) for u >= 0, exp(u) / (1 + exp(u)) below
                e = b.call(
                    exp, [b.fneg(b.call(module.declare_intrinsic("llvm.fabs", [_F64]), [u]))]
                )
                positive = b.fcmp_ordered(">=", u, ir.Constant(_F64, 0.0))
                numerator = b.select(positive, one, e)
                p = b.fdiv(numerator, b.fadd(one, e))
                y = b.fadd(ir.Constant(_F64, lower), b.fmul(ir.Constant(_F64, width), p))
            b.store(y, b.gep(out, [i]))
    b.ret(ir.Constant(_I32, 0))
    with global_compiler_lock:
        library.add_ir_module(module)
        library.finalize()
    return EntryLibrary(library, {"nutpie_expand": function.name}, ())
