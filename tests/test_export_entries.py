"""Native entry points written as LLVM IR around the compiled kernels: every entry point
(C, Numba, nutpie's logp) gives gradtape's value_and_grad at generated points; programs of
several kernels hand their arrays on without leaking; a cold build compiles the kernels once
and the entry points are not typed by Numba; a corrupted or stale cached kernel is detected
and rebuilt; nutpie's entry points refuse wrong sizes and missing data."""

from __future__ import annotations

import ctypes
import io
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba import export, fusion

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed"),
]

DOUBLE_P = ctypes.POINTER(ctypes.c_double)
RNG = np.random.default_rng(11)
DESIGN = RNG.normal(size=(40, 3))
COUNTS = RNG.poisson(2.0, size=40).astype(np.float64)
MIXING = RNG.normal(size=(3, 3))


def poisson_logp(beta):
    """A Poisson regression (the shape of a sampler's density: data, exp, sums)."""
    eta = DESIGN @ beta
    return np.sum(COUNTS * eta - np.exp(eta)) - 0.5 * np.sum(beta**2)


def layered(x):
    """Two tanh layers: split into several kernels below, arrays handed from one to the next."""
    h = np.tanh(MIXING @ x)
    return np.sum(np.exp(h) * x) + np.sum(np.tanh(MIXING @ h) ** 2)


def matrix_input(x):
    """A 2-d argument and a 2-d gradient."""
    return np.sum(np.log1p(x**2) * DESIGN[:2, :]) + np.sum(x[:, 0] * x[:, 1])


def _several_kernels_handle(monkeypatch_members: int = 4):
    saved = fusion.MAX_KERNEL_MEMBERS
    fusion.MAX_KERNEL_MEMBERS = monkeypatch_members  # bounded kernels, made small
    try:
        return gt.compile(gt.value_and_grad(layered)).as_native(np.zeros(3))
    finally:
        fusion.MAX_KERNEL_MEMBERS = saved


HANDLES = {}


def handle_of(name: str):
    """One handle per function for the whole module (each is compiled once)."""
    if name not in HANDLES:
        if name == "poisson":
            HANDLES[name] = gt.compile(gt.value_and_grad(poisson_logp)).as_native(np.zeros(3))
        elif name == "layered":
            HANDLES[name] = _several_kernels_handle()
        else:
            HANDLES[name] = gt.compile(gt.value_and_grad(matrix_input)).as_native(np.ones((2, 3)))
    return HANDLES[name]


FUNCTIONS = {"poisson": poisson_logp, "layered": layered, "matrix": matrix_input}


def _c_call(address: int, n: int, x, first, second, data: int) -> int:
    function = export.pointer_type()(address)
    return function(
        n,
        x.ctypes.data_as(DOUBLE_P),
        first.ctypes.data_as(DOUBLE_P),
        second.ctypes.data_as(DOUBLE_P),
        ctypes.c_void_p(data),
    )


@settings(max_examples=12, deadline=None)
@given(
    name=st.sampled_from(sorted(FUNCTIONS)),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([0.1, 1.0, 3.0]),
)
def test_every_entry_point_gives_value_and_grad_at_generated_points(name, seed, scale):
    import numba

    h = handle_of(name)
    x = np.random.default_rng(seed).normal(0.0, scale, size=h.input_shape)
    expected_value, expected_grad = gt.value_and_grad(FUNCTIONS[name])(x)
    expected_grad = np.reshape(expected_grad, -1)
    flat = np.ascontiguousarray(x).reshape(-1)

    value, grad = np.full(1, -7.0), np.full(h.n, -7.0)  # the C entry point
    status = _c_call(h.address, h.n, flat, value, grad, h.data_address)
    results = [(status, value[0], grad)]

    pair = np.array([h.data_address, 0], np.int64)  # nutpie's order: (n, x, grad, logp, pair)
    value, grad = np.full(1, -7.0), np.full(h.n, -7.0)
    status = _c_call(h.nutpie_logp().address, h.n, flat, grad, value, pair.ctypes.data)
    results.append((status, value[0], grad))

    core = h.numba

    @numba.njit
    def from_numba(x, data):
        value, grad = np.empty(1), np.empty(x.size)
        return core(x, value, grad, data), value[0], grad

    results.append(from_numba(flat, h.data))
    value, grad = h(x)  # from Python
    results.append((0, value, np.reshape(grad, -1)))
    for status, value, grad in results:
        assert status == export.STATUS_OK
        np.testing.assert_allclose(value, expected_value, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-11, atol=1e-12)


def test_several_kernels_hand_their_arrays_on_and_free_them():
    from numba.core.runtime import _nrt_python, rtsys

    h = handle_of("layered")
    calls = h._module.plan.calls
    assert len(calls) > 1
    assert any(kind == "value" for call in calls for kind, _ in call.args)
    x = np.array([0.3, -0.7, 1.1])
    value, grad = np.empty(1), np.empty(3)
    assert _c_call(h.address, 3, x, value, grad, h.data_address) == 0
    enabled = _nrt_python.memsys_stats_enabled()
    _nrt_python.memsys_enable_stats()
    before = rtsys.get_allocation_stats()
    for _ in range(200):
        assert _c_call(h.address, 3, x, value, grad, h.data_address) == 0
    after = rtsys.get_allocation_stats()
    if not enabled:
        _nrt_python.memsys_disable_stats()
    allocated, freed = after.alloc - before.alloc, after.free - before.free
    assert allocated > 0 and allocated == freed  # every array a kernel returned was released
    assert after.mi_alloc - before.mi_alloc == after.mi_free - before.mi_free


def test_nutpie_entry_points_refuse_wrong_sizes_and_missing_data():
    h = handle_of("poisson")
    x, value, grad = np.zeros(3), np.empty(1), np.empty(3)
    pair = np.array([h.data_address, 0], np.int64)
    logp = h.nutpie_logp().address
    assert _c_call(logp, 4, x, grad, value, pair.ctypes.data) == export.STATUS_WRONG_SIZE
    assert _c_call(logp, 3, x, grad, value, 0) == export.STATUS_BAD_DATA
    other = np.array([h.data_address + 8, 0], np.int64)  # not this handle's descriptor
    assert _c_call(logp, 3, x, grad, value, other.ctypes.data) == export.STATUS_BAD_DATA
    copy = h.nutpie_copy().address
    expand_type = ctypes.CFUNCTYPE(
        ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, DOUBLE_P, DOUBLE_P, ctypes.c_void_p
    )
    out = np.zeros(3)
    xs = np.array([1.0, 2.0, 3.0])
    status = expand_type(copy)(3, 3, xs.ctypes.data_as(DOUBLE_P), out.ctypes.data_as(DOUBLE_P), 0)
    assert status == 0 and out.tolist() == [1.0, 2.0, 3.0]
    status = expand_type(copy)(3, 2, xs.ctypes.data_as(DOUBLE_P), out.ctypes.data_as(DOUBLE_P), 0)
    assert status == export.STATUS_WRONG_SIZE
    with pytest.raises(gt.GradtapeError, match="expand"):
        h.nutpie_expand()  # (a function of two results has none)


def test_entry_points_are_not_compiled_by_numba():
    """The entry points call the compiled kernels through their addresses: building them
    compiles no Numba function (the kernels were compiled once, with their signatures)."""
    from numba.core import compiler

    def f(x):
        return np.sum(np.cos(x) * DESIGN[:4, 0]) + np.sum(x**4)

    h = gt.compile(gt.value_and_grad(f)).as_native(np.zeros(4))
    assert h.cfunc.address  # the kernels first
    compiled = []
    original = compiler.compile_extra

    def counting(*args, **kwargs):
        compiled.append(args[2] if len(args) > 2 else kwargs.get("func"))
        return original(*args, **kwargs)

    from gradtape.compile.numba import export_runtime

    module = h._module
    compiler.compile_extra = counting
    try:  # the entry points again, around the kernels compiled above
        library = export_runtime.build_entries(module.plan, module.kernels, ())
    finally:
        compiler.compile_extra = original
    assert compiled == []
    x = np.linspace(-1.0, 1.0, 4)
    value, grad = np.empty(1), np.empty(4)
    assert _c_call(library.addresses["c_entry"], 4, x, value, grad, h.data_address) == 0
    expected_value, expected_grad = gt.value_and_grad(f)(x)
    np.testing.assert_allclose(value[0], expected_value, rtol=1e-13)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-12)


_SCRIPT = textwrap.dedent(
    """
    import json, numpy as np, gradtape as gt
    from gradtape.compile.numba import cache
    w = np.linspace(0.5, 1.5, 6)
    def f(x):
        return np.sum(w * np.logaddexp(0.0, x)) - 0.5 * np.sum(x ** 2)
    h = gt.compile(gt.value_and_grad(f)).as_native(np.zeros(6))
    x = np.linspace(-1, 1, 6)
    v, g = h(x)
    ev, eg = gt.value_and_grad(f)(x)
    assert abs(v - ev) < 1e-12 and np.allclose(g, eg, rtol=1e-12), (v, ev)
    m = h._module
    print(json.dumps({"from_cache": h.from_cache, "corrupt": len(cache.corrupt_files),
                      "kernels_cached": m.from_cache, "entries_cached": m.entries_from_cache,
                      "stale_entries": m.stale_entries,
                      "kernel_seconds": h.kernel_seconds, "entry_seconds": h.entry_seconds}))
    """
)


def _run(cache_dir: Path) -> dict:
    import json

    env = dict(os.environ, GRADTAPE_CACHE_DIR=str(cache_dir), GRADTAPE_CACHE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(gt.__file__).parents[1])] + sys.path)
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_cold_build_then_cache_then_corrupted_or_stale_cached_code_is_rebuilt(tmp_path: Path):
    cold = _run(tmp_path)  # an empty cache: the kernels compiled, the entry points written
    assert cold["from_cache"] is False and cold["corrupt"] == 0
    assert cold["kernel_seconds"] > 0 and cold["entry_seconds"] > 0
    warm = _run(tmp_path)  # kernels and entry points loaded: nothing compiled
    assert warm["from_cache"] is True and warm["corrupt"] == 0
    pycache = tmp_path / "kernels" / "__pycache__"
    (entries,) = pycache.glob("*.nbe")

    _damage(entries)  # a damaged entry point: detected by its checksum, written again
    damaged = _run(tmp_path)
    assert damaged["kernels_cached"] is True and damaged["entries_cached"] is False
    assert damaged["corrupt"] == 1
    assert _run(tmp_path)["from_cache"] is True

    (entries,) = pycache.glob("*.nbe")  # a stale one (another version's): written again
    identity, serialized = pickle.loads(export.cache.unframe(entries.read_bytes()))
    identity = dict(identity, numba="0.0.0")
    entries.write_bytes(export.cache.frame(pickle.dumps((identity, serialized), -1)))
    stale = _run(tmp_path)
    assert stale["entries_cached"] is False and stale["stale_entries"] is True
    assert stale["corrupt"] == 0
    assert _run(tmp_path)["from_cache"] is True

    for path in [*pycache.glob("*.nbi"), *pycache.glob("*.nbc")]:  # damaged kernel files
        _damage(path)
    damaged = _run(tmp_path)  # compiled again; the entry points link to them by symbol
    assert damaged["kernels_cached"] is False  # (written again if the symbols changed)
    assert damaged["corrupt"] > 0
    assert _run(tmp_path)["from_cache"] is True

    for index in pycache.glob("*.nbi"):  # kernel indexes of another module text
        payload = export.cache.unframe(index.read_bytes())
        stream = io.BytesIO(payload)
        version = pickle.load(stream)
        _stamp, overloads = pickle.loads(stream.read())
        other = pickle.dumps(version, protocol=-1) + pickle.dumps(("stale", overloads), -1)
        index.write_bytes(export.cache.frame(other))
    stale = _run(tmp_path)  # not loaded: compiled again, right numbers
    assert stale["kernels_cached"] is False and stale["corrupt"] == 0
    assert _run(tmp_path)["from_cache"] is True

    (module,) = (tmp_path / "kernels").glob("k_x*.py")  # a truncated module text
    module.write_text(module.read_text()[:200])
    again = _run(tmp_path)  # written again (the cached code is keyed by the text: it serves)
    assert module.read_text().startswith("# generated by gradtape")
    assert again["from_cache"] is True
