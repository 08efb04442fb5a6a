"""The numpy backend: a Program becomes the source of one Python function calling NumPy.

Every intermediate is written into a buffer allocated once per variant and thread
(`np.exp(a, out=b3)`); buffers are reused once their value is dead. Results are
written straight into the caller's `out=` arrays, or into fresh arrays the caller
owns. Guards are `if` statements right after the value they test. The generated
function runs no Tracer and walks no tape. Primitives without a table entry below
call their own NumPy implementation, so every primitive is supported.
"""

from __future__ import annotations

import collections
import math
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import config
from ..core.errors import GuardFailure
from ..core.ir import Instruction, Var
from ..core.primitive import Primitive
from ..rules import elementwise, indexing, reductions, shape
from ..rules.indexing import is_basic
from .lengths import equal_constants, rebinding, remember_lowering, replaced
from .program import Program, tree_expr

BUFFER, VIEW, VALUE = "buffer", "view", "value"  # how an emitter produces its output


@dataclass(frozen=True)
class Emitter:
    """How to lower one primitive: `emit(gen, ins, out, args) -> lines`.

    kind BUFFER writes into `out` (a preallocated array); VIEW and VALUE assign `out`
    (a view of an input, or a value that may share memory with its inputs). `inplace`: which
    arguments' buffers the output may take over when they die here: ANY (elementwise
    ufuncs), FIRST (copy argument 0, then write into it), SECOND (argument 1 only), or NONE.
    """

    kind: str
    emit: Callable
    inplace: str = "none"


ANY, FIRST, SECOND, NONE = "any", "first", "second", "none"  # Emitter.inplace


# --- the generator ---------------------------------------------------------------------------
class _Source:
    """Source lines plus the constants they refer to (bound once, as closure variables)."""

    def __init__(self):
        self.consts: dict[str, object] = {}
        self._by_id: dict[int, str] = {}

    def const(self, value, hint: str = "c") -> str:
        """An expression for `value`: a literal for plain Python scalars, else a bound name."""
        t = type(value)
        if value is None or t is bool or t is int or (t is float and math.isfinite(value)):
            return repr(value)
        if t is str:
            return repr(value)
        name = self._by_id.get(id(value))
        if name is None:
            if hint in ("c", "f") and callable(value):
                hint = _ident(getattr(value, "__name__", hint)) + "_"
            name = f"{hint}{len(self.consts)}"
            self.consts[name] = value
            self._by_id[id(value)] = name
        return name


def _call(gen: _Source, fn, args, kwargs=None, hint="f") -> str:
    parts = list(args) + [f"{k}={gen.const(v)}" for k, v in (kwargs or {}).items()]
    return f"{gen.const(fn, hint)}({', '.join(parts)})"


# --- emitters ---------------------------------------------------------------------------------
# NumPy deprecates a positional `out` for these; for the others it saves a keyword dictionary
_KEYWORD_OUT = frozenset({np.maximum, np.minimum})


def _ufunc_emitter(ufunc) -> Emitter:
    """A ufunc writing into its buffer; an elementwise one may overwrite a dying input (a
    generalized ufunc such as matmul reads whole rows: never in place)."""
    out_arg = "out={}" if ufunc in _KEYWORD_OUT else "{}"

    def emit(gen, ins, out, args):
        args = _scalars_as_arrays(gen, ufunc, ins, args)
        return [
            f"{gen.const(ufunc, 'u_' + _ident(ufunc.__name__) + '_')}({', '.join(args)}, "
            f"{out_arg.format(out)})"
        ]

    return Emitter(BUFFER, emit, inplace=ANY if ufunc.signature is None else NONE)


def _scalars_as_arrays(gen: _Source, ufunc, ins: Instruction, args: list) -> list:
    """Constant scalars as 0-d arrays of the dtype the ufunc would convert them to.

    A Python scalar operand is converted (and for floats, cast by a slower loop) on every
    call; a 0-d array of the resolved dtype gives the same numbers and runs the fast loop.
    """
    consts = [
        i
        for i, v in enumerate(ins.invars)
        if v is None
        and (type(ins.args[i]) in (int, float, complex) or isinstance(ins.args[i], np.generic))
    ]
    if not consts:
        return args
    try:
        dtypes = ufunc.resolve_dtypes(
            tuple(
                v.dtype
                if v is not None
                else type(a)
                if type(a) in (int, float, complex)
                else np.asarray(a).dtype
                for v, a in zip(ins.invars, ins.args)
            )
            + (None,) * ufunc.nout
        )
        args = list(args)
        for i in consts:
            a = np.array(ins.args[i], dtype=dtypes[i])
            a.flags.writeable = False
            args[i] = gen.const(a, "k")
    except (TypeError, ValueError, OverflowError):
        return args
    return args


# --- 0-d values: NumPy scalars, no buffer (a ufunc call on a 0-d array costs ~1 us) -----------
_SCALAR_OPERATORS = {
    elementwise.add: "{0} + {1}",
    elementwise.subtract: "{0} - {1}",
    elementwise.multiply: "{0} * {1}",
    elementwise.divide: "{0} / {1}",
    elementwise.negative: "-{0}",
    elementwise.square: "{0} * {0}",
}
_F64 = np.dtype(np.float64)


def _is_float64_operand(v, a) -> bool:
    if v is not None:
        return v.dtype == _F64
    return type(a) in (int, float) or type(a) is np.float64


def _scalar_emitter(ins: Instruction, ufunc) -> Emitter | None:
    """For an elementwise op on 0-d values: an operator (+ - * / are exactly rounded, so
    NumPy's scalar arithmetic equals the ufunc) or the ufunc without a buffer."""
    if ins.outvars[0].shape != () or any(v is not None and v.shape != () for v in ins.invars):
        return None
    pattern = _SCALAR_OPERATORS.get(ins.prim)
    if (
        pattern is not None
        and ins.outvars[0].dtype == _F64
        and all(_is_float64_operand(v, a) for v, a in zip(ins.invars, ins.args))
    ):
        return Emitter(VALUE, lambda gen, ins, out, args: [f"{out} = {pattern.format(*args)}"])
    return Emitter(
        VALUE,
        lambda gen, ins, out, args: [
            f"{out} = {gen.const(ufunc, 'u_' + _ident(ufunc.__name__) + '_')}({', '.join(args)})"
        ],
    )


def _scalar_where(ins: Instruction) -> Emitter | None:
    """np.where on 0-d values of the output's dtype: a conditional expression."""
    out = ins.outvars[0]
    if (
        out.shape != ()
        or any(v is not None and v.shape != () for v in ins.invars)
        or any(v is not None and v.dtype != out.dtype for v in ins.invars[1:])
    ):
        return None

    def emit(gen, ins, out_name, args):
        x, y = (
            args[i] if ins.invars[i] is not None else gen.const(out.dtype.type(ins.args[i]))
            for i in (1, 2)
        )
        return [f"{out_name} = {x} if {args[0]} else {y}"]

    return Emitter(VALUE, emit)


def _reduction(ufunc) -> Emitter:
    def emit(gen, ins, out, args):
        p = ins.params
        call = (
            f"{gen.const(ufunc.reduce, 'r_' + _ident(ufunc.__name__) + '_')}({args[0]}, "
            f"{gen.const(tuple(p['axes']), 'axes')}"
        )
        if ins.outvars[0].shape == ():  # a NumPy scalar: cheaper to use than a 0-d buffer
            return [f"{out} = {call})"]
        return [f"{call}, None, {out}, {p['keepdims']!r})"]

    return emit


def _cumulative(fn) -> Emitter:
    return Emitter(
        BUFFER,
        lambda gen, ins, out, args: [
            f"{gen.const(fn)}({args[0]}, {ins.params['axis']!r}, None, {out})"
        ],
    )


def _copy_then(update: Callable) -> Emitter:
    """Copy argument 0 into the buffer (unless it is that buffer, dying here: y[i] = v on a
    temporary updates it in place), then update it (functional writes)."""

    def emit(gen, ins, out, args):
        copy = [] if out == args[0] else [f"{gen.const(np.copyto, 'copyto')}({out}, {args[0]})"]
        return copy + update(gen, ins, out, args)

    return Emitter(BUFFER, emit, inplace=FIRST)


def _setitem_update(gen, ins, out, args):
    return [f"{out}[{gen.const(ins.params['idx'], 'idx')}] = {args[1]}"]


def _scatter_add_update(gen, ins, out, args):
    idx = ins.params["idx"]
    if is_basic(idx):
        return [f"{out}[{gen.const(idx, 'idx')}] += {args[1]}"]
    return [f"{gen.const(np.add.at, 'add_at')}({out}, {gen.const(idx, 'idx')}, {args[1]})"]


def _emit_where(gen, ins, out, args):
    copyto = gen.const(np.copyto, "copyto")
    return [
        f"{copyto}({out}, {args[2]}, 'unsafe')",
        f"{copyto}({out}, {args[1]}, 'unsafe', {args[0]})",
    ]


def _emit_pad(gen, ins, out, args):
    shape = ins.invars[0].shape if ins.invars[0] is not None else np.shape(ins.args[0])
    inner = tuple(slice(lo, lo + d) for (lo, _), d in zip(ins.params["pad_width"], shape))
    return [
        f"{out}.fill({gen.const(ins.params['value'])})",
        f"{out}[{gen.const(inner, 'idx')}] = {args[0]}",
    ]


def _take_axis(idx) -> tuple[int, np.ndarray] | None:
    """(axis, indices) when `idx` is full slices and one integer array: a `np.take`."""
    axis, arr = None, None
    for k, i in enumerate(idx):
        if isinstance(i, np.ndarray) and i.dtype.kind in "iu" and arr is None:
            axis, arr = k, i
        elif not (isinstance(i, slice) and i == slice(None)):
            return None
    return None if arr is None else (axis, arr)


def _lower_getitem(ins: Instruction) -> Emitter:
    idx = ins.params["idx"]
    take = _take_axis(idx)
    if take is not None and ins.invars[0] is not None:
        axis, arr = take
        # the indices were valid when recorded, for this very shape: mode="wrap" equals "raise"
        return Emitter(
            BUFFER,
            lambda gen, ins, out, args: [
                f"{gen.const(np.take, 'take')}({args[0]}, {gen.const(arr, 'idx')}, {axis}, {out}, "
                "'wrap')"
            ],
        )
    kind = VIEW if is_basic(idx) else VALUE
    return Emitter(
        kind, lambda gen, ins, out, args: [f"{out} = {args[0]}[{gen.const(idx, 'idx')}]"]
    )


def _view(fn, param: str) -> Emitter:
    return Emitter(
        VIEW,
        lambda gen, ins, out, args: [
            f"{out} = {gen.const(fn)}({args[0]}, {gen.const(ins.params[param])})"
        ],
    )


def _emit_concatenate(gen, ins, out, args):
    return [f"{gen.const(np.concatenate)}(({', '.join(args)},), {ins.params['axis']!r}, {out})"]


def _emit_astype(gen, ins, out, args):
    return [f"{gen.const(np.copyto, 'copyto')}({out}, {args[0]}, 'unsafe')"]


def _zero_nan_products(d, g) -> None:
    """In place on d = g * p: 0 where g is 0 and p is not finite (nan_safe_multiply's rule),
    which is where d is NaN and g is 0 (0 times a finite p is 0): p is not needed, so d may
    take over p's buffer."""
    np.copyto(d, 0, where=np.isnan(d) & np.equal(g, 0))


_smallest = np.minimum.reduce  # NaN when any entry is NaN (NumPy's minimum propagates NaN)


def _shape_of(ins: Instruction, i: int) -> tuple:
    v = ins.invars[i]
    return v.shape if v is not None else np.shape(ins.args[i])


def _tests_the_product(ins: Instruction) -> bool:
    """Whether the NaN test of a product looks at the product itself (a NaN in it), rather than
    at a factor broadcast against the other (a scalar, say), which is cheaper to test: a g
    with no zero, or a finite p, needs no mask."""
    size = math.prod(ins.outvars[0].shape)
    return all(2 * math.prod(_shape_of(ins, i)) > size for i in (0, 1))


def _nan_test(gen, value: str, shape: tuple) -> str:
    """A condition true when `value` (of `shape`) holds a NaN: NumPy's minimum propagates NaN,
    and its reduce is cheaper than isnan(...).any() (no boolean array)."""
    isnan = gen.const(np.isnan, "isnan")
    if shape == ():
        return f"{isnan}({value})"
    return f"{isnan}({gen.const(_smallest, 'smallest')}({value}, None))"


def _emit_nan_safe_multiply(gen, ins, out, args):
    """d = g * p, then the mask only when it changes something, tested inline on the smallest
    of: a g broadcast against a larger p (a zero in it?), a p broadcast against a larger g (all
    finite?), or the product (a zero times an infinite or NaN p is a NaN of the product, so a
    product whose minimum is not NaN needs none)."""
    size = math.prod(ins.outvars[0].shape)
    g_shape, p_shape = _shape_of(ins, 0), _shape_of(ins, 1)
    if 2 * math.prod(g_shape) <= size and math.prod(g_shape) <= math.prod(p_shape):
        test = f"{args[0]} == 0" if g_shape == () else f"not {gen.const(np.all, 'all')}({args[0]})"
    elif 2 * math.prod(p_shape) <= size:
        finite = f"{gen.const(np.isfinite, 'isfinite')}({args[1]})"
        test = f"not {finite}" if p_shape == () else f"not {finite}.all()"
    else:
        test = _nan_test(gen, out, ins.outvars[0].shape)
    return [*_emit_plain_product(gen, ins, out, args), f"if {test}: {_zero_call(gen, out, args)}"]


def _zero_call(gen, out: str, args: list[str]) -> str:
    return f"{gen.const(_zero_nan_products, 'zero_nan_products')}({out}, {args[0]})"


def _emit_plain_product(gen, ins, out, args):
    return [f"{gen.const(np.multiply, 'multiply')}({args[0]}, {args[1]}, {out})"]


def _emit_scalar_nan_safe_multiply(gen, ins, out, args):
    """On 0-d float64 values: the product, and 0 where it is NaN because g is 0 (a NaN product
    with g == 0 means p was infinite or NaN: exactly the masked case)."""
    g, p = args
    return [f"{out} = {g} * {p}", f"if {out} != {out} and {g} == 0: {out} = 0.0"]


def _nan_safe_multiply_entry(ins: Instruction) -> Emitter:
    if (
        ins.outvars[0].shape == ()
        and ins.outvars[0].dtype == _F64
        and all(
            (v is None or v.shape == ()) and _is_float64_operand(v, a)
            for v, a in zip(ins.invars, ins.args)
        )
    ):
        return Emitter(VALUE, _emit_scalar_nan_safe_multiply)
    return Emitter(BUFFER, _emit_nan_safe_multiply, SECOND)


def _emit_identity(gen, ins, out, args):
    return [f"{out} = {args[0]}"]


def _reduction_entry(ufunc) -> Callable[[Instruction], Emitter]:
    emit = _reduction(ufunc)
    return lambda ins: Emitter(VALUE if ins.outvars[0].shape == () else BUFFER, emit)


def _always(emitter: Emitter) -> Callable[[Instruction], Emitter]:
    return lambda ins: emitter


_WHERE = Emitter(BUFFER, _emit_where)
_IDENTITY = Emitter(VIEW, _emit_identity)

# primitive -> its emitter for an instruction; the others: ufuncs into their buffer, identities
# forwarded, everything else through the primitive's own implementation (`emitter_for`)
EMITTERS: dict[Primitive, Callable[[Instruction], Emitter]] = {
    indexing.getitem_p: lambda ins: _lower_getitem(ins),
    reductions.reduce_sum: _reduction_entry(np.add),
    reductions.reduce_prod: _reduction_entry(np.multiply),
    reductions.reduce_max: _reduction_entry(np.maximum),
    reductions.reduce_min: _reduction_entry(np.minimum),
    reductions.cumsum_p: _always(_cumulative(np.cumsum)),
    reductions.cumprod_p: _always(_cumulative(np.cumprod)),
    indexing.where_p: lambda ins: _scalar_where(ins) or _WHERE,
    shape.concatenate_p: _always(Emitter(BUFFER, _emit_concatenate)),
    # the product into its buffer, then the mask in place where needed (not a fresh array)
    elementwise.nan_safe_multiply_p: _nan_safe_multiply_entry,
    shape.astype_p: _always(Emitter(BUFFER, _emit_astype)),
    indexing.setitem_p: _always(_copy_then(_setitem_update)),
    indexing.scatter_add_p: _always(_copy_then(_scatter_add_update)),
    shape.pad_p: _always(Emitter(BUFFER, _emit_pad)),
    shape.reshape_p: _always(_view(np.reshape, "shape")),
    shape.transpose_p: _always(_view(np.transpose, "axes")),
    shape.broadcast_p: _always(_view(np.broadcast_to, "shape")),
}


def _fallback(gen, ins, out, args):
    """Call the primitive's own implementation (it may return a view: treated as one)."""
    impl = ins.prim.python_impl or ins.prim.impl  # loops: never their native drivers here
    return [f"{out} = {_call(gen, impl, args, ins.params, 'p_' + _ident(ins.prim.name))}"]


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def ufunc_of(prim):
    """The ufunc a primitive computes (NumPy's, or scipy.special's once scipy is imported),
    or None."""
    if isinstance(prim.impl, np.ufunc):
        return prim.impl
    if prim.partials is not None and "scipy.special" in sys.modules:
        uf = getattr(sys.modules["scipy.special"], prim.name, None)
        if isinstance(uf, np.ufunc):
            return uf
    return None


def emitter_for(ins: Instruction) -> Emitter:
    """The table entry for a primitive; ufuncs write into their buffer, others call impl."""
    prim = ins.prim
    if prim.multiple_results:
        return Emitter(VALUE, _fallback)
    entry = EMITTERS.get(prim)
    if entry is not None:
        return entry(ins)
    if prim.identity:
        return _IDENTITY
    uf = ufunc_of(prim)
    if uf is not None and uf.nout == 1:
        return (_scalar_emitter(ins, uf) if uf.signature is None else None) or _ufunc_emitter(uf)
    return Emitter(VALUE, _fallback)


# --- storage planning --------------------------------------------------------------------------
@dataclass
class _Plan:
    emitters: list[Emitter]
    names: dict[int, str]  # var id -> the expression that holds it
    slots: list[tuple[tuple, np.dtype]]  # pooled buffers: shape, dtype
    direct: dict[int, int]  # var id -> output leaf index it is written into
    tested_at_sum: dict[int, int]  # a NaN-safe product's index -> the sum that tests for it


def _plan(program: Program, input_names: list[str]) -> _Plan:
    instrs = program.instructions
    emitters = [emitter_for(ins) for ins in instrs]
    names = {v.id: n for v, n in zip(program.inputs, input_names)}
    direct = _written_into_results(program, emitters)
    last = _last_uses(program)
    tested_at_sum = _products_tested_at_their_sum(program, emitters, last)
    for i, j in tested_at_sum.items():  # g stays whole until the sum, which may redo d
        g = instrs[i].invars[0]
        if g is not None:
            last[g.id] = max(last[g.id], j)
    storage, owner_last = _buffer_owners(instrs, emitters, last)
    frees_after: dict[int, list[int]] = {}
    for o, i in owner_last.items():
        frees_after.setdefault(i, []).append(o)

    slots: list[tuple[tuple, np.dtype]] = []
    free: dict[tuple, list[int]] = {}
    slot_of: dict[int, int] = {}
    handed_on: set[int] = set()  # buffers taken over in place by the instruction's output
    for i, (ins, e) in enumerate(zip(instrs, emitters)):
        for j, v in enumerate(ins.outvars):
            if e.kind != BUFFER:
                names[v.id] = f"v{v.id}" if len(ins.outvars) == 1 else f"v{v.id}_{j}"
            elif v.id in direct:
                names[v.id] = f"o{direct[v.id]}"
            else:
                key = (v.shape, v.dtype)
                slot = (
                    None
                    if e.inplace == NONE
                    else _in_place_slot(ins, i, key, e.inplace, slot_of, storage, owner_last)
                )
                if slot is not None:
                    handed_on.add(slot)
                else:
                    pool = free.get(key)
                    slot = pool.pop() if pool else None
                if slot is None:
                    slot = len(slots)
                    slots.append(key)
                slot_of[v.id] = slot
                names[v.id] = f"b{slot}"
        for o in frees_after.get(i, ()):
            slot = slot_of.get(o)
            if slot is not None and slot not in handed_on:
                free.setdefault(slots[slot], []).append(slot)
        handed_on.clear()
    return _Plan(emitters, names, slots, direct, tested_at_sum)


def _written_into_results(program: Program, emitters) -> dict[int, int]:
    """Results computed into a buffer that can be written straight into the result arrays:
    var id -> output leaf index."""
    input_ids = {v.id for v in program.inputs}
    buffered = {
        ins.outvars[0].id for ins, e in zip(program.instructions, emitters) if e.kind == BUFFER
    }
    direct: dict[int, int] = {}
    for k, leaf in enumerate(program.outputs):
        v = leaf.var
        if v is not None and v.id in buffered and v.id not in direct and v.id not in input_ids:
            direct[v.id] = k
    return direct


def _last_uses(program: Program) -> dict[int, int]:
    """Var id -> the last instruction (or check) that reads it; results live to the end."""
    last: dict[int, int] = {}
    for i, ins in enumerate(program.instructions):
        for v in ins.invars:
            if v is not None:
                last[v.id] = i
    for c in program.checks:
        if isinstance(c.operand, Var):
            last[c.operand.id] = max(last.get(c.operand.id, -1), c.position)
    for leaf in program.outputs:
        if leaf.var is not None:
            last[leaf.var.id] = len(program.instructions)
    return last


def _buffer_owners(instrs, emitters, last: dict) -> tuple[dict, dict]:
    """Which buffers each var may share memory with (a view or value shares its inputs'), and
    when each buffer is last needed."""
    storage: dict[int, frozenset] = {}
    owner_last: dict[int, int] = {}
    for i, (ins, e) in enumerate(zip(instrs, emitters)):
        if e.kind == BUFFER:
            owners = frozenset((ins.outvars[0].id,))
        else:
            owners = frozenset().union(
                *(storage.get(v.id, frozenset()) for v in ins.invars if v is not None)
            )
        for v in ins.outvars:
            storage[v.id] = owners
            for o in owners:
                owner_last[o] = max(owner_last.get(o, i), last.get(v.id, i))
    return storage, owner_last


def _products_tested_at_their_sum(program: Program, emitters, last: dict) -> dict[int, int]:
    """NaN-safe products read only by the sum right after them: instead of testing the product
    for a NaN (a pass over it), the sum is tested, which holds a NaN wherever the product did;
    only then is the product masked and summed again. Product index -> the sum's index."""
    instrs = program.instructions
    uses: dict[int, int] = {}
    for ins in instrs:
        for v in ins.invars:
            if v is not None:
                uses[v.id] = uses.get(v.id, 0) + 1
    tested = {}
    for i in range(len(instrs) - 1):
        ins, following = instrs[i], instrs[i + 1]
        d = ins.outvars[0]
        if (
            ins.prim is elementwise.nan_safe_multiply_p
            and emitters[i].kind == BUFFER
            and _tests_the_product(ins)
            and following.prim is reductions.reduce_sum
            and following.invars[0] is d
            and uses.get(d.id) == 1
            and last.get(d.id) == i + 1  # not an output, not read by a check
        ):
            tested[i] = i + 1
    return tested


def _in_place_slot(ins: Instruction, i: int, key: tuple, which: str, slot_of, storage, owner_last):
    """The buffer of an input that dies at instruction i and that the output can overwrite:
    same shape and dtype, a whole buffer (not a view), and not read through another operand
    (an exact overlap is safe for a ufunc; a partial one would make NumPy copy)."""
    candidates = {FIRST: ins.invars[:1], SECOND: ins.invars[1:2]}.get(which, ins.invars)
    for w in candidates:
        if (
            w is not None
            and w.id in slot_of
            and (w.shape, w.dtype) == key
            and storage.get(w.id) == frozenset((w.id,))
            and owner_last.get(w.id) == i
            and not any(
                u is not None and u.id != w.id and w.id in storage.get(u.id, ()) for u in ins.invars
            )
        ):
            return slot_of[w.id]
    return None


# --- checks -------------------------------------------------------------------------------------
def _check_lines(gen: _Source, index: int, kind: str, operand: str, answer) -> list[str]:
    fail = gen.const(GuardFailure, "GuardFailure")
    if kind == "bool":
        return [f"_a = bool({operand})", f"if _a is not {answer!r}: raise {fail}({index}, _a)"]
    raise_ = f"raise {fail}({index}, _a)"
    if kind in ("int", "index"):
        conv = "int" if kind == "int" else gen.const(operator.index, "index")
        return [f"_a = {conv}({operand})", f"if _a != {gen.const(answer)}: {raise_}"]
    if kind == "item":
        return [
            f"_a = {operand}.item()",
            f"if {gen.const(_item_differs, 'item_differs')}(_a, {gen.const(answer)}): {raise_}",
        ]
    if kind == "shape":
        return [
            f"_a = {gen.const(np.shape, 'shape_of')}({operand})",
            f"if _a != {gen.const(answer)}: {raise_}",
        ]
    # "value": the whole array the function read
    return [
        f"if not {gen.const(_same_value, 'same_value')}({operand}, {gen.const(answer)}): "
        f"raise {fail}({index}, {gen.const(np.array, 'array')}({operand}))"
    ]


def _item_differs(a, b) -> bool:
    return a != b and not (a != a and b != b)


def _same_value(x, answer: np.ndarray) -> bool:
    return np.shape(x) == answer.shape and bool(
        np.array_equal(x, answer, equal_nan=answer.dtype.kind in "fc")
    )


# --- lowering -------------------------------------------------------------------------------------
_CODE_CACHE_SIZE = 256
_code_cache: collections.OrderedDict = collections.OrderedDict()  # source -> code object


def compiled_source(source: str, filename: str):
    """Python's `compile` of generated `source`, shared by every variant that generates the
    same text (a new input length of one program usually does: its shapes are constants),
    so only the first pays the compile. The least recently used of at most 256 are kept."""
    code = _code_cache.get(source)
    if code is None:
        code = compile(source, filename, "exec")
        _code_cache[source] = code
        while len(_code_cache) > _CODE_CACHE_SIZE:
            try:
                _code_cache.popitem(last=False)
            except KeyError:  # (another thread emptied it)
                break
    else:
        try:
            _code_cache.move_to_end(source)
        except KeyError:  # (another thread dropped it meanwhile)
            pass
    return code


class NumpyLowered:
    """A compiled variant: `run(*leaves, out_leaves)` replays it; `source` is the generated code.

    `out_leaves` is None (return fresh results) or the caller's result arrays (return None).
    A failed guard raises GuardFailure.
    """

    def __init__(self, program: Program):
        rebind = rebinding(program, "numpy")
        if rebind is not None:  # the same program at another length: its code, rebound
            template, old, new = rebind
            self.source = template.source
            self._bind(
                template._code,
                {name: replaced(value, old, new) for name, value in template._consts.items()},
                [(replaced(shape, old, new), dtype) for shape, dtype in template._slots],
            )
            return
        gen = _Source()
        input_names = [f"x{i}" for i in range(len(program.inputs))]
        plan = _plan(program, input_names)
        body = self._body(gen, program, plan)
        self.source = self._assemble(gen, program, plan, input_names, body)
        self._bind(compiled_source(self.source, "<gradtape compiled>"), gen.consts, plan.slots)
        remember_lowering(program, "numpy", self, _same_at_length)

    def _bind(self, code, consts: dict, slots: list) -> None:
        """Make `run` from the generated code, its constants and its buffers' shapes."""
        self._code, self._consts, self._slots = code, consts, slots
        self.nbuffers = len(slots)
        namespace: dict = {}
        exec(code, namespace)
        # buffer sets kept between calls: one per thread calling at once, at most
        # GRADTAPE_BUFFER_SETS (a deque drops the oldest set beyond that)
        pool = self.pool = collections.deque(maxlen=config.buffer_sets())
        bound = dict(consts)
        bound.update(
            _pool_pop=pool.pop,
            _pool_push=pool.append,
            _alloc=lambda: [np.empty(s, d) for s, d in slots],
        )
        # run(*leaves, out_leaves): fresh results, or None after writing into out_leaves
        self.run = namespace["_build"](bound)

    def same_at_length(self, old: int, new: int, other: NumpyLowered) -> bool:
        """Whether `other` is this code with its shapes' length `old` replaced by `new`: the
        same source, constants and buffers (what a rebinding for `new` would give)."""
        return (
            self.source == other.source
            and [(replaced(s, old, new), d) for s, d in self._slots] == other._slots
            and self._consts.keys() == other._consts.keys()
            and all(
                equal_constants(replaced(v, old, new), other._consts[k])
                for k, v in self._consts.items()
            )
        )

    @staticmethod
    def _body(gen: _Source, program: Program, plan: _Plan) -> list[str]:
        names = plan.names

        def operand(x) -> str:
            return names[x.id] if isinstance(x, Var) else gen.const(x)

        checks_after: dict[int, list] = {}
        for index, c in enumerate(program.checks):
            checks_after.setdefault(c.position, []).append((index, c))
        lines = []

        def emit_checks(pos):
            for index, c in checks_after.get(pos, ()):
                lines.extend(_check_lines(gen, index, c.kind, operand(c.operand), c.answer))

        emit_checks(-1)
        for i, (ins, e) in enumerate(zip(program.instructions, plan.emitters)):
            args = [
                names[v.id] if v is not None else gen.const(a) for v, a in zip(ins.invars, ins.args)
            ]
            if len(ins.outvars) == 1 and not ins.prim.multiple_results:
                out = names[ins.outvars[0].id]
            else:
                out = ", ".join(names[v.id] for v in ins.outvars) + ","
            if i in plan.tested_at_sum:
                lines.extend(_emit_plain_product(gen, ins, out, args))
                product_args = args
            else:
                lines.extend(e.emit(gen, ins, out, args))
            if i - 1 in plan.tested_at_sum:  # the sum of a product not tested yet
                product = names[program.instructions[i - 1].outvars[0].id]
                lines.append(f"if {_nan_test(gen, out, ins.outvars[0].shape)}:")
                lines.append(f"    {_zero_call(gen, product, product_args)}")
                lines.extend("    " + line for line in e.emit(gen, ins, out, args))
            emit_checks(i)
        return lines

    @staticmethod
    def _assemble(gen: _Source, program: Program, plan: _Plan, input_names, body) -> str:
        names = plan.names
        outputs = program.outputs
        fresh_exprs, into_lines, alloc_lines = [], [], []
        for k, leaf in enumerate(outputs):
            if leaf.var is not None and plan.direct.get(leaf.var.id) == k:
                alloc_lines.append(
                    f"o{k} = {gen.const(np.empty, 'empty')}("
                    f"{gen.const(leaf.shape)}, {gen.const(leaf.dtype, 'dt')})"
                )
                fresh_exprs.append(f"o{k}[()]" if leaf.scalar else f"o{k}")
                continue
            src = names[leaf.var.id] if leaf.var is not None else gen.const(leaf.const)
            into_lines.append(f"o{k}[...] = {src}")
            if leaf.var is not None and leaf.scalar:
                fresh_exprs.append(
                    f"({src}[()] if {src}.__class__ is "
                    f"{gen.const(np.ndarray, 'ndarray')} else {src})"
                )
            elif leaf.var is not None:
                fresh_exprs.append(f"{gen.const(np.array, 'array')}({src})")
            elif isinstance(leaf.const, np.ndarray):
                fresh_exprs.append(f"{gen.const(np.array, 'array')}({src})")
            else:
                fresh_exprs.append(src)
        result = tree_expr(program.out_tree, iter(fresh_exprs), gen.const)

        inner = []
        if plan.slots:
            inner.append(f"{', '.join(f'b{j}' for j in range(len(plan.slots)))}, = B")
        if outputs:
            inner.append("if O is None:")
            inner.extend("    " + s for s in alloc_lines or ["pass"])
            inner.append("else:")
            inner.append(f"    {', '.join(f'o{k}' for k in range(len(outputs)))}, = O")
        inner.extend(body)
        inner.append("if O is None:")
        inner.append(f"    return {result}")
        inner.extend(into_lines)
        inner.append("return None")

        params = ", ".join(input_names + ["O"])
        lines = ["def _build(C):"]
        lines.extend(f"    {name} = C[{name!r}]" for name in gen.consts)
        if plan.slots:
            lines.extend(f"    {n} = C[{n!r}]" for n in ("_pool_pop", "_pool_push", "_alloc"))
        lines.append(f"    def run({params}):")
        if plan.slots:
            lines += [
                "        try:",
                "            B = _pool_pop()",
                "        except IndexError:",
                "            B = _alloc()",
                "        try:",
            ]
            lines.extend("            " + s for s in inner)
            lines += ["        finally:", "            _pool_push(B)"]
        else:
            lines.extend("        " + s for s in inner)
        lines.append("    return run")
        return "\n".join(lines) + "\n"


def _same_at_length(template: NumpyLowered, old: int, new: int, lowered: NumpyLowered) -> bool:
    return template.same_at_length(old, new, lowered)


def lower(program: Program) -> NumpyLowered:
    """Lower a Program to generated NumPy code (the backend entry point)."""
    return NumpyLowered(program)
