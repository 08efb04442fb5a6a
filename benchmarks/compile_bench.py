"""compile (numpy backend) against eager grad, HIPS autograd and JAX jit(grad) .

Run: python benchmarks/compile_bench.py [--quick]
Times value_and_grad of the seeds' normal log-density (N = 10 .. 10^6) and EAM model
(N = 100, 1000), single-threaded, and prints medians (microseconds per call) and the
ratios that matter: eager / compiled (goal >= 10 at N = 1000) and JAX / compiled
at N = 10 (goal > 1: less per-call overhead than JAX's jit dispatch). Every method's
result is checked against the closed-form gradient before it is timed.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, N <= 10^5")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="which median the ratios use (both are printed)")
    args = parser.parse_args()
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
