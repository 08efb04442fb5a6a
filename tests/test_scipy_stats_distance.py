"""scipy.stats.wasserstein_distance and energy_distance on traced samples and weights:
SciPy's values, gradients against central differences (away from ties, where the distance
has a kink), forward against reverse mode, SciPy's errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad
from hypothesis import given, settings
from hypothesis import strategies as st_

import gradtape as gt

st = pytest.importorskip("scipy.stats")


@settings(max_examples=25, deadline=None)
@given(
    m=st_.integers(1, 6),
    n=st_.integers(1, 6),
    weighted=st_.booleans(),
    which=st_.sampled_from(["wasserstein_distance", "energy_distance"]),
    seed=st_.integers(0, 2**16),
)
def test_values_and_gradients(m, n, weighted, which, seed):
    rng = np.random.default_rng(seed)
    u, v = rng.normal(size=m), rng.normal(size=n)  # distinct with probability one
    u_w = rng.uniform(0.5, 2.0, m) if weighted else None
    v_w = rng.uniform(0.5, 2.0, n) if weighted else None
    distance = getattr(st, which)

    def f(u, log_w):
        return distance(u, v, None if log_w is None else np.exp(log_w), v_w)

    log_w = None if u_w is None else np.log(u_w)
    value, grad = gt.value_and_grad(f)(u, log_w)
    np.testing.assert_allclose(value, f(u, log_w), rtol=1e-12)
    np.testing.assert_allclose(
        grad, central_difference_grad(f, (u, log_w), 0), rtol=1e-5, atol=1e-8
    )
    if weighted:
        g_w = gt.grad(f, argnums=1)(u, log_w)
        np.testing.assert_allclose(
            g_w, central_difference_grad(f, (u, log_w), 1), rtol=1e-5, atol=1e-8
        )
    _, tangent = gt.jvp(lambda u: f(u, log_w), (u,), (np.ones_like(u),))
    np.testing.assert_allclose(tangent, np.sum(grad), rtol=1e-9, atol=1e-12)


def test_errors_are_scipys():
    with pytest.raises(ValueError, match="Distribution can't be empty"):
        gt.grad(lambda u: st.wasserstein_distance(u, np.ones(0)))(np.ones(3))
    with pytest.raises(ValueError, match="negative"):
        gt.grad(lambda u: st.wasserstein_distance(u, [0.0, 1.0], [1.0, -1.0, 1.0]))(np.ones(3))
