"""jacrev and hessian by vmap of the backward pass: the same numbers as forward mode, JAX
and central differences, in one chunk or several, for pytrees of inputs and outputs; and the
batching of indices whose advanced parts NumPy moves first."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.transforms import forward as forward_mode
from gradtape.transforms import higher

RNG = np.random.default_rng(11)


def mixing(x, y):
    return {"a": np.tanh(x @ y) * np.sum(y), "b": np.sin(x[..., 0]) * y[0]}


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 5),
    m=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    argnums=st.sampled_from([0, 1, (0, 1), (1, 0)]),
)
def test_jacrev_matches_jacfwd_over_shapes(n, m, seed, argnums):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(m, n)), rng.normal(size=n)
    rev = gt.jacrev(mixing, argnums=argnums)(x, y)
    fwd = gt.jacfwd(mixing, argnums=argnums)(x, y)
    assert gt.tree_util.tree_structure(rev) == gt.tree_util.tree_structure(fwd)
    for r, f in zip(gt.tree_util.tree_leaves(rev), gt.tree_util.tree_leaves(fwd)):
        assert r.shape == f.shape
        np.testing.assert_allclose(r, f, rtol=1e-12, atol=1e-14)


def test_rows_in_several_chunks_equal_one_chunk(monkeypatch):
    x = RNG.normal(size=(6, 4))
    w = RNG.normal(size=(4, 5))

    def f(x):
        return np.tanh(x @ w) ** 2

    whole = gt.jacrev(f)(x)
    assert whole.shape == (6, 5, 6, 4)
    calls = []
    original = higher.vmap

    def counted(*a, **k):
        calls.append(1)
        return original(*a, **k)

    monkeypatch.setattr(higher, "vmap", counted)
    monkeypatch.setattr(forward_mode, "_MAX_BATCH_ELEMENTS", 7 * 30)  # 7 rows per chunk
    chunked = gt.jacrev(f)(x)
    assert len(calls) == 5  # 30 rows in chunks of 7
    np.testing.assert_array_equal(chunked, whole)
    np.testing.assert_allclose(whole, gt.jacfwd(f)(x), rtol=1e-12, atol=1e-14)


def test_hessian_by_rows_matches_forward_over_reverse_and_differences():
    a = RNG.normal(size=(5, 5))

    def f(x, s):
        return np.sum(np.log1p(np.exp(np.tanh(a @ x) * s))) + np.prod(x[:2]) * s**2

    x, s = RNG.normal(size=5), 0.7
    h = gt.hessian(f, argnums=(0, 1))(x, s)
    over = gt.jacfwd(gt.grad(f, argnums=(0, 1)), argnums=(0, 1))(x, s)
    for i in range(2):
        for j in range(2):
            np.testing.assert_allclose(h[i][j], over[i][j], rtol=1e-12, atol=1e-14)
    column = central_difference_grad(lambda x: gt.grad(f)(x, s)[2], (x,), 0)
    np.testing.assert_allclose(h[0][0][2], column, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(h[0][0], h[0][0].T, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", ["numpy", "eager"])
def test_compiled_hessian_with_argnums_matches_forward_over_reverse(backend):
    a = RNG.normal(size=(4, 4))

    def f(x, s):
        return np.sum(np.log1p(np.exp(np.tanh(a @ x) * s))) + np.prod(x[:2]) * s**2

    x, s = RNG.normal(size=4), 1.3
    h = gt.hessian(f, argnums=(0, 1))
    if backend != "eager":
        h = gt.compile(h, backend=backend)
    got = h(x, s)
    expected = gt.jacfwd(gt.grad(f, argnums=(0, 1)), argnums=(0, 1))(x, s)
    for i in range(2):
        for j in range(2):
            np.testing.assert_allclose(got[i][j], expected[i][j], rtol=1e-12, atol=1e-14)


def test_hessian_with_aux_and_under_compile_and_vmap():
    def f(x):
        return np.sum(np.sin(x) * x**2), {"norm": np.sum(x * x)}

    x = RNG.normal(size=4)
    h, aux = gt.hessian(f, has_aux=True)(x)
    expected = np.diag(2 * np.sin(x) + 4 * x * np.cos(x) - x**2 * np.sin(x))
    np.testing.assert_allclose(h, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(aux["norm"], np.sum(x * x))
    compiled = gt.compile(gt.hessian(lambda x: f(x)[0]), backend="numpy")
    np.testing.assert_allclose(compiled(x), expected, rtol=1e-12, atol=1e-14)
    xs = RNG.normal(size=(3, 4))
    batched = gt.vmap(gt.hessian(lambda x: f(x)[0]))(xs)
    for b, xi in zip(batched, xs):
        np.testing.assert_allclose(
            b, np.diag(2 * np.sin(xi) + 4 * xi * np.cos(xi) - xi**2 * np.sin(xi)), rtol=1e-12
        )


def test_against_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    w = RNG.normal(size=(7, 7)) / 3

    def f(xp, x):
        return xp.tanh(w @ x) * xp.cos(x)

    x = RNG.normal(size=7)
    np.testing.assert_allclose(
        gt.jacrev(lambda x: f(np, x))(x), jax.jacrev(lambda x: f(jnp, x))(x), rtol=1e-12
    )
    np.testing.assert_allclose(
        gt.jacobian(lambda x: f(np, x))(x), jax.jacobian(lambda x: f(jnp, x))(x), rtol=1e-12
    )
    np.testing.assert_allclose(
        gt.hessian(lambda x: np.sum(f(np, x) ** 2))(x),
        jax.hessian(lambda x: jnp.sum(f(jnp, x) ** 2))(x),
        rtol=1e-11,
        atol=1e-13,
    )


@pytest.mark.parametrize(
    "index",
    [(0, slice(None), np.array([1, 2])), (np.array([0, 1]), slice(None), 1)],
    ids=["int then array", "array then int"],
)
def test_vmap_of_indices_with_advanced_parts_apart(index):
    xs = RNG.normal(size=(3, 2, 4, 3))
    expected = np.stack([x[index] for x in xs])
    np.testing.assert_array_equal(gt.vmap(lambda x: x[index])(xs), expected)

    def write(x, v):
        y = x * 1.0
        y[index] = v
        return y

    vs = RNG.normal(size=(3,) + expected.shape[1:])
    got = gt.vmap(write)(xs, vs)
    np.testing.assert_array_equal(got, np.stack([write(x, v) for x, v in zip(xs, vs)]))
    grads = gt.vmap(gt.grad(lambda x: np.sum(x[index] ** 2)))(xs)
    np.testing.assert_allclose(
        grads, np.stack([gt.grad(lambda x: np.sum(x[index] ** 2))(x) for x in xs]), rtol=1e-14
    )
