"""Loops recorded once and not unrolled: scan, fori_loop, while_loop.

The body is recorded once (per carry/x signature and per path through its
guards) on a loop-body level, which turns the outer traced values it closes over
(an RNN's weights) into inputs of its own. The loop itself is one primitive:
`scan` evaluates the recorded body on each step, and its VJP is another loop
primitive, `scan_bwd`, that walks the stored carries backwards, differentiating
one step at a time. Staging levels (compile) record each loop as one
instruction; differentiating the backward loop again traces through it.
"""

from __future__ import annotations

import functools
import threading
import types
import weakref
from collections import OrderedDict

import numpy as np

from .. import config
from ..compile.numba import backend as numba_backend
from ..compile.numba import loops as native_loops
from ..compile.numba.loops import NativeLoop
from ..compile.numpy_backend import lower
from ..compile.step import BackwardLoopArgs, body_inputs, step_program
from ..core import tracing as trace
from ..core.errors import GradtapeError, GuardFailure
from ..core.interpret import eval_tape, guards_by_var
from ..core.ir import Var
from ..core.primitive import Primitive
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import LevelKind, bind, new_level
from ..rules._util import dtype_of, shape_of
from ..transforms.arguments import TransformedFunction
from ..transforms.linearize import linearize, record_step_vjp
from ..transforms.vmap import vmap

_MAX_BODY_VARIANTS = 32


def _concrete(x):
    # a member of a vmap batch stands for one example: the body is recorded on one
    return trace.example_value(x)


def _is_tracer(x) -> bool:
    return type(x) is trace.Tracer


def _aval(x) -> tuple:
    return (tuple(shape_of(x)), np.dtype(dtype_of(x)))


_LIVE_BODIES: weakref.WeakSet = weakref.WeakSet()  # every BodyProgram not yet freed


def renew_locks_after_fork() -> None:
    """In a child created by os.fork: a new lock for every recorded loop body (another thread
    of the parent may have been recording a path of it at the fork, holding the lock)."""
    for body in list(_LIVE_BODIES):
        body._lock = threading.Lock()


class BodyProgram:
    """A loop body as recorded tapes: one variant per path through the body's guards.

    `caps` are the outer traced values the body closed over (inputs of the loop
    primitive, so gradients reach them); each variant maps its own captures to them.
    """

    def __init__(self, fn, name: str):
        self.fn = fn
        self.name = name
        self.variants: list = []  # (tape, guards by var, capture positions)
        self.caps: list = []
        self.out_avals: list = []
        self.out_treedef = None
        self._lock = threading.Lock()
        _LIVE_BODIES.add(self)  # (a forked child renews the lock: renew_locks_after_fork)
        # per variant: generated NumPy code of the step and of its VJP (built on first use)
        self._fwd: list = []
        self._bwd: list = []
        self._lowering_failed = False
        self.native: dict = {}  # loop kind and options -> its native driver (eager calls)
        self.native_calls: dict = {}  # eager calls per loop kind before a driver is built

    def record(self, inputs) -> None:
        """Record the body on these (concrete) inputs as a new variant."""
        if len(self.variants) >= _MAX_BODY_VARIANTS:
            raise GradtapeError(
                f"the body of {self.name} took more than {_MAX_BODY_VARIANTS} different paths "
                "through its Python control flow; use np.where for data-dependent choices "
                "inside loop bodies."
            )
        with new_level(LevelKind.LOOP_BODY) as level:
            traced = [level.new_input(_concrete(x)) for x in inputs]
            outs = self.fn(*traced)
        tape = level.tape
        tape.outputs = [_output_var(level, o) for o in outs]
        positions = []
        for _, outer, _ in tape.captured:
            for i, c in enumerate(self.caps):
                if c is outer:
                    positions.append(i)
                    break
            else:
                if self.variants:
                    raise GradtapeError(
                        f"the body of {self.name} used a new traced value from outside the loop "
                        "on another path through its control flow; compute it before the loop."
                        + _input_guard_hint(self.variants[0][0])
                    )
                positions.append(len(self.caps))
                self.caps.append(outer)
        if not self.variants:
            self.out_avals = [
                (o.shape, o.dtype) if isinstance(o, Var) else _aval(o) for o in tape.outputs
            ]
        self.variants.append((tape, guards_by_var(tape), positions))
        self._fwd.append(None)
        self._bwd.append(None)

    def run(self, inputs, caps) -> list:
        """The body's outputs for one step; a step taking a new path is recorded first."""
        for tape, guards, positions in self.variants:
            try:
                return eval_tape(tape, inputs, [caps[p] for p in positions], guards)
            except GuardFailure:
                continue
        with self._lock:
            self.record(inputs)
            tape, guards, positions = self.variants[-1]
        return eval_tape(tape, inputs, [caps[p] for p in positions], guards)

    # --- the fast path: each variant lowered to generated NumPy code (concrete values only) ----
    def run_fast(self, inputs, caps) -> list:
        """`run` for concrete arrays, through the numpy backend's generated code of the step."""
        if self._lowering_failed:
            return self.run(inputs, caps)
        for i, (tape, _, positions) in enumerate(self.variants):
            args = list(inputs) + [caps[p] for p in positions]
            fwd = self._fwd[i]
            if fwd is None:
                fwd = self._fwd[i] = self._lower_or_none(
                    lambda: _lower_tape(tape, body_inputs(tape))
                )
                if fwd is None:
                    return self.run(inputs, caps)
            try:
                return list(fwd(*args, None))
            except GuardFailure:
                continue
        with self._lock:
            self.record(inputs)
        return self.run_fast(inputs, caps)

    def vjp_fast(self, inputs, caps, cts):
        """(input cotangents, capture cotangents) of one step, by generated code of its VJP."""
        if self._lowering_failed:
            return _step_vjp(self, inputs, caps, cts)
        for i, (tape, guards, positions) in enumerate(self.variants):
            vcaps = [caps[p] for p in positions]
            bwd = self._bwd[i]
            if bwd is None:
                try:
                    bwd = self._lower_or_none(
                        lambda: _lower_step_vjp(tape, guards, inputs, vcaps, cts)
                    )
                except GuardFailure:  # these inputs take another path than this variant
                    continue
                if bwd is None:
                    return _step_vjp(self, inputs, caps, cts)
                self._bwd[i] = bwd
            try:
                out = bwd(*inputs, *vcaps, *cts, None)
            except GuardFailure:
                continue
            g_in = list(out[: len(inputs)])
            g_caps = [None] * len(caps)
            for p, g in zip(positions, out[len(inputs) :]):
                g_caps[p] = _add(g_caps[p], g)
            return g_in, g_caps
        with self._lock:
            self.record(inputs)
        return self.vjp_fast(inputs, caps, cts)

    def _lower_or_none(self, build):
        try:
            return build()
        except GuardFailure:
            raise
        except Exception:  # pragma: no cover - a primitive the backend cannot lower
            self._lowering_failed = True
            return None

    def __repr__(self) -> str:
        n = len(self.variants[0][0]) if self.variants else 0
        return f"{{{self.name}: {n} instructions, {len(self.variants)} variant(s)}}"


# --- recorded bodies, reused across calls ---------------------------------------------------------
_PROGRAMS: OrderedDict = OrderedDict()
_PROGRAMS_MAX = 128
_programs_lock = threading.Lock()


_SNAPSHOT_MAX_BYTES = 1 << 20  # a closure array up to 1 MB is compared on reuse; larger: no reuse
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), np.generic, np.dtype, slice, range)
_BY_IDENTITY = (types.ModuleType, type, np.ufunc, types.BuiltinFunctionType)


class _Uncacheable(Exception):
    """A body whose Python state cannot be checked cheaply: it is recorded on every call."""


class _BodyState:
    """What a body's code reads besides its inputs: closure cells and the globals it names.

    `key` identifies it (traced values by position, shape and dtype: their values are inputs
    of the loop; other objects by identity); `tracers` are the traced values in key order;
    `arrays` the arrays it read, whose contents must be unchanged for a recorded body to be
    reused (the recording baked them in as constants: `keep` copies them); `pinned` keeps
    every object the key names by identity alive, so that its id cannot come back as another
    object's.
    """

    def __init__(self, fn):
        self.tracers: list = []
        self.arrays: list = []
        self.pinned: list = []
        self.key = self._function(fn, 0)

    def _function(self, fn, depth: int) -> tuple:
        if depth > 2:
            raise _Uncacheable
        cells = []
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                cells.append(self._value(cell.cell_contents, depth))
            except ValueError:  # an empty cell
                cells.append(None)
        env = getattr(fn, "__globals__", {})
        named = tuple(
            (name, self._value(env[name], depth))
            for name in _global_names(fn.__code__)
            if name in env
        )
        defaults = tuple(self._value(d, depth) for d in fn.__defaults__ or ())
        keyword = tuple((k, self._value(d, depth)) for k, d in (fn.__kwdefaults__ or {}).items())
        return (fn.__code__, tuple(cells), named, defaults, keyword)

    def _value(self, v, depth: int):
        t = type(v)
        if t is trace.Tracer:  # its value is an input of the loop; its shape is recorded
            self.tracers.append(v)
            return ("traced", _aval(v))
        if isinstance(v, _IMMUTABLE):
            return ("value", t, v)
        if t is np.ndarray:
            if v.nbytes > _SNAPSHOT_MAX_BYTES or v.dtype.hasobject:
                raise _Uncacheable
            self.arrays.append(v)
            return ("array", id(v))
        if t in (list, tuple, dict) or (isinstance(v, tuple) and hasattr(t, "_fields")):
            leaves, treedef = tree_flatten(v)
            return ("tree", treedef, tuple(self._value(x, depth) for x in leaves))
        if isinstance(v, _BY_IDENTITY):
            self.pinned.append(v)
            return ("object", id(v))
        if isinstance(v, types.FunctionType):
            self.pinned.append(v)
            return ("function", self._function(v, depth + 1))
        if isinstance(v, TransformedFunction):  # grad(f): the transform, f and its options
            self.pinned.append(v)
            transform, fun, options = v.transformed
            return ("transformed", id(transform), self._value(fun, depth + 1), options)
        raise _Uncacheable

    def keep(self) -> _BodyState:
        """Copy the arrays' contents, for `unchanged` to compare with (when the body is cached)."""
        self.copies = [a.copy() for a in self.arrays]
        return self

    def unchanged(self, recorded: _BodyState) -> bool:
        """Whether the arrays this call reads hold what they held when the body was recorded."""
        for now, then, copy in zip(self.arrays, recorded.arrays, recorded.copies):
            if now is not then:
                return False
            if not (now == copy).all() and not np.array_equal(  # (NaNs: compared again)
                now, copy, equal_nan=now.dtype.kind in "fc"
            ):
                return False
        return True


def _global_names(code) -> tuple:
    """The global names a code object (and the functions defined in it) may read."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_global_names(const))
    return tuple(dict.fromkeys(names))


def cached_program(
    kind: str, user_fn, flat_fn, name: str, inputs: list, avals: tuple, structure
) -> tuple:
    """(program, captured values for this call): recorded bodies are reused when the same
    code, Python state and input shapes come back (a new loop length records nothing).

    Reuse needs the body's closure and the globals it reads to be what they were: traced
    values by position (this call's are read from the same places), arrays by identity and
    contents (the recording baked them in), functions, modules and numbers by identity or
    value. A body reading other Python objects, large arrays, or traced values from
    elsewhere is recorded again on each call.
    """
    state = key = None
    if isinstance(user_fn, types.FunctionType):
        try:
            state = _BodyState(user_fn)
            key = (kind, state.key, avals, structure)
        except (_Uncacheable, TypeError):  # (TypeError: an unhashable value in the key)
            state = None
    if key is not None:
        with _programs_lock:
            hit = _PROGRAMS.get(key)
            if hit is not None:
                _PROGRAMS.move_to_end(key)
        if hit is not None and state.unchanged(hit[2]):
            program, paths, _ = hit
            caps = [state.tracers[i] for i in paths]
            with program._lock:  # a new path found during this call is recorded with these
                program.fn, program.caps = flat_fn, list(caps)
            return program, caps
    program = BodyProgram(flat_fn, name)
    program.record(inputs)
    paths = _capture_paths(state, program.caps)
    if key is not None and paths is not None:
        with _programs_lock:
            _PROGRAMS[key] = (program, paths, state.keep())
            while len(_PROGRAMS) > _PROGRAMS_MAX:
                _PROGRAMS.popitem(last=False)
    return program, list(program.caps)


def _capture_paths(state: _BodyState | None, caps: list) -> list | None:
    """Where each captured traced value sits among the body's traced values (None: not all
    of them are there, so another call could not find its own)."""
    if state is None:
        return None
    paths = []
    for c in caps:
        where = next((i for i, t in enumerate(state.tracers) if t is c), None)
        if where is None:
            return None
        paths.append(where)
    return paths


def _lower_tape(tape, inputs: list):
    """The `run(*inputs, out)` of generated NumPy code for `tape` with these input vars."""
    return lower(step_program(tape, inputs)).run


def _lower_step_vjp(tape, guards, inputs, caps, cts):
    """The step VJP of `tape` (record_step_vjp) lowered to generated NumPy code."""
    vjp_tape = record_step_vjp(tape, guards, inputs, caps, cts)
    return _lower_tape(vjp_tape, vjp_tape.inputs)


def _output_var(level, o):
    if type(o) is trace.Tracer:
        if o._level is level:
            return o._var
        return level.capture(o)[0]
    return np.asarray(o)


def _zeros(aval):
    return np.zeros(aval[0], aval[1])


def _float(aval) -> bool:
    return aval[1].kind in "fc"


# --- the step VJP shared by scan and while_loop ----------------------------------------------
def _step_vjp(program: BodyProgram, inputs: list, caps: list, cts: list):
    """Cotangents of one step's inputs and captures, given its output cotangents."""
    n = len(inputs)
    got = linearize(lambda *a: program.run(list(a[:n]), list(a[n:])), inputs + caps).vjp(cts)
    return got[:n], got[n:]


def _step_jvp(program: BodyProgram, inputs: list, caps: list, t_inputs: list, t_caps: list):
    """(outputs, output tangents) of one step, by the forward interpreter on its tape."""
    n = len(inputs)
    step = linearize(lambda *a: program.run(list(a[:n]), list(a[n:])), inputs + caps)
    return step.values(), step.jvp(t_inputs + t_caps)


def _zero_tangent(t, like):
    if t is not None:
        return t
    return np.zeros(shape_of(like), dtype_of(like) if dtype_of(like).kind in "fc" else np.float64)


def _scan_jvp(ts, ans, *args, program, n_carry, n_x, length, reverse, checkpoint):
    """Forward mode through scan. On traced values (compile, nested transforms) it is another
    scan, over (carry, tangent) pairs, whose body pushes one step's tangents: one instruction,
    not one per step. On concrete values, each step's tangents go through its recorded tape."""
    if any(_is_tracer(a) for a in (*args, *ts)):
        return _scan_jvp_as_scan(ts, args, program, n_carry, n_x, length, reverse, checkpoint)
    nc, nx = n_carry, n_x
    carry = list(args[:nc])
    xs = args[nc : nc + nx]
    caps = list(args[nc + nx :])
    t_carry = [_zero_tangent(t, c) for t, c in zip(ts[:nc], carry)]
    t_xs = ts[nc : nc + nx]
    t_caps = [_zero_tangent(t, c) for t, c in zip(ts[nc + nx :], caps)]
    t_stored, t_ys = [], []
    steps = range(length - 1, -1, -1) if reverse else range(length)
    for k, t in enumerate(steps):
        if checkpoint is None or k % checkpoint == 0:
            t_stored.append(t_carry)
        x_t = [x[t] for x in xs]
        tx_t = [_zero_tangent(None if tx is None else tx[t], xt) for tx, xt in zip(t_xs, x_t)]
        out, t_out = _step_jvp(program, carry + x_t, caps, t_carry + tx_t, t_caps)
        carry = out[:nc]
        t_carry = [_zero_tangent(tt, o) for tt, o in zip(t_out[:nc], carry)]
        t_ys.append([_zero_tangent(tt, o) for tt, o in zip(t_out[nc:], out[nc:])])
    if reverse:
        t_ys.reverse()
    y_avals = program.out_avals[nc:]
    ys = [_stack([y[i] for y in t_ys], y_avals[i], length) for i in range(len(y_avals))]
    hidden = [
        _stack([s[i] for s in t_stored], program.out_avals[i], len(t_stored)) for i in range(nc)
    ]
    return tuple(t_carry + ys + hidden)


def _tangent_step(program: BodyProgram, nc: int, caps: list, t_caps: list):
    """The body of a tangent loop: one step of `program` and its JVP, on (value, tangent)
    pairs of carries and xs; the captured values and their tangents are closed over."""

    def tangent_step(pair, x_pair):
        (c, tc), (x, tx) = pair, x_pair
        out, t_out = _step_jvp(program, c + x, caps, tc + tx, t_caps)
        t_out = [_zero_tangent(t, o) for t, o in zip(t_out, out)]
        return (out[:nc], t_out[:nc]), (out[nc:], t_out[nc:])

    return tangent_step


def _scan_jvp_as_scan(ts, args, program, nc, nx, length, reverse, checkpoint) -> tuple:
    carry, xs, caps = list(args[:nc]), list(args[nc : nc + nx]), list(args[nc + nx :])
    t_carry = [_zero_tangent(t, c) for t, c in zip(ts[:nc], carry)]
    t_xs = [_zero_tangent(t, x) for t, x in zip(ts[nc : nc + nx], xs)]
    t_caps = [_zero_tangent(t, c) for t, c in zip(ts[nc + nx :], caps)]
    outs, _, _, n_leaves, n_ys = _bind_scan(
        _tangent_step(program, nc, caps, t_caps),
        (carry, t_carry),
        (xs, t_xs),
        length,
        reverse,
        checkpoint,
    )
    ny = n_ys // 2  # outputs: carries, tangents; ys, their tangents; stored of both
    return tuple(
        [*outs[nc:n_leaves], *outs[n_leaves + ny : n_leaves + n_ys], *outs[n_leaves + n_ys + nc :]]
    )


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _stack(items, aval, length):
    if length == 0:
        return np.zeros((0,) + aval[0], aval[1])
    return np.stack(items)


# --- eager loops as native drivers ----------------------------------------------------------------
EAGER_NATIVE_AFTER = 3  # eager calls of one loop (same body, same options) before its driver
_PER_CALL_PARAMS = frozenset({"program", "body", "cond", "length"})
_native_usable: list = []


def _eager_native_enabled() -> bool:
    """Numba installed and not turned off (GRADTAPE_NUMBA=0); checked once."""
    if not _native_usable:
        _native_usable.append(numba_backend.available() and config.numba_enabled())
    return _native_usable[0]


def _native(owner: BodyProgram, prim: Primitive, args: tuple, params: dict):
    """An eager loop's results from its native driver, or None: run it in Python.

    A body's loops get native drivers (compile/numba/loops.py) after EAGER_NATIVE_AFTER
    eager calls, built in the background, so `grad` of a scan in an optimiser's loop runs
    native code after a few iterations while a one-off call never waits for Numba.
    """
    key = (prim.name, *sorted((k, v) for k, v in params.items() if k not in _PER_CALL_PARAMS))
    loop = owner.native.get(key)
    if loop is None:
        if not _eager_native_enabled():
            return None
        with owner._lock:
            count = owner.native_calls[key] = owner.native_calls.get(key, 0) + 1
            if count < EAGER_NATIVE_AFTER:
                return None
            loop = owner.native.setdefault(key, NativeLoop(prim, quiet=True))
    return loop.try_call(args, params)


def _scan_bwd_impl(*args, **params):
    """scan_bwd: the native driver on concrete values once built, else the Python loop."""
    if any(_is_tracer(a) for a in args):  # values of a lower level: the loop is bound there
        return bind(scan_bwd_p, args, params)
    result = _native(params["program"], scan_bwd_p, args, params)
    return _scan_bwd_python(*args, **params) if result is None else result


def _backward_length(stored, xs, checkpoint, recorded: int) -> int:
    """The number of steps the backward loop walks, read from its arrays: a while loop's trip
    count changes from call to call, and a compiled replay keeps the recorded parameters."""
    if stored and checkpoint is None:
        return shape_of(stored[0])[0]
    if xs:
        return shape_of(xs[0])[0]
    return recorded


def _scan_bwd_python(
    *args, program, n_carry, n_x, n_y, length, reverse, checkpoint, stored_cotangents
):
    """The backward loop: from the last step to the first, one step's VJP at a time.

    Arguments as `BackwardLoopArgs` lays them out: cotangents of the final carry and of ys,
    the stored carries, xs, the captured values, and (when `stored_cotangents`) cotangents
    of the stored carries themselves, which a second differentiation sends back.
    """
    nc, nx = n_carry, n_x
    parts = BackwardLoopArgs.split(args, n_carry, n_x, n_y, stored_cotangents)
    g_carry, g_ys, stored, xs = parts.g_carry, parts.g_ys, parts.stored, parts.xs
    caps, g_stored = parts.caps, parts.g_stored
    length = _backward_length(stored, xs, checkpoint, length)
    steps = list(range(length - 1, -1, -1)) if reverse else list(range(length))
    concrete = not any(_is_tracer(a) for a in args)
    run = program.run_fast if concrete else program.run
    g_caps = [None] * len(caps)
    g_xs = [[None] * length for _ in range(nx)]
    segment_start, segment = None, None
    for k in range(length - 1, -1, -1):
        t = steps[k]
        x_t = [x[t] for x in xs]
        if checkpoint is None:
            carry = [s[k] for s in stored]
        else:  # recompute the carries of this segment from its stored checkpoint
            start = (k // checkpoint) * checkpoint
            if start != segment_start:
                segment_start = start
                carry = [s[k // checkpoint] for s in stored]
                segment = [carry]
                for j in range(start, min(start + checkpoint, length) - 1):
                    out = run(carry + [x[steps[j]] for x in xs], caps)
                    carry = out[:nc]
                    segment.append(carry)
            carry = segment[k - start]
        cts = g_carry + [g[t] for g in g_ys]
        if concrete:
            g_in, g_c = program.vjp_fast(carry + x_t, caps, cts)
        else:
            g_in, g_c = _step_vjp(program, carry + x_t, caps, cts)
        g_carry = [
            g if g is not None else np.zeros_like(_concrete(c)) for g, c in zip(g_in[:nc], carry)
        ]
        if g_stored and (checkpoint is None or k % checkpoint == 0):
            j = k if checkpoint is None else k // checkpoint
            g_carry = [gc + gs[j] for gc, gs in zip(g_carry, g_stored)]
        for i in range(nx):
            g_xs[i][t] = g_in[nc + i]
        g_caps = [_add(a, b) for a, b in zip(g_caps, g_c)]
    out_xs = []
    for i, x in enumerate(xs):
        aval = _aval(x)
        if not _float(aval):
            out_xs.append(np.zeros(aval[0], np.float64))
            continue
        step_aval = (aval[0][1:], aval[1])
        out_xs.append(
            _stack([g if g is not None else _zeros(step_aval) for g in g_xs[i]], step_aval, length)
        )
    out_caps = [
        g
        if g is not None
        else np.zeros(shape_of(c), dtype_of(c) if dtype_of(c).kind in "fc" else np.float64)
        for g, c in zip(g_caps, caps)
    ]
    return tuple(g_carry + out_xs + out_caps)


def _scan_bwd_vjp_all(g, ans, args, params, invars):
    """Reverse mode through the backward loop (second derivatives): through its steps."""
    loop = linearize(functools.partial(_scan_bwd_python, **params), args)
    return loop.vjp(
        [gi if gi is not None else np.zeros(shape_of(a), dtype_of(a)) for gi, a in zip(g, ans)]
    )


def _scan_bwd_jvp(
    ts, ans, *args, program, n_carry, n_x, n_y, length, reverse, checkpoint, stored_cotangents
):
    """Forward mode through the backward loop (hvp, hessian). On traced values it is the
    backward loop of the tangent step (`_tangent_step`): for the pair map F(s, t) = (f(s),
    Df(s) t), the VJP with cotangents (tangent of g, g) is (tangent of Df(s)^T g, Df(s)^T g),
    so one loop computes the backward pass and its tangent. On concrete values, the
    tangents go through the loop's steps."""
    params = dict(
        program=program,
        n_carry=n_carry,
        n_x=n_x,
        n_y=n_y,
        length=length,
        reverse=reverse,
        checkpoint=checkpoint,
        stored_cotangents=stored_cotangents,
    )
    nc, nx = n_carry, n_x
    bwd = BackwardLoopArgs.split(args, n_carry, n_x, n_y, stored_cotangents)
    length = _backward_length(bwd.stored, bwd.xs, checkpoint, length)
    t_bwd = BackwardLoopArgs.split(
        [_zero_tangent(t, x) for t, x in zip(ts, args)], n_carry, n_x, n_y, stored_cotangents
    )
    if (
        length == 0
        or not bwd.caps
        or not all(_is_tracer(c) for c in bwd.caps)
        or not any(_is_tracer(x) for x in args)
    ):
        loop = linearize(functools.partial(_scan_bwd_python, **params), args)
        return tuple(_zero_tangent(t, o) for t, o in zip(loop.jvp(ts), loop.outputs))
    example = ([_concrete(s)[0] for s in bwd.stored], [_concrete(s)[0] for s in t_bwd.stored])
    pair, pair_caps, _, _, _, _ = _scan_program(
        _tangent_step(program, nc, bwd.caps, t_bwd.caps), example, (bwd.xs, t_bwd.xs), length
    )
    # the pair loop's carries are (carry, tangent): its cotangents (tangent of g, g)
    pair_args = BackwardLoopArgs(
        t_bwd.g_carry + bwd.g_carry,
        t_bwd.g_ys + bwd.g_ys,
        bwd.stored + t_bwd.stored,
        bwd.xs + t_bwd.xs,
        pair_caps,
        t_bwd.g_stored + bwd.g_stored,
    )
    g_pair_carry, g_pair_xs, g_pair_caps = pair_args.outputs(
        bind(scan_bwd_p, pair_args.flat(), pair_args.params(pair, length, reverse, checkpoint))
    )
    t_g_caps = []
    for c in bwd.caps:
        i = next((i for i, p in enumerate(pair_caps) if p is c), None)
        t_g_caps.append(g_pair_caps[i] if i is not None else _zero_tangent(None, c))
    return tuple([*g_pair_carry[:nc], *g_pair_xs[:nx], *t_g_caps])


scan_bwd_p = Primitive(
    "scan_bwd", _scan_bwd_impl, multiple_results=True, jvp=_scan_bwd_jvp, reads_trip_count=True
)
scan_bwd_p.vjp_all = _scan_bwd_vjp_all
scan_bwd_p.python_impl = _scan_bwd_python


def _scan_bwd_batch(prim, args, batched, **params):
    """vmap of the backward loop (per-example gradients of a scan, fori_loop or while_loop).

    The stored carries of a batched forward loop are each member's own (batch axis first),
    so each member gets the cotangents of its own loop. Recorded (compile, a loop body), it is
    one backward loop over the batch whose step is the member's step mapped over the batch
    (`_batched_backward_loop`); on concrete values, one walk over the steps, each step's VJP
    mapped over the batch. Either way each rule of the step runs once on the whole batch.
    """
    parts = BackwardLoopArgs.split(
        args, params["n_carry"], params["n_x"], params["n_y"], params["stored_cotangents"]
    )
    if parts.xs and params["checkpoint"] is None:
        return _backward_as_scan(args, batched, **params)
    if any(_is_tracer(a) for a in args) and all(_is_tracer(c) for c in parts.caps):
        return _batched_backward_loop(args, batched, **params)
    in_axes = tuple(0 if b else None for b in batched)
    return vmap(lambda *a: _scan_bwd_python(*a, **params), in_axes=in_axes)(*args)


def _split_batched(args, batched, n_carry, n_x, n_y, stored_cotangents) -> tuple:
    """A backward loop's arguments and their batched flags split into their groups
    (BackwardLoopArgs.split), and the batch size."""
    split = functools.partial(
        BackwardLoopArgs.split,
        n_carry=n_carry,
        n_x=n_x,
        n_y=n_y,
        stored_cotangents=stored_cotangents,
    )
    size = next(shape_of(a)[0] for a, b in zip(args, batched) if b)
    return split(args), split(batched), size


def _backward_as_scan(
    args, batched, program, n_carry, n_x, n_y, length, reverse, checkpoint, stored_cotangents
):
    """The batched backward loop as a scan over the steps from the last to the first, whose
    step is the member's step VJP mapped over the batch (as JAX batches the transpose of a
    scan). The VJP of each member gives each member its own cotangents of values the batch
    shares, with the rules' own forms (an outer product, a matrix-vector product), which the
    backends fuse; the cotangents of the captured values are carried and summed."""
    parts, flags, size = _split_batched(args, batched, n_carry, n_x, n_y, stored_cotangents)
    nc = n_carry

    def full(v, b):
        return v if b else np.broadcast_to(v, (size,) + shape_of(v))

    def by_step(v, b, indexed_by_step=True):
        """A stacked value in the order the forward loop visited its steps, loop axis first
        (xs and their cotangents are indexed by step, stored carries by visit)."""
        v = np.swapaxes(v, 0, 1) if b else v
        return v[::-1] if reverse and indexed_by_step else v

    caps = parts.caps
    cap_axes = [0 if b else None for b in flags.caps]
    x_axes = [0 if b else None for b in flags.xs]
    gy_axes = [0 if b else None for b in flags.g_ys]

    def member_vjp(carry, x, k, g_carry, g_y):
        g_in, g_k = _step_vjp(program, list(carry) + list(x), list(k), list(g_carry) + list(g_y))
        inputs = list(carry) + list(x)
        g_in = [
            g if g is not None else np.zeros(shape_of(v), _cotangent_dtype(v))
            for g, v in zip(g_in, inputs)
        ]
        g_k = [
            g if g is not None else np.zeros(shape_of(c), _cotangent_dtype(c))
            for g, c in zip(g_k, k)
        ]
        return g_in, g_k

    mapped_vjp = vmap(member_vjp, in_axes=(0, x_axes, cap_axes, 0, gy_axes))

    def backward_step(carry, step):
        g_carry, g_caps = carry
        stored, x, g_y, g_stored = step
        g_in, g_k = mapped_vjp(stored, x, caps, g_carry, g_y)
        g_carry = list(g_in[:nc])
        if g_stored:
            g_carry = [g + s for g, s in zip(g_carry, g_stored)]
        return (g_carry, [a + b for a, b in zip(g_caps, g_k)]), list(g_in[nc:])

    g_carry = [full(g, b) for g, b in zip(parts.g_carry, flags.g_carry)]
    g_caps = [
        np.zeros(shape_of(c) if b else (size,) + shape_of(c), _cotangent_dtype(c))
        for c, b in zip(caps, flags.caps)
    ]
    steps = (
        [by_step(v, b, False) for v, b in zip(parts.stored, flags.stored)],
        [by_step(v, b) for v, b in zip(parts.xs, flags.xs)],
        [by_step(v, b) for v, b in zip(parts.g_ys, flags.g_ys)],
        [by_step(v, b, False) for v, b in zip(parts.g_stored, flags.g_stored)],
    )
    (g_init, g_caps), g_xs = scan(backward_step, (g_carry, g_caps), steps, reverse=True)
    g_xs = [np.swapaxes(g[::-1] if reverse else g, 0, 1) for g in g_xs]
    return tuple([*g_init, *g_xs, *g_caps])


def _batched_backward_loop(
    args, batched, program, n_carry, n_x, n_y, length, reverse, checkpoint, stored_cotangents
):
    """One scan_bwd over the batch: every argument gets the batch axis (values shared by the
    members are broadcast, so that each member gets its own cotangent of them), the stacked
    ones with the loop's axis first and the batch second."""
    parts, flags, size = _split_batched(args, batched, n_carry, n_x, n_y, stored_cotangents)

    def full(values, are_batched, stacked=False):
        out = [
            v if b else np.broadcast_to(v, (size,) + shape_of(v))
            for v, b in zip(values, are_batched)
        ]
        return [np.swapaxes(v, 0, 1) for v in out] if stacked else out

    caps = full(parts.caps, flags.caps)
    stored = full(parts.stored, flags.stored, stacked=True)
    xs = full(parts.xs, flags.xs, stacked=True)
    member_step = vmap(lambda c, x, k: program.run(list(c) + list(x), list(k)))

    def batched_step(carry, x):
        out = member_step(carry, x, caps)
        return list(out[:n_carry]), list(out[n_carry:])

    steps = _backward_length(stored, xs, checkpoint, length)
    example = (
        [_concrete(s)[0] for s in stored]
        if steps
        else [_concrete(c) for c in full(parts.g_carry, flags.g_carry)]
    )
    step_program, step_caps, _, _, _, _ = _scan_program(batched_step, example, xs, steps)
    loop = BackwardLoopArgs(
        full(parts.g_carry, flags.g_carry),
        full(parts.g_ys, flags.g_ys, stacked=True),
        stored,
        xs,
        step_caps,
        full(parts.g_stored, flags.g_stored, stacked=True),
    )
    g_init, g_xs, g_step_caps = loop.outputs(
        bind(scan_bwd_p, loop.flat(), loop.params(step_program, length, reverse, checkpoint))
    )
    g_caps = []
    for c in caps:
        j = next((j for j, k in enumerate(step_caps) if k is c), None)
        g_caps.append(
            g_step_caps[j] if j is not None else np.zeros(shape_of(c), _cotangent_dtype(c))
        )
    return tuple([*g_init, *(np.swapaxes(g, 0, 1) for g in g_xs), *g_caps])


def _cotangent_dtype(x) -> np.dtype:
    return dtype_of(x) if dtype_of(x).kind in "fc" else np.dtype(np.float64)


scan_bwd_p.batch = _scan_bwd_batch


# --- scan -----------------------------------------------------------------------------------
def _scan_impl(*args, **params):
    if any(_is_tracer(a) for a in args):  # values of a lower level: the loop is bound there
        return bind(scan_p, args, params)
    result = _native(params["program"], scan_p, args, params)
    return _scan_python(*args, **params) if result is None else result


def _scan_python(*args, program, n_carry, n_x, length, reverse, checkpoint):
    """The forward loop in Python: one call of the body's generated NumPy code per step."""
    carry = list(args[:n_carry])
    xs = args[n_carry : n_carry + n_x]
    caps = list(args[n_carry + n_x :])
    stored, ys = [], []
    steps = range(length - 1, -1, -1) if reverse else range(length)
    for k, t in enumerate(steps):
        if checkpoint is None or k % checkpoint == 0:
            stored.append(carry)
        out = program.run_fast(carry + [x[t] for x in xs], caps)
        carry = out[:n_carry]
        ys.append(out[n_carry:])
    if reverse:
        ys.reverse()
    y_avals = program.out_avals[n_carry:]
    ys_stacked = [
        _stack([np.asarray(y[i]) for y in ys], y_avals[i], length) for i in range(len(y_avals))
    ]
    hidden = [
        _stack([s[i] for s in stored], program.out_avals[i], len(stored)) for i in range(n_carry)
    ]
    return tuple(carry + ys_stacked + hidden)


def _scan_vjp_all(g, ans, args, params, invars):
    nc, nx = params["n_carry"], params["n_x"]
    program = params["program"]
    ny = len(program.out_avals) - nc
    g_carry = [
        gi if gi is not None else np.zeros(shape_of(a), dtype_of(a))
        for gi, a in zip(g[:nc], ans[:nc])
    ]
    g_ys = [
        gi if gi is not None else np.zeros(shape_of(a), dtype_of(a))
        for gi, a in zip(g[nc : nc + ny], ans[nc : nc + ny])
    ]
    hidden = ans[nc + ny :]
    g_hidden = _stored_cotangents(g[nc + ny :], hidden)
    xs = args[nc : nc + nx]
    caps = args[nc + nx :]
    bwd = BackwardLoopArgs(g_carry, g_ys, list(hidden), list(xs), list(caps), g_hidden)
    outs = bind(
        scan_bwd_p,
        bwd.flat(),
        bwd.params(program, params["length"], params["reverse"], params["checkpoint"]),
    )
    return [o if dtype_of(a).kind in "fc" else None for o, a in zip(outs, args)]


def _stored_cotangents(g_hidden, hidden) -> list:
    """Cotangents of the stored carries (only a second differentiation produces them)."""
    if all(gh is None for gh in g_hidden):
        return []
    return [
        gh if gh is not None else np.zeros(shape_of(h), dtype_of(h))
        for gh, h in zip(g_hidden, hidden)
    ]


def _scan_batch(prim, args, batched, program, n_carry, n_x, length, reverse, checkpoint):
    """vmap of scan: one scan over the batch, whose step is the member's step mapped over the
    batch (so a compiled batch runs one loop). Its stored carries, batch axis first, are each
    member's own: a gradient inside the vmap (per-example gradients) reads them, and its
    backward loop is batched too (`_scan_bwd_batch`)."""
    size = next(shape_of(a)[0] for a, b in zip(args, batched) if b)
    carry = [
        a if b else np.broadcast_to(a, (size,) + shape_of(a))
        for a, b in zip(args[:n_carry], batched[:n_carry])
    ]
    # batched xs step along their second axis: the scan's axis first, the batch second
    xs = [
        np.swapaxes(a, 0, 1) if b else a
        for a, b in zip(args[n_carry : n_carry + n_x], batched[n_carry : n_carry + n_x])
    ]
    x_axes = [0 if b else None for b in batched[n_carry : n_carry + n_x]]
    caps = list(args[n_carry + n_x :])
    cap_axes = [0 if b else None for b in batched[n_carry + n_x :]]
    member_step = vmap(
        lambda c, x, k: program.run(list(c) + list(x), list(k)), in_axes=(0, x_axes, cap_axes)
    )

    def step(c, x):
        out = member_step(c, x, caps)
        return list(out[:n_carry]), list(out[n_carry:])

    outs, _, _, nc, ny = _bind_scan(step, carry, xs, length, reverse, checkpoint)
    return tuple(list(outs[:nc]) + [np.swapaxes(o, 0, 1) for o in outs[nc:]])


scan_p = Primitive("scan", _scan_impl, multiple_results=True, jvp=_scan_jvp, batch=_scan_batch)
scan_p.python_impl = _scan_python
scan_p.vjp_all = _scan_vjp_all


def scan(
    body,
    init,
    xs=None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int = 1,
    checkpoint: int | None = None,
):
    """`body(carry, x) -> (carry, y)` over the leading axis of `xs`; returns `(carry, ys)`.

    JAX's semantics. The body is recorded once, not once per step, and the loop is
    one instruction on the tape, so a new length re-records nothing. `checkpoint=k`
    keeps every k-th carry for the backward pass and recomputes the others
    (memory T/k + k carries instead of T). `unroll` is accepted for compatibility.

    Parameters
    ----------
    body : callable
        `body(carry, x) -> (carry, y)`, plain NumPy code; the carry keeps its structure, shapes
        and dtypes.
    init : array, float or pytree
        The initial carry.
    xs : array or pytree, optional
        Sliced along the leading axis, one slice per step; None with `length`.
    length : int, optional
        The number of steps when `xs` is None.
    reverse : bool, default False
        Walk the steps from last to first.
    unroll : int, default 1
        Accepted for compatibility with JAX; ignored.
    checkpoint : int, optional
        Keep every k-th carry for the backward pass.

    Returns
    -------
    tuple
        `(final_carry, ys)`, the `y` of every step stacked along a new leading axis.

    Raises
    ------
    GradtapeError
        A body whose carry changes structure, shape or dtype, or does something that cannot be
        differentiated.
    ValueError
        Neither `xs` nor `length`, or leading axes that disagree.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> def step(total, x):
    ...     return total + x, total * x
    >>> carry, ys = gt.scan(step, 0.0, np.array([1.0, 2.0, 3.0]))
    >>> print(float(carry), ys)
    6.0 [0. 2. 9.]
    """
    outs, carry_td, y_td, nc, ny = _bind_scan(body, init, xs, length, reverse, checkpoint)
    return tree_unflatten(carry_td, list(outs[:nc])), tree_unflatten(y_td, list(outs[nc : nc + ny]))


def _bind_scan(body, init, xs, length, reverse, checkpoint) -> tuple:
    """Bind scan_p for `scan`: (all its outputs: carry leaves, ys leaves, stored carries;
    the carry's and ys' tree structures; the numbers of carry and ys leaves)."""
    program, caps, carry_leaves, xs_leaves, n, carry_td = _scan_program(body, init, xs, length)
    nc = len(carry_leaves)
    outs = bind(
        scan_p,
        (*carry_leaves, *xs_leaves, *caps),
        dict(
            program=program,
            n_carry=nc,
            n_x=len(xs_leaves),
            length=n,
            reverse=bool(reverse),
            checkpoint=checkpoint,
        ),
    )
    return outs, carry_td, program.out_treedef, nc, len(program.out_avals) - nc


def _scan_program(body, init, xs, length) -> tuple:
    """(the recorded body, its captured values, carry leaves, xs leaves, length, carry tree)."""
    carry_leaves, carry_td = tree_flatten(init)
    carry_leaves = [c if hasattr(c, "dtype") else np.asarray(c) for c in carry_leaves]
    xs_leaves, xs_td = tree_flatten(xs)
    xs_leaves = [x if hasattr(x, "dtype") else np.asarray(x) for x in xs_leaves]
    n = _scan_length(xs_leaves, length)
    x0 = [_concrete(x)[0] if n > 0 else np.zeros(shape_of(x)[1:], dtype_of(x)) for x in xs_leaves]
    nc = len(carry_leaves)
    name = getattr(body, "__name__", "body")

    y_treedef = []

    def flat_body(*leaves):
        new_carry, y = body(
            tree_unflatten(carry_td, leaves[:nc]), tree_unflatten(xs_td, leaves[nc:])
        )
        c_leaves, c_td = tree_flatten(new_carry)
        if c_td != carry_td:
            raise GradtapeError(
                f"scan: {name} returned a carry with structure {c_td}, but "
                f"the initial carry has structure {carry_td}."
            )
        y_leaves, y_td = tree_flatten(y)
        y_treedef.append(y_td)
        return c_leaves + y_leaves

    avals = tuple(_aval(c) for c in carry_leaves) + tuple(_aval(x) for x in x0)
    program, caps = cached_program(
        "scan",
        body,
        flat_body,
        f"scan body {name}",
        [_concrete(c) for c in carry_leaves] + x0,
        avals,
        (carry_td, xs_td),
    )
    if program.out_treedef is None:
        program.out_treedef = y_treedef[0]
    _check_carry(program, carry_leaves, name)
    return program, caps, carry_leaves, xs_leaves, n, carry_td


def _scan_length(xs_leaves, length) -> int:
    lengths = []
    for i, x in enumerate(xs_leaves):
        s = shape_of(x)
        if not s:
            raise GradtapeError(
                f"scan: leaf {i} of xs is a scalar; every leaf of xs needs a "
                "leading axis to scan over."
            )
        lengths.append(s[0])
    if len(set(lengths)) > 1:
        detail = ", ".join(f"leaf {i}: {n}" for i, n in enumerate(lengths))
        raise GradtapeError(f"scan: the leaves of xs have different leading lengths ({detail}).")
    if length is not None and lengths and lengths[0] != length:
        raise GradtapeError(f"scan: length={length} but xs has leading length {lengths[0]}.")
    if length is None and not lengths:
        raise GradtapeError("scan: give xs or length.")
    return int(length if length is not None else lengths[0])


def _check_carry(program: BodyProgram, carry_leaves, name: str) -> None:
    for i, c in enumerate(carry_leaves):
        want = _aval(c)
        got = program.out_avals[i]
        if tuple(got[0]) != tuple(want[0]) or np.dtype(got[1]) != want[1]:
            raise GradtapeError(
                f"{name}: carry leaf {i} changes from shape {want[0]} {want[1]} to shape "
                f"{tuple(got[0])} {np.dtype(got[1])} in one step; a loop carry must keep its "
                "shape and dtype (cast with .astype, or initialise it with the right dtype)."
            )


def fori_loop(lower: int, upper: int, body, init_val):
    """`body(i, val) -> val` for i in range(lower, upper), recorded once (a scan over i).

    Parameters
    ----------
    lower, upper : int
        The counter's range (Python integers, or traced integers under `while_loop`).
    body : callable
        `body(i, val) -> val`, plain NumPy code.
    init_val : array, float or pytree
        The initial value.

    Returns
    -------
    array, float or pytree
        The value after the last step.

    Raises
    ------
    GradtapeError
        A body that changes the value's structure, shape or dtype.

    Examples
    --------
    >>> import gradtape as gt
    >>> print(gt.fori_loop(0, 3, lambda i, v: v * 2.0, 1.0))
    8.0
    """
    lower, upper = int(lower), int(upper)

    def step(carry, i):
        return body(i, carry), None

    carry, _ = scan(step, init_val, np.arange(lower, max(lower, upper)))
    return carry


# --- while_loop -------------------------------------------------------------------------------
def _while_impl(*args, **params):
    if any(_is_tracer(a) for a in args):
        return bind(while_p, args, params)
    result = _native(params["body"], while_p, args, params)
    return _while_python(*args, **params) if result is None else result


def _while_python(*args, body, cond, n_carry, n_body_caps):
    """The loop in Python: the condition's and the body's generated NumPy code per step."""
    carry = list(args[:n_carry])
    bcaps = list(args[n_carry : n_carry + n_body_caps])
    ccaps = list(args[n_carry + n_body_caps :])
    stored = []
    while bool(np.asarray(cond.run_fast(carry, ccaps)[0])):
        stored.append(carry)
        carry = body.run_fast(carry, bcaps)
    hidden = [
        _stack([s[i] for s in stored], body.out_avals[i], len(stored)) for i in range(n_carry)
    ]
    return tuple(carry + hidden)


def _while_vjp_all(g, ans, args, params, invars):
    nc, nb = params["n_carry"], params["n_body_caps"]
    g_carry = [
        gi if gi is not None else np.zeros(shape_of(a), dtype_of(a))
        for gi, a in zip(g[:nc], ans[:nc])
    ]
    hidden = ans[nc:]
    g_hidden = _stored_cotangents(g[nc:], hidden)
    length = shape_of(hidden[0])[0] if hidden else 0
    bwd = BackwardLoopArgs(g_carry, [], list(hidden), [], list(args[nc : nc + nb]), g_hidden)
    outs = bind(scan_bwd_p, bwd.flat(), bwd.params(params["body"], length, False, None))
    cts = list(outs) + [None] * (len(args) - nc - nb)
    return [o if dtype_of(a).kind in "fc" else None for o, a in zip(cts, args)]


def _while_jvp(ts, ans, *args, body, cond, n_carry, n_body_caps):
    """Forward mode through while_loop. On traced values (compile, nested transforms) it is
    another while_loop, over (carry, tangent) pairs, whose trip count is found at run time
    like the primal's; on concrete values each iteration's tangents go through its tape."""
    carry = list(args[:n_carry])
    bcaps = list(args[n_carry : n_carry + n_body_caps])
    ccaps = list(args[n_carry + n_body_caps :])
    t_carry = [_zero_tangent(t, c) for t, c in zip(ts[:n_carry], carry)]
    t_bcaps = [_zero_tangent(t, c) for t, c in zip(ts[n_carry : n_carry + n_body_caps], bcaps)]
    if any(_is_tracer(a) for a in (*args, *ts)):

        def pair_cond(pair):
            return cond.run(list(pair[0]), ccaps)[0]

        def pair_body(pair):
            out, t_out = _step_jvp(body, list(pair[0]), bcaps, list(pair[1]), t_bcaps)
            return list(out), [_zero_tangent(t, o) for t, o in zip(t_out, out)]

        outs, _, n = _bind_while(pair_cond, pair_body, (carry, t_carry))
        return tuple([*outs[n_carry:n], *outs[n + n_carry :]])
    t_stored = []
    while bool(np.asarray(_concrete(cond.run(carry, ccaps)[0]))):
        t_stored.append(t_carry)
        carry, t_out = _step_jvp(body, carry, bcaps, t_carry, t_bcaps)
        t_carry = [_zero_tangent(tt, o) for tt, o in zip(t_out, carry)]
    hidden = [
        _stack([s[i] for s in t_stored], body.out_avals[i], len(t_stored)) for i in range(n_carry)
    ]
    return tuple(t_carry + hidden)


while_p = Primitive(
    "while_loop",
    _while_impl,
    multiple_results=True,
    jvp=_while_jvp,
    shape_from_data=lambda params: slice(params["n_carry"], None),
)
while_p.python_impl = _while_python
while_p.vjp_all = _while_vjp_all

# the numba backend's native drivers of the loop primitives
native_loops.register_driver(scan_p, native_loops.forward_spec)
native_loops.register_driver(scan_bwd_p, native_loops.backward_spec)
native_loops.register_driver(while_p, native_loops.while_spec)


def _while_batch(prim, args, batched, body, cond, n_carry, n_body_caps):
    """vmap of while_loop, as JAX: one loop over the whole batch that runs while any member's
    condition holds; a member whose condition fails keeps its carry (np.where). When the loop
    is also differentiated per member (a grad inside the vmap), the members must take the
    same number of steps: the gradient of each walks its own stored carries, which the
    batched loop's are (batch axis first) only then. A count of each member's steps checks it.
    """
    differentiated = trace.read_above()
    size = next(shape_of(a)[0] for a, b in zip(args, batched) if b)
    carry = [
        a if b else np.broadcast_to(a, (size,) + shape_of(a))
        for a, b in zip(args[:n_carry], batched[:n_carry])
    ]
    bcaps = list(args[n_carry : n_carry + n_body_caps])
    ccaps = list(args[n_carry + n_body_caps :])
    b_axes = [0 if b else None for b in batched[n_carry : n_carry + n_body_caps]]
    c_axes = [0 if b else None for b in batched[n_carry + n_body_caps :]]
    member_cond = vmap(lambda c, k: cond.run(list(c), list(k))[0], in_axes=(0, c_axes))
    member_body = vmap(lambda c, k: body.run(list(c), list(k)), in_axes=(0, b_axes))

    def any_member(c):
        return np.any(member_cond(c[:n_carry], ccaps))

    def step_active_members(c):
        going = member_cond(c[:n_carry], ccaps)
        new = member_body(c[:n_carry], bcaps)
        stepped = [
            np.where(np.reshape(going, (size,) + (1,) * (len(shape_of(o)) - 1)), n, o)
            for n, o in zip(new, c[:n_carry])
        ]
        return stepped + [c[n_carry] + going.astype(np.int64)] if differentiated else stepped

    start = carry + [np.zeros(size, np.int64)] if differentiated else carry
    outs, _, n = _bind_while(any_member, step_active_members, start)
    if differentiated and bool(np.any(outs[n_carry] != outs[n_carry][0])):
        raise GradtapeError(
            "while_loop differentiated inside vmap: the members of the batch ran different "
            "numbers of iterations, and the gradient of each needs its own stored carries. "
            "Differentiate outside the vmap (grad of vmap), or use fori_loop or scan with a "
            "fixed number of steps."
        )
    return tuple(list(outs[:n_carry]) + [np.swapaxes(h, 0, 1) for h in outs[n : n + n_carry]])


while_p.batch = _while_batch


def while_loop(cond_fun, body_fun, init_val):
    """`while cond_fun(val): val = body_fun(val)`, recorded once; differentiable in reverse mode.

    The trip count is found at run time; the backward pass walks back through the
    stored carries of the iterations that ran.

    Parameters
    ----------
    cond_fun : callable
        `cond_fun(val) -> bool`.
    body_fun : callable
        `body_fun(val) -> val`, plain NumPy code.
    init_val : array, float or pytree
        The initial value.

    Returns
    -------
    array, float or pytree
        The value once `cond_fun` is false.

    Raises
    ------
    GradtapeError
        A body that changes the value's structure, shape or dtype, or forward-mode
        differentiation through the loop (reverse mode only).

    Examples
    --------
    >>> import gradtape as gt
    >>> print(gt.while_loop(lambda v: v < 10.0, lambda v: v * 2.0, 1.0))
    16.0
    """
    outs, td, n = _bind_while(cond_fun, body_fun, init_val)
    return tree_unflatten(td, list(outs[:n]))


def _bind_while(cond_fun, body_fun, init_val) -> tuple:
    """Bind while_p: (its outputs, the final carry leaves then the stored ones; the carry's
    tree structure; the number of carry leaves)."""
    leaves, td = tree_flatten(init_val)
    leaves = [c if hasattr(c, "dtype") else np.asarray(c) for c in leaves]
    name = getattr(body_fun, "__name__", "body")

    def flat_body(*ls):
        new, new_td = tree_flatten(body_fun(tree_unflatten(td, ls)))
        if new_td != td:
            raise GradtapeError(
                f"while_loop: {name} returned structure {new_td}, but the "
                f"initial value has structure {td}."
            )
        return new

    def flat_cond(*ls):
        return [cond_fun(tree_unflatten(td, ls))]

    avals = tuple(_aval(c) for c in leaves)
    concrete = [_concrete(c) for c in leaves]
    body, body_caps = cached_program(
        "while_body", body_fun, flat_body, f"while_loop body {name}", concrete, avals, td
    )
    _check_carry(body, leaves, name)
    cond, cond_caps = cached_program(
        "while_cond",
        cond_fun,
        flat_cond,
        f"while_loop cond {getattr(cond_fun, '__name__', 'cond')}",
        concrete,
        avals,
        td,
    )
    outs = bind(
        while_p,
        (*leaves, *body_caps, *cond_caps),
        dict(body=body, cond=cond, n_carry=len(leaves), n_body_caps=len(body_caps)),
    )
    return outs, td, len(leaves)


def _input_guard_hint(tape) -> str:
    """Why a body takes a new path at every step, when it is because a Python int was taken
    from one of its inputs (the loop counter indexing a plain NumPy array: NumPy asks the
    index for a Python int)."""
    inputs = {v.id for v in tape.inputs}
    for guard in tape.guards:
        if guard.var.id in inputs and guard.kind in ("index", "value", "int"):
            return (
                f" The path depends on a loop input's value ({guard.where}): a plain NumPy "
                "array indexed by the loop counter (E[i], np.take(E, i)) asks the counter for a "
                "Python int, so each step is another path. Hand the rows to the loop instead "
                "(gradtape.scan(step, carry, E) gives step one row of E per step), or select "
                "with a traced comparison (np.where(np.arange(n) == i, ...))."
            )
    return ""
