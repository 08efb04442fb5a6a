"""Trace levels, recording, and the thread-local stack of levels.

Tracing is eager and nested: each level (a `grad`, a `jvp`, a `trace`/`compile`)
owns a tape. A Tracer of level L holds the value one level down, which may itself
be a Tracer of a lower level; `bind` records an instruction at the highest level
among its arguments and computes the value by binding again one level down.
"""

from __future__ import annotations

import enum
import os
import sys
import threading

import numpy as np

from .errors import GradtapeError
from .ir import Guard, Instruction, Tape, Var

Tracer = None  # the Tracer class; set by tracer.py (it imports this module)

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
    """

    DIFFERENTIATE = "differentiate"
    STAGE = "stage"
    LOOP_BODY = "loop body"


class Level:
    """One tracing level. `record_all`: also record values with no derivative (for replay)."""

    __slots__ = ("id", "kind", "tape", "active", "record_all", "captures", "_nvars",
                 "__weakref__")

    def __init__(self, kind: LevelKind):
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

    def new_var(self, value) -> Var:
        try:
            v = Var(self._nvars, value.shape, value.dtype)
        except AttributeError:  # a Python scalar
            v = Var(self._nvars, np.shape(value), _dtype_of(value))
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
            value = outer
            while type(value) is Tracer:
                value = value._value
            hit = self.captures[id(outer)] = (self.new_var(value), outer, value)
            self.tape.captured.append(hit)
        return hit

    def add_guard(self, var: Var, kind: str, answer) -> None:
        self.tape.guards.append(Guard(var, kind, answer, _user_source_line()))

    def __repr__(self) -> str:
        return f"<Level {self.id} {self.kind.value}{'' if self.active else ' (closed)'}>"


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

    def __init__(self, kind: LevelKind):
        for hook in level_hooks:
            hook()
        self.level = Level(kind)

    def __enter__(self) -> Level:
        self.stack = _stack()
        self.stack.append(self.level)
        return self.level

    def __exit__(self, *exc) -> None:
        level, stack = self.level, self.stack
        level.active = False
        # pop this level and anything left above it by an exception
        while stack:
            top = stack.pop()
            top.active = False
            if top is level:
                break


def current_levels() -> list:
    return list(_stack())


def bind(prim, args: tuple, params: dict):
    """Apply `prim` to `args`: record it at the highest level among the Tracer arguments."""
    top = None
    for a in args:
        if type(a) is Tracer:
            lv = a._level
            if top is None or lv.id > top.id:
                top = lv
    if top is None:
        return prim.impl(*args, **params)
    if not top.active:
        raise _leaked_error(top)
    if prim.transparent and not top.record_all:
        # differentiated through its implementation (which is written with primitives)
        return prim.impl(*args, **params)
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
    if not top.record_all and (prim.nondiff or not _inexact(out, prim.multiple_results)):
        return out
    vals = tuple(vals)
    invars = tuple(invars)
    if prim.multiple_results:
        outvars = tuple(top.new_var(o) for o in out)
        top.tape.instructions.append(Instruction(prim, invars, vals, params, outvars, out))
        return type(out)(Tracer(o, v, top) for o, v in zip(out, outvars))
    var = top.new_var(out)
    top.tape.instructions.append(Instruction(prim, invars, vals, params, (var,), out))
    return Tracer(out, var, top)


def _inexact(out, multiple: bool) -> bool:
    if multiple:
        return any(_inexact(o, False) for o in out)
    dt = getattr(out, "dtype", None)
    if dt is None:
        return isinstance(out, (float, complex))
    return dt.kind in "fc"


def _leaked_error(level) -> GradtapeError:
    return GradtapeError(
        f"a traced value from a finished transformation ({level!r}) was used again. This happens "
        "when a traced value escapes the function being differentiated (stored in a global, a "
        "closure or an attribute). Return it from the function instead, or wrap it in "
        "gradtape.stop_gradient before storing it."
    )


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the gradtape package
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__))


def _user_source_line() -> str:
    """The first frame outside gradtape (and NumPy's dispatch): where the user asked for a value."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIR) and _NUMPY_DIR not in fn:
            break
        f = f.f_back
    if f is None:
        return "<unknown>"
    import linecache

    line = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}: {line}"
