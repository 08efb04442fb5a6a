"""The numba backend's kernel source, translated to LLVM IR for the subset it is written in.

A kernel of the numba backend is plain Python that Numba compiles (kernel.py writes it): loops
over `range`, loads and stores of C-contiguous arrays, float arithmetic, the scalar functions
of `math` and NumPy, and the helpers of runtime.py and fastmath.py. `Translator` reads that
text (its `ast`) and emits the same operations with Numba's typing and semantics:

* types: float64, float32, int64 (and int32 inside fastmath's bit manipulation) and booleans;
  a Python int is an int64 and a Python float a float64; float32 with float32 stays float32,
  any other mix with a float is float64, integers mix to int64 (as Numba types them);
* arithmetic is IEEE with no fast-math flag, except the flags Numba's code carries:
  `reduce_add`/`reduce_mul` (runtime.py) are an fadd/fmul with `reassoc nsz contract`, and
  fastmath.py's kernels are compiled with `contract` (each is a function of its own, always
  inlined, as in Numba, so its flags stay its own);
* `math.sin`, `np.cos`, ... are the calls Numba makes (LLVM intrinsics or libm's functions by
  name), `np.maximum`/`np.minimum` Numba's NaN-propagating selects, `abs` llvm.fabs;
* the helpers of runtime.py (`nan_safe_product`, `max_step`, ...) and fastmath.py (`fast_exp`,
  ...) are translated from their own source text, read from the files (neither module is
  imported: both import Numba).

Anything outside the subset raises `NotServed` with the construct: that module is compiled by
Numba, as before. So the subset can only be too small, never silently different.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from llvmlite import ir

__all__ = ["NotServed", "Translator", "ArrayArg", "F64", "F32", "I64", "I32", "BOOL"]

_NUMBA_DIR = Path(__file__).resolve().parent.parent / "numba"


class NotServed(Exception):
    """A construct the translator does not serve: the module goes to Numba."""


# --- types -----------------------------------------------------------------------------------
F64, F32, I64, I32, BOOL = "f64", "f32", "i64", "i32", "bool"
LL = {
    F64: ir.DoubleType(),
    F32: ir.FloatType(),
    I64: ir.IntType(64),
    I32: ir.IntType(32),
    BOOL: ir.IntType(1),
}
STORE = {F64: ir.DoubleType(), F32: ir.FloatType(), I64: ir.IntType(64), BOOL: ir.IntType(8)}
ITEMSIZE = {F64: 8, F32: 4, I64: 8, BOOL: 1}
DTYPE_TYPE = {
    np.dtype(np.float64): F64,
    np.dtype(np.float32): F32,
    np.dtype(np.int64): I64,
    np.dtype(np.bool_): BOOL,
}
NP_NAMES = {"float64": F64, "float32": F32, "int64": I64, "bool_": BOOL}
REDUCTION_FLAGS = ("reassoc", "nsz", "contract")
FAST_FLAGS = ("contract",)


def is_float(t: str) -> bool:
    return t in (F64, F32)


def unify(a: str, b: str) -> str:
    """The type of a binary operation's operands (Numba's NumPy-like promotion)."""
    if a == b:
        return a
    if is_float(a) or is_float(b):
        return F32 if a == F32 and b == F32 else F64
    return I64


@dataclass
class Val:
    """A scalar value: its LLVM value and type."""

    v: ir.Value
    t: str


@dataclass
class ArrayArg:
    """An array: its data pointer, its dims (LLVM i64 values), its type, its flags."""

    data: ir.Value
    dims: list
    t: str
    flags: ir.Value | None = None  # NumPy's flags word (arguments); None for buffers
    written: bool = False


@dataclass
class Func:
    """A Python function to translate: its AST and the values its free names have."""

    node: ast.FunctionDef
    names: dict = field(default_factory=dict)


# --- the helpers' source -----------------------------------------------------------------------
class _Marker:
    def __init__(self, name: str):
        self.name = name


def _parse(name: str) -> ast.Module:
    return ast.parse((_NUMBA_DIR / name).read_text(encoding="utf-8"))


def _functions(module: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}


_RUNTIME: dict[str, Func] | None = None
_FAST: dict[int, dict[str, Func]] | None = None


def runtime_helpers() -> dict[str, Func]:
    """runtime.py's inline helpers (module-level functions), by name."""
    global _RUNTIME
    if _RUNTIME is None:
        module = _parse("runtime.py")
        consts: dict[str, Any] = {"math": math, "np": np}
        for node in module.body:  # module constants such as _SQRT1_2
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                try:
                    consts[node.targets[0].id] = eval(  # noqa: S307  (gradtape's own file)
                        compile(ast.Expression(node.value), "runtime.py", "eval"), dict(consts)
                    )
                except Exception:
                    pass
        funcs = _functions(module)
        _RUNTIME = {name: Func(f, consts) for name, f in funcs.items()}
        for f in _RUNTIME.values():
            f.names.update({n: ("runtime", n) for n in funcs})
    return _RUNTIME


def fast_kernels() -> dict[int, dict[str, Func]]:
    """fastmath.py's kernels per float width (64, 32): each kernel's AST and the constants and
    helpers it closes over, from `_make_kernels` run without Numba (its decorators are
    identities, its intrinsics markers the translator knows)."""
    global _FAST
    if _FAST is not None:
        return _FAST
    module = _parse("fastmath.py")
    keep = {"_hex", "_Format", "_int_bits", "_make_kernels", "TANH_POLYNOMIAL_BELOW", "_FORMATS"}
    body = []
    for node in module.body:
        name = getattr(node, "name", None)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        if name in keep:
            if isinstance(node, ast.FunctionDef):
                node.decorator_list = []
            body.append(node)
    namespace: dict[str, Any] = {
        "__name__": "gradtape_fastmath_source",
        "math": math,
        "np": np,
        "NamedTuple": __import__("typing").NamedTuple,
        "Callable": object,
        "Any": object,
        "annotations": None,
        "njit": lambda *a, **k: lambda f: f,
        "KERNEL_OPTIONS": {},
        "_bits": _Marker("_bits"),
        "_fma": _Marker("_fma"),
        "_from_bits": _Marker("_from_bits"),
    }
    code = compile(ast.Module(body=body, type_ignores=[]), "fastmath.py", "exec")
    exec(code, namespace)  # noqa: S102  (gradtape's own file, without its Numba parts)
    make = next(n for n in module.body if getattr(n, "name", None) == "_make_kernels")
    inner = {n.name: n for n in ast.walk(make) if isinstance(n, ast.FunctionDef)}
    _FAST = {}
    for bits, fmt in namespace["_FORMATS"].items():
        kernels = namespace["_make_kernels"](fmt)
        table: dict[str, Func] = {}

        def closure(fn) -> dict:
            cells = fn.__closure__ or ()
            return {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, cells)}

        seen: dict[int, Func] = {}

        def func_of(fn) -> Func:
            if id(fn) in seen:
                return seen[id(fn)]
            f = seen[id(fn)] = Func(inner[fn.__name__], {})
            for name, value in closure(fn).items():
                f.names[name] = (
                    func_of(value) if callable(value) and hasattr(value, "__code__") else value
                )
            f.names.update({"math": math, "np": np, "abs": abs})
            for name in ("_bits", "_fma", "_from_bits"):
                f.names[name] = namespace[name]
            return f

        for name, fn in kernels.items():
            table[name] = func_of(fn)
        _FAST[bits] = table
    return _FAST


# --- the translator -----------------------------------------------------------------------------
_LIBM_INTRINSIC = {"sin": "llvm.sin", "cos": "llvm.cos", "sqrt": "llvm.sqrt"}
_LIBM_EXTERN = {"tan": "tan", "erf": "erf", "erfc": "erfc"}
_FAST_NAMES = {
    "fast_exp": "exp",
    "fast_expm1": "expm1",
    "fast_log": "log",
    "fast_log1p": "log1p",
    "fast_tanh": "tanh",
    "fast_expit": "expit",
    "fast_log_expit": "log_expit",
    "fast_logaddexp": "logaddexp",
}


# Compile time. LLVM's vectorizers (loop and SLP) take time superlinear in a loop body's size:
# a fused loop of 133 fast exps (k = 100 operations) took 0.5 s in each, 1000 operations 66 s,
# against 1.6 s without them. A loop whose body costs more than LARGE_LOOP_COST (statements; a
# fast function FAST_COST) is therefore not vectorized, and a module holding one is compiled
# without the SLP vectorizer: its compile time stays linear in its length, while the loops of
# ordinary programs (tens of statements) are vectorized as Numba vectorizes them. A loop
# calling libm more than MAX_VECTOR_LIBM_CALLS times is not vectorized either: LLVM would call
# the scalar function once per lane anyway, and the shuffles around the calls cost compile time.
LARGE_LOOP_COST = 640
FAST_COST = 24
MAX_VECTOR_LIBM_CALLS = 8
_MARKER = "gradtape.loop.novector."
_VECTORIZE_OFF = '!{!"llvm.loop.vectorize.enable", i1 false}'


def finish_ir(text: str) -> str:
    """The module's IR text with each loop marker made a distinct self-referencing loop ID
    that turns the loop vectorizer off."""
    lines = text.splitlines()
    out = []
    extra = []
    for line in lines:
        if _MARKER in line and line.startswith("!") and " = !{" in line:
            name = line.split(" = ", 1)[0].strip()
            off = f"!{900000 + int(name[1:])}"
            out.append(f"{name} = distinct !{{{name}, {off}}}")
            extra.append(f"{off} = {_VECTORIZE_OFF}")
            continue
        out.append(line)
    return "\n".join(out + extra) + "\n"


class Scope:
    """The variables of one function body being translated (allocas by name)."""

    def __init__(self, names: dict, flags: tuple):
        self.vars: dict[str, tuple[ir.AllocaInstr, str]] = {}
        self.values: dict[str, Any] = {}  # tuples and arrays (not held in allocas)
        self.names = names  # free names: constants, helpers
        self.flags = flags
        self.ret: list | None = None  # inlined helper: where its return value goes


class Translator:
    """Emits one kernel's body into an LLVM function (see the module docstring).

    `arrays` maps the kernel's array argument names to ArrayArg, `scalars` its scalar
    arguments to Val. `on_return(values, builder)` is called for each `return` of the
    kernel (a list of Val), after the buffers are freed; it terminates the block.
    """

    def __init__(self, module: ir.Module, builder: ir.IRBuilder, entry_builder: ir.IRBuilder):
        self.module = module
        self.b = builder
        self.entry = entry_builder  # allocas go at the function's start
        self.buffers: list[ir.Value] = []
        self.on_return = None
        self.wide_vectors = False
        self._fast_functions: dict[tuple, ir.Function] = {}
        self.depth = 0  # loops and branches around the statement being translated
        self.cost = 0  # statements translated (a fast function counts FAST_COST)
        self.libm_calls = 0  # calls of libm that LLVM cannot vectorize
        self.large_loops = 0
        self.markers = 0

    # --- module-level declarations ---
    def declare(self, name: str, ret: ir.Type, args: list) -> ir.Function:
        f = self.module.globals.get(name)
        if f is None:
            f = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
        return f

    def intrinsic(self, name: str, t: str, nargs: int) -> ir.Function:
        suffix = "f64" if t == F64 else "f32"
        return self.declare(f"{name}.{suffix}", LL[t], [LL[t]] * nargs)

    # --- conversions ---
    def convert(self, x: Val, t: str) -> Val:
        b = self.b
        if x.t == t:
            return x
        if t == BOOL:
            if is_float(x.t):
                return Val(b.fcmp_unordered("!=", x.v, ir.Constant(LL[x.t], 0.0)), BOOL)
            return Val(b.icmp_signed("!=", x.v, ir.Constant(LL[x.t], 0)), BOOL)
        if is_float(t):
            if is_float(x.t):
                op = b.fpext if t == F64 else b.fptrunc
                return Val(op(x.v, LL[t]), t)
            if x.t == BOOL:
                return Val(b.uitofp(x.v, LL[t]), t)
            return Val(b.sitofp(x.v, LL[t]), t)
        if is_float(x.t):
            return Val(b.fptosi(x.v, LL[t]), t)
        if x.t == BOOL:
            return Val(b.zext(x.v, LL[t]), t)
        width = {I64: 64, I32: 32}
        if width[x.t] < width[t]:
            return Val(b.sext(x.v, LL[t]), t)
        return Val(b.trunc(x.v, LL[t]), t)

    def const(self, value) -> Val:
        if isinstance(value, (bool, np.bool_)):
            return Val(ir.Constant(LL[BOOL], int(bool(value))), BOOL)
        if isinstance(value, np.float32):
            return Val(ir.Constant(LL[F32], float(value)), F32)
        if isinstance(value, (float, np.float64)):
            return Val(ir.Constant(LL[F64], float(value)), F64)
        if isinstance(value, (int, np.integer)) and not isinstance(value, np.unsignedinteger):
            if not -(2**63) <= int(value) < 2**63:
                raise NotServed(f"integer constant {value}")
            return Val(ir.Constant(LL[I64], int(value)), I64)
        raise NotServed(f"constant {value!r}")

    # --- functions ---
    def body(self, stmts: list, scope: Scope, nested: bool = True) -> None:
        self.depth += nested
        try:
            self._body(stmts, scope)
        finally:
            self.depth -= nested

    def _body(self, stmts: list, scope: Scope) -> None:
        for stmt in stmts:
            self.cost += 1
            if self.b.block.is_terminated:
                return  # code after a return
            self.stmt(stmt, scope)

    def stmt(self, s: ast.stmt, scope: Scope) -> None:
        b = self.b
        if isinstance(s, ast.Expr):
            if (
                isinstance(s.value, ast.Call)
                and isinstance(s.value.func, ast.Name)
                and s.value.func.id == "prefer_wide_vectors"
            ):
                self.wide_vectors = True
                return
            if isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
                return  # a docstring
            raise NotServed("an expression statement")
        if isinstance(s, ast.Assign):
            if len(s.targets) != 1:
                raise NotServed("chained assignment")
            self.assign(s.targets[0], s.value, scope)
            return
        if isinstance(s, ast.AugAssign):
            if not isinstance(s.target, (ast.Name, ast.Subscript)):
                raise NotServed("augmented assignment")
            load = ast.copy_location(ast.BinOp(left=_as_load(s.target), op=s.op, right=s.value), s)
            self.assign(s.target, load, scope)
            return
        if isinstance(s, ast.If):
            cond = self.convert(self.expr(s.test, scope), BOOL).v
            if s.orelse:
                with b.if_else(cond) as (then, otherwise):
                    with then:
                        self.body(s.body, scope)
                    with otherwise:
                        self.body(s.orelse, scope)
            else:
                with b.if_then(cond):
                    self.body(s.body, scope)
            return
        if isinstance(s, ast.For):
            self.for_range(s, scope)
            return
        if isinstance(s, ast.Return):
            self.ret(s, scope)
            return
        if isinstance(s, ast.Pass):
            return
        raise NotServed(f"statement {type(s).__name__}")

    def assign(self, target: ast.expr, value: ast.expr, scope: Scope) -> None:
        if isinstance(target, ast.Tuple):
            got = self.expr(value, scope, allow_tuple=True)
            if not isinstance(got, tuple) or len(got) != len(target.elts):
                raise NotServed("tuple unpacking of a non-tuple")
            for t, v in zip(target.elts, got):
                self.bind(t, v, scope)
            return
        if isinstance(target, ast.Subscript):
            array, index = self.element(target, scope)
            array.written = True
            v = self.convert(self.expr(value, scope), array.t if array.t != BOOL else BOOL)
            store = v.v if array.t != BOOL else self.b.zext(v.v, STORE[BOOL])
            self.b.store(store, index)
            return
        if isinstance(value, ast.Call) and _dotted(value.func) in ("np.empty", "np.full"):
            self.bind(target, self.empty(value, scope), scope)
            return
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr == "reshape"
        ):
            self.bind(target, self.reshape(value, scope), scope)
            return
        self.bind(target, self.expr(value, scope, allow_tuple=True), scope)

    def bind(self, target: ast.expr, v, scope: Scope) -> None:
        if not isinstance(target, ast.Name):
            raise NotServed("assignment target")
        name = target.id
        if isinstance(v, (tuple, ArrayArg)):
            if name in scope.vars:
                raise NotServed(f"{name} rebound to another kind")
            scope.values[name] = v
            return
        if name in scope.values:
            raise NotServed(f"{name} rebound to another kind")
        slot = scope.vars.get(name)
        if slot is None:
            slot = (self.entry.alloca(LL[v.t], name=name), v.t)
            scope.vars[name] = slot
        elif slot[1] != v.t:
            if not self.rebind_ok(slot[1], v.t):
                raise NotServed(f"{name} changes type ({slot[1]} to {v.t})")
            v = self.convert(v, slot[1])
        self.b.store(v.v, slot[0])

    @staticmethod
    def rebind_ok(old: str, new: str) -> bool:
        return unify(old, new) == old

    def empty(self, call: ast.Call, scope: Scope) -> ArrayArg:
        """np.empty(shape, dtype) or np.full(shape, value[, dtype]): a buffer of this call
        (malloc; freed at every return of the kernel)."""
        full = _dotted(call.func) == "np.full"
        if (
            len(call.args) != (2 if not full else len(call.args))
            or not 2 <= len(call.args) <= 3
            or not isinstance(call.args[0], ast.Tuple)
            or scope.ret is not None
        ):
            raise NotServed("np.empty or np.full form")
        if full:
            fill = self.expr(call.args[1], scope)
            t = self.np_type(call.args[2]) if len(call.args) == 3 else fill.t
            if t not in ITEMSIZE:
                raise NotServed("np.full of this type")
        else:
            t = self.np_type(call.args[1])
        if self.depth:
            raise NotServed("np.empty inside a loop or branch")
        dims = [self.convert(self.expr(d, scope), I64).v for d in call.args[0].elts]
        size = ir.Constant(LL[I64], ITEMSIZE[t])
        for d in dims:
            size = self.b.mul(size, d)
        malloc = self.declare("malloc", ir.IntType(8).as_pointer(), [LL[I64]])
        raw = self.b.call(malloc, [size])
        self.buffers.append(raw)
        array = ArrayArg(self.b.bitcast(raw, STORE[t].as_pointer()), dims, t)
        if full:
            self.fill(array, self.convert(fill, t), size)
        return array

    def fill(self, array: ArrayArg, value: Val, nbytes: ir.Value) -> None:
        b = self.b
        count = b.udiv(nbytes, ir.Constant(LL[I64], ITEMSIZE[array.t]))
        counter = self.entry.alloca(LL[I64], name="fill.n")
        b.store(ir.Constant(LL[I64], 0), counter)
        head = b.append_basic_block("fill")
        loop = b.append_basic_block("fill.body")
        after = b.append_basic_block("fill.end")
        b.branch(head)
        b.position_at_end(head)
        i = b.load(counter)
        b.cbranch(b.icmp_signed("<", i, count), loop, after)
        b.position_at_end(loop)
        v = value.v if array.t != BOOL else b.zext(value.v, STORE[BOOL])
        b.store(v, b.gep(array.data, [i], inbounds=True))
        b.store(b.add(i, ir.Constant(LL[I64], 1), flags=("nsw",)), counter)
        b.branch(head)
        b.position_at_end(after)

    def reshape(self, call: ast.Call, scope: Scope) -> ArrayArg:
        """a.reshape(shape) of a C-contiguous array: the same data, other dims."""
        array = self.array(call.func.value, scope)
        if len(call.args) != 1 or call.keywords:
            raise NotServed("reshape form")
        shape = call.args[0]
        parts = shape.elts if isinstance(shape, ast.Tuple) else [shape]  # (a.reshape(n))
        dims = [self.convert(self.expr(d, scope), I64).v for d in parts]
        return ArrayArg(array.data, dims, array.t, array.flags)

    def np_type(self, node: ast.expr) -> str:
        name = _dotted(node)
        if name and name.startswith("np.") and name[3:] in NP_NAMES:
            return NP_NAMES[name[3:]]
        raise NotServed(f"dtype {ast.unparse(node)}")

    def for_range(self, s: ast.For, scope: Scope) -> None:
        b = self.b
        call = s.iter
        if (
            s.orelse
            or not isinstance(s.target, ast.Name)
            or not isinstance(call, ast.Call)
            or not isinstance(call.func, ast.Name)
            or call.func.id != "range"
            or not 1 <= len(call.args) <= 2
        ):
            if isinstance(call, (ast.Subscript, ast.Name, ast.Tuple)):
                return self.for_tuple(s, scope)
            raise NotServed("a loop other than range(n) or range(a, b)")
        bounds = [self.convert(self.expr(a, scope), I64).v for a in call.args]
        start, stop = (ir.Constant(LL[I64], 0), bounds[0]) if len(bounds) == 1 else bounds
        name = s.target.id
        if name in scope.values:
            raise NotServed("loop variable rebinds a value")
        slot = scope.vars.get(name)
        if slot is None or slot[1] != I64:
            if slot is not None:
                raise NotServed("loop variable changes type")
            slot = scope.vars[name] = (self.entry.alloca(LL[I64], name=name), I64)
        counter = self.entry.alloca(LL[I64], name=f"{name}.n")
        b.store(start, counter)
        head = b.append_basic_block(f"for.{name}")
        loop = b.append_basic_block(f"body.{name}")
        after = b.append_basic_block(f"end.{name}")
        b.branch(head)
        b.position_at_end(head)
        i = b.load(counter)
        b.cbranch(b.icmp_signed("<", i, stop), loop, after)
        b.position_at_end(loop)
        b.store(i, slot[0])
        b.store(b.add(i, ir.Constant(LL[I64], 1), flags=("nsw",)), counter)
        cost_before, calls_before = self.cost, self.libm_calls
        self.body(s.body, scope)
        if not b.block.is_terminated:
            latch = b.branch(head)
            cost, calls = self.cost - cost_before, self.libm_calls - calls_before
            if cost > LARGE_LOOP_COST or calls > MAX_VECTOR_LIBM_CALLS:
                # not vectorized (see LARGE_LOOP_COST); nor is the module's straight code
                latch.set_metadata("llvm.loop", self.loop_marker())
                self.large_loops += 1
        b.position_at_end(after)

    def loop_marker(self) -> ir.MDValue:
        """Metadata of a loop not to vectorize; made a distinct, self-referencing loop ID by
        `finish_ir` (llvmlite cannot write one)."""
        self.markers += 1
        return self.module.add_metadata(
            [ir.MetaDataString(self.module, f"{_MARKER}{self.markers}")]
        )

    def for_tuple(self, s: ast.For, scope: Scope) -> None:
        """`for c in constants[1:]`: unrolled (fastmath's polynomials)."""
        items = self.py_value(s.iter, scope)
        if not isinstance(items, tuple) or s.orelse or not isinstance(s.target, ast.Name):
            raise NotServed("a loop over something other than a range or a constant tuple")
        for item in items:
            scope.names = dict(scope.names, **{s.target.id: item})
            self.body(s.body, scope)

    def ret(self, s: ast.Return, scope: Scope) -> None:
        value = self.expr(s.value, scope, allow_tuple=True) if s.value is not None else None
        if scope.ret is not None:  # an inlined helper
            scope.ret.append((value, self.b.block))
            self.b.branch(scope.ret_block)
            return
        if not isinstance(value, tuple) or not all(isinstance(v, Val) for v in value):
            raise NotServed("a kernel returning other than a tuple of scalars")
        free = self.declare("free", ir.VoidType(), [ir.IntType(8).as_pointer()])
        for raw in self.buffers:
            self.b.call(free, [raw])
        self.on_return(list(value), self.b)

    # --- expressions ---
    def py_value(self, node: ast.expr, scope: Scope):
        """A compile-time Python value (a constant or a slice of a constant tuple)."""
        if isinstance(node, ast.Name):
            if node.id in scope.names:
                return scope.names[node.id]
            raise NotServed(f"name {node.id}")
        if isinstance(node, ast.Subscript):
            base = self.py_value(node.value, scope)
            if isinstance(node.slice, ast.Slice) and isinstance(base, tuple):
                lo = node.slice.lower
                hi = node.slice.upper
                lo = None if lo is None else self.py_value(lo, scope)
                hi = None if hi is None else self.py_value(hi, scope)
                return base[lo:hi]
            if isinstance(base, tuple):
                return base[self.py_value(node.slice, scope)]
        if isinstance(node, ast.Constant):
            return node.value
        raise NotServed(f"compile-time value {ast.unparse(node)}")

    def expr(self, e: ast.expr, scope: Scope, allow_tuple: bool = False):
        b = self.b
        if isinstance(e, ast.Constant):
            return self.const(e.value)
        if isinstance(e, ast.Name):
            if e.id in scope.vars:
                slot, t = scope.vars[e.id]
                return Val(b.load(slot), t)
            if e.id in scope.values:
                got = scope.values[e.id]
                if isinstance(got, tuple) and not allow_tuple:
                    raise NotServed("a tuple used as a value")
                return got
            if e.id in scope.names:
                value = scope.names[e.id]
                if isinstance(value, tuple):
                    if allow_tuple:
                        return tuple(self.const(x) for x in value)
                    raise NotServed("a constant tuple used as a value")
                return self.const(value)
            raise NotServed(f"name {e.id}")
        if isinstance(e, ast.Tuple):
            if not allow_tuple:
                raise NotServed("a tuple used as a value")
            return tuple(self.expr(x, scope) for x in e.elts)
        if isinstance(e, ast.Attribute):
            name = _dotted(e)
            if name in ("np.nan", "math.nan"):
                return self.const(float("nan"))
            if name in ("np.inf", "math.inf"):
                return self.const(float("inf"))
            if name == "math.pi" or name == "np.pi":
                return self.const(math.pi)
            raise NotServed(f"attribute {name}")
        if isinstance(e, ast.UnaryOp):
            if isinstance(e.operand, ast.Constant) and isinstance(e.op, ast.USub):
                value = e.operand.value
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return self.const(-value)
            x = self.expr(e.operand, scope)
            if isinstance(e.op, ast.Not):
                return Val(b.not_(self.convert(x, BOOL).v), BOOL)
            if isinstance(e.op, ast.UAdd):
                return x
            if isinstance(e.op, ast.USub):
                if is_float(x.t):
                    return Val(b.fneg(x.v, flags=scope.flags), x.t)
                x = self.convert(x, I64) if x.t == BOOL else x
                return Val(b.neg(x.v), x.t)
            raise NotServed("unary operator")
        if isinstance(e, ast.BinOp):
            return self.binop(e.op, self.expr(e.left, scope), self.expr(e.right, scope), scope)
        if isinstance(e, ast.BoolOp):
            values = [self.convert(self.expr(x, scope), BOOL).v for x in e.values]
            acc = values[0]
            for v in values[1:]:
                acc = b.and_(acc, v) if isinstance(e.op, ast.And) else b.or_(acc, v)
            return Val(acc, BOOL)
        if isinstance(e, ast.Compare):
            if len(e.ops) != 1:
                raise NotServed("chained comparison")
            return self.compare(
                e.ops[0], self.expr(e.left, scope), self.expr(e.comparators[0], scope)
            )
        if isinstance(e, ast.IfExp):
            return self.ifexp(e, scope)
        if isinstance(e, ast.Subscript):
            if isinstance(e.value, ast.Attribute) and e.value.attr == "shape":
                array = self.array(e.value.value, scope)
                k = self.py_value(e.slice, scope)
                if not isinstance(k, int) or not 0 <= k < len(array.dims):
                    raise NotServed("shape index")
                return Val(array.dims[k], I64)
            if (
                isinstance(e.value, ast.Name)
                and e.value.id not in scope.values
                and e.value.id in scope.names
            ):
                return self.const(self.py_value(e, scope))
            array, ptr = self.element(e, scope)
            v = b.load(ptr)
            if array.t == BOOL:
                return Val(b.icmp_unsigned("!=", v, ir.Constant(STORE[BOOL], 0)), BOOL)
            return Val(v, array.t)
        if isinstance(e, ast.Call):
            return self.call(e, scope)
        raise NotServed(f"expression {type(e).__name__}")

    def array(self, node: ast.expr, scope: Scope) -> ArrayArg:
        if isinstance(node, ast.Name) and isinstance(scope.values.get(node.id), ArrayArg):
            return scope.values[node.id]
        raise NotServed(f"array {ast.unparse(node)}")

    def element(self, e: ast.Subscript, scope: Scope) -> tuple[ArrayArg, ir.Value]:
        array = self.array(e.value, scope)
        parts = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
        if len(parts) != len(array.dims) or not parts:
            raise NotServed("an index other than one integer per axis")
        b = self.b
        flat = None
        for k, part in enumerate(parts):
            if isinstance(part, ast.Slice):
                raise NotServed("a slice")
            i = self.expr(part, scope)
            if is_float(i.t):
                raise NotServed("a float index")
            i = self.convert(i, I64).v
            if not (isinstance(i, ir.Constant) and i.constant >= 0):
                # negative indices count from the end (Numba wraps them around too)
                negative = b.icmp_signed("<", i, ir.Constant(LL[I64], 0))
                i = b.select(negative, b.add(i, array.dims[k]), i)
            flat = i if flat is None else b.add(b.mul(flat, array.dims[k]), i)
        return array, b.gep(array.data, [flat], inbounds=True)

    def binop(self, op: ast.operator, x: Val, y: Val, scope: Scope) -> Val:
        b = self.b
        if isinstance(op, ast.Div):
            t = unify(x.t, y.t)
            t = t if is_float(t) else F64
            x, y = self.convert(x, t), self.convert(y, t)
            return Val(b.fdiv(x.v, y.v, flags=scope.flags), t)
        if isinstance(op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            if x.t == BOOL and y.t == BOOL:
                t = BOOL
            else:
                t = unify(x.t, y.t)
                if is_float(t):
                    raise NotServed("a bitwise operation on floats")
                x, y = self.convert(x, t), self.convert(y, t)
            f = {ast.BitAnd: b.and_, ast.BitOr: b.or_, ast.BitXor: b.xor}[type(op)]
            return Val(f(x.v, y.v), t)
        if isinstance(op, (ast.LShift, ast.RShift)):
            if is_float(x.t) or is_float(y.t):
                raise NotServed("a shift of floats")
            x, y = self.convert(x, I64), self.convert(y, I64)
            f = b.shl if isinstance(op, ast.LShift) else b.ashr
            return Val(f(x.v, y.v), I64)
        t = unify(x.t, y.t)
        if t == BOOL:
            t = I64
        x, y = self.convert(x, t), self.convert(y, t)
        if is_float(t):
            f = {ast.Add: b.fadd, ast.Sub: b.fsub, ast.Mult: b.fmul}.get(type(op))
            if f is not None:
                return Val(f(x.v, y.v, flags=scope.flags), t)
            if isinstance(op, ast.Pow):
                return self.power(x, y)
            raise NotServed(f"float operator {type(op).__name__}")
        f = {ast.Add: b.add, ast.Sub: b.sub, ast.Mult: b.mul}.get(type(op))
        if f is None:
            raise NotServed(f"integer operator {type(op).__name__}")
        return Val(f(x.v, y.v), t)

    def power(self, x: Val, y: Val) -> Val:
        pow_ = self.intrinsic("llvm.pow", x.t, 2)
        return Val(self.b.call(pow_, [x.v, y.v]), x.t)

    def compare(self, op: ast.cmpop, x: Val, y: Val) -> Val:
        symbol = {
            ast.Lt: "<",
            ast.LtE: "<=",
            ast.Gt: ">",
            ast.GtE: ">=",
            ast.Eq: "==",
            ast.NotEq: "!=",
        }.get(type(op))
        if symbol is None:
            raise NotServed("comparison operator")
        t = unify(x.t, y.t)
        x, y = self.convert(x, t), self.convert(y, t)
        b = self.b
        if is_float(t):
            if symbol == "!=":
                return Val(b.fcmp_unordered("!=", x.v, y.v), BOOL)
            return Val(b.fcmp_ordered(symbol, x.v, y.v), BOOL)
        if t == BOOL:
            return Val(b.icmp_unsigned(symbol, x.v, y.v), BOOL)
        return Val(b.icmp_signed(symbol, x.v, y.v), BOOL)

    def ifexp(self, e: ast.IfExp, scope: Scope) -> Val:
        b = self.b
        cond = self.convert(self.expr(e.test, scope), BOOL).v
        then_block = b.append_basic_block("ifexp.then")
        else_block = b.append_basic_block("ifexp.else")
        merge = b.append_basic_block("ifexp.end")
        b.cbranch(cond, then_block, else_block)
        b.position_at_end(then_block)
        x = self.expr(e.body, scope)
        x_end = b.block
        b.position_at_end(else_block)
        y = self.expr(e.orelse, scope)
        y_end = b.block
        t = unify(x.t, y.t)
        b.position_at_end(x_end)
        x = self.convert(x, t)
        b.branch(merge)
        b.position_at_end(y_end)
        y = self.convert(y, t)
        b.branch(merge)
        b.position_at_end(merge)
        phi = b.phi(LL[t])
        phi.add_incoming(x.v, x_end)
        phi.add_incoming(y.v, y_end)
        return Val(phi, t)

    # --- calls ---
    def call(self, e: ast.Call, scope: Scope):
        if e.keywords:
            raise NotServed("keyword arguments")
        name = _dotted(e.func)
        b = self.b
        if isinstance(e.func, ast.Name) and e.func.id in scope.names:
            target = scope.names[e.func.id]
            if isinstance(target, Func):
                args = [
                    _Py(scope.names[a.id])
                    if isinstance(a, ast.Name)
                    and a.id not in scope.vars
                    and isinstance(scope.names.get(a.id), tuple)
                    else self.expr(a, scope)
                    for a in e.args
                ]
                return self.inline(target, args, scope.flags)
            if isinstance(target, _Marker):
                return self.marker(target.name, e, scope)
            if isinstance(target, tuple) and target[0] == "runtime":
                name = target[1]
        if name in ("reduce_add", "reduce_mul"):
            x, y = (self.expr(a, scope) for a in e.args)
            if not (is_float(x.t) and x.t == y.t):
                raise NotServed(f"{name} of {x.t} and {y.t}")
            op = b.fadd if name == "reduce_add" else b.fmul
            return Val(op(x.v, y.v, flags=REDUCTION_FLAGS), x.t)
        if name == "is_c":
            array = self.array(e.args[0], scope)
            if array.flags is None:
                return self.const(True)
            bit = b.and_(array.flags, ir.Constant(ir.IntType(32), 1))
            return Val(b.icmp_unsigned("!=", bit, ir.Constant(ir.IntType(32), 0)), BOOL)
        if name in _FAST_NAMES:
            self.cost += FAST_COST
            return self.fast(_FAST_NAMES[name], [self.expr(a, scope) for a in e.args])
        if name in runtime_helpers() and name in _RUNTIME_INLINE:
            args = [self.expr(a, scope) for a in e.args]
            return self.inline(runtime_helpers()[name], args, scope.flags)
        args = [self.expr(a, scope) for a in e.args]
        if name == "abs" and len(args) == 1:
            x = args[0]
            if is_float(x.t):
                return Val(b.call(self.intrinsic("llvm.fabs", x.t, 1), [x.v]), x.t)
            x = self.convert(x, I64) if x.t == BOOL else x
            negative = b.icmp_signed("<", x.v, ir.Constant(LL[x.t], 0))
            return Val(b.select(negative, b.neg(x.v), x.v), x.t)
        if name and name.startswith("np.") and name[3:] in NP_NAMES and len(args) == 1:
            target = NP_NAMES[name[3:]]
            if target == BOOL:
                return self.convert(args[0], BOOL)
            return self.convert(args[0], target)
        if name in ("math.copysign", "np.copysign") and len(args) == 2:
            t = unify(args[0].t, args[1].t)
            t = t if is_float(t) else F64
            x, y = (self.convert(a, t) for a in args)
            return Val(b.call(self.intrinsic("llvm.copysign", t, 2), [x.v, y.v]), t)
        if name in ("np.maximum", "np.minimum") and len(args) == 2:
            return self.extremum(name == "np.maximum", *args)
        if name in ("np.isnan", "math.isnan") and len(args) == 1:
            x = args[0]
            if not is_float(x.t):
                return self.const(False)
            return Val(b.fcmp_unordered("uno", x.v, x.v), BOOL)
        if name and "." in name:
            lib, fn = name.split(".", 1)
            if lib in ("np", "math") and len(args) == 1:
                x = args[0]
                # np.* of a float32 stays float32; math.* computes in float64
                t = x.t if (lib == "np" and x.t == F32) else F64
                x = self.convert(x, t)
                if fn != "sqrt":
                    self.libm_calls += 1
                if fn in _LIBM_INTRINSIC:
                    return Val(b.call(self.intrinsic(_LIBM_INTRINSIC[fn], t, 1), [x.v]), t)
                if fn in _LIBM_EXTERN:
                    symbol = _LIBM_EXTERN[fn] + ("f" if t == F32 else "")
                    return Val(b.call(self.declare(symbol, LL[t], [LL[t]]), [x.v]), t)
        raise NotServed(f"call of {name or ast.unparse(e.func)}")

    def extremum(self, maximum: bool, x: Val, y: Val) -> Val:
        """Numba's np.maximum / np.minimum of floats: NaN propagates (the first one)."""
        b = self.b
        t = unify(x.t, y.t)
        if not is_float(t):
            raise NotServed("np.maximum of integers")
        x, y = self.convert(x, t), self.convert(y, t)
        x_nan = b.fcmp_unordered("uno", x.v, x.v)
        any_nan = b.fcmp_unordered("uno", x.v, y.v)
        nan_result = b.select(x_nan, x.v, y.v)
        keep_x = b.fcmp_ordered(">=" if maximum else "<=", x.v, y.v)
        other = b.select(keep_x, x.v, y.v)
        return Val(b.select(any_nan, nan_result, other), t)

    def marker(self, name: str, e: ast.Call, scope: Scope) -> Val:
        b = self.b
        args = [self.expr(a, scope) for a in e.args]
        if name == "_bits":
            x = args[0]
            if not is_float(x.t):
                raise NotServed("_bits of an integer")
            t = I64 if x.t == F64 else I32
            return Val(b.bitcast(x.v, LL[t]), t)
        if name == "_fma":
            t = args[0].t
            if not (is_float(t) and all(a.t == t for a in args)):
                raise NotServed("_fma of mixed types")
            return Val(b.call(self.intrinsic("llvm.fma", t, 3), [a.v for a in args]), t)
        if name == "_from_bits":
            bits, like = args
            width = 64 if like.t == F64 else 32
            it = I64 if width == 64 else I32
            value = self.convert(bits, it) if bits.t != it else bits
            return Val(b.bitcast(value.v, LL[like.t]), like.t)
        raise NotServed(name)

    def inline(self, func: Func, args: list, flags: tuple) -> Any:
        """A helper inlined at its call (Numba's inline="always"): the caller's flags."""
        node = func.node
        params = [a.arg for a in node.args.args]
        defaults = node.args.defaults
        if len(args) > len(params) or len(args) < len(params) - len(defaults):
            raise NotServed(f"call of {node.name} with {len(args)} arguments")
        scope = Scope(dict(func.names), flags)
        scope.ret = []
        scope.ret_block = self.b.append_basic_block(f"{node.name}.end")
        for p, a in zip(params, args):
            if isinstance(a, _Py):
                scope.names[p] = a.value
            elif isinstance(a, Val):
                slot = self.entry.alloca(LL[a.t], name=p)
                self.b.store(a.v, slot)
                scope.vars[p] = (slot, a.t)
            else:
                scope.values[p] = a
        self.body(node.body, scope)
        if not self.b.block.is_terminated:
            raise NotServed(f"{node.name} may end without a return")
        self.b.position_at_end(scope.ret_block)
        returns = scope.ret
        if not returns:
            raise NotServed(f"{node.name} never returns")
        first = returns[0][0]
        merge = scope.ret_block
        if isinstance(first, tuple):
            n = len(first)
            if not all(isinstance(r, tuple) and len(r) == n for r, _ in returns):
                raise NotServed(f"{node.name} returns tuples of several lengths")
            return tuple(self._merge([(r[k], blk) for r, blk in returns], merge) for k in range(n))
        if not all(isinstance(r, Val) for r, _ in returns):
            raise NotServed(f"{node.name} returns a tuple on some paths only")
        return self._merge(returns, merge)

    def _merge(self, returns: list, merge: ir.Block) -> Val:
        """The value a helper returns: a phi of its returns in the block they branch to."""
        if not all(isinstance(r, Val) for r, _ in returns):
            raise NotServed("a helper returning nested tuples")
        t = returns[0][0].t
        for r, _ in returns:
            t = unify(t, r.t)
        b = self.b
        # conversions happen in the returning blocks, before their branches
        values = []
        for r, blk in returns:
            if r.t != t:
                term = blk.terminator
                b.position_before(term)
                r = self.convert(r, t)
            values.append((r.v, blk))
        b.position_at_end(merge)
        phi = b.phi(LL[t])
        for v, blk in values:
            phi.add_incoming(v, blk)
        return Val(phi, t)

    def fast(self, name: str, args: list) -> Val:
        """A fastmath kernel: a function of its own with `contract` flags, always inlined."""
        width = 32 if all(a.t == F32 for a in args) else 64
        t = F32 if width == 32 else F64
        args = [self.convert(a, t) for a in args]
        key = (name, width)
        fn = self._fast_functions.get(key)
        if fn is None:
            func = fast_kernels()[width].get(name)
            if func is None:
                raise NotServed(f"fast {name}")
            fn = ir.Function(
                self.module,
                ir.FunctionType(LL[t], [LL[t]] * len(args)),
                name=f"gradtape_fast_{name}_f{width}",
            )
            fn.linkage = "internal"
            fn.attributes.add("alwaysinline")
            fn.attributes.add("nounwind")
            entry_block = fn.append_basic_block("entry")
            body_block = fn.append_basic_block("body")
            inner = Translator(self.module, ir.IRBuilder(body_block), ir.IRBuilder(entry_block))
            inner._fast_functions = self._fast_functions
            inner.top_block = body_block
            scope = Scope(dict(func.names), FAST_FLAGS)
            scope.ret = []
            scope.ret_block = fn.append_basic_block("return")
            for p, a in zip([p.arg for p in func.node.args.args], fn.args):
                slot = inner.entry.alloca(LL[t], name=p)
                inner.b.store(a, slot)
                scope.vars[p] = (slot, t)
            inner.body(func.node.body, scope)
            if not inner.b.block.is_terminated:
                raise NotServed(f"fast {name} may end without a return")
            inner.b.position_at_end(scope.ret_block)
            value = inner._merge(scope.ret, scope.ret_block)
            value = inner.convert(value, t)
            inner.b.ret(value.v)
            inner.entry.branch(body_block)
            self._fast_functions[key] = fn
        return Val(self.b.call(fn, [a.v for a in args]), t)


# runtime.py's helpers inlined from their source (is_c, reduce_add, reduce_mul and
# prefer_wide_vectors are translated directly; the others use constructs outside the subset)
_RUNTIME_INLINE = frozenset(
    {"max_step", "min_step", "nan_safe_product", "int_max_step", "int_min_step", "ndtr"}
)


@dataclass
class _Py:
    """A compile-time value passed to an inlined helper (fastmath's constant tuples)."""

    value: Any


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _as_load(target: ast.expr) -> ast.expr:
    node = ast.parse(ast.unparse(target), mode="eval").body
    return ast.copy_location(node, target)
