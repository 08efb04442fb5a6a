"""A fork that lands while another thread holds one of gradtape's locks: the child never
hangs. Each test places the fork deterministically (the other thread stops inside the lock
until the fork is done) and kills a child that does not finish within a timeout, so a hang
fails the test instead of hanging the run. These run on the numpy backend (GRADTAPE_NUMBA=0);
the numba backend's compiler thread and Numba's import at a fork are tested in
test_fork_imports.py."""

from __future__ import annotations

import os

import pytest
from forking import child_start, run_child_script

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

PRELUDE = child_start(wait_seconds=30.0)


def run_script(script: str, tmp_path, extra_env: dict | None = None) -> str:
    return run_child_script(
        PRELUDE, script, tmp_path, {"GRADTAPE_NUMBA": "0", **(extra_env or {})}, timeout=180
    )


def test_fork_while_another_thread_records_a_variant(tmp_path):
    """Another thread is inside the compiled function's lock (storing the variant it recorded)
    at the fork: the child records a new signature of the same function (it used to wait
    forever for the lock) and replays the old one, with the right numbers."""
    out = run_script(
        """
        cf = gt.compile(gt.grad(f))
        x, y = np.linspace(0.0, 1.0, 7), np.linspace(-1.0, 1.0, 11)
        inside, forked = threading.Event(), threading.Event()
        drop = cf._drop_least_recent

        def held_inside_the_lock():  # runs under cf._lock, as dispatch stores a signature
            inside.set()
            forked.wait(60)
            drop()

        cf._drop_least_recent = held_inside_the_lock
        recorder = threading.Thread(target=cf, args=(x,))
        recorder.start()
        assert inside.wait(60)
        assert cf._lock.locked()
        pid = os.fork()
        if pid == 0:
            cf._drop_least_recent = drop
            ok = np.allclose(cf(y), df(y), rtol=1e-12) and np.allclose(cf(x), df(x), rtol=1e-12)
            os._exit(0 if ok else 3)
        forked.set()
        recorder.join(60)
        print("child", wait_child(pid))
        print("parent", np.allclose(cf(x), df(x), rtol=1e-12), np.allclose(cf(y), df(y)))
        """,
        tmp_path,
    )
    assert "child 0" in out and "parent True True" in out, out


def test_fork_while_another_thread_records_a_loop_body(tmp_path):
    """Another thread is recording a new path of a fori_loop body (a later iteration takes
    another branch; the body's lock is held while it is recorded) at the fork: the child runs
    the loop, recording that path itself (it used to wait forever for the lock)."""
    out = run_script(
        """
        from gradtape.control import loops

        inside, forked = threading.Event(), threading.Event()

        def body(i, c):
            if c[0] > 0.3:
                return c * 0.5
            if threading.current_thread().name == "recorder":
                inside.set()
                forked.wait(60)
            return c * 0.5 + np.sin(c)

        def g(x):
            return np.sum(gt.fori_loop(0, 4, body, x))

        def g_loop(x):  # the same, as a Python loop
            c = x
            for _ in range(4):
                c = c * 0.5 if c[0] > 0.3 else c * 0.5 + np.sin(c)
            return np.sum(c)

        x = np.linspace(1.0, 2.0, 5)
        recorder = threading.Thread(target=gt.grad(g), args=(x,), name="recorder")
        recorder.start()
        assert inside.wait(60)
        assert any(body._lock.locked() for body in loops._LIVE_BODIES)
        pid = os.fork()
        if pid == 0:
            ok = np.allclose(gt.grad(g)(x), gt.grad(g_loop)(x), rtol=1e-12)
            ok = ok and np.allclose(g(x), g_loop(x), rtol=1e-12)
            os._exit(0 if ok else 3)
        forked.set()
        recorder.join(60)
        print("child", wait_child(pid))
        print("parent", np.allclose(gt.grad(g)(x), gt.grad(g_loop)(x), rtol=1e-12))
        """,
        tmp_path,
    )
    assert "child 0" in out and "parent True" in out, out


def test_every_lock_of_gradtape_is_new_in_a_forked_child(tmp_path):
    """A parent thread holds every lock of every gradtape module, of every compiled function
    and of every recorded loop body at the fork: in the child each of them can be taken at
    once, and compiling, differentiating and loops work (a lock added later without a reset
    fails this test)."""
    out = run_script(
        """
        from gradtape.compile import dispatch
        from gradtape.control import loops

        cf = gt.compile(gt.grad(f))
        x = np.linspace(0.0, 1.0, 5)
        cf(x)
        scan_grad = gt.grad(lambda x: np.sum(gt.scan(lambda c, xi: (c * xi, c), 1.0, x)[1]))
        scan_grad(x)
        lock_types = (type(threading.Lock()), type(threading.RLock()))

        def every_lock():
            found = []
            for name, module in sorted(sys.modules.items()):
                if module is None or not name.startswith("gradtape"):
                    continue
                for attr, value in sorted(vars(module).items()):
                    if type(value) in lock_types:
                        found.append((f"{name}.{attr}", value))
            found += [(f"compiled {c!r}", c._lock) for c in dispatch._LIVE_FUNCTIONS]
            found += [(f"loop body {b.name}", b._lock) for b in loops._LIVE_BODIES]
            return found

        held, forked = threading.Event(), threading.Event()
        # (the numba backend's fork handler takes this one itself, for a counter update: the
        # fork waits for it, and it is never held longer)
        locks = [(n, lk) for n, lk in every_lock() if not n.endswith("._numba_work_lock")]

        def hold_all():
            for _, lock in locks:
                lock.acquire()
            held.set()
            forked.wait(60)
            for _, lock in reversed(locks):
                lock.release()

        holder = threading.Thread(target=hold_all)
        holder.start()
        assert held.wait(60)
        pid = os.fork()
        if pid == 0:
            stuck = []
            for name, lock in every_lock():
                if not lock.acquire(timeout=0.5):
                    stuck.append(name)
                else:
                    lock.release()
            if stuck:
                print("child: still held:", stuck, flush=True)
                os._exit(4)
            y = np.linspace(-1.0, 2.0, 9)
            ok = np.allclose(cf(y), df(y), rtol=1e-12)
            ok = ok and np.allclose(gt.compile(gt.grad(f))(y), df(y), rtol=1e-12)
            ok = ok and np.all(np.isfinite(scan_grad(y)))
            os._exit(0 if ok else 3)
        forked.set()
        holder.join(60)
        print("locks", len(locks))
        print("child", wait_child(pid))
        """,
        tmp_path,
    )
    assert "child 0" in out, out
    assert int(out.split("locks")[1].split()[0]) >= 10, out
