"""Python-loop workloads (gradtape.bench.workloads.LOOP_WORKLOADS): the costs the loop issue
names, as ratios measured in one run.

For each workload and size n, in a fresh process per (workload, n) so that nothing is cached:

* objective: the Python-loop function run on NumPy arrays (median of calls), and the
  vectorized NumPy objective;
* compiled: `gt.compile(gt.value_and_grad(f), backend="numba")` — the first call (recording,
  rolling, lowering and compiling the kernels), then the median call; the first call split
  into recording (the staged trace), the rolling search (`rolling.roll_tape`), planning (the
  rest of `build_program`: simplifications), lowering (the backend's lowering without the
  native compile) and the native compile (`NativeKernels._compile`: LLVM or Numba, or the
  kernel cache); and the recording alone (`gt.trace(gt.value_and_grad(f), x)`, timed
  separately);
* the first call again in a second fresh process with the kernel cache the first one filled
  (what a user sees from the second run of a script on: recording, rolling and lowering,
  no Numba compile);
* eager: `gt.value_and_grad(f)` with no compile (median).

Every gradient is compared with eager gradtape's before anything is timed. Usage:

    PYTHONPATH=src python benchmarks/loop_bench.py mixture_loops 10 100
    PYTHONPATH=src python benchmarks/loop_bench.py --one mixture_loops 10   # (one process)

The kernel cache is a temporary directory per size, shared by its two processes (set
GRADTAPE_CACHE_DIR to keep one).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def _median_time(f, repeat: int, budget: float = 20.0) -> float:
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget and len(times) >= 3:
            break
    return statistics.median(times)


def measure_one(name: str, n: int) -> dict:
    """The measurements of one workload at one size (in this process)."""
    import gradtape as gt
    from gradtape.bench.workloads import LOOP_WORKLOADS
    from gradtape.compile import dispatch, rolling
    from gradtape.compile.numba import backend

    spent = dict.fromkeys(("recording", "search", "program", "lower", "native"), 0.0)

    def timed(name: str, function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0

        return run

    rolling.roll_tape = timed("search", rolling.roll_tape)
    dispatch.build_program = timed("program", dispatch.build_program)
    dispatch.CompiledFunction._trace = timed("recording", dispatch.CompiledFunction._trace)
    backend.NativeKernels._compile = timed("native", backend.NativeKernels._compile)

    workload = LOOP_WORKLOADS[name]
    problem = workload.make_problem(n, np.random.default_rng([0, n]))
    consts = problem.consts

    def f(x):
        return workload.body(x, *consts)

    x = problem.x
    value = f(x)
    if not np.isclose(value, workload.vectorized(x, *consts), rtol=1e-10):
        raise AssertionError(f"{name}: the loop and the vectorized objective disagree")
    eager = gt.value_and_grad(f)
    t0 = time.perf_counter()
    want = eager(x)
    eager_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    tape = gt.trace(gt.value_and_grad(f), x)
    recording = time.perf_counter() - t0
    tape_length = len(tape.instructions)
    del tape
    compiled = gt.compile(gt.value_and_grad(f), backend="numba")
    lower = compiled._lower
    compiled._lower = timed("lower", lower)
    compiled._lower.native_loops = getattr(lower, "native_loops", False)
    for name in spent:
        spent[name] = 0.0
    t0 = time.perf_counter()
    got = compiled(x)
    first_call = time.perf_counter() - t0
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-8, atol=1e-12)
    result = {
        "workload": name,
        "n": n,
        "objective_loops_s": _median_time(lambda: f(x), 7),
        "objective_vectorized_s": _median_time(lambda: workload.vectorized(x, *consts), 21),
        "compiled_first_call_s": first_call,
        "rolling_search_s": spent["search"],
        "first_call_split_s": {
            "recording": spent["recording"],
            "search": spent["search"],
            "planning": spent["program"] - spent["search"],
            "lowering": spent["lower"] - spent["native"],
            "native compile": spent["native"],
        },
        "recording_s": recording,
        "tape_length": tape_length,
        "compiled_call_s": _median_time(lambda: compiled(x), 51),
        "eager_s": min(eager_first, _median_time(lambda: eager(x), 3)),
    }
    lowered = compiled.lowered(x)
    loops = getattr(getattr(lowered, "generated", None), "loops", {})
    result["native_loops"] = sum(1 for loop in loops.values() if loop.native)
    result["loops_in_python"] = [loop.reason for loop in loops.values() if not loop.native]
    return result


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(measure_one(argv[1], int(argv[2]))))
        return
    name, sizes = argv[0], [int(a) for a in argv[1:]]
    print(f"load average before: {os.getloadavg()}")
    for n in sizes:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ)
            env.setdefault("GRADTAPE_CACHE_DIR", cache)
            runs = [
                subprocess.run(
                    [sys.executable, __file__, "--one", name, str(n)],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                for _ in range(2)  # (the second with the kernels the first one cached)
            ]
        failed = next((done for done in runs if done.returncode), None)
        if failed is not None:
            print(f"{name} n={n}: failed\n{failed.stderr[-2000:]}")
            continue
        r, warm = (json.loads(done.stdout.strip().splitlines()[-1]) for done in runs)
        call = r["compiled_call_s"]
        line = (
            f"{name} n={n}: objective (loops) {r['objective_loops_s'] * 1e3:.3f} ms, "
            f"vectorized {r['objective_vectorized_s'] * 1e3:.3f} ms; compiled value_and_grad "
            f"{call * 1e3:.3f} ms = {call / r['objective_loops_s']:.3g}x "
            f"the loop objective ({call / r['objective_vectorized_s']:.3g}x the "
            f"vectorized), first call {r['compiled_first_call_s']:.2f} s (rolling search "
            f"{r['rolling_search_s']:.2f} s; recording alone {r['recording_s']:.2f} s, "
            f"{r['tape_length']} instructions), with the kernels cached "
            f"{warm['compiled_first_call_s']:.2f} s (rolling search "
            f"{warm['rolling_search_s']:.2f} s); eager {r['eager_s'] * 1e3:.1f} ms"
        )
        line += "; first call split: " + ", ".join(
            f"{part} {seconds:.2f} s" for part, seconds in r["first_call_split_s"].items()
        )
        line += f" (kernels cached: {warm['first_call_split_s']['native compile']:.2f} s native)"
        per_instruction = 1e6 / r["tape_length"]
        line += (
            f"; per recorded instruction: recording {r['recording_s'] * per_instruction:.1f} µs,"
            f" search {r['rolling_search_s'] * per_instruction:.1f} µs"
        )
        line += f"; native loops {r['native_loops']}"
        if r["loops_in_python"]:
            line += f", in Python: {r['loops_in_python']}"
        print(line, flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main(sys.argv[1:])
