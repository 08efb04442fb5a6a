"""JAX as an independent oracle: gradtape's gradient of NumPy's functions against jax.grad of
jax.numpy's (float64, away from kinks and ties, where both define the same derivative)."""

from __future__ import annotations

import numpy as np
import pytest

import gradtape as gt

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

RNG = np.random.default_rng(7)
X = RNG.normal(size=7)
M = RNG.normal(size=(3, 5))
W = np.linspace(0.5, 1.5, 200)

# name -> (function of the module `m` (np or jnp) and the argument, the argument)
CASES = {
    "diff": (lambda m, x: m.diff(x, n=2), X),
    "ediff1d": (lambda m, x: m.ediff1d(x, to_begin=1.0), X),
    "gradient": (lambda m, x: m.gradient(x, 0.5), X),
    "gradient_coords": (lambda m, x: m.gradient(x, m.cumsum(m.abs(x) + 0.5)), X),
    "trapezoid": (lambda m, x: m.trapezoid(x, dx=0.3), M),
    "interp": (
        lambda m, x: m.interp(x, m.array([-2.0, -0.5, 0.3, 2.0]), m.array([1.0, -1.0, 0.5, 2.0])),
        X,
    ),
    "convolve": (lambda m, x: m.convolve(x, m.array([1.0, -0.5, 0.25])), X),
    "correlate_same": (lambda m, x: m.correlate(x, m.array([1.0, -0.5, 0.25, 2.0]), "same"), X),
    "cov": (lambda m, x: m.cov(x), M),
    "corrcoef": (lambda m, x: m.corrcoef(x)[0, 1:], M),
    "median": (lambda m, x: m.median(x, axis=1), M),
    "quantile": (lambda m, x: m.quantile(x, m.array([0.1, 0.65]), axis=0), M),
    "percentile_midpoint": (lambda m, x: m.percentile(x, 30.0, method="midpoint"), X),
    "nanmean": (lambda m, x: m.nanmean(m.where(x > 1.2, m.nan, x), axis=1), M),
    "nanvar": (lambda m, x: m.nanvar(m.where(x > 1.2, m.nan, x), axis=0), M),
    "ptp": (lambda m, x: m.ptp(x, axis=1), M),
    "logaddexp_reduce": (lambda m, x: m.logaddexp.reduce(x, axis=1), M),
    "cross": (lambda m, x: m.cross(x[:, :3], x[:, 2:]), M),
    "kron": (lambda m, x: m.kron(x, x[:2, :2]), M),
    "pad_reflect": (lambda m, x: m.pad(x, ((2, 1), (3, 4)), mode="reflect"), M),
    "pad_symmetric": (lambda m, x: m.pad(x, 2, mode="symmetric"), M),
    "pad_wrap": (lambda m, x: m.pad(x, ((1, 2), (6, 0)), mode="wrap"), M),
    "pad_edge": (lambda m, x: m.pad(x, 2, mode="edge"), M),
    "pad_linear_ramp": (lambda m, x: m.pad(x, 2, mode="linear_ramp", end_values=1.5), M),
    "pad_mean": (lambda m, x: m.pad(x, 2, mode="mean"), M),
    "sinc": (lambda m, x: m.sinc(x), X),
    "i0": (lambda m, x: m.i0(x), X),
    "polyval": (lambda m, x: m.polyval(x, 0.7), X),
    "vander": (lambda m, x: m.vander(x[:4]), X),
    "linspace": (lambda m, x: m.linspace(x[0], x[1], 6), X),
    "logspace": (lambda m, x: m.logspace(x[0], x[1], 5), X),
    "geomspace": (lambda m, x: m.geomspace(m.exp(x[0]), m.exp(x[1]), 5), X),
    "meshgrid": (lambda m, x: m.meshgrid(x[:3], x[3:])[1] * m.meshgrid(x[:3], x[3:])[0], X),
    "rot90": (lambda m, x: m.rot90(x, 3), M),
    "insert": (lambda m, x: m.insert(x, 2, x[:2]), X),
    "delete": (lambda m, x: m.delete(x, m.array([1, 3])), X),
    "partition": (lambda m, x: m.sort(m.partition(x, 3))[:4], X),
    "sliding_window": (lambda m, x: m.sum(_windows(m, x), axis=-1), X),
    "vecdot": (lambda m, x: m.vecdot(x, x[::-1]), M),
    "nan_to_num": (lambda m, x: m.nan_to_num(m.log(x)), np.abs(X) + 0.1),
    "cumulative_sum": (lambda m, x: m.cumulative_sum(x, axis=1, include_initial=True), M),
}


def _windows(m, x):
    if m is np:
        return np.lib.stride_tricks.sliding_window_view(x, 3)
    return jnp.stack([x[i : i + 3] for i in range(x.shape[0] - 2)])


@pytest.mark.parametrize("name", CASES)
def test_gradient_agrees_with_jax(name):
    f, x = CASES[name]
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:

        def loss_jax(x):
            out = f(jnp, x)
            return jnp.sum(jnp.asarray(W[: out.size]).reshape(out.shape) * out)

        expected = np.asarray(jax.grad(loss_jax)(jnp.asarray(x)))
    finally:
        jax.config.update("jax_enable_x64", x64)

    def loss(x):
        out = f(np, x)
        return np.sum(W[: np.size(out)].reshape(np.shape(out)) * out)

    np.testing.assert_allclose(gt.grad(loss)(x), expected, rtol=1e-9, atol=1e-12)
