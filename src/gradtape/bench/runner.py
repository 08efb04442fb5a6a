"""Run the benchmark: for each workload, size and method, check the gradient, then time it.

Every method is first called once (that first call, which holds any tracing or JIT compilation,
is timed on its own as ``first_call_s``) and its value and gradient are compared with the
hand-written NumPy reference.  gradtape's methods are then called a few more times and the
background compiler is waited for (eager loops and backend="auto" reach native code after a few
calls: the median is the steady state, the first call the cold one).  Only a correct method is
timed: ``timeit`` loops whose number of
calls is chosen so that one sample lasts at least ``min_sample_s``, then the median of up to
``repeat`` samples.  Two methods compared with each other (``Method.interleaved_with``) are then
timed again in turn, one sample of each per round, and keep those samples: their ratio is not
skewed by the machine's load changing between the two.  Nothing here prints; progress goes to
an optional ``ProgressSink``.
"""

from __future__ import annotations

import math
import statistics
import time
import timeit
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

import gradtape
from gradtape.bench.methods import Absent, Method, PreparedCall, ValueAndGrad
from gradtape.bench.workloads import Problem, Workload

OK, WRONG, ERROR, ABSENT, SKIPPED = "ok", "WRONG", "error", "absent", "skipped"


@dataclass(frozen=True)
class RunConfig:
    """How to run: size override, number of samples, and the per-sample / per-method time."""

    quick: bool = False
    sizes: tuple[int, ...] | None = None
    repeat: int = 7
    min_sample_s: float = 2e-3
    budget_s: float = 10.0
    """Stop sampling a method once its samples took this long (keeping at least one)."""
    seed: int = 0


@dataclass
class Measurement:
    """The outcome of one method on one workload at one size (raw samples are per call)."""

    workload: str
    size: int
    method: str
    status: str
    detail: str = ""
    first_call_s: float | None = None
    number: int = 0
    samples_s: list[float] = field(default_factory=list)
    median_s: float | None = None
    grad_error: float | None = None
    """max |grad - reference| / max |reference| (value error for the value-only baseline)."""
    ratio_to_numpy: float | None = None
    ratio_to_best_peer: float | None = None
    best_peer: str | None = None
    interleaved_ratio: float | None = None
    """For a method timed in turn with ``Method.interleaved_with``: the median over rounds of
    that method's sample divided by this one's."""

    def to_json(self) -> dict[str, Any]:
        """A plain dict for ``results.json``."""
        return asdict(self)


@dataclass
class BenchRun:
    """Everything one run measured, plus the reasons of absent methods and run-level notes."""

    config: RunConfig
    workloads: list[Workload]
    methods: list[Method]
    measurements: list[Measurement] = field(default_factory=list)
    absent: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def sizes_of(self, workload: str) -> list[int]:
        """The sizes measured for ``workload``, in run order."""
        return list(dict.fromkeys(m.size for m in self.measurements if m.workload == workload))


class ProgressSink(Protocol):
    """Receives progress: ``begin`` before each measurement, ``done`` after it."""

    def begin(self, label: str) -> None: ...

    def done(self, measurement: Measurement) -> None: ...


def planned_sizes(workload: Workload, config: RunConfig) -> tuple[list[int], list[int]]:
    """The sizes to run for ``workload`` and those dropped for exceeding its ``max_size``."""
    sizes = list(config.sizes or workload.sizes(config.quick))
    limit = workload.max_size
    return [n for n in sizes if limit is None or n <= limit], [
        n for n in sizes if limit is not None and n > limit
    ]


def count_steps(workloads: Sequence[Workload], methods: Sequence[Method], config: RunConfig) -> int:
    """How many measurements ``run_benchmark`` will make (for a progress bar)."""
    return sum(
        len(planned_sizes(w, config)[0]) * sum(m.applies_to(w) for m in methods) for w in workloads
    )


def short_error(exc: BaseException, limit: int = 160) -> str:
    """``TypeName: first line of the message``, cut to ``limit`` characters."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def relative_error(got: Any, expected: np.ndarray | float) -> float:
    """max |got - expected| / max |expected|: one number comparable across sizes and scales."""
    got_array = np.asarray(got, dtype=np.float64)
    expected_array = np.asarray(expected, dtype=np.float64)
    if got_array.shape != expected_array.shape:
        raise ValueError(f"shape {got_array.shape}, expected {expected_array.shape}")
    scale = max(float(np.max(np.abs(expected_array), initial=0.0)), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(got_array - expected_array), initial=0.0)) / scale


def check_output(output: ValueAndGrad, reference: ValueAndGrad, rtol: float) -> tuple[float, str]:
    """Compare a method's ``(value, grad)`` with the reference: (error, problem or '')."""
    if not (isinstance(output, tuple) and len(output) == 2):
        return math.inf, f"returned {type(output).__name__}, expected a (value, grad) tuple"
    (value, grad), (ref_value, ref_grad) = output, reference
    try:
        value_error = relative_error(np.asarray(value).reshape(()), ref_value)
        if value_error > rtol:
            return value_error, f"value {float(np.asarray(value)):.17g} != {ref_value:.17g}"
        if grad is None:  # the value-only baseline
            return value_error, ""
        grad_error = relative_error(grad, ref_grad)
    except (TypeError, ValueError) as exc:
        return math.inf, f"unusable output: {short_error(exc)}"
    if not grad_error <= rtol:
        return grad_error, f"gradient off by {grad_error:.2g} (relative to max |grad|)"
    return grad_error, ""


def time_call(call: PreparedCall, config: RunConfig) -> tuple[int, list[float]]:
    """Calls per sample and per-call seconds of each sample (timeit: GC off during a sample)."""
    timer = timeit.Timer(call)
    number, elapsed = 1, timer.timeit(1)
    while elapsed < config.min_sample_s:
        growth = math.ceil(1.2 * config.min_sample_s / max(elapsed, 1e-9))
        number *= min(100, max(2, growth))
        elapsed = timer.timeit(number)
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < config.repeat:
        samples.append(timer.timeit(number) / number)
        if time.perf_counter() - started > config.budget_s:
            break
    return number, samples


def measure(
    method: Method,
    workload: Workload,
    problem: Problem,
    reference: ValueAndGrad,
    config: RunConfig,
    absent: dict[str, str],
    calls: dict[str, PreparedCall] | None = None,
) -> Measurement:
    """Check then time one method on one problem; never raises for the method's own failures.
    A correct method's prepared call is kept in ``calls`` (by method name) when given."""
    result = Measurement(workload.name, problem.size, method.name, OK)
    if method.name in absent:
        result.status, result.detail = ABSENT, absent[method.name]
        return result
    if method.max_input_size is not None and problem.x.size > method.max_input_size:
        result.status = SKIPPED
        result.detail = f"len(x) = {problem.x.size} > {method.max_input_size}"
        return result
    try:
        call = method.prepare(workload, problem)
        started = time.perf_counter()
        output = call()
        result.first_call_s = time.perf_counter() - started
        result.grad_error, problem_found = check_output(output, reference, method.rtol)
        if problem_found:
            result.status, result.detail = WRONG, problem_found
            return result
        if method.name.startswith("gradtape"):
            _settle(call)
        result.number, result.samples_s = time_call(call, config)
        if calls is not None:
            calls[method.name] = call
    except Absent as exc:
        absent[method.name] = str(exc)
        result.status, result.detail = ABSENT, str(exc)
        return result
    except Exception as exc:  # a failing method is a result, not a crash of the run
        result.status, result.detail = ERROR, short_error(exc)
        return result
    result.median_s = statistics.median(result.samples_s)
    return result


SETTLE_CALLS = 5  # calls before waiting: eager loops request native drivers after a few


def _settle(call: PreparedCall) -> None:
    """A few more calls, then wait for kernels and loop drivers compiling in the background."""
    for _ in range(SETTLE_CALLS):
        call()
    gradtape.wait_for_native(120)
    call()  # the first call that runs what was compiled


def time_in_turn(
    first: PreparedCall, second: PreparedCall, numbers: tuple[int, int], config: RunConfig
) -> tuple[list[float], list[float]]:
    """Per-call seconds of ``first`` and ``second``, one sample of each per round (``numbers``
    calls per sample, as ``time_call`` chose them), for ``config.repeat`` rounds or until the
    budget is spent (at least one round)."""
    timers = (timeit.Timer(first), timeit.Timer(second))
    samples: tuple[list[float], list[float]] = ([], [])
    started = time.perf_counter()
    while len(samples[0]) < config.repeat:
        for timer, number, taken in zip(timers, numbers, samples):
            taken.append(timer.timeit(number) / number)
        if time.perf_counter() - started > config.budget_s:
            break
    return samples


def interleave_pairs(
    row: Sequence[Measurement],
    calls: dict[str, PreparedCall],
    methods: Sequence[Method],
    config: RunConfig,
) -> None:
    """Re-time each pair of methods compared with each other (``Method.interleaved_with``)
    in turn where both were timed, replacing their samples and medians, and set the second's
    ``interleaved_ratio``."""
    by_method = {m.method: m for m in row}
    for method in methods:
        partner_name = method.interleaved_with
        mine, partner = by_method.get(method.name), by_method.get(partner_name or "")
        if mine is None or partner is None or partner_name not in calls:
            continue
        if method.name not in calls:
            continue
        partner_samples, my_samples = time_in_turn(
            calls[partner_name], calls[method.name], (partner.number, mine.number), config
        )
        for measurement, samples in ((partner, partner_samples), (mine, my_samples)):
            measurement.samples_s = samples
            measurement.median_s = statistics.median(samples)
        mine.interleaved_ratio = statistics.median(
            a / b for a, b in zip(partner_samples, my_samples)
        )


def add_ratios(row: Sequence[Measurement], methods: Sequence[Method]) -> None:
    """Fill ratio to ``numpy`` and to the fastest correct peer for one (workload, size)."""
    medians = {m.method: m.median_s for m in row if m.median_s is not None}
    peers = {m.name for m in methods if m.peer}
    peer_medians = {name: t for name, t in medians.items() if name in peers}
    best_peer = min(peer_medians, key=peer_medians.__getitem__) if peer_medians else None
    for measurement in row:
        if measurement.median_s is None:
            continue
        if "numpy" in medians:
            measurement.ratio_to_numpy = measurement.median_s / medians["numpy"]
        if best_peer is not None:
            measurement.best_peer = best_peer
            measurement.ratio_to_best_peer = measurement.median_s / peer_medians[best_peer]


def run_benchmark(
    workloads: Sequence[Workload],
    methods: Sequence[Method],
    config: RunConfig,
    progress: ProgressSink | None = None,
) -> BenchRun:
    """Measure every method on every workload and size; see the module docstring."""
    run = BenchRun(config, list(workloads), list(methods))
    for workload in workloads:
        sizes, dropped = planned_sizes(workload, config)
        if dropped:
            run.notes.append(f"{workload.name}: sizes {dropped} skipped (max {workload.max_size})")
        for size in sizes:
            problem = workload.problem(size, config.seed)
            reference = workload.hand_value_and_grad(problem.x, *problem.consts)
            row = []
            calls: dict[str, PreparedCall] = {}
            for method in (m for m in methods if m.applies_to(workload)):
                if progress is not None:
                    progress.begin(f"{workload.name} N={size} {method.name}")
                measurement = measure(
                    method, workload, problem, reference, config, run.absent, calls
                )
                row.append(measurement)
                if progress is not None:
                    progress.done(measurement)
            interleave_pairs(row, calls, methods, config)
            calls.clear()
            add_ratios(row, methods)
            run.measurements.extend(row)
    return run
