"""A fork that lands while the numba backend's compiler thread imports Numba: the fork waits
for that import to finish (a bounded wait), so the child can import Numba (and whatever
Numba imports) itself and compile natively. Before, the child was left with Numba's modules
half-imported, their import locks held by a thread it does not have: its first `import numba`
waited forever.

The import is paused by an import hook (in the compiler thread only) until the fork has
started, and a child that does not finish within its timeout is killed and reported as
"hung", so a hang fails the test instead of hanging the run."""

from __future__ import annotations

import os
import re

import pytest
from forking import child_start, run_child_script

from gradtape.compile.numba import backend

native = pytest.mark.native
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

PRELUDE = child_start(
    wait_seconds=60.0,
    more="""
import importlib.abc, importlib.util, warnings
from gradtape.compile.numba import backend

inside_import = threading.Event()

class PauseNumbaImport(importlib.abc.MetaPathFinder):
    # Numba's own import, in the compiler thread only: `numba` is in sys.modules, half
    # initialized, its import lock held, while this sleeps
    def __init__(self, seconds):
        self.seconds = seconds

    def find_spec(self, name, path, target=None):
        if name != "numba" or threading.current_thread().name != "gradtape-numba-compiler":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        seconds = self.seconds

        def paused(module):
            inside_import.set()
            time.sleep(seconds)
            run(module)

        spec.loader.exec_module = paused
        return spec
""",
)


def run_script(script: str, tmp_path) -> str:
    return run_child_script(PRELUDE, script, tmp_path, {"GRADTAPE_LLVM": "0"}, timeout=300)


@native
def test_fork_during_numbas_import_waits_for_it_and_the_child_compiles_natively(tmp_path):
    out = run_script(
        """
        sys.meta_path.insert(0, PauseNumbaImport(1.0))
        x = np.linspace(0.0, 1.0, 50)
        cf = gt.compile(gt.grad(f))  # (starts Numba's import in the compiler thread)
        assert np.allclose(cf(x), df(x), rtol=1e-12)
        assert inside_import.wait(60)
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                import numba  # (waited forever: its import lock belonged to the parent's thread)

                ch = gt.compile(gt.grad(lambda x: np.sum(np.tanh(x) * 3.0)), backend="numba")
                ok = np.allclose(ch(x), 3.0 * (1.0 - np.tanh(x) ** 2), rtol=1e-12)
                ok = ok and ch.lowered(x).tier == "native"
                # the parent's queued kernels are requested again by the next call
                ok = ok and np.allclose(cf(x), df(x), rtol=1e-12) and gt.wait_for_native(120)
                ok = ok and np.allclose(cf(x), df(x), rtol=1e-12)
                ok = ok and cf.lowered(x).tier == "native"
            warned = [str(w.message) for w in caught if "forked while" in str(w.message)]
            print("child", ch.lowered(x).tier, cf.lowered(x).tier, warned, flush=True)
            os._exit(0 if ok and not warned else 3)
        print("fork seconds", round(time.perf_counter() - start, 3))
        print("waited", round(backend.last_fork_import_wait[0], 3))
        print("child", wait_child(pid, 120))
        print("parent", np.allclose(cf(x), df(x), rtol=1e-12))
        """,
        tmp_path,
    )
    assert "child 0" in out and "parent True" in out, out
    # the fork waited for the rest of the paused import, and only for that
    waited = float(re.search(r"waited ([0-9.]+)", out).group(1))
    assert 0.0 < waited < backend.FORK_IMPORT_WAIT, out


@native
def test_the_forks_wait_for_an_import_is_bounded(tmp_path):
    """An import that takes longer than FORK_IMPORT_WAIT (as a deadlock would): the fork goes
    on after that bound, and the child, whose Numba is half imported, never calls Numba: it
    gets the right numbers from the numpy backend, with a warning that says why."""
    out = run_script(
        """
        backend.FORK_IMPORT_WAIT = 0.3
        sys.meta_path.insert(0, PauseNumbaImport(10.0))
        x = np.linspace(0.0, 1.0, 50)
        cf = gt.compile(gt.grad(f))
        assert np.allclose(cf(x), df(x), rtol=1e-12)
        assert inside_import.wait(60)
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ch = gt.compile(gt.grad(lambda x: np.sum(np.tanh(x) * 3.0)), backend="numba")
                ok = np.allclose(ch(x), 3.0 * (1.0 - np.tanh(x) ** 2), rtol=1e-12)
                ok = ok and ch.lowered(x).tier == "numpy"
                ok = ok and np.allclose(cf(x), df(x), rtol=1e-12)
            ok = ok and any("forked while" in str(w.message) for w in caught)
            os._exit(0 if ok else 3)
        print("fork seconds", round(time.perf_counter() - start, 3))
        print("child", wait_child(pid, 120))
        gt.wait_for_native(120)
        print("parent", np.allclose(cf(x), df(x), rtol=1e-12), cf.lowered(x).tier)
        """,
        tmp_path,
    )
    assert "child 0" in out and "parent True native" in out, out
    fork_seconds = float(re.search(r"fork seconds ([0-9.]+)", out).group(1))
    assert 0.25 < fork_seconds < 8.0, out  # (without the bound: the 10 s pause)
