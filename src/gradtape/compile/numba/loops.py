"""Native loops for the numba backend: `scan`, its backward loop, `while_loop` and rolled
Python loops (compile/rolling.py) as Numba functions.

Without this a compiled tape runs a scan in Python, one generated-NumPy call per step (about
20 us a step for a small RNN). Here the body's step (for `scan_bwd`, the step's VJP) becomes a
Numba kernel, written by the generator every program goes through (codegen.generate),
and a driver loop written around it walks the steps natively: array carries live in two
buffers swapped every step, ys and the stored carries are written in place, the cotangents of
the values the body captured are summed over the steps. Sizes are read from the arguments,
so another length runs the same compiled driver.

A loop is built on its first call (the step VJP is recorded on that call's values) and
compiled like the other kernels: in the background for backend="auto" (the Python loop runs
meanwhile), before the call returns for backend="numba". What the driver cannot do runs the
primitive's Python implementation, with the same results: a step that leaves the body's
recorded path (a failed check), `checkpoint=`, a body that needs NumPy between kernels.

A rolled Python loop (`rolled_spec`) is built when its variant is lowered, from the recorded
values: `rolling.step_tape` writes one iteration as a tape, and the driver passes each
iteration's views (`x[i]`, `x[i:i + 3]`), rows of per-iteration constants and progressing
indices (`start + t * step`, from constant arguments: another trip count reuses the module),
and adds the backward pass's scatter-adds into carried gradients in place.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from ...core.errors import GuardFailure
from ...core.ir import Var
from ...core.primitive import Primitive
from ...transforms.linearize import record_step_vjp
from .. import rolling
from ..step import body_inputs, step_program
from . import backend, codegen, drivers
from .generator import Generated, Kernel, KernelArg
from .notices import warn_once
from .scalar import literal, numpy_type

_FIRST_CAPACITY = 16  # stored carries of a while loop: room for this many, doubled when full
_MAX_FAILURES = 3  # a loop whose steps keep leaving the recorded path stays in Python
_I64 = np.dtype(np.int64)
_NOT_YET, _BUILDING, _READY, _OFF = "not yet", "building", "ready", "off"


class Unsupported(Exception):
    """This loop runs in Python; the message says why."""


@dataclass
class _Output:
    """One result of the loop primitive: shape after the leading length (if `per_step`)."""

    shape: tuple
    dtype: np.dtype
    per_step: bool
    zeros: bool
    every: int = 1  # one entry per `every` steps (stored carries with checkpoint=)


@dataclass
class LoopSpec:
    """A driver's module and how the Python side calls it."""

    module: str
    driver: Kernel
    arg_slots: list  # per primitive argument: (dtype, is_scalar)
    outputs: list[_Output]
    consts: list = field(default_factory=list)
    length_from: int | None = None  # argument whose leading axis is the length
    grows: bool = False  # a while loop: the driver returns its trip count and stored carries

    def call(self, driver, args, params: dict) -> tuple | None:
        """Run the driver on the primitive's arguments; None when it must run in Python."""
        converted = []
        for a, (dtype, scalar) in zip(args, self.arg_slots):
            a = np.asarray(a)
            if a.dtype != dtype:
                return None
            converted.append(a[()] if scalar else np.ascontiguousarray(a))
        if self.length_from is not None:
            steps = args[self.length_from].shape[0]
        elif "loop" in params:  # a rolled Python loop
            steps = params["loop"].trips
        else:
            steps = params.get("length", 0)
        outs, driver_outs = [], []
        for o in self.outputs:
            shape = (-(-steps // o.every), *o.shape) if o.per_step else o.shape
            arr = (np.zeros if o.zeros else np.empty)(shape, o.dtype)
            outs.append(arr)
            driver_outs.append(arr if arr.ndim else arr.reshape(1))
        if self.grows:
            status, trips, *stored = driver(*converted, _FIRST_CAPACITY, *driver_outs, *self.consts)
            return None if status else tuple(outs + [h[:trips] for h in stored])
        if driver(*converted, steps, *driver_outs, *self.consts) != 0:
            return None
        return tuple(outs)


_LIVE_LOOPS: weakref.WeakSet = weakref.WeakSet()  # every NativeLoop not yet freed


def renew_locks_after_fork() -> None:
    """In a child created by os.fork: a new lock for every native loop (another thread of the
    parent may have been recording a step of it at the fork, holding the lock)."""
    for loop in list(_LIVE_LOOPS):
        loop._lock = threading.Lock()


class NativeLoop:
    """A loop primitive's native driver, built on the first call (see the module docstring).

    A compiled wrapper calls it in place of the primitive (one per instruction); eager calls
    reach it through `try_call` (one per recorded body, `quiet`: no warnings).
    """

    def __init__(self, prim: Primitive, quiet: bool = False):
        self.prim = prim
        self._python = prim.python_impl or prim.impl
        self.quiet = quiet
        self.wait = False  # backend="numba": compile before the first call returns
        self.state = _NOT_YET
        self.spec: LoopSpec | None = None
        self.driver = None
        self.failures = 0
        self.reason: str | None = None
        self._lock = threading.Lock()
        _LIVE_LOOPS.add(self)  # (a forked child renews the lock: renew_locks_after_fork)

    @property
    def native(self) -> bool:
        """Whether calls now run the native driver."""
        return self.driver is not None

    def __call__(self, *args, **params):
        result = self.try_call(args, params)
        return self._python(*args, **params) if result is None else result

    def try_call(self, args: tuple, params: dict) -> tuple | None:
        """The loop's results from the native driver; None when this call must run in Python
        (the driver is not built yet, cannot be, or a step left the recorded path)."""
        driver = self.driver
        if driver is None:
            if self.state != _NOT_YET:
                return None
            self._prepare(args, params)
            driver = self.driver
            if driver is None:
                return None
        result = self.spec.call(driver, args, params)
        if result is None:
            self.failures += 1
            if self.failures >= _MAX_FAILURES:
                self.driver, self.state = None, _OFF
                self.reason = "its steps kept leaving the body's recorded path"
        return result

    def prepare(self, args: tuple, params: dict) -> None:
        """Build (and start compiling) the driver now, from the values of a recording; a
        call would otherwise do it on the first native call."""
        if self.state == _NOT_YET:
            self._prepare(args, params)

    def _prepare(self, args, params) -> None:
        with self._lock:
            if self.state != _NOT_YET:
                return
            try:
                spec = build_spec(self.prim, params, args)
            except _TooShort:
                return  # no step to record the VJP on: try again on the next call
            except Exception as exc:  # Unsupported, or what the generator cannot write:
                # the loop stays in Python rather than failing a call that works there
                self.state, self.reason = _OFF, str(exc) or type(exc).__name__
                if not self.quiet:
                    warn_once(
                        f"numba backend: a {self.prim.name} loop runs step "
                        f"by step through NumPy: {exc}"
                    )
                return
            self.spec, self.state = spec, _BUILDING
        generated = Generated(
            spec.module,
            hashlib.sha256(spec.module.encode()).hexdigest()[:32],
            [spec.driver],
            "",
            {},
            [],
            None,
        )
        nk = backend.kernels_for(generated)

        def ready(nk) -> None:
            if nk.functions is not None:
                self.driver, self.state = nk.functions[-1], _READY
            else:
                self.state, self.reason = _OFF, nk.error
                if not self.quiet:
                    warn_once(
                        f"numba backend: Numba could not compile a "
                        f"{self.prim.name} loop ({nk.error}); it runs "
                        "through NumPy"
                    )

        if self.wait:
            nk.compile_now()
            ready(nk)
        else:
            nk.when_ready(ready)
            nk.request()


class _TooShort(Exception):
    """A loop of length 0: nothing to record its step on yet."""


# --- specs ---------------------------------------------------------------------------------------
def register_driver(prim: Primitive, build) -> None:
    """Give a loop primitive a native driver: `build(params, args) -> LoopSpec` (control flow,
    declared above compile, registers its loops here)."""
    drivers.register(prim, build, NativeLoop)


has_driver = drivers.has_driver
build_spec = drivers.build_spec


def _step_kernel(program) -> Generated:
    gen = codegen.generate(program, threads=1, one_kernel=True)
    if (
        len(gen.kernels) != 1
        or gen.plan.segments != 1
        or any(s.kind == "python" for s in gen.plan.stages)
    ):
        names = sorted({s.members[0].prim.name for s in gen.plan.stages if s.kind == "python"})
        raise Unsupported(
            f"its body uses {', '.join(names) or 'operations'} without a native translation"
        )
    return gen


def _slot(a) -> tuple[np.dtype, bool]:
    a = np.asarray(a)
    return a.dtype, a.ndim == 0


def forward_spec(params: dict, args: tuple) -> LoopSpec:
    body = params["program"]
    nc, nx = params["n_carry"], params["n_x"]
    ny = len(body.out_avals) - nc
    tape, _, positions = body.variants[0]
    gen = _step_kernel(step_program(tape, body_inputs(tape), roll=False))
    w = _DriverWriter(gen)
    slots = [_slot(a) for a in args]
    carries = [w.value_arg(f"i{j}", args[j]) for j in range(nc)]
    xs = [w.value_arg(f"xs{i}", args[nc + i]) for i in range(nx)]
    caps = [w.value_arg(f"cp{i}", a) for i, a in enumerate(args[nc + nx :])]
    w.add_arg("T", _I64, None)
    carry_avals = [(np.shape(a), np.asarray(a).dtype) for a in args[:nc]]
    every = params["checkpoint"] or 1
    outputs = (
        [_Output(s, d, False, False) for s, d in carry_avals]
        + [_Output(tuple(s), np.dtype(d), True, False) for s, d in body.out_avals[nc:]]
        + [_Output(s, d, True, False, every) for s, d in carry_avals]
    )
    finals = [w.out_arg(f"fc{j}", o) for j, o in enumerate(outputs[:nc])]
    ys = [w.out_arg(f"ys{i}", o) for i, o in enumerate(outputs[nc : nc + ny])]
    stored = [w.out_arg(f"hd{j}", o) for j, o in enumerate(outputs[nc + ny :])]
    scalar_carry = [not s for s, _ in carry_avals]
    w.open_carries(carries, scalar_carry)
    w.lines.append("for k in range(T):")
    w.lines.append("    t = T - 1 - k" if params["reverse"] else "    t = k")
    if every > 1:  # checkpoint=: every `every`-th carry is stored
        w.body(f"if k % {every} == 0:")
    for j in range(nc):
        at = "k" if every == 1 else f"k // {every}"
        w.body(
            ("    " if every > 1 else "")
            + (
                f"{stored[j]}[{at}] = a{j}"
                if scalar_carry[j]
                else f"copy_into({stored[j]}[{at}], a{j})"
            )
        )
    step_inputs = (
        [f"a{j}" for j in range(nc)]
        + [f"{xs[i]}[t]" for i in range(nx)]
        + [caps[p] for p in positions]
    )
    targets = [f"n{j}" if scalar_carry[j] else f"b{j}" for j in range(nc)] + [
        f"{ys[i]}[t]" for i in range(ny)
    ]
    w.step(step_inputs, targets)
    w.swap_carries(scalar_carry)
    w.close_carries(finals, scalar_carry)
    return w.spec(slots, outputs, length_from=nc if nx else None)


def backward_spec(params: dict, args: tuple) -> LoopSpec:
    body = params["program"]
    nc, nx, ny = params["n_carry"], params["n_x"], params["n_y"]
    g_carry, g_ys, stored, xs, caps, added = _backward_arguments(params, args)
    every = params["checkpoint"] or 1
    vjp, tape, positions = _recorded_step_vjp(params, g_carry, g_ys, stored, xs, caps)
    gen = _step_kernel(step_program(vjp, vjp.inputs, roll=False))
    w = _DriverWriter(gen)
    slots = [_slot(a) for a in args]
    gc = [w.value_arg(f"gc{j}", a) for j, a in enumerate(g_carry)]
    gy = [w.value_arg(f"gy{i}", a) for i, a in enumerate(g_ys)]
    st = [w.value_arg(f"st{j}", a) for j, a in enumerate(stored)]
    xa = [w.value_arg(f"xs{i}", a) for i, a in enumerate(xs)]
    cp = [w.value_arg(f"cp{i}", a) for i, a in enumerate(caps)]
    gs = [w.value_arg(f"gs{j}", a) for j, a in enumerate(added)]
    w.add_arg("T", _I64, None)
    outputs = _backward_outputs(g_carry, xs, caps)
    finals = [w.out_arg(f"ogc{j}", o) for j, o in enumerate(outputs[:nc])]
    ogx = [w.out_arg(f"ogx{i}", o) for i, o in enumerate(outputs[nc : nc + nx])]
    ogp = [w.out_arg(f"ogp{i}", o) for i, o in enumerate(outputs[nc + nx :])]
    scalar_carry = [np.ndim(a) == 0 for a in g_carry]
    w.open_carries(gc, scalar_carry)
    scalar_cap = [np.ndim(caps[p]) == 0 for p in positions]
    for i, p in enumerate(positions):
        if not scalar_cap[i]:
            w.lines.append(f"q{i} = np.empty_like({ogp[p]})")
    if every == 1:
        w.lines.append("for k in range(T - 1, -1, -1):")
        carry_at = [f"{st[j]}[k]" for j in range(nc)]
        forward = None
    else:  # recompute each segment's carries from its stored one, then walk it back
        forward = _step_kernel(step_program(tape, body_inputs(tape), roll=False))
        _recompute_segments(w, forward, params, body, st, xa, cp, positions, scalar_carry)
        carry_at = [f"sg{j}[k - start]" for j in range(nc)]
    w.body("t = T - 1 - k" if params["reverse"] else "t = k")
    step_inputs = (
        carry_at
        + [f"{xa[i]}[t]" for i in range(nx)]
        + [cp[p] for p in positions]
        + [f"a{j}" for j in range(nc)]
        + [f"{gy[i]}[t]" for i in range(ny)]
    )
    targets = (
        [f"n{j}" if scalar_carry[j] else f"b{j}" for j in range(nc)]
        + [f"{ogx[i]}[t]" if np.asarray(xs[i]).dtype.kind in "fc" else None for i in range(nx)]
        + [f"qs{i}" if scalar_cap[i] else f"q{i}" for i in range(len(positions))]
    )
    w.step(step_inputs, targets)
    for i, p in enumerate(positions):
        w.body(f"{ogp[p]}[0] += qs{i}" if scalar_cap[i] else f"add_into({ogp[p]}, q{i})")
    _add_carry_cotangents(w, gs, every, scalar_carry)
    w.swap_carries(scalar_carry)
    w.indent = "    "
    w.close_carries(finals, scalar_carry)
    if every == 1:
        length_from = nc + ny if nc else None
    else:
        length_from = 2 * nc + ny if nx else None
    return w.spec(
        slots,
        outputs,
        length_from=length_from,
        helpers={"forward_step": forward} if every > 1 else None,
    )


def _backward_arguments(params: dict, args: tuple) -> tuple:
    """The backward loop's arguments by role: (cotangents of the final carries, cotangents of
    the per-step outputs, the stored carries, the per-step inputs, the captured values, the
    cotangents added to the carries per step or per checkpoint segment (or none))."""
    nc, nx, ny = params["n_carry"], params["n_x"], params["n_y"]
    g_carry, g_ys = args[:nc], args[nc : nc + ny]
    stored, xs = args[nc + ny : 2 * nc + ny], args[2 * nc + ny : 2 * nc + ny + nx]
    rest = args[2 * nc + ny + nx :]
    caps = rest[: len(rest) - nc] if params["stored_cotangents"] else rest
    return g_carry, g_ys, stored, xs, caps, rest[len(caps) :]


def _backward_outputs(g_carry: tuple, xs: tuple, caps: tuple) -> list:
    """The backward loop's outputs: the cotangents of the initial carries, of each step's
    inputs (one row per step) and of the captured values (floats: an integer input's
    cotangent is a float zero)."""

    def cotangent_output(a, per_step: bool) -> _Output:
        a = np.asarray(a)
        shape = a.shape[1:] if per_step else a.shape
        dtype = a.dtype if a.dtype.kind in "fc" else np.dtype(np.float64)
        return _Output(shape, dtype, per_step, True)

    return (
        [_Output(np.shape(a), np.asarray(a).dtype, False, False) for a in g_carry]
        + [cotangent_output(x, True) for x in xs]
        + [cotangent_output(c, False) for c in caps]
    )


def _add_carry_cotangents(w: _DriverWriter, gs: list, every: int, scalar_carry: list) -> None:
    """The loop's lines adding the stored cotangents `gs` into the carries' cotangents (each
    step's, or with checkpoint=, each segment's at its first step)."""
    if gs and every > 1:
        w.body(f"if k % {every} == 0:")
    for j, g in enumerate(gs):
        at = "k" if every == 1 else f"k // {every}"
        w.body(
            ("    " if every > 1 else "")
            + (f"n{j} += {g}[{at}]" if scalar_carry[j] else f"add_into(b{j}, {g}[{at}])")
        )


def _recorded_step_vjp(params: dict, g_carry, g_ys, stored, xs, caps) -> tuple:
    """(the step's VJP tape, the body tape it differentiates, its capture positions),
    recorded on the first step the backward loop differentiates (with checkpoint=, the first
    step of the last segment, whose carry is stored); raises _TooShort for no step."""
    every = params["checkpoint"] or 1
    length = np.shape(stored[0])[0] if params["n_carry"] and every == 1 else params["length"]
    if length == 0:
        raise _TooShort
    last = (length - 1) // every * every
    t_last = length - 1 - last if params["reverse"] else last
    example = [np.asarray(s)[last // every] for s in stored] + [np.asarray(x)[t_last] for x in xs]
    cts = list(g_carry) + [np.asarray(g)[t_last] for g in g_ys]
    for tape, guards, positions in params["program"].variants:
        try:
            vjp = record_step_vjp(tape, guards, example, [caps[p] for p in positions], cts)
            return vjp, tape, positions
        except GuardFailure:
            continue
    raise Unsupported("no recorded path of its body matches its last step")


def _recompute_segments(w, forward, params, body, st, xa, cp, positions, scalar_carry) -> None:
    """Open the backward loop of a checkpointed scan: for each segment, from the last, the
    forward step kernel refills `sg` (the segment's carries) from the stored first one."""
    every, nc = params["checkpoint"], params["n_carry"]
    for j, name in enumerate(st):
        w.lines.append(f"sg{j} = np.empty(({every},) + {name}.shape[1:], {name}.dtype)")
    y_targets = []
    for i, (shape, dtype) in enumerate(body.out_avals[nc:]):
        if tuple(shape):  # the step's ys are not needed again: a scratch buffer
            w.lines.append(f"ys{i} = np.empty({tuple(shape)!r}, {numpy_type(np.dtype(dtype))})")
        y_targets.append(f"ys{i}")
    w.lines.append(f"for start in range((T - 1) // {every} * {every}, -1, -{every}):")
    w.body(f"end = min(start + {every}, T)")
    for j, name in enumerate(st):
        w.body(
            f"sg{j}[0] = {name}[start // {every}]"
            if scalar_carry[j]
            else f"copy_into(sg{j}[0], {name}[start // {every}])"
        )
    w.body("for k in range(start, end - 1):")
    w.indent = "        "
    w.body("t = T - 1 - k" if params["reverse"] else "t = k")
    w.step(
        [f"sg{j}[k - start]" for j in range(nc)]
        + [f"{x}[t]" for x in xa]
        + [cp[p] for p in positions],
        [f"sg{j}[k - start + 1]" for j in range(nc)] + y_targets,
        forward,
        "forward_step",
    )
    w.indent = "    "
    w.body("for k in range(end - 1, start - 1, -1):")
    w.indent = "        "


def while_spec(params: dict, args: tuple) -> LoopSpec:
    body, cond = params["body"], params["cond"]
    nc, nb = params["n_carry"], params["n_body_caps"]
    tape, _, positions = body.variants[0]
    c_tape, _, c_positions = cond.variants[0]
    w = _DriverWriter(_step_kernel(step_program(tape, body_inputs(tape), roll=False)))
    cond_gen = _step_kernel(step_program(c_tape, body_inputs(c_tape), roll=False))
    slots = [_slot(a) for a in args]
    carries = [w.value_arg(f"i{j}", args[j]) for j in range(nc)]
    bcaps = [w.value_arg(f"cp{i}", a) for i, a in enumerate(args[nc : nc + nb])]
    ccaps = [w.value_arg(f"cc{i}", a) for i, a in enumerate(args[nc + nb :])]
    w.add_arg("T", _I64, None)
    outputs = [_Output(np.shape(a), np.asarray(a).dtype, False, False) for a in args[:nc]]
    finals = [w.out_arg(f"fc{j}", o) for j, o in enumerate(outputs)]
    scalar_carry = [not o.shape for o in outputs]
    w.open_carries(carries, scalar_carry)
    stored = [f"hd{j}" for j in range(nc)]
    for j, o in enumerate(outputs):
        shape = "".join(f"{s}, " for s in ["T", *(f"a{j}.shape[{k}]" for k in range(len(o.shape)))])
        w.lines.append(f"hd{j} = np.empty(({shape}), {numpy_type(o.dtype)})")
    w.lines += ["capacity = T", "n = 0", "while True:"]
    w.fail = f"return (r[0], n, {''.join(h + ', ' for h in stored)})"
    w.step([f"a{j}" for j in range(nc)] + [ccaps[p] for p in c_positions], ["go"], cond_gen, "cond")
    w.body("if not go:")
    w.body("    break")
    w.body("if n == capacity:  # room for twice as many stored carries")
    for j, (h, o) in enumerate(zip(stored, outputs)):
        w.body(f"    grown{j} = np.empty((2 * capacity,) + {h}.shape[1:], {numpy_type(o.dtype)})")
        w.body(f"    grown{j}[:n] = {h}[:n]")
        w.body(f"    {h} = grown{j}")
    w.body("    capacity *= 2")
    for j, h in enumerate(stored):
        w.body(f"{h}[n] = a{j}" if scalar_carry[j] else f"copy_into({h}[n], a{j})")
    w.step(
        [f"a{j}" for j in range(nc)] + [bcaps[p] for p in positions],
        [f"n{j}" if scalar_carry[j] else f"b{j}" for j in range(nc)],
    )
    w.swap_carries(scalar_carry)
    w.body("n += 1")
    w.close_carries(finals, scalar_carry, result=f"(0, n, {''.join(h + ', ' for h in stored)})")
    spec = w.spec(slots, outputs, length_from=None, helpers={"cond": cond_gen})
    spec.grows = True
    return spec


def rolled_spec(params: dict, args: tuple) -> LoopSpec:
    """The driver of a rolled Python loop (compile/rolling.py): its body, recorded as one step
    on the first iteration of these arguments, walked natively for the loop's trip count.
    Progressing indices (`x[i]`) are read from constant arguments (start, step), so another
    trip count of the same body writes the same module and reuses the compiled driver."""
    loop = params["loop"]
    try:
        stepped = rolling.step_tape(loop, args)
    except rolling.NotSteppable as exc:
        raise Unsupported(str(exc)) from None
    gen = _step_kernel(step_program(stepped.tape, stepped.tape.inputs, roll=False))
    w = _DriverWriter(gen)
    slots = [_slot(a) for a in args]
    names = [w.value_arg(f"x{m}", a) for m, a in enumerate(args)]
    w.add_arg("T", _I64, None)
    values = loop.first_iteration(args)
    outputs = []
    for kind, k, j in loop.outputs:
        a = np.asarray(rolling._pick(loop.steps, values, (k, j)))
        outputs.append(_Output(a.shape, a.dtype, kind == "stack", False))
    targets_out = [w.out_arg(f"o{i}", o) for i, o in enumerate(outputs)]
    n_carry = len(loop.carries)
    accumulators = stepped.accumulators
    scalar_carry = [np.ndim(args[m]) == 0 for m, _ in loop.carries]
    swapped = [c for c in range(n_carry) if c not in accumulators]
    w.open_carries([names[loop.carries[c][0]] for c in swapped], [scalar_carry[c] for c in swapped])
    carry_name = {c: f"a{i}" for i, c in enumerate(swapped)}
    next_name = {c: (f"n{i}" if scalar_carry[c] else f"b{i}") for i, c in enumerate(swapped)}
    added = {}  # position among the step's outputs -> where the step puts the value added
    for c, entries in accumulators.items():
        carry_name[c] = f"acc{c}"
        w.lines.append(f"acc{c} = {names[loop.carries[c][0]]}.copy()")
        for _, position in entries:
            leaf = stepped.tape.outputs[position]  # a Var, or a constant added every time
            if isinstance(leaf, Var):
                shape, dtype = leaf.shape, leaf.dtype
            else:
                shape, dtype = np.shape(leaf), np.asarray(leaf).dtype
            name = added[position] = f"add{position}"
            if shape:
                w.lines.append(
                    f"{name} = np.empty({tuple(shape)!r}, {numpy_type(np.dtype(dtype))})"
                )
    w.lines.append("for t in range(T):")
    step_inputs = []
    for source in stepped.sources:
        kind = source[0]
        if kind == "carry":
            step_inputs.append(carry_name[source[1]])
        elif kind == "in":
            step_inputs.append(names[source[1]])
        elif kind == "row":
            step_inputs.append(f"{names[source[1]]}[t]")
        elif kind == "view":
            step_inputs.append(f"{names[source[1]]}[{w.index_text(source[2])}]")
        else:  # ("index", start, step): constants, so the text is the same for every start
            step_inputs.append(w.progression(source[1], source[2]))
    targets = [added[c] if c in accumulators else next_name[c] for c in range(n_carry)]
    producers = {kj: c for c, (_, kj) in enumerate(loop.carries)}
    finals = []
    for (kind, k, j), name, o in zip(loop.outputs, targets_out, outputs):
        if kind == "last" and (k, j) in producers:  # written once, after the loop
            targets.append(None)
            finals.append((name, carry_name[producers[(k, j)]], not o.shape))
        elif o.per_step:
            targets.append(f"{name}[t]")
        else:
            targets.append(f"{name}[0]" if not o.shape else name)
    targets += [added[p] for p in range(len(targets), len(stepped.tape.outputs))]
    w.step(step_inputs, targets)
    for c, entries in accumulators.items():
        for parts, position in entries:
            w.body(f"acc{c}[{w.index_text(parts)}] += {added[position]}")
    w.swap_carries([scalar_carry[c] for c in swapped])
    for name, carry, scalar in finals:
        w.lines.append(f"{name}[0] = {carry}" if scalar else f"copy_into({name}, {carry})")
    w.close_carries([], [])
    return w.spec(slots, outputs, length_from=None)


register_driver(rolling.rolled_loop_p, rolled_spec)


# --- the driver's text ------------------------------------------------------------------------
class _DriverWriter:
    """Writes `loop(<arguments>, T, <results>, <constants>)` around the step kernel."""

    def __init__(self, gen: Generated):
        self.gen = gen
        self.args: list[KernelArg] = []
        self.lines: list[str] = []
        self.consts: list = []
        self.const_names: list[str] = []
        self.fail = "return r[0]"  # what the driver returns when a step's status is not 0
        self.indent = "    "  # of the statements in the loop over steps

    def add_arg(self, name: str, dtype: np.dtype, ndim: int | None) -> str:
        self.args.append(KernelArg(name, np.dtype(dtype), ndim))
        return name

    def value_arg(self, name: str, value) -> str:
        a = np.asarray(value)
        return self.add_arg(name, a.dtype, a.ndim or None)

    def out_arg(self, name: str, o: _Output) -> str:
        return self.add_arg(name, o.dtype, len(o.shape) + o.per_step or 1)

    def const(self, value) -> str:
        name = f"kc{len(self.consts)}"
        value = np.asarray(value)  # (ascontiguousarray would make a 0-d value 1-d)
        self.consts.append(np.ascontiguousarray(value) if value.ndim else value[()])
        self.const_names.append(name)
        return name

    def progression(self, start: int, step: int) -> str:
        """The integer `start + t * step` in iteration t; start and step are constant
        arguments, so the text is the same for every start and step."""
        return f"({self.const(np.int64(start))} + t * {self.const(np.int64(step))})"

    def index_text(self, parts: list) -> str:
        """An index as source: ints, None, ("index", start, step) progressions and
        ("slice", start, stop, step) with ints, progressions or None in it."""

        def bound(x) -> str:
            if x is None:
                return ""
            if isinstance(x, tuple):
                return self.progression(x[1], x[2])
            return str(int(x))

        text = []
        for part in parts:
            if part is None:
                text.append("None")
            elif isinstance(part, tuple) and part[0] == "slice":
                text.append(":".join(bound(x) for x in part[1:]))
            else:
                text.append(bound(part))
        return ", ".join(text)

    def body(self, line: str) -> None:
        self.lines.append(self.indent + line)

    def open_carries(self, sources: list[str], scalar: list[bool]) -> None:
        for j, (src, is_scalar) in enumerate(zip(sources, scalar)):
            if is_scalar:
                self.lines.append(f"a{j} = {src}")
            else:
                self.lines.append(f"a{j} = {src}.copy()")
                self.lines.append(f"b{j} = np.empty_like(a{j})")

    def swap_carries(self, scalar: list[bool]) -> None:
        for j, is_scalar in enumerate(scalar):
            self.body(f"a{j} = n{j}" if is_scalar else f"a{j}, b{j} = b{j}, a{j}")

    def close_carries(self, finals: list[str], scalar: list[bool], result: str = "0") -> None:
        for j, (f, is_scalar) in enumerate(zip(finals, scalar)):
            self.lines.append(f"{f}[0] = a{j}" if is_scalar else f"copy_into({f}, a{j})")
        self.lines.append(f"return {result}")

    def step(
        self, inputs: list[str], targets: list[str | None], gen=None, function: str = "step"
    ) -> None:
        """Call a step kernel (`gen`'s; the body's by default): `inputs` are its program's
        inputs, `targets` where its outputs go (an array to write into, or a scalar variable
        or element to assign)."""
        gen = gen or self.gen
        program, kernel = gen.generator.program, gen.kernels[0]
        call_args = []
        for a in kernel.args:
            kind, k = a.name[0], int(a.name[1:])
            if kind == "x":
                call_args.append(inputs[k])
            elif kind == "c":
                call_args.append(self.const(gen.consts[k]))
            elif kind == "o":
                call_args.append(targets[k])
            else:
                raise Unsupported(f"the step kernel takes {a.name}")
        self.body(f"r = {function}({', '.join(call_args)})")
        self.body("if r[0] != 0:")
        self.body(f"    {self.fail}")
        returned = {v.id: pos for pos, (_, v) in enumerate(kernel.returns, start=1)}
        input_pos = {v.id: k for k, v in enumerate(program.inputs)}
        written = {a.name for a in kernel.args if a.name.startswith("o")}
        first_target: dict[int, str] = {}
        for k, (leaf, target) in enumerate(zip(program.outputs, targets)):
            if target is None:
                continue
            v = leaf.var
            array = len(leaf.shape) > 0
            if v is None:
                value = self.const(leaf.const) if array else literal(leaf.const, leaf.dtype)
            elif f"o{k}" in written:
                first_target.setdefault(v.id, target)
                continue
            elif v.id in first_target:
                value = first_target[v.id]
            elif v.id in input_pos:
                value = inputs[input_pos[v.id]]
            elif v.id in returned:
                value = f"r[{returned[v.id]}]"
            else:
                raise Unsupported("a step result the driver cannot place")
            self.body(f"copy_into({target}, {value})" if array else f"{target} = {value}")
            if v is not None:
                first_target.setdefault(v.id, target)

    def spec(self, slots, outputs, length_from, helpers: dict | None = None) -> LoopSpec:
        for name, c in zip(self.const_names, self.consts):
            self.add_arg(name, np.asarray(c).dtype, np.ndim(c) or None)
        driver = Kernel("loop", self.args, [], self.lines)
        module = self.gen.module.replace("\ndef kernel0(", "\ndef step(", 1)
        for name, gen in (helpers or {}).items():  # other kernels: their functions, renamed
            module += f"\ndef {name}(" + gen.module.split("\ndef kernel0(", 1)[1]
        names = ("step", *(helpers or {}))
        module += (
            "\nfrom gradtape.compile.numba.runtime import add_into, copy_into"
            "  # noqa: E402\n"
            f"\nHELPERS = {names!r}\n\n"
            f"\ndef loop({', '.join(a.name for a in self.args)}):\n"
            + "".join(f"    {line}\n" for line in self.lines)
        )
        return LoopSpec(module, driver, slots, outputs, self.consts, length_from)
