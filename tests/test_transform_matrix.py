"""Every transform composed with every other: a generated matrix of pairs and triples of
transforms over a set of functions, each composition checked against the same composition
of JAX's transforms (skipped where JAX is not installed)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import gradtape as gt

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

# each function is written once against a namespace: xp.sin is np.sin or jnp.sin
FUNCTIONS = {
    "tanh_poly": lambda xp, x: xp.tanh(x) * x**2 + 0.5 * x,
    "matvec": lambda xp, x: xp.sin(
        xp.asarray(np.arange(1.0, 10.0).reshape(3, 3) / 9.0) @ x[..., :3]
    ),
    "logsumexp": lambda xp, x: xp.log(xp.sum(xp.exp(x), axis=-1, keepdims=True)) - x,
}


def _sum(xp):
    return lambda g: lambda x: xp.sum(g(x))


def _wrap(system, name):
    """The transform `name` of `system` as a function -> function of one array argument."""
    if system == "gradtape":
        mod, xp = gt, np
    else:
        mod, xp = jax, jnp
    summed = _sum(xp)
    if name == "grad":  # the gradient of the summed output (grad needs a scalar)
        return lambda g: mod.grad(summed(g))
    if name == "hessian":
        return lambda g: mod.hessian(summed(g))
    if name == "vmap":
        return mod.vmap
    if name == "jacfwd":
        return mod.jacfwd
    if name == "jacrev":
        return mod.jacrev
    if name == "checkpoint":
        return mod.checkpoint
    if name == "jvp":  # the derivative along the direction of ones
        return lambda g: lambda x: mod.jvp(g, (x,), (xp.ones_like(x),))[1]
    if name == "linearize":
        return lambda g: lambda x: mod.linearize(g, x)[1](xp.ones_like(x))
    if name == "compile":
        return (lambda g: gt.compile(g, backend="numpy")) if system == "gradtape" else jax.jit
    raise KeyError(name)


TRANSFORMS = ["grad", "vmap", "jacfwd", "jacrev", "hessian", "checkpoint", "jvp", "linearize"]
PAIRS = [
    (first, second)
    for first, second in itertools.product(TRANSFORMS + ["compile"], repeat=2)
    if first != "compile"  # compile of a composition: compile outermost
]
TRIPLES = random.Random(0).sample(list(itertools.product(TRANSFORMS, repeat=3)), 30)
CASES = [(f, chain) for chain in PAIRS for f in ("tanh_poly", "logsumexp")] + [
    ("matvec", chain) for chain in TRIPLES
]


def _build(system, fname, chain):
    xp = np if system == "gradtape" else jnp
    base = FUNCTIONS[fname]
    g = lambda x: base(xp, x)  # noqa: E731
    for name in chain:  # innermost first: ("grad", "vmap") is vmap(grad(f))
        g = _wrap(system, name)(g)
    return g


@pytest.mark.parametrize(
    "fname, chain", CASES, ids=lambda v: v if isinstance(v, str) else "-".join(v)
)
def test_composition_matches_jax(fname, chain):
    batch_axes = sum(name == "vmap" for name in chain)
    x = np.random.default_rng(len(chain)).normal(size=(2,) * batch_axes + (3,))
    got = _build("gradtape", fname, chain)(x)
    expected = jax.jit(_build("jax", fname, chain))(jnp.asarray(x))  # one compile per case
    got_leaves, expected_leaves = (
        jax.tree_util.tree_leaves(got),
        jax.tree_util.tree_leaves(expected),
    )
    assert len(got_leaves) == len(expected_leaves)
    for a, b in zip(got_leaves, expected_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
