"""The public transforms take JAX's parameters: the same names, positions, kinds and
defaults, for every parameter gradtape supports; the parameters it leaves out are listed here
with the reason. argnums (int or tuple) and has_aux then behave as JAX's."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import gradtape as gt

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = pytest.importorskip("jax.numpy")

# JAX's parameters that gradtape does not take, and why.
NOT_TAKEN = {
    "allow_int": "integer inputs are never differentiated (their gradient is float0 in JAX)",
    "reduce_axes": "deprecated in JAX; named axes do not exist in gradtape",
    "axis_name": "named axes belong to JAX's collectives, which gradtape has not",
    "axis_size": "every vmap has a batched argument that gives the size",
    "spmd_axis_name": "no devices to shard over",
    "sum_match": "an experimental JAX option for named axes",
    "policy": "checkpoint recomputes every intermediate; there is no saving policy",
    "static_argnames": "static arguments are given by position (static_argnums)",
    "concrete": "deprecated in JAX",
}

# gradtape's transform -> its JAX equivalent.
EQUIVALENTS = {
    "grad": "grad",
    "value_and_grad": "value_and_grad",
    "vjp": "vjp",
    "jvp": "jvp",
    "jacfwd": "jacfwd",
    "jacrev": "jacrev",
    "jacobian": "jacobian",
    "hessian": "hessian",
    "vmap": "vmap",
    "linearize": "linearize",
    "checkpoint": "checkpoint",
    "remat": "remat",
}
# gradtape's transforms without a JAX function of that name, and their own contract.
OWN = {
    "hvp": ["fun", "x", "v", "args"],
    "elementwise_grad": ["fun", "argnum"],
}
# Public functions taking `fun` first that are not transforms of derivatives or batches.
NOT_COMPARED = {"compile": "jax.jit's counterpart, with gradtape's own options (backend, ...)"}
# Parameters gradtape adds after JAX's (keyword-only, so JAX's positions stay).
EXTRA = {"jacobian": {"mode"}}


def public_transforms() -> list[str]:
    """The names of gt.__all__ that transform a function (take `fun` first, return a
    function or apply it)."""
    names = []
    for name in gt.__all__:
        obj = getattr(gt, name)
        if not inspect.isfunction(obj):
            continue
        params = list(inspect.signature(obj).parameters)
        if params and params[0] == "fun" and name not in NOT_COMPARED:
            names.append(name)
    return names


def test_every_public_transform_is_compared():
    found = set(public_transforms())
    assert found == set(EQUIVALENTS) | set(OWN), found ^ (set(EQUIVALENTS) | set(OWN))


@pytest.mark.parametrize("name", sorted(EQUIVALENTS))
def test_parameters_match_jax(name):
    ours = inspect.signature(getattr(gt, name)).parameters
    theirs = inspect.signature(getattr(jax, EQUIVALENTS[name])).parameters
    taken = [p for p in theirs.values() if p.name not in NOT_TAKEN]
    assert [p.name for p in ours.values() if p.name not in EXTRA.get(name, ())] == [
        p.name for p in taken
    ]
    for p in taken:
        mine = ours[p.name]
        assert mine.kind == p.kind, (name, p.name, mine.kind, p.kind)
        assert mine.default == p.default or (
            # JAX's tuple-typed defaults; gradtape spells them as the same value
            isinstance(p.default, tuple) and tuple(mine.default) == p.default
        ), (name, p.name, mine.default, p.default)
    for extra in EXTRA.get(name, ()):
        assert ours[extra].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("name", sorted(OWN))
def test_own_transforms_keep_their_contract(name):
    assert list(inspect.signature(getattr(gt, name)).parameters) == OWN[name]


def two_arguments_np(x, y):
    return np.sum(np.sin(x) * y**2)


def two_arguments_jax(x, y):
    return jnp.sum(jnp.sin(x) * y**2)


def with_aux_np(x, y):
    return np.sum(np.sin(x) * y**2), {"scale": np.max(y)}


def with_aux_jax(x, y):
    return jnp.sum(jnp.sin(x) * y**2), {"scale": jnp.max(y)}


def vector_np(x, y):
    return np.sin(x) * y**2


def vector_jax(x, y):
    return jnp.sin(x) * y**2


X = np.array([0.3, -1.2, 2.0])
Y = np.array([1.5, 0.5, -0.7])


def assert_trees_close(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for u, v in zip(la, lb):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["grad", "value_and_grad", "jacfwd", "jacrev", "hessian"])
@pytest.mark.parametrize("argnums", [0, 1, (0,), (1, 0), (0, 1)])
@pytest.mark.parametrize("has_aux", [False, True])
def test_argnums_and_has_aux_behave_as_jax(name, argnums, has_aux):
    scalar = name in ("grad", "value_and_grad", "hessian")
    if scalar:
        f_np, f_jax = (
            (with_aux_np, with_aux_jax) if has_aux else (two_arguments_np, two_arguments_jax)
        )
    else:
        f_np, f_jax = (
            (
                (lambda x, y: (vector_np(x, y), {"s": np.max(y)})),
                (lambda x, y: (vector_jax(x, y), {"s": jnp.max(y)})),
            )
            if has_aux
            else (vector_np, vector_jax)
        )
    ours = getattr(gt, name)(f_np, argnums=argnums, has_aux=has_aux)(X, Y)
    theirs = getattr(jax, name)(f_jax, argnums=argnums, has_aux=has_aux)(X, Y)
    assert_trees_close(ours, theirs)


@pytest.mark.parametrize("argnums", [0, 1, (1, 0)])
def test_jacobian_positional_has_aux_is_jax_position(argnums):
    def f_np(x, y):
        return vector_np(x, y), np.sum(x)

    def f_jax(x, y):
        return vector_jax(x, y), jnp.sum(x)

    ours = gt.jacobian(f_np, argnums, True)(X, Y)
    theirs = jax.jacobian(f_jax, argnums, True)(X, Y)
    assert_trees_close(ours, theirs)


def test_vjp_jvp_linearize_has_aux_as_jax():
    out, pull, aux = gt.vjp(with_aux_np, X, Y, has_aux=True)
    out_j, pull_j, aux_j = jax.vjp(with_aux_jax, X, Y, has_aux=True)
    assert_trees_close((out, pull(1.0), aux), (out_j, pull_j(1.0), aux_j))
    tangents = (np.ones(3), np.array([0.5, 0.0, -1.0]))
    assert_trees_close(
        gt.jvp(with_aux_np, (X, Y), tangents, has_aux=True),
        jax.jvp(with_aux_jax, (X, Y), tangents, has_aux=True),
    )
    value, f_jvp, aux = gt.linearize(with_aux_np, X, Y, has_aux=True)
    value_j, f_jvp_j, aux_j = jax.linearize(with_aux_jax, X, Y, has_aux=True)
    assert_trees_close((value, f_jvp(*tangents), aux), (value_j, f_jvp_j(*tangents), aux_j))
