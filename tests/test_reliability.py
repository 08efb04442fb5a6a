"""Reliability of the runtime: the kernel cache's trust and checksums, pickling of transformed
and compiled functions, and the errors a user's mistakes get.

Native tests compile Numba kernels (in this process or in a child process started with a
private cache directory); the rest run in the fast tier.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba import cache

SRC = str(Path(gt.__file__).resolve().parent.parent)


# --- module-level functions: what pickling ships by reference -------------------------------------
def loss(x):
    return np.sum(np.sin(x) * x**2)


def loss_grad_exact(x):
    return np.cos(x) * x**2 + 2 * x * np.sin(x)


def weighted(x, w):
    return np.sum(w * np.exp(x))


@gt.grad
def decorated_grad(x):
    return np.sum(x**3)


compiled_vg = gt.compile(gt.value_and_grad(loss))
compiled_grad = gt.compile(gt.grad(weighted, argnums=(0, 1)), backend="numpy")


def _grad_in_child(x):
    return gt.grad(loss)(x)


def _compiled_in_child(x):
    return compiled_vg(x)


# --- the kernel cache: where it is and whom it trusts ---------------------------------------------
@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A cache directory of this test; the once-per-process warnings reset."""
    if numba_backend.available():
        numba_backend.wait_for_kernels(300)
    monkeypatch.setattr(cache, "_override", [tmp_path / "cache"])
    monkeypatch.setattr(cache, "_warned", set())
    return tmp_path / "cache"


def test_the_cache_directory_is_created_private(private_cache):
    directory = cache.kernel_dir()
    assert directory == private_cache / "kernels"
    for path in (private_cache, directory, directory / "__pycache__"):
        assert path.stat().st_mode & 0o777 == 0o700


def test_a_cache_directory_others_may_write_to_is_refused_once(private_cache):
    private_cache.mkdir()
    private_cache.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="writable by other users.*compiled in memory"):
        assert cache.kernel_dir() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: no second warning
        assert cache.kernel_dir() is None


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs chown")
def test_a_cache_directory_of_another_user_is_refused(private_cache):
    private_cache.mkdir(mode=0o700)
    os.chown(private_cache, 12345, 12345)
    with pytest.warns(RuntimeWarning, match="belongs to another user"):
        assert cache.kernel_dir() is None


def test_an_owners_loose_directory_is_narrowed_to_owner_only(private_cache):
    private_cache.mkdir()
    private_cache.chmod(0o755)
    assert cache.kernel_dir() is not None
    assert private_cache.stat().st_mode & 0o777 == 0o700


def test_an_unwritable_cache_directory_means_compiling_in_memory(private_cache, monkeypatch):
    cache.kernel_dir()

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cache.tempfile, "TemporaryFile", read_only)
    with pytest.warns(RuntimeWarning, match="cannot be used.*Read-only.*compiled in memory"):
        assert cache.kernel_dir() is None


# --- checksums of Numba's cache files -------------------------------------------------------------
def test_a_checksummed_payload_round_trips_and_any_damage_is_detected():
    payload = pickle.dumps({"kernel": b"\x00\x01" * 1000})
    framed = cache.frame(payload)
    assert cache.unframe(framed) == payload
    assert cache.unframe(payload) is None  # not checksummed (another version's file)
    assert cache.unframe(framed[:-1]) is None  # truncated
    assert cache.unframe(framed[: len(cache.CHECKSUM_MAGIC) + 5]) is None
    flipped = bytearray(framed)
    flipped[-100] ^= 0x01
    assert cache.unframe(bytes(flipped)) is None
    zeroed = bytearray(framed)
    zeroed[len(cache.CHECKSUM_MAGIC) + 40 : len(cache.CHECKSUM_MAGIC) + 1000] = bytes(960)
    assert cache.unframe(bytes(zeroed)) is None


def test_a_damaged_file_is_deleted_and_reported_as_missing(private_cache, tmp_path):
    path = tmp_path / "k_x.kernel0-1.py311.1.nbc"
    path.write_bytes(cache.frame(b"payload")[:-3])
    with pytest.warns(RuntimeWarning, match="failed its checksum"):
        with pytest.raises(FileNotFoundError):
            cache._read_verified(str(path))
    assert not path.exists() and str(path) in cache.corrupt_files


# --- a child process: NUMBA_CACHE_DIR, damaged files, the cache loaded ----------------------------
CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    import gradtape as gt
    from gradtape.compile.numba import cache
    warnings.simplefilter("always")
    def f(x):
        return np.sum(np.sin(x) * x ** 2)
    g = gt.compile(gt.value_and_grad(f), backend="numba")
    x = np.linspace(0.0, 1.0, 7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, grad = g(x)
    expected = np.cos(x) * x ** 2 + 2 * x * np.sin(x)
    print(json.dumps({
        "error": float(np.abs(grad - expected).max() + abs(value - f(x))),
        "from_cache": bool(g.lowered(x).native.from_cache),
        "tier": g.lowered(x).tier,
        "corrupt": len(getattr(cache, "corrupt_files", ())),
        "warnings": [str(w.message) for w in caught],
    }))
    """
)


def run_child(env_extra: dict, timeout: float = 300) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADTAPE_", "NUMBA_"))}
    env.update(PYTHONPATH=SRC, **env_extra)
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def numba_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.suffix in (".nbi", ".nbc"))


@pytest.mark.native
def test_numba_cache_dir_is_never_read_nor_written_for_kernels(tmp_path):
    planted, own = tmp_path / "shared", tmp_path / "own"
    planted.mkdir()
    env = {"NUMBA_CACHE_DIR": str(planted), "GRADTAPE_CACHE_DIR": str(own), "GRADTAPE_LLVM": "0"}
    first = run_child(env)
    assert first["error"] < 1e-12 and first["tier"] == "native"
    assert numba_files(planted) == []  # nothing written where others may plant files
    ours = numba_files(own)
    assert ours, "the kernel is cached in gradtape's own directory"
    # plant, where Numba's own locator would look, files that run code when unpickled
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    from numba.core.caching import _CacheLocator

    kernel_module = next((own / "kernels").glob("k_*.py"))
    subdir = planted / _CacheLocator.get_suitable_cache_subpath(str(kernel_module))
    subdir.mkdir(parents=True)
    for path in ours:
        (subdir / path.name).write_bytes(pickle.dumps(Payload()))
    second = run_child(env)
    assert second["error"] < 1e-12 and second["from_cache"]
    assert not marker.exists()


@pytest.mark.native
@pytest.mark.parametrize("damage", ["zeroed page", "flipped bytes", "truncated", "empty index"])
def test_a_damaged_cached_kernel_is_detected_discarded_and_compiled_again(tmp_path, damage):
    env = {"GRADTAPE_CACHE_DIR": str(tmp_path), "GRADTAPE_LLVM": "0"}  # (Numba's files)
    assert run_child(env)["error"] < 1e-12
    data = next(p for p in numba_files(tmp_path) if p.suffix == ".nbc")
    index = next(p for p in numba_files(tmp_path) if p.suffix == ".nbi")
    raw = bytearray(data.read_bytes())
    if damage == "zeroed page":  # (a page, or what there is of it after the header)
        start = len(cache.CHECKSUM_MAGIC) + 32 + len(raw) // 4
        raw[start : start + 4096] = bytes(len(raw[start : start + 4096]))
        data.write_bytes(bytes(raw))
    elif damage == "flipped bytes":
        for i in range(200, len(raw), 997):
            raw[i] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "truncated":
        data.write_bytes(bytes(raw[: len(raw) // 2]))
    else:
        index.write_bytes(b"")
    result = run_child(env)
    assert result["error"] < 1e-12 and result["tier"] == "native"
    assert not result["from_cache"] and result["corrupt"] == 1
    assert any("failed its checksum" in w for w in result["warnings"])
    again = run_child(env)  # rewritten: loads cleanly
    assert again["from_cache"] and again["corrupt"] == 0 and again["error"] < 1e-12


@pytest.mark.native
def test_a_read_only_cache_directory_still_gives_native_code(private_cache, monkeypatch):
    """A cache this process cannot write (simulated: root may write anywhere): one warning,
    and the kernels are compiled in memory."""
    monkeypatch.setattr(numba_backend, "_REGISTRY", type(numba_backend._REGISTRY)())
    cache.kernel_dir()

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cache.tempfile, "TemporaryFile", read_only)

    def f(x):
        return np.sum(np.arcsinh(x) * x) * 1.75

    compiled = gt.compile(gt.grad(f), backend="numba")
    x = np.linspace(-1.0, 1.0, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = compiled(x)
        compiled(x + 1)
    np.testing.assert_allclose(got, 1.75 * (np.arcsinh(x) + x / np.sqrt(1 + x * x)), rtol=1e-12)
    assert compiled.lowered(x).tier == "native"
    unusable = [w for w in caught if "cannot be used" in str(w.message)]
    assert len(unusable) == 1 and "compiled in memory" in str(unusable[0].message)
    assert not list((private_cache / "kernels").glob("k_*.py"))


# --- pickling -------------------------------------------------------------------------------------
def test_grad_and_value_and_grad_pickle_by_reference_to_the_user_function():
    x = np.linspace(-1.0, 2.0, 5)
    for made in (
        gt.grad(loss),
        gt.value_and_grad(loss),
        gt.grad(weighted, argnums=(0, 1)),
    ):
        text = pickle.dumps(made)
        assert b"loss" in text or b"weighted" in text
        back = pickle.loads(text)
        args = (x,) if "weighted" not in made.__qualname__ else (x, x + 1)
        np.testing.assert_allclose(_flat(back(*args)), _flat(made(*args)), rtol=0, atol=0)
    second = pickle.loads(pickle.dumps(gt.grad(gt.grad(cube))))
    assert second(2.0) == 12.0
    assert pickle.loads(pickle.dumps(decorated_grad)) is decorated_grad
    np.testing.assert_allclose(decorated_grad(x), 3 * x**2)


def cube(x):
    return x**3


def _flat(result):
    import itertools

    if isinstance(result, tuple):
        return np.concatenate([np.ravel(r) for r in itertools.chain(result)])
    return np.ravel(result)


def test_compiled_transforms_pickle_and_record_again_on_the_other_side():
    x = np.linspace(-1.0, 2.0, 5)
    value, grad = compiled_vg(x)
    back = pickle.loads(pickle.dumps(compiled_vg))
    v1, g1 = back(x)
    assert v1 == value and np.array_equal(g1, grad)
    fresh = pickle.loads(pickle.dumps(gt.compile(gt.value_and_grad(loss), backend="numpy")))
    v2, g2 = fresh(x)
    assert v2 == value and np.array_equal(g2, grad) and fresh.stats["recordings"] == 1
    gw = pickle.loads(pickle.dumps(gt.compile(gt.grad(weighted, argnums=(0, 1)))))
    gx, gwt = gw(x, x + 1)
    np.testing.assert_allclose(gx, (x + 1) * np.exp(x))
    np.testing.assert_allclose(gwt, np.exp(x))


def test_a_closure_says_it_cannot_be_pickled():
    scale = 3.0
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pickle.dumps(gt.grad(lambda x: scale * np.sum(x)))


def test_a_transformed_function_read_by_a_loop_body_keys_the_reused_body():
    from gradtape.control import loops

    g = gt.grad(loss)

    def step(i, x):
        return x - 0.1 * g(x)

    first, again = loops._BodyState(step), loops._BodyState(step)
    assert first.key == again.key and hash(first.key) == hash(again.key)
    other = gt.grad(weighted)

    def other_step(i, x):
        return x - 0.1 * other(x, x)

    assert loops._BodyState(other_step).key != first.key
    x0 = np.linspace(0.1, 1.0, 4)
    x = x0.copy()
    for _ in range(5):
        x = x - 0.1 * loss_grad_exact(x)
    np.testing.assert_allclose(gt.fori_loop(0, 5, step, x0), x, rtol=1e-12)


def test_spawned_pool_map_runs_grad_and_compiled_functions():
    xs = [np.linspace(0.0, 1.0, 4) + k for k in range(4)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        grads = pool.map(gt.grad(loss), xs)
        pairs = pool.map(compiled_vg, xs)
        via_function = pool.map(_compiled_in_child, xs[:2])
    for x, g, (v, g2) in zip(xs, grads, pairs):
        np.testing.assert_allclose(g, loss_grad_exact(x), rtol=1e-12)
        np.testing.assert_allclose(g2, loss_grad_exact(x), rtol=1e-12)
        np.testing.assert_allclose(v, loss(x), rtol=1e-12)
    np.testing.assert_allclose(via_function[1][1], loss_grad_exact(xs[1]), rtol=1e-12)


# --- clear errors ---------------------------------------------------------------------------------
THIS_FILE = os.path.basename(__file__)


def test_grad_of_none_names_the_argument_and_the_line():
    with pytest.raises(gt.GradtapeError, match=rf"argument 0 is None \(at {THIS_FILE}:\d+"):
        gt.grad(loss)(None)
    with pytest.raises(gt.GradtapeError, match="argument 1 is None"):
        gt.grad(weighted, argnums=1)(np.ones(2), None)


def test_a_list_argument_explains_containers_and_points_at_the_failing_line():
    with pytest.raises(gt.GradtapeError, match=r"list of numbers.*np\.array\(x\)") as info:
        gt.grad(loss)([1.0, 2.0])
    assert "return np.sum(np.sin(x) * x**2)" in str(info.value)
    assert isinstance(info.value.__cause__, TypeError)
    # a function written for lists still works (a list is a pytree, as in JAX)
    assert gt.grad(lambda xs: xs[0] * xs[1])([2.0, 3.0]) == [3.0, 2.0]


@pytest.mark.parametrize("argnums", ["x", 1.5, (0, 0), [0, "a"], True, None])
def test_bad_argnums_are_refused_when_the_transform_is_made(argnums):
    with pytest.raises(gt.GradtapeError, match=re.escape(f"argnums={argnums!r}")) as info:
        gt.grad(loss, argnums=argnums)
    assert THIS_FILE in str(info.value)


@pytest.mark.parametrize(
    "transform",
    [gt.grad, gt.value_and_grad, gt.jacobian, gt.jacfwd, gt.jacrev, gt.hessian, gt.compile],
)
def test_a_transform_of_something_that_is_not_a_function(transform):
    with pytest.raises(gt.GradtapeError, match=r"expect.*function.*\(f\)\(x\)") as info:
        transform(loss(np.ones(3)))
    assert THIS_FILE in str(info.value)


def test_np_matrix_inputs_are_refused_with_what_to_do():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        m = np.matrix([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(gt.GradtapeError, match=r"numpy\.matrix.*np\.asarray\(x\).*@"):
        gt.grad(loss)(m)
    with pytest.raises(gt.GradtapeError, match=r"numpy\.matrix.*np\.asarray\(x\)"):
        gt.compile(loss)(m)
    with pytest.raises(gt.GradtapeError, match=r"numpy\.matrix"):
        gt.jvp(loss, (m,), (m,))


def scaled_by_exp(x, s):
    return np.sum(x) * math.exp(s)


def test_math_exp_of_a_compiled_float_argument_says_static_argnums():
    x = np.ones(3)
    for compiled in (gt.compile(scaled_by_exp), gt.compile(gt.grad(scaled_by_exp))):
        with pytest.raises(gt.GradtapeError, match="static_argnums") as info:
            compiled(x, 0.5)
        assert "math.exp(s)" in str(info.value) and THIS_FILE in str(info.value)
        assert "stop_gradient" not in str(info.value)
    fixed = gt.compile(gt.grad(scaled_by_exp), static_argnums=1)
    np.testing.assert_allclose(fixed(x, 0.5), np.full(3, math.exp(0.5)))
    # a differentiated value still gets the gradient advice
    with pytest.raises(gt.GradtapeError, match="cut the gradient"):
        gt.grad(lambda x: math.exp(x[0]))(x)


def unique_sum(x):
    return np.sum(np.unique(x)) + x.size


@pytest.mark.parametrize(
    "backend", ["numpy", pytest.param("numba", marks=pytest.mark.native), "auto"]
)
def test_compile_without_a_gradient_runs_np_unique(backend):
    x = np.array([3.0, 1.0, 3.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", numba_backend.NativeFallbackWarning)
        f = gt.compile(unique_sum, backend=backend)
        assert f(x) == 10.0 and f(np.array([5.0, 5.0, 5.0, 5.0])) == 9.0
        assert f(np.array([4.0, 1.0, 2.0, 3.0])) == 14.0


# --- threads ---------------------------------------------------------------------------------
def branchy(x):
    if np.sum(x) > 10.0:  # a guard: inputs of both sides record two variants
        return np.sum(np.sin(x) * x)
    return np.sum(np.exp(-x) * x**2)


def test_eight_threads_share_a_compiled_function_while_variants_are_recorded():
    from conftest import disagreements_across_threads

    compiled = gt.compile(gt.value_and_grad(branchy), backend="numpy")
    eager = gt.value_and_grad(branchy)

    def agree(got, expected):
        if not (np.isclose(got[0], expected[0], rtol=1e-12) and np.allclose(got[1], expected[1])):
            return f"{got} != {expected}"
        return None

    assert disagreements_across_threads(compiled, eager, agree, threads=8, calls=50) == []
    assert compiled.stats["variants"] == 2


# --- the data stack: pandas and xarray ------------------------------------------------------------
def test_pandas_series_and_dataframes_are_differentiated_with_their_labels_kept():
    pd = pytest.importorskip("pandas")
    s = pd.Series([0.5, 1.0, 2.0], index=["a", "b", "c"], name="w")
    g = gt.grad(loss)(s)
    assert isinstance(g, pd.Series) and list(g.index) == ["a", "b", "c"] and g.name == "w"
    np.testing.assert_allclose(g.to_numpy(), loss_grad_exact(s.to_numpy()))
    df = pd.DataFrame({"p": [0.1, 0.2], "q": [0.3, 0.4]}, index=[10, 20])
    value, gd = gt.value_and_grad(loss)(df)
    assert isinstance(gd, pd.DataFrame) and list(gd.columns) == ["p", "q"]
    assert list(gd.index) == [10, 20]
    np.testing.assert_allclose(gd.to_numpy(), loss_grad_exact(df.to_numpy()))
    np.testing.assert_allclose(value, loss(df.to_numpy()))
    # a column of a frame
    np.testing.assert_allclose(gt.grad(loss)(df["q"]).to_numpy(), loss_grad_exact(df["q"]))
    mixed = pd.DataFrame({"p": [0.1, 0.2], "name": ["a", "b"]})
    with pytest.raises(gt.GradtapeError, match=r"to_numpy\(dtype=float\)"):
        gt.grad(loss)(mixed)
    with pytest.raises(gt.GradtapeError, match=r"pandas Series.*to_numpy\(\)"):
        gt.compile(loss)(s)


def test_xarray_dataarrays_are_differentiated_with_their_coordinates_kept():
    xr = pytest.importorskip("xarray")
    da = xr.DataArray(
        np.linspace(0.1, 1.0, 6).reshape(2, 3),
        dims=("t", "k"),
        coords={"t": [0, 1], "k": ["a", "b", "c"]},
        name="field",
    )
    g = gt.grad(loss)(da)
    assert isinstance(g, xr.DataArray) and g.dims == ("t", "k") and g.name == "field"
    assert list(g.coords["k"].values) == ["a", "b", "c"]
    np.testing.assert_allclose(g.to_numpy(), loss_grad_exact(da.to_numpy()))
    # a function of two DataArrays gets arrays (no alignment by dimension name)
    other = xr.DataArray(np.ones(3), dims=("k",))
    gx, gw = gt.grad(weighted, argnums=(0, 1))(other, other * 2)
    np.testing.assert_allclose(gx.to_numpy(), 2 * np.e * np.ones(3))
    with pytest.raises(gt.GradtapeError, match="Dataset"):
        gt.grad(loss)(da.to_dataset())
    with pytest.raises(gt.GradtapeError, match=r"xarray DataArray.*to_numpy\(\)"):
        gt.compile(loss)(da)
