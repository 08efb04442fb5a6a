"""The kernel cache's pruning and clearing (compile/cache.py), on entries made up in tmp dirs,
and end to end: a process that compiles a new kernel prunes once, keeping what it uses."""

from __future__ import annotations

import os
import time
import uuid

import numpy as np
import pytest

import gradtape as gt
from gradtape.bench.cli import main as cli_main
from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba import cache

DAY = 86400.0


def make_entry(directory, key: str, size: int, used_seconds_ago: float) -> None:
    """A fake entry: a module and two Numba files of `size` bytes each, last used that long
    ago (the module's access time; its modification time is older still)."""
    pycache = directory / "__pycache__"
    pycache.mkdir(parents=True, exist_ok=True)
    module = directory / f"k_{key}.py"
    module.write_text("# a kernel module\n")
    for suffix in ("kernel0-19.py311.nbi", "kernel0-19.py311.1.nbc"):
        (pycache / f"k_{key}.{suffix}").write_bytes(b"x" * size)
    used = time.time() - used_seconds_ago
    os.utime(module, (used, used - 10))


def keys(directory) -> set[str]:
    return {e.key for e in cache.entries(directory)}


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A cache directory of its own, and this process's pruning state reset."""
    if numba_backend.available():  # earlier tests' background compiles write and prune
        numba_backend.wait_for_kernels(300)
    monkeypatch.setattr(cache, "_override", [tmp_path])
    monkeypatch.setattr(cache, "_new_entries", [])
    monkeypatch.setattr(cache, "_used_keys", set())
    monkeypatch.setattr(cache, "_pruned", [])
    return cache.kernel_dir()


def test_entries_group_a_key_and_sort_least_recently_used_first(fresh_cache):
    make_entry(fresh_cache, "b", 100, 2 * DAY)
    make_entry(fresh_cache, "a", 100, 5 * DAY)
    (fresh_cache / "__pycache__" / "k_orphan.kernel0-3.py311.nbi").write_bytes(b"y" * 7)
    found = cache.entries(fresh_cache)
    assert [e.key for e in found] == ["orphan", "a", "b"]  # no module: never used
    assert found[1].size == len("# a kernel module\n") + 200 and len(found[1].files) == 3


def test_prune_removes_old_entries_then_least_recently_used_beyond_the_cap(fresh_cache):
    make_entry(fresh_cache, "ancient", 10, 40 * DAY)
    make_entry(fresh_cache, "old", 1000, 3 * DAY)
    make_entry(fresh_cache, "kept_by_caller", 1000, 2 * DAY)
    make_entry(fresh_cache, "middle", 1000, 1 * DAY)
    make_entry(fresh_cache, "new", 1000, 3600)
    make_entry(fresh_cache, "loading_now", 1000, 5)
    stale = fresh_cache / ".tmp-dead.py"
    stale.write_text("half written")
    os.utime(stale, (time.time() - 2 * 3600,) * 2)
    removed = cache.prune(
        fresh_cache, max_bytes=6100, max_age_seconds=30 * DAY, keep={"kept_by_caller"}
    )
    assert removed == ["ancient", "old", "middle"]
    assert keys(fresh_cache) == {"kept_by_caller", "new", "loading_now"}
    assert not list((fresh_cache / "__pycache__").glob("k_old.*")) and not stale.exists()
    # within both limits: nothing more goes
    assert cache.prune(fresh_cache, max_bytes=10**9, max_age_seconds=30 * DAY) == []


def test_prune_limits_come_from_the_environment(fresh_cache, monkeypatch):
    make_entry(fresh_cache, "week", 10, 7 * DAY)
    make_entry(fresh_cache, "big", 600_000, 3600)
    make_entry(fresh_cache, "small", 10, 1800)
    assert cache.prune(fresh_cache) == []  # defaults: 30 days, 256 MB
    monkeypatch.setenv("GRADTAPE_CACHE_MAX_AGE_DAYS", "5")
    monkeypatch.setenv("GRADTAPE_CACHE_MAX_MB", "1")
    assert cache.prune(fresh_cache) == ["week", "big"]
    monkeypatch.setenv("GRADTAPE_CACHE_MAX_MB", "lots")
    with pytest.warns(RuntimeWarning, match="not a number"):
        assert cache.prune(fresh_cache) == []


def test_loading_an_entry_marks_it_used_without_changing_what_numba_keys_on(fresh_cache):
    path = cache.module_file(fresh_cache, "k1", "# text\n")
    assert cache._new_entries == ["k1"]
    then = time.time() - 5 * DAY
    os.utime(path, (then, then))
    mtime_ns = path.stat().st_mtime_ns
    assert cache.module_file(fresh_cache, "k1", "# text\n") == path  # found: not written again
    assert path.stat().st_mtime_ns == mtime_ns  # Numba's cache stays valid
    assert time.time() - cache.entries(fresh_cache)[0].last_used < 60
    assert cache._new_entries == ["k1"] and cache._used_keys == {"k1"}


@pytest.mark.native
def test_a_process_that_compiles_a_new_kernel_prunes_once(fresh_cache, monkeypatch):
    monkeypatch.setenv("GRADTAPE_CACHE_MAX_MB", "0.5")
    make_entry(fresh_cache, "ancient", 10, 60 * DAY)
    make_entry(fresh_cache, "large", 400_000, 2 * DAY)
    make_entry(fresh_cache, "recent", 10, 3600)
    scale = 1.0 + uuid.uuid4().int % 10**6 / 1e7  # a constant no other test compiled

    def f(x):
        return np.sum(np.exp(x) * scale)

    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    x = np.linspace(0.0, 1.0, 7)
    value, grad = cf(x)
    np.testing.assert_allclose(grad, np.exp(x) * scale, rtol=1e-14)
    own = numba_backend.lowered(cf, x).native.key
    assert keys(fresh_cache) == {own, "recent"}
    # the machine code: Numba's cache files, or the llvmlite generator's object file
    pycache = fresh_cache / "__pycache__"
    assert any(pycache.glob(f"k_{own}.*.nbc")) or any(pycache.glob(f"k_{own}.llvm-*.o"))
    make_entry(fresh_cache, "later", 10, 90 * DAY)  # once per process: no second pruning
    cf2 = gt.compile(
        gt.value_and_grad(lambda x: np.sum(np.exp(x) * (scale + 1.0))), backend="numba"
    )
    cf2(x)
    assert "later" in keys(fresh_cache)


def test_clear_cache_and_the_cli(fresh_cache, capsys):
    make_entry(fresh_cache, "a", 10, DAY)
    make_entry(fresh_cache, "b", 10, 60)
    assert cli_main(["cache"]) == 0
    assert f"{fresh_cache}: 2 modules" in capsys.readouterr().out
    assert gt.clear_cache() == 2
    assert cache.entries(fresh_cache) == []
    make_entry(fresh_cache, "c", 10, DAY)
    assert cli_main(["cache", "--clear"]) == 0
    assert "removed 1 cached kernel modules" in capsys.readouterr().out
    assert cache.entries(fresh_cache) == []
    cache._override[:] = [None]
    assert gt.clear_cache() == 0 and cache.usage() == (None, 0, 0)
