"""The numba backend's runtime under forks, interrupts and threads: a forked child never hangs
and gets the right numbers (natively when the fork lands while the compiler is idle, on the
numpy backend with a warning when it lands during Numba work; also after set_num_threads
under GNU OpenMP), Ctrl-C during a compile does not leave the function
hanging, and threads calling one compiled function while another records a new variant get
the right numbers."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from forking import child_start, run_child_script

native = pytest.mark.native

# the child's verdict: exit status 0 when its numbers are right, 3 when wrong
_PRELUDE = child_start(wait_seconds=90.0, more="from gradtape.compile.numba import backend\n")


def _run(script: str, tmp_path, timeout: float = 240.0) -> str:
    return run_child_script(_PRELUDE, script, tmp_path, timeout=timeout)


@native
@pytest.mark.parametrize("when", ["idle", "startup", "busy"])
def test_forked_child_compiles_and_calls(tmp_path, when, monkeypatch):
    """A forked child never hangs and gets the right numbers. "idle": the fork lands when the
    compiler has nothing to do, and the child compiles natively. "busy": the fork lands while
    the compiler thread is inside a compile (held there until the fork is done), and the child
    runs on the numpy backend with a warning that says why. "startup": the fork lands just
    after the first call, while the compiler thread imports Numba (it used to hang), and the
    child does one or the other."""
    monkeypatch.setenv("GRADTAPE_LLVM", "0")  # Numba's path (not the llvmlite generator)
    out = _run(
        f"""
        import threading, warnings
        x = np.linspace(0.0, 1.0, 200)
        cf = gt.compile(gt.grad(f))
        cf(x)
        if {when!r} == "idle":
            backend.wait_for_kernels(120)
        elif {when!r} == "busy":
            backend.wait_for_kernels(120)
            inside, forked = threading.Event(), threading.Event()
            build = backend._build_kernels

            def slow_build(nk):
                inside.set()
                forked.wait(60)
                return build(nk)

            backend._build_kernels = slow_build
            cg = gt.compile(gt.grad(lambda x: np.sum(np.sin(x) ** 3 + np.cos(x) * 1.5)))
            dg = lambda x: 3 * np.sin(x) ** 2 * np.cos(x) - 1.5 * np.sin(x)
            cg(x)
            assert inside.wait(60)
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ch = gt.compile(gt.grad(lambda x: np.sum(np.tanh(x) * 3.0)), backend="numba")
                ok = np.allclose(ch(x), 3.0 * (1.0 - np.tanh(x) ** 2), rtol=1e-12)
                for _ in range(3):
                    ok = ok and np.allclose(cf(x), df(x), rtol=1e-12)
                ok = ok and gt.wait_for_native(60) and np.allclose(cf(x), df(x), rtol=1e-12)
                if {when!r} == "busy":
                    ok = ok and np.allclose(cg(x), dg(x))
            warned = any("forked while gradtape was compiling" in str(w.message) for w in caught)
            print("child tier", ch.lowered(x).tier, "warned", warned, flush=True)
            os._exit(0 if ok else 3)
        if {when!r} == "busy":
            forked.set()
        print("child", wait_child(pid))
        print("parent", np.allclose(cf(x), df(x), rtol=1e-12))
        if {when!r} == "busy":
            gt.wait_for_native(120)
            print("parent busy", np.allclose(cg(x), dg(x)), cg.lowered(x).tier)
        """,
        tmp_path,
    )
    assert "child 0" in out and "parent True" in out, out
    if when == "idle":
        assert "child tier native warned False" in out, out
    elif when == "busy":
        assert "child tier numpy warned True" in out and "parent busy True native" in out, out
    else:
        assert "child tier native warned False" in out or "child tier numpy warned True" in out


@native
def test_multiprocessing_fork_pool(tmp_path):
    out = _run(
        """
        import multiprocessing as mp
        cf = gt.compile(gt.grad(f))
        x = np.linspace(0.0, 1.0, 50)
        cf(x)

        def work(scale):
            y = x * scale
            return float(np.max(np.abs(cf(y) - df(y))))

        with mp.get_context("fork").Pool(2) as pool:
            errors = pool.map_async(work, [0.5, 1.0, 1.5, 2.0]).get(120)
        print("max error", max(errors))
        """,
        tmp_path,
    )
    assert "max error 0.0" in out or float(out.split("max error")[1]) < 1e-12, out


@native
def test_fork_after_parallel_loops_under_openmp(tmp_path):
    """After set_num_threads(2) a parallel kernel ran: a forked child (which GNU OpenMP kills
    when it starts a parallel region) gets the right numbers from one thread."""
    out = _run(
        """
        gt.set_num_threads(2)
        cf = gt.compile(gt.grad(f), backend="numba")
        x = np.linspace(0.0, 1.0, 300_000)
        assert np.allclose(cf(x), df(x), rtol=1e-12)
        pid = os.fork()
        if pid == 0:
            ok = np.allclose(cf(x), df(x), rtol=1e-12) and gt.get_num_threads() == 1
            os._exit(0 if ok else 3)
        print("child", wait_child(pid))
        print("parent", np.allclose(cf(x), df(x), rtol=1e-12), gt.get_num_threads())
        """,
        tmp_path,
    )
    assert "child 0" in out and "parent True 2" in out, out


@native
def test_keyboard_interrupt_during_compile_then_compiles(tmp_path):
    """Ctrl-C while Numba compiles: the call raises KeyboardInterrupt; the next call compiles
    (it used to wait forever for the interrupted compile)."""
    out = _run(
        """
        import _thread, threading
        from gradtape.compile.numba import backend as nb
        nb._numba_startup()
        x = np.linspace(0.0, 1.0, 100)
        cf = gt.compile(gt.grad(f), backend="numba")
        timer = threading.Timer(0.05, _thread.interrupt_main)
        timer.start()
        try:
            cf(x)
            print("finished before the interrupt")
        except KeyboardInterrupt:
            print("interrupted")
        timer.join()
        print("right", np.allclose(cf(x), df(x), rtol=1e-12))
        print("tier", cf.lowered(x).tier)
        """,
        tmp_path,
    )
    assert "interrupted" in out and "right True" in out and "tier native" in out, out


def test_interrupted_compile_is_compiled_again(monkeypatch):
    """Without Numba: an interrupt inside the build leaves the kernels NEW (not COMPILING), a
    waiting thread is woken and takes over, and the next compile_now builds them."""
    monkeypatch.setenv("GRADTAPE_LLVM", "0")  # Numba's path (not the llvmlite generator)
    from gradtape.compile.numba import backend as nb

    class Generated:
        key = "interrupt-test"
        module = "x = 1\n"
        kernels = ()

    calls = []

    def build(nk):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return ("k",), False

    monkeypatch.setattr(nb, "_numba_startup", lambda: 0.0)
    monkeypatch.setattr(nb, "_build_kernels", build)
    nk = nb.NativeKernels(Generated())
    with pytest.raises(KeyboardInterrupt):
        nk.compile_now()
    assert nk.state == nb.NEW and not nk.ready.is_set()
    nk.compile_now()
    assert nk.state == nb.READY and nk.functions == ("k",) and len(calls) == 2


def test_waiting_thread_takes_over_an_interrupted_compile(monkeypatch):
    monkeypatch.setenv("GRADTAPE_LLVM", "0")  # Numba's path (not the llvmlite generator)
    from gradtape.compile.numba import backend as nb

    class Generated:
        key = "interrupt-test-2"
        module = "x = 1\n"
        kernels = ()

    started, release = threading.Event(), threading.Event()
    calls = []

    def build(nk):
        calls.append(1)
        if len(calls) == 1:
            started.set()
            release.wait(10)
            raise KeyboardInterrupt
        return ("k",), False

    monkeypatch.setattr(nb, "_numba_startup", lambda: 0.0)
    monkeypatch.setattr(nb, "_build_kernels", build)
    nk = nb.NativeKernels(Generated())
    interrupted = []

    def first():
        try:
            nk.compile_now()
        except KeyboardInterrupt:
            interrupted.append(True)

    t1 = threading.Thread(target=first)
    t1.start()
    started.wait(10)
    t2 = threading.Thread(target=nk.compile_now)
    t2.start()
    release.set()
    t1.join(10)
    t2.join(10)
    assert not t2.is_alive() and interrupted == [True]
    assert nk.state == nb.READY and len(calls) == 2


@pytest.mark.parametrize("threads", [4, 16])
@pytest.mark.parametrize("backend", ["numpy", pytest.param("auto", marks=native)])
def test_threads_calling_while_another_records(threads, backend):
    """Threads calling one compiled function while another thread makes it record new
    variants (new shapes, another branch): every result is right."""
    import gradtape as gt

    def f(x):
        if x[0] > 0:
            return np.sum(np.sin(x) * x)
        return np.sum(np.cos(x) * 3.0)

    def df(x):
        if x[0] > 0:
            return np.cos(x) * x + np.sin(x)
        return -3.0 * np.sin(x)

    cf = gt.compile(gt.grad(f), backend=backend, max_variants=64)
    x = np.linspace(0.1, 1.0, 64)
    cf(x)
    errors, stop = [], threading.Event()

    def caller(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            y = x * rng.uniform(0.5, 2.0)
            g = cf(y)
            if not np.allclose(g, df(y), rtol=1e-12, atol=1e-14):
                errors.append(("caller", seed))
        stop.set()

    def recorder():
        n = 3
        while not stop.is_set() and n < 40:
            y = np.linspace(-1.0, 1.0, n) * (-1) ** n
            if not np.allclose(cf(y), df(y), rtol=1e-12, atol=1e-14):
                errors.append(("recorder", n))
            n += 1

    workers = [threading.Thread(target=caller, args=(s,)) for s in range(threads)]
    workers.append(threading.Thread(target=recorder))
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not any(w.is_alive() for w in workers)
    assert errors == []


def test_short_switch_interval_only_while_the_compiler_works():
    import gradtape as gt
    from gradtape.compile.numba import backend as nb

    gt.wait_for_native(120)  # the compiler thread sets the interval while it works
    before = sys.getswitchinterval()
    with nb._short_switch_interval():
        assert sys.getswitchinterval() == min(before, nb.COMPILING_SWITCH_INTERVAL)
    assert sys.getswitchinterval() == before
    with nb._short_switch_interval():
        sys.setswitchinterval(0.002)  # the program's own choice meanwhile: kept
    try:
        assert sys.getswitchinterval() == 0.002
    finally:
        sys.setswitchinterval(before)


def test_wait_for_native_with_nothing_to_compile():
    import gradtape as gt

    assert gt.wait_for_native(120) is True  # what earlier tests left compiling
    assert gt.wait_for_native(0.0) is True
    assert "waits" in gt.wait_for_native.__doc__ or "Wait" in gt.wait_for_native.__doc__


@pytest.mark.parametrize("numba_work_at_fork", [False, True])
def test_fork_records_numba_work_and_the_child_keeps_away_from_numba(
    monkeypatch, numba_work_at_fork
):
    """Without forking: the fork handlers take no lock a compile holds (the fork never waits),
    and a child forked during Numba work refuses Numba: its kernels fail with the reason
    instead of compiling, so the variant runs on the numpy backend."""
    monkeypatch.setenv("GRADTAPE_LLVM", "0")  # Numba's path (not the llvmlite generator)
    from gradtape.compile.numba import backend as nb
    from gradtape.compile.numba import notices

    class Generated:
        key = f"fork-test-{numba_work_at_fork}"
        module = "x = 1\n"
        kernels = ()

    builds = []
    monkeypatch.setattr(nb, "_started", [True])  # (Numba's startup counts as done)
    monkeypatch.setattr(nb, "_build_kernels", lambda nk: builds.append(1) or (("k",), False))
    monkeypatch.setattr(nb, "_forked_during_numba_work", [])
    monkeypatch.setattr(nb, "_numba_work_count", [0])
    monkeypatch.setattr(nb, "_ALL_KERNELS", type(nb._ALL_KERNELS)())
    monkeypatch.setattr(nb, "_compiler_instance", [])
    for name in ("_numba_work_lock", "_startup_lock", "_registry_lock", "_compiler_lock"):
        monkeypatch.setattr(nb, name, getattr(nb, name))  # (restored after the test)
    monkeypatch.setattr(notices, "_warn_lock", notices._warn_lock)
    monkeypatch.setattr(nb, "_threads_lock", nb._threads_lock)
    monkeypatch.setattr(nb, "_switch_lock", nb._switch_lock)
    nk = nb.NativeKernels(Generated())
    nb._ALL_KERNELS.add(nk)
    work = nb._numba_work()
    if numba_work_at_fork:
        work.__enter__()  # another thread is compiling
    held = nb._numba_work_lock
    nb._before_fork()
    try:
        assert held.locked()  # no count change until the fork is done ...
    finally:
        nb._after_fork_in_child()  # ... the child's locks are new
    assert nb._numba_work_lock is not held and not nb._numba_work_lock.locked()
    held.release()  # (the parent's: released by _after_fork_in_parent there)
    assert nb._numba_work_count[0] == 0
    if numba_work_at_fork:
        with pytest.raises(RuntimeError, match="forked while gradtape was compiling"):
            nb.numba_usable_here()
        nk.compile_now()
        assert nk.state == nb.FAILED and "wait_for_native" in nk.error and not builds
    else:
        nb.numba_usable_here()
        nk.compile_now()
        assert nk.state == nb.READY and builds == [1]
