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
import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from llvmlite import ir

from ..numba.status import STATUS_CHECK

__all__ = ["NotServed", "Translator", "ArrayArg", "F64", "F32", "I64", "I32", "BOOL"]

_NUMBA_DIR = Path(__file__).resolve().parent.parent / "numba"


class NotServed(Exception):
    """A construct the translator does not serve: the module goes to Numba."""


# --- types -----------------------------------------------------------------------------------
F64, F32, I64, I32, BOOL = "f64", "f32", "i64", "i32", "bool"
U64 = "u64"  # np.uint64 scalars (the matrix-vector loops' row counters); never an array
LL = {
    F64: ir.DoubleType(),
    F32: ir.FloatType(),
    I64: ir.IntType(64),
    I32: ir.IntType(32),
    U64: ir.IntType(64),
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
NP_NAMES = {"float64": F64, "float32": F32, "int64": I64, "bool_": BOOL, "uint64": U64}
REDUCTION_FLAGS = ("reassoc", "nsz", "contract")
C_FLAGS = ir.Constant(ir.IntType(32), 0x1 | 0x100 | 0x400)  # C-contiguous, aligned, writeable
FAST_FLAGS = ("contract",)
INTO = ("copy_into", "add_into")


def is_float(t: str) -> bool:
    return t in (F64, F32)


def unify(a: str, b: str) -> str:
    """The type of a binary operation's operands (Numba's NumPy-like promotion)."""
    if a == b:
        return a
    if is_float(a) or is_float(b):
        return F32 if a == F32 and b == F32 else F64
    if U64 in (a, b):  # (Numba makes uint64 with int64 a float64; not translated)
        raise NotServed("uint64 mixed with another integer type")
    return I64


class Builder(ir.IRBuilder):
    """An IRBuilder whose loads and stores assume no alignment unless told (align 1): an
    array's data may be unaligned (Dask hands over arrays deserialized from its frames), and
    x86-64 and AArch64 use the same instructions for aligned and unaligned elements."""

    def load(self, ptr, name="", align=None, typ=None):
        align = 1 if align is None else align
        if typ is None:  # (llvmlite before 0.44 has no typ parameter)
            return super().load(ptr, name, align)
        return super().load(ptr, name, align, typ)

    def store(self, value, ptr, align=None):
        return super().store(value, ptr, 1 if align is None else align)


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
    flags: ir.Value | None = None  # NumPy's flags word (arguments); None: C-contiguous
    written: bool = False
    pyobj: ir.Value | None = None  # an ndarray this kernel allocated: the slot holding it


@dataclass
class ArraySlots:
    """An array bound to a name: its data pointer and dims live in stack slots, so a name
    rebound inside a loop (`a0, b0 = b0, a0`) reads the current binding on every iteration
    (LLVM's mem2reg turns the slots back into registers)."""

    data: ir.AllocaInstr
    dims: list
    t: str
    flags: ir.AllocaInstr
    pyobj: ir.Value | None = None

    def load(self, b: ir.IRBuilder) -> ArrayArg:
        dims = [b.load(d) for d in self.dims]
        return ArrayArg(b.load(self.data), dims, self.t, b.load(self.flags), pyobj=self.pyobj)

    def store(self, b: ir.IRBuilder, array: ArrayArg) -> None:
        b.store(array.data, self.data)
        for slot, d in zip(self.dims, array.dims):
            b.store(d, slot)
        b.store(array.flags if array.flags is not None else C_FLAGS, self.flags)


@dataclass
class Placeholder:
    """`np.empty((0,), dtype)` in a return that reports a failed check: an empty array."""

    t: str
    ndim: int


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


def single_definition(body: list, name: str, stores: dict) -> bool:
    """Whether each read of `name` in a function (`body`) sees exactly one assignment: the
    nearest earlier statement of its own block or of an enclosing block that assigns the
    name is a plain assignment (or the enclosing loop's variable), and no loop between that
    assignment and the read assigns the name again. A type change of such a name is a new
    variable (Numba types each SSA version on its own); a name a read may see two
    assignments of keeps one variable (and a type change is refused). `stores`: a memo of
    the names each statement assigns (id -> set)."""

    def assigned(node: ast.AST) -> set:
        got = stores.get(id(node))
        if got is None:
            got = stores[id(node)] = {
                n.id
                for n in ast.walk(node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            }
        return got

    def reaching(chain: list) -> bool:
        for block, index in reversed(chain):
            for earlier in reversed(block[:index]):
                if name in assigned(earlier):
                    return isinstance(earlier, ast.Assign)
            owner = block.owner
            if isinstance(owner, ast.For):
                if name in assigned(owner.target):
                    return True
                if name in assigned(owner):
                    return False  # assigned later in the loop: the back edge brings it
            elif owner is not None and name in assigned(owner):
                return False
        return False

    def reads(node: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
            for n in ast.walk(node)
        )

    def visit(block: _Block, chain: list) -> bool:
        for index, stmt in enumerate(block):
            here = [*chain, (block, index)]
            if isinstance(stmt, (ast.If, ast.For)):
                head = stmt.test if isinstance(stmt, ast.If) else stmt.iter
                if reads(head) and not reaching(here):
                    return False
                for inner in (stmt.body, stmt.orelse):
                    if inner and not visit(_Block(inner, stmt), here):
                        return False
            elif reads(stmt) and not reaching(here):
                return False
        return True

    return visit(_Block(body, None), [])


class _Block(list):
    """A statement list and the statement that holds it (None: the function's body)."""

    def __init__(self, stmts: list, owner: ast.stmt | None):
        super().__init__(stmts)
        self.owner = owner


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
        self.buffers: list[ir.Value] = []  # slots of malloc'd buffers (NULL until made)
        self.on_return = None
        self.wide_vectors = False
        self._fast_functions: dict[tuple, ir.Function] = {}
        self.depth = 0  # loops and branches around the statement being translated
        self.cost = 0  # statements translated (a fast function counts FAST_COST)
        self.libm_calls = 0  # calls of libm that LLVM cannot vectorize
        self.large_loops = 0
        self.markers = 0
        # the module's functions a kernel may call (a loop driver's step kernels), and the
        # LLVM functions made of them, per argument kinds (shared by every translator of
        # the module)
        self.functions: dict[str, ast.FunctionDef] = {}
        self.compiled: dict[tuple, tuple] = {}
        self.returned: set[str] = set()  # names of arrays this kernel returns
        self.rebound: set[str] = set()  # names bound more than once (rebound_names)
        self.function_body: list = []  # the statements of the function being translated
        self.splittable: dict[str, bool] = {}  # name -> single_definition (memo)
        self._stores: dict[int, set] = {}
        self.allocator = None  # (t, dims) -> ArrayArg: an ndarray (the entry point's)
        self.status_exit = None  # (builder, free_buffers): return STATUS_CHECK from here

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
            if x.t in (BOOL, U64):
                return Val(b.uitofp(x.v, LL[t]), t)
            return Val(b.sitofp(x.v, LL[t]), t)
        if is_float(x.t):
            return Val((b.fptoui if t == U64 else b.fptosi)(x.v, LL[t]), t)
        if {x.t, t} <= {I64, U64}:
            return Val(x.v, t)  # (the same bits)
        if x.t == BOOL:
            return Val(b.zext(x.v, LL[t]), t)
        width = {I64: 64, I32: 32, U64: 64}
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
        if not nested:
            self.function_body, self.splittable = stmts, {}
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
            if isinstance(s.value, ast.Call) and _dotted(s.value.func) in INTO:
                self.elementwise_into(s.value, scope, _dotted(s.value.func) == "add_into")
                return
            raise NotServed("an expression statement")
        if isinstance(s, ast.Assign):
            if len(s.targets) != 1:
                raise NotServed("chained assignment")
            self.assign(s.targets[0], s.value, scope)
            return
        if isinstance(s, ast.AugAssign):
            if not isinstance(s.target, (ast.Name, ast.Subscript)):
                raise NotServed("augmented assignment")
            if isinstance(s.target, ast.Subscript) and self.is_view(s.target, scope):
                self.update_view(s, scope)
                return
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
            v = self.convert(self.scalar(value, scope), array.t if array.t != BOOL else BOOL)
            store = v.v if array.t != BOOL else self.b.zext(v.v, STORE[BOOL])
            self.b.store(store, index)
            return
        name = target.id if isinstance(target, ast.Name) else None
        array = self.array_value(value, scope, name) if isinstance(value, ast.Call) else None
        if array is not None:
            self.bind(target, array, scope)
            return
        self.bind(target, self.operand(value, scope), scope)

    def bind(self, target: ast.expr, v, scope: Scope) -> None:
        if not isinstance(target, ast.Name):
            raise NotServed("assignment target")
        name = target.id
        if isinstance(v, ArrayArg):
            self.bind_array(name, v, scope)
            return
        if isinstance(v, tuple):
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
        elif slot[1] != v.t and not self.rebind_ok(slot[1], v.t) and self.split_ok(name):
            # every read of the name sees one assignment: a new variable, as Numba's SSA
            # names make it (an index `i` of int64 after a loop's `i` of uint64)
            slot = scope.vars[name] = (self.entry.alloca(LL[v.t], name=name), v.t)
        elif slot[1] != v.t:
            if not self.rebind_ok(slot[1], v.t):
                raise NotServed(f"{name} changes type ({slot[1]} to {v.t})")
            v = self.convert(v, slot[1])
        self.b.store(v.v, slot[0])

    def bind_array(self, name: str, v: ArrayArg, scope: Scope) -> None:
        """Bind an array to a name: its data pointer and dims go to slots (see ArraySlots);
        a rebinding (in a loop) stores another array of the same type and axes."""
        if name in scope.vars:
            raise NotServed(f"{name} rebound to another kind")
        current = scope.values.get(name)
        if current is None and name not in self.rebound:  # (bound once: no slots)
            scope.values[name] = v
            return
        if current is None:
            i64 = LL[I64]
            data = self.entry.alloca(v.data.type, name=f"{name}.data")
            dims = [self.entry.alloca(i64, name=f"{name}.d{k}") for k in range(len(v.dims))]
            flags = self.entry.alloca(C_FLAGS.type, name=f"{name}.flags")
            current = scope.values[name] = ArraySlots(data, dims, v.t, flags, v.pyobj)
        elif not (
            isinstance(current, ArraySlots)
            and current.t == v.t
            and len(current.dims) == len(v.dims)
            and current.pyobj is None
            and v.pyobj is None
        ):
            raise NotServed(f"{name} rebound to another kind of array")
        current.store(self.b, v)

    def split_ok(self, name: str) -> bool:
        """Whether a new type for `name` may be a new variable (single_definition)."""
        got = self.splittable.get(name)
        if got is None:
            got = self.splittable[name] = single_definition(self.function_body, name, self._stores)
        return got

    @staticmethod
    def rebind_ok(old: str, new: str) -> bool:
        try:
            return unify(old, new) == old
        except NotServed:  # (uint64 with int64)
            return False

    def array_value(self, call: ast.Call, scope: Scope, name: str | None) -> ArrayArg | None:
        """The array a call makes (np.empty, np.full, np.empty_like, a.copy(), a.reshape(),
        np.ascontiguousarray, np.concatenate), bound to `name`; None for other calls."""
        func = _dotted(call.func)
        if func in ("np.empty", "np.full"):
            return self.empty(call, scope, name)
        if func == "np.zeros" and len(call.args) == 2 and not call.keywords:
            array = self.empty(ast.Call(ast.Name("np.empty"), call.args, []), scope, name)
            i8p = ir.IntType(8).as_pointer()
            memset = self.declare("memset", i8p, [i8p, ir.IntType(32), LL[I64]])
            raw = self.b.bitcast(array.data, i8p)
            self.b.call(memset, [raw, ir.Constant(ir.IntType(32), 0), self.nbytes(array)])
            return array  # (all bytes 0: 0.0, 0, False)
        if isinstance(call.func, ast.Attribute) and call.func.attr in ("reshape", "copy", "ravel"):
            if call.func.attr == "reshape":
                return self.reshape(call, scope)
            if call.func.attr == "ravel":  # (of a C-contiguous array: a view)
                if call.args or call.keywords:
                    raise NotServed("ravel with arguments")
                source = self.array(call.func.value, scope)
                size = ir.Constant(LL[I64], 1)
                for d in source.dims:
                    size = self.b.mul(size, d)
                return ArrayArg(source.data, [size], source.t, source.flags)
            source = self.array_operand(call.func.value, scope)
            if call.args or call.keywords:
                raise NotServed("copy with arguments")
            copied = self.allocate(source.t, source.dims, name)
            self.copy_data(copied, source)
            return copied
        if func == "np.empty_like" and len(call.args) == 1 and not call.keywords:
            source = self.array_operand(call.args[0], scope)
            return self.allocate(source.t, source.dims, name)
        if func == "np.ascontiguousarray" and len(call.args) == 1 and not call.keywords:
            return self.array_operand(call.args[0], scope)  # (views here are C-contiguous)
        if func == "np.concatenate":
            return self.concatenate(call, scope, name)
        return None

    def array_operand(self, e: ast.expr, scope: Scope) -> ArrayArg:
        got = self.operand(e, scope)
        if not isinstance(got, ArrayArg):
            raise NotServed(f"{ast.unparse(e)} is not an array")
        return got

    def empty(self, call: ast.Call, scope: Scope, name: str | None = None) -> ArrayArg:
        """np.empty(shape, dtype) or np.full(shape, value[, dtype]): a buffer of this call
        (freed at every return of the kernel, or an ndarray it returns)."""
        full = _dotted(call.func) == "np.full"
        if (
            len(call.args) != (2 if not full else len(call.args))
            or not 2 <= len(call.args) <= 3
            or scope.ret is not None
        ):
            raise NotServed("np.empty or np.full form")
        if full:
            fill = self.scalar(call.args[1], scope)
            t = self.np_type(call.args[2]) if len(call.args) == 3 else fill.t
            if t not in ITEMSIZE:
                raise NotServed("np.full of this type")
        else:
            t = self.np_type(call.args[1])
        shape = call.args[0]
        parts = shape.elts if isinstance(shape, ast.Tuple) else [shape]  # (np.empty(n, ...))
        dims = [self.convert(self.scalar(d, scope), I64).v for d in parts]
        array = self.allocate(t, dims, name)
        if full:
            self.fill(array, self.convert(fill, t), self.nbytes(array))
        return array

    def nbytes(self, array: ArrayArg) -> ir.Value:
        size = ir.Constant(LL[I64], ITEMSIZE[array.t])
        for d in array.dims:
            size = self.b.mul(size, d)
        return size

    def allocate(self, t: str, dims: list, name: str | None) -> ArrayArg:
        """A new C-contiguous array: an ndarray (through `self.allocator`, the entry point's)
        when the kernel returns it by `name`, else a buffer (malloc; freed at every return)."""
        if self.depth:
            raise NotServed("an array allocated inside a loop or branch")
        if t not in ITEMSIZE:
            raise NotServed(f"an array of {t}")
        if name is not None and name in self.returned and self.allocator is not None:
            return self.allocator(t, list(dims))
        array = ArrayArg(None, list(dims), t)
        malloc = self.declare("malloc", ir.IntType(8).as_pointer(), [LL[I64]])
        raw = self.b.call(malloc, [self.nbytes(array)])
        slot = self.entry.alloca(raw.type, name="buffer")
        self.entry.store(ir.Constant(raw.type, None), slot)
        self.b.store(raw, slot)
        self.buffers.append(slot)
        array.data = self.b.bitcast(raw, STORE[t].as_pointer())
        return array

    def copy_data(self, dst: ArrayArg, src: ArrayArg) -> None:
        """dst's elements = src's (one type, as many elements; distinct memory)."""
        if dst.t != src.t:
            raise NotServed("a copy between types")
        i8p = ir.IntType(8).as_pointer()
        memcpy = self.declare("memcpy", i8p, [i8p, i8p, LL[I64]])
        b = self.b
        b.call(memcpy, [b.bitcast(dst.data, i8p), b.bitcast(src.data, i8p), self.nbytes(src)])

    def concatenate(self, call: ast.Call, scope: Scope, name: str | None) -> ArrayArg:
        """np.concatenate((a, b, ...), axis=0) of C-contiguous arrays of one type."""
        axis = [k for k in call.keywords if k.arg == "axis"]
        if (
            len(call.args) != 1
            or not isinstance(call.args[0], ast.Tuple)
            or len(call.keywords) != len(axis)
            or (axis and self.py_value(axis[0].value, scope) != 0)
        ):
            raise NotServed("np.concatenate form")
        parts = [self.array_operand(e, scope) for e in call.args[0].elts]
        t, ndim = parts[0].t, len(parts[0].dims)
        if ndim < 1 or any(p.t != t or len(p.dims) != ndim for p in parts):
            raise NotServed("np.concatenate of these arrays")
        b = self.b
        rows = parts[0].dims[0]
        for p in parts[1:]:
            for d, first in zip(p.dims[1:], parts[0].dims[1:]):
                self.check_or_fail(b.icmp_signed("==", d, first))  # (Numba raises)
            rows = b.add(rows, p.dims[0])
        out = self.allocate(t, [rows, *parts[0].dims[1:]], name)
        offset = ir.Constant(LL[I64], 0)
        for p in parts:
            self.copy_data(ArrayArg(b.gep(out.data, [offset]), p.dims, t), p)
            size = b.udiv(self.nbytes(p), ir.Constant(LL[I64], ITEMSIZE[t]))
            offset = b.add(offset, size)
        return out

    def check_or_fail(self, ok: ir.Value) -> None:
        """Go on where `ok`; else the kernel returns the status STATUS_CHECK (its caller
        answers the call another way: NumPy), where Numba would raise."""
        if self.status_exit is None:
            raise NotServed("a check this kernel cannot report")
        b = self.b
        good = b.append_basic_block("checked")
        bad = b.append_basic_block("check.failed")
        b.cbranch(ok, good, bad)
        b.position_at_end(bad)
        self.status_exit(b, self.free_buffers)
        b.position_at_end(good)

    def is_view(self, target: ast.Subscript, scope: Scope) -> bool:
        if isinstance(target.value, ast.Name) and isinstance(
            scope.values.get(target.value.id), (ArrayArg, ArraySlots)
        ):
            parts = target.slice.elts if isinstance(target.slice, ast.Tuple) else [target.slice]
            ndim = len(self.array(target.value, scope).dims)
            return len(parts) < ndim or any(isinstance(p, ast.Slice) for p in parts)
        return False

    def update_view(self, s: ast.AugAssign, scope: Scope) -> None:
        """`a[lo:hi] += b` (b an array of the view's size, or a scalar): element by element,
        each `view[k] = view[k] op b[k]` as Numba's in-place operator computes it."""
        view = self.subscript(s.target, scope)
        source = self.operand(s.value, scope)
        b = self.b
        count = b.udiv(self.nbytes(view), ir.Constant(LL[I64], ITEMSIZE[view.t]))
        if isinstance(source, ArrayArg):
            size = b.udiv(self.nbytes(source), ir.Constant(LL[I64], ITEMSIZE[source.t]))
            self.check_or_fail(b.icmp_signed("==", size, count))
        elif not isinstance(source, Val):
            raise NotServed("an in-place update by a tuple")
        with self.element_loop(count, "update") as i:
            target = b.gep(view.data, [i], inbounds=True)
            current = self.loaded(view.t, b.load(target))
            other = source
            if isinstance(source, ArrayArg):
                other = self.loaded(source.t, b.load(b.gep(source.data, [i], inbounds=True)))
            v = self.convert(self.binop(s.op, current, other, scope), view.t)
            b.store(v.v if view.t != BOOL else b.zext(v.v, STORE[BOOL]), target)

    @contextlib.contextmanager
    def element_loop(self, count: ir.Value, name: str):
        """`for i in range(count)` in IR: the body is emitted inside the `with` (i: int64)."""
        b = self.b
        counter = self.entry.alloca(LL[I64], name=f"{name}.n")
        b.store(ir.Constant(LL[I64], 0), counter)
        head = b.append_basic_block(name)
        loop = b.append_basic_block(f"{name}.body")
        after = b.append_basic_block(f"{name}.end")
        b.branch(head)
        b.position_at_end(head)
        i = b.load(counter)
        b.cbranch(b.icmp_signed("<", i, count), loop, after)
        b.position_at_end(loop)
        yield i
        b.store(b.add(i, ir.Constant(LL[I64], 1), flags=("nsw",)), counter)
        b.branch(head)
        b.position_at_end(after)

    def loaded(self, t: str, v: ir.Value) -> Val:
        """An element loaded from memory as a value (booleans are stored as bytes)."""
        if t == BOOL:
            return Val(self.b.icmp_unsigned("!=", v, ir.Constant(STORE[BOOL], 0)), BOOL)
        return Val(v, t)

    def elementwise_into(self, call: ast.Call, scope: Scope, add: bool) -> None:
        """copy_into(dst, src) / add_into(dst, src): runtime.py's loops over the elements of
        two C-contiguous arrays of one shape (`dst[i] = s[i]`, `dst[i] += s[i]`)."""
        if len(call.args) != 2 or call.keywords:
            raise NotServed("copy_into form")
        dst, src = (self.array_operand(a, scope) for a in call.args)
        if dst.t != src.t or len(dst.dims) != len(src.dims):
            raise NotServed("copy_into between arrays of other kinds")
        b = self.b
        count = b.udiv(self.nbytes(dst), ir.Constant(LL[I64], ITEMSIZE[dst.t]))
        with self.element_loop(count, "into") as i:
            value = b.load(b.gep(src.data, [i], inbounds=True))
            target = b.gep(dst.data, [i], inbounds=True)
            if add:
                if not is_float(dst.t):
                    raise NotServed("add_into of integers")
                value = b.fadd(b.load(target), value)
            b.store(value, target)

    def fill(self, array: ArrayArg, value: Val, nbytes: ir.Value) -> None:
        b = self.b
        count = b.udiv(nbytes, ir.Constant(LL[I64], ITEMSIZE[array.t]))
        with self.element_loop(count, "fill") as i:
            v = value.v if array.t != BOOL else b.zext(value.v, STORE[BOOL])
            b.store(v, b.gep(array.data, [i], inbounds=True))

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
        """`for i in range(...)`: one, two or three arguments (a constant step), int64 or
        uint64 (Numba's loop variable takes the bounds' type)."""
        b = self.b
        call = s.iter
        if (
            s.orelse
            or not isinstance(s.target, ast.Name)
            or not isinstance(call, ast.Call)
            or not isinstance(call.func, ast.Name)
            or call.func.id != "range"
            or not 1 <= len(call.args) <= 3
        ):
            if isinstance(call, (ast.Subscript, ast.Name, ast.Tuple)):
                return self.for_tuple(s, scope)
            raise NotServed("a loop other than over a range")
        start, stop, step, t = self.range_bounds(call.args, scope)
        name = s.target.id
        if name in scope.values:
            raise NotServed("loop variable rebinds a value")
        slot = scope.vars.get(name)
        if slot is not None and slot[1] != t and not self.split_ok(name):
            raise NotServed(f"{name} changes type ({slot[1]} to {t}) where a read sees both")
        if slot is None or slot[1] != t:  # (another loop's variable of another type: a new
            # variable, as Numba's SSA names make it)
            slot = scope.vars[name] = (self.entry.alloca(LL[t], name=name), t)
        counter = self.entry.alloca(LL[t], name=f"{name}.n")
        b.store(start, counter)
        head = b.append_basic_block(f"for.{name}")
        loop = b.append_basic_block(f"body.{name}")
        after = b.append_basic_block(f"end.{name}")
        b.branch(head)
        b.position_at_end(head)
        i = b.load(counter)
        compare = b.icmp_unsigned if t == U64 else b.icmp_signed
        b.cbranch(compare("<" if step.constant > 0 else ">", i, stop), loop, after)
        b.position_at_end(loop)
        b.store(i, slot[0])
        b.store(b.add(i, step, flags=() if t == U64 else ("nsw",)), counter)
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

    def range_bounds(self, args: list, scope: Scope) -> tuple:
        """(start, stop, step, type) of range(...)'s arguments; the step a constant."""
        values = [self.scalar(a, scope) for a in args]
        if any(is_float(v.t) for v in values):
            raise NotServed("range of floats")
        unsigned = [v.t == U64 for v in values]
        if any(unsigned) and not all(unsigned):
            raise NotServed("range of uint64 and int64")
        t = U64 if all(unsigned) else I64
        values = [self.convert(v, t).v for v in values]
        if len(values) == 1:
            return ir.Constant(LL[t], 0), values[0], ir.Constant(LL[t], 1), t
        if len(values) == 2:
            return values[0], values[1], ir.Constant(LL[t], 1), t
        step = values[2]
        if not isinstance(step, ir.Constant) or step.constant == 0:
            raise NotServed("range with a step that is not a constant")
        if t == U64 and step.constant < 0:
            raise NotServed("range with a negative uint64 step")
        return values[0], values[1], step, t

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
        if scope.ret is not None:  # an inlined helper
            value = self.expr(s.value, scope, allow_tuple=True) if s.value is not None else None
            scope.ret.append((value, self.b.block))
            self.b.branch(scope.ret_block)
            return
        if isinstance(s.value, ast.Tuple):  # (failed checks return placeholders of arrays)
            value = tuple(self.placeholder(e) or self.operand(e, scope) for e in s.value.elts)
        elif s.value is not None:
            value = self.scalar(s.value, scope)
        else:
            raise NotServed("a kernel returning nothing")
        self.on_return(value, self.b, self.free_buffers)

    def free_buffers(self) -> None:
        """Free the buffers this kernel allocated so far (at a return)."""
        free = self.declare("free", ir.VoidType(), [ir.IntType(8).as_pointer()])
        for slot in self.buffers:  # (free(NULL): nothing)
            self.b.call(free, [self.b.load(slot)])

    def placeholder(self, e: ast.expr) -> Placeholder | None:
        if (
            isinstance(e, ast.Call)
            and _dotted(e.func) == "np.empty"
            and len(e.args) == 2
            and isinstance(e.args[0], ast.Tuple)
            and all(isinstance(d, ast.Constant) and d.value == 0 for d in e.args[0].elts)
        ):
            return Placeholder(self.np_type(e.args[1]), len(e.args[0].elts))
        return None

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
        """The value of expression `e`: a Val, or (allow_tuple) a tuple or an array."""
        if isinstance(e, ast.Constant):
            return self.const(e.value)
        if isinstance(e, ast.Name):
            return self.name(e, scope, allow_tuple)
        if isinstance(e, ast.Tuple):
            if not allow_tuple:
                raise NotServed("a tuple used as a value")
            return tuple(self.operand(x, scope) for x in e.elts)
        if isinstance(e, ast.Attribute):
            return self.attribute(e)
        if isinstance(e, ast.UnaryOp):
            return self.unary(e, scope)
        if isinstance(e, ast.BinOp):
            left, right = self.scalar(e.left, scope), self.scalar(e.right, scope)
            return self.binop(e.op, left, right, scope)
        if isinstance(e, ast.BoolOp):
            values = [self.convert(self.scalar(x, scope), BOOL).v for x in e.values]
            acc = values[0]
            for v in values[1:]:
                acc = self.b.and_(acc, v) if isinstance(e.op, ast.And) else self.b.or_(acc, v)
            return Val(acc, BOOL)
        if isinstance(e, ast.Compare):
            if len(e.ops) != 1:
                raise NotServed("chained comparison")
            left, right = self.scalar(e.left, scope), self.scalar(e.comparators[0], scope)
            return self.compare(e.ops[0], left, right)
        if isinstance(e, ast.IfExp):
            return self.ifexp(e, scope)
        if isinstance(e, ast.Subscript):
            got = self.subscript(e, scope)
            if isinstance(got, ArrayArg) and not allow_tuple:
                raise NotServed("an array used as a scalar")
            return got
        if isinstance(e, ast.Call):
            return self.call(e, scope)
        raise NotServed(f"expression {type(e).__name__}")

    def scalar(self, e: ast.expr, scope: Scope) -> Val:
        """The value of `e`, which must be a scalar."""
        got = self.expr(e, scope)
        if not isinstance(got, Val):
            raise NotServed(f"{ast.unparse(e)} used as a scalar")
        return got

    def operand(self, e: ast.expr, scope: Scope):
        """The value of `e` where an array may stand (call arguments, tuples, assignments)."""
        if isinstance(e, ast.Call):
            array = self.array_value(e, scope, None)
            if array is not None:
                return array
        return self.expr(e, scope, allow_tuple=True)

    def name(self, e: ast.Name, scope: Scope, allow_tuple: bool):
        if e.id in scope.vars:
            slot, t = scope.vars[e.id]
            return Val(self.b.load(slot), t)
        if e.id in scope.values:
            got = scope.values[e.id]
            if isinstance(got, ArraySlots):
                got = got.load(self.b)
            if isinstance(got, (tuple, ArrayArg)) and not allow_tuple:
                raise NotServed("a tuple or an array used as a scalar")
            return got
        if e.id in scope.names:
            value = scope.names[e.id]
            if isinstance(value, tuple):
                if allow_tuple:
                    return tuple(self.const(x) for x in value)
                raise NotServed("a constant tuple used as a value")
            return self.const(value)
        raise NotServed(f"name {e.id}")

    def attribute(self, e: ast.Attribute) -> Val:
        name = _dotted(e)
        if name in ("np.nan", "math.nan"):
            return self.const(float("nan"))
        if name in ("np.inf", "math.inf"):
            return self.const(float("inf"))
        if name == "math.pi" or name == "np.pi":
            return self.const(math.pi)
        raise NotServed(f"attribute {name}")

    def unary(self, e: ast.UnaryOp, scope: Scope) -> Val:
        b = self.b
        if isinstance(e.operand, ast.Constant) and isinstance(e.op, ast.USub):
            value = e.operand.value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return self.const(-value)
        x = self.scalar(e.operand, scope)
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

    def subscript(self, e: ast.Subscript, scope: Scope):
        """An element (a Val), an item of a tuple, a dimension, or a view (an ArrayArg)."""
        if isinstance(e.value, ast.Attribute) and e.value.attr == "shape":
            array = self.array(e.value.value, scope)
            k = self.py_value(e.slice, scope)
            if not isinstance(k, int) or not 0 <= k < len(array.dims):
                raise NotServed("shape index")
            return Val(array.dims[k], I64)
        if isinstance(e.value, ast.Name) and isinstance(scope.values.get(e.value.id), tuple):
            k = self.py_value(e.slice, scope)
            items = scope.values[e.value.id]
            if not isinstance(k, int) or not -len(items) <= k < len(items):
                raise NotServed("tuple index")
            return items[k]
        if (
            isinstance(e.value, ast.Name)
            and e.value.id not in scope.values
            and e.value.id in scope.names
        ):
            return self.const(self.py_value(e, scope))
        if isinstance(e.value, ast.Call) and _dotted(e.value.func) == "np.full":
            return self.full_item(e.value, scope)
        array = self.array(e.value, scope)
        parts = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
        if len(parts) < len(array.dims) or any(isinstance(p, ast.Slice) for p in parts):
            return self.view(array, parts, scope)
        array, ptr = self.element(e, scope)
        v = self.b.load(ptr)
        if array.t == BOOL:
            return Val(self.b.icmp_unsigned("!=", v, ir.Constant(STORE[BOOL], 0)), BOOL)
        return Val(v, array.t)

    def full_item(self, call: ast.Call, scope: Scope) -> Val:
        """An element of `np.full(shape, value[, dtype])` (a reduction of a size-1 value
        writes `np.full((1,), s)[j]`): the value, in the array's type; nothing is allocated."""
        if not 2 <= len(call.args) <= 3 or call.keywords:
            raise NotServed("np.full form")
        fill = self.scalar(call.args[1], scope)
        t = self.np_type(call.args[2]) if len(call.args) == 3 else fill.t
        if t not in ITEMSIZE:
            raise NotServed("np.full of this type")
        return self.convert(fill, t)

    def array(self, node: ast.expr, scope: Scope) -> ArrayArg:
        if isinstance(node, ast.Name):
            got = scope.values.get(node.id)
            if isinstance(got, ArraySlots):
                return got.load(self.b)
            if isinstance(got, ArrayArg):
                return got
        elif isinstance(node, (ast.Call, ast.Subscript)):
            return self.array_operand(node, scope)
        raise NotServed(f"array {ast.unparse(node)}")

    def view(self, array: ArrayArg, parts: list, scope: Scope) -> ArrayArg:
        """`a[i]`, `a[i, 2:5]`, `a[lo:hi]`: a C-contiguous view (integers on the leading
        axes, then at most one slice of step 1, then whole axes); Numba's rules for negative
        indices and for slice bounds out of range (clipped)."""
        b = self.b
        i64 = LL[I64]
        if len(parts) > len(array.dims) or any(
            isinstance(p, ast.Constant) and p.value is None for p in parts
        ):
            raise NotServed("an index with more parts than axes, or None")
        offset = ir.Constant(i64, 0)
        dims = []
        sliced = False
        for k, (part, n) in enumerate(zip(parts, array.dims)):
            if isinstance(part, ast.Slice):
                whole = part.lower is None and part.upper is None
                if part.step is not None or (sliced and not whole):
                    raise NotServed("a slice that is not C-contiguous")
                start, length = self.slice_bounds(part, n, scope)
                dims.append(length)
                sliced = True
            else:
                if sliced:
                    raise NotServed("an integer index after a slice")
                start = self.index(part, n, scope)
            offset = b.add(b.mul(offset, n), start) if k else start
        for n in array.dims[len(parts) :]:
            offset = b.mul(offset, n)
            dims.append(n)
        data = b.gep(array.data, [offset], inbounds=True)
        return ArrayArg(data, dims, array.t, None)

    def index(self, part: ast.expr, n: ir.Value, scope: Scope) -> ir.Value:
        """An integer index; negative ones count from the end (as Numba wraps them)."""
        i = self.scalar(part, scope)
        if is_float(i.t):
            raise NotServed("a float index")
        unsigned = i.t == U64
        i = self.convert(i, I64).v
        if unsigned or (isinstance(i, ir.Constant) and i.constant >= 0):
            return i
        b = self.b
        return b.select(b.icmp_signed("<", i, ir.Constant(LL[I64], 0)), b.add(i, n), i)

    def slice_bounds(self, part: ast.Slice, n: ir.Value, scope: Scope) -> tuple:
        """(start, length) of `lo:hi` on an axis of length n, as Numba computes them."""
        b = self.b
        zero = ir.Constant(LL[I64], 0)

        def bound(node, default):
            if node is None:
                return default
            v = self.convert(self.scalar(node, scope), I64).v
            v = b.select(b.icmp_signed("<", v, zero), b.add(v, n), v)
            v = b.select(b.icmp_signed("<", v, zero), zero, v)
            return b.select(b.icmp_signed(">", v, n), n, v)

        start, stop = bound(part.lower, zero), bound(part.upper, n)
        length = b.sub(stop, start)
        return start, b.select(b.icmp_signed("<", length, zero), zero, length)

    def element(self, e: ast.Subscript, scope: Scope) -> tuple[ArrayArg, ir.Value]:
        array = self.array(e.value, scope)
        parts = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
        if not parts and not array.dims:  # a 0-d array's element, a[()]
            return array, self.b.gep(array.data, [ir.Constant(LL[I64], 0)], inbounds=True)
        if len(parts) != len(array.dims) or not parts:
            raise NotServed("an index other than one integer per axis")
        b = self.b
        flat = None
        for k, part in enumerate(parts):
            if isinstance(part, ast.Slice):
                raise NotServed("a slice")
            i = self.index(part, array.dims[k], scope)
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
        if isinstance(op, ast.Mod):
            return self.modulo(x, y)
        f = {ast.Add: b.add, ast.Sub: b.sub, ast.Mult: b.mul}.get(type(op))
        if f is None:
            raise NotServed(f"integer operator {type(op).__name__}")
        return Val(f(x.v, y.v), t)

    def modulo(self, x: Val, y: Val) -> Val:
        """x % y of integers by a constant other than 0: Python's (and Numba's) sign rule."""
        if not (isinstance(y.v, ir.Constant) and y.v.constant != 0):
            raise NotServed("% by a value that may be 0")
        b = self.b
        if x.t == U64:
            return Val(b.urem(x.v, y.v), U64)
        rem = b.srem(x.v, y.v)
        zero = ir.Constant(LL[x.t], 0)
        fix = b.and_(
            b.icmp_signed("!=", rem, zero),
            b.icmp_signed("<", b.xor(rem, y.v), zero),
        )
        return Val(b.select(fix, b.add(rem, y.v), rem), x.t)

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
        if t in (BOOL, U64):
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
    def call_function(self, name: str, args: list) -> tuple:
        return FunctionCalls.call(self, name, args)

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
        if name in self.functions:
            return self.call_function(name, [self.operand(a, scope) for a in e.args])
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
        return self.scalar_call(name, [self.scalar(a, scope) for a in e.args], e)

    def scalar_call(self, name: str | None, args: list, e: ast.Call) -> Val:
        """A builtin, NumPy or math function of scalars."""
        b = self.b
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
        if name in ("min", "max") and len(args) == 2:
            return self.integer_extremum(name, *args)
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

    def integer_extremum(self, name: str, x: Val, y: Val) -> Val:
        """Python's min and max of integers (the first of equals)."""
        t = unify(x.t, y.t)
        if is_float(t) or t == BOOL:
            raise NotServed(f"{name} of {t}")
        x, y = self.convert(x, t), self.convert(y, t)
        symbol = "<" if name == "min" else ">"
        before = (self.b.icmp_unsigned if t == U64 else self.b.icmp_signed)(symbol, y.v, x.v)
        return Val(self.b.select(before, y.v, x.v), t)

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
        fn = self._fast_functions.get(key) or self.module.globals.get(
            f"gradtape_fast_{name}_f{width}"
        )  # (made for another kernel of the module)
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
            inner = Translator(self.module, Builder(body_block), Builder(entry_block))
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


def rebound_names(node: ast.FunctionDef) -> set[str]:
    """Names a function binds more than once, or inside a loop: arrays bound to them live
    in slots (ArraySlots); the others are bound once, as values."""
    counts: dict[str, int] = {}

    def visit(stmts: list, weight: int) -> None:
        for st in stmts:
            targets = st.targets if isinstance(st, ast.Assign) else []
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        counts[n.id] = counts.get(n.id, 0) + weight
            inner = 2 if isinstance(st, (ast.For, ast.While)) else weight
            for field_name in ("body", "orelse"):
                visit(getattr(st, field_name, []) or [], inner)

    visit(node.body, 1)
    return {name for name, count in counts.items() if count > 1}


def _kinds(args: list) -> tuple:
    """The argument kinds a module function is specialized on (as Numba specializes it)."""
    kinds = []
    for a in args:
        if isinstance(a, ArrayArg):
            kinds.append(("array", a.t, len(a.dims)))
        elif isinstance(a, Val):
            kinds.append(("scalar", a.t))
        else:
            raise NotServed("a call argument other than an array or a scalar")
    return tuple(kinds)


class FunctionCalls:
    """Calls between the functions of one module (a loop driver calling its step kernels):
    each callee is an LLVM function of its own, specialized on its arguments' kinds
    (arrays pass their data pointer, dims and flags), that writes the scalars it returns
    (a tuple: the status first) into an area its caller passes. LLVM inlines it or not;
    either way its arithmetic is the kernel's own."""

    @staticmethod
    def call(tr: Translator, name: str, args: list) -> tuple:
        fn, types = FunctionCalls.function(tr, name, _kinds(args))
        b = tr.b
        i64 = LL[I64]
        area = tr.entry.alloca(ir.ArrayType(i64, max(1, len(types))), name=f"{name}.result")
        ll_args = []
        for a in args:
            if isinstance(a, ArrayArg):
                ll_args += [a.data, *a.dims, a.flags if a.flags is not None else C_FLAGS]
            else:
                ll_args.append(a.v)
        b.call(fn, ll_args + [b.bitcast(area, ir.IntType(8).as_pointer())])
        values = []
        for k, t in enumerate(types):
            slot = b.gep(area, [ir.Constant(i64, 0), ir.Constant(i64, k)])
            values.append(Val(b.load(b.bitcast(slot, LL[t].as_pointer())), t))
        return tuple(values)

    @staticmethod
    def function(tr: Translator, name: str, kinds: tuple) -> tuple:
        key = (name, kinds)
        if key in tr.compiled:
            if tr.compiled[key] is None:
                raise NotServed(f"{name} calls itself")
            return tr.compiled[key]
        tr.compiled[key] = None
        node = tr.functions[name]
        if len(node.args.args) != len(kinds) or node.args.defaults:
            raise NotServed(f"call of {name} with {len(kinds)} arguments")
        params = []
        for kind in kinds:
            if kind[0] == "array":
                params += [STORE[kind[1]].as_pointer()] + [LL[I64]] * kind[2] + [C_FLAGS.type]
            else:
                params.append(LL[kind[1]])
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), params + [i8p])
        fn = ir.Function(tr.module, fnty, name=f"gradtape_fn_{name}_{len(tr.compiled)}")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        inner = FunctionCalls.translator(tr, fn)
        inner.rebound = rebound_names(node)
        scope = FunctionCalls.parameters(inner, node, kinds, fn.args)
        returns: list = []
        ret_block = fn.append_basic_block("return")

        def on_return(value, builder, free_buffers) -> None:
            if not isinstance(value, tuple) or not all(isinstance(v, Val) for v in value):
                raise NotServed(f"{name} returns other than a tuple of scalars")
            free_buffers()
            returns.append((value, builder.block))
            builder.branch(ret_block)

        status_block = []  # (one block: the caller reads the status only)

        def status_exit(builder, free_buffers) -> None:
            if not status_block:
                status_block.append(fn.append_basic_block("status"))
            builder.branch(status_block[0])

        inner.on_return = on_return
        inner.status_exit = status_exit
        inner.body(node.body, scope, nested=False)
        if not inner.b.block.is_terminated or not returns:
            raise NotServed(f"{name} may end without a return")
        types = FunctionCalls.finish(inner, returns, ret_block, fn.args[-1])
        if status_block:  # every buffer, freed (those not made yet are NULL)
            inner.b.position_at_end(status_block[0])
            inner.free_buffers()
            status_slot = inner.b.bitcast(fn.args[-1], LL[I64].as_pointer())
            inner.b.store(ir.Constant(LL[I64], STATUS_CHECK), status_slot)
            inner.b.ret_void()
        inner.entry.branch(fn.blocks[1])
        if inner.wide_vectors:
            set.add(fn.attributes, '"prefer-vector-width"="512"')
        tr.large_loops += inner.large_loops
        tr.compiled[key] = (fn, types)
        return fn, types

    @staticmethod
    def translator(tr: Translator, fn: ir.Function) -> Translator:
        entry_block = fn.append_basic_block("entry")
        body_block = fn.append_basic_block("body")
        inner = Translator(tr.module, Builder(body_block), Builder(entry_block))
        inner._fast_functions = tr._fast_functions
        inner.functions = tr.functions
        inner.compiled = tr.compiled
        inner.markers = tr.markers + 1000 * len(tr.compiled)  # (distinct loop markers)
        inner.top_block = body_block
        return inner

    @staticmethod
    def parameters(inner: Translator, node: ast.FunctionDef, kinds: tuple, args) -> Scope:
        scope = Scope({}, ())
        position = 0
        for param, kind in zip(node.args.args, kinds):
            if kind[0] == "array":
                data, *dims = args[position : position + kind[2] + 2]
                flags = dims.pop()
                scope.values[param.arg] = ArrayArg(data, list(dims), kind[1], flags)
                position += kind[2] + 2
            else:
                slot = inner.entry.alloca(LL[kind[1]], name=param.arg)
                inner.b.store(args[position], slot)
                scope.vars[param.arg] = (slot, kind[1])
                position += 1
        return scope

    @staticmethod
    def finish(inner: Translator, returns: list, ret_block: ir.Block, area) -> list:
        """Merge the returned tuples (one type per position), store them into the area."""
        n = len(returns[0][0])
        if not all(len(r) == n for r, _ in returns):
            raise NotServed("returns of several lengths")
        merged = [inner._merge([(r[k], blk) for r, blk in returns], ret_block) for k in range(n)]
        b = inner.b
        b.position_at_end(ret_block)
        i64 = LL[I64]
        base = b.bitcast(area, i64.as_pointer())
        for k, v in enumerate(merged):
            b.store(v.v, b.bitcast(b.gep(base, [ir.Constant(i64, k)]), LL[v.t].as_pointer()))
        b.ret_void()
        return [v.t for v in merged]


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
