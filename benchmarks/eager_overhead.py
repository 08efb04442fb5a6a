"""Eager `grad` overhead per recorded operation, against HIPS autograd.

Run: python benchmarks/eager_overhead.py
Prints medians (microseconds) and the ratio gradtape / autograd, single-threaded; then, per
operation of a chain of `sin` and `* 0.5` at N=10 (the scaling benchmark's chain), gradtape's
and autograd's cost beside two floors measured in the same run: the NumPy calls the forward
and backward passes make, on plain arrays (what any tape-based eager gradient pays), and
NumPy's dispatch to an `__array_ufunc__` override that does nothing (what a traced value pays
before any of gradtape's code runs), and a minimal pure-Python tape (an override that calls the
ufunc and appends to a list, a backward loop of one closure call per entry: what any tape
written in Python pays, before checking anything). The per-operation lines give the median
wall-clock time and the least process CPU time (steadier on a loaded machine).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import statistics  # noqa: E402
import time  # noqa: E402
import timeit  # noqa: E402

import numpy as onp  # noqa: E402

import gradtape as gt  # noqa: E402


def chain(np):
    """50 elementwise operations on a small vector, then a sum."""

    def f(x):
        y = x
        for _ in range(10):
            y = np.sin(y) * 0.9 + np.exp(-y * y) - 0.1 * y
        return np.sum(y)

    return f


def normal_logpdf(np):
    def f(x):
        return np.sum(-0.5 * ((x - 0.3) / 1.7) ** 2 - np.log(1.7) - 0.5 * np.log(2 * np.pi))

    return f


def sum_exp(np):
    """Two operations: the fixed cost of a call, and at large N the NumPy work."""

    def f(x):
        return np.sum(np.exp(x))

    return f


def median_us(fn, repeat: int = 7) -> float:
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return statistics.median(t / number for t in timer.repeat(repeat, number)) * 1e6


def cpu_min_us(fn, repeat: int = 9) -> float:
    """The least process CPU time of a call over `repeat` runs: on a loaded machine, what the
    call itself costs (wall-clock medians there also count the time other processes ran)."""
    timer = timeit.Timer(fn, timer=time.process_time)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat, number)) / number * 1e6


def main() -> None:
    import autograd
    import autograd.numpy as anp

    rows = []
    for name, make, sizes in (
        ("chain50", chain, (10,)),
        ("normal_logpdf", normal_logpdf, (10, 1000, 100_000)),
        ("sum_exp", sum_exp, (10, 1000, 100_000)),
        ("sin_chain100", lambda np: sin_chain(np), (1000, 100_000)),
    ):
        for n in sizes:
            x = onp.random.default_rng(0).random(n)
            g_gt = gt.grad(make(onp))
            g_ag = autograd.grad(make(anp))
            onp.testing.assert_allclose(g_gt(x), g_ag(x), rtol=1e-10)
            t_f = median_us(lambda: make(onp)(x))
            t_gt = median_us(lambda: g_gt(x))
            t_ag = median_us(lambda: g_ag(x))
            rows.append((name, n, t_f, t_gt, t_ag))
    print(f"load average: {os.getloadavg()}")
    print(
        f"{'workload':<14} {'N':>7} {'f (us)':>9} {'gradtape':>9} {'autograd':>9} "
        f"{'gt/autograd':>11} {'gt/f':>6}"
    )
    for name, n, t_f, t_gt, t_ag in rows:
        print(
            f"{name:<14} {n:>7} {t_f:>9.1f} {t_gt:>9.1f} {t_ag:>9.1f} {t_gt / t_ag:>11.2f} "
            f"{t_gt / t_f:>6.1f}"
        )


PER_OP_OPS = 100


def sin_chain(np):
    def f(x):
        y = x
        for _ in range(PER_OP_OPS // 2):
            y = np.sin(y) * 0.5
        return np.sum(y)

    return f


class _Inert:
    """A value whose override answers every ufunc at once (NumPy's dispatch cost alone)."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self

    def __mul__(self, other):
        return onp.multiply(self, other)


def numpy_floor(x):
    """The NumPy calls of the chain's forward and backward passes, on plain arrays."""
    ys = [x]
    for _ in range(PER_OP_OPS // 2):
        ys.append(onp.sin(ys[-1]) * 0.5)
    g = onp.ones_like(x)
    for y in reversed(ys[:-1]):
        g = (g * 0.5) * onp.cos(y)
    return g


class _MinimalTraced:
    """The least a pure-Python tape can do per operation: its override calls the ufunc and
    appends (ufunc, operand values) to a list; no checks, broadcasting, dtypes or constants."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        values = [a.value if type(a) is _MinimalTraced else a for a in inputs]
        _MINIMAL_TAPE.append((ufunc, values))
        return _MinimalTraced(ufunc(*values))

    def __mul__(self, other):
        return onp.multiply(self, other)


_MINIMAL_TAPE: list = []
_MINIMAL_VJPS = {
    onp.sin: lambda g, values: g * onp.cos(values[0]),
    onp.multiply: lambda g, values: g * values[1],
}


def minimal_tape_grad(x):
    """The chain's gradient through `_MinimalTraced`: one closure call per recorded entry."""
    _MINIMAL_TAPE.clear()
    y = _MinimalTraced(x)
    for _ in range(PER_OP_OPS // 2):
        y = onp.sin(y) * 0.5
    g = onp.ones_like(x)
    for ufunc, values in reversed(_MINIMAL_TAPE):
        g = _MINIMAL_VJPS[ufunc](g, values)
    return g


def dispatch_only(inert):
    y = inert
    for _ in range(PER_OP_OPS // 2):
        y = onp.sin(y) * 0.5
    return y


def per_operation() -> None:
    import autograd
    import autograd.numpy as anp

    x = onp.linspace(0.0, 1.0, 10)
    g_gt, g_ag = gt.grad(sin_chain(onp)), autograd.grad(sin_chain(anp))
    onp.testing.assert_allclose(g_gt(x), g_ag(x), rtol=1e-12)
    onp.testing.assert_allclose(g_gt(x), numpy_floor(x), rtol=1e-12)
    onp.testing.assert_allclose(minimal_tape_grad(x), numpy_floor(x), rtol=1e-12)
    inert = _Inert()
    rows = [
        ("gradtape grad", lambda: g_gt(x)),
        ("autograd grad", lambda: g_ag(x)),
        ("NumPy calls of forward + backward (floor)", lambda: numpy_floor(x)),
        ("NumPy dispatch to an override (floor)", lambda: dispatch_only(inert)),
        ("a minimal pure-Python tape (floor)", lambda: minimal_tape_grad(x)),
    ]
    print(f"\nper operation: sin / * 0.5 chain of {PER_OP_OPS} operations, N=10")
    print(f"{'':<44} {'median':>9} {'CPU min':>9}")
    for name, fn in rows:
        wall, cpu = median_us(fn) / PER_OP_OPS, cpu_min_us(fn) / PER_OP_OPS
        print(f"{name:<44} {wall:>6.2f} us {cpu:>6.2f} us")
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
    per_operation()
