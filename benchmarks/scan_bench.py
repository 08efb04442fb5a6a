"""scan: a tanh RNN (hidden 32) over T = 10, 100, 1000 steps, against JAX and the unrolled loop.

Run: python benchmarks/scan_bench.py [--quick] [--lengths T ...] [--repeat K]

The model is the bench's ``rnn_scan`` workload (h = tanh(W h + U x_t), loss =
0.5 * sum_t (v.h_t - z_t)**2, gradient w.r.t. W), timed as value and gradient with: gradtape's
eager ``grad`` of ``gt.scan``, ``gt.compile(gt.value_and_grad(f))`` of the same function on the
numpy backend (the loop runs in Python, one generated-NumPy call per step) and on the numba backend
(the loop and its backward loop are native Numba drivers), gradtape's eager ``grad`` of the plain
Python loop (unrolled on the tape), JAX's ``jit(value_and_grad)`` of ``lax.scan`` (its compile time
reported separately), and the hand-written NumPy backpropagation through time as the yardstick.
Every gradient is checked against the hand-written one before it is timed, then each method is
called a few more times and the background compiler is waited for (eager scans get native drivers
after a few calls; see the first-call columns for what a cold call costs). A second table gives the
time to the first gradient at a length not seen before (T+1, T+2, ...: JAX recompiles, gradtape
reuses the recorded body). Single-threaded: thread variables are set before NumPy and JAX are
imported. Each timing is a median over samples of back-to-back calls, in wall time and in the
process's CPU time (the steadier figure on a machine that other work shares; both are printed).
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
              "NUMBA_NUM_THREADS"):
    os.environ[_name] = "1"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                           " intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import gradtape as gt  # noqa: E402
from gradtape.bench.runner import relative_error  # noqa: E402
from gradtape.bench.workloads import (  # noqa: E402
    python_scan,
    rnn_loss,
    rnn_scan_hand,
    rnn_scan_problem,
)
from gradtape.compile.numba import backend as numba_backend  # noqa: E402
from gradtape.control.loops import EAGER_NATIVE_AFTER  # noqa: E402

ValueAndGrad = Callable[..., tuple[Any, Any]]
REFERENCE = "hand BPTT (NumPy)"
EAGER, COMPILED, NATIVE, UNROLLED, JAX_JIT = (
    "gradtape scan, eager", "gradtape scan, compiled numpy", "gradtape scan, compiled numba",
    "gradtape unrolled loop", "jax lax.scan jit")
RTOL = 1e-9


def problem_args(steps: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(x = W.ravel(), xs, targets, U, v, h0) of the bench workload at length ``steps``."""
    problem = rnn_scan_problem(steps, np.random.default_rng([seed, steps]))
    return (problem.x, *problem.consts)


def gradtape_methods() -> dict[str, ValueAndGrad]:
    """Each gradtape variant as value_and_grad(x, xs, targets, U, v, h0) w.r.t. x."""
    with_scan = functools.partial(rnn_loss, np, gt.scan)
    unrolled = functools.partial(rnn_loss, np, functools.partial(python_scan, np))
    methods = {
        EAGER: gt.value_and_grad(with_scan),
        COMPILED: gt.compile(gt.value_and_grad(with_scan), backend="numpy"),
        UNROLLED: gt.value_and_grad(unrolled),
    }
    if numba_backend.available():  # native loops; compiled before the first call returns
        methods[NATIVE] = gt.compile(gt.value_and_grad(with_scan), backend="numba")
    return methods


def jax_method() -> tuple[ValueAndGrad, Callable[..., Any]] | None:
    """JAX's jit(value_and_grad) of the lax.scan model and a converter of the arguments."""
    try:
        import jax
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    loss = functools.partial(rnn_loss, jax.numpy, jax.lax.scan)
    compiled = jax.jit(jax.value_and_grad(loss))

    def call(*args: Any) -> tuple[Any, Any]:
        return jax.block_until_ready(compiled(*args))

    return call, lambda args: tuple(jax.device_put(a) for a in args)


def check(name: str, output: tuple[Any, Any], reference: tuple[float, np.ndarray]) -> None:
    """Stop with a message if a method's value or gradient is not the hand-written one."""
    value_error = relative_error(np.asarray(output[0]).reshape(()), reference[0])
    grad_error = relative_error(np.asarray(output[1]).ravel(), reference[1])
    if not max(value_error, grad_error) <= RTOL:
        raise SystemExit(f"{name}: value error {value_error:.2g}, gradient error {grad_error:.2g}")


@dataclass(frozen=True)
class Timing:
    """How long to sample: ``repeat`` samples of calls lasting ``min_sample_s`` each."""

    repeat: int
    min_sample_s: float


def per_call_medians(call: Callable[[], Any], timing: Timing) -> tuple[float, float]:
    """Median wall and CPU seconds per call over ``timing.repeat`` samples (GC off)."""
    number, started = 1, time.perf_counter()
    call()
    while (time.perf_counter() - started) < timing.min_sample_s:
        number *= 2
        started = time.perf_counter()
        for _ in range(number):
            call()
    wall, cpu = [], []
    gc.disable()
    try:
        for _ in range(timing.repeat):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(number):
                call()
            cpu.append((time.process_time() - cpu0) / number)
            wall.append((time.perf_counter() - wall0) / number)
    finally:
        gc.enable()
    return statistics.median(wall), statistics.median(cpu)


def timed_first_call(fn: ValueAndGrad, args: tuple[Any, ...]) -> tuple[float, Any]:
    started = time.perf_counter()
    output = fn(*args)
    return time.perf_counter() - started, output


def measure_length(steps: int, methods: dict[str, tuple[ValueAndGrad, Callable]],
                   timing: Timing) -> dict[str, dict[str, float]]:
    """First call, then median per call of every method at length ``steps`` (checked first)."""
    args = problem_args(steps)
    reference = rnn_scan_hand(*args)
    rows = {}
    for name, (fn, convert) in methods.items():
        converted = convert(args)
        first, output = timed_first_call(fn, converted)
        check(f"{name} at T={steps}", output, reference)
        for _ in range(EAGER_NATIVE_AFTER):  # eager scans get native drivers after a few calls
            fn(*converted)
        if numba_backend.available():
            numba_backend.wait_for_kernels(120)
        wall, cpu = per_call_medians(lambda fn=fn, converted=converted: fn(*converted), timing)
        rows[name] = {"first": first, "wall": wall, "cpu": cpu}
    return rows


def measure_new_lengths(steps: int, methods: dict[str, tuple[ValueAndGrad, Callable]],
                        count: int) -> dict[str, float]:
    """Median time to the first gradient at lengths never called before: steps+1 ... steps+count."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    for new_steps in range(steps + 1, steps + count + 1):
        args = problem_args(new_steps, seed=1)
        reference = rnn_scan_hand(*args)
        for name, (fn, convert) in methods.items():
            elapsed, output = timed_first_call(fn, convert(args))
            check(f"{name} at new length T={new_steps}", output, reference)
            times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| :--- |" + " ---: |" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def print_tables(lengths: list[int], results: dict[int, dict[str, dict[str, float]]],
                 new_length: dict[int, dict[str, float]], names: list[str]) -> None:
    """The timing table, the ratios (of CPU medians) and the new-length table, as Markdown."""
    columns = ["method", *(f"T={t}" for t in lengths)]
    print("\n## value and gradient per call: CPU median / wall median [1st call, wall]\n")
    print(markdown_table(columns, [
        [name, *(f"{fmt(r['cpu'])} / {fmt(r['wall'])} [{fmt(r['first'])}]"
                 if (r := results[t].get(name)) else "-" for t in lengths)]
        for name in names
    ]))

    def cpu(t: int, name: str) -> float | None:
        return results[t].get(name, {}).get("cpu")

    rows = [
        [label, *(ratio(cpu(t, top), cpu(t, bottom)) for t in lengths)]
        for label, top, bottom in (
            ("unrolled loop / scan (both eager)", UNROLLED, EAGER),
            ("eager / compiled", EAGER, COMPILED),
            ("gradtape compiled / jax jit", COMPILED, JAX_JIT),
            ("gradtape numba / jax jit", NATIVE, JAX_JIT),
            ("gradtape numba / hand BPTT", NATIVE, REFERENCE),
            ("gradtape eager / jax jit", EAGER, JAX_JIT),
            ("gradtape compiled / hand BPTT", COMPILED, REFERENCE),
            ("jax jit / hand BPTT", JAX_JIT, REFERENCE),
        )
    ]
    if all(JAX_JIT in results[t] for t in lengths):
        rows.append(["jax jit compile time (1st call - wall median)",
                     *(fmt(results[t][JAX_JIT]["first"] - results[t][JAX_JIT]["wall"])
                       for t in lengths)])
    print("\n## ratios of CPU medians\n")
    print(markdown_table(["ratio", *(f"T={t}" for t in lengths)], rows))

    timed = [n for n in (EAGER, COMPILED, NATIVE, JAX_JIT) if n in new_length[lengths[0]]]
    print("\n## time to the first gradient at a new length (wall, median over T+1, T+2, ...)\n")
    print(markdown_table(["T", *timed, "jax jit / gradtape numba"], [
        [str(t), *(fmt(new_length[t][n]) for n in timed),
         ratio(new_length[t].get(JAX_JIT), new_length[t].get(NATIVE))]
        for t in lengths
    ]))


def main(argv: list[str] | None = None) -> None:
    """Parse the options, measure every length, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T = 10, 100 and fewer repeats")
    parser.add_argument("--lengths", nargs="+", type=int, help="sequence lengths T")
    parser.add_argument("--repeat", type=int, help="timing samples per measurement")
    parser.add_argument("--new-lengths", type=int, default=3,
                        help="how many unseen lengths the first-gradient time is taken over")
    args = parser.parse_args(argv)
    lengths = args.lengths or ([10, 100] if args.quick else [10, 100, 1000])
    timing = Timing(repeat=args.repeat or (5 if args.quick else 9), min_sample_s=0.05)

    def identity(a: tuple[Any, ...]) -> tuple[Any, ...]:
        return a

    methods: dict[str, tuple[ValueAndGrad, Callable]] = {
        REFERENCE: (rnn_scan_hand, identity),
        **{name: (fn, identity) for name, fn in gradtape_methods().items()},
    }
    jax = jax_method()
    if jax is None:
        print("jax not installed: its rows are left out")
    else:
        methods[JAX_JIT] = jax
    print(f"RNN hidden 32, 4 inputs; gradtape {gt.__version__}, numpy {np.__version__}"
          + ("" if jax is None else f", jax {sys.modules['jax'].__version__}")
          + f"; single thread; medians of {timing.repeat} samples, each >= "
          f"{timing.min_sample_s * 1e3:g} ms of back-to-back calls; load average before: "
          f"{os.getloadavg()[0]:.2f}")
    results, new_length = {}, {}
    for steps in lengths:
        results[steps] = measure_length(steps, methods, timing)
        timed = {n: m for n, m in methods.items() if n in (EAGER, COMPILED, NATIVE, JAX_JIT)}
        new_length[steps] = measure_new_lengths(steps, timed, args.new_lengths)
        print(f"T={steps} done", flush=True)
    print_tables(lengths, results, new_length, list(methods))
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
