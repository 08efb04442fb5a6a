"""vmap: JAX's semantics on plain NumPy code.

The reference for every batched result is the function applied to each member in a Python
loop and stacked (the definition of vmap); where JAX is installed, it is a second oracle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt

RNG = np.random.default_rng(0)


def _members(x, axis):
    return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


def _loop(f, args, in_axes):
    """The definition of vmap: f on each member, the results stacked along axis 0."""
    size = next(a.shape[ax] for a, ax in zip(args, in_axes) if ax is not None)
    outs = []
    for i in range(size):
        member = [a if ax is None else np.take(a, i, axis=ax) for a, ax in zip(args, in_axes)]
        outs.append(f(*member))
    if isinstance(outs[0], tuple):
        return tuple(np.stack([o[k] for o in outs]) for k in range(len(outs[0])))
    return np.stack(outs)


def _close(a, b, tol=1e-10):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y, tol)
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _spd(n):
    a = RNG.normal(size=(n, n))
    return a @ a.T + n * np.eye(n)


# --- every category of batching rule, against the per-member loop -----------------------------
B = 4
ONE_ARG = {
    "elementwise": (lambda x: np.exp(np.sin(x)) * x**2 - np.log1p(x * x), (B, 3, 2)),
    "sum axis": (lambda x: np.sum(x, axis=-1) + x.mean(axis=0)[0], (B, 3, 2)),
    "sum all": (lambda x: np.sum(np.tanh(x)), (B, 3, 2)),
    "max keepdims": (lambda x: x - np.max(x, axis=1, keepdims=True), (B, 3, 2)),
    "prod": (lambda x: np.prod(x, axis=0), (B, 3, 2)),
    "cumsum": (lambda x: np.cumsum(x, axis=1) * np.cumprod(x, axis=-1), (B, 3, 2)),
    "reshape": (lambda x: np.reshape(x, (-1,)) @ np.ones(6), (B, 3, 2)),
    "transpose": (lambda x: x.T @ x, (B, 3, 2)),
    "swapaxes": (lambda x: np.swapaxes(x[None], 0, 2), (B, 3, 2)),
    "broadcast": (lambda x: np.broadcast_to(x[:, :1], (3, 5)) * 2.0, (B, 3, 2)),
    "concatenate": (lambda x: np.concatenate([x, np.ones((1, 2)), 2 * x]), (B, 3, 2)),
    "stack": (lambda x: np.stack([x, x * 2], axis=-1), (B, 3, 2)),
    "getitem basic": (lambda x: x[1:, 0] + x[-1, ::-1].sum(), (B, 3, 2)),
    "getitem array": (lambda x: x[np.array([2, 0, 2]), 1], (B, 3, 2)),
    "getitem arrays apart": (lambda x: x[np.array([0, 2]), :, np.array([1, 0])], (B, 3, 2, 2)),
    "where": (lambda x: np.where(x > 0, np.sqrt(np.abs(x)), x**3), (B, 3, 2)),
    "clip": (lambda x: np.clip(x, -0.5, 0.5), (B, 3, 2)),
    "astype": (lambda x: x.astype(np.float32).astype(np.float64), (B, 3, 2)),
    "zeros_like": (lambda x: np.zeros_like(x) + x, (B, 3, 2)),
    "einsum": (lambda x: np.einsum("ij,kj->ik", x, x), (B, 3, 2)),
    "inv": (lambda a: np.linalg.inv(a + 4 * np.eye(3)), (B, 3, 3)),
    "det": (lambda a: np.linalg.det(a), (B, 3, 3)),
    "slogdet": (lambda a: np.linalg.slogdet(a + 4 * np.eye(3))[1], (B, 3, 3)),
    "cholesky": (lambda a: np.linalg.cholesky(a @ a.T + np.eye(3)), (B, 3, 3)),
    "eigh": (lambda a: np.linalg.eigh(a + a.T)[0], (B, 3, 3)),
    "svd": (lambda a: np.linalg.svd(a, compute_uv=False), (B, 3, 2)),
    "qr": (lambda a: np.abs(np.linalg.qr(a)[1]), (B, 3, 2)),
    "pinv": (lambda a: np.linalg.pinv(a), (B, 3, 2)),
    "sort (loop fallback)": (lambda x: np.sort(x, axis=0), (B, 3, 2)),
    "fft (loop fallback)": (lambda x: np.abs(np.fft.fft(x)), (B, 4)),
    "logsumexp": (lambda x: np.log(np.sum(np.exp(x - x.max()))) + x.max(), (B, 3, 2)),
}


def _setitem_fn(x):
    y = np.zeros_like(x)
    y[1] = x[0]
    y[:, 0] += x[:, 1]
    y[np.array([0, 2]), 1] = 7.0
    return y


ONE_ARG["setitem"] = (_setitem_fn, (B, 3, 2))


@pytest.mark.parametrize("name", sorted(ONE_ARG))
def test_each_category_matches_the_loop_over_members(name):
    f, shape = ONE_ARG[name]
    x = RNG.normal(size=shape)
    _close(gt.vmap(f)(x), _loop(f, [x], [0]))


@pytest.mark.parametrize("name", ["elementwise", "sum axis", "transpose", "getitem basic", "inv"])
def test_in_axes_other_than_zero(name):
    f, shape = ONE_ARG[name]
    x = np.moveaxis(RNG.normal(size=shape), 0, -1)
    _close(gt.vmap(f, in_axes=-1)(x), _loop(f, [x], [-1]))
    _close(gt.vmap(f, in_axes=x.ndim - 1, out_axes=1)(x), np.moveaxis(_loop(f, [x], [-1]), 0, 1))


TWO_ARG = {
    "add": lambda a, b: a + b,
    "matmul": lambda a, b: a @ b,
    "solve": lambda a, b: np.linalg.solve(a + 4 * np.eye(3), b),
    "einsum": lambda a, b: np.einsum("ij,j->i", a, b),
    "dot": lambda a, b: np.dot(a, b),
}
SHAPES = {
    "add": [((3, 2), (2,)), ((3,), (3,)), ((2, 3, 2), (3, 2))],
    "matmul": [((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((5, 2, 3), (3,))],
    "solve": [((3, 3), (3,)), ((3, 3), (3, 2))],
    "einsum": [((2, 3), (3,))],
    "dot": [((3,), (3,)), ((2, 3), (3,))],
}


@pytest.mark.parametrize("axes", [(0, 0), (0, None), (None, 0), (1, 0), (0, -1)])
@pytest.mark.parametrize("name", sorted(TWO_ARG))
def test_two_arguments_batched_in_every_combination(name, axes):
    f = TWO_ARG[name]
    for sa, sb in SHAPES[name]:
        shapes = []
        for s, ax in zip((sa, sb), axes):
            if ax is None:
                shapes.append(s)
            else:
                full = list(s)
                full.insert(ax % (len(s) + 1), B)
                shapes.append(tuple(full))
        a, b = (RNG.normal(size=s) for s in shapes)
        _close(gt.vmap(f, in_axes=axes)(a, b), _loop(f, [a, b], axes))


@settings(max_examples=40, deadline=None)
@given(
    member=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    size=st.integers(1, 4),
    data=st.data(),
)
def test_hypothesis_in_axes_and_shapes(member, size, data):
    nd = len(member) + 1
    ax_x = data.draw(st.integers(-nd, nd - 1))
    ax_w = data.draw(st.sampled_from([None, 0, -1]))
    shape_x = list(member)
    shape_x.insert(ax_x % nd, size)
    x = RNG.normal(size=shape_x)
    w_member = (member[-1],)
    w = RNG.normal(
        size=w_member if ax_w is None else ((size,) + w_member if ax_w == 0 else w_member + (size,))
    )

    def f(x, w):
        return np.sum(np.tanh(x * w), axis=-1) + np.max(x) * w[0]

    _close(gt.vmap(f, in_axes=(ax_x, ax_w))(x, w), _loop(f, [x, w], [ax_x, ax_w]))


# --- pytrees, in_axes prefixes, out_axes ----------------------------------------------------------
def test_pytree_inputs_with_prefix_in_axes_and_out_axes():
    params = {"w": RNG.normal(size=3), "b": np.float64(0.5)}
    xs = (RNG.normal(size=(B, 3)), RNG.normal(size=(3, B)))

    def f(p, x):
        u, v = x
        return {"dot": u @ p["w"] + p["b"], "pair": (u * v, None)}

    out = gt.vmap(f, in_axes=(None, (0, 1)), out_axes={"dot": 0, "pair": (1, None)})(params, xs)
    for i in range(B):
        ref = f(params, (xs[0][i], xs[1][:, i]))
        _close(out["dot"][i], ref["dot"])
        _close(out["pair"][0][:, i], ref["pair"][0])
    assert out["pair"][1] is None


def test_dict_in_axes_and_keyword_arguments_batched_along_zero():
    d = {"a": RNG.normal(size=(B, 2)), "b": RNG.normal(size=2)}

    def f(d, scale):
        return d["a"] * d["b"] * scale

    scale = RNG.normal(size=B)
    out = gt.vmap(f, in_axes=({"a": 0, "b": None},))(d, scale=scale)
    _close(out, d["a"] * d["b"] * scale[:, None])


def test_outputs_independent_of_the_batch_are_broadcast_or_kept():
    x = RNG.normal(size=(B, 2))
    out = gt.vmap(lambda x: (x, np.ones(3)), out_axes=(0, None))(x)
    _close(out[1], np.ones(3))
    _close(gt.vmap(lambda x: 2.0)(x), np.full(B, 2.0))
    with pytest.raises(ValueError, match="out_axes is None"):
        gt.vmap(lambda x: x, out_axes=None)(x)


# --- errors --------------------------------------------------------------------------------------
def test_sizes_that_disagree_are_named():
    with pytest.raises(ValueError, match=r"argument 0: axis 0 of shape \(3, 2\) has size 3") as e:
        gt.vmap(lambda a, b: a + b)(np.ones((3, 2)), np.ones((4, 2)))
    assert "argument 1: axis 0 of shape (4, 2) has size 4" in str(e.value)


def test_other_mistakes_raise_clearly():
    with pytest.raises(ValueError, match="2 entries but the function was called with 1"):
        gt.vmap(lambda a: a, in_axes=(0, 0))(np.ones(3))
    with pytest.raises(ValueError, match="scalar cannot be mapped"):
        gt.vmap(lambda a: a)(1.0)
    with pytest.raises(ValueError, match="out of range"):
        gt.vmap(lambda a: a, in_axes=2)(np.ones((3, 2)))
    with pytest.raises(ValueError, match="at least one batched argument"):
        gt.vmap(lambda a: a, in_axes=None)(np.ones(3))


def test_a_branch_that_differs_across_the_batch_is_refused_with_the_line():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(gt.GradtapeError, match=r"test_vmap.py:\d+: .*if x.sum\(\) > 0.*differs"):
        gt.vmap(f)(np.array([[1.0], [-1.0]]))
    _close(gt.vmap(f)(np.array([[1.0], [2.0]])), np.array([[1.0], [2.0]]))


def test_results_of_different_shapes_across_the_batch_are_refused():
    with pytest.raises(gt.GradtapeError, match=r"test_vmap.py:\d+: .*nonzero gives results of"):
        gt.vmap(lambda x: np.nonzero(x > 0)[0])(np.array([[1.0, -1.0], [1.0, 1.0]]))


# --- composition with the other transforms -----------------------------------------------------
def _logistic(w, x, y):
    return np.log1p(np.exp(-y * (x @ w))) + 0.01 * np.sum(w * w)


def _logistic_data(n=6, d=3):
    return RNG.normal(size=d), RNG.normal(size=(n, d)), np.sign(RNG.normal(size=n))


def test_per_example_gradients_are_vmap_of_grad():
    w, X, Y = _logistic_data()
    out = gt.vmap(gt.grad(_logistic), in_axes=(None, 0, 0))(w, X, Y)
    _close(out, _loop(gt.grad(_logistic), [w, X, Y], [None, 0, 0]))


def test_grad_of_vmap_is_the_gradient_of_the_summed_loss():
    w, X, Y = _logistic_data()
    g = gt.grad(lambda w: np.sum(gt.vmap(_logistic, in_axes=(None, 0, 0))(w, X, Y)))(w)
    _close(g, sum(gt.grad(_logistic)(w, X[i], Y[i]) for i in range(len(X))))


def test_vmap_of_vmap_and_of_jacobian_hessian_hvp():
    A = RNG.normal(size=(3, B, 2))

    def f(x):
        return np.sum(np.sin(x) ** 3) + np.prod(x)

    _close(gt.vmap(gt.vmap(f))(A), np.array([[f(a) for a in row] for row in A]))
    X = A[0]
    _close(gt.vmap(gt.hessian(f))(X), _loop(gt.hessian(f), [X], [0]))
    _close(gt.vmap(gt.jacobian(np.sin))(X), _loop(gt.jacobian(np.sin), [X], [0]))
    _close(gt.vmap(gt.jacfwd(np.tanh))(X), _loop(gt.jacfwd(np.tanh), [X], [0]))
    V = RNG.normal(size=X.shape)
    hv = gt.vmap(lambda x, v: gt.hvp(f, x, v))(X, V)
    _close(hv, _loop(lambda x, v: gt.hvp(f, x, v), [X, V], [0, 0]))
    jv = gt.vmap(lambda x, v: gt.jvp(np.sin, (x,), (v,))[1])(X, V)
    _close(jv, np.cos(X) * V)


def test_grad_of_grad_inside_vmap_and_vmap_inside_grad_of_grad():
    X = RNG.normal(size=(B, 2))

    def f(x):
        return np.sum(np.exp(x) * x)

    second = gt.vmap(gt.grad(lambda x: np.sum(gt.grad(f)(x))))(X)
    _close(second, np.exp(X) * (X + 2))
    outer = gt.grad(lambda X: np.sum(gt.vmap(gt.grad(f))(X)))(X)
    _close(outer, np.exp(X) * (X + 2))


# --- loops ---------------------------------------------------------------------------------------
def test_scan_and_fori_loop_under_vmap_and_their_gradients():
    X = RNG.normal(size=(B, 3))

    def f(x):
        def body(c, xi):
            c = c * 0.9 + np.sin(xi) * x[0]
            return c, c * 2

        c, ys = gt.scan(body, x[1], x)
        return c + ys.sum() + gt.fori_loop(0, 3, lambda i, c: c * np.cos(c), x).sum()

    _close(gt.vmap(f)(X), _loop(f, [X], [0]))
    _close(gt.vmap(gt.grad(f))(X), _loop(gt.grad(f), [X], [0]))
    _close(gt.grad(lambda X: gt.vmap(f)(X).sum())(X), _loop(gt.grad(f), [X], [0]))


def _until_large(x):
    return gt.while_loop(
        lambda c: c[1] < 3 + 10 * np.abs(x[0]), lambda c: (c[0] * 1.1, c[1] + 1), (x, 0)
    )


def test_while_loop_with_a_batched_predicate_runs_until_every_member_is_done():
    X = RNG.normal(size=(5, 3)) * 2
    out = gt.vmap(_until_large)(X)
    ref = _loop(_until_large, [X], [0])
    assert len(set(ref[1].tolist())) > 1  # the members take different numbers of steps
    _close(out, ref)
    g = gt.grad(lambda X: gt.vmap(_until_large)(X)[0].sum())(X)
    _close(g, _loop(gt.grad(lambda x: _until_large(x)[0].sum()), [X], [0]))
    compiled = gt.compile(gt.vmap(_until_large), backend="numpy")
    _close(compiled(X), ref)
    _close(compiled(X / 2), _loop(_until_large, [X / 2], [0]))


def test_while_loop_differentiated_per_member_needs_equal_trip_counts():
    loss = gt.grad(lambda x: _until_large(x)[0].sum())
    same = np.ones((3, 3))
    _close(gt.vmap(loss)(same), _loop(loss, [same], [0]))
    with pytest.raises(gt.GradtapeError, match="different numbers of iterations"):
        gt.vmap(loss)(RNG.normal(size=(5, 3)) * 2)


# --- compiled ------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=pytest.mark.native)])
def test_compiled_per_example_gradients(backend):
    w, X, Y = _logistic_data(50, 4)
    f = gt.compile(gt.vmap(gt.grad(_logistic), in_axes=(None, 0, 0)), backend=backend)
    ref = _loop(gt.grad(_logistic), [w, X, Y], [None, 0, 0])
    for _ in range(3):
        _close(f(w, X, Y), ref)
    w2 = w + 1.0
    _close(f(w2, X, Y), _loop(gt.grad(_logistic), [w2, X, Y], [None, 0, 0]))


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=pytest.mark.native)])
def test_compiled_batched_hessians(backend):
    X = RNG.normal(size=(20, 5))

    def f(x):
        return np.sum(np.log1p(np.exp(x))) + 0.5 * np.sum(x**2) * np.sum(np.sin(x))

    h = gt.compile(gt.vmap(gt.hessian(f)), backend=backend)
    _close(h(X), _loop(gt.hessian(f), [X], [0]))


def test_the_compiled_batched_tape_has_no_loop_over_members():
    w, X, Y = _logistic_data(7, 3)
    tape = gt.trace(gt.vmap(gt.grad(_logistic), in_axes=(None, 0, 0)), w, X, Y)
    assert not any(ins.prim.name == "getitem" for ins in tape.instructions), tape


# --- JAX as a second oracle ----------------------------------------------------------------------
def test_against_jax_per_example_gradients_and_hessians():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    w, X, Y = _logistic_data(8, 3)

    def jloss(w, x, y):
        return jnp.log1p(jnp.exp(-y * (x @ w))) + 0.01 * jnp.sum(w * w)

    ref = jax.vmap(jax.grad(jloss), in_axes=(None, 0, 0))(w, X, Y)
    _close(gt.vmap(gt.grad(_logistic), in_axes=(None, 0, 0))(w, X, Y), np.asarray(ref))
    ref_h = jax.vmap(jax.hessian(jloss), in_axes=(None, 0, 0))(w, X, Y)
    _close(gt.vmap(gt.hessian(_logistic), in_axes=(None, 0, 0))(w, X, Y), np.asarray(ref_h))
    ref_o = jax.vmap(lambda x: (x.sum(), x), out_axes=(0, 1))(X)
    out = gt.vmap(lambda x: (x.sum(), x), out_axes=(0, 1))(X)
    _close(out, tuple(np.asarray(r) for r in ref_o))


# --- the documentation's examples run and check themselves --------------------------------------
DOCS = Path(__file__).resolve().parent.parent / "docs" / "transforms"


def _python_blocks(page):
    text = (DOCS / page).read_text()
    return [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]


@pytest.mark.parametrize(
    "page, block",
    [(p.name, i) for p in sorted(DOCS.glob("*.md")) for i in range(len(_python_blocks(p.name)))],
)
def test_documentation_examples(page, block):
    exec(compile(_python_blocks(page)[block], f"{page}[{block}]", "exec"), {})


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=pytest.mark.native)])
def test_a_batched_scan_is_one_scan_over_the_batch(backend):
    X = RNG.normal(size=(6, 5))

    def f(x):
        c, ys = gt.scan(lambda c, xi: (c * 0.5 + np.sin(xi) * x[0], c * xi), x[1], x, length=5)
        return c + np.sum(ys)

    tape = gt.trace(gt.vmap(f), X)
    assert [ins.prim.name for ins in tape.instructions].count("scan") == 1, tape
    compiled = gt.compile(gt.vmap(f), backend=backend)
    for _ in range(3):
        _close(compiled(X), _loop(f, [X], [0]))
    rev = gt.vmap(lambda x: gt.scan(lambda c, xi: (c + xi, c), 0.0, x, reverse=True)[1])(X)
    _close(
        rev, _loop(lambda x: gt.scan(lambda c, xi: (c + xi, c), 0.0, x, reverse=True)[1], [X], [0])
    )


def test_custom_rules_are_used_when_a_vmap_is_differentiated():
    @gt.custom_vjp
    def clipped_identity(x):
        return x

    clipped_identity.defvjp(lambda x: (x, None), lambda res, g: (np.clip(g, -1.0, 1.0),))

    @gt.custom_jvp
    def safe_log(x):
        return np.log(x)

    safe_log.defjvp(lambda primals, tangents: (np.log(primals[0]), tangents[0] * 7.0))

    X = RNG.normal(size=(3, 2)) * 5
    g = gt.grad(lambda X: np.sum(gt.vmap(clipped_identity)(X) * 3.0))(X)
    _close(g, np.ones_like(X))  # 3, clipped to 1 by the rule
    per_member = gt.vmap(gt.grad(lambda x: np.sum(clipped_identity(x) * 3.0)))(X)
    _close(per_member, np.ones_like(X))
    P = np.abs(X) + 1
    _close(gt.grad(lambda P: np.sum(gt.vmap(safe_log)(P)))(P), np.full_like(P, 7.0))
    _close(gt.vmap(safe_log)(P), np.log(P))
