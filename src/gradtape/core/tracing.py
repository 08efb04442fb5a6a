"""Trace levels, recording, and the thread-local stack of levels.

Tracing is eager and nested: each level (a `grad`, a `jvp`, a `trace`/`compile`)
owns a tape. A Tracer of level L holds the value one level down, which may itself
be a Tracer of a lower level; `bind` records an instruction at the highest level
among its arguments and computes the value by binding again one level down.
"""

from __future__ import annotations

import enum
import operator
import os
import sys
import threading
import weakref

import numpy as np

from . import collector, routes
from .errors import GradtapeError, TracedAttributeError
from .ir import Guard, Instruction, Released, Tape, Var

_state = threading.local()
_level_counter = iter(range(1, 1 << 62))
_counter_lock = threading.Lock()


class LevelKind(enum.Enum):
    """What a level records.

    DIFFERENTIATE: only what has a derivative (grad, vjp, jvp, jacobians): reverse mode walks
        the tape backwards, forward mode pushes tangents along it.
    STAGE: every operation, integer and boolean values too, because the tape is replayed on
        new inputs (trace, compile).
    LOOP_BODY: like STAGE, for a loop body recorded once; Tracers of outer levels the body
        closes over become inputs of its own (closure conversion).
    BATCH: vmap. Records nothing: a Tracer of this level stands for one member of a batch and
        holds the whole batch (batch axis first) one level down; `bind` applies the
        primitive's batching rule to it (`batch_bind`).
    """

    DIFFERENTIATE = "differentiate"
    STAGE = "stage"
    LOOP_BODY = "loop body"
    BATCH = "batch"


class Level:
    """One tracing level. `record_all`: also record values with no derivative (for replay)."""

    __slots__ = (
        "id",
        "kind",
        "tape",
        "active",
        "record_all",
        "captures",
        "_nvars",
        "_frozen",
        "batch_size",
        "releases",
        "differentiates",
        "__weakref__",
    )

    def __init__(self, kind: LevelKind, batch_size: int | None = None):
        with _counter_lock:
            self.id = next(_level_counter)
        self.kind = kind
        # staging levels (trace, compile) and loop bodies keep every operation
        self.record_all = kind is not LevelKind.DIFFERENTIATE
        # a loop-body level turns outer Tracers into inputs of its own (closure conversion)
        self.captures = {} if kind is LevelKind.LOOP_BODY else None
        self.tape = Tape()
        self.active = True
        self._nvars = 0
        self._frozen = None  # id -> (array, read-only copy): see freeze
        self.batch_size = batch_size  # BATCH levels: the size of the batch axis
        # only the reverse interpreter reads this tape (grad, vjp): values its rules do not
        # read are released as they are recorded (see release_unread)
        self.releases = False
        # an open DIFFERENTIATE level (grad, jvp): `bind` records on it by its short path
        # (`_record_differentiated`); False once the level is closed
        self.differentiates = kind is LevelKind.DIFFERENTIATE and batch_size is None

    def new_var(self, value) -> Var:
        try:
            v = Var(self._nvars, value.shape, value.dtype)
        except AttributeError:  # a Python scalar
            v = Var(self._nvars, np.shape(value), _dtype_of(value))
        self._nvars += 1
        return v

    def new_batched_var(self, value) -> Var:
        """The Var of one member of the batch `value` (batch axis first): BATCH levels."""
        v = Var(self._nvars, value.shape[1:], value.dtype)
        self._nvars += 1
        return v

    def new_input(self, value):
        """Wrap `value` as an input Tracer of this level."""
        var = self.new_var(value)
        self.tape.inputs.append(var)
        return Tracer(value, var, self)

    def capture(self, outer):
        """The Var standing for a Tracer of an outer level used inside a body being recorded."""
        hit = self.captures.get(id(outer))
        if hit is None:
            value = example_value(outer)  # a member of a vmap batch: one member's value
            hit = self.captures[id(outer)] = (self.new_var(value), outer, value)
            self.tape.captured.append(hit)
        return hit

    def freeze(self, a: np.ndarray) -> np.ndarray:
        """A read-only copy of a writable constant array an instruction keeps.

        The caller may write into the array later in the same call (a scratch buffer), and the
        derivative rules and replays must see the values the instruction computed with. The
        same unchanged array gets the same copy, so a replay still sees one constant.
        """
        memo = self._frozen
        if memo is None:
            memo = self._frozen = {}
        hit = memo.get(id(a))
        if hit is not None and hit[0] is a and _same_contents(a, hit[1]):
            return hit[1]
        copy = a.copy()
        copy.flags.writeable = False
        memo[id(a)] = (a, copy)
        return copy

    def add_guard(self, var: Var, kind: str, answer) -> None:
        self.tape.guards.append(Guard(var, kind, answer, user_source_line()))

    def __repr__(self) -> str:
        return f"<Level {self.id} {self.kind.value}{'' if self.active else ' (closed)'}>"


def _same_contents(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _dtype_of(value) -> np.dtype:
    dt = getattr(value, "dtype", None)
    if dt is None:
        return np.asarray(value).dtype
    return dt


def _stack() -> list:
    s = getattr(_state, "stack", None)
    if s is None:
        s = _state.stack = []
    return s


# Called when a level is pushed (e.g. to adapt scipy.special once SciPy is loaded).
level_hooks: list = []


class new_level:
    """Push a level for the duration of a traced call; it is closed and popped also on error.

    (A class, not a generator: it is entered on every traced call, so it is kept cheap.)
    """

    __slots__ = ("level", "stack")

    def __init__(self, kind: LevelKind, batch_size: int | None = None):
        for hook in level_hooks:
            hook()
        self.level = Level(kind, batch_size)

    def __enter__(self) -> Level:
        self.stack = _stack()
        if self.level.kind in _STAGED:  # (a recording kept for replay: see core/collector.py)
            collector.pause_full_collections()
        self.stack.append(self.level)
        return self.level

    def __exit__(self, *exc) -> None:
        level, stack = self.level, self.stack
        level.active = level.differentiates = False
        # pop this level and anything left above it by an exception
        while stack:
            top = stack.pop()
            top.active = top.differentiates = False
            if top is level:
                break
        if level.kind in _STAGED:
            collector.resume_full_collections()


# levels whose tape is kept (and can be long): full collections wait while they record
_STAGED = (LevelKind.STAGE, LevelKind.LOOP_BODY)


def current_levels() -> list:
    return list(_stack())


def bind(prim, args: tuple, params: dict):
    """Apply `prim` to `args`: record it at the highest level among the Tracer arguments.

    The common case of eager differentiation (an open DIFFERENTIATE level, a primitive with
    one result that has a derivative: `Primitive.plain_differentiable`) is recorded here in one
    frame, as `_record` would record it; every other case goes through `_record`.
    """
    top = None
    for a in args:
        if type(a) is Tracer:
            lv = a._level
            if top is None or lv.id > top.id:
                top = lv
    if top is None:
        return prim.impl(*args, **params)
    if not (top.differentiates and prim.plain_differentiable):
        return _bind_at(top, prim, args, params)
    vals = []
    invars = []
    constant_array = False  # a writable ndarray argument (frozen below unless prim is linear)
    for a in args:
        if type(a) is Tracer and a._level is top:
            vals.append(a._value)
            invars.append(a._var)
            continue
        if type(a) is _ndarray and a.flags.writeable:
            constant_array = True
        vals.append(a)
        invars.append(None)
    out = prim.impl(*vals, **params) if params else prim.impl(*vals)
    dt = getattr(out, "dtype", None)
    if not (isinstance(out, (float, complex)) if dt is None else dt.kind in "fc"):
        return out  # an integer or boolean result: no derivative
    if constant_array and not prim.linear:
        vals = [
            top.freeze(v) if var is None and type(v) is _ndarray and v.flags.writeable else v
            for v, var in zip(vals, invars)
        ]
    vals = tuple(vals)
    # the user's line (see user_frame; a differentiated tape names it in backward errors)
    f = _getframe(1)
    library = _LIBRARY_CODE
    while f is not None:
        inside = library.get(f.f_code)
        if inside is None:
            inside = _library_code(f.f_code)
        if not inside:
            break
        f = f.f_back
    var = Var(top._nvars, (), _dtype_of(out)) if dt is None else Var(top._nvars, out.shape, dt)
    top._nvars += 1
    source = None if f is None else (f.f_code, f.f_lasti)
    ins = Instruction(prim, tuple(invars), vals, params, (var,), out, source)
    top.tape.instructions.append(ins)
    if top.releases and (
        type(out) is _ndarray
        and out.size >= _RELEASE_SIZE
        # (an elementwise result is as large as its arguments: only others can have larger)
        or (prim.partials is None and _any_large(vals))
    ):
        release_unread(ins)
    tracer = Tracer(out, var, top)
    if prim.aliases_input and type(args[0]) is Tracer:  # x.T, x.reshape(...): a view of x
        add_view(args[0], tracer, None, _recompute_view(prim, args[1:], params))
    return tracer


def _bind_at(top: Level, prim, args: tuple, params: dict):
    """`bind` at `top`, the highest level among the arguments, other than its short path."""
    if not top.active:
        raise _leaked_error(top)
    if top.batch_size is not None:
        return batch_bind(top, prim, args, params)
    if prim.transparent and not top.record_all:
        # differentiated through its implementation (which is written with primitives)
        return prim.impl(*args, **params)
    return _record(top, prim, args, params)


def _record(top: Level, prim, args: tuple, params: dict):
    """`bind` at the open level `top` (not a BATCH level)."""
    vals = []
    invars = []
    for a in args:
        if type(a) is Tracer and a._level is top:
            vals.append(a._value)
            invars.append(a._var)
        elif top.captures is not None and type(a) is Tracer:
            var, _, value = top.capture(a)
            vals.append(value)
            invars.append(var)
        else:
            vals.append(a)
            invars.append(None)
    out = prim.impl(*vals, **params)
    if top.record_all:
        inexact = True  # (not asked)
    elif prim.multiple_results:
        inexact = _inexact(out, True)
    else:
        dt = getattr(out, "dtype", None)
        inexact = isinstance(out, (float, complex)) if dt is None else dt.kind in "fc"
    if not top.record_all and (prim.nondiff or not inexact):
        if prim.nondiff and not prim.complex_correct and _complex(out, prim.multiple_results):
            # np.sign(z): zero derivative on the reals, not on the complex plane
            raise GradtapeError(
                f"{user_source_line()}: "
                + complex_refusal(prim.name, "taken as a constant, with zero derivative")
            )
        return out
    if (top.record_all or not prim.linear) and None in invars:  # constants read again later
        # (only constants: a traced value is the result of a recorded operation, which the
        # function cannot write into, or an input, which is read before the call returns)
        vals = [
            top.freeze(v) if var is None and type(v) is np.ndarray and v.flags.writeable else v
            for v, var in zip(vals, invars)
        ]
    vals = tuple(vals)
    invars = tuple(invars)
    # a differentiated tape remembers the user's line of each operation: an error raised by
    # a derivative rule later (in the backward pass) names it
    source = None if top.record_all else user_frame(4)
    if prim.multiple_results:
        outvars = tuple(top.new_var(o) for o in out)
        top.tape.instructions.append(Instruction(prim, invars, vals, params, outvars, out, source))
        return type(out)(Tracer(o, v, top) for o, v in zip(out, outvars))
    var = top.new_var(out)
    ins = Instruction(prim, invars, vals, params, (var,), out, source)
    top.tape.instructions.append(ins)
    if top.releases and (
        # (small values are kept: release_unread would look at nothing)
        type(out) is _ndarray and out.size >= _RELEASE_SIZE or _any_large(vals)
    ):
        release_unread(ins)
    tracer = Tracer(out, var, top)
    if prim.aliases_input and type(args[0]) is Tracer:  # x.T, x.reshape(...): a view of x
        add_view(args[0], tracer, None, _recompute_view(prim, args[1:], params))
    return tracer


_RELEASE_SIZE = 256  # arrays smaller than this are kept: releasing them saves little
_ndarray = np.ndarray


def _any_large(values: tuple) -> bool:
    for a in values:
        if type(a) is _ndarray and a.size >= _RELEASE_SIZE:
            return True
    return False


def release_unread(ins: Instruction) -> None:
    """Replace the values of `ins` that no VJP rule of its differentiated arguments reads by
    `Released` stand-ins (shape and dtype only), so an eager gradient does not keep every
    intermediate alive until its backward pass. Constants stay (the tape prints them).
    Arrays smaller than _RELEASE_SIZE entries stay too (releasing them saves little)."""
    invars = ins.invars
    traced = tuple([v is not None for v in invars])
    plan = _RELEASE_PLANS.get((ins.prim, traced))
    if plan is None:
        plan = _release_plan(ins.prim, traced)
    release_out, release_args = plan
    out = ins.out
    if release_out and type(out) is _ndarray and out.size >= _RELEASE_SIZE:
        ins.out = Released(out.shape, out.dtype)
    if not release_args:
        return
    args = ins.args
    kept = None
    for k in release_args:
        a = args[k]
        if type(a) is _ndarray and a.size >= _RELEASE_SIZE:
            if kept is None:
                kept = list(args)
            kept[k] = Released(a.shape, a.dtype)
    if kept is not None:
        ins.args = tuple(kept)


# (primitive, which arguments are traced) -> (release the result, indices of the traced
# arguments to release): what release_unread does for each application of that form
_RELEASE_PLANS: dict = {}


def _release_plan(prim, traced: tuple) -> tuple:
    """What release_unread releases of an application of `prim` whose traced arguments are
    `traced`: the values no VJP rule of a traced argument reads (nothing when unknown)."""
    per_rule = prim.vjp_reads(len(traced))
    reads = None
    if per_rule is not None:
        for is_traced, rule_reads in zip(traced, per_rule):
            if is_traced:
                reads = rule_reads if reads is None else [a or b for a, b in zip(reads, rule_reads)]
    if reads is None:
        plan = (False, ())
    else:
        plan = (not reads[0], tuple(k for k, t in enumerate(traced) if t and not reads[k + 1]))
    if not prim.user_rule:  # (a custom_vjp's primitive is the user's: not kept alive here)
        _RELEASE_PLANS[(prim, traced)] = plan
    return plan


def _recompute_view(prim, rest: tuple, params: dict):
    def recompute(base):
        return bind(prim, (base, *rest), params)

    recompute.__name__ = prim.name
    return recompute


def batch_bind(level: Level, prim, args: tuple, params: dict):
    """Apply `prim` to arguments of which some are members of `level`'s batch.

    The primitive's batching rule (`Primitive.batch`) receives the arguments one level down,
    the batched ones with the batch axis first, and returns the batched result (batch axis
    first). A primitive without a rule runs once per member of the batch (`loop_batch`).
    """
    vals = []
    batched = []
    for a in args:
        if type(a) is Tracer and a._level is level:
            vals.append(a._value)
            batched.append(True)
        else:
            vals.append(a)
            batched.append(False)
    rule = prim.batch if prim.batch is not None else loop_batch
    outer = getattr(_state, "batch_level", None)
    _state.batch_level = level
    try:
        out = rule(prim, tuple(vals), tuple(batched), **params)
    finally:
        _state.batch_level = outer
    if prim.multiple_results:
        return type(out)(Tracer(o, level.new_batched_var(o), level) for o in out)
    tracer = Tracer(out, level.new_batched_var(out), level)
    if prim.aliases_input and type(args[0]) is Tracer:
        add_view(args[0], tracer, None, _recompute_view(prim, args[1:], params))
    return tracer


def batching_level() -> Level | None:
    """The BATCH level whose batching rule is running (None outside a batching rule)."""
    return getattr(_state, "batch_level", None)


def read_above(level: Level | None = None) -> bool:
    """Whether a level above the BATCH level whose rule is running (or `level`) records what
    the rule returns (a grad inside vmap: its rules read the primitive's outputs)."""
    level = level if level is not None else _state.batch_level
    return any(lv.id > level.id and lv.batch_size is None for lv in _stack())


def loop_batch(prim, args: tuple, batched: tuple, **params):
    """The batching rule of a primitive without one: the primitive once per member of the
    batch, the results stacked (correct for every primitive, but not fused into one call)."""
    return stack_members(prim, member_results(prim, args, batched, params))


def member_results(prim, args: tuple, batched: tuple, params: dict) -> list:
    """The primitive applied to each member of the batch, one level down."""
    size = next(a.shape[0] for a, b in zip(args, batched) if b)
    return [
        bind(prim, tuple(a[i] if b else a for a, b in zip(args, batched)), params)
        for i in range(size)
    ]


def member_shapes(prim, results: list) -> set:
    return {
        tuple(np.shape(o) for o in r) if prim.multiple_results else np.shape(r) for r in results
    }


def stack_members(prim, results: list):
    """The members' results stacked along a new first axis (the batch axis)."""
    shapes = member_shapes(prim, results)
    if len(shapes) > 1:
        raise GradtapeError(
            f"{user_source_line()}: vmap: {prim.name} gives results of different shapes for "
            f"different members of the batch ({', '.join(map(str, sorted(shapes)))}); a batch "
            "needs one shape for all its members. Compute a fixed-size result instead (a "
            "mask with np.where rather than the selected elements, for instance)."
        )
    if prim.multiple_results:
        return type(results[0])(np.stack([r[k] for r in results]) for k in range(len(results[0])))
    return np.stack(results)


def example_value(x):
    """The concrete value of one member of every batch `x` belongs to (for code that needs a
    representative value, such as recording a loop body once): the innermost value, indexed
    at 0 along the batch axis of every BATCH level it passes."""
    members = 0
    while type(x) is Tracer:
        if x._level.batch_size is not None:
            members += 1
        x = x._value
    return x[(0,) * members] if members else x


def _batch_answer(tracer, ask, kind: str):
    """A Python value asked of a member of a batch: the same for every member, or an error."""
    values = tracer._value
    first = values[0]
    if not bool(np.all(values == first)):
        raise GradtapeError(
            f"{user_source_line()}: {kind}() of a value that differs across the batch of "
            "vmap: the function takes a different path for different members. Write the "
            "branch with np.where (both sides computed), or use gradtape.while_loop / "
            "gradtape.fori_loop / gradtape.scan, which vmap runs for each member."
        )
    return ask(first)


def _inexact(out, multiple: bool) -> bool:
    if multiple:
        return any(_inexact(o, False) for o in out)
    dt = getattr(out, "dtype", None)
    if dt is None:
        return isinstance(out, (float, complex))
    return dt.kind in "fc"


def _complex(out, multiple: bool) -> bool:
    if multiple:
        return any(_complex(o, False) for o in out)
    dt = getattr(out, "dtype", None)
    return dt.kind == "c" if dt is not None else isinstance(out, complex)


def complex_refusal(name: str, why: str = "") -> str:
    """The message for a primitive that does not differentiate complex values."""
    return (
        f"gradtape cannot differentiate {name} of complex values: its derivative rule is "
        "written for real numbers" + (f" ({why})" if why else "") + ", and applied to complex "
        "ones it could give a wrong result. Write the computation with real and imaginary "
        "parts (np.real, np.imag) as real arrays, or give it a rule with gradtape.custom_vjp."
    )


def _leaked_error(level) -> GradtapeError:
    return GradtapeError(
        f"a traced value from a finished transformation ({level!r}) was used again. This happens "
        "when a traced value escapes the function being differentiated (stored in a global, a "
        "closure or an attribute). Return it from the function instead, or wrap it in "
        "gradtape.stop_gradient before storing it."
    )


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the gradtape package
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__))


_SCIPY_MARK = os.sep + "scipy" + os.sep
_getframe = sys._getframe
_LIBRARY_CODE: dict = {}  # code object -> True when it is gradtape's, NumPy's or SciPy's


def user_frame(depth: int = 2) -> tuple | None:
    """`(code, instruction offset)` of the first frame outside gradtape, NumPy and SciPy (the
    user's line that led to this operation; a SciPy function's own lines are skipped so that
    `norm.logpdf(x)` names the caller). Costs a dictionary lookup per frame; the line number
    is found from the offset only when a message names it (`ir.source_text`)."""
    f = sys._getframe(depth)
    library = _LIBRARY_CODE
    while f is not None:
        code = f.f_code
        inside = library.get(code)
        if inside is None:
            inside = _library_code(code)
        if not inside:
            return (code, f.f_lasti)
        f = f.f_back
    return None


def _library_code(code) -> bool:
    """Whether `code` is gradtape's, NumPy's or SciPy's (remembered in _LIBRARY_CODE)."""
    fn = code.co_filename
    inside = _LIBRARY_CODE[code] = fn.startswith(_PKG_DIR) or _NUMPY_DIR in fn or _SCIPY_MARK in fn
    return inside


def user_source_line() -> str:
    """The first frame outside gradtape (and NumPy's dispatch): where the user asked for a
    value. When that frame is SciPy's, the user's line that called SciPy comes first and
    SciPy's line after it ("model.py:3: ...; inside SciPy at _cubic.py:865: ...")."""
    f = _first_frame_outside(sys._getframe(2), scipy=False)
    if f is None:
        return "<unknown>"
    where = _frame_line(f)
    if _SCIPY_MARK in f.f_code.co_filename:
        caller = _first_frame_outside(f, scipy=True)
        if caller is not None:
            return f"{_frame_line(caller)}; inside SciPy at {where}"
    return where


def plain_write_error(exc: BaseException) -> GradtapeError | None:
    """The clear error for NumPy's ValueError when a traced value is written into a plain
    array (out[i] = x), naming the line that wrote; None for any other exception."""
    if not isinstance(exc, ValueError) or "setting an array element with a sequence" not in str(
        exc
    ):
        return None
    return GradtapeError(
        f"{traceback_source_line(exc.__traceback__)}: a traced value was written into a plain "
        "NumPy array (a[i] = x): that would cut the gradient. Build the array from traced "
        "values instead: y = np.zeros_like(x) (x traced) then y[i] = ..., or collect values "
        "in a list and use np.stack."
    )


def traceback_source_line(tb) -> str:
    """As user_source_line, for the innermost frames of a traceback outside gradtape and NumPy:
    where an exception caught later was raised."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    outside = [
        f
        for f in frames
        if not (f.f_code.co_filename.startswith(_PKG_DIR) or _NUMPY_DIR in f.f_code.co_filename)
    ]
    if not outside:
        return "<unknown>"
    where = _frame_line(outside[-1])
    if _SCIPY_MARK in outside[-1].f_code.co_filename:
        callers = [f for f in outside if _SCIPY_MARK not in f.f_code.co_filename]
        if callers:
            return f"{_frame_line(callers[-1])}; inside SciPy at {where}"
    return where


def _first_frame_outside(f, scipy: bool):
    """The first frame from `f` outwards that is not gradtape's or NumPy's (nor SciPy's)."""
    while f is not None:
        fn = f.f_code.co_filename
        if not (fn.startswith(_PKG_DIR) or _NUMPY_DIR in fn or (scipy and _SCIPY_MARK in fn)):
            return f
        f = f.f_back
    return None


def _frame_line(f) -> str:
    import linecache

    line = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}: {line}"


# --- the Tracer ------------------------------------------------------------------------------
_UFUNCS = routes.UFUNCS
_METHODS = routes.METHODS


def differentiated(x) -> bool:
    """Whether `x` is a Tracer of a level that differentiates (at any depth of nesting)."""
    while type(x) is Tracer:
        if x._level.kind is LevelKind.DIFFERENTIATE:
            return True
        x = x._value
    return False


def _traced_lists(t):
    """`t.tolist()` with traced scalars as the items (0-d: `t` itself)."""
    if not t.shape:
        return t
    return [_traced_lists(t[i]) for i in range(t.shape[0])]


def _no_float_message(what: str, tracer: Tracer | None = None) -> str:
    where = user_source_line()
    if tracer is not None and tracer._level.kind is LevelKind.STAGE:
        # a value compile (or trace) records without differentiating it: a
        # Python number computed from it could not be checked when the code is replayed
        return (
            f"{what} was called on a value that compile traces ({where}): compile records "
            "array and float arguments as inputs, so a Python number made from one (math.exp(s), "
            "float(s)) cannot be replayed for a new value. If the argument is a setting that "
            "does not change often, mark it static: gradtape.compile(f, static_argnums=(i,)) "
            "(or static_argnames=...; each new value records again). If it varies, use NumPy "
            "on it (np.exp(s) rather than math.exp(s)); x.item() records a guard instead."
        )
    return (
        f"{what} was called on a traced value ({where}): it would turn the value into a plain "
        "Python number and silently cut the gradient. Use NumPy functions on the array instead "
        "(np.exp, np.sqrt, ... rather than math.exp, math.sqrt). If you are writing it into a "
        "plain NumPy array (a[i] = x), build that array from traced values instead: "
        "y = np.zeros_like(x); y[i] = ...  or  np.stack([...]). If you really want a constant, "
        "use gradtape.stop_gradient(x)."
    )


def _index_trick() -> str | None:
    """'np.r_', 'np.c_' (...) when NumPy's index tricks are converting their items: they make
    plain arrays of them before they concatenate."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "__getitem__" and f.f_code.co_filename.endswith(
            "_index_tricks_impl.py"
        ):
            trick = f.f_locals.get("self")
            for name in ("r_", "c_", "s_", "index_exp", "mgrid", "ogrid"):
                if getattr(np, name, None) is trick:
                    return f"np.{name}"
            return "NumPy's index tricks"
        f = f.f_back
    return None


def _guarded_value(x):
    """The concrete value of `x` (an integer cast), guarded at every level that recorded it."""
    if type(x) is not Tracer:
        return np.asarray(x)
    if x._level.batch_size is not None:
        return _batch_answer(x, np.asarray, "an integer cast")
    value = _guarded_value(x._value)
    x._level.add_guard(x._var, "value", value)
    return value


def _as_array_message(dtype: np.dtype | None = None) -> str:
    """What to write instead, when NumPy's C code asks a Tracer for a plain array."""
    where = user_source_line()
    if dtype is not None:
        return (
            f"NumPy was asked to convert a traced value into a plain array of {dtype} "
            f"({where}), which would copy the numbers out and cut the gradient. A NumPy scalar "
            f"type called on it (np.{dtype}(x)) does that: write x.astype(np.{dtype}) or "
            f"np.asarray(x, dtype=np.{dtype}) (the cast is recorded, the gradient flows through "
            "it). So does a write into a plain array (a[i] = x): build that array from traced "
            "values instead (y = np.zeros_like(x); y[i] = value, or np.stack([...]))."
        )
    trick = _index_trick()
    if trick is not None:
        return (
            f"{trick}[...] makes plain arrays of its items ({where}), which would copy the "
            "numbers of a traced value out and cut the gradient. Write np.concatenate([a, b]) "
            "(np.atleast_1d for scalars) instead of np.r_[a, b], and np.column_stack([a, b]) "
            "instead of np.c_[a, b]."
        )
    if ".dot(" in where.replace("np.dot(", "").replace("numpy.dot(", ""):
        advice = (
            "A plain array's method (X.dot(w)) cannot see a traced argument: write "
            "X @ w or np.dot(X, w)."
        )
    else:
        advice = (
            "This happens in a plain array's methods given a traced argument (write "
            "X @ w or np.dot(X, w) for X.dot(w)), in writes into a plain array (build it "
            "from traced values: y = np.zeros_like(x); y[i] = value, or np.stack([...])), "
            "in a NumPy ufunc given only a list of traced values (np.exp([a, b]): write "
            "np.exp(np.array([a, b]))), and in C code of other libraries."
        )
    return (
        f"NumPy was asked to convert a traced value into a plain array ({where}), which "
        f"would copy the numbers out and cut the gradient. {advice}"
    )


_SEQUENCES = (list, tuple)


def _holds_tracer(seq) -> bool:
    for e in seq:
        t = type(e)
        if t is Tracer or ((t is list or t is tuple) and _holds_tracer(e)):
            return True
    return False


def _stacked_inputs(inputs: tuple, name: str) -> tuple:
    """A ufunc's inputs with each list or tuple that holds a Tracer stacked into one."""
    stack = routes.ARRAY_LIKE[0]
    return tuple(
        stack(i, f"np.{name}") if type(i) in _SEQUENCES and _holds_tracer(i) else i for i in inputs
    )


def _stacked_arguments(args: tuple, kwargs: dict, lists: tuple, func) -> tuple:
    """`args` and `kwargs` with each of `lists` (the lists and tuples holding Tracers that
    NumPy's dispatcher of `func` names as array-likes) stacked into a Tracer; also inside a
    sequence argument (np.concatenate([[a, b], x]))."""
    stack = routes.ARRAY_LIKE[0]
    name = f"np.{getattr(func, '__name__', 'function')}"

    def convert(a):
        for seq in lists:
            if a is seq:
                return stack(a, name)
        if type(a) in _SEQUENCES and any(e is seq for e in a for seq in lists):
            return type(a)(convert(e) for e in a)
        return a

    return tuple(convert(a) for a in args), {k: convert(v) for k, v in kwargs.items()}


class Tracer:
    """A value being traced at one level; behaves like a NumPy array.

    Writes follow NumPy's memory semantics. `x[1:]` (basic indexing) is a view: a write into it
    (`v[0] = 1`, `v *= 2`) is written into `x`, and views of `x` that are still alive see every
    write into `x`. Other views (`x.T`, `x.reshape(...)`, `np.broadcast_to(x, ...)`) see writes
    into `x`; writing into them raises, because NumPy may or may not share memory there.
    In-place operators (`x += 1`) change the array every name bound to it sees, as in NumPy.
    """

    __slots__ = ("_value", "_var", "_level", "_views", "_view_of", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, value, var, level):
        self._value = value
        self._var = var
        self._level = level
        self._views = None  # weak references to the views taken of this array
        self._view_of = None  # (base, basic index or None, recompute(base) -> fresh Tracer)

    # --- array attributes ---------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._var.shape

    @property
    def dtype(self) -> np.dtype:
        return self._var.dtype

    @property
    def ndim(self) -> int:
        return len(self._var.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self._var.shape:
            n *= d
        return n

    @property
    def T(self):
        return np.transpose(self)

    @property
    def mT(self):
        """The transpose of the last two axes (NumPy 2's ndarray.mT)."""
        if len(self._var.shape) < 2:
            raise ValueError("matrix transpose with ndim < 2 is undefined")
        return np.swapaxes(self, -1, -2)

    @property
    def real(self):
        return np.real(self)

    @property
    def imag(self):
        return np.imag(self)

    def __len__(self) -> int:
        if not self._var.shape:
            raise TypeError("len() of unsized object")
        return self._var.shape[0]

    def __iter__(self):
        if not self._var.shape:
            raise TypeError("iteration over a 0-d array")
        for i in range(self._var.shape[0]):
            yield self[i]

    def __repr__(self) -> str:
        return f"Tracer<{self._var.type_str} level {self._level.id}>({self._value!r})"

    # --- NumPy's override protocols -----------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if not kwargs and method == "__call__":  # np.sin(x), np.add(x, 1): at once
            prim = _UFUNCS.get(ufunc)
            if prim is not None:
                for i in inputs:
                    if type(i) in _SEQUENCES:
                        break
                else:
                    return bind(prim, inputs, {})
        for i in inputs:
            if type(i) in _SEQUENCES:
                if method == "at":  # np.add.at(a, (rows, cols), v): the tuple is the index
                    inputs = inputs[:1] + (inputs[1],) + _stacked_inputs(inputs[2:], ufunc.__name__)
                else:
                    inputs = _stacked_inputs(inputs, ufunc.__name__)
                break
        out = kwargs.pop("out", None)
        if out is not None and not (isinstance(out, tuple) and all(o is None for o in out)):
            return _ufunc_into(ufunc, method, inputs, kwargs, out)
        if method == "__call__":
            prim = routes.lookup_ufunc(ufunc)
            if prim is None:
                raise _no_rule_error(f"the ufunc {ufunc.__name__}")
            if kwargs:
                return _ufunc_with_kwargs(prim, inputs, kwargs, ufunc)
            return bind(prim, inputs, {})
        impl = routes.UFUNC_METHODS.get((ufunc, method))
        if impl is not None:
            return impl(*inputs, **kwargs)
        raise _no_rule_error(f"np.{ufunc.__name__}.{method}")

    def __array_function__(self, func, types, args, kwargs):
        impl = routes.FUNCTIONS.get(func)
        if impl is None:
            # the public spelling: np.fft.fft, np.linalg.eig, np.sum, scipy.x.y
            parts = [
                p
                for p in (getattr(func, "__module__", None) or "numpy").split(".")
                if not p.startswith("_")
            ]
            parts[:1] = ["np"] if parts[:1] == ["numpy"] else parts[:1]
            raise _no_rule_error(".".join(parts + [func.__name__]))
        lists = getattr(_state, "array_like_lists", None)
        if lists is not None:  # np.mean([a, b]): NumPy's dispatcher named these lists
            _state.array_like_lists = None
            args, kwargs = _stacked_arguments(args, kwargs, lists, func)
        return impl(*args, **kwargs)

    def __array__(self, dtype=None, copy=None):
        if dtype is not None:
            dt = np.dtype(dtype)
            if dt.kind in "biu" and self.dtype.kind in "biuf":
                # np.int64(x): an integer cast has zero derivative, as NumPy's cast cuts the
                # value; its value is a guard wherever it is recorded
                return _guarded_value(self.astype(dt))
            raise GradtapeError(_as_array_message(dt))
        raise GradtapeError(_as_array_message())

    # --- Python values: answered with the concrete value, recorded as a guard -----------
    def __bool__(self) -> bool:
        if self._level.batch_size is not None:
            return _batch_answer(self, bool, "bool")
        ans = bool(self._value)
        self._level.add_guard(self._var, "bool", ans)
        return ans

    def __int__(self) -> int:
        if self._level.batch_size is not None:
            return _batch_answer(self, int, "int")
        ans = int(self._value)
        self._level.add_guard(self._var, "int", ans)
        return ans

    def __index__(self) -> int:
        if self.dtype.kind not in "iub":
            raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
        if self._level.batch_size is not None:
            return _batch_answer(self, operator.index, "index")
        ans = self._value.__index__()
        self._level.add_guard(self._var, "index", ans)
        return ans

    def item(self, *args):
        """The concrete value as a Python scalar, recorded as a guard.

        Raises GradtapeError for a float or complex value being differentiated: a Python
        number would cut the gradient silently (gradtape.stop_gradient says so on purpose).
        """
        v = self._value
        if self._level.batch_size is not None:
            return _batch_answer(self, lambda m: m.item(*args), "item")
        if self.dtype.kind in "fc" and differentiated(self):
            raise GradtapeError(_no_float_message(".item()", self))
        ans = v.item(*args) if hasattr(v, "item") else v
        self._level.add_guard(self._var, "item", ans)
        return ans

    def tolist(self):
        """The value as nested lists: of traced scalars when a float or complex value is being
        differentiated (the gradient flows through them), else of Python numbers recorded as
        a guard."""
        v = self._value
        if self._level.batch_size is not None:
            return _batch_answer(self, lambda m: m.tolist(), "tolist")
        if self.dtype.kind in "fc" and differentiated(self):
            return _traced_lists(self)
        ans = v.tolist()
        self._level.add_guard(self._var, "value", np.array(v))
        return ans

    def __float__(self):
        raise GradtapeError(_no_float_message("float()", self))

    def __complex__(self):
        raise GradtapeError(_no_float_message("complex()", self))

    # --- operators ------------------------------------------------------------------------
    def __add__(self, o):
        return bind(_UFUNCS[np.add], (self, o), {})

    def __radd__(self, o):
        return bind(_UFUNCS[np.add], (o, self), {})

    def __sub__(self, o):
        return bind(_UFUNCS[np.subtract], (self, o), {})

    def __rsub__(self, o):
        return bind(_UFUNCS[np.subtract], (o, self), {})

    def __mul__(self, o):
        return bind(_UFUNCS[np.multiply], (self, o), {})

    def __rmul__(self, o):
        return bind(_UFUNCS[np.multiply], (o, self), {})

    def __truediv__(self, o):
        return bind(_UFUNCS[np.divide], (self, o), {})

    def __rtruediv__(self, o):
        return bind(_UFUNCS[np.divide], (o, self), {})

    def __floordiv__(self, o):
        return np.floor_divide(self, o)

    def __rfloordiv__(self, o):
        return np.floor_divide(o, self)

    def __mod__(self, o):
        return bind(_UFUNCS[np.remainder], (self, o), {})

    def __rmod__(self, o):
        return bind(_UFUNCS[np.remainder], (o, self), {})

    def __divmod__(self, o):
        return np.divmod(self, o)

    def __rdivmod__(self, o):
        return np.divmod(o, self)

    def __pow__(self, o):
        if type(o) is int and o == 2:
            return bind(_UFUNCS[np.square], (self,), {})
        return bind(_UFUNCS[np.power], (self, o), {})

    def __rpow__(self, o):
        return bind(_UFUNCS[np.power], (o, self), {})

    def __matmul__(self, o):
        return np.matmul(self, o)

    def __rmatmul__(self, o):
        return np.matmul(o, self)

    def __neg__(self):
        return bind(_UFUNCS[np.negative], (self,), {})

    def __pos__(self):
        return Tracer(self._value, self._var, self._level)

    def __abs__(self):
        return bind(_UFUNCS[np.absolute], (self,), {})

    def __lt__(self, o):
        return np.less(self, o)

    def __le__(self, o):
        return np.less_equal(self, o)

    def __gt__(self, o):
        return np.greater(self, o)

    def __ge__(self, o):
        return np.greater_equal(self, o)

    def __eq__(self, o):
        return np.equal(self, o)

    def __ne__(self, o):
        return np.not_equal(self, o)

    def __and__(self, o):
        return np.logical_and(self, o) if self.dtype == bool else np.bitwise_and(self, o)

    def __or__(self, o):
        return np.logical_or(self, o) if self.dtype == bool else np.bitwise_or(self, o)

    def __invert__(self):
        return np.logical_not(self) if self.dtype == bool else np.invert(self)

    __hash__ = None

    # --- writes: in-place operators, item assignment, out=, fill ------------------------------
    def __iadd__(self, o):
        return self._in_place(self + o, "add")

    def __isub__(self, o):
        return self._in_place(self - o, "subtract")

    def __imul__(self, o):
        return self._in_place(self * o, "multiply")

    def __itruediv__(self, o):
        return self._in_place(self / o, "divide")

    def __ifloordiv__(self, o):
        return self._in_place(self // o, "floor_divide")

    def __imod__(self, o):
        return self._in_place(self % o, "remainder")

    def __ipow__(self, o):
        return self._in_place(self**o, "power")

    def __imatmul__(self, o):
        return self._in_place(self @ o, "matmul")

    def __iand__(self, o):
        return self._in_place(self & o, "bitwise_and")

    def __ior__(self, o):
        return self._in_place(self | o, "bitwise_or")

    def fill(self, value) -> None:
        """`x.fill(v)`: every element of x (and of the array x views) becomes v."""
        self[...] = value

    def _in_place(self, result, op: str):
        """Store `result` into this array as NumPy's in-place ufunc would (shape kept, cast
        to this dtype under 'same_kind'), and return the array."""
        shape = self._var.shape
        rshape = getattr(result, "shape", ())
        if rshape != shape:
            raise ValueError(
                f"non-broadcastable output operand with shape {shape} doesn't "
                f"match the broadcast shape {rshape}"
            )
        dtype = self._var.dtype
        rdtype = getattr(result, "dtype", None) or np.result_type(result)
        if rdtype != dtype:
            if not np.can_cast(rdtype, dtype, casting="same_kind"):
                raise TypeError(
                    f"Cannot cast ufunc '{op}' output from {rdtype!r} to {dtype!r} "
                    "with casting rule 'same_kind'"
                )
            result = _METHODS["astype"](result, dtype)
        if type(result) is not Tracer:
            raise GradtapeError(
                f"an in-place {op} (x {op}= ...) made a traced array constant (its derivative is "
                f"zero). Write x = np.{op}(x, ...) instead, or stop_gradient(x) first."
            )
        self._assign(result)
        return self

    def _assign(self, new) -> None:
        """This array now holds `new` (same shape and dtype): a write, seen through every name
        bound to this Tracer, by the array it views and by its own live views."""
        view_of = self._view_of
        if view_of is not None:
            base, index, recompute = view_of
            if index is None:
                raise GradtapeError(
                    f"{user_source_line()}: a write into the result of {recompute.__name__} "
                    "(x.T, x.reshape, np.broadcast_to, ...): NumPy may or may not write through "
                    "to x there. Write into x itself (x[...] = ...), or take a copy first "
                    "(y = x.T.copy())."
                )
            base._assign(_METHODS["__setitem__"](base, index, new))  # also refreshes self
            return
        self._value, self._var, self._level = new._value, new._var, new._level
        if self._views:
            self._refresh_views()

    def _refresh_views(self) -> None:
        """Recompute the live views of this array after a write into it."""
        live = []
        for ref in self._views:
            view = ref()
            if view is None:
                continue
            live.append(ref)
            fresh = view._view_of[2](self)
            view._value, view._var, view._level = fresh._value, fresh._var, fresh._level
            if view._views:
                view._refresh_views()
        self._views = live

    # --- indexing -----------------------------------------------------------------------
    def __getitem__(self, idx):
        out = _METHODS["__getitem__"](self, idx)
        if type(out) is Tracer and _is_view_index(idx, len(self._var.shape)):
            add_view(self, out, idx)
        return out

    def __setitem__(self, idx, value):
        self._assign(_METHODS["__setitem__"](self, idx, value))

    # --- methods ----------------------------------------------------------------------
    # The reductions take ndarray's keywords (initial=, where=, ...) as their np. spellings do;
    # a keyword is passed on only when given, as ndarray's methods leave NumPy's defaults.
    def sum(self, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        return np.sum(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, **kwargs)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        return np.mean(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, **kwargs)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        return np.prod(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims, **kwargs)

    def max(self, axis=None, out=None, keepdims=False, **kwargs):
        return np.max(self, axis=axis, out=out, keepdims=keepdims, **kwargs)

    def min(self, axis=None, out=None, keepdims=False, **kwargs):
        return np.min(self, axis=axis, out=out, keepdims=keepdims, **kwargs)

    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kwargs):
        return np.var(self, axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims, **kwargs)

    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kwargs):
        return np.std(self, axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims, **kwargs)

    def cumsum(self, axis=None, dtype=None, out=None):
        return np.cumsum(self, axis=axis, dtype=dtype, out=out)

    def cumprod(self, axis=None, dtype=None, out=None):
        return np.cumprod(self, axis=axis, dtype=dtype, out=out)

    def argmax(self, axis=None, out=None, keepdims=False):
        return np.argmax(self, axis=axis, out=out, keepdims=keepdims)

    def argmin(self, axis=None, out=None, keepdims=False):
        return np.argmin(self, axis=axis, out=out, keepdims=keepdims)

    def argsort(self, axis=-1, kind=None, order=None):
        return np.argsort(self, axis=axis, kind=kind, order=order)

    def any(self, axis=None, out=None, keepdims=False, **kwargs):
        return np.any(self, axis=axis, out=out, keepdims=keepdims, **kwargs)

    def all(self, axis=None, out=None, keepdims=False, **kwargs):
        return np.all(self, axis=axis, out=out, keepdims=keepdims, **kwargs)

    def dot(self, b, out=None):
        return np.dot(self, b, out=out)

    def reshape(self, *newshape, order="C"):
        if len(newshape) == 1 and not isinstance(newshape[0], (int, np.integer)):
            newshape = newshape[0]
        return np.reshape(self, newshape, order=order)

    def transpose(self, *axes):
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = axes[0]
        return np.transpose(self, axes or None)

    def swapaxes(self, a, b):
        return np.swapaxes(self, a, b)

    def ravel(self, order="C"):
        return np.ravel(self, order=order)

    def flatten(self, order="C"):
        return np.ravel(self, order=order)

    @property
    def flat(self) -> _FlatEntries:
        """The entries in C order, as ndarray.flat: read by iteration or index; a write
        `x.flat[i] = v` writes into x."""
        return _FlatEntries(self)

    def squeeze(self, axis=None):
        return np.squeeze(self, axis=axis)

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        return _METHODS["astype"](self, np.dtype(dtype))

    def clip(self, min=None, max=None, out=None):
        return np.clip(self, min, max, out=out)

    def copy(self, order="C"):
        # a new object for the same value: a later y[i] = ... on the copy leaves self alone
        return Tracer(self._value, self._var, self._level)

    def conj(self):
        return np.conjugate(self)

    conjugate = conj

    def round(self, decimals=0, out=None):
        return np.round(self, decimals=decimals, out=out)

    def take(self, indices, axis=None, out=None, mode="raise"):
        return np.take(self, indices, axis=axis, out=out, mode=mode)

    def repeat(self, repeats, axis=None):
        return np.repeat(self, repeats, axis=axis)

    def nonzero(self):
        return np.nonzero(self)

    def trace(self, offset=0, axis1=0, axis2=1, dtype=None, out=None):
        return np.trace(self, offset, axis1, axis2, dtype, out)

    def diagonal(self, offset=0, axis1=0, axis2=1):
        return np.diagonal(self, offset, axis1, axis2)

    def compress(self, condition, axis=None, out=None):
        return np.compress(condition, self, axis=axis, out=out)

    def choose(self, choices, out=None, mode="raise"):
        return np.choose(self, choices, out=out, mode=mode)

    def searchsorted(self, v, side="left", sorter=None):
        return np.searchsorted(self, v, side=side, sorter=sorter)

    def sort(self, axis=-1, kind=None, order=None, *, stable=None) -> None:
        """In place, as ndarray.sort: the sorted values are written into this array."""
        self[...] = np.sort(self, axis=axis, kind=kind, order=order, stable=stable)

    def partition(self, kth, axis=-1, kind="introselect", order=None) -> None:
        """In place, as ndarray.partition."""
        self[...] = np.partition(self, kth, axis=axis, kind=kind, order=order)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def device(self) -> str:
        """ "cpu", as for every NumPy array (SciPy's array-API helpers ask for it)."""
        return "cpu"

    def __array_namespace__(self, *, api_version=None):
        """NumPy, as for an ndarray: array-API code (SciPy's helpers) then calls NumPy's
        functions, which gradtape records, and treats the value as writeable."""
        return np

    def to_device(self, device: str, /, *, stream=None) -> Tracer:
        """This value: NumPy arrays live on the CPU only (as ndarray.to_device)."""
        if device != "cpu":
            raise ValueError(f"unsupported device {device!r}: NumPy arrays live on 'cpu'")
        return self

    def __getattr__(self, name: str):
        # reached only for names a Tracer does not have: the memory of a plain ndarray
        if name in _MEMORY_ATTRIBUTES:
            raise TracedAttributeError(
                f"{user_source_line()}: the code asked for .{name} of a traced value, the "
                "memory of a plain ndarray, which a traced value does not have (gradtape records "
                "operations, not memory). Functions gradtape has no rule for do this, typically "
                "SciPy functions that hand arrays to compiled code. Give that computation a rule "
                "with gradtape.custom_vjp, or, if it needs no gradient, pass its traced inputs "
                "through gradtape.stop_gradient."
            )
        raise AttributeError(f"'Tracer' object has no attribute {name!r}")


class _FlatEntries:
    """`Tracer.flat`: a traced value's entries in C order (ndarray.flat's reading and writing;
    a value that does not broadcast to the selected entries raises, where NumPy's flat
    iterator would repeat it)."""

    def __init__(self, base: Tracer):
        self.base = base

    def __len__(self) -> int:
        return int(self.base.size)

    def __iter__(self):
        return iter(np.ravel(self.base))

    def __getitem__(self, index):
        return np.ravel(self.base)[index]

    def __setitem__(self, index, value) -> None:
        entries = np.ravel(self.base).copy()  # (a reshape's result: written as a copy)
        entries[index] = value
        self.base[...] = np.reshape(entries, self.base.shape)


# ndarray attributes about memory that a Tracer cannot have (`Tracer.__getattr__`)
_MEMORY_ATTRIBUTES = frozenset(
    "flags strides ctypes data base view tobytes tostring resize byteswap setflags itemset "
    "tofile dump dumps getfield setfield put".split()
)


def _gufunc_core_axes(ufunc, inputs, kwargs):
    """A gufunc's `axes=`, `axis=` and `keepdims=` (np.vecdot(x, y, axis=0), ...): the inputs
    with their core axes moved last, and a function placing the output's core axes where they
    were asked for; NumPy's rules for which combinations are valid."""
    axis, axes = kwargs.pop("axis", None), kwargs.pop("axes", None)
    keepdims = kwargs.pop("keepdims", False)
    signature = ufunc.signature
    if ufunc.nout != 1:
        raise GradtapeError(f"np.{ufunc.__name__} with axes=/axis= cannot be traced.")
    # "(n),(n),()"; optional dimensions (matmul's n?, m?) taken as present
    groups = signature.replace(" ", "").replace("?", "").replace("->", ",")[1:-1].split("),(")
    cores = [tuple(d for d in group.split(",") if d) for group in groups]
    in_cores, out_core = cores[: ufunc.nin], cores[ufunc.nin]
    if axis is not None:
        if axes is not None or any(len(c) > 1 for c in cores):
            raise TypeError(f"np.{ufunc.__name__}: axis= needs core dimensions of at most one")
        axes = [(axis,) if c else () for c in cores]
    if axes is None:
        axes = [tuple(range(-len(c), 0)) for c in cores]
    axes = [(a,) if isinstance(a, (int, np.integer)) else tuple(a) for a in axes]
    if len(axes) == ufunc.nin and not out_core:
        axes.append(())
    if len(axes) != ufunc.nin + 1 or any(len(a) != len(c) for a, c in zip(axes, cores)):
        raise ValueError(f"np.{ufunc.__name__}: axes= does not match its signature {signature}")
    moved = [
        np.moveaxis(x, a, tuple(range(-len(a), 0))) if a else x
        for x, a in zip(inputs, axes[: ufunc.nin])
    ]

    def place(out):
        if keepdims:  # the reduced core axis kept with size one where the inputs had it
            if out_core or len({len(c) for c in in_cores}) != 1:
                raise ValueError(f"np.{ufunc.__name__}: keepdims= needs a reduction")
            return np.expand_dims(out, axes[0]) if axes[0] else out
        out_axes = axes[ufunc.nin]
        if not out_axes:
            return out
        return np.moveaxis(out, tuple(range(-len(out_axes), 0)), out_axes)

    return moved, place


def _ufunc_with_kwargs(prim, inputs, kwargs, ufunc):
    place = None
    if ufunc.signature is not None and {"axis", "axes", "keepdims"} & set(kwargs):
        inputs, place = _gufunc_core_axes(ufunc, inputs, kwargs)
    where = kwargs.pop("where", True)
    dtype = kwargs.pop("dtype", None)
    kwargs.pop("casting", None)
    kwargs.pop("order", None)
    kwargs.pop("subok", None)
    if kwargs:
        raise GradtapeError(
            f"np.{ufunc.__name__} with {sorted(kwargs)} cannot be traced; call it without them."
        )
    if where is not True:
        raise GradtapeError(
            f"np.{ufunc.__name__}(..., where=mask) leaves masked entries uninitialised; "
            "write np.where(mask, np.f(x), fill) instead."
        )
    out = bind(prim, tuple(inputs), {})
    if place is not None:
        out = place(out)
    return _METHODS["astype"](out, np.dtype(dtype)) if dtype is not None else out


def _ufunc_into(ufunc, method: str, inputs, kwargs, out):
    """`np.f(..., out=y)` with y traced: computed as usual, then written into y in place."""
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != 1 or method != "__call__" or type(outs[0]) is not Tracer:
        raise GradtapeError(
            f"np.{ufunc.__name__}(..., out=...) writes traced values into a plain ndarray (or "
            "several outputs), which would cut the gradient. Write y = np.{0}(...) instead.".format(
                ufunc.__name__
            )
        )
    target = outs[0]
    where = kwargs.pop("where", True)
    result = ufunc(*inputs, **kwargs)
    if where is not True:
        result = np.where(where, result, target)
    result = np.broadcast_to(result, target.shape) if np.shape(result) != target.shape else result
    return target._in_place(result, ufunc.__name__)


def _is_view_index(idx, ndim: int) -> bool:
    """Whether x[idx] is a view of x in NumPy: basic indexing (ints, slices, None, ...) that
    does not pick a single element (x[1, 2] of a 2-d array is a scalar: a copy)."""
    parts = idx if type(idx) is tuple else (idx,)
    ints = 0
    for p in parts:
        if p is None or p is Ellipsis or type(p) is slice:
            return all(q is None or q is Ellipsis or type(q) is slice or _is_int(q) for q in parts)
        if not _is_int(p):
            return False
        ints += 1
    return ints < ndim


def _is_int(p) -> bool:
    return isinstance(p, (int, np.integer)) and not isinstance(p, (bool, np.bool_))


def assign(target: Tracer, new: Tracer) -> None:
    """Write `new` into the traced array `target` in place (np.add.at, np.copyto): every name
    bound to `target`, the array it views and its live views see the new value."""
    target._assign(new)


def add_view(base: Tracer, view: Tracer, index=None, recompute=None) -> None:
    """Record that `view` shows (part of) `base`: a write into `base` recomputes it.

    `index` is the basic index of x[index] (writes into the view are written into `base`), or
    None for views that cannot be written through (`recompute.__name__` names them in errors).
    """
    if index is not None:

        def recompute(b, index=index):
            return _METHODS["__getitem__"](b, index)

    view._view_of = (base, index, recompute)
    refs = base._views
    ref = weakref.ref(view)
    if refs is None:
        base._views = [ref]
        return
    if len(refs) >= 16 and (len(refs) & (len(refs) - 1)) == 0:  # prune at 16, 32, 64, ...
        refs[:] = [r for r in refs if r() is not None]
    refs.append(ref)


def _no_rule_error(what: str) -> GradtapeError:
    return GradtapeError(
        f"gradtape has no derivative rule for {what}. Define one with gradtape.custom_vjp "
        "(and custom_jvp for forward mode), or, if the value does not need a gradient, "
        "pass its inputs through gradtape.stop_gradient first."
    )
