"""The benchmark's "scaling" section: costs that should grow with the work, not faster.

`gradtape scaling [--quick] [--out DIR]` measures, each in fresh processes with a cold kernel
cache (so one measurement cannot warm the next):

* **time to native under load**: a caller that never pauses calls `compile(grad(f))` with
  `backend="auto"` from its first call on; the time until calls run native code, the longest
  single call after the first, and the calls per second while Numba compiles against the
  numpy tier's (normal log-density, logistic regression);
* **compile time against program size**: a straight-line program of k elementwise operations
  (loop rolling off: one fused loop), its value and gradient compiled by gradtape's numba
  backend with each kernel generator (llvmlite directly; Numba, `GRADTAPE_LLVM=0`) and by
  JAX's `jit` (XLA);
* **a second process with a warm cache**: the same process run twice on one cache, the
  second's time from `import` to the result of its first native call (gradtape with each
  generator; JAX with its persistent compilation cache);
* **peak memory against N**: eager `grad` of a chain of 20 operations, gradtape against
  autograd and JAX (the resident high-water mark above the process's own, in MB);
* **per-operation overhead**: eager `grad` of a chain of k operations at N=10, per operation;
* **a new input length**: `compile(value_and_grad(f))` called with a length it has not seen
  (the same program), against a steady call, on the numpy and numba backends;
* **re-creating** `compile(value_and_grad(f))` before each call, against a steady call;
* **kernel memory**: resident memory per distinct program over many programs compiled
  natively with a small `GRADTAPE_MAX_KERNELS` and `GRADTAPE_MAX_COMPILED`.

Results go to DIR/scaling.json and DIR/scaling.md, and DIR/scaling.png when matplotlib is
installed. Peers that are not installed are reported as absent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

QUICK_SIZES = {
    "ops": (10, 100, 300),
    "n_memory": (10_000, 100_000, 1_000_000),
    "kernel_programs": 60,
}
FULL_SIZES = {
    "ops": (10, 100, 300, 1000),
    "n_memory": (10_000, 100_000, 1_000_000, 3_000_000),
    "kernel_programs": 400,
}
LOAD_SECONDS = 20.0  # the longest a caller waits for native code
OVERHEAD_OPS = 100
NEW_LENGTHS = 200  # new input lengths timed (and as many steady calls)
KEPT_LENGTHS = 2000  # further new lengths, for the memory each one keeps

# --- the measurements, each a script run in a fresh process; it prints one JSON line --------
_TIME_TO_NATIVE = """
import json, time
import numpy as np
import gradtape as gt
from gradtape.compile.numba import backend as nb

rng = np.random.default_rng(0)
if WORKLOAD == "normal_logpdf":
    x = rng.normal(size=1000)

    def f(x):
        return np.sum(-0.5 * ((x - 0.3) / 1.7) ** 2 - np.log(1.7) - 0.9189385332046727)

else:
    X = rng.normal(size=(1000, 10))
    y = (rng.random(1000) < 0.5).astype(float)
    x = rng.normal(size=10) * 0.1

    def f(w):
        z = X @ w
        return np.sum(np.logaddexp(0.0, z) - y * z)

numpy_tier = gt.compile(gt.value_and_grad(f), backend="numpy")
numpy_tier(x)
count, start = 0, time.perf_counter()
while time.perf_counter() - start < 0.5:
    numpy_tier(x)
    count += 1
numpy_rate = count / (time.perf_counter() - start)

start = time.perf_counter()
cf = gt.compile(gt.value_and_grad(f), backend="auto")
cf(x)
first = time.perf_counter() - start
lowered = nb.lowered(cf, x)
longest, calls, native_at = 0.0, 0, None
while time.perf_counter() - start < LOAD_SECONDS:
    t = time.perf_counter()
    cf(x)
    dt = time.perf_counter() - t
    calls += 1
    longest = max(longest, dt)
    if lowered.tier == "native":
        native_at = time.perf_counter() - start
        break
rate = calls / ((native_at or LOAD_SECONDS) - first) if calls else 0.0
print(json.dumps({
    "workload": WORKLOAD, "time_to_native_s": native_at, "first_call_s": first,
    "max_call_s": longest, "throughput_vs_numpy_tier": rate / numpy_rate,
}))
"""

_COMPILE_GRADTAPE = """
import json, os, time, warnings
import numpy as np
import gradtape as gt
from gradtape.compile.numba import backend as nb

warnings.simplefilter("ignore")
if os.environ.get("GRADTAPE_LLVM") == "0":
    nb._numba_startup()  # reported apart: a process pays it once
out = []
for k in SIZES:
    def f(x, k=k):
        y = x
        for i in range(k // 3):
            y = np.sin(y) * 0.5 + y
        return np.sum(y)

    x = np.linspace(0.0, 1.0, 100)
    start = time.perf_counter()
    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    cf(x)
    native = cf.lowered(x).native
    out.append({"ops": k, "seconds": time.perf_counter() - start,
                "generator": native.generator if native is not None else None})
print(json.dumps(out))
"""

# the same process twice with one cache: the second's time from before `import gradtape` to
# the result of its first native call (backend="numba": the kernels come before that call)
_SECOND_PROCESS_GRADTAPE = """
import time
start = time.perf_counter()
import gradtape as gt
imported = time.perf_counter()
import json, sys
import numpy as np

def f(x):
    return np.sum(-0.5 * ((x - 0.3) / 1.7) ** 2 - np.log(1.7) - 0.9189385332046727)

x = np.linspace(-1.0, 1.0, 1000)
cf = gt.compile(gt.value_and_grad(f), backend="numba")
cf(x)
done = time.perf_counter()
native = cf.lowered(x).native
print(json.dumps({"import_s": imported - start, "first_native_after_import_s": done - imported,
                  "generator": native.generator, "from_cache": native.from_cache,
                  "numba_imported": "numba" in sys.modules}))
"""

_SECOND_PROCESS_JAX = """
import time
start = time.perf_counter()
import jax
imported = time.perf_counter()
import json, os
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", os.environ["GRADTAPE_CACHE_DIR"] + "/jax")
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
import jax.numpy as jnp
import numpy as np

def f(x):
    return jnp.sum(-0.5 * ((x - 0.3) / 1.7) ** 2 - jnp.log(1.7) - 0.9189385332046727)

x = np.linspace(-1.0, 1.0, 1000)
value, grad = jax.jit(jax.value_and_grad(f))(x)
grad.block_until_ready()
done = time.perf_counter()
print(json.dumps({"import_s": imported - start, "first_native_after_import_s": done - imported}))
"""

_COMPILE_JAX = """
import json, time
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np

out = []
for k in SIZES:
    def f(x, k=k):
        y = x
        for i in range(k // 3):
            y = jnp.sin(y) * 0.5 + y
        return jnp.sum(y)

    x = np.linspace(0.0, 1.0, 100)
    start = time.perf_counter()
    jax.jit(jax.value_and_grad(f)).lower(x).compile()
    out.append({"ops": k, "seconds": time.perf_counter() - start})
print(json.dumps(out))
"""

_MEMORY = """
import json, resource
import numpy as np

def chain(m, x):
    y = x
    for i in range(5):
        y = m.sin(y) * 0.5 + m.exp(-y * y)
    return m.sum(y)

x = np.linspace(0.0, 1.0, N)
if METHOD == "gradtape":
    import gradtape as gt
    g = gt.grad(lambda x: chain(np, x))
elif METHOD == "autograd":
    import autograd
    import autograd.numpy as anp
    g = autograd.grad(lambda x: chain(anp, x))
else:
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    g = jax.jit(jax.grad(lambda x: chain(jnp, x)))
small = np.linspace(0.0, 1.0, 16)
np.asarray(g(small))  # imports and first-call state, before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = np.asarray(g(x))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
traced = None
if METHOD != "jax":  # (XLA's buffers are not Python allocations)
    import tracemalloc
    del result
    tracemalloc.start()
    result = np.asarray(g(x))
    traced = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
print(json.dumps({"method": METHOD, "n": N, "peak_mb": max(after - before, 0) / 1024,
                  "traced_peak_mb": traced, "input_mb": x.nbytes / 2**20}))
"""

_OVERHEAD = """
import json, time
import numpy as np

def chain(m, x):
    y = x
    for i in range(OPS // 2):
        y = m.sin(y) * 0.5
    return m.sum(y)

x = np.linspace(0.0, 1.0, 10)
if METHOD == "gradtape":
    import gradtape as gt
    g = gt.grad(lambda x: chain(np, x))
else:
    import autograd
    import autograd.numpy as anp
    g = autograd.grad(lambda x: chain(anp, x))
g(x)
best = float("inf")
for _ in range(7):
    start = time.perf_counter()
    for _ in range(20):
        g(x)
    best = min(best, (time.perf_counter() - start) / 20)
print(json.dumps({"method": METHOD, "us_per_op": best / OPS * 1e6}))
"""


_NEW_LENGTH = """
import gc, json, resource, time, warnings
import numpy as np
import gradtape as gt

warnings.simplefilter("ignore")


def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 1024


def f(x):
    return np.sum(-0.5 * ((x - 0.3) / 1.7) ** 2 - np.log(1.7) - 0.9189385332046727)


def median(values):
    return sorted(values)[len(values) // 2]


out = []
for backend in BACKENDS:
    cf = gt.compile(gt.value_and_grad(f), backend=backend)
    for n in (10, 11, 12):  # the first recordings, and the kernels compiled
        cf(np.linspace(0.0, 1.0, n))
    new = []
    for n in range(100, 100 + LENGTHS):
        x = np.linspace(0.0, 1.0, n)
        start = time.perf_counter()
        cf(x)
        new.append(time.perf_counter() - start)
    x = np.linspace(0.0, 1.0, 100)
    steady = []
    for _ in range(LENGTHS):
        start = time.perf_counter()
        cf(x)
        steady.append(time.perf_counter() - start)
    # what each further new length keeps: signatures are bounded (GRADTAPE_MAX_SIGNATURES)
    gc.collect()
    before = rss_kb()
    for n in range(100 + LENGTHS, 100 + LENGTHS + KEPT_LENGTHS):
        cf(np.linspace(0.0, 1.0, n))
    gc.collect()
    out.append({"backend": backend, "new_length_ms": median(new) * 1e3,
                "steady_us": median(steady) * 1e6,
                "kb_kept_per_length": (rss_kb() - before) / KEPT_LENGTHS,
                "kept_lengths": KEPT_LENGTHS})
print(json.dumps(out))
"""

_RECREATE = """
import json, time
import numpy as np
import gradtape as gt


def f(x):
    return np.sum(-0.5 * ((x - 0.3) / 1.7) ** 2)


x = np.linspace(0.0, 1.0, 10)
cf = gt.compile(gt.value_and_grad(f), backend="numpy")
cf(x)


def best(call, n=2000):
    times = []
    for _ in range(9):
        start = time.perf_counter()
        for _ in range(n):
            call()
        times.append((time.perf_counter() - start) / n)
    return sorted(times)[len(times) // 2]


steady = best(lambda: cf(x))
again = best(lambda: gt.compile(gt.value_and_grad(f), backend="numpy")(x))
print(json.dumps({"steady_us": steady * 1e6, "recreated_us": again * 1e6,
                  "ratio": again / steady}))
"""

_KERNEL_MEMORY = """
import gc, json, resource, sys, warnings
import numpy as np
import gradtape as gt

warnings.simplefilter("ignore")
OPS = [np.sin, np.cos, np.tanh, np.exp, np.arctan, np.log1p]


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def program(i):  # a distinct sequence of five operations per i: a distinct kernel text
    ops = []
    for _ in range(5):
        ops.append(OPS[i % 6])
        i //= 6

    def f(x):
        y = x
        for op in ops:
            y = op(y) * 0.5 + y
        return np.sum(y)

    return f


x = np.linspace(0.1, 0.9, 50)
warm = PROGRAMS // 4
for i in range(PROGRAMS):
    gt.compile(gt.grad(program(i + 7)), backend="numba")(x)
    if i + 1 == warm:
        gc.collect()
        base = rss_mb()
gc.collect()
kept = sum(1 for name in sys.modules if name.startswith("gradtape_kernel_"))
print(json.dumps({"programs": PROGRAMS, "max_kernels": MAX_KERNELS,
                  "kb_per_program": (rss_mb() - base) * 1024 / (PROGRAMS - warm),
                  "modules_imported": kept}))
"""


def _run(
    script: str,
    timeout: float = 900.0,
    environment: dict | None = None,
    times: int = 1,
    **names: Any,
) -> tuple[Any, str | None]:
    """Run `script` with `names` defined, in a fresh process with a cold kernel cache (and
    `environment` added to the environment); with `times` > 1, that many processes one after
    another on the same cache (the last one's result)."""
    prelude = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    with tempfile.TemporaryDirectory(prefix="gradtape-scaling-") as cache_dir:
        env = dict(os.environ, GRADTAPE_CACHE_DIR=cache_dir, **(environment or {}))
        for _ in range(times):
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", prelude + textwrap.dedent(script)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                return None, f"timed out after {timeout:.0f} s"
            if proc.returncode != 0:
                break
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit status {proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def measure(quick: bool) -> dict[str, Any]:
    """Every measurement of the section; absent peers and failures are noted, not raised."""
    sizes = QUICK_SIZES if quick else FULL_SIZES
    results: dict[str, Any] = {"notes": []}
    native = _installed("numba")

    results["time_to_native"] = []
    for workload in ("normal_logpdf", "logistic_regression"):
        if not native:
            results["notes"].append("numba not installed: no time to native")
            break
        got, error = _run(_TIME_TO_NATIVE, WORKLOAD=workload, LOAD_SECONDS=LOAD_SECONDS)
        results["time_to_native"].append(got or {"workload": workload, "error": error})

    results["compile_time"] = {}
    # a straight-line program (loop rolling off: one fused loop of k operations), compiled
    # by the llvmlite generator, by Numba (GRADTAPE_LLVM=0) and by XLA
    straight = {"GRADTAPE_ROLL": "0"}
    peers = [
        ("gradtape (llvm)", _COMPILE_GRADTAPE, native, straight),
        ("gradtape (numba)", _COMPILE_GRADTAPE, native, dict(straight, GRADTAPE_LLVM="0")),
        ("jax", _COMPILE_JAX, _installed("jax"), {}),
    ]
    for name, script, present, environment in peers:
        if not present:
            results["notes"].append(f"{name}: not installed (compile time)")
            continue
        got, error = _run(script, timeout=3600.0, environment=environment, SIZES=list(sizes["ops"]))
        results["compile_time"][name] = got if got is not None else {"error": error}

    results["second_process"] = []
    second = [
        ("gradtape (llvm)", _SECOND_PROCESS_GRADTAPE, native, {}),
        ("gradtape (numba)", _SECOND_PROCESS_GRADTAPE, native, {"GRADTAPE_LLVM": "0"}),
        ("jax", _SECOND_PROCESS_JAX, _installed("jax"), {}),
    ]
    for name, script, present, environment in second:
        if present:
            got, error = _run(script, environment=environment, times=2)
            results["second_process"].append(
                dict(got, method=name) if got else {"method": name, "error": error}
            )

    results["memory"] = []
    for method, module in (("gradtape", "numpy"), ("autograd", "autograd"), ("jax", "jax")):
        if not _installed(module):
            results["notes"].append(f"{method}: not installed (memory)")
            continue
        for n in sizes["n_memory"]:
            got, error = _run(_MEMORY, METHOD=method, N=n)
            results["memory"].append(got or {"method": method, "n": n, "error": error})

    results["overhead"] = []
    for method, module in (("gradtape", "numpy"), ("autograd", "autograd")):
        if _installed(module):
            got, error = _run(_OVERHEAD, METHOD=method, OPS=OVERHEAD_OPS)
            results["overhead"].append(got or {"method": method, "error": error})

    backends = ["numpy", "numba"] if native else ["numpy"]
    got, error = _run(
        _NEW_LENGTH, BACKENDS=backends, LENGTHS=NEW_LENGTHS, KEPT_LENGTHS=KEPT_LENGTHS
    )
    results["new_length"] = got if got is not None else [{"backend": "-", "error": error}]
    got, error = _run(_RECREATE)
    results["recreate"] = got if got is not None else {"error": error}
    if native:
        got, error = _run(
            _KERNEL_MEMORY,
            timeout=7200.0,
            environment={"GRADTAPE_MAX_KERNELS": "8", "GRADTAPE_MAX_COMPILED": "8"},
            PROGRAMS=sizes["kernel_programs"],
            MAX_KERNELS=8,
        )
        results["kernel_memory"] = got if got is not None else {"error": error}
    else:
        results["notes"].append("numba not installed: no kernel memory")
    return results


def markdown(results: dict[str, Any]) -> str:
    """The section as Markdown tables."""
    lines = ["# Scaling"]
    lines += _time_to_native_table(results)
    lines += _compile_time_table(results)
    lines += _second_process_table(results)
    lines += _memory_tables(results)
    lines += _overhead_table(results)
    lines += _cost_tables(results)
    if results["notes"]:
        lines += ["", "Notes: " + "; ".join(results["notes"])]
    return "\n".join(lines) + "\n"


def _time_to_native_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Time to native under a caller that never pauses (cold cache)",
        "",
        "| workload | time to native (s) | first call (s) | longest call (ms) "
        "| throughput vs numpy tier |",
        "|---|---|---|---|---|",
    ]
    for r in results["time_to_native"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | error: {r['error']} | | | |")
            continue
        native = r["time_to_native_s"]
        lines.append(
            f"| {r['workload']} | {'not reached' if native is None else f'{native:.2f}'} | "
            f"{r['first_call_s']:.3f} | {r['max_call_s'] * 1e3:.1f} | "
            f"{r['throughput_vs_numpy_tier']:.2f} |"
        )
    return lines


def _compile_time_table(results: dict[str, Any]) -> list[str]:
    lines = ["", "## Compile time of value-and-gradient against program size (seconds)", ""]
    peers = list(results["compile_time"])
    lines.append("| ops | " + " | ".join(peers) + " |")
    lines.append("|---|" + "---|" * len(peers))
    rows: dict[int, dict[str, str]] = {}
    for peer, got in results["compile_time"].items():
        if isinstance(got, dict):
            rows.setdefault(-1, {})[peer] = f"error: {got['error']}"
            continue
        for r in got:
            rows.setdefault(r["ops"], {})[peer] = f"{r['seconds']:.2f}"
    for k in sorted(rows):
        label = "-" if k < 0 else str(k)
        lines.append(f"| {label} | " + " | ".join(rows[k].get(p, "") for p in peers) + " |")
    return [
        *lines,
        "",
        "A straight-line program of k operations (loop rolling off), value and gradient.",
    ]


def _second_process_table(results: dict[str, Any]) -> list[str]:
    if not results.get("second_process"):
        return []
    lines = [
        "",
        "## A second process with a warm cache: seconds to the first native call",
        "",
        "| method | import | first native call after import | total | Numba imported |",
        "|---|---|---|---|---|",
    ]
    for r in results["second_process"]:
        if "error" in r:
            lines.append(f"| {r['method']} | error: {r['error']} | | | |")
            continue
        first, imp = r["first_native_after_import_s"], r["import_s"]
        numba = {True: "yes", False: "no"}.get(r.get("numba_imported"), "-")
        lines.append(f"| {r['method']} | {imp:.3f} | {first:.3f} | {imp + first:.3f} | {numba} |")
    return lines


def _memory_tables(results: dict[str, Any]) -> list[str]:
    lines = ["", "## Peak memory of eager grad, chain of 20 operations (MB above baseline)", ""]
    methods = list(dict.fromkeys(r["method"] for r in results["memory"]))
    lines.append("| N | input (MB) | " + " | ".join(methods) + " |")
    lines.append("|---|---|" + "---|" * len(methods))
    by_n: dict[int, dict[str, str]] = {}
    inputs: dict[int, float] = {}
    for r in results["memory"]:
        text = f"error: {r['error']}" if "error" in r else f"{r['peak_mb']:.1f}"
        by_n.setdefault(r["n"], {})[r["method"]] = text
        if "input_mb" in r:
            inputs[r["n"]] = r["input_mb"]
    for n in sorted(by_n):
        cells = " | ".join(by_n[n].get(m, "") for m in methods)
        lines.append(f"| {n} | {inputs.get(n, float('nan')):.1f} | {cells} |")
    traced = [r for r in results["memory"] if r.get("traced_peak_mb") is not None]
    if traced:
        lines += ["", "Peak of Python's allocations (tracemalloc) in the same call, MB:", ""]
        traced_methods = list(dict.fromkeys(r["method"] for r in traced))
        lines.append("| N | " + " | ".join(traced_methods) + " |")
        lines.append("|---|" + "---|" * len(traced_methods))
        by_n_traced: dict[int, dict[str, str]] = {}
        for r in traced:
            by_n_traced.setdefault(r["n"], {})[r["method"]] = f"{r['traced_peak_mb']:.1f}"
        for n in sorted(by_n_traced):
            cells = " | ".join(by_n_traced[n].get(m, "") for m in traced_methods)
            lines.append(f"| {n} | {cells} |")
    return lines


def _overhead_table(results: dict[str, Any]) -> list[str]:
    lines = ["", f"## Eager grad, per recorded operation (N=10, {OVERHEAD_OPS} operations)", ""]
    lines += ["| method | us per operation |", "|---|---|"]
    for r in results["overhead"]:
        value = f"error: {r['error']}" if "error" in r else f"{r['us_per_op']:.2f}"
        lines.append(f"| {r['method']} | {value} |")
    return lines


def _cost_tables(results: dict[str, Any]) -> list[str]:
    """New input lengths, re-creating a compiled function, kernel memory (when measured)."""
    lines: list[str] = []
    if "new_length" in results:
        lines += ["", "## A new input length (the same program), medians", ""]
        lines += [
            "| backend | new length (ms) | steady call (us) | KB kept per further length |",
            "|---|---|---|---|",
        ]
        for r in results["new_length"]:
            if "error" in r:
                lines.append(f"| {r['backend']} | error: {r['error']} | | |")
            else:
                kept = r.get("kb_kept_per_length")
                kept_text = "" if kept is None else f"{kept:.2f} (over {r['kept_lengths']})"
                lines.append(
                    f"| {r['backend']} | {r['new_length_ms']:.3f} | {r['steady_us']:.2f} | "
                    f"{kept_text} |"
                )
    if "recreate" in results:
        r = results["recreate"]
        lines += ["", "## Re-creating `compile(value_and_grad(f))` before each call", ""]
        if "error" in r:
            lines.append(f"error: {r['error']}")
        else:
            lines += [
                "| steady call (us) | re-created and called (us) | ratio |",
                "|---|---|---|",
                f"| {r['steady_us']:.2f} | {r['recreated_us']:.2f} | {r['ratio']:.2f} |",
            ]
    if "kernel_memory" in results:
        r = results["kernel_memory"]
        lines += ["", "## Resident memory per distinct natively compiled program", ""]
        if "error" in r:
            lines.append(f"error: {r['error']}")
        else:
            lines += [
                "| programs | GRADTAPE_MAX_KERNELS | KB per program | kernel modules imported |",
                "|---|---|---|---|",
                f"| {r['programs']} | {r['max_kernels']} | {r['kb_per_program']:.1f} | "
                f"{r['modules_imported']} |",
            ]
    return lines


def plot(results: dict[str, Any], path: Path) -> bool:
    """Four panels in one PNG; False when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(11, 8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(2, 2, 1)
    ok = [r for r in results["time_to_native"] if r.get("time_to_native_s") is not None]
    ax.bar([r["workload"] for r in ok], [r["time_to_native_s"] for r in ok])
    ax.set_title("time to native under load (s)")
    ax = fig.add_subplot(2, 2, 2)
    for peer, got in results["compile_time"].items():
        if isinstance(got, list):
            ax.loglog([r["ops"] for r in got], [r["seconds"] for r in got], "o-", label=peer)
    ax.set_title("compile time vs operations (s)")
    ax.legend()
    ax = fig.add_subplot(2, 2, 3)
    for method in dict.fromkeys(r["method"] for r in results["memory"]):
        pts = [r for r in results["memory"] if r["method"] == method and "peak_mb" in r]
        ax.loglog([r["n"] for r in pts], [max(r["peak_mb"], 0.1) for r in pts], "o-", label=method)
    ax.set_title("peak memory of eager grad vs N (MB)")
    ax.legend()
    ax = fig.add_subplot(2, 2, 4)
    ok = [r for r in results["overhead"] if "us_per_op" in r]
    ax.bar([r["method"] for r in ok], [r["us_per_op"] for r in ok])
    ax.set_title("eager grad: us per operation (N=10)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def add_parser(commands) -> None:
    """The `gradtape scaling` subcommand."""
    parser = commands.add_parser(
        "scaling",
        help="benchmark costs against size: time to native, compile time, memory, overhead",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument("--quick", action="store_true", help="fewer and smaller sizes")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="directory for scaling.json, scaling.md and scaling.png (default: bench-results)",
    )
    parser.set_defaults(handler=run_scaling_command)


def run_scaling_command(args: argparse.Namespace, argv) -> int:
    """`gradtape scaling`: measure, write the files, print the tables."""
    results = measure(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    (args.out / "scaling.md").write_text(text)
    written = ["scaling.json", "scaling.md"]
    if plot(results, args.out / "scaling.png"):
        written.append("scaling.png")
    print(text)
    print("Wrote " + ", ".join(str(args.out / w) for w in written))
    return 0
