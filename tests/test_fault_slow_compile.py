"""A Numba compile that takes minutes holds up nothing else indefinitely.

Numba compiles one function at a time per process (its global compiler lock). With one
program's compile stuck in the background compiler thread:

* other compiled functions on backend="auto" keep answering, from the numpy backend, with the
  right numbers, and run native code once the compiler gets to them;
* a call on backend="numba" waits for Numba at most GRADTAPE_NATIVE_WAIT seconds, then
  answers from the numpy backend with a warning that says so; its kernels are compiled in
  the background after the slow one, and later calls run them.

The slow compile is simulated: the compiler thread holds Numba's compiler lock and sleeps
before building one program's kernels. Nothing here asserts a duration: the checks are about
order (the backend="numba" call returned while the slow compile was still running)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from gradtape.compile.numba import backend as nb

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


class _Generated:
    module = "x = 1\n"
    kernels = ()

    def __init__(self, key):
        self.key = key


class _FakeNumbaLock:
    """Stands for Numba's global compiler lock (an RLock in its `_lock`)."""

    def __init__(self):
        self._lock = threading.RLock()


@pytest.fixture
def fake_numba(monkeypatch):
    """The backend's compile path without Numba: startup is free, the build returns a stand-in
    kernel, and Numba's compiler lock is a lock this test can hold from another thread."""
    numba_lock = _FakeNumbaLock()
    monkeypatch.setattr(nb, "_numba_startup", lambda: 0.0)
    monkeypatch.setattr(nb, "_numba_compiler_lock", lambda: numba_lock)

    def build(nk):
        with numba_lock._lock:  # (as Numba's compile takes its lock)
            return ("kernel",), False

    monkeypatch.setattr(nb, "_build_kernels", build)
    return numba_lock


def _hold(lock, release: threading.Event) -> threading.Thread:
    taken = threading.Event()

    def holder():
        with lock:
            taken.set()
            release.wait(60)

    thread = threading.Thread(target=holder)
    thread.start()
    assert taken.wait(10)
    return thread


def test_compile_now_waits_for_a_busy_numba_at_most_its_timeout(fake_numba):
    release = threading.Event()
    holder = _hold(fake_numba._lock, release)
    nk = nb.NativeKernels(_Generated("slow-compile-test-1"))
    try:
        assert nk.compile_now(timeout=0.2) is False  # Numba busy: nothing built
        assert nk.state == nb.NEW and nk.functions is None
    finally:
        release.set()
        holder.join(10)
    assert nk.compile_now(timeout=0.2) is True
    assert nk.state == nb.READY and nk.functions == ("kernel",)


def test_compile_now_without_a_timeout_waits_as_long_as_it_takes(fake_numba):
    release = threading.Event()
    holder = _hold(fake_numba._lock, release)
    nk = nb.NativeKernels(_Generated("slow-compile-test-2"))
    done = []
    waiter = threading.Thread(target=lambda: done.append(nk.compile_now(timeout=None)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and nk.state == nb.COMPILING  # (inside Numba, waiting for its lock)
    release.set()
    holder.join(10)
    waiter.join(10)
    assert done == [True] and nk.state == nb.READY


def test_a_caller_waiting_for_another_threads_compile_of_the_same_kernels_is_bounded(
    monkeypatch,
):
    started, release = threading.Event(), threading.Event()

    def slow_build(nk):
        started.set()
        release.wait(60)
        return ("kernel",), False

    monkeypatch.setattr(nb, "_numba_startup", lambda: 0.0)
    monkeypatch.setattr(nb, "_build_kernels", slow_build)
    nk = nb.NativeKernels(_Generated("slow-compile-test-3"))
    first = threading.Thread(target=nk.compile_now)
    first.start()
    assert started.wait(10)
    try:
        assert nk.compile_now(timeout=0.2) is False
        assert nk.state == nb.COMPILING  # (still the first thread's)
    finally:
        release.set()
        first.join(10)
    assert nk.compile_now(timeout=0.2) is True and nk.functions == ("kernel",)


def test_the_wait_setting(monkeypatch):
    from gradtape import config

    monkeypatch.delenv("GRADTAPE_NATIVE_WAIT", raising=False)
    assert config.native_wait() == 60.0
    monkeypatch.setenv("GRADTAPE_NATIVE_WAIT", "2.5")
    assert config.native_wait() == 2.5
    monkeypatch.setenv("GRADTAPE_NATIVE_WAIT", "inf")
    assert config.native_wait() == float("inf")
    monkeypatch.setenv("GRADTAPE_NATIVE_WAIT", "-1")
    with pytest.warns(RuntimeWarning, match="GRADTAPE_NATIVE_WAIT"):
        assert config.native_wait() == 60.0


@pytest.mark.native
def test_a_minutes_long_compile_holds_up_no_other_function(tmp_path):
    script = """
    import threading, time, warnings
    import numpy as np
    import gradtape as gt
    from gradtape.compile.numba import backend

    backend._numba_startup()
    from numba.core.compiler_lock import global_compiler_lock

    slow_started, slow_done, slow_on = threading.Event(), threading.Event(), [True]
    build = backend._build_kernels

    def slow_build(nk):  # the first build in the compiler thread takes "minutes"
        if slow_on and threading.current_thread().name == "gradtape-numba-compiler":
            slow_on.clear()
            with global_compiler_lock:
                slow_started.set()
                time.sleep(25.0)
            slow_done.set()
        return build(nk)

    backend._build_kernels = slow_build
    x = np.linspace(0.1, 1.0, 40)
    slow = gt.compile(gt.grad(lambda x: np.sum(np.sin(x) ** 3)))
    assert np.allclose(slow(x), 3 * np.sin(x) ** 2 * np.cos(x), rtol=1e-12)
    assert slow_started.wait(60)

    # backend="auto": answers at once from the numpy backend while the compiler is stuck
    other = gt.compile(gt.grad(lambda x: np.sum(np.exp(x) * x)))
    for _ in range(20):
        assert np.allclose(other(x), np.exp(x) * (1 + x), rtol=1e-12)
    print("auto tier while stuck", other.lowered(x).tier, "stuck", not slow_done.is_set())

    # backend="numba": waits GRADTAPE_NATIVE_WAIT (1 s here), then the numpy backend
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        numba_fn = gt.compile(gt.grad(lambda x: np.sum(np.tanh(x) * 2.0)), backend="numba")
        right = np.allclose(numba_fn(x), 2 * (1 - np.tanh(x) ** 2), rtol=1e-12)
    warned = any("GRADTAPE_NATIVE_WAIT" in str(w.message) for w in caught)
    print("numba returned while stuck", not slow_done.is_set(), "right", right)
    print("numba tier", numba_fn.lowered(x).tier, "warned", warned)

    assert gt.wait_for_native(240)
    ok = np.allclose(slow(x), 3 * np.sin(x) ** 2 * np.cos(x), rtol=1e-12)
    ok = ok and np.allclose(other(x), np.exp(x) * (1 + x), rtol=1e-12)
    ok = ok and np.allclose(numba_fn(x), 2 * (1 - np.tanh(x) ** 2), rtol=1e-12)
    tiers = [f.lowered(x).tier for f in (slow, other, numba_fn)]
    print("after", ok, tiers)
    """
    env = dict(
        os.environ, PYTHONPATH=SRC, GRADTAPE_CACHE_DIR=str(tmp_path / "cache"), GRADTAPE_LLVM="0"
    )
    env.pop("GRADTAPE_NUMBA", None)
    env["GRADTAPE_NATIVE_WAIT"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "auto tier while stuck numpy stuck True" in out, out
    assert "numba returned while stuck True right True" in out, out
    assert "numba tier numpy warned True" in out, out
    assert "after True ['native', 'native', 'native']" in out, out
