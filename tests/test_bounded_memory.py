"""Caches with bounds: compiled functions remembered by (function, transform, options),
signatures per compiled function, numpy-backend buffers, native kernels shared by text (scalar
constants are kernel arguments), and resident memory under many shapes, closures and guard
variants."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile import memo

native = pytest.mark.native
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _loss(x):
    return np.sum(np.sin(x) * x)


# --- compile remembers ---------------------------------------------------------------------
def test_compile_of_a_new_transform_closure_is_the_one_already_built():
    x = np.linspace(0.0, 1.0, 7)
    first = gt.compile(gt.value_and_grad(_loss), backend="numpy")
    first(x)
    again = gt.compile(gt.value_and_grad(_loss), backend="numpy")
    assert again is first
    again(x)
    assert first.stats["recordings"] == 1 and first.stats["replays"] == 1
    # other options, another transform: another compiled function
    assert gt.compile(gt.value_and_grad(_loss), backend="numpy", max_variants=3) is not first
    assert gt.compile(gt.grad(_loss), backend="numpy") is not first
    assert gt.compile(gt.value_and_grad(_loss, argnums=(0,)), backend="numpy") is not first


def test_closures_are_keyed_by_the_values_they_close_over():
    x = np.linspace(0.0, 1.0, 5)

    def make(c):
        return lambda x: np.sum(x * c)

    a = gt.compile(gt.grad(make(2.5)), backend="numpy")
    assert gt.compile(gt.grad(make(2.5)), backend="numpy") is a
    b = gt.compile(gt.grad(make(3.5)), backend="numpy")
    assert b is not a
    np.testing.assert_array_equal(a(x), np.full(5, 2.5))
    np.testing.assert_array_equal(b(x), np.full(5, 3.5))
    # the sign of zero and the type of a number are part of the value
    assert gt.compile(make(0.0), backend="numpy") is not gt.compile(make(-0.0), backend="numpy")
    assert gt.compile(make(1), backend="numpy") is not gt.compile(make(1.0), backend="numpy")


def test_what_may_change_unseen_is_not_remembered():
    """An array, a list or an object the function reads may change in place between two
    compile calls: such functions are compiled afresh each time (no stale replay)."""
    w = np.ones(3)
    f = lambda x: np.sum(x * w)  # noqa: E731
    cf = gt.compile(f, backend="numpy")
    x = np.arange(3.0)
    assert cf(x) == 3.0
    w[:] = 2.0
    fresh = gt.compile(f, backend="numpy")
    assert fresh is not cf and fresh(x) == 6.0

    class Model:
        scale = 1.0

        def loss(self, x):
            return np.sum(x) * self.scale

    m = Model()
    assert gt.compile(m.loss, backend="numpy") is not gt.compile(m.loss, backend="numpy")


SCALE = 2.0


def _reads_a_global(x):
    return np.sum(x) * SCALE


def test_rebinding_a_global_the_function_reads_compiles_again():
    global SCALE
    x = np.ones(4)
    before = gt.compile(_reads_a_global, backend="numpy")
    assert before(x) == 8.0
    SCALE = 3.0
    try:
        after = gt.compile(_reads_a_global, backend="numpy")
        assert after is not before and after(x) == 12.0
    finally:
        SCALE = 2.0
    assert gt.compile(_reads_a_global, backend="numpy") is before


def test_at_most_max_compiled_are_remembered(monkeypatch):
    monkeypatch.setenv("GRADTAPE_MAX_COMPILED", "3")

    def make(c):
        return lambda x: x * c

    built = [gt.compile(make(float(c)), backend="numpy") for c in range(5)]
    assert len(memo._memo) == 3
    assert gt.compile(make(4.0), backend="numpy") is built[4]  # recent: remembered
    assert gt.compile(make(0.0), backend="numpy") is not built[0]  # least recent: dropped


# --- signatures ------------------------------------------------------------------------------
def test_signatures_are_bounded_least_recently_used_first(monkeypatch):
    monkeypatch.setenv("GRADTAPE_MAX_SIGNATURES", "4")
    cf = gt.compile(gt.grad(_loss), backend="numpy")
    keep = np.linspace(0.0, 1.0, 3)
    for n in range(4, 30):
        x = np.linspace(0.0, 1.0, n)
        np.testing.assert_allclose(cf(x), np.sin(x) + x * np.cos(x), rtol=1e-13)
        cf(keep)  # used all along: never the least recent
        assert len(cf._signatures) <= 4
    stats = cf.stats
    assert stats["recordings"] == 27  # keep once, each length once
    assert stats["calls"] == 2 * 26
    assert ((3,), np.dtype(float)) in {k[0] for k in cf._signatures}
    # a dropped signature is recorded again when it comes back, with the right numbers
    x = np.linspace(0.0, 1.0, 4)
    np.testing.assert_allclose(cf(x), np.sin(x) + x * np.cos(x), rtol=1e-13)
    assert cf.stats["recordings"] == 28


def test_numpy_backend_keeps_a_bounded_number_of_buffer_sets(monkeypatch):
    monkeypatch.setenv("GRADTAPE_BUFFER_SETS", "2")
    from gradtape.compile.numpy_backend import NumpyLowered

    cf = gt.compile(gt.grad(lambda x: np.sum(np.exp(x) * x + np.sin(x) * np.cos(x))), "numpy")
    x = np.ones(10)
    cf(x)
    lowered = cf.lowered(x)
    assert isinstance(lowered, NumpyLowered) and lowered.nbuffers > 0
    assert lowered.pool.maxlen == 2 and len(lowered.pool) == 1
    # five calls at once (each takes a set from the pool or allocates one), then returned
    real = lowered.pool.pop()
    held = [real] + [[np.empty_like(b) for b in real] for _ in range(4)]
    for buffers in held:
        lowered.pool.append(buffers)
    assert len(lowered.pool) == 2
    np.testing.assert_allclose(cf(x), cf(x.copy()), rtol=0)


def test_config_reads_the_bounds(monkeypatch):
    from gradtape import config

    for name in ("GRADTAPE_MAX_SIGNATURES", "GRADTAPE_MAX_KERNELS", "GRADTAPE_MAX_COMPILED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GRADTAPE_BUFFER_SETS", raising=False)
    assert config.max_signatures() == 64 and config.max_kernels() == 256
    assert config.max_compiled() == 256 and config.buffer_sets() == 4
    monkeypatch.setenv("GRADTAPE_MAX_SIGNATURES", "0")
    with pytest.warns(RuntimeWarning, match="whole number"):
        assert config.max_signatures() == 64
    monkeypatch.setenv("GRADTAPE_MAX_KERNELS", "12")
    assert config.max_kernels() == 12
    monkeypatch.delenv("GRADTAPE_MAX_NUMBA_MODULES", raising=False)
    assert config.max_numba_modules() == 256
    monkeypatch.setenv("GRADTAPE_MAX_NUMBA_MODULES", "3")
    assert config.max_numba_modules() == 3


# --- one kernel for closures differing in a constant ----------------------------------------
def _program(cf, x):
    _, variant = cf._variant_for((x,), {})
    return variant.program


def test_closures_differing_in_a_constant_share_one_kernel_text():
    """200 closures over another value of a parameter: the numba backend's generated module
    (its key: the kernel's identity and machine code) is the same for all (generated here
    without Numba)."""
    from gradtape.compile.numba import codegen

    x = np.linspace(-1.0, 1.0, 50)
    keys = set()
    for i in range(200):
        mu = 0.0137 * i + 0.1

        def f(x, mu=mu):
            return np.sum((x - mu) ** 2 * 1.3 + np.exp(x * mu))

        cf = gt.compile(gt.value_and_grad(f), backend="numpy")
        keys.add(codegen.generate(_program(cf, x), 1).key)
    assert len(keys) == 1


def test_small_whole_constants_stay_literals():
    from gradtape.compile.numba import codegen

    x = np.linspace(-1.0, 1.0, 50)
    cf = gt.compile(gt.grad(lambda x: np.sum(x**3 * 2.0 - x * 0.5)), backend="numpy")
    module = codegen.generate(_program(cf, x), 1).module
    assert "c0s" not in module and "2.0" in module


@native
def test_closures_differing_in_a_constant_run_one_native_kernel():
    from gradtape.compile.numba import backend as nb

    x = np.linspace(-1.0, 1.0, 300)
    native_keys = set()
    for i in range(12):
        mu, s = 0.0311 * i - 0.2, 1.05 + 0.173 * i  # (no small whole number: those are baked)

        def f(x, mu=mu, s=s):
            return np.sum(np.exp(-((x - mu) ** 2) * s))

        cf = gt.compile(gt.grad(f), backend="numba")
        expected = -2.0 * s * (x - mu) * np.exp(-((x - mu) ** 2) * s)
        np.testing.assert_allclose(cf(x), expected, rtol=1e-12, atol=1e-15)
        lowered = nb.lowered(cf, x)
        assert lowered.tier == "native"
        native_keys.add(lowered.native.key)
    assert len(native_keys) == 1


@native
def test_kernel_registry_is_bounded(monkeypatch):
    from gradtape.compile.numba import backend as nb

    monkeypatch.setenv("GRADTAPE_MAX_KERNELS", "2")
    x = np.linspace(0.1, 1.0, 40)
    fs = [np.sin, np.cos, np.tanh, np.exp]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fn in fs:
            cf = gt.compile(gt.grad(lambda x, fn=fn: np.sum(fn(x) * x)), backend="auto")
            cf(x)
    assert len(nb._REGISTRY) <= 2
    assert gt.wait_for_native(120)


@native
def test_dropped_kernels_leave_sys_modules(tmp_path):
    """Kernels dropped from the registry and no longer used are not kept imported (their
    module held its functions and Numba's dispatchers): 6 distinct programs with room for 2
    leave at most 2 kernel modules (all 6 stayed before)."""
    script = """
    import gc, sys, warnings
    import numpy as np
    import gradtape as gt

    warnings.simplefilter("ignore")
    OPS = [np.sin, np.cos, np.tanh, np.exp, np.arctan, np.log1p]

    def program(i):
        ops = [OPS[i % 6], OPS[(i // 6) % 6]]

        def f(x):
            y = x
            for op in ops:
                y = op(y) * 0.5 + y
            return np.sum(y)

        return f

    x = np.linspace(0.1, 0.9, 20)
    for i in range(6):
        np.testing.assert_allclose(
            gt.compile(gt.grad(program(i + 7)), backend="numba")(x), gt.grad(program(i + 7))(x)
        )
    gc.collect()
    print("modules", sum(1 for m in sys.modules if m.startswith("gradtape_kernel_")))
    """
    env = dict(
        os.environ,
        PYTHONPATH=SRC,
        GRADTAPE_CACHE_DIR=str(tmp_path / "cache"),
        GRADTAPE_MAX_KERNELS="2",
        GRADTAPE_MAX_COMPILED="2",
    )
    env.pop("GRADTAPE_NUMBA", None)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split("modules")[1]) <= 2, proc.stdout


# --- resident memory ---------------------------------------------------------------------------
RESOURCE_BOUND_MB = 120  # documented in the guide ("Performance and memory")


@pytest.mark.parametrize("backend", ["numpy", pytest.param("auto", marks=native)])
def test_resident_memory_stays_bounded(tmp_path, backend):
    """10^4 calls over 10^3 shapes, 10^3 closures and 10^3 guard variants: resident memory
    grows by at most RESOURCE_BOUND_MB (after a warm-up that loads what every run needs)."""
    script = f"""
    import resource, warnings
    import numpy as np
    import gradtape as gt
    warnings.simplefilter("ignore")

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20

    def loss(x):
        return np.sum(np.sin(x) * x + np.exp(-x * x))

    def branchy(x, k):
        return np.sum(x * k) if x[0] > k else np.sum(np.cos(x) * k)

    def run(count, start):
        shaped = gt.compile(gt.value_and_grad(loss), backend={backend!r})
        variants = gt.compile(gt.grad(branchy), backend={backend!r}, static_argnums=(1,))
        for i in range(start, start + count):
            x = np.linspace(0.0, 1.0, 16 + i % 1000)
            shaped(x)                                   # 10^3 shapes
            c = 0.001 * i

            def closure(x, c=c):
                return np.sum(np.tanh(x) * c)

            gt.compile(gt.grad(closure), backend={backend!r})(x[:16])  # 10^3 closures
            variants(x[:8], i % 1000)                   # 10^3 guard variants (static)
            for _ in range(7):
                shaped(x)

    run(300, 0)
    gt.wait_for_native(300)
    base = rss_mb()
    run(1000, 300)
    gt.wait_for_native(300)
    print("grew", rss_mb() - base)
    """
    env = dict(os.environ, PYTHONPATH=SRC, GRADTAPE_CACHE_DIR=str(tmp_path / "cache"))
    if backend == "numpy":
        env["GRADTAPE_NUMBA"] = "0"
    else:
        env.pop("GRADTAPE_NUMBA", None)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    grew = float(proc.stdout.split("grew")[1])
    assert grew < RESOURCE_BOUND_MB, proc.stdout


@native
def test_modules_numba_builds_are_bounded(monkeypatch):
    """Numba never frees a module's machine code: beyond GRADTAPE_MAX_NUMBA_MODULES distinct
    modules a new one runs on the numpy backend (right numbers, a warning naming the setting);
    one already built is still served."""
    from gradtape.compile.numba import backend as nb

    monkeypatch.setenv("GRADTAPE_LLVM", "0")  # every module to Numba
    monkeypatch.setattr(nb, "_numba_modules", set())
    monkeypatch.setenv("GRADTAPE_MAX_NUMBA_MODULES", "1")
    x = np.linspace(0.1, 1.0, 40)

    def first(x):
        return np.sum(np.sin(x) * x**3)

    def second(x):
        return np.sum(np.tanh(x) * np.exp(-x))

    gt.compile(gt.grad(first), backend="numba")(x)
    assert len(nb._numba_modules) == 1
    with pytest.warns(gt.NativeFallbackWarning, match="GRADTAPE_MAX_NUMBA_MODULES"):
        g = gt.compile(gt.grad(second), backend="numba")(x)
    np.testing.assert_allclose(g, gt.grad(second)(x), rtol=1e-12)
    assert len(nb._numba_modules) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", gt.NativeFallbackWarning)
        gt.compile(gt.grad(first), backend="numba")(x * 2)  # the module already built
