"""gt.tree_util: pytrees users own (dataclasses, registered types) through every transform."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest

import gradtape as gt
from gradtape import tree_util as tu

RNG = np.random.default_rng(0)


@dataclasses.dataclass
class Params:
    w: np.ndarray
    b: np.ndarray


@dataclasses.dataclass(frozen=True)
class Frozen:
    scale: np.ndarray
    note: object = None


class Pair(NamedTuple):
    first: np.ndarray
    second: np.ndarray


class Box:
    """A user type registered as a pytree node: one child and a static label."""

    def __init__(self, value, label):
        self.value, self.label = value, label


tu.register_pytree_node(Box, lambda b: ((b.value,), b.label), lambda label, ch: Box(ch[0], label))


def test_flatten_unflatten_round_trip_over_every_kind_of_node():
    tree = {
        "p": Params(np.ones(2), np.zeros(())),
        "f": Frozen(np.arange(3.0)),
        "pair": Pair(np.ones(1), np.full(2, 2.0)),
        "box": Box(np.ones(2), "label"),
        "seq": [1.0, (2.0, None)],
    }
    leaves, td = tu.tree_flatten(tree)
    assert len(leaves) == td.num_leaves == 8
    back = tu.tree_unflatten(td, leaves)
    assert isinstance(back["p"], Params) and isinstance(back["f"], Frozen)
    assert isinstance(back["pair"], Pair) and back["box"].label == "label"
    assert back["seq"][1][1] is None
    assert tu.tree_structure(tree) == tu.tree_structure(back)
    assert tu.tree_structure(Box(1, "a")) != tu.tree_structure(Box(1, "b"))
    doubled = tu.tree_map(lambda x, y: x + y, tree, tree)
    assert np.array_equal(doubled["f"].scale, 2 * np.arange(3.0))
    assert tu.tree_leaves(doubled)[0] is not None


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="has 2 leaves, 3 were given"):
        tu.tree_unflatten(tu.tree_structure((1, 2)), [1, 2, 3])
    with pytest.raises(ValueError, match="tree 1 has structure"):
        tu.tree_map(lambda a, b: a, (1, 2), [1, 2])

    class Unhashable:
        def __init__(self, v):
            self.v = v

    tu.register_pytree_node(Unhashable, lambda u: ((u.v,), [1]), lambda aux, ch: Unhashable(*ch))
    with pytest.raises(TypeError, match="not hashable"):
        tu.tree_flatten(Unhashable(1.0))


def _loss(p, x):
    return np.sum(np.tanh(p.w * x) * p.b.value) + np.sum(p.w**2)


def _params():
    return Params(RNG.normal(size=3), Box(RNG.normal(size=()), "gain"))


def _flat_loss(w, b, x):
    return np.sum(np.tanh(w * x) * b) + np.sum(w**2)


@pytest.mark.parametrize("backend", [None, "numpy"])
def test_user_pytrees_through_grad_value_and_grad_and_compile(backend):
    p, x = _params(), RNG.normal(size=3)

    def with_aux(p, x):
        return _loss(p, x), {"pred": Pair(p.w * x, None), "none": None, "frozen": Frozen(x)}

    transform = gt.grad(with_aux, has_aux=True)
    if backend:
        transform = gt.compile(transform, backend=backend)
    g, aux = transform(p, x)
    ref_w, ref_b = gt.grad(_flat_loss, argnums=(0, 1))(p.w, p.b.value, x)
    assert isinstance(g, Params) and isinstance(g.b, Box) and g.b.label == "gain"
    np.testing.assert_allclose(g.w, ref_w)
    np.testing.assert_allclose(g.b.value, ref_b)
    assert isinstance(aux["pred"], Pair) and aux["pred"].second is None and aux["none"] is None
    np.testing.assert_allclose(aux["frozen"].scale, x)
    value, g2 = gt.value_and_grad(_loss)(p, x)
    np.testing.assert_allclose(value, _flat_loss(p.w, p.b.value, x))
    np.testing.assert_allclose(g2.w, ref_w)


def test_user_pytrees_through_forward_mode_jacobians_hessian_vjp_and_vmap():
    p, x = _params(), RNG.normal(size=3)
    jac = gt.jacobian(lambda p: Pair(p.w * 2, p.b.value * p.w))(p)
    np.testing.assert_allclose(jac.first.w, 2 * np.eye(3))
    np.testing.assert_allclose(jac.second.b.value, p.w)
    jf = gt.jacfwd(lambda p: p.w * p.b.value)(p)
    np.testing.assert_allclose(jf.w, p.b.value * np.eye(3))
    h = gt.hessian(_loss)(p, x)
    ref = gt.hessian(_flat_loss)(p.w, p.b.value, x)
    np.testing.assert_allclose(h.w.w, ref)
    out, vjp = gt.vjp(lambda p: Frozen(p.w * p.b.value), p)
    (ct,) = vjp(Frozen(np.ones(3)))
    np.testing.assert_allclose(ct.w, np.full(3, p.b.value))
    tangent = Params(np.ones(3), Box(np.zeros(()), "gain"))
    value, t = gt.jvp(_loss, (p, x), (tangent, np.zeros(3)))
    np.testing.assert_allclose(t, np.sum(gt.grad(_loss)(p, x).w))
    ps = Params(RNG.normal(size=(4, 3)), Box(RNG.normal(size=4), "gain"))
    batched = gt.vmap(_loss, in_axes=(Params(0, Box(0, "gain")), None))(ps, x)
    loop = [_flat_loss(ps.w[i], ps.b.value[i], x) for i in range(4)]
    np.testing.assert_allclose(batched, loop)
    grads = gt.vmap(gt.grad(_loss), in_axes=(0, None))(ps, x)
    assert isinstance(grads, Params) and grads.w.shape == (4, 3)
