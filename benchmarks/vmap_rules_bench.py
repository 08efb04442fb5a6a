"""vmap with batching rules against vmap running each primitive once per member.

Run: python benchmarks/vmap_rules_bench.py [members]
For each workload, the same batched function twice: with the primitives' batching rules (one
call of each primitive on the whole batch), and with the rules of the primitives the workload
is about switched off (the per-member fallback every primitive without a rule gets: the
primitive once per member, the results stacked). Prints medians in milliseconds of an eager
call (traced on every call) and of a compiled call (numpy backend, replayed), and the ratio
loop / rules. Every result is checked against the function applied to each member alone.
Single-threaded BLAS, float64.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import contextlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import timeit  # noqa: E402

import numpy as np  # noqa: E402
import scipy.linalg as sl  # noqa: E402

import gradtape as gt  # noqa: E402
from gradtape.core.primitive import REGISTRY  # noqa: E402

RNG = np.random.default_rng(0)


def logpdf(mu, cov, x):
    """A multivariate normal's log-density through SciPy's Cholesky factor and solve."""
    factor = sl.cho_factor(cov, lower=True)
    r = x - mu
    half_logdet = np.sum(np.log(np.diag(factor[0])))
    return -0.5 * r @ sl.cho_solve(factor, r) - half_logdet


def smoothed_ranks(x):
    """Sorting and searching: each value's place among the sorted values, and a moving sum."""
    order = np.argsort(x)
    place = np.searchsorted(np.sort(x), x + 0.1)
    return np.sum(x[order] * np.convolve(x, np.ones(5), "same")) + np.sum(place)


def spectrum(x):
    """A one-axis FFT and its inverse around a padding."""
    padded = np.pad(x, (3, 3))
    return np.sum(np.abs(np.fft.rfft(padded)) ** 2) + np.sum(np.fft.irfft(np.fft.rfft(x)))


def _spd(n: int) -> np.ndarray:
    a = RNG.normal(size=(n, n))
    return a @ a.T + n * np.eye(n)


def workloads(members: int) -> list:
    """(name, function of one member, batched arguments, primitives it is about)."""
    n = 5
    covs = np.stack([_spd(n) for _ in range(members)])
    mus, xs = RNG.normal(size=(members, n)), RNG.normal(size=(members, n))
    signals = RNG.normal(size=(members, 64))
    return [
        (
            "vmap(grad(logpdf)) in mu and cov, cho_factor/cho_solve",
            gt.grad(logpdf, argnums=(0, 1)),
            (mus, covs, xs),
            ("cho_factors", "cho_solve", "pos_solve"),
        ),
        (
            "vmap(logpdf), cho_factor/cho_solve",
            logpdf,
            (mus, covs, xs),
            ("cho_factors", "cho_solve", "pos_solve"),
        ),
        (
            "vmap(grad(argsort, searchsorted, convolve))",
            gt.grad(smoothed_ranks),
            (signals,),
            ("argsort", "searchsorted", "convolution", "dyn_getitem", "getitem"),
        ),
        (
            "vmap(grad(pad, rfft, irfft))",
            gt.grad(spectrum),
            (signals,),
            ("pad", "fft"),
        ),
    ]


@contextlib.contextmanager
def per_member(names):
    """The workload's primitives without their batching rules (run once per member)."""
    saved = {n: REGISTRY[n].batch for n in names}
    try:
        for n in names:
            REGISTRY[n].batch = None
        yield
    finally:
        for n, rule in saved.items():
            REGISTRY[n].batch = rule


def _median_ms(call, repeat: int) -> float:
    return 1e3 * statistics.median(timeit.repeat(call, number=1, repeat=repeat))


def _each_member(member_fn, args) -> tuple:
    """The function applied to each member alone, the results stacked (vmap's definition)."""
    outs = [member_fn(*(a[i] for a in args)) for i in range(args[0].shape[0])]
    if isinstance(outs[0], tuple):
        return tuple(np.stack([o[k] for o in outs]) for k in range(len(outs[0])))
    return (np.stack(outs),)


def _check(got, want: tuple) -> None:
    for g, w in zip(got if isinstance(got, tuple) else (got,), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)


# two wrappers of different code, so that `compile` remembers each program on its own
def _program_with_rules(fn):
    return lambda *a: fn(*a)


def _program_per_member(fn):
    return lambda *a: fn(*a)


def measure(member_fn, args, names, repeat: int) -> tuple:
    fn = gt.vmap(member_fn)
    want = _each_member(member_fn, args)
    compiled_rules = gt.compile(_program_with_rules(fn), backend="numpy")
    _check(fn(*args), want)
    _check(compiled_rules(*args), want)
    eager_rules = _median_ms(lambda: fn(*args), repeat)
    compiled_rules_ms = _median_ms(lambda: compiled_rules(*args), repeat * 5)
    with per_member(names):
        _check(fn(*args), want)
        eager_loop = _median_ms(lambda: fn(*args), repeat)
        compiled_loop = gt.compile(_program_per_member(fn), backend="numpy")
        _check(compiled_loop(*args), want)
        compiled_loop_ms = _median_ms(lambda: compiled_loop(*args), repeat * 5)
    return eager_loop, eager_rules, compiled_loop_ms, compiled_rules_ms


def main() -> None:
    members = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print(f"{members} members; medians in ms; loop: the primitives once per member")
    head = f"{'workload':58} {'eager loop':>10} {'rules':>8} {'x':>6}"
    print(head + f" {'compiled loop':>14} {'rules':>8} {'x':>6}")
    for name, fn, args, names in workloads(members):
        el, er, cl, cr = measure(fn, args, names, repeat=7)
        print(f"{name:58} {el:10.2f} {er:8.2f} {el / er:6.1f} {cl:14.3f} {cr:8.3f} {cl / cr:6.1f}")
    with open("/proc/loadavg") as f:
        print("load average:", " ".join(f.read().split()[:3]))


if __name__ == "__main__":
    main()
