"""`compile`: signatures, variants, guards, and the registry of backends.

A call is keyed by its signature: the structure of the arguments, each leaf's
shape and dtype, and the values of the static arguments. The first call with a
signature records the whole program at a staging level (under `compile(grad(f))`
the grad level sits above it, so forward and backward operations land on the
same tape), builds a Program and lowers it with a backend. Later calls replay the
lowered code. A replay checks every guard; when one fails, the answer it saw
selects another variant recorded for that path, or a new variant is recorded.
Variants of one signature form a tree keyed by guard answers, so alternating
inputs never record again; their number is bounded, and a function that keeps
re-recording is reported once and then runs eagerly on paths not yet recorded.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from .. import config
from ..core import tracing as trace
from ..core.errors import GradtapeError, GuardFailure, NotExportableError
from ..core.ir import Tape, Var, source_text
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import LevelKind, new_level
from ..transforms.arguments import compile_leaf_message, user_line
from . import lengths
from .memo import remembered
from .program import (
    Program,
    answer_key,
    build_program,
    output_leaf,
    unreplayable_reason,
)

_TRACE_STATE = trace._state  # the thread-local stack of levels: non-empty while tracing
_ndarray = np.ndarray  # (a global name is found faster than a module attribute)

# --- backends -------------------------------------------------------------------------------
# name -> lower(program) -> an object with `run(*leaves, out_leaves)` and `source`: run returns
# fresh results (out_leaves None) or writes into out_leaves and returns None; a failed check
# raises program.GuardFailure
BACKENDS: dict[str, Callable[[Program], Any]] = {}
AUTO_ORDER: list[str] = ["numpy"]  # what backend="auto" tries, first available wins


#: makers of native handles (`CompiledFunction.as_native`), registered by the numba backend
NATIVE_EXPORTERS: list[Callable[[Program, str], Any]] = []


def register_native_exporter(make_handle: Callable[[Program, str], Any]) -> None:
    """Make `as_native` build its handles with `make_handle(program, name)`."""
    NATIVE_EXPORTERS.insert(0, make_handle)


def register_backend(name: str, lower: Callable[[Program], Any], *, auto: bool = False) -> None:
    """Make `compile(f, backend=name)` use `lower`; `auto=True` also prefers it for "auto"."""
    BACKENDS[name] = lower
    if auto and name not in AUTO_ORDER:
        AUTO_ORDER.insert(0, name)


def _numpy_lower(program: Program):
    from . import numpy_backend

    return numpy_backend.lower(program)


register_backend("numpy", _numpy_lower)


def resolve_backend(name: str) -> Callable[[Program], Any]:
    if name == "auto":
        for candidate in AUTO_ORDER:
            if candidate in BACKENDS:
                return BACKENDS[candidate]
    lower = BACKENDS.get(name)
    if lower is None and name == "numba":
        raise _numba_unavailable()
    if lower is None:
        raise ValueError(
            f"compile: unknown backend {name!r}; available: {', '.join(['auto', *BACKENDS])}"
        )
    return lower


def _numba_unavailable() -> ImportError:
    """The error for backend="numba" where it is not registered: Numba is not installed (the
    command that installs it), or GRADTAPE_NUMBA turned the backend off."""
    import importlib.util

    from .. import config

    if not config.numba_enabled():
        return ImportError(
            'compile: backend="numba" is turned off by GRADTAPE_NUMBA=0 in the environment; '
            'unset it, or use backend="numpy" (or "auto")'
        )
    if importlib.util.find_spec("numba") is None:
        return ImportError(
            'compile: backend="numba" needs Numba, which is not installed; install it with '
            '`pip install "gradtape[numba]"` (or `pip install numba`), or use '
            'backend="numpy" (or "auto", which uses Numba when it is installed)'
        )
    return ImportError('compile: backend="numba" is not available in this process')


class CompileWarning(UserWarning):
    """A compiled function could not stay compiled (it keeps taking new paths, ...).

    Emitted when a signature exceeds `max_variants` or a function cannot be replayed (it reads
    random numbers or global state through traced values); the calls then run the function
    eagerly, with the same results.

    Examples
    --------
    >>> import warnings
    >>> import gradtape as gt
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", gt.CompileWarning)  # make it an error in tests
    """


# --- signatures -----------------------------------------------------------------------------
_PY_SCALARS = {
    float: np.float64,
    int: np.asarray(0).dtype.type,
    bool: np.bool_,
    complex: np.complex128,
}


def _leaf_key(x, where: str):
    t = type(x)
    if t is np.ndarray:
        if x.dtype.kind not in "biufc":
            raise GradtapeError(
                f"compile: {where} is an array of dtype {x.dtype}, which cannot "
                "be traced. Pass numeric arrays, or mark the argument static."
            )
        return (x.shape, x.dtype)
    if t in _PY_SCALARS:
        return t
    if isinstance(x, np.generic) and x.dtype.kind in "biufc":
        return ("scalar", x.dtype)
    labelled = compile_leaf_message(x, where)
    if labelled is not None:
        raise GradtapeError(labelled)
    if isinstance(x, np.matrix):
        raise GradtapeError(
            f"compile: {where} is a numpy.matrix: gradtape traces ndarrays, and np.matrix gives "
            "* and ** other meanings (matrix products). Pass np.asarray(x) and write matrix "
            "products with @."
        )
    if t is trace.Tracer:
        raise GradtapeError(
            f"compile: {where} is a traced value of a finished transformation; "
            "it cannot be passed to a compiled function."
        )
    raise GradtapeError(
        f"compile: {where} is a {t.__module__}.{t.__qualname__}, which a compiled function "
        "cannot take as a traced argument. Pass NumPy arrays, Python numbers, or tuples, lists "
        "and dicts of them; mark other arguments static (static_argnums / static_argnames: "
        "they must be hashable, and each new value records the function again)."
    )


def _array_key(args: tuple):
    """The signature of positional ndarray arguments (the common case), else None."""
    if len(args) == 1:
        a = args[0]
        return ((a.shape, a.dtype),) if type(a) is np.ndarray else None
    key = []
    for a in args:
        if type(a) is not np.ndarray:
            return None
        key.append((a.shape, a.dtype))
    return tuple(key)


def _replay_leaf(x):
    """Python numbers are replayed as NumPy scalars (they were recorded as 0-d arrays)."""
    conv = _PY_SCALARS.get(type(x))
    return x if conv is None else conv(x)


def _type_str(key) -> str:
    from ..core.ir import DTYPE_SHORT

    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], np.dtype):
        if key[0] == "scalar":
            return f"{DTYPE_SHORT.get(str(key[1]), str(key[1]))} scalar"
        return Var(0, key[0], key[1]).type_str
    return getattr(key, "__name__", repr(key))


def _render(td, types) -> str:
    """A pytree structure with each leaf shown as its type."""
    if td.kind == "leaf":
        return next(types)
    if td.kind == "none":
        return "None"
    inner = [_render(c, types) for c in td.children]
    if td.kind == "dict":
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(td.meta, inner)) + "}"
    if td.kind == "custom":
        return f"{td.meta[0].__name__}(" + ", ".join(inner) + ")"
    text = ", ".join(inner)
    return f"[{text}]" if td.kind == "list" else f"({text}{',' if len(inner) == 1 else ''})"


@dataclass
class SignatureStats:
    """Counters for one signature; every call is one replay, one recording or one eager call."""

    replays: int = 0
    recordings: int = 0
    guard_failures: int = 0
    eager_calls: int = 0
    variants: int = 0


_STAT_NAMES = tuple(f.name for f in fields(SignatureStats))


class _Variant:
    """One recorded path: its tape, Program, lowered code and the answers of its checks."""

    __slots__ = ("tape", "program", "lowered", "path", "run")

    def __init__(self, tape: Tape, program: Program, lowered):
        self.tape = tape
        self.program = program
        self.lowered = lowered
        self.run = lowered.run
        self.path = tuple(answer_key(c.kind, c.answer) for c in program.checks)


class _Signature:
    """The variants recorded for one signature, and the tree that selects among them."""

    __slots__ = ("_label", "variants", "by_prefix", "hot", "stats", "eager_reason", "used")

    def __init__(self, label: str | Callable[[], str]):
        self._label = label  # (or the function that writes it: most labels are never read)
        self.variants: list[_Variant] = []
        self.by_prefix: dict[tuple, _Variant] = {}
        self.hot: _Variant | None = None
        self.stats = SignatureStats()
        self.eager_reason: str | None = None
        self.used = next(_clock)  # when last dispatched to: the least recent is dropped

    @property
    def label(self) -> str:
        """The readable signature, "(f64[1000], {'w': f32[3]})"."""
        label = self._label
        if type(label) is not str:
            label = self._label = label()
        return label

    def add(self, variant: _Variant) -> _Variant:
        for v in self.variants:
            if v.path == variant.path:  # another thread recorded the same path first
                return v
        self.variants.append(variant)
        path = variant.path
        for i in range(len(path) + 1):
            self.by_prefix.setdefault(path[:i], variant)
        self.stats.variants = len(self.variants)
        return variant


_clock = itertools.count()  # (next() on it is atomic: threads need no lock)


_MAX_LENGTH_TEMPLATES = 8  # families of signatures whose first recording is kept


class _LengthTemplate:
    """The first recording of a family of signatures that differ by lengths, and the old
    lengths for which a full recording at another length gave its Program, length replaced."""

    __slots__ = ("key", "tape", "program_outputs", "program", "verified")

    def __init__(self, key, tape: Tape, program_outputs: list, program: Program):
        self.key = key
        self.tape = tape
        self.program_outputs = program_outputs  # the result leaves as recorded
        self.program = program
        self.verified: set[int] = set()


class _CallInfo:
    """How one call's arguments split into traced leaves and static values."""

    __slots__ = ("key", "leaves", "in_tree", "args", "kwargs")

    def __init__(self, key, leaves, in_tree, args, kwargs):
        self.key = key
        self.leaves = leaves
        self.in_tree = in_tree
        self.args = args
        self.kwargs = kwargs


def _line_of_operation(fn, args, kwargs, name: str) -> str | None:
    """`file.py:12: the line` where `fn` first asks for the operation `name` on these arguments,
    found by recording the call once more on a tape that keeps the user's lines (compiled
    recordings do not, to record faster); None when it cannot be found."""
    leaves, treedef = tree_flatten((args, kwargs))
    try:
        with new_level(LevelKind.DIFFERENTIATE) as level:
            traced = [
                level.new_input(x) if isinstance(x, np.ndarray) and x.dtype.kind in "fc" else x
                for x in leaves
            ]
            call_args, call_kwargs = tree_unflatten(treedef, traced)
            fn(*call_args, **call_kwargs)
            for ins in level.tape.instructions:
                if ins.prim.name == name and ins.source is not None:
                    return source_text(ins.source)
    except Exception:  # (only a better message is at stake)
        return None
    return None


# --- the compiled function ---------------------------------------------------------------------
_LIVE_FUNCTIONS: weakref.WeakSet = weakref.WeakSet()  # every CompiledFunction not yet freed


def renew_locks_after_fork() -> None:
    """In a child created by os.fork: a new lock for every live compiled function. Another
    thread of the parent may have held one at the fork (recording a variant); that thread does
    not exist in the child, so the lock would never be released and the child's next recording
    would wait forever. (Called by gradtape/process.py's fork handler.)"""
    for function in list(_LIVE_FUNCTIONS):
        function._lock = threading.Lock()


class CompiledFunction:
    """What `compile(f)` returns: records `f` once per signature and replays the lowered code.

    Call it as `f` (with `out=` to write into given arrays). `source(*args)` is the generated
    code for those arguments' signature, `tape(*args)` and `tapes(*args)` the recorded tapes
    with their guards, `stats` the counts of calls, recordings and variants. It pickles when
    `f` does (the variants are recorded again in the new process).

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> def f(x):
    ...     return np.sum(np.exp(x))
    >>> cf = gt.compile(f, backend="numpy")
    >>> float(cf(np.zeros(3)))
    3.0
    >>> "exp" in cf.source(np.zeros(3))
    True
    """

    def __init__(
        self,
        fun: Callable,
        backend: str = "auto",
        static_argnums: Sequence[int] = (),
        max_variants: int = 8,
        static_argnames: Sequence[str] = (),
    ):
        if not callable(fun):
            raise GradtapeError(
                f"compile: expected a function, got {type(fun).__name__} {fun!r:.60} "
                f"{user_line()}. Pass the function itself, gradtape.compile(f), and call the "
                "result with the arguments: gradtape.compile(f)(x)."
            )
        if max_variants < 1:
            raise ValueError("compile: max_variants must be at least 1")
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._backend_name = backend
        self._lower = resolve_backend(backend)
        prepare = getattr(self._lower, "prepare", None)
        if prepare is not None:  # the backend starts what it needs (Numba's import) now
            prepare()
        self._static = tuple(
            sorted(
                {
                    int(i)
                    for i in (
                        (static_argnums,) if isinstance(static_argnums, int) else static_argnums
                    )
                }
            )
        )
        if any(i < 0 for i in self._static):
            raise ValueError("compile: static_argnums must be non-negative positions")
        self._static_names = (
            (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        )
        self._max_variants = int(max_variants)
        # at most _max_signatures, least recently used dropped first (GRADTAPE_MAX_SIGNATURES)
        self._signatures: dict = {}
        self._max_signatures = config.max_signatures()
        self._roll = config.roll_enabled()  # (settings read now are part of compile's memo key)
        self._dropped = SignatureStats()  # the counters of dropped signatures
        self._lock = threading.Lock()
        _LIVE_FUNCTIONS.add(self)  # (a forked child renews the lock: renew_locks_after_fork)
        self._warned = False
        self._last: tuple = (None,) * 5  # the hot path's signature; see _make_hot
        # family of signatures (the same arguments up to lengths) -> its _LengthTemplate
        self._lengths: dict = {}

    # --- calling ---------------------------------------------------------------------------
    def __call__(self, *args, out=None, **kwargs):
        if out is None and not kwargs and len(args) == 1:
            # the hot path: one array of the signature last replayed, whose variant still holds
            a = args[0]
            last = self._last  # (shape, dtype, run, variant, stats); see _make_hot
            if (
                type(a) is _ndarray
                and a.shape == last[0]
                and a.dtype is last[1]
                and not _TRACE_STATE.__dict__.get("stack")
            ):
                try:
                    result = last[2](a, None)
                except GuardFailure as gf:  # another path: _dispatch selects or records it
                    return self._dispatch(self._call_info(args, kwargs), None, (last[3], gf))[0]
                last[4].replays += 1
                return result
        if _TRACE_STATE.__dict__.get("stack"):  # (getattr is slow in a thread without one)
            # under an outer transformation (grad(compile(f))): it records f's operations itself
            if out is not None:
                raise GradtapeError(
                    "compile: out= cannot be used while the compiled function is "
                    "being traced by another transformation."
                )
            return self._fun(*args, **kwargs)
        sig = None
        if not kwargs and not self._static:  # positional arrays: their key, without flattening
            sig = self._signatures.get(_array_key(args))
        variant = None if sig is None else sig.hot
        if variant is None:
            return self._dispatch(self._call_info(args, kwargs), out)[0]
        sig.used = next(_clock)
        try:
            if out is None:
                result = variant.run(*args, None)
            else:
                variant.run(*args, _out_leaves(variant.program, out, args))
                result = out
        except GuardFailure as gf:
            return self._dispatch(self._call_info(args, kwargs), out, (variant, gf))[0]
        sig.stats.replays += 1
        return result

    def _call_info(self, args: tuple, kwargs: dict) -> _CallInfo:
        if not kwargs and not self._static:
            key = _array_key(args)
            if key is not None and all(a.dtype.kind in "biufc" for a in args):
                return _CallInfo(key, list(args), None, args, kwargs)
        nargs = len(args)
        static = tuple((i, type(args[i]), args[i]) for i in self._static if i < nargs)
        static += tuple((k, type(kwargs[k]), kwargs[k]) for k in self._static_names if k in kwargs)
        try:
            hash(static)
        except TypeError:
            raise GradtapeError(
                "compile: static arguments must be hashable (their values key "
                "the cache); got " + ", ".join(f"{type(v).__name__}" for _, _, v in static)
            ) from None
        dyn_args = tuple(a for i, a in enumerate(args) if i not in self._static)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
        leaves, in_tree = tree_flatten((dyn_args, dyn_kwargs))
        keys = tuple(_leaf_key(x, f"argument leaf {i}") for i, x in enumerate(leaves))
        leaves = [_replay_leaf(x) for x in leaves]
        return _CallInfo((in_tree, keys, nargs, static), leaves, in_tree, args, kwargs)

    def _dispatch(self, info: _CallInfo, out, failed: tuple | None = None):
        """Replay (or record) for one call; returns (result, the variant that produced it).

        `failed`: (variant, GuardFailure) when the hot path already tried that variant.
        """
        sig = self._signatures.get(info.key)
        if sig is None:
            return self._record_and_run(None, info, out, None)
        sig.used = next(_clock)
        stats = sig.stats
        variant, failure = sig.hot, None
        tried: list = []
        if failed is not None:
            tried.append(failed[0])
            variant, failure = self._after_failure(sig, *failed, tried)
        while variant is not None:
            out_leaves = None if out is None else _out_leaves(variant.program, out, info.leaves)
            try:
                result = variant.run(*info.leaves, out_leaves)
            except GuardFailure as gf:
                tried.append(variant)
                variant, failure = self._after_failure(sig, variant, gf, tried)
                continue
            self._make_hot(sig, variant, info)
            stats.replays += 1
            return (out if out is not None else result), variant
        if sig.eager_reason is not None:
            return self._eager(sig, info, out), None
        return self._record_and_run(sig, info, out, failure)

    @staticmethod
    def _after_failure(sig: _Signature, variant: _Variant, gf: GuardFailure, tried=()):
        """The variant recorded for the path the failed check took (or None), and the failure.

        A rolled loop's check compares every iteration at once, and variants whose loops ran
        another number of iterations check other arrays: when a check at or after such a
        check fails and no variant is known for its answer, the variants not tried yet in this
        call are."""
        sig.stats.guard_failures += 1
        check = variant.program.checks[gf.index]
        path = variant.path[: gf.index] + (answer_key(check.kind, gf.actual),)
        found = sig.by_prefix.get(path)
        if found is None and any(c.rolled for c in variant.program.checks[: gf.index + 1]):
            found = next((v for v in sig.variants if all(v is not t for t in tried)), None)
        return found, (check, gf.actual)

    # --- recording ---------------------------------------------------------------------------
    def _record_and_run(self, sig: _Signature | None, info: _CallInfo, out, failure):
        if sig is not None and len(sig.variants) >= self._max_variants:
            self._warn_once(self._too_many_variants_message(sig, failure))
            sig.eager_reason = sig.eager_reason or "too many variants"
            return self._eager(sig, info, out), None
        tape, outputs, out_tree, traced = self._trace(info)
        reused = (
            None if sig is not None else self._at_other_length(info.key, tape, outputs, out_tree)
        )
        if reused is not None:  # the program of another length: its code, rebound
            program, lowered = reused
            reason = None
        else:
            program = self._program(tape, outputs, out_tree)
            reason = unreplayable_reason(program)
            if reason is None and sig is None:
                self._learn_lengths(info.key, tape, outputs, program)
            lowered = None if reason else self._lower(program)
        _release_recorded_values(tape, program)
        with self._lock:
            if sig is None:
                sig = self._signatures.get(info.key)
                if sig is None:
                    # (the label is written when read, from the key alone: not the arrays)
                    shape_only = _CallInfo(info.key, None, info.in_tree, None, None)
                    sig = self._signatures[info.key] = _Signature(
                        functools.partial(self._label, shape_only)
                    )
                    self._drop_least_recent()
            sig.stats.recordings += 1
            if reason is not None:
                sig.eager_reason = reason
            else:
                variant = sig.add(_Variant(tape, program, lowered))
        if reason is not None:
            self._warn_once(f"compile: {self._name()} runs eagerly for {sig.label}: {reason}.")
            return self._deliver(traced, out), None  # counted once: as the recording
        out_leaves = None if out is None else _out_leaves(program, out, info.leaves)
        try:
            result = variant.run(*info.leaves, out_leaves)
        except GuardFailure as gf:
            # the replay disagrees with the recording on the same inputs: the function is not
            # a function of its arguments (random numbers, global state)
            check = program.checks[gf.index]
            self._warn_once(
                f"compile: {self._name()} took a different path when replayed on the inputs it "
                f"was recorded with ({check.where}: recorded {check.answer!r}, replay saw "
                f"{gf.actual!r}). Does it read random numbers or global state? The result of this "
                "call comes from the recording."
            )
            return self._deliver(traced, out), variant
        self._make_hot(sig, variant, info)
        return (out if out is not None else result), variant

    def _drop_least_recent(self) -> None:
        """Keep at most _max_signatures signatures (under self._lock): drop the least recently
        used, with its variants, lowered code and buffers; it is recorded again if it comes
        back."""
        while len(self._signatures) > self._max_signatures:
            key = min(self._signatures, key=lambda k: self._signatures[k].used)
            dropped = self._signatures.pop(key)
            for name in _STAT_NAMES:
                setattr(
                    self._dropped, name, getattr(self._dropped, name) + getattr(dropped.stats, name)
                )
            if self._last[3] in dropped.variants:
                self._last = (None,) * 5

    def _make_hot(self, sig: _Signature, variant: _Variant, info: _CallInfo) -> None:
        """Make `variant` the one the hot path replays first for `sig`; a one-array signature
        also becomes `_last`, which the hot path checks without hashing a key."""
        sig.hot = variant
        if info.in_tree is None and len(info.leaves) == 1:
            ((shape, dtype),) = info.key
            self._last = (shape, dtype, variant.run, variant, sig.stats)

    # --- a new length of a known program (compile/lengths.py) ---------------------------------
    def _at_other_length(self, key, tape: Tape, outputs: list, out_tree) -> tuple | None:
        """(program, lowered) for a new signature whose recording is the program recorded
        for another length, with that length replaced; None otherwise."""
        template = self._lengths.get(lengths.family_key(key))
        if template is None:
            return None
        change = lengths.length_change(template.key, key)
        if change is None or change[0] not in template.verified:
            return None
        old, new = change
        if not (
            template.program.out_tree == out_tree
            and lengths.same_tape(template.tape, tape, old, new)
            and lengths.same_outputs(template.program_outputs, outputs, old, new)
        ):
            return None
        program = lengths.program_at_length(template.program, tape, old, new)
        return program, self._lower(program)  # (the backend rebinds what it can)

    def _learn_lengths(self, key, tape: Tape, outputs: list, program: Program) -> None:
        """Keep the first recording of each family of signatures (the same arguments up to
        lengths) as its template. A later length whose recording and Program are the
        template's with the length replaced marks that length replaceable: further lengths
        are then not simplified again, and their Program names the template's as its origin
        so that the backend rebinds its lowered code (each backend checks its rebinding
        against its full lowering of this first one)."""
        family = lengths.family_key(key)
        if family is None:
            return
        template = self._lengths.get(family)
        if template is None:
            with self._lock:
                self._lengths[family] = _LengthTemplate(key, tape, outputs, program)
                while len(self._lengths) > _MAX_LENGTH_TEMPLATES:
                    del self._lengths[next(iter(self._lengths))]  # the oldest
            return
        change = lengths.length_change(template.key, key)
        if change is None or change[0] in template.verified:
            return
        old, new = change
        if (
            template.program.out_tree == program.out_tree
            and lengths.same_tape(template.tape, tape, old, new)
            and lengths.same_outputs(template.program_outputs, outputs, old, new)
            and lengths.same_program(template.program, program, old, new)
        ):
            template.verified.add(old)
            program.origin = (template.program, old, new)

    def _record(self, info: _CallInfo, native_loops: bool | None = None):
        """Run the function on stage Tracers; returns (tape, program, traced result).
        `native_loops`: the backend runs rolled Python loops natively (its lower function's
        `native_loops`; rolling then starts at shorter programs)."""
        tape, outputs, out_tree, traced = self._trace(info)
        return tape, self._program(tape, outputs, out_tree, native_loops), traced

    def _program(self, tape: Tape, outputs: list, out_tree, native_loops: bool | None = None):
        """The Program of a recording."""
        if native_loops is None:
            native_loops = getattr(self._lower, "native_loops", False)
        return build_program(tape, outputs, out_tree, roll=self._roll, native_loops=native_loops)

    def _trace(self, info: _CallInfo):
        """Run the function on stage Tracers; returns (tape, output leaves, output tree,
        traced result)."""
        with new_level(LevelKind.STAGE) as level:
            tracers = [level.new_input(x) for x in info.leaves]
            args, kwargs = self._rebuild(info, tracers)
            try:
                result = self._fun(*args, **kwargs)
            except ValueError as e:
                clear = trace.plain_write_error(e)
                if clear is not None:
                    raise clear from e
                raise
        res_leaves, out_tree = tree_flatten(result)
        outputs, values = [], []
        for x in res_leaves:
            if type(x) is trace.Tracer:
                if x._level is not level:
                    raise GradtapeError(
                        f"compile: {self._name()} returned a traced value of another "
                        "transformation (it escaped from an outer grad or a closure)."
                    )
                outputs.append(output_leaf(x._value, x._var))
                values.append(x._value)
            else:
                outputs.append(output_leaf(x, None))
                values.append(x)
        tape = level.tape
        tape.outputs = [leaf.var if leaf.var is not None else leaf.const for leaf in outputs]
        return tape, outputs, out_tree, tree_unflatten(out_tree, values)

    def _rebuild(self, info: _CallInfo, leaves) -> tuple[list, dict]:
        if info.in_tree is None:
            return list(leaves), {}
        dyn_args, dyn_kwargs = tree_unflatten(info.in_tree, leaves)
        args, it = [], iter(dyn_args)
        for i in range(len(info.args)):
            args.append(info.args[i] if i in self._static else next(it))
        kwargs = dict(dyn_kwargs)
        kwargs.update((k, info.kwargs[k]) for k in self._static_names if k in info.kwargs)
        return args, kwargs

    # --- results -----------------------------------------------------------------------------
    @staticmethod
    def _deliver(result, out):
        """Return `result`, or copy it into the caller's `out=` structure and return that."""
        if out is None:
            return result
        res_leaves, res_td = tree_flatten(result)
        out_leaves, out_td = tree_flatten(out)
        if res_td != out_td:
            raise GradtapeError(
                f"compile: out= has structure {out_td}, but the result has structure {res_td}."
            )
        for o, r in zip(out_leaves, res_leaves):
            if type(o) is not np.ndarray or o.shape != np.shape(r):
                raise GradtapeError(
                    f"compile: out= leaf of shape {getattr(o, 'shape', None)} "
                    f"cannot hold a result of shape {np.shape(r)}."
                )
        _refuse_overlapping_out(out_leaves)
        for o, r in zip(out_leaves, res_leaves):
            np.copyto(o, r)
        return out

    def _eager(self, sig: _Signature, info: _CallInfo, out):
        sig.stats.eager_calls += 1
        result = self._fun(*info.args, **info.kwargs)
        if out is None:
            return result
        return self._deliver(result, out)

    # --- reporting -----------------------------------------------------------------------------
    def _name(self) -> str:
        return getattr(self._fun, "__qualname__", None) or repr(self._fun)

    def _label(self, info: _CallInfo) -> str:
        """A readable signature: "(f64[1000], {'w': f32[3]}, scale=f64 scalar) static 3='sum'"."""
        if info.in_tree is None:
            return "(" + ", ".join(_type_str(k) for k in info.key) + ")"
        in_tree, keys, _, static = info.key
        types = iter([_type_str(k) for k in keys])
        args_tree, kwargs_tree = in_tree.children
        parts = [_render(c, types) for c in args_tree.children]
        parts += [
            f"{k}={_render(c, types)}" for k, c in zip(kwargs_tree.meta, kwargs_tree.children)
        ]
        text = "(" + ", ".join(parts) + ")"
        if static:
            text += " static " + ", ".join(f"{i}={v!r}" for i, _, v in static)
        return text

    def _too_many_variants_message(self, sig: _Signature, failure) -> str:
        where = "a data-dependent check"
        why = ""
        if failure is not None:
            check, actual = failure
            where = check.where
            why = f" (its {check.kind} answer was {check.answer!r} when recorded, now {actual!r})"
        return (
            f"compile: {self._name()} was recorded {len(sig.variants)} times for "
            f"{sig.label} (max_variants={self._max_variants}) because the guard at {where} "
            f"keeps taking new values{why}: Python control flow on traced values records "
            "one variant per path. New paths of this signature now run eagerly (exact, "
            "uncompiled). Use np.where for data-dependent selection, or make the value a "
            "static argument."
        )

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, CompileWarning, stacklevel=5)

    # --- introspection -----------------------------------------------------------------------
    def _variant_for(self, args, kwargs) -> tuple[_Signature | None, _Variant | None]:
        info = self._call_info(args, kwargs)
        _, variant = self._dispatch(info, None)
        return self._signatures.get(info.key), variant

    def tape(self, *args, **kwargs) -> Tape:
        """The recorded Tape that these arguments replay (recording it if needed)."""
        sig, variant = self._variant_for(args, kwargs)
        if variant is None:
            raise GradtapeError(
                f"compile: these arguments run eagerly ({sig.eager_reason}); "
                "see .tapes() for the recorded variants."
            )
        return variant.tape

    def tapes(self, *args, **kwargs) -> list[Tape]:
        """Every recorded Tape (one per variant) of the signature of these arguments."""
        sig, _ = self._variant_for(args, kwargs)
        return [v.tape for v in sig.variants]

    def lowered(self, *args, **kwargs):
        """The backend's lowered variant that these arguments replay (recorded if needed), or
        None when they run eagerly: what `source()` and the numba backend's tiers read."""
        _, variant = self._variant_for(args, kwargs)
        return None if variant is None else variant.lowered

    def as_native(self, *args, **kwargs) -> Any:
        """Native entry points of this function: a Numba function for `@njit` code and a C
        function pointer, with no Python between the caller and the compiled kernels.

        The function must take one float64 array (any shape: close over the other values, or
        bind them with `functools.partial`; closed-over arrays are bound once, by address) and
        return one or two float64 results (`value_and_grad`: the value, then the gradient).
        The C entry point is
        `int32_t f(int64_t n, const double *x, double *value, double *grad, void *data)`,
        called with `data = handle.data_address`; `handle.numba` is
        `status = f(x, value, grad, data)` with `data = handle.data`. The status is 0 when
        done, positive (3) when a result is NaN or infinite, negative when nothing was
        computed: -1 a wrong size, -2 a point on another path than the recorded one, -3 bad
        data, -4 a non-contiguous buffer. See docs/numba-callable.md.

        Parameters
        ----------
        *args, **kwargs
            An example call. Its shapes fix the handle's sizes, and the path it takes through
            Python branches is the one the handle computes.

        Returns
        -------
        NativeHandle
            `.numba`, `.cfunc`, `.address`, `.ctypes_function`, `.data`, `.data_address`,
            the sizes `.n`, `.value_size`, `.grad_size`; calling it from Python returns what
            the compiled function returns.

        Raises
        ------
        GradtapeError
            Naming what cannot be exported: an operation without a native translation, a
            loop (`scan`, `while_loop`), several traced arguments, results that are not
            float64, more than two results.
        ImportError
            Numba is not installed (`pip install "gradtape[numba]"`).

        Examples
        --------
        >>> import numpy as np
        >>> import gradtape as gt
        >>> vg = gt.compile(gt.value_and_grad(lambda x: np.sum(x**2)))
        >>> h = vg.as_native(np.ones(3))
        >>> value, grad = h(np.array([0.0, 1.0, 2.0]))
        >>> print(float(value), grad)
        5.0 [0. 2. 4.]
        """
        info = self._call_info(args, kwargs)
        tape, program, _ = self._record(info, native_loops=False)  # (exported: no loops)
        reason = unreplayable_reason(program)
        if reason is not None:
            raise GradtapeError(f"as_native: {self._name()} cannot be compiled: {reason}")
        if not NATIVE_EXPORTERS:
            raise ImportError('as_native needs the numba backend: pip install "gradtape[numba]"')
        try:
            return NATIVE_EXPORTERS[0](program, self._name())
        except NotExportableError as refusal:
            line = refusal.operation and _line_of_operation(
                self._fun, args, kwargs, refusal.operation
            )
            if not line or line in str(refusal):
                raise
            where = f" (at {line})"
            raise NotExportableError(
                str(refusal).replace(repr(refusal.operation), repr(refusal.operation) + where, 1),
                refusal.reason.replace(repr(refusal.operation), repr(refusal.operation) + where, 1),
                refusal.operation,
            ) from None

    def source(self, *args, **kwargs) -> str:
        """The generated source that these arguments replay."""
        sig, variant = self._variant_for(args, kwargs)
        if variant is None:
            raise GradtapeError(f"compile: these arguments run eagerly ({sig.eager_reason}).")
        return variant.lowered.source

    @property
    def stats(self) -> dict:
        """Totals of calls, replays, recordings, guard failures, eager calls, variants, and the
        same counters per signature (`per_signature`, keyed by a readable signature). Signatures
        dropped as least recently used (GRADTAPE_MAX_SIGNATURES) leave `per_signature`; their
        counters stay in the totals."""
        per = {}
        for sig in list(self._signatures.values()):
            counts = asdict(sig.stats)
            counts["calls"] = counts["replays"] + counts["recordings"] + counts["eager_calls"]
            per[sig.label] = counts
        dropped = asdict(self._dropped)
        dropped["calls"] = dropped["replays"] + dropped["recordings"] + dropped["eager_calls"]
        dropped["variants"] = 0  # (no longer held)
        totals = {
            k: sum(s[k] for s in per.values()) + dropped[k]
            for k in ("calls", *asdict(SignatureStats()))
        }
        totals["per_signature"] = per
        return totals

    def __repr__(self) -> str:
        return f"<compiled {self._name()} backend={self._backend_name}>"

    # --- pickling: the function and the options; re-recorded and re-lowered on load -----------
    def __reduce__(self):
        module = sys.modules.get(getattr(self, "__module__", None) or "")
        qualname = getattr(self, "__qualname__", "")
        obj = module
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if obj is self:  # used as a decorator: the module attribute is this object
            return qualname
        return (
            _rebuild,
            (self._fun, self._backend_name, self._static, self._max_variants, self._static_names),
        )


def _release_recorded_values(tape: Tape, program: Program) -> None:
    """Drop the values seen while recording (every intermediate of the recording call): the
    lowered code no longer needs them. Constants stay, so the tape still prints in full."""
    for ins in (*tape.instructions, *program.instructions):
        if ins.out is not None:
            ins.args = tuple(None if v is not None else a for v, a in zip(ins.invars, ins.args))
            ins.out = None


def _out_leaves(program: Program, out, arg_leaves) -> list:
    """Validate a caller's `out=` structure against the result; returns its leaves."""
    spec = program.out_spec
    if type(out) is tuple and program.out_is_flat_tuple and len(out) == len(spec):
        leaves = out  # the common case, (value, gradient): no flattening
    else:
        leaves, td = tree_flatten(out)
        if td != program.out_tree:
            raise GradtapeError(
                f"compile: out= has structure {td}, but the result has "
                f"structure {program.out_tree}."
            )
    for o, (shape, dtype) in zip(leaves, spec):
        if (
            type(o) is not np.ndarray
            or o.shape != shape
            or o.dtype != dtype
            or not o.flags["WRITEABLE"]
        ):
            raise _bad_out(o, shape, dtype)
        for x in arg_leaves:
            # arrays that own their memory overlap only if they are the same array
            if type(x) is np.ndarray and (
                x is o or (x.base is not None or o.base is not None) and np.may_share_memory(o, x)
            ):
                raise GradtapeError(
                    "compile: an out= array shares memory with an argument; pass separate arrays."
                )
    _refuse_overlapping_out(leaves)
    return leaves


def _refuse_overlapping_out(leaves) -> None:
    """Raise when two out= arrays share memory: one result would overwrite another."""
    for i, o in enumerate(leaves):
        for p in leaves[:i]:
            # arrays that own their memory overlap only if they are the same array
            if p is o or (p.base is not None or o.base is not None) and np.may_share_memory(p, o):
                raise GradtapeError(
                    "compile: two out= arrays share memory (the same array twice, or "
                    "overlapping views), so one result would overwrite another; pass a "
                    "separate array for each result."
                )


def _bad_out(o, shape, dtype) -> GradtapeError:
    if type(o) is np.ndarray and o.shape == shape and o.dtype == dtype:
        return GradtapeError("compile: an out= array is read-only.")
    return GradtapeError(
        f"compile: out= leaves must be ndarrays shaped like the result: shape "
        f"{shape} and dtype {dtype} expected, got {type(o).__name__} "
        f"{getattr(o, 'shape', '')} {getattr(o, 'dtype', '')}."
    )


def _rebuild(fun, backend, static_argnums, max_variants, static_argnames):
    return CompiledFunction(fun, backend, static_argnums, max_variants, static_argnames)


def compile(
    fun: Callable,
    backend: str = "auto",
    static_argnums: int | Sequence[int] = (),
    max_variants: int = 8,
    static_argnames: str | Sequence[str] = (),
) -> CompiledFunction:
    """Record `fun` once per call signature, lower it, and replay the lowered code.

    Works on plain functions and on transforms (`compile(grad(f))` records the forward
    and backward passes on one tape). Control flow on traced values is guarded: a call
    that takes another path records (and keeps) another variant, at most `max_variants`
    per signature. Call with `out=` (a structure of arrays shaped like the result) to
    write the result without allocating; `out` is therefore reserved as a keyword.

    Sharp bits: Python-level state the function reads (random numbers, globals, arrays it
    closes over) is captured when a variant is recorded, as in JAX; `static_argnames` name
    keyword arguments; pickling needs a picklable `fun` (a module-level function, not the
    closure `grad(f)` returns).

    Compiling the same function again returns the compiled function already built, so
    `compile(value_and_grad(f))` may be written inside a loop: the key is the function's
    code, the values of its closure cells, defaults and the globals it names, these
    options and the settings read while building (`GRADTAPE_ROLL`, `GRADTAPE_NUMBA`,
    `GRADTAPE_BUFFER_SETS`, `GRADTAPE_MAX_SIGNATURES`; see compile/memo.py;
    GRADTAPE_MAX_COMPILED of them are remembered).

    Parameters
    ----------
    fun : callable
        Plain NumPy/SciPy code, or a transform of it (`grad(f)`, `value_and_grad(f)`, ...).
    backend : {"auto", "numpy", "numba"}, default "auto"
        "numpy" replays generated NumPy code. "numba" compiles fused native loops before the
        first call returns. "auto" uses Numba when it can be imported: the numpy backend answers
        at once and a background thread compiles the native kernels, which later calls use;
        without Numba (or with `GRADTAPE_NUMBA=0`) it is the numpy backend, quietly.
    static_argnums : int or sequence of int, default ()
        Positional arguments that are Python values baked into the recording (a new value
        records a new variant); they must be hashable.
    max_variants : int, default 8
        Paths kept per signature before the function runs eagerly (with a `CompileWarning`).
    static_argnames : str or sequence of str, default ()
        Keyword arguments treated as `static_argnums`.

    Returns
    -------
    CompiledFunction
        Called as `fun` is (plus `out=`); `.source(*args)`, `.tape(*args)` and `.stats` show
        what was recorded and generated.

    Raises
    ------
    ImportError
        `backend="numba"` where Numba is not installed (the message names
        `pip install "gradtape[numba]"`) or is turned off by `GRADTAPE_NUMBA=0`.
    ValueError
        An unknown backend, or `max_variants` below 1.
    TypeError
        `fun` is not callable.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> vg = gt.compile(gt.value_and_grad(lambda x: np.sum(x**2)))
    >>> value, g = vg(np.array([1.0, 2.0]))
    >>> print(float(value), g)
    5.0 [2. 4.]
    >>> value_buf, grad_buf = np.empty(()), np.empty(2)
    >>> _ = vg(np.array([3.0, 4.0]), out=(value_buf, grad_buf))  # writes into the buffers
    >>> print(float(value_buf), grad_buf)
    25.0 [6. 8.]
    """
    options = (
        backend,
        static_argnums if type(static_argnums) is int else tuple(static_argnums),
        max_variants,
        static_argnames if type(static_argnames) is str else tuple(static_argnames),
        config.build_settings(),  # (GRADTAPE_ROLL and the others read while building)
    )
    return remembered(
        fun,
        options,
        lambda: CompiledFunction(fun, backend, static_argnums, max_variants, static_argnames),
    )
