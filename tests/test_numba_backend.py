"""The numba backend: fused native kernels agree with eager evaluation and the numpy backend.

References are independent of the backend under test: closed-form gradients, central
differences (conftest), and eager gradtape / the numpy backend (which run NumPy's own
functions). Native results differ from NumPy's by rounding only (polynomial exp/log, and the
order of summation), so they are compared with tolerances of a few ulps per operation.
Compiled kernels are shared by source text and cached on disk, so tests reuse them.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import textwrap
import tracemalloc
import warnings

import numpy as np
import pytest
from conftest import central_difference_grad, disagreements_across_threads
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba import cache, fusion, notices
from gradtape.compile.numba import codegen as numba_codegen
from gradtape.compile.numba.backend import NativeFallbackWarning, lowered

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed"),
]

RNG = np.random.default_rng(20260707)
LOG_2PI = math.log(2 * math.pi)
MU = RNG.normal(2.0, 1.0, 64)
DESIGN = RNG.normal(size=(40, 3))
LABELS = (RNG.random(40) < 0.5).astype(np.float64)


# --- the seeds' workloads (module level: pickling uses them) ----------------------------------
def normal_logpdf(x):
    return np.sum(-0.5 * ((x - MU[: x.size]) / 1.5) ** 2 - np.log(1.5) - 0.5 * LOG_2PI)


def eam(x):
    rho = np.sum(np.exp(-3.0 * (x + 1.0)))
    return rho**2 + rho**3 + 0.25 * rho**4


def sum_exp(x):
    return np.sum(np.exp(x))


def logistic_regression(w):
    z = DESIGN @ w
    return np.sum(np.logaddexp(0.0, z) - LABELS * z)


def branching(x):
    s = np.sum(x)
    return s**3 if s > 1 else s**2


def _expit(z):
    return 1.0 / (1.0 + np.exp(-z))


CLOSED_FORMS = {
    normal_logpdf: lambda x: -(x - MU[: x.size]) / 1.5**2,
    eam: lambda x: (
        -3 * np.exp(-3 * (x + 1)) * (2 * (r := np.sum(np.exp(-3 * (x + 1)))) + 3 * r**2 + r**3)
    ),
    sum_exp: np.exp,
    logistic_regression: lambda w: DESIGN.T @ (_expit(DESIGN @ w) - LABELS),
    branching: lambda x: np.full_like(x, 3 * np.sum(x) ** 2 if np.sum(x) > 1 else 2 * np.sum(x)),
}


def close(actual, expected, rtol=1e-12, atol_scale=1e-13):
    """Native and NumPy results agree to a few ulps (relative to the result's scale)."""
    a_leaves, a_tree = gt.core.pytree.tree_flatten(actual)
    e_leaves, e_tree = gt.core.pytree.tree_flatten(expected)
    assert a_tree == e_tree
    for a, e in zip(a_leaves, e_leaves):
        assert np.shape(a) == np.shape(e)
        assert np.asarray(a).dtype == np.asarray(e).dtype
        scale = max(1.0, float(np.max(np.abs(e), initial=0.0)))
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol_scale * scale)


def loops(source: str) -> int:
    """The number of fused loops in a kernel's source."""
    return sum(1 for line in source.splitlines() if line.strip().startswith("for i in range("))


@pytest.mark.parametrize("f", list(CLOSED_FORMS), ids=lambda f: f.__name__)
def test_seed_workloads_against_closed_forms_and_numpy_backend(f):
    native = gt.compile(gt.value_and_grad(f), backend="numba")
    reference = gt.compile(gt.value_and_grad(f), backend="numpy")
    sizes = (3,) if f is logistic_regression else (7, 50, 64)
    for n in sizes:
        for _ in range(2):
            x = RNG.normal(size=n) * 0.5 + (0.5 if f is branching else 0.0)
            value, grad = native(x)
            close((value, grad), reference(x))
            np.testing.assert_allclose(grad, CLOSED_FORMS[f](x), rtol=1e-10, atol=1e-12)
            assert type(value) is np.float64 and grad.dtype == np.float64
            assert lowered(native, x).tier == "native"


def test_fusion_of_the_seed_workloads():
    """sum(exp), the normal log-density and eam become one or two loops, each exp once."""
    x = RNG.random(20)
    expected = {sum_exp: (1, 1), normal_logpdf: (1, 0), eam: (2, 1)}
    for f, (n_loops, n_exp) in expected.items():
        source = lowered(gt.compile(gt.value_and_grad(f), backend="numba"), x).generated.module
        assert loops(source) == n_loops, source
        assert source.count("fast_exp(") == n_exp, source
    # eam: the stored exp is the gradient array itself, scaled in place by the second loop
    source = lowered(gt.compile(gt.value_and_grad(eam), backend="numba"), x).generated.module
    assert "np.empty(" not in source


def test_a_new_length_reuses_the_compiled_kernel():
    cf = gt.compile(gt.value_and_grad(eam), backend="numba")
    first = lowered(cf, RNG.random(1234))
    second = lowered(cf, RNG.random(4321))
    assert first is not second  # one variant per signature
    assert first.native is second.native  # ... and one kernel for both (same source)
    assert "1234" not in first.generated.module and "4321" not in second.generated.module


# --- random programs: eager, numpy backend and numba backend agree ----------------------------
SHAPES = [(6,), (3, 4), (2, 3, 2)]


def _unary():
    return [
        np.sin,
        np.tanh,
        lambda a: np.exp(-a * a),
        lambda a: np.log1p(a * a),
        lambda a: a / (1.0 + np.abs(a)),
        lambda a: np.sqrt(1.0 + a * a),
        np.square,
        lambda a: -a,
        lambda a: np.logaddexp(a, 0.3 * a),
        lambda a: np.exp(np.tanh(a)),
        lambda a: a * np.sum(a) * 0.1,
        lambda a: a - np.max(a),
        lambda a: a / (1.0 + np.sum(a * a, axis=-1, keepdims=True)),
        lambda a: a * np.mean(np.cos(a)),
        lambda a: np.where(a > 0.1, a, 0.5 * a),
        lambda a: np.maximum(a, -0.2) + np.minimum(a, 0.3),
    ]


def _binary(weights):
    return [
        np.add,
        np.subtract,
        np.multiply,
        lambda a, b: a / (2.0 + np.cos(b)),
        lambda a, b: np.where(a > b, a, b * 0.5),
        lambda a, b: a * weights,
        lambda a, b: a + b[..., :1],
        lambda a, b: a * np.sum(b) + np.mean(a) * b,
        lambda a, b: np.reshape(np.reshape(a, (-1,))[::-1], a.shape) * b,
        lambda a, b: a + (b**3 if np.sum(b) > 0 else -b),
    ]


def _random_program(steps, shape):
    weights = np.linspace(0.5, 1.5, shape[-1])
    unary, binary = _unary(), _binary(weights)

    def f(x):
        values = [x, np.cos(x)]
        for u, b, pick, use_binary in steps:
            a = values[pick % len(values)]
            c = values[(pick // 2) % len(values)]
            values.append(binary[b % len(binary)](a, c) if use_binary else unary[u % len(unary)](a))
        return np.sum(values[-1] * values[-2]) + np.sum(values[len(values) // 2] ** 2)

    return f


@settings(max_examples=18, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.integers(0, 15), st.integers(0, 9), st.integers(0, 30), st.booleans()),
        min_size=1,
        max_size=7,
    ),
    st.sampled_from(SHAPES),
)
def test_random_programs_agree(steps, shape):
    f = _random_program(steps, shape)
    eager = gt.value_and_grad(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NativeFallbackWarning)
        native = gt.compile(eager, backend="numba")
        reference = gt.compile(eager, backend="numpy")
        for seed in range(3):
            x = np.random.default_rng(seed).normal(size=shape) * 0.7
            with np.errstate(all="ignore"):
                expected = eager(x)
                close(native(x), expected, rtol=1e-9, atol_scale=1e-10)
                close(reference(x), expected, rtol=0, atol_scale=0)


def test_random_program_against_finite_differences():
    steps = [(0, 3, 1, True), (9, 0, 2, False), (13, 7, 4, True), (5, 5, 3, True)]
    f = _random_program(steps, (3, 4))
    cf = gt.compile(gt.grad(f), backend="numba")
    x = RNG.normal(size=(3, 4)) * 0.7
    np.testing.assert_allclose(cf(x), central_difference_grad(f, (x,), 0), rtol=1e-6, atol=1e-7)
    assert lowered(cf, x).tier == "native"


def test_indexing_reductions_and_linear_algebra():
    idx = np.array([0, 2, 2, 1])
    w = RNG.normal(size=(4, 3))

    def f(x):
        m = np.reshape(x, (3, 4))
        y = np.sum(np.tanh(w @ m) ** 2, axis=0)  # matmul, partial reduction
        z = np.concatenate([x[idx], x[::3] ** 2])  # gather, strided slice, concatenate
        acc = np.zeros_like(x)
        acc[1:5] = z[:4] * 2.0  # functional write
        np.add.at(acc, idx, x[:4])  # scatter-add with repeats
        return np.sum(y) + np.sum(acc * x) + np.prod(1 + 0.1 * x[:5]) + np.max(m.T @ x[:3])

    native = gt.compile(gt.value_and_grad(f), backend="numba")
    for _ in range(3):
        x = RNG.normal(size=12)
        close(native(x), gt.value_and_grad(f)(x), rtol=1e-11)
        np.testing.assert_allclose(
            native(x)[1], central_difference_grad(f, (x,), 0), rtol=1e-6, atol=1e-7
        )
    plan = lowered(native, x).generated.plan
    assert all(s.kind != fusion.PYTHON for s in plan.stages)  # every op is native


# --- matrix products: row products and column accumulations in loops, explicit loops --------
def regression(w, design, labels):
    """A logistic loss with the design matrix as an argument (its gradient too)."""
    z = design @ w
    return np.sum(np.logaddexp(0.0, z) - labels * z)


def regression_parts(w, design, labels):
    """Row products, a transposed product of a loop value, strided and transposed matrices."""
    z = design @ w
    r = np.tanh(z) - labels
    cols = design[:, ::2]  # a strided view read by a row product
    return (
        np.sum(r * r)
        + np.sum(design.T @ r)
        + np.sum(np.cos(cols @ w[::2]))
        + np.sum((labels @ design) * w)
    )


@pytest.mark.parametrize("n, k", [(40, 3), (257, 8), (1000, 1), (2, 5), (1, 4)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matrix_products_agree_with_the_numpy_backend(n, k, dtype):
    rng = np.random.default_rng([n, k])
    w = rng.normal(size=k).astype(dtype)
    design = (rng.normal(size=(n, k)) / math.sqrt(k)).astype(dtype)
    labels = (rng.random(n) < 0.5).astype(dtype)
    tol = {"rtol": 1e-11} if dtype == np.float64 else {"rtol": 3e-5, "atol_scale": 3e-5}
    for f in (regression, regression_parts):
        g = gt.value_and_grad(f, argnums=(0, 1))
        native = gt.compile(g, backend="numba")
        reference = gt.compile(g, backend="numpy")
        for args in ((w, design, labels), (w[::-1], np.asfortranarray(design), labels)):
            close(native(*args), reference(*args), **tol)
        assert lowered(native, w, design, labels).tier == "native"
        source = lowered(native, w, design, labels).generated.module
        assert "np.dot(" not in source  # no BLAS: explicit loops
    if n > 1:  # one loop computes X @ w, the loss and accumulates X.T @ r
        source = lowered(
            gt.compile(gt.value_and_grad(regression), backend="numba"), w, design, labels
        ).generated.module
        assert source.count("for i in range(u0, u1):") == 1, source


def test_matrix_products_in_parallel_chunks_are_deterministic():
    design = RNG.normal(size=(50_000, 6)) / 3
    labels = (RNG.random(50_000) < 0.5).astype(np.float64)
    w = RNG.normal(size=6)
    f = gt.value_and_grad(lambda w: regression(w, design, labels))
    expected = gt.compile(f, backend="numba")(w)
    numba_backend.set_num_threads(2)
    try:
        parallel = gt.compile(f, backend="numba")
        first = parallel(w)
        assert "prange(" in lowered(parallel, w).generated.module
        for _ in range(3):
            again = parallel(w)
            assert again[0] == first[0] and np.array_equal(again[1], first[1])
    finally:
        numba_backend.set_num_threads(1)
    close(first, expected, rtol=1e-12)
    close(first, gt.compile(f, backend="numpy")(w), rtol=1e-11)


def test_a_product_of_a_loop_value_reads_the_matrix_by_rows_unless_it_has_few():
    """M @ tanh(x): accumulated column by column in x's loop for a few rows of M; for many,
    a row product after that loop (columns of a large row-major M are far apart)."""
    for rows, accumulated in ((3, True), (40, False)):
        m = RNG.normal(size=(rows, 40))

        def f(x, m=m):
            return np.sum(np.cos(m @ np.tanh(x)))

        native = gt.compile(gt.value_and_grad(f), backend="numba")
        x = RNG.normal(size=40)
        close(native(x), gt.compile(gt.value_and_grad(f), backend="numpy")(x), rtol=1e-11)
        plan = lowered(native, x).generated.plan
        forward = next(
            ins
            for s in plan.stages
            for ins in s.members
            if ins.prim.name == "matmul"
            and ins.invars[0] is None
            and ins.args[0].shape == (rows, 40)
        )
        assert (forward.outvars[0].id in plan.reductions) == accumulated


def test_matrix_matrix_products_call_blas_only_when_large():
    def f(a, b):
        return np.sum(np.tanh(a @ b))

    for size, blas in ((8, False), (48, True)):
        a, b = RNG.normal(size=(size, size)), RNG.normal(size=(size, size + 1))
        native = gt.compile(gt.value_and_grad(f, argnums=(0, 1)), backend="numba")
        close(native(a, b), gt.value_and_grad(f, argnums=(0, 1))(a, b), rtol=1e-11)
        assert ("np.dot(" in lowered(native, a, b).generated.module) == blas


# --- guards and variants ----------------------------------------------------------------------
def test_guards_select_variants_like_the_numpy_backend():
    cf = gt.compile(gt.value_and_grad(branching), backend="numba")
    low, high = np.array([0.1, 0.2, 0.3]), np.array([1.1, 1.2, 1.3])
    for _ in range(3):
        for x in (low, high):
            value, grad = cf(x)
            close((value, grad), gt.value_and_grad(branching)(x))
    stats = cf.stats
    assert stats["recordings"] == 2 and stats["variants"] == 2 and stats["calls"] == 6
    assert "if not" in lowered(cf, high).generated.module  # the check runs in the kernel


def test_int_guard_loop_count():
    def f(x):
        s = 0.0
        for _ in range(int(x[0])):
            s = s + np.sin(x[1] * s + x[2])
        return s

    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    for count in (3, 5, 3, 0, 5):
        x = np.array([count + 0.5, RNG.random(), RNG.random()])
        close(cf(x), gt.value_and_grad(f)(x))
    assert cf.stats["recordings"] == 3


# --- calling conventions ----------------------------------------------------------------------
def test_out_writes_in_place_without_allocating():
    cf = gt.compile(gt.value_and_grad(eam), backend="numba")
    x = RNG.random(100)
    out = (np.empty(()), np.empty(100))
    assert cf(x, out=out) is out
    close((out[0][()], out[1]), gt.value_and_grad(eam)(x))
    for _ in range(20):
        cf(x, out=out)
    tracemalloc.start()
    try:
        for _ in range(1000):
            cf(x, out=out)
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(1000):
            cf(x, out=out)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after - before < 512, f"{after - before} bytes more after 1000 calls"


def test_non_contiguous_arguments_and_results():
    def f(a):
        return np.sum(np.exp(-a * a) * np.arange(a.shape[-1]))

    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    big = RNG.normal(size=(8, 10))
    for x in (big[::2, ::3], big.T[:4], np.asfortranarray(big[:4, :4])):
        close(cf(x), gt.value_and_grad(f)(x))
    x = np.ascontiguousarray(big[:4, :4])
    grad_out = np.empty((4, 8))[:, ::2]  # a strided result array
    value_out = np.empty(())
    cf(x, out=(value_out, grad_out))
    close((value_out[()], grad_out), gt.value_and_grad(f)(x))


def test_float32_scalars_and_0d_arguments():
    def f(x, scale, shift):
        y = np.exp(x * 0.1 + shift) / (x * x + 1.5)
        return np.sum(np.where(y > 0.7, y, 2.0 * y) - 1e-3 * x**3) * scale

    g = gt.value_and_grad(f, argnums=(0, 1, 2))
    cf = gt.compile(g, backend="numba")
    x32 = RNG.normal(size=9).astype(np.float32)
    value, grads = cf(x32, np.float32(2.0), np.array(0.3, np.float32))
    assert value.dtype == np.float32 and all(gr.dtype == np.float32 for gr in grads)
    close(
        (value, grads),
        g(x32, np.float32(2.0), np.array(0.3, np.float32)),
        rtol=2e-6,
        atol_scale=2e-6,
    )
    x64 = x32.astype(np.float64)
    close(cf(x64, 2.0, np.array(0.3)), g(x64, 2.0, np.array(0.3)))
    assert lowered(cf, x64, 2.0, np.array(0.3)).tier == "native"


def test_0d_input_and_0d_result():
    def newton_sqrt(a):
        x = a
        while np.abs(x * x - a) > 1e-12 * a:
            x = 0.5 * (x + a / x)
        return x

    cf = gt.compile(gt.grad(newton_sqrt), backend="numba")
    reference = gt.compile(gt.grad(newton_sqrt), backend="numpy")
    for a in (2.0, 30.0, 2.5, 30.0):
        g = cf(np.array(a))
        assert type(g) is type(reference(np.array(a))) and np.shape(g) == ()
        np.testing.assert_allclose(g, 0.5 / np.sqrt(a), rtol=1e-10)
    double = gt.compile(lambda x: (x * 2.0, np.sum(x)), backend="numba")
    for arg in (np.array(1.5), np.float64(1.5)):
        close(double(arg), gt.compile(lambda x: (x * 2.0, np.sum(x)), backend="numpy")(arg))


def test_threads_share_a_compiled_function():
    cf = gt.compile(gt.value_and_grad(branching), backend="numba")

    def within_ulps(got, expected):
        try:
            close(got, expected)
        except AssertionError as exc:
            return exc
        return None

    errors = disagreements_across_threads(cf, gt.value_and_grad(branching), within_ulps)
    assert not errors
    assert cf.stats["variants"] == 2


def test_pickle_re_lowers_on_load():
    cf = gt.compile(eam, backend="numba")  # (transformed functions do not pickle by name)
    x = RNG.random(5)
    cf(x)
    loaded = pickle.loads(pickle.dumps(cf))
    assert loaded.stats["calls"] == 0
    close(loaded(x), cf(x))
    assert lowered(loaded, x).tier == "native"


# --- partial and whole fallback ---------------------------------------------------------------
def test_primitive_without_native_code_runs_through_numpy_between_kernels(monkeypatch):
    monkeypatch.setattr(notices, "_warned", set())  # (the note is given once a process)

    def f(x):
        y = np.exp(0.5 * x)
        return np.sum(np.sort(y) * np.arange(x.size)) + np.sum(np.pad(y, (1, 2)) ** 2)

    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    x = RNG.normal(size=7)
    with pytest.warns(NativeFallbackWarning, match="argsort|pad"):
        cf2 = gt.compile(gt.value_and_grad(lambda x: f(x) * 1.0), backend="numba")
        cf2(x)
    close(cf(x), gt.value_and_grad(f)(x))
    np.testing.assert_allclose(cf(x)[1], central_difference_grad(f, (x,), 0), rtol=1e-6)
    low = lowered(cf, x)
    assert low.tier == "native" and len(low.generated.kernels) >= 2


def test_a_kernel_numba_rejects_falls_back_to_the_numpy_backend(monkeypatch):
    original = numba_backend._build_kernels

    def failing(nk):
        raise RuntimeError("simulated typing error")

    monkeypatch.setattr(numba_backend, "_build_kernels", failing)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cf = gt.compile(gt.value_and_grad(lambda x: np.sum(np.sinh(x) * 0.125)), backend="numba")
        x = RNG.random(4)
        close(cf(x), gt.value_and_grad(lambda x: np.sum(np.sinh(x) * 0.125))(x))
    assert any("could not compile" in str(w.message) for w in caught)
    assert lowered(cf, x).tier == "numpy"
    monkeypatch.setattr(numba_backend, "_build_kernels", original)


# --- tiers ------------------------------------------------------------------------------------
def test_auto_runs_numpy_first_and_switches_when_the_kernel_is_ready(tmp_path):
    cache.set_cache_dir(tmp_path)  # a new kernel: the compiler really has work to do
    try:
        offset = float(RNG.random())  # a constant of the source: a kernel no run has built

        def f(x):
            return np.sum(np.tanh(x + offset) ** 2)

        cf = gt.compile(gt.value_and_grad(f))
        x = RNG.normal(size=16)
        first = cf(x)
        low = lowered(cf, x)
        assert low.tier == "numpy"  # the call did not wait for the compiler
        close(first, gt.value_and_grad(f)(x), rtol=0, atol_scale=0)  # numpy tier: same bits
        assert numba_backend.wait_for_kernels(timeout=120)
        assert low.tier == "native"
        close(cf(x), gt.value_and_grad(f)(x))
    finally:
        cache._override.clear()


# --- parallel loops ---------------------------------------------------------------------------
def test_parallel_loops_are_deterministic():
    x = RNG.normal(size=70_000)
    single = gt.compile(gt.value_and_grad(normal_like), backend="numba")
    expected = single(x)
    numba_backend.set_num_threads(2)
    try:
        parallel = gt.compile(gt.value_and_grad(normal_like), backend="numba")
        first = parallel(x)
        assert "prange(" in lowered(parallel, x).generated.module
        close(first, expected, rtol=1e-12)
        for _ in range(5):
            again = parallel(x)
            assert again[0] == first[0] and np.array_equal(again[1], first[1])
    finally:
        numba_backend.set_num_threads(1)


def normal_like(x):
    return np.sum(-0.5 * ((x - 0.3) / 1.7) ** 2 + np.exp(-x * x))


@pytest.mark.parametrize("backend", ["numba", "auto"])
def test_set_num_threads_applies_to_functions_compiled_before(backend):
    x = np.random.default_rng(7).normal(size=70_000)  # summed in two chunks: another last bit
    cf = gt.compile(gt.value_and_grad(normal_like), backend=backend)
    cf(x)
    assert numba_backend.wait_for_kernels(timeout=120)
    serial = cf(x)
    assert "prange(" not in lowered(cf, x).generated.module
    numba_backend.set_num_threads(2)
    try:
        assert numba_backend.wait_for_kernels(timeout=120)
        two = cf(x)  # two chunks: the sum is added in another order
        assert "prange(" in lowered(cf, x).generated.module and lowered(cf, x).tier == "native"
        fresh = gt.compile(gt.value_and_grad(normal_like), backend="numba")(x)
        assert two[0] == fresh[0] and np.array_equal(two[1], fresh[1])
        assert two[0] != serial[0]
        close(two, serial, rtol=1e-12)
    finally:
        numba_backend.set_num_threads(1)
    assert numba_backend.wait_for_kernels(timeout=120)
    again = cf(x)
    assert again[0] == serial[0] and np.array_equal(again[1], serial[1])


# --- the disk cache ---------------------------------------------------------------------------
_CACHE_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import gradtape as gt
    from gradtape.compile.numba.backend import lowered

    def f(x):
        return np.sum(np.log1p(np.exp(0.25 * x)) * 1.2345)

    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    x = np.linspace(-1.0, 1.0, 11)
    start = time.perf_counter()
    value, grad = cf(x)
    low = lowered(cf, x)
    print(json.dumps({"seconds": time.perf_counter() - start, "tier": low.tier,
                      "from_cache": low.native.from_cache, "key": low.native.key,
                      "value": float(value), "grad": grad.tolist()}))
""")


def _run_cache_script(env: dict) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _CACHE_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_kernels_from_the_cache(tmp_path):
    env = {**os.environ, "GRADTAPE_CACHE_DIR": str(tmp_path / "cache")}
    first = _run_cache_script(env)
    assert first["tier"] == "native" and not first["from_cache"]
    kernels = tmp_path / "cache" / "kernels"
    assert (kernels / f"k_{first['key']}.py").is_file()
    assert kernels.stat().st_mode & 0o077 == 0 and (tmp_path / "cache").stat().st_mode & 0o077 == 0
    second = _run_cache_script(env)
    assert second["from_cache"] and second["key"] == first["key"]
    assert second["value"] == first["value"] and second["grad"] == first["grad"]

    # a corrupt module and corrupt Numba cache files are ignored and rebuilt
    (kernels / f"k_{first['key']}.py").write_text("this is not the generated module\n")
    for index in (kernels / "__pycache__").glob("*.nbi"):
        index.write_bytes(b"garbage")
    third = _run_cache_script(env)
    assert third["tier"] == "native" and third["value"] == first["value"]
    fourth = _run_cache_script(env)
    assert fourth["from_cache"]


def test_cache_location_and_switch(tmp_path, monkeypatch):
    monkeypatch.delenv("GRADTAPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "gradtape"
    monkeypatch.setenv("GRADTAPE_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_root() == tmp_path / "mine"
    monkeypatch.setenv("GRADTAPE_CACHE", "0")
    assert cache.cache_root() is None and cache.kernel_dir() is None
    monkeypatch.setenv("GRADTAPE_CACHE", "1")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("GRADTAPE_CACHE_DIR", str(shared))
    with pytest.warns(RuntimeWarning, match="writable by other users"):
        assert cache.kernel_dir() is None


def test_generated_source_is_shape_generic_and_typed():
    def f(x):
        return np.sum(np.exp(x) * MU[: x.size])

    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    a = lowered(cf, RNG.random(40)).generated
    b = lowered(cf, RNG.random(41)).generated
    assert a.key == b.key and a.module == b.module
    assert "float64[::1]" in a.module and "d0 = " in a.module
    assert numba_codegen.STATUS_LAYOUT == 1


def test_empty_arrays_run_natively():
    """Numba gives an empty array strides of 0: still contiguous (it looped on the layout
    retry before)."""

    def f(w, X, y):
        z = X @ w
        return np.sum(np.logaddexp(0.0, z) - y * z)

    compiled = gt.compile(gt.value_and_grad(f), backend="numba")
    w = np.ones(3)
    for rows in (0, 1, 0):
        X, y = np.full((rows, 3), 0.5), np.ones(rows)
        value, grad = compiled(w, X, y)
        expected = gt.value_and_grad(f)(w, X, y)
        assert value == expected[0]
        np.testing.assert_allclose(grad, expected[1], rtol=1e-13)


def test_kernel_texts_name_the_runtime_they_inline():
    """The helpers' digest is in every module (hence in its cache key): Numba's cache would
    otherwise serve a kernel built against older helpers."""
    cf = gt.compile(gt.value_and_grad(sum_exp), backend="numba")
    x = np.linspace(0.0, 1.0, 5)
    cf(x)
    assert numba_codegen._runtime_digest() in lowered(cf, x).native.module_text


def test_the_wrapper_calls_numpys_own_constructors_not_the_dispatchers():
    from gradtape.compile.numba.wrapper import runtime_functions

    functions = runtime_functions()
    for name, numpy_function in [
        ("array", np.array),
        ("asarray", np.asarray),
        ("ascontiguous", np.ascontiguousarray),
        ("empty", np.empty),
    ]:
        bound = functions[name]
        assert not hasattr(bound, "__gradtape_original__")
        assert bound is getattr(numpy_function, "__gradtape_original__", numpy_function)
    assert hasattr(np.array, "__gradtape_original__")  # gradtape patched it: the test means it


@pytest.mark.native
def test_a_concatenation_of_many_pieces_runs_through_numpy_between_kernels():
    # Numba types np.concatenate of a tuple piece by piece, and LLVM's loop strength reduction
    # then grows far faster than the tuple (500 pieces did not compile in 15 minutes)
    from gradtape.compile.numba.lowering import MAX_NATIVE_CONCATENATE

    n = 4 * MAX_NATIVE_CONCATENATE

    def f(x):
        return np.sum(np.concatenate([x[i : i + 1] * (i + 1.0) for i in range(n)]) ** 2)

    x = np.linspace(0.1, 1.0, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NativeFallbackWarning)
        cf = gt.compile(gt.value_and_grad(f), backend="numba")
        value, grad = cf(x)
    expected = gt.value_and_grad(f)(x)
    np.testing.assert_allclose(value, expected[0], rtol=1e-12)
    np.testing.assert_allclose(grad, expected[1], rtol=1e-12)
