"""linearize, checkpoint (remat), elementwise_grad and hvp(f)(x, v, *args)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import gradtape as gt

RNG = np.random.default_rng(0)


def _f(x, y):
    return {"a": np.sin(x) * y, "b": np.sum(np.exp(x * 0.3) * y[0])}


def test_linearize_matches_jvp_and_does_not_run_the_function_again():
    x, y = RNG.normal(size=3), RNG.normal(size=3)
    calls = []

    def counted(x, y):
        calls.append(1)
        return _f(x, y)

    value, f_jvp = gt.linearize(counted, x, y)
    assert len(calls) == 1
    for _ in range(3):
        tx, ty = RNG.normal(size=3), RNG.normal(size=3)
        out = f_jvp(tx, ty)
        ref_value, ref = gt.jvp(_f, (x, y), (tx, ty))
        np.testing.assert_allclose(out["a"], ref["a"], rtol=1e-13)
        np.testing.assert_allclose(out["b"], ref["b"], rtol=1e-13)
    np.testing.assert_allclose(value["a"], ref_value["a"])
    assert len(calls) == 1
    with pytest.raises(gt.GradtapeError, match="shape"):
        f_jvp(np.ones(2), np.ones(3))


def test_linearize_with_aux_under_compile_and_vmap():
    x = RNG.normal(size=4)
    value, f_jvp, aux = gt.linearize(lambda x: (np.tanh(x), {"n": np.sum(x)}), x, has_aux=True)
    np.testing.assert_allclose(aux["n"], np.sum(x))
    np.testing.assert_allclose(f_jvp(np.ones(4)), 1 - np.tanh(x) ** 2)

    def directional(x, t):
        return gt.linearize(lambda z: np.sin(z) * z, x)[1](t)

    X, T = RNG.normal(size=(5, 4)), RNG.normal(size=(5, 4))
    expected = (np.cos(X) * X + np.sin(X)) * T
    np.testing.assert_allclose(gt.vmap(directional)(X, T), expected, rtol=1e-12)
    np.testing.assert_allclose(gt.compile(directional, backend="numpy")(X[0], T[0]), expected[0])


def test_linearize_against_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    x = RNG.normal(size=3)
    t = RNG.normal(size=3)
    _, jf = jax.linearize(lambda x: jax.numpy.sin(x) * jax.numpy.sum(x**2), x)
    _, gf = gt.linearize(lambda x: np.sin(x) * np.sum(x**2), x)
    np.testing.assert_allclose(gf(t), np.asarray(jf(t)), rtol=1e-13)


# --- checkpoint -----------------------------------------------------------------------------------
def _block(x, scale):
    h = np.tanh(x * scale)
    return h * np.cos(x), {"side": np.sin(h)}


def _chain(x, block):
    y, side = block(x, 2.0)
    z, side2 = block(y + side["side"], 0.5)
    return np.sum(z * side2["side"])


def test_checkpoint_keeps_values_and_gradients_and_recomputes_in_the_backward_pass():
    x = RNG.normal(size=(3, 4))
    calls = []

    def counted(x, scale):
        calls.append(1)
        return _block(x, scale)

    block = gt.checkpoint(counted)
    np.testing.assert_allclose(_chain(x, block), _chain(x, _block))
    calls.clear()
    g = gt.grad(lambda x: _chain(x, block))(x)
    assert len(calls) == 4  # two blocks forward, each run again in the backward pass
    np.testing.assert_allclose(g, gt.grad(lambda x: _chain(x, _block))(x), rtol=1e-13)
    assert gt.remat is gt.checkpoint


@pytest.mark.parametrize(
    "transform",
    ["hessian", "grad of grad", "vmap of grad", "grad of vmap", "jacfwd", "compile of grad"],
)
def test_checkpoint_composes(transform):
    block = gt.checkpoint(_block, static_argnums=1)

    def with_block(x):
        return _chain(x, block)

    def plain(x):
        return _chain(x, _block)

    def apply(f, x):
        if transform == "hessian":
            return gt.hessian(f)(x)
        if transform == "grad of grad":
            return gt.grad(lambda x: np.sum(gt.grad(f)(x) ** 2))(x)
        if transform == "vmap of grad":
            return gt.vmap(gt.grad(f))(x[None].repeat(3, 0) * np.arange(1, 4)[:, None])
        if transform == "grad of vmap":
            return gt.grad(lambda x: np.sum(gt.vmap(f)(np.stack([x, 2 * x]))))(x)
        if transform == "jacfwd":
            return gt.jacfwd(f)(x)
        return gt.compile(gt.grad(f), backend="numpy")(x)

    x = RNG.normal(size=4)
    np.testing.assert_allclose(apply(with_block, x), apply(plain, x), rtol=1e-12, atol=1e-14)


def test_checkpoint_lowers_peak_memory_on_a_long_chain():
    mix = np.linalg.qr(RNG.normal(size=(64, 64)))[0]

    def block(x):
        h = np.tanh(x @ mix)
        return x + 0.1 * h * np.cos(x) - 0.05 * np.sin(h)

    def loss(x, b):
        for _ in range(40):
            x = b(x)
        return np.sum(x * x)

    x = RNG.normal(size=(32, 64))
    peaks = {}
    grads = {}
    for name, b in (("plain", block), ("checkpoint", gt.checkpoint(block))):
        grad = gt.grad(lambda x, b=b: loss(x, b))
        grad(x)
        tracemalloc.start()
        grads[name] = grad(x)
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    np.testing.assert_allclose(grads["checkpoint"], grads["plain"], rtol=1e-12)
    assert peaks["checkpoint"] < 0.5 * peaks["plain"], peaks


# --- elementwise_grad, hvp ------------------------------------------------------------------------
def test_elementwise_grad_is_the_derivative_at_each_element():
    x = RNG.normal(size=(2, 3))
    np.testing.assert_allclose(gt.elementwise_grad(np.tanh)(x), 1 - np.tanh(x) ** 2)
    np.testing.assert_allclose(
        gt.elementwise_grad(lambda a, x: a * x**3, argnum=1)(2.0, x), 6.0 * x**2
    )


def test_hvp_curried_with_extra_arguments():
    x, v = RNG.normal(size=3), RNG.normal(size=3)

    def f(x, a, b):
        return a * np.sum(x**3) + b * np.sum(x) ** 2

    expected = gt.hessian(f)(x, 2.0, 0.5) @ v
    np.testing.assert_allclose(gt.hvp(f)(x, v, 2.0, 0.5), expected, rtol=1e-13)
    np.testing.assert_allclose(gt.hvp(f, x, v, 2.0, 0.5), expected, rtol=1e-13)
    X, V = RNG.normal(size=(4, 3)), RNG.normal(size=(4, 3))
    batched = gt.vmap(gt.hvp(f), in_axes=(0, 0, None, None))(X, V, 2.0, 0.5)
    np.testing.assert_allclose(batched[1], gt.hessian(f)(X[1], 2.0, 0.5) @ V[1], rtol=1e-13)
