"""compile (numpy backend) against eager grad, HIPS autograd and JAX jit(grad) .

Run: python benchmarks/compile_bench.py [--quick]
     python benchmarks/compile_bench.py --program-size [--ops 10 100 1000 4000]
Times value_and_grad of the seeds' normal log-density (N = 10 .. 10^6) and EAM model
(N = 100, 1000), single-threaded, and prints medians (microseconds per call) and the
ratios that matter: eager / compiled (goal >= 10 at N = 1000) and JAX / compiled
at N = 10 (goal > 1: less per-call overhead than JAX's jit dispatch). Every method's
result is checked against the closed-form gradient before it is timed.

With --program-size: compile time against program size. value_and_grad of a straight chain
of k elementwise operations (loop rolling off: one program of about 2.3 k instructions),
compiled natively by gradtape (backend="numba": LLVM's generator, or Numba with
GRADTAPE_LLVM=0) and by JAX's jit, each method in a fresh process with a cold cache; wall and
CPU seconds of the first call (recording and compiling), the kernels' count, and the load
average beside them.
"""

from __future__ import annotations

import os

# single-threaded everywhere, set before NumPy / JAX are imported
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                           " intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as onp  # noqa: E402

import gradtape as gt  # noqa: E402


def normal_logpdf(np):
    def f(x):
        return np.sum(-0.5 * ((x - 0.3) / 1.7) ** 2 - np.log(1.7) - 0.5 * np.log(2 * np.pi))
    return f


def normal_logpdf_grad(x):
    return -(x - 0.3) / 1.7**2


def eam(np):
    def f(x):
        rho = np.sum(np.exp(-3 * (x + 1)))
        return rho**2 + rho**3 + 0.25 * rho**4
    return f


def eam_grad(x):
    rho = onp.sum(onp.exp(-3 * (x + 1)))
    return -3 * onp.exp(-3 * (x + 1)) * (2 * rho + 3 * rho**2 + rho**3)


WORKLOADS = [("normal_logpdf", normal_logpdf, normal_logpdf_grad, (10, 1000, 100_000, 1_000_000)),
             ("eam", eam, eam_grad, (100, 1000))]


def median_us(fn: Callable, repeat: int, budget: float) -> tuple[float, float]:
    """Medians over `repeat` batches of the per-call wall time and CPU time (microseconds).

    CPU time (time.process_time, all threads of this process) is the steadier figure on a
    shared machine: it leaves out the time other processes hold the cores.
    """
    number, elapsed = 1, 0.0
    while elapsed < 0.02:  # batches of at least 20 ms
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed < 0.02:
            number *= 2
    number = max(number, int(number * budget / repeat / max(elapsed, 1e-9)))
    walls, cpus = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(number):
            fn()
        walls.append((time.perf_counter() - w0) / number)
        cpus.append((time.process_time() - c0) / number)
    return statistics.median(walls) * 1e6, statistics.median(cpus) * 1e6


def methods(make, n):
    """name -> a zero-argument call of value_and_grad at x (x bound inside), per system."""
    x = onp.random.default_rng(0).random(n)
    f = make(onp)
    compiled = gt.compile(gt.value_and_grad(f))
    out = (onp.empty(()), onp.empty(n))
    eager = gt.value_and_grad(f)
    calls = {"compiled": lambda: compiled(x), "compiled_out": lambda: compiled(x, out=out),
             "eager": lambda: eager(x)}
    try:
        import autograd
        import autograd.numpy as anp

        ag = autograd.value_and_grad(make(anp))
        calls["autograd"] = lambda: ag(x)
    except ImportError:
        pass
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        jf = jax.jit(jax.value_and_grad(make(jnp)))
        xj = jnp.asarray(x)
        calls["jax_jit"] = lambda: jax.block_until_ready(jf(xj))
        calls["jax_jit_numpy_in"] = lambda: jax.block_until_ready(jf(x))
    except ImportError:
        pass
    return x, calls


_PROGRAM_SIZE = """
import json, os, sys, time
os.environ["GRADTAPE_ROLL"] = "0"
import numpy as np
method, sizes = sys.argv[1], [int(k) for k in sys.argv[2:]]
if method == "jax":
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as m
else:
    import gradtape as gt
    m = np
out = []
for k in sizes:
    def f(x, k=k):
        y = x
        for i in range(k // 3):
            y = m.sin(y) * 0.5 + y
        return m.sum(y)

    x = np.linspace(0.0, 1.0, 100)
    wall, cpu = time.perf_counter(), time.process_time()
    if method == "jax":
        jax.jit(jax.value_and_grad(f)).lower(x).compile()
        kernels = None
    else:
        cf = gt.compile(gt.value_and_grad(f), backend="numba")
        cf(x)
        native = cf.lowered(x).native
        kernels = cf.source(x).count("def kernel") if native is not None else 0
    out.append({"ops": k, "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu, "kernels": kernels})
print(json.dumps(out))
"""


def program_size(sizes: list[int]) -> None:
    """Compile time against k (see the module docstring), one fresh process per method."""
    import json
    import subprocess
    import tempfile

    results = {}
    for method, env in (("gradtape", {}), ("jax", {})):
        with tempfile.TemporaryDirectory(prefix="gradtape-compile-") as cache:
            environment = dict(os.environ, GRADTAPE_CACHE_DIR=cache, **env)
            proc = subprocess.run([sys.executable, "-c", _PROGRAM_SIZE, method, *map(str, sizes)],
                                  capture_output=True, text=True, env=environment)
        if proc.returncode != 0:
            print(f"{method}: failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        results[method] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"compile time against program size (load average {os.getloadavg()[0]:.1f}):")
    print(f"  {'k':>6} " + " ".join(f"{m + ' wall/cpu s':>24}" for m in results) + "  kernels")
    for row, k in enumerate(sizes):
        cells = [f"{results[m][row]['wall_s']:11.2f}/{results[m][row]['cpu_s']:<11.2f}"
                 for m in results]
        kernels = results.get("gradtape", [{}] * len(sizes))[row].get("kernels")
        print(f"  {k:>6} " + " ".join(f"{c:>24}" for c in cells) + f"  {kernels}")
    if "gradtape" in results and "jax" in results:
        print("  gradtape/jax (cpu): " + "  ".join(
            f"k={k}: {results['gradtape'][r]['cpu_s'] / results['jax'][r]['cpu_s']:.2f}x"
            for r, k in enumerate(sizes)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, N <= 10^5")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="which median the ratios use (both are printed)")
    parser.add_argument("--program-size", action="store_true",
                        help="compile time against program size (gradtape vs JAX)")
    parser.add_argument("--ops", type=int, nargs="+", default=[10, 100, 1000, 4000])
    args = parser.parse_args()
    if args.program_size:
        program_size(args.ops)
        return
    repeat = 5 if args.quick else args.repeat
    budget = 0.3 if args.quick else 1.5
    pick = 1 if args.clock == "cpu" else 0
    rows = []
    for name, make, grad_ref, sizes in WORKLOADS:
        for n in sizes:
            if args.quick and n > 100_000:
                continue
            x, calls = methods(make, n)
            times = {}
            for method, call in calls.items():
                value, grad = call()  # the first call records / compiles: not timed
                onp.testing.assert_allclose(onp.asarray(grad), grad_ref(x), rtol=1e-9,
                                            err_msg=f"{method} {name} N={n}")
                times[method] = median_us(call, repeat, budget)
            rows.append((name, n, {k: v[pick] for k, v in times.items()}))
            print(f"{name} N={n}: " + "  ".join(
                f"{k} {v[0]:.2f}/{v[1]:.2f}" for k, v in times.items()), flush=True)
    print(f"\nmedians ({args.clock} time), microseconds per value_and_grad call:")
    methods_seen = list(rows[0][2])
    print(f"  {'workload':<14} {'N':>8} " + " ".join(f"{m:>16}" for m in methods_seen))
    for name, n, t in rows:
        print(f"  {name:<14} {n:>8} " + " ".join(f"{t.get(m, float('nan')):16.2f}"
                                                    for m in methods_seen))
    print("\nratios (> 1: compiled is faster):")
    for name, n, t in rows:
        parts = [f"eager/compiled {t['eager'] / t['compiled']:6.1f}x"]
        if "autograd" in t:
            parts.append(f"autograd/compiled {t['autograd'] / t['compiled']:6.1f}x")
        if "jax_jit" in t:
            parts.append(f"jax_jit/compiled {t['jax_jit'] / t['compiled']:5.2f}x")
            parts.append(f"jax_jit/compiled_out {t['jax_jit'] / t['compiled_out']:5.2f}x")
        print(f"  {name:<14} N={n:<8} " + "  ".join(parts))
    print(f"\npython {sys.version.split()[0]}, numpy {onp.__version__}; medians of {repeat} "
          "batches; per method: wall/cpu microseconds above")


if __name__ == "__main__":
    main()
