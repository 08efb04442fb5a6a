"""Native handles (`CompiledFunction.as_native`): the Numba function and the C entry point give
the compiled function's numbers; statuses report another path, NaN/inf, wrong sizes and bad
data; what cannot be exported is refused by name; a second process loads the entry points
from the disk cache."""

from __future__ import annotations

import ctypes
import os
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
from gradtape.compile.numba import export
from gradtape.core.errors import GradtapeError

RNG = np.random.default_rng(20261125)
DESIGN = RNG.normal(size=(60, 4))
DESIGN.flags.writeable = False  # read-only data is bound in place (writable: one snapshot)
LABELS = (RNG.random(60) < 0.4).astype(np.float64)
DOUBLE_P = ctypes.POINTER(ctypes.c_double)

needs_numba = pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed")
native = [pytest.mark.native, needs_numba]


def logistic_logp(beta):
    eta = DESIGN @ beta
    return np.sum(LABELS * eta - np.logaddexp(0.0, eta)) - 0.5 * np.sum(beta**2)


def call_c(handle, x, data_address=None, n=None):
    """Call the C entry point through ctypes; returns (status, value, grad)."""
    x = np.ascontiguousarray(x, np.float64).reshape(-1)
    value = np.full(handle.value_size, -7.0)
    grad = np.full(max(handle.grad_size, 1), -7.0)
    status = handle.ctypes_function(
        handle.n if n is None else n,
        x.ctypes.data_as(DOUBLE_P),
        value.ctypes.data_as(DOUBLE_P),
        grad.ctypes.data_as(DOUBLE_P),
        ctypes.c_void_p(handle.data_address if data_address is None else data_address),
    )
    return status, value, grad[: handle.grad_size]


@pytest.fixture(scope="module")
def logistic_handle():
    vg = gt.compile(gt.value_and_grad(logistic_logp))
    return vg.as_native(np.zeros(4))


@pytest.mark.native
@needs_numba
def test_value_and_grad_through_python_numba_and_ctypes(logistic_handle):
    import numba

    h = logistic_handle
    assert (h.n, h.value_size, h.grad_size) == (4, 1, 4)
    beta = np.array([0.3, -0.2, 0.5, 0.1])
    expected_value, expected_grad = gt.value_and_grad(logistic_logp)(beta)
    value, grad = h(beta)
    np.testing.assert_allclose(value, expected_value, rtol=1e-13)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-12, atol=1e-13)

    status, v, g = call_c(h, beta)
    assert status == export.STATUS_OK
    np.testing.assert_allclose(v[0], expected_value, rtol=1e-13)
    np.testing.assert_allclose(g, expected_grad, rtol=1e-12, atol=1e-13)

    core = h.numba

    @numba.njit
    def gradient_ascent(x, data, steps):
        value = np.empty(1)
        grad = np.empty(x.size)
        for _ in range(steps):
            status = core(x, value, grad, data)
            if status != 0:
                return x, value[0], status
            x = x + 0.01 * grad
        return x, value[0], 0

    x, last, status = gradient_ascent(beta.copy(), h.data, 50)
    assert status == 0
    # the same loop in Python on the eager gradient
    y = beta.copy()
    for _ in range(50):
        val, gr = gt.value_and_grad(logistic_logp)(y)
        y = y + 0.01 * gr
    np.testing.assert_allclose(x, y, rtol=1e-10)
    np.testing.assert_allclose(last, gt.value_and_grad(logistic_logp)(x - 0.0)[0], rtol=1e-6)


@pytest.mark.native
@needs_numba
def test_closed_over_arrays_are_bound_without_a_copy(logistic_handle):
    h = logistic_handle
    # a design matrix of few columns is bound as its columns, copied once when the kernel is
    # generated (the products then read contiguous streams); never copied per call
    columns = [c for c in h.constants if c.shape == DESIGN.T.shape and np.array_equal(c, DESIGN.T)]
    assert any(c is DESIGN or np.shares_memory(c, DESIGN) for c in h.constants) or columns
    assert h.data[1:].tolist() == [c.ctypes.data for c in h.constants]
    before = h.data.copy()
    h(np.ones(4))
    assert h.data.tolist() == before.tolist()


@pytest.mark.native
@needs_numba
@settings(max_examples=8, deadline=None)
@given(shape=st.sampled_from([(), (1,), (5,), (2, 3), (3, 1, 2)]), seed=st.integers(0, 2**16))
def test_shapes_of_x_agree_with_the_compiled_function(shape, seed):
    weights = np.random.default_rng(seed).normal(size=shape)

    def f(x):  # (np.sum of a 0-d value is native code too: exportable)
        return np.sum(np.sin(x) * weights) + np.sum(x**2) ** 0.5

    x = np.random.default_rng(seed + 1).normal(size=shape) + 2.0
    h = gt.compile(gt.value_and_grad(f)).as_native(x)
    value, grad = h(x)
    expected_value, expected_grad = gt.value_and_grad(f)(x)
    np.testing.assert_allclose(value, expected_value, rtol=1e-12)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-11, atol=1e-14)
    assert np.shape(grad) == shape
    status, v, g = call_c(h, x)
    assert status == 0
    np.testing.assert_allclose(g, np.reshape(expected_grad, -1), rtol=1e-11, atol=1e-14)


@pytest.mark.native
@needs_numba
def test_grad_and_plain_functions():
    def f(x):
        return np.sum(np.exp(0.1 * x) * x)

    x = np.linspace(-1.0, 2.0, 7)
    hg = gt.compile(gt.grad(f)).as_native(x)
    assert (hg.value_size, hg.grad_size) == (7, 0)
    np.testing.assert_allclose(hg(x), gt.grad(f)(x), rtol=1e-12)
    status, v, _ = call_c(hg, x)
    assert status == 0
    np.testing.assert_allclose(v, gt.grad(f)(x), rtol=1e-12)

    def two_results(x):
        return np.tanh(x), np.sum(x**3)

    hp = gt.compile(two_results).as_native(x)
    a, b = hp(x)
    np.testing.assert_allclose(a, np.tanh(x), rtol=1e-14)
    np.testing.assert_allclose(b, np.sum(x**3), rtol=1e-14)

    identity = gt.compile(lambda x: x * 1.0).as_native(x)
    np.testing.assert_array_equal(identity(x), x)


@pytest.mark.native
@needs_numba
def test_blas_matrix_products_work_through_the_handle():
    a = RNG.normal(size=(48, 48))

    def f(x):
        m = x.reshape(48, 48)
        return np.sum(np.tanh(a @ m @ a))

    x = RNG.normal(size=48 * 48) * 0.1
    h = gt.compile(gt.value_and_grad(f)).as_native(x)
    value, grad = h(x)
    expected_value, expected_grad = gt.value_and_grad(f)(x)
    np.testing.assert_allclose(value, expected_value, rtol=1e-11)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.native
@needs_numba
def test_another_path_is_a_negative_status_never_a_number():
    def f(x):
        if x[0] > 0:
            return np.sum(x**2)
        return np.sum(x**3)

    h = gt.compile(gt.value_and_grad(f)).as_native(np.array([1.0, 2.0]))
    np.testing.assert_allclose(h(np.array([3.0, 1.0]))[0], 10.0)
    status, value, grad = call_c(h, np.array([-3.0, 1.0]))
    assert status == export.STATUS_OTHER_PATH < 0
    with pytest.raises(GradtapeError, match="another path"):
        h(np.array([-3.0, 1.0]))


@pytest.mark.native
@needs_numba
def test_nan_and_inf_are_a_positive_status():
    h = gt.compile(gt.value_and_grad(lambda x: np.sum(np.log(x)))).as_native(np.ones(3))
    status, value, grad = call_c(h, np.array([1.0, -1.0, 2.0]))
    assert status == export.STATUS_NONFINITE > 0
    assert np.isnan(value[0])
    status, value, grad = call_c(h, np.array([1.0, 0.0, 2.0]))
    assert status == export.STATUS_NONFINITE
    value, grad = h(np.array([1.0, 0.0, 2.0]))  # Python: the numbers, as compile returns them
    assert value == -np.inf and grad[1] == np.inf


@pytest.mark.native
@needs_numba
def test_wrong_sizes_layouts_and_data_are_refused(logistic_handle):
    h = logistic_handle
    status, _, _ = call_c(h, np.zeros(4), n=5)
    assert status == export.STATUS_WRONG_SIZE
    status, _, _ = call_c(h, np.zeros(4), data_address=0)
    assert status == export.STATUS_BAD_DATA
    other = gt.compile(gt.value_and_grad(lambda x: np.sum((x - DESIGN[0]) ** 2))).as_native(
        np.zeros(4)
    )
    status, _, _ = call_c(h, np.zeros(4), data_address=other.data_address)
    assert status == export.STATUS_BAD_DATA
    with pytest.raises(GradtapeError, match="5 elements"):
        h(np.zeros(5))
    with pytest.raises(GradtapeError, match="C-contiguous"):
        h(np.zeros(8)[::2])
    with pytest.raises(GradtapeError, match="float64"):
        h(np.zeros(4, np.float32))
    value = np.empty(1)
    assert h.numba(np.zeros(4), value, np.empty(3), h.data) == export.STATUS_WRONG_SIZE
    for status in (0, 3, -1, -2, -3, -4):
        assert export.status_message(status)


def test_what_cannot_be_exported_is_named():
    if not numba_backend.available():
        pytest.skip("Numba is not installed")

    def with_scan(x):
        carry, _ = gt.scan(lambda c, xi: (c * 0.5 + xi, c), 0.0, x)
        return carry

    with pytest.raises(GradtapeError, match="'scan'"):
        gt.compile(with_scan).as_native(np.ones(5))
    with pytest.raises(GradtapeError, match="'argsort'"):
        gt.compile(lambda x: x[np.argsort(x)] * 2.0).as_native(np.ones(5))
    with pytest.raises(GradtapeError, match="2 traced arguments"):
        gt.compile(lambda x, y: np.sum(x * y)).as_native(np.ones(3), np.ones(3))
    with pytest.raises(GradtapeError, match="float32"):
        gt.compile(lambda x: x.astype(np.float32)).as_native(np.ones(3))
    with pytest.raises(GradtapeError, match="3 results"):
        gt.compile(lambda x: (x, x * 2, x * 3)).as_native(np.ones(3))
    with pytest.raises(GradtapeError, match="int64"):
        gt.compile(lambda x: np.sum(x)).as_native(np.ones(3, np.int64))


@pytest.mark.native
@needs_numba
def test_a_second_process_loads_the_handle_from_the_disk_cache(tmp_path: Path):
    script = textwrap.dedent(
        """
        import numpy as np, gradtape as gt
        w = np.linspace(0.5, 1.5, 6)
        def f(x):
            return np.sum(w * np.logaddexp(0.0, x)) - 0.5 * np.sum(x ** 2)
        h = gt.compile(gt.value_and_grad(f)).as_native(np.zeros(6))
        h.cfunc
        h.numba
        x = np.linspace(-1, 1, 6)
        v, g = h(x)
        ev, eg = gt.value_and_grad(f)(x)
        assert abs(v - ev) < 1e-12 and np.allclose(g, eg, rtol=1e-12)
        print(h.from_cache)
        """
    )
    env = dict(os.environ, GRADTAPE_CACHE_DIR=str(tmp_path), GRADTAPE_CACHE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(gt.__file__).parents[1])] + sys.path)
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout.split()[-1] == "False"
    assert runs[1].stdout.split()[-1] == "True"


@pytest.mark.native
@needs_numba
def test_scipy_low_level_callable_wraps_the_entry_point(logistic_handle):
    scipy = pytest.importorskip("scipy")
    h = logistic_handle
    callable_ = scipy.LowLevelCallable(h.ctypes_function, ctypes.c_void_p(h.data_address))
    assert callable_.signature.startswith("int (")
    assert callable_.signature.count("double *") == 3 and "void *" in callable_.signature
    # the pointer it holds is the handle's entry point: calling that gives the Python numbers
    function = ctypes.cast(h.address, type(h.ctypes_function))
    x = np.array([0.1, -0.4, 0.2, 0.3])
    value, grad = np.empty(1), np.empty(4)
    status = function(
        4,
        x.ctypes.data_as(DOUBLE_P),
        value.ctypes.data_as(DOUBLE_P),
        grad.ctypes.data_as(DOUBLE_P),
        ctypes.c_void_p(h.data_address),
    )
    assert status == 0
    np.testing.assert_allclose(value[0], h(x)[0], rtol=1e-14)
