"""scipy.stats.gaussian_kde on traced values: SciPy's values, gradients in the points, the
data and the weights against central differences, forward against reverse mode, compiled
against eager, and the errors SciPy gives."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad, compile_backends
from hypothesis import given, settings
from hypothesis import strategies as st_

import gradtape as gt

st = pytest.importorskip("scipy.stats")


@settings(max_examples=20, deadline=None)
@given(
    d=st_.integers(1, 3),
    n=st_.integers(6, 12),  # more points than dimensions + 2: a regular covariance
    m=st_.integers(1, 4),
    bw=st_.sampled_from(["scott", "silverman", 0.4]),
    seed=st_.integers(0, 2**16),
)
def test_values_and_gradients_in_the_points(d, n, m, bw, seed):
    rng = np.random.default_rng(seed)
    data = rng.normal(size=(d, n)) if d > 1 else rng.normal(size=n)
    points = rng.normal(size=(d, m)) if d > 1 else rng.normal(size=m)
    kde = st.gaussian_kde(data, bw_method=bw)
    for method in ("logpdf", "pdf", "evaluate", "__call__"):

        def f(p):
            return np.sum(getattr(kde, method)(p))

        value, grad = gt.value_and_grad(f)(points)
        np.testing.assert_allclose(value, f(points), rtol=1e-11)
        np.testing.assert_allclose(
            grad, central_difference_grad(f, (points,), 0), rtol=1e-5, atol=1e-9
        )
        _, tangent = gt.jvp(f, (points,), (np.ones_like(points),))
        np.testing.assert_allclose(tangent, np.sum(grad), rtol=1e-9, atol=1e-12)


def test_gradients_in_the_data_and_the_weights():
    rng = np.random.default_rng(3)
    data, points = rng.normal(size=(2, 15)), rng.normal(size=(2, 4))
    weights = rng.uniform(0.5, 1.5, size=15)

    def f(data, log_w):
        return np.sum(st.gaussian_kde(data, weights=np.exp(log_w)).logpdf(points))

    args = (data, np.log(weights))
    value, grads = gt.value_and_grad(f, argnums=(0, 1))(*args)
    np.testing.assert_allclose(value, f(*args), rtol=1e-11)
    for i, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference_grad(f, args, i), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("backend", compile_backends())
def test_compiled(backend):
    rng = np.random.default_rng(4)
    kde = st.gaussian_kde(rng.normal(size=40))
    f = gt.compile(gt.value_and_grad(lambda x: np.sum(kde.logpdf(x))), backend=backend)
    for x in (rng.normal(size=6), rng.normal(size=6)):
        value, grad = f(x)
        np.testing.assert_allclose(value, np.sum(kde.logpdf(x)), rtol=1e-11)
        eager = gt.grad(lambda x: np.sum(kde.logpdf(x)))(x)
        np.testing.assert_allclose(grad, eager, rtol=1e-11)


def test_a_row_of_d_values_is_one_point_and_errors_are_scipys():
    rng = np.random.default_rng(5)
    kde = st.gaussian_kde(rng.normal(size=(3, 10)))
    x = rng.normal(size=3)
    np.testing.assert_allclose(gt.value_and_grad(lambda x: kde.logpdf(x)[0])(x)[0], kde.logpdf(x))
    with pytest.raises(ValueError, match="points have dimension 2, dataset has dimension 3"):
        gt.grad(lambda x: np.sum(kde.logpdf(x)))(np.ones((2, 4)))
    with pytest.raises(gt.GradtapeError, match="complex points"):
        gt.grad(lambda x: np.real(np.sum(kde.logpdf(x))), holomorphic=False)(np.ones((3, 2)) + 0j)


def test_plain_calls_are_scipys_own():
    rng = np.random.default_rng(6)
    kde = st.gaussian_kde(rng.normal(size=10))
    assert st.gaussian_kde.logpdf.__gradtape_original__ is not None
    np.testing.assert_array_equal(kde.logpdf([0.1, 0.2]), kde.logpdf([0.1, 0.2]))
