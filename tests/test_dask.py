"""gradtape.dask: value, gradient and hvp summed over row blocks, on a real LocalCluster."""

from __future__ import annotations

import importlib
import os
import sys
import time

import numpy as np
import pytest

import gradtape as gt
from gradtape.core.errors import GradtapeError

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
gtd = pytest.importorskip("gradtape.dask")


def logistic_loss(w, X, y):
    z = X @ w
    return np.sum(np.logaddexp(0.0, z) - y * z)


def ridge_loss(params, X, y, scale):
    r = X @ params["w"] + params["b"] - y
    return scale * np.sum(r * r) + np.sum(params["w"] ** 2)


@pytest.fixture(scope="module")
def client():
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 6))
    y = (rng.uniform(size=4000) < 0.3).astype(float)
    return X, y


def chunked(X, y, rows=500):
    return da.from_array(X, chunks=(rows, X.shape[1])), da.from_array(y, chunks=rows)


@pytest.mark.cluster
def test_value_grad_and_hvp_match_in_memory(client, data):
    X, y = data
    Xd, yd = chunked(X, y)
    w = np.linspace(-0.5, 0.5, 6)
    value, g = gtd.value_and_grad(logistic_loss, data_argnums=(1, 2), backend="numpy")(w, Xd, yd)
    value0, g0 = gt.value_and_grad(logistic_loss)(w, X, y)
    assert isinstance(value, float)
    np.testing.assert_allclose(value, value0, rtol=1e-12)
    np.testing.assert_allclose(g, g0, rtol=1e-10, atol=1e-10)
    g_only = gtd.grad(logistic_loss, data_argnums=(1, 2), backend="numpy")(w, Xd, yd)
    np.testing.assert_allclose(g_only, g0, rtol=1e-10, atol=1e-10)
    v = np.arange(6.0) - 2.0
    hv = gtd.hvp(logistic_loss, data_argnums=(1, 2), backend="numpy")(w, v, Xd, yd)
    np.testing.assert_allclose(hv, gt.hessian(logistic_loss)(w, X, y) @ v, rtol=1e-9, atol=1e-9)


@pytest.mark.cluster
def test_same_parameters_on_other_data_or_another_function_are_not_confused(client, data):
    # task keys are named once per call: they must differ with the data, the function and
    # the transform, not only with the parameters
    X, y = data
    Xd, yd = chunked(X, y)
    Xd2, yd2 = chunked(X[::-1].copy(), y)
    w = np.linspace(-0.5, 0.5, 6)
    vg = gtd.value_and_grad(logistic_loss, data_argnums=(1, 2), backend="numpy")
    first, second = vg(w, Xd, yd), vg(w, Xd2, yd2)
    np.testing.assert_allclose(first[1], gt.grad(logistic_loss)(w, X, y), rtol=1e-10)
    np.testing.assert_allclose(second[1], gt.grad(logistic_loss)(w, X[::-1], y), rtol=1e-10)
    squared = gtd.value_and_grad(
        lambda w, X, y: np.sum((X @ w - y) ** 2), data_argnums=(1, 2), backend="numpy"
    )
    np.testing.assert_allclose(squared(w, Xd, yd)[0], np.sum((X @ w - y) ** 2), rtol=1e-12)
    g_only = gtd.grad(logistic_loss, data_argnums=(1, 2), backend="numpy")(w, Xd, yd)
    np.testing.assert_allclose(g_only, first[1], rtol=1e-12)


@pytest.mark.cluster
def test_pytree_params_other_arguments_and_uneven_blocks(client, data):
    X, y = data
    Xd, yd = chunked(X, y, rows=(1000, 700, 1300, 1000))
    params = {"w": np.ones(6), "b": np.array(0.5)}
    vg = gtd.value_and_grad(ridge_loss, data_argnums=(1, 2), backend="numpy")
    value, g = vg(params, Xd, yd, 0.25)
    value0, g0 = gt.value_and_grad(ridge_loss)(params, X, y, 0.25)
    # the penalty sits inside the block loss, so it is counted once per block
    assert set(g) == {"w", "b"}
    blocks = 4
    np.testing.assert_allclose(value, value0 + (blocks - 1) * np.sum(params["w"] ** 2), rtol=1e-12)
    np.testing.assert_allclose(g["b"], g0["b"], rtol=1e-10)
    np.testing.assert_allclose(g["w"], g0["w"] + (blocks - 1) * 2 * params["w"], rtol=1e-10)


def test_numpy_data_count_as_one_block_or_split_like_dask_neighbours(data):
    X, y = data
    w = np.full(6, 0.1)
    vg = gtd.value_and_grad(logistic_loss, data_argnums=(1, 2), backend="numpy")
    value0, g0 = gt.value_and_grad(logistic_loss)(w, X, y)
    for args in ((X, y), (chunked(X, y)[0], y)):  # all NumPy; NumPy next to Dask
        value, g = vg(w, *args)
        np.testing.assert_allclose(value, value0, rtol=1e-12)
        np.testing.assert_allclose(g, g0, rtol=1e-10, atol=1e-10)


@pytest.mark.cluster
def test_lbfgs_converges_to_the_in_memory_solution(client, data):
    from scipy.optimize import minimize

    X, y = data
    Xd, yd = chunked(X, y)
    vg = gtd.value_and_grad(logistic_loss, data_argnums=(1, 2), backend="numpy")
    distributed_fit = minimize(vg, np.zeros(6), args=(Xd, yd), jac=True, method="L-BFGS-B")
    memory_fit = minimize(
        gt.value_and_grad(logistic_loss), np.zeros(6), args=(X, y), jac=True, method="L-BFGS-B"
    )
    assert distributed_fit.success and memory_fit.success
    np.testing.assert_allclose(distributed_fit.x, memory_fit.x, atol=1e-5)


@pytest.mark.cluster
def test_params_enter_the_graph_once_and_each_worker_compiles_once(client, data):
    X, y = data
    Xd, yd = chunked(X, y)
    w = np.full(6, 0.2)
    vg = gtd.value_and_grad(logistic_loss, data_argnums=(1, 2), backend="numpy")
    graph = dict(vg.lazy(w, Xd, yd).__dask_graph__())
    # one literal holds the shared arguments; every block task refers to its key
    shared = [k for k, t in graph.items() if _holds(t, w)]
    assert len(shared) == 1, shared
    client.run(_reset_compiled_cache)
    vg(w, Xd, yd)
    vg(w + 1.0, Xd, yd)
    counts = client.run(_compiled_calls)
    assert all(n <= 1 for n, _ in counts.values()), counts  # compiled once per worker
    assert sum(calls for _, calls in counts.values()) == 2 * Xd.numblocks[0]


def _holds(task, target) -> bool:
    value = getattr(task, "value", task)
    if value is target:
        return True
    if isinstance(value, (tuple, list)):
        return any(v is target for v in value)
    return False


def _reset_compiled_cache():
    import gradtape.dask

    gradtape.dask._COMPILED.clear()
    gradtape.dask._STATS.update(compiled=0, blocks=0)


def _compiled_calls():
    import gradtape.dask

    return gradtape.dask._STATS["compiled"], gradtape.dask._STATS["blocks"]


def test_bad_inputs_get_clear_errors(data):
    X, y = data
    Xd, yd = chunked(X, y)
    w = np.zeros(6)
    vg = gtd.value_and_grad(logistic_loss, data_argnums=(1, 2), backend="numpy")
    with pytest.raises(GradtapeError, match="row chunks differ"):
        vg(w, Xd, da.from_array(y, chunks=400))
    with pytest.raises(GradtapeError, match="other than 0"):
        vg(w, da.from_array(X, chunks=(500, 3)), yd)
    with pytest.raises(GradtapeError, match="is a list"):
        vg(w, Xd, list(y))
    with pytest.raises(GradtapeError, match="scalar output"):
        gtd.value_and_grad(lambda w, X: X @ w, data_argnums=1, backend="numpy")(w, Xd)
    with pytest.raises(GradtapeError, match="both argnums and data_argnums"):
        gtd.value_and_grad(logistic_loss, argnums=1, data_argnums=(1, 2))(w, Xd, yd)
    with pytest.raises(GradtapeError, match="called with 2 positional"):
        gtd.grad(logistic_loss, data_argnums=(1, 2))(w, Xd)
    with pytest.raises(GradtapeError, match="same rows|share their rows"):
        vg(w, Xd, y[:10])


def _slow_logistic_loss(w, X, y):
    time.sleep(1.0)  # runs while a worker records the block function, then never again
    return logistic_loss(w, X, y)


@pytest.mark.cluster
def test_a_killed_worker_is_survived(client, data):
    X, y = data
    Xd, yd = chunked(X, y)
    w = np.full(6, -0.3)
    vg = gtd.value_and_grad(_slow_logistic_loss, data_argnums=(1, 2), backend="numpy")
    future = client.compute(vg.lazy(w, Xd, yd))
    time.sleep(0.5)
    pid = next(iter(client.run(os.getpid).values()))
    os.kill(pid, 9)
    value, g = future.result(timeout=120)
    value0, g0 = gt.value_and_grad(logistic_loss)(w, X, y)
    np.testing.assert_allclose(value, value0, rtol=1e-12)
    np.testing.assert_allclose(g, g0, rtol=1e-10, atol=1e-10)
    client.wait_for_workers(2, timeout=60)


def _worker_killing_loss(w, X):
    os._exit(1)


@pytest.mark.cluster
def test_an_unrecoverable_cluster_raises_and_returns_no_partial_sum(data):
    import dask

    X, _ = data
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with (
            distributed.LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            distributed.Client(cluster),
        ):
            vg = gtd.value_and_grad(_worker_killing_loss, data_argnums=1, backend="numpy")
            with pytest.raises(GradtapeError, match="lost the workers"):
                vg(np.zeros(6), da.from_array(X, chunks=(1000, 6)))


def test_import_without_dask_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask", None)
    monkeypatch.delitem(sys.modules, "gradtape.dask")
    with pytest.raises(ImportError, match=r'pip install "gradtape\[dask\]"'):
        importlib.import_module("gradtape.dask")
    monkeypatch.undo()
    importlib.import_module("gradtape.dask")


@pytest.mark.cluster
@pytest.mark.native
def test_native_backend_on_the_workers(client, data):
    X, y = data
    Xd, yd = chunked(X, y)
    w = np.linspace(-1, 1, 6)
    value, g = gtd.value_and_grad(logistic_loss, data_argnums=(1, 2))(w, Xd, yd)
    value0, g0 = gt.value_and_grad(logistic_loss)(w, X, y)
    np.testing.assert_allclose(value, value0, rtol=1e-12)
    np.testing.assert_allclose(g, g0, rtol=1e-10, atol=1e-10)
