"""Faults injected into the runtime: Numba failing midway through a compile, cache files
damaged between processes, a cache write that fails (a full disk), a spawned child loading
the cache. Each case gives the right numbers or a clear error, and the process stays usable.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba import cache

pytestmark = pytest.mark.native

SRC = str(Path(gt.__file__).resolve().parent.parent)


def energy(x):
    return np.sum(np.log1p(x**2) * np.cos(x))


def energy_grad(x):
    return 2 * x / (1 + x**2) * np.cos(x) - np.log1p(x**2) * np.sin(x)


def _spawned_value_and_grad(args):
    cache_dir, x = args
    os.environ["GRADTAPE_CACHE_DIR"] = cache_dir
    f = gt.compile(gt.value_and_grad(energy), backend="numba")
    value, grad = f(x)
    return value, grad, f.lowered(x).native.from_cache


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    numba_backend.wait_for_kernels(300)
    monkeypatch.setattr(cache, "_override", [tmp_path / "cache"])
    monkeypatch.setattr(cache, "_warned", set())
    monkeypatch.setattr(
        numba_backend, "_REGISTRY", type(numba_backend._REGISTRY)()
    )  # kernels of this test are its own
    return tmp_path / "cache"


def fresh_function(scale: float):
    """A function whose kernels no earlier test compiled (the constant changes the text)."""

    def f(x):
        return np.sum(np.tanh(x) * x) * scale

    def exact(x):
        return (x * (1 - np.tanh(x) ** 2) + np.tanh(x)) * scale

    return f, exact


def test_an_exception_inside_numba_midway_leaves_the_right_numbers(private_cache, monkeypatch):
    monkeypatch.setenv("GRADTAPE_LLVM", "0")  # Numba's path (not the llvmlite generator)
    from gradtape.compile.numba import numba_cache

    f, exact = fresh_function(1.25)
    x = np.linspace(-1.0, 1.0, 9)
    real_jit = numba_cache._jit_namespace
    calls = []

    def failing_namespace(numba, path):
        namespace = real_jit(numba, path)
        njit = namespace.njit

        def broken_njit(**options):
            decorate = njit(**options)

            def wrapped(function):
                dispatcher = decorate(function)

                def compile_then_fail(signature):
                    calls.append(signature)
                    raise RuntimeError("LLVM failed midway (injected)")

                dispatcher.compile = compile_then_fail
                return dispatcher

            return wrapped

        namespace.njit = broken_njit
        return namespace

    monkeypatch.setattr(numba_cache, "_jit_namespace", failing_namespace)
    compiled = gt.compile(gt.grad(f), backend="numba")
    with pytest.warns(numba_backend.NativeFallbackWarning, match="injected"):
        got = compiled(x)
    np.testing.assert_allclose(got, exact(x), rtol=1e-12)
    assert calls and compiled.lowered(x).tier == "numpy"
    # the process stays usable: with Numba working again, a new function compiles natively
    monkeypatch.setattr(numba_cache, "_jit_namespace", real_jit)

    def g(x):  # (another program: kernels that differ only in a constant are shared)
        return np.sum(np.sinh(x) * x)

    compiled2 = gt.compile(gt.grad(g), backend="numba")
    np.testing.assert_allclose(compiled2(x), np.cosh(x) * x + np.sinh(x), rtol=1e-12)
    assert compiled2.lowered(x).tier == "native"


def test_a_full_disk_while_writing_the_module_compiles_in_memory(private_cache, monkeypatch):
    f, exact = fresh_function(2.25)
    x = np.linspace(-1.0, 1.0, 9)

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache, "write_atomically", disk_full)
    compiled = gt.compile(gt.grad(f), backend="numba")
    with pytest.warns(RuntimeWarning, match="No space left.*compiled in memory"):
        got = compiled(x)
    np.testing.assert_allclose(got, exact(x), rtol=1e-12)
    assert compiled.lowered(x).tier == "native"
    assert not list((private_cache / "kernels").glob("k_*.py"))


def test_a_full_disk_while_numba_writes_its_cache_keeps_the_kernel(private_cache, monkeypatch):
    monkeypatch.setenv("GRADTAPE_LLVM", "0")  # Numba's path (not the llvmlite generator)
    from numba.core import caching

    f, exact = fresh_function(3.25)
    x = np.linspace(-1.0, 1.0, 9)

    def disk_full(self, filepath):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(caching.IndexDataCacheFile, "_open_for_write", disk_full)
    compiled = gt.compile(gt.value_and_grad(f), backend="numba")
    with pytest.warns(RuntimeWarning, match="writing to the kernel cache failed"):
        value, got = compiled(x)
    np.testing.assert_allclose(got, exact(x), rtol=1e-12)
    np.testing.assert_allclose(value, f(x), rtol=1e-12)
    assert compiled.lowered(x).tier == "native"
    assert not list((private_cache / "kernels" / "__pycache__").glob("*.nbc"))


CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import gradtape as gt
    from gradtape.compile.numba import cache
    def energy(x):
        return np.sum(np.log1p(x ** 2) * np.cos(x))
    f = gt.compile(gt.value_and_grad(energy), backend="numba")
    x = np.linspace(-2.0, 2.0, 11)
    value, grad = f(x)
    exact = 2 * x / (1 + x ** 2) * np.cos(x) - np.log1p(x ** 2) * np.sin(x)
    print(json.dumps({"error": float(np.abs(grad - exact).max()),
                      "from_cache": bool(f.lowered(x).native.from_cache),
                      "corrupt": len(getattr(cache, "corrupt_files", ()))}))
    """
)


def run_child(cache_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADTAPE_", "NUMBA_"))}
    env.update(PYTHONPATH=SRC, GRADTAPE_CACHE_DIR=str(cache_dir))
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]  # (a SIGSEGV would show here)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cache_files_damaged_between_processes_in_every_way(tmp_path):
    assert run_child(tmp_path)["error"] < 1e-12
    pycache = tmp_path / "kernels" / "__pycache__"
    originals = {p: p.read_bytes() for p in pycache.iterdir()}
    module = next((tmp_path / "kernels").glob("k_*.py"))
    damages = {
        "every file cut in half": lambda p, raw: raw[: len(raw) // 2],
        "every file empty": lambda p, raw: b"",
        "random bytes": lambda p, raw: bytes(np.random.default_rng(0).integers(0, 256, len(raw))),
        "one byte flipped": lambda p, raw: raw[:-7] + bytes([raw[-7] ^ 1]) + raw[-6:],
        "an unchecksummed pickle": lambda p, raw: raw[len(cache.CHECKSUM_MAGIC) + 32 :],
    }
    for name, damage in damages.items():
        for path, raw in originals.items():
            path.write_bytes(damage(path, raw))
        result = run_child(tmp_path)
        assert result["error"] < 1e-12, name
        assert not result["from_cache"] and result["corrupt"] >= 1, name
    # the module's source itself truncated: rewritten with the text gradtape generates, whose
    # hash is what Numba's (intact) files were stamped with: they load
    text = module.read_text()
    module.write_text(text[:50])
    result = run_child(tmp_path)
    assert result["error"] < 1e-12 and result["from_cache"] and result["corrupt"] == 0
    assert module.read_text() == text


def test_spawned_children_load_the_kernels_from_the_cache(tmp_path):
    assert run_child(tmp_path)["from_cache"] is False
    xs = [np.linspace(-1.0, 1.0, 11) * k for k in (1.0, 2.0)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        results = pool.map(_spawned_value_and_grad, [(str(tmp_path), x) for x in xs])
    for x, (value, grad, from_cache) in zip(xs, results):
        np.testing.assert_allclose(grad, energy_grad(x), rtol=1e-12)
        np.testing.assert_allclose(value, energy(x), rtol=1e-12)
        assert from_cache


def test_a_pickled_compiled_function_reloads_its_kernels_in_a_spawned_child(tmp_path):
    run_child(tmp_path)  # the kernels of energy's value_and_grad are on disk
    compiled = gt.compile(gt.value_and_grad(energy), backend="numba")
    x = np.linspace(-2.0, 2.0, 11)
    context = multiprocessing.get_context("spawn")
    env_before = os.environ.get("GRADTAPE_CACHE_DIR")
    os.environ["GRADTAPE_CACHE_DIR"] = str(tmp_path)  # inherited by the children
    try:
        with context.Pool(1) as pool:
            value, grad = pool.apply(compiled, (x,))
    finally:
        if env_before is None:
            del os.environ["GRADTAPE_CACHE_DIR"]
        else:
            os.environ["GRADTAPE_CACHE_DIR"] = env_before
    np.testing.assert_allclose(grad, energy_grad(x), rtol=1e-12)
    np.testing.assert_allclose(value, energy(x), rtol=1e-12)
