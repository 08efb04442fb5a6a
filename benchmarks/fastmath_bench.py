"""Fused reductions over transcendental functions: Numba with libm, with fastmath, and NumPy.

    python benchmarks/fastmath_bench.py [--repeat 50] [--sizes 1000 100000 1000000]
                                        [--dtype float64|float32]

Each Numba kernel is one loop `s += <element>` compiled with fastmath
{"reassoc", "contract", "nsz", "arcp"} (the reduction may be reordered, so LLVM vectorizes
it): "libm" uses NumPy's functions in the loop (LLVM lowers them to scalar libm calls), "fast"
uses gradtape.compile.numba.fastmath's; "numpy" is the unfused NumPy expression. One thread (the
loops are not parallel; NumPy's elementwise functions are single-threaded). The three are
timed in turn within each repeat, so they share the machine's load; medians in microseconds.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
from numba import njit

from gradtape.compile.numba import fastmath as fm

LOOP_FLAGS = {"reassoc", "contract", "nsz", "arcp"}
FAST_NAMES = {f.__name__: f for f in fm.FAST_FUNCTIONS.values()}

WORKLOADS = [  # (name, libm element, fast element, numpy expression, input range)
    ("sum(exp(x))", "np.exp(v)", "fast_exp(v)", lambda x: np.exp(x).sum(), (-5.0, 5.0)),
    ("sum(log1p(exp(x)))", "np.log1p(np.exp(v))", "fast_log1p(fast_exp(v))",
     lambda x: np.log1p(np.exp(x)).sum(), (-5.0, 5.0)),
    ("  as fast_softplus", "np.log1p(np.exp(v))", "fast_softplus(v)",
     lambda x: np.log1p(np.exp(x)).sum(), (-5.0, 5.0)),
    ("sum(tanh(x))", "np.tanh(v)", "fast_tanh(v)", lambda x: np.tanh(x).sum(), (-3.0, 3.0)),
]


def fused_sum(element: str):
    """An @njit loop summing `element` (an expression in v = x[i]) over x."""
    source = (
        "def total(x):\n"
        "    s = x.dtype.type(0)\n"
        "    for i in range(x.size):\n"
        "        v = x[i]\n"
        f"        s += {element}\n"
        "    return s\n"
    )
    namespace = {"np": np, **FAST_NAMES}
    exec(source, namespace)
    return njit(fastmath=LOOP_FLAGS)(namespace["total"])


def medians_us(functions, x, repeat: int) -> list[float]:
    """Median time per call of each function, timed in turn within every repeat."""
    number = max(1, int(2e4 // x.size))
    samples = [[] for _ in functions]
    for _ in range(repeat):
        for f, times in zip(functions, samples):
            times.append(timeit.timeit(lambda f=f: f(x), number=number) / number)
    return [float(np.median(t)) * 1e6 for t in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000, 1_000_000])
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{args.dtype}, medians of {args.repeat}")
    print(f"{'workload':22}{'N':>9}{'libm us':>10}{'fast us':>10}{'numpy us':>10}"
          f"{'libm/fast':>11}{'numpy/fast':>11}{'rel diff':>10}")
    for name, libm_element, fast_element, numpy_expression, (lo, hi) in WORKLOADS:
        libm, fast = fused_sum(libm_element), fused_sum(fast_element)
        for n in args.sizes:
            x = rng.uniform(lo, hi, n).astype(args.dtype)
            expected = float(numpy_expression(x.astype(np.longdouble)))
            diff = abs(float(fast(x)) - expected) / abs(expected)  # also compiles
            libm(x)
            t_libm, t_fast, t_numpy = medians_us([libm, fast, numpy_expression], x, args.repeat)
            print(f"{name:22}{n:>9}{t_libm:>10.1f}{t_fast:>10.1f}{t_numpy:>10.1f}"
                  f"{t_libm / t_fast:>11.2f}{t_numpy / t_fast:>11.2f}{diff:>10.1e}")


if __name__ == "__main__":
    main()
