"""vmap of grad through scan, fori_loop and while_loop: one batched loop (forward and
backward), never a loop over the members; the numbers of a Python loop of grad and of JAX's
jit(vmap(grad)) of lax.scan."""

from __future__ import annotations

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile.numba import backend as numba_backend
from gradtape.core import tracing

RNG = np.random.default_rng(7)
HIDDEN, INPUTS, STEPS = 5, 3, 9
W = 0.4 * RNG.normal(size=HIDDEN * HIDDEN + INPUTS * HIDDEN)


def sequence_loss(w, x, y):
    w_h = w[: HIDDEN * HIDDEN].reshape(HIDDEN, HIDDEN)
    w_x = w[HIDDEN * HIDDEN :].reshape(INPUTS, HIDDEN)

    def step(h, x_t):
        h = np.tanh(h @ w_h + x_t @ w_x)
        return h, np.sum(h * h)

    h, ys = gt.scan(step, np.zeros(HIDDEN), x)
    return (np.sum(h) - y) ** 2 + 0.1 * np.sum(ys)


def fori_loss(w, x, y):
    def body(i, h):
        return np.tanh(h * w[:INPUTS] + x * np.cos(w[INPUTS : 2 * INPUTS] * i))

    return np.sum((gt.fori_loop(0, 6, body, x) - y) ** 2)


def while_loss(w, x, y):
    def cond(c):
        return c[1] < 5.0

    def body(c):
        h, k = c
        return np.sin(h * w[:INPUTS]) + x, k + 1.0

    h, _ = gt.while_loop(cond, body, (x, 0.0))
    return np.sum(h * y)


@pytest.fixture
def no_member_loop(monkeypatch):
    """Fail if any primitive runs once per member of the batch."""

    def refuse(prim, *args, **kwargs):
        raise AssertionError(f"{prim.name} ran once per member of the batch")

    monkeypatch.setattr(tracing, "loop_batch", refuse)
    monkeypatch.setattr(tracing, "member_results", refuse)


def per_member(f, w, xs, ys):
    return np.stack([gt.grad(f)(w, x, y) for x, y in zip(xs, ys)])


@pytest.mark.parametrize(
    "f, x_shape",
    [(sequence_loss, (STEPS, INPUTS)), (fori_loss, (INPUTS,)), (while_loss, (INPUTS,))],
    ids=["scan", "fori_loop", "while_loop"],
)
def test_per_example_gradients_are_one_batched_loop(f, x_shape, no_member_loop):
    xs = RNG.normal(size=(6,) + x_shape)
    ys = RNG.normal(size=6)
    batched = gt.vmap(gt.grad(f), in_axes=(None, 0, 0))(W, xs, ys)
    np.testing.assert_allclose(batched, per_member(f, W, xs, ys), rtol=1e-12, atol=1e-14)


def check_compiled_per_example_gradients(backend):
    xs = RNG.normal(size=(7, STEPS, INPUTS))
    ys = RNG.normal(size=7)
    compiled = gt.compile(gt.vmap(gt.grad(sequence_loss), in_axes=(None, 0, 0)), backend=backend)
    expected = per_member(sequence_loss, W, xs, ys)
    np.testing.assert_allclose(compiled(W, xs, ys), expected, rtol=1e-11, atol=1e-13)
    # a second batch replays the recording
    xs2, ys2 = RNG.normal(size=xs.shape), RNG.normal(size=7)
    np.testing.assert_allclose(
        compiled(W, xs2, ys2), per_member(sequence_loss, W, xs2, ys2), rtol=1e-11, atol=1e-13
    )
    names = [ins.prim.name for ins in compiled.tape(W, xs, ys).instructions]
    # the forward loop once over the whole batch, and the backward loop once: a scan over
    # the steps whose step is the members' step VJP mapped over the batch
    assert names.count("scan") == 2 and "scan_bwd" not in names


def test_compiled_per_example_gradients_of_a_scan():
    check_compiled_per_example_gradients("numpy")


@pytest.mark.native
@pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed")
def test_native_per_example_gradients_of_a_scan():
    check_compiled_per_example_gradients("numba")


@pytest.mark.parametrize(
    "f, x_shape",
    [(fori_loss, (INPUTS,)), (while_loss, (INPUTS,))],
    ids=["fori_loop", "while_loop"],
)
def test_compiled_per_example_gradients_of_other_loops(f, x_shape):
    compiled = gt.compile(gt.vmap(gt.grad(f), in_axes=(None, 0, 0)), backend="numpy")
    for _ in range(2):
        xs, ys = RNG.normal(size=(5,) + x_shape), RNG.normal(size=5)
        np.testing.assert_allclose(
            compiled(W, xs, ys), per_member(f, W, xs, ys), rtol=1e-11, atol=1e-13
        )
    names = [ins.prim.name for ins in compiled.tape(W, xs, ys).instructions]
    assert names.count("scan") + names.count("scan_bwd") + names.count("while_loop") == 2


def test_batched_weights_and_reverse_scan(no_member_loop):
    """An ensemble: weights and data both batched; a reverse scan."""
    ws = W + 0.1 * RNG.normal(size=(4,) + W.shape)
    xs = RNG.normal(size=(4, STEPS, INPUTS))

    def loss(w, x):
        a = w[:INPUTS]

        def step(c, x_t):
            c = np.tanh(c * a + x_t)
            return c, c[0]

        c, ys = gt.scan(step, np.ones(INPUTS), x, reverse=True)
        return np.sum(c**2) + np.sum(ys * np.arange(STEPS))

    batched = gt.vmap(gt.grad(loss))(ws, xs)
    expected = np.stack([gt.grad(loss)(w, x) for w, x in zip(ws, xs)])
    np.testing.assert_allclose(batched, expected, rtol=1e-12, atol=1e-14)


def test_hessian_of_a_scan_under_vmap():
    xs = RNG.normal(size=(3, STEPS, INPUTS))
    w_small = W[: HIDDEN * HIDDEN + INPUTS * HIDDEN]

    def loss(w, x):
        return sequence_loss(w, x, 0.5)

    batched = gt.vmap(gt.hessian(loss), in_axes=(None, 0))(w_small, xs)
    expected = np.stack([gt.hessian(loss)(w_small, x) for x in xs])
    np.testing.assert_allclose(batched, expected, rtol=1e-10, atol=1e-12)


def test_while_loop_members_with_different_trip_counts_are_refused():
    def loss(x):
        def cond(c):
            return c[0] < 3.0

        def body(c):
            return c[0] + 1.0, c[1] * 1.5

        return gt.while_loop(cond, body, (x[0], x[1]))[1]

    with pytest.raises(gt.GradtapeError, match="different numbers of iterations"):
        gt.vmap(gt.grad(loss))(np.array([[0.0, 1.0], [1.0, 1.0]]))
    same = gt.vmap(gt.grad(loss))(np.array([[0.5, 1.0], [0.0, 2.0]]))
    np.testing.assert_allclose(same[:, 1], 1.5**3)


def test_against_jax_lax_scan():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy

    def jax_loss(w, x, y):
        w_h = w[: HIDDEN * HIDDEN].reshape(HIDDEN, HIDDEN)
        w_x = w[HIDDEN * HIDDEN :].reshape(INPUTS, HIDDEN)

        def step(h, x_t):
            h = jnp.tanh(h @ w_h + x_t @ w_x)
            return h, jnp.sum(h * h)

        h, ys = jax.lax.scan(step, jnp.zeros(HIDDEN), x)
        return (jnp.sum(h) - y) ** 2 + 0.1 * jnp.sum(ys)

    xs = RNG.normal(size=(5, STEPS, INPUTS))
    ys = RNG.normal(size=5)
    expected = jax.jit(jax.vmap(jax.grad(jax_loss), in_axes=(None, 0, 0)))(W, xs, ys)
    got = gt.vmap(gt.grad(sequence_loss), in_axes=(None, 0, 0))(W, xs, ys)
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-11, atol=1e-13)
