"""The numba backend against its peers.

    python benchmarks/numba_bench.py [--quick] [--repeat 9] [--skip-all-cores] [--skip-latency]

Times value_and_grad of the seeds' workloads: the normal log-density (N = 10 .. 10^6), eam
(N = 100 .. 10^5), sum(exp(x)) (N = 10^3 .. 10^5) and a logistic regression with a design
matrix of N rows and 8 columns (N = 100 .. 10^5), with

  gt_numba      gradtape.compile(value_and_grad(f), backend="numba"), 1 thread
  gt_numpy      the same with backend="numpy"
  hand_numba    a hand-written fused loop, numba.njit, libm exp (what the seeds' users write)
  hand_fast     the same loop with gradtape's vectorizable exp/log and a reassociable sum
  hand_numpy    a hand-written NumPy gradient
  jax_jit, torch, autograd   the peers

Every method is checked against the hand-written NumPy gradient before it is timed. Single
thread: every thread pool is pinned to one thread before NumPy, JAX and PyTorch are imported;
the methods are timed in turn within each repeat (they share the machine's load) and the
medians are reported, in microseconds. The all-core table comes from a child process with
nothing pinned (JAX and PyTorch use their default pools; gradtape's loops run in
`os.cpu_count()` parallel chunks). Latency: fresh processes with an empty kernel cache measure
the time to the first gradient (record, lower, first call; backend="auto"), when the native
kernel is ready, and what a second process (warm disk cache) takes to run native code.
"""

from __future__ import annotations

import os
import sys

CHILD_ALL_CORES = "--child-all-cores" in sys.argv  # followed by the one system it measures
if not CHILD_ALL_CORES:  # one thread everywhere, set before NumPy / JAX / PyTorch are imported
    for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[_v] = "1"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false"
                               " intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

import gradtape as gt  # noqa: E402
from gradtape.compile.numba import backend as numba_backend  # noqa: E402

LOG_2PI = math.log(2 * math.pi)
FEATURES = 8


# --- workloads: body(xp, x, *consts), hand NumPy gradient, hand loop (numba source) -------------
def normal_logpdf(xp, x, mu):
    return xp.sum(-0.5 * ((x - mu) / 1.5) ** 2 - math.log(1.5) - 0.5 * LOG_2PI)


def normal_logpdf_hand(x, mu):
    z = (x - mu) / 1.5
    return float(np.sum(-0.5 * z * z) - x.size * (math.log(1.5) + 0.5 * LOG_2PI)), -z / 1.5


NORMAL_LOOP = """
def loop(x, mu):
    grad = np.empty_like(x)
    value = 0.0
    per_term = -math.log(1.5) - 0.5 * LOG_2PI
    for i in range(x.size):
        d = (x[i] - mu[i]) / 1.5
        value += -0.5 * d * d + per_term
        grad[i] = -d / 1.5
    return value, grad
"""


def eam(xp, x):
    rho = xp.sum(xp.exp(-3.0 * (x + 1.0)))
    return rho**2 + rho**3 + 0.25 * rho**4


def eam_hand(x):
    e = np.exp(-3.0 * (x + 1.0))
    rho = e.sum()
    return float(rho**2 + rho**3 + 0.25 * rho**4), -3.0 * (2 * rho + 3 * rho**2 + rho**3) * e


EAM_LOOP = """
def loop(x):
    grad = np.empty_like(x)
    rho = 0.0
    for i in range(x.size):
        e = EXP(-3.0 * (x[i] + 1.0))
        grad[i] = e
        rho += e
    scale = -3.0 * (2.0 * rho + 3.0 * rho**2 + rho**3)
    for i in range(x.size):
        grad[i] *= scale
    return rho**2 + rho**3 + 0.25 * rho**4, grad
"""


def sum_exp(xp, x):
    return xp.sum(xp.exp(x))


def sum_exp_hand(x):
    e = np.exp(x)
    return float(e.sum()), e


SUM_EXP_LOOP = """
def loop(x):
    grad = np.empty_like(x)
    value = 0.0
    for i in range(x.size):
        e = EXP(x[i])
        grad[i] = e
        value += e
    return value, grad
"""


def logistic(xp, w, design, labels):
    z = design @ w
    return xp.sum(xp.logaddexp(0.0, z) - labels * z)


def logistic_torch(torch, w, design, labels):
    z = design @ w
    return torch.sum(torch.nn.functional.softplus(z) - labels * z)


def logistic_hand(w, design, labels):
    z = design @ w
    value = float(np.sum(np.logaddexp(0.0, z) - labels * z))
    return value, design.T @ (1.0 / (1.0 + np.exp(-z)) - labels)


LOGISTIC_LOOP = """
def loop(w, design, labels):
    grad = np.zeros_like(w)
    value = 0.0
    n, p = design.shape
    for i in range(n):
        z = 0.0
        for j in range(p):
            z += design[i, j] * w[j]
        e = EXP(-abs(z))
        value += max(z, 0.0) + LOG1P(e) - labels[i] * z
        s = 1.0 / (1.0 + e) if z >= 0 else e / (1.0 + e)
        r = s - labels[i]
        for j in range(p):
            grad[j] += r * design[i, j]
    return value, grad
"""


def _problem(name: str, n: int):
    rng = np.random.default_rng([7, n])
    if name == "normal_logpdf":
        return rng.standard_normal(n), (rng.normal(2.0, 1.0, n),)
    if name == "eam":
        return rng.random(n), ()
    if name == "sum_exp":
        return rng.standard_normal(n), ()
    design = rng.standard_normal((n, FEATURES)) / math.sqrt(FEATURES)
    labels = (rng.random(n) < 0.5).astype(np.float64)
    return rng.standard_normal(FEATURES), (design, labels)


WORKLOADS = {  # name: (body, hand NumPy, hand loop, sizes, quick sizes)
    "normal_logpdf": (normal_logpdf, normal_logpdf_hand, NORMAL_LOOP,
                      (10, 100, 1000, 10_000, 100_000, 1_000_000), (10, 1000, 100_000)),
    "eam": (eam, eam_hand, EAM_LOOP, (100, 1000, 10_000, 100_000), (100, 10_000)),
    "sum_exp": (sum_exp, sum_exp_hand, SUM_EXP_LOOP, (1000, 10_000, 100_000), (1000, 100_000)),
    "logistic": (logistic, logistic_hand, LOGISTIC_LOOP, (100, 1000, 10_000, 100_000),
                 (100, 10_000)),
}


# --- methods ---------------------------------------------------------------------------------
def _hand_loop(source: str, fast: bool):
    from numba import njit

    from gradtape.compile.numba import fastmath

    namespace = {"np": np, "math": math, "LOG_2PI": LOG_2PI,
                 "EXP": fastmath.fast_exp if fast else math.exp,
                 "LOG1P": fastmath.fast_log1p if fast else math.log1p}
    exec(textwrap.dedent(source), namespace)
    flags = {"reassoc", "contract", "nsz", "arcp"} if fast else False
    return njit(fastmath=flags, error_model="numpy")(namespace["loop"])


def methods(name: str, n: int, threads: int, peers: bool) -> dict[str, Callable]:
    """method -> a zero-argument call returning (value, gradient) at this problem."""
    body, hand, loop, _, _ = WORKLOADS[name]
    x, consts = _problem(name, n)
    f = (lambda x: body(np, x, *consts))
    calls: dict[str, Callable] = {}
    numba_backend.set_num_threads(threads)  # this process's setting (it applies to every call)
    compiled = gt.compile(gt.value_and_grad(f), backend="numba")
    compiled(x)
    calls["gt_numba"] = lambda: compiled(x)
    if not peers:
        return calls
    reference = gt.compile(gt.value_and_grad(f), backend="numpy")
    calls["gt_numpy"] = lambda: reference(x)
    calls["hand_numpy"] = lambda: hand(x, *consts)
    for label, fast in (("hand_numba", False), ("hand_fast", True)):
        kernel = _hand_loop(loop, fast)
        calls[label] = (lambda k: lambda: k(x, *consts))(kernel)
    return calls | peer_methods(name, x, consts)


def peer_methods(name: str, x, consts, systems=("jax", "torch", "autograd")
                 ) -> dict[str, Callable]:
    body = WORKLOADS[name][0]
    calls: dict[str, Callable] = {}
    try:
        if "jax" not in systems:
            raise ImportError
        import jax

        jax.config.update("jax_enable_x64", True)
        jnp = jax.numpy
        jconsts = tuple(jnp.asarray(c) for c in consts)
        jf = jax.jit(jax.value_and_grad(lambda x: body(jnp, x, *jconsts)))
        xj = jax.device_put(x)
        calls["jax_jit"] = lambda: jax.block_until_ready(jf(xj))
    except ImportError:
        pass
    try:
        if "torch" not in systems:
            raise ImportError
        import torch

        if not CHILD_ALL_CORES:
            torch.set_num_threads(1)
        tconsts = tuple(torch.as_tensor(c) for c in consts)
        xt = torch.from_numpy(x)
        tbody = logistic_torch if name == "logistic" else body

        def torch_call():
            leaf = xt.detach().requires_grad_(True)
            value = tbody(torch, leaf, *tconsts)
            (grad,) = torch.autograd.grad(value, leaf)
            return value.item(), grad.numpy()

        calls["torch"] = torch_call
    except ImportError:
        pass
    if "autograd" in systems:
        try:
            import autograd
            import autograd.numpy as anp

            ag = autograd.value_and_grad(lambda x: body(anp, x, *consts))
            calls["autograd"] = lambda: ag(x)
        except ImportError:
            pass
    return calls


def time_methods(calls: dict[str, Callable], reference, repeat: int, budget: float
                 ) -> dict[str, float]:
    """Median microseconds per call of each method; methods take turns within each repeat."""
    numbers = {}
    for label, call in calls.items():
        value, grad = call()  # the first call records, compiles: not timed
        np.testing.assert_allclose(np.asarray(grad), reference[1], rtol=1e-9, atol=1e-12,
                                   err_msg=label)
        np.testing.assert_allclose(float(value), reference[0], rtol=1e-9, err_msg=label)
        start, number = time.perf_counter(), 1
        while time.perf_counter() - start < 0.01:
            call()
            number += 1
        per_call = (time.perf_counter() - start) / number
        numbers[label] = max(1, int(budget / repeat / len(calls) / per_call))
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(repeat):
        for label, call in calls.items():
            n = numbers[label]
            start = time.perf_counter()
            for _ in range(n):
                call()
            samples[label].append((time.perf_counter() - start) / n * 1e6)
    return {label: statistics.median(s) for label, s in samples.items()}


def throughput_tables(quick: bool, repeat: int, threads: int, system: str | None = None,
                      min_size: int = 0) -> list[dict]:
    """Times of every method (system None) or of one system's ("gt", "jax", "torch")."""
    rows = []
    for name, (_, hand, _, sizes, quick_sizes) in WORKLOADS.items():
        for n in (quick_sizes if quick else sizes):
            if n < min_size:
                continue
            x, consts = _problem(name, n)
            if system is None:
                calls = methods(name, n, threads, peers=True)
            elif system == "gt":
                calls = methods(name, n, threads, peers=False)
            else:
                calls = peer_methods(name, x, consts, systems=(system,))
            budget = 0.4 if quick else 1.5
            times = time_methods(calls, hand(x, *consts), repeat, budget)
            rows.append({"workload": name, "n": n, "times": times})
            print(f"  {name} N={n}: " + "  ".join(f"{k} {v:.2f}" for k, v in times.items()),
                  file=sys.stderr, flush=True)
    return rows


# --- latency ---------------------------------------------------------------------------------
_LATENCY_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import gradtape as gt
from gradtape.compile.numba.backend import lowered
t1 = time.perf_counter()
sys.path.insert(0, {bench_dir!r})
import numba_bench as B
body = B.WORKLOADS[{name!r}][0]
x, consts = B._problem({name!r}, {n})
f = lambda x: body(np, x, *consts)
t2 = time.perf_counter()
cf = gt.compile(gt.value_and_grad(f))
cf(x)
t3 = time.perf_counter()
low = lowered(cf, x)
calls = 0
while low.tier != "native" and time.perf_counter() - t3 < 120:
    cf(x)
    calls += 1
    time.sleep(0.0005)
t4 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "first_gradient": t3 - t2, "native_after": t4 - t3,
                  "numpy_tier_calls": calls, "from_cache": low.native.from_cache,
                  "compile_seconds": low.native.compile_seconds,
                  "startup_seconds": low.native.startup_seconds}}))
"""

_JAX_LATENCY_SCRIPT = """
import json, sys, time
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, {bench_dir!r})
import numba_bench as B
body = B.WORKLOADS[{name!r}][0]
x, consts = B._problem({name!r}, {n})
jconsts = tuple(jax.numpy.asarray(c) for c in consts)
t2 = time.perf_counter()
jf = jax.jit(jax.value_and_grad(lambda x: body(jax.numpy, x, *jconsts)))
jax.block_until_ready(jf(x))
print(json.dumps({{"first_gradient": time.perf_counter() - t2}}))
"""


def _run(script: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def latency(cases: list[tuple[str, int]]) -> list[dict]:
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    rows = []
    for name, n in cases:
        with tempfile.TemporaryDirectory() as cache_dir:
            env = {**os.environ, "GRADTAPE_CACHE_DIR": cache_dir}
            script = _LATENCY_SCRIPT.format(bench_dir=bench_dir, name=name, n=n)
            cold = _run(script, env)
            warm = _run(script, env)
        row = {"workload": name, "n": n, "cold": cold, "warm": warm}
        try:
            row["jax"] = _run(_JAX_LATENCY_SCRIPT.format(bench_dir=bench_dir, name=name, n=n),
                              dict(os.environ))
        except RuntimeError:
            pass
        rows.append(row)
        print(f"  latency {name} N={n}: {row}", file=sys.stderr, flush=True)
    return rows


# --- report ----------------------------------------------------------------------------------
ORDER = ["gt_numba", "hand_fast", "hand_numba", "hand_numpy", "gt_numpy", "jax_jit", "torch",
         "autograd"]
PEERS = ["jax_jit", "torch", "autograd", "hand_numpy"]


def report(single: list[dict], all_cores: list[dict] | None, lat: list[dict] | None) -> str:
    out = ["## value_and_grad, 1 thread: median microseconds per call", ""]
    labels = [m for m in ORDER if any(m in r["times"] for r in single)]
    out.append("| workload | N | " + " | ".join(labels) + " | best peer / gt_numba | "
               "gt_numba / hand_numba | gt_numba / hand_fast | jax_jit / gt_numba |")
    out.append("|---|---:|" + "---:|" * (len(labels) + 4))
    for r in single:
        t = r["times"]
        peers = [t[p] for p in PEERS if p in t]
        g = t["gt_numba"]
        cells = [f"{t[m]:.2f}" if m in t else "" for m in labels]
        ratios = [f"{min(peers) / g:.2f}" if peers else "",
                  f"{g / t['hand_numba']:.2f}" if "hand_numba" in t else "",
                  f"{g / t['hand_fast']:.2f}" if "hand_fast" in t else "",
                  f"{t['jax_jit'] / g:.2f}" if "jax_jit" in t else ""]
        out.append(f"| {r['workload']} | {r['n']} | " + " | ".join(cells + ratios) + " |")
    if all_cores:
        out += ["", f"## all cores ({os.cpu_count()}): median microseconds per call "
                "(1-thread gt_numba beside it)", ""]
        labels = [m for m in ("gt_numba", "jax_jit", "torch") if any(
            m in r["times"] for r in all_cores)]
        out.append("| workload | N | gt_numba 1 thread | " + " | ".join(
            f"{m} all cores" for m in labels) + " |")
        out.append("|---|---:|---:|" + "---:|" * len(labels))
        one = {(r["workload"], r["n"]): r["times"]["gt_numba"] for r in single}
        for r in all_cores:
            key = (r["workload"], r["n"])
            cells = [f"{r['times'][m]:.2f}" if m in r["times"] else "" for m in labels]
            out.append(f"| {r['workload']} | {r['n']} | "
                       f"{one.get(key, float('nan')):.2f} | " + " | ".join(cells) + " |")
    if lat:
        out += ["", "## latency (fresh processes; backend='auto'; seconds)", "",
                "| workload | N | import gradtape | first gradient | native ready after | "
                "(Numba startup + compile) | numpy-tier calls meanwhile | 2nd process: native "
                "after | (Numba startup + kernel load) | JAX jit first gradient |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in lat:
            c, w = r["cold"], r["warm"]
            jax_first = f"{r['jax']['first_gradient']:.3f}" if "jax" in r else ""
            out.append(f"| {r['workload']} | {r['n']} | {c['import']:.3f} | "
                       f"{c['first_gradient']:.4f} | {c['native_after']:.2f} | "
                       f"{c['startup_seconds']:.2f} + {c['compile_seconds']:.2f} | "
                       f"{c['numpy_tier_calls']} | {w['native_after']:.2f} | "
                       f"{w['startup_seconds']:.2f} + {w['compile_seconds']:.3f}"
                       f"{'' if w['from_cache'] else ' (no cache hit)'} | {jax_first} |")
    return "\n".join(out)


def all_core_rows(quick: bool, repeat: int) -> list[dict]:
    """Each system in a process of its own, nothing pinned: thread pools that spin between
    parallel regions (OpenMP) would otherwise take the cores from each other."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")
           and k != "XLA_FLAGS"}
    merged: dict[tuple, dict] = {}
    for system in ("gt", "jax", "torch"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child-all-cores", system,
               "--repeat", str(repeat), "--workloads", *WORKLOADS] + (
                   ["--quick"] if quick else [])
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            continue
        for row in json.loads(done.stdout.strip().splitlines()[-1]):
            key = (row["workload"], row["n"])
            merged.setdefault(key, {"workload": row["workload"], "n": row["n"], "times": {}})
            merged[key]["times"].update(row["times"])
    return list(merged.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--skip-all-cores", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS),
                        help="only these workloads (default: all)")
    parser.add_argument("--child-all-cores", choices=("gt", "jax", "torch"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeat = 5 if args.quick else args.repeat
    if args.workloads:
        for name in list(WORKLOADS):
            if name not in args.workloads:
                del WORKLOADS[name]
    if args.child_all_cores:
        rows = throughput_tables(args.quick, repeat, os.cpu_count() or 1,
                                 system=args.child_all_cores, min_size=10_000)
        print(json.dumps(rows))
        return
    single = throughput_tables(args.quick, repeat, 1)
    all_cores = None
    if not args.skip_all_cores:
        all_cores = all_core_rows(args.quick, repeat)
    lat = None
    if not args.skip_latency:
        lat = latency([("normal_logpdf", 1000), ("eam", 1000), ("logistic", 1000)])
    print(report(single, all_cores, lat))
    print(f"\npython {sys.version.split()[0]}, numpy {np.__version__}, "
          f"{os.cpu_count()} cores; medians of {repeat} interleaved batches")


if __name__ == "__main__":
    main()
