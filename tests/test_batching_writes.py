"""vmap of writes and gathers whose indices are members of the batch, composed with every
derivative: np.add.at, `out[idx] += v` and `out[idx] = v` with repeated indices, np.put,
np.put_along_axis, np.place, np.copyto(where=), np.take, and scipy.linalg.lu's permutation.

The reference is vmap's definition: gradtape's derivative of each member alone, the results
stacked. Each member has its own indices (repeated ones included), the differentiated
parameter is batched or shared (in_axes None), and Hypothesis draws the batch size, the
number of indices and the axes. Forward mode is checked against reverse mode, compiled
programs against the eager result on indices they were not recorded with, and, where JAX is
installed, jax.vmap of the same function written with `.at[]` is a second oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradtape as gt

sl = pytest.importorskip("scipy.linalg")

N = 6  # the length of the parameter w each function writes into


def _add_at(w, x, i):
    out = np.sin(w)
    np.add.at(out, i, x * w[i])
    return out * w


def _plus_equals(w, x, i):
    out = np.sin(w)
    out[i] += x * w[0]  # buffered: of repeated indices, the last write counts
    return out * np.cos(w)


def _set(w, x, i):
    out = np.sin(w)
    out[i] = x * np.cos(w[i])
    return out * w


def _put(w, x, i):
    out = np.sin(w)
    np.put(out, i, x**2 * w[1])
    return out * w


def _put_wrap(w, x, i):
    out = np.sin(w)
    np.put(out, i + N, x * w[2], mode="wrap")
    return out * w


def _put_along_axis(w, x, i):
    out = np.outer(w, np.arange(1.0, 4.0))
    rows = np.stack([i, i[::-1], (i + 1) % N], axis=1)
    np.put_along_axis(out, rows, x[:, None] * w[:3], axis=0)
    return np.sum(out * np.cos(out), axis=1)


def _add_at_2d(w, x, i):
    out = np.stack([w, w**2], axis=1)
    np.add.at(out, (i, i % 2), x * w[i])
    return out[:, 0] * out[:, 1]


def _gathers(w, x, i):
    picked = np.take(w, i) * x + np.take_along_axis(w, i, axis=0) ** 2
    return np.sin(w) * np.sum(picked) + np.sum(w[i] * w[i[::-1]])


WRITES = {
    "add.at": _add_at,
    "out[i] += v": _plus_equals,
    "out[i] = v": _set,
    "put": _put,
    "put wrap": _put_wrap,
    "put_along_axis": _put_along_axis,
    "add.at 2-d": _add_at_2d,
    "take, take_along_axis, w[i]": _gathers,
}


def _members(seed: int, size: int, k: int):
    """Per member: w (N,), x (k,), i (k,) with repeats (the first index twice when k > 1)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(size, N))
    x = rng.normal(size=(size, k))
    i = rng.integers(0, N, size=(size, k))
    if k > 1:
        i[:, -1] = i[:, 0]
    return w, x, i


def _loss(f):
    weights = np.linspace(0.5, 1.5, N)
    return lambda w, x, i: np.sum(np.sin(f(w, x, i)) * weights)


def _each(fn, w, x, i, shared_w: bool):
    outs = [fn(w if shared_w else w[m], x[m], i[m]) for m in range(x.shape[0])]
    return gt.tree_util.tree_map(lambda *ms: np.stack(ms), *outs)


def _assert_tree_close(got, want, tol=1e-12):
    got_leaves, want_leaves = gt.tree_util.tree_leaves(got), gt.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert np.shape(g) == np.shape(w), (np.shape(g), np.shape(w))
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(WRITES)),
    size=st.integers(1, 4),
    k=st.integers(1, 5),
    shared_w=st.booleans(),
    x_axis=st.sampled_from([0, -1]),
    out_axis=st.sampled_from([0, -1]),
    seed=st.integers(0, 2**16),
)
def test_value_and_gradient_of_each_member(name, size, k, shared_w, x_axis, out_axis, seed):
    """vmap(value_and_grad) with per-member indices equals each member's own, whatever the
    batch size, the number of (repeated) indices, and the axes in and out."""
    w, x, i = _members(seed, size, k)
    w = w[0] if shared_w else w
    vg = gt.value_and_grad(_loss(WRITES[name]), argnums=(0, 1))
    want_value, (want_gw, want_gx) = _each(vg, w, x, i, shared_w)
    in_axes = (None if shared_w else 0, x_axis, 0)
    x_in = np.moveaxis(x, 0, x_axis)
    value, (gw, gx) = gt.vmap(vg, in_axes=in_axes, out_axes=out_axis)(w, x_in, i)
    _assert_tree_close(value, want_value)
    _assert_tree_close(np.moveaxis(gw, out_axis, 0), want_gw)
    _assert_tree_close(np.moveaxis(gx, out_axis, 0), want_gx)


@pytest.mark.parametrize("name", sorted(WRITES))
@pytest.mark.parametrize("shared_w", [True, False])
def test_grad_of_vmap_is_the_sum_of_the_members_gradients(name, shared_w):
    w, x, i = _members(5, 3, 4)
    w = w[0] if shared_w else w
    loss = _loss(WRITES[name])
    total = lambda w, x: np.sum(gt.vmap(loss, in_axes=(None if shared_w else 0, 0, 0))(w, x, i))  # noqa: E731
    gw, gx = gt.grad(total, argnums=(0, 1))(w, x)
    members_w, members_x = _each(gt.grad(loss, argnums=(0, 1)), w, x, i, shared_w)
    _assert_tree_close(gw, np.sum(members_w, axis=0) if shared_w else members_w)
    _assert_tree_close(gx, members_x)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_forward_and_reverse_jacobians_and_hessians_agree_with_each_member(name):
    f = WRITES[name]
    w, x, i = _members(11, 3, 4)
    for transform in (gt.jacfwd, gt.jacrev):
        jac = transform(f, argnums=(0, 1))
        got = gt.vmap(jac, in_axes=(None, 0, 0))(w[0], x, i)
        _assert_tree_close(got, _each(jac, w[0], x, i, True))
    forward = gt.vmap(gt.jacfwd(f), in_axes=(0, 0, 0))(w, x, i)
    reverse = gt.vmap(gt.jacrev(f), in_axes=(0, 0, 0))(w, x, i)
    _assert_tree_close(forward, reverse)
    hess = gt.hessian(_loss(f))
    _assert_tree_close(gt.vmap(hess, in_axes=(0, 0, 0))(w, x, i), _each(hess, w, x, i, False))


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_batch_is_recorded_once_whatever_its_size(name):
    """No primitive runs once per member: the recorded per-example gradient of a batch of 2
    and of 5 is the same list of primitives."""

    def recorded(size):
        w, x, i = _members(3, size, 4)
        per_example = gt.vmap(gt.grad(_loss(WRITES[name])), in_axes=(None, 0, 0))
        return [ins.prim.name for ins in gt.trace(per_example, w[0], x, i).instructions]

    assert recorded(2) == recorded(5)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_compiled_batch_replays_other_indices(name):
    """The indices are data of the compiled program: other indices (other repeats) replay
    it with each member's numbers."""
    per_example = gt.vmap(gt.grad(_loss(WRITES[name]), argnums=(0, 1)), in_axes=(None, 0, 0))
    compiled = gt.compile(per_example, backend="numpy")
    for seed in (1, 2, 3):
        w, x, i = _members(seed, 3, 4)
        want = _each(gt.grad(_loss(WRITES[name]), argnums=(0, 1)), w[0], x, i, True)
        _assert_tree_close(compiled(w[0], x, i), want)


def test_a_compiled_gradient_of_a_write_at_traced_indices_replays_other_repeats():
    """Which of repeated indices' writes survive is computed from the indices the program
    is called with, not baked in from the first call."""

    def f(x, i):
        out = np.zeros_like(x)[:4]
        out[i] = x
        return np.sum(out**2 * np.arange(1.0, 5.0))

    compiled = gt.compile(gt.grad(f), backend="numpy")
    x = np.arange(1.0, 6.0)
    for i in ([0, 0, 1, 2, 3], [0, 1, 1, 2, 3], [3, 3, 3, 3, 3]):
        np.testing.assert_array_equal(compiled(x, np.array(i)), gt.grad(f)(x, np.array(i)))


# --- masks that differ per member -------------------------------------------------------------
def _place(w, mask):
    out = w * 1.0
    np.place(out, mask, np.cos(w[:2]))
    return out * w


def _copyto(w, mask):
    out = w * 1.0
    np.copyto(out, w**3, where=mask)
    return out * w


def _putmask(w, mask):
    out = w * 1.0
    np.putmask(out, mask, w**2)
    return out


MASKED = {"place": _place, "copyto where": _copyto, "putmask": _putmask}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(MASKED)), size=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_masked_writes_with_a_mask_per_member(name, size, seed):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(size, N))
    mask = rng.random((size, N)) < 0.5
    f = MASKED[name]
    loss = lambda w, m: np.sum(np.sin(f(w, m)))  # noqa: E731
    outs = [f(w[m], mask[m]) for m in range(size)]
    _assert_tree_close(gt.vmap(f)(w, mask), np.stack(outs))
    grads = np.stack([gt.grad(loss)(w[m], mask[m]) for m in range(size)])
    _assert_tree_close(gt.vmap(gt.grad(loss))(w, mask), grads)
    _assert_tree_close(gt.grad(lambda w: np.sum(gt.vmap(loss)(w, mask)))(w), grads)
    jac = np.stack([gt.jacfwd(f)(w[m], mask[m]) for m in range(size)])
    _assert_tree_close(gt.vmap(gt.jacrev(f))(w, mask), jac)


def test_place_refuses_an_empty_values_array_where_a_member_writes():
    w = np.ones((2, 3))
    mask = np.array([[False, False, False], [True, False, False]])

    def f(w, m):
        out = w * 1.0
        np.place(out, m, w[:0])
        return out

    with pytest.raises(ValueError, match="empty array"):
        gt.vmap(f)(w, mask)
    np.testing.assert_array_equal(gt.vmap(f)(w, mask & False), w)


def test_put_raises_for_an_index_out_of_bounds_in_any_member():
    def f(w, i):
        out = w * 1.0
        np.put(out, i, 1.0)
        return out

    with pytest.raises(IndexError, match="out of bounds"):
        gt.vmap(f)(np.ones((2, 3)), np.array([[0], [3]]))


# --- scipy.linalg.lu: P from each member's pivots -----------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(1, 4),
    shape=st.sampled_from([(3, 3), (4, 4), (4, 2), (2, 4)]),
    form=st.sampled_from(["p", "p_indices", "permute_l"]),
    seed=st.integers(0, 2**16),
)
def test_lu_of_each_member(size, shape, form, seed):
    a = np.random.default_rng(seed).normal(size=(size, *shape))
    options = {"p": {}, "p_indices": {"p_indices": True}, "permute_l": {"permute_l": True}}[form]
    f = lambda a: sl.lu(a, **options)  # noqa: E731
    got = gt.vmap(f)(a)
    want = tuple(np.stack(parts) for parts in zip(*[sl.lu(m, **options) for m in a]))
    for g, w in zip(got, want, strict=True):
        assert g.dtype.kind == w.dtype.kind
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)

    def loss(a):
        parts = sl.lu(a, **options)
        p_l = parts[0] @ parts[1] if form == "p" else parts[0] if form == "permute_l" else parts[1]
        return np.sum(np.sin(p_l) * np.arange(p_l.size).reshape(p_l.shape)) * np.sum(
            np.cos(parts[-1])
        )

    grads = np.stack([gt.grad(loss)(m) for m in a])
    np.testing.assert_allclose(gt.vmap(gt.grad(loss))(a), grads, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gt.vmap(gt.jacfwd(loss))(a), grads, rtol=1e-10, atol=1e-10)


# --- JAX as a second oracle -----------------------------------------------------------------------
def _jax_functions(jnp):
    def add_at(w, x, i):
        return (jnp.sin(w).at[i].add(x * w[i])) * w

    def add_at_2d(w, x, i):
        out = jnp.stack([w, w**2], axis=1).at[i, i % 2].add(x * w[i])
        return out[:, 0] * out[:, 1]

    def gathers(w, x, i):
        picked = jnp.take(w, i) * x + jnp.take_along_axis(w, i, axis=0) ** 2
        return jnp.sin(w) * jnp.sum(picked) + jnp.sum(w[i] * w[i[::-1]])

    return {"add.at": add_at, "add.at 2-d": add_at_2d, "take, take_along_axis, w[i]": gathers}


@pytest.mark.parametrize("name", ["add.at", "add.at 2-d", "take, take_along_axis, w[i]"])
def test_jax_vmap_of_grad_agrees(name):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    jf = _jax_functions(jnp)[name]
    weights = np.linspace(0.5, 1.5, N)
    jloss = lambda w, x, i: jnp.sum(jnp.sin(jf(w, x, i)) * weights)  # noqa: E731
    w, x, i = _members(4, 3, 5)
    want = jax.vmap(jax.grad(jloss, argnums=(0, 1)), in_axes=(None, 0, 0))(w[0], x, i)
    got = gt.vmap(gt.grad(_loss(WRITES[name]), argnums=(0, 1)), in_axes=(None, 0, 0))(w[0], x, i)
    _assert_tree_close(got, tuple(np.asarray(g) for g in want), tol=1e-11)


def test_add_at_with_a_tuple_of_traced_index_arrays_is_a_multi_axis_index():
    """np.add.at(out, (rows, cols), v): the tuple is one index of two axes, not an array of
    rows to stack, with traced integers too (a compiled program's inputs, a batch's members)."""

    def f(x, rows, cols):
        out = x * 1.0
        np.add.at(out, (rows, cols), 1.0)
        return out

    x, rows, cols = np.zeros((3, 3)), np.array([0, 1, 1]), np.array([2, 2, 2])
    compiled = gt.compile(f, backend="numpy")
    np.testing.assert_array_equal(compiled(x, rows, cols), f(x, rows, cols))
    np.testing.assert_array_equal(compiled(x, rows[::-1], cols - 2), f(x, rows[::-1], cols - 2))
    xs, batch_rows = np.ones((2, 3, 3)), np.array([[0, 1, 1], [2, 2, 0]])
    want = np.stack([f(x, r, cols) for x, r in zip(xs, batch_rows)])
    np.testing.assert_array_equal(gt.vmap(f, in_axes=(0, 0, None))(xs, batch_rows, cols), want)


# --- x[mask] reads and writes with a mask per member ---------------------------------------------
def _mask_read_write(x):
    y = x * 1.0
    y[x > 0] = x[x > 0] ** 2  # as many values as the mask selects
    return y * np.sum(x[x < 0])


def _piecewise(x):
    return np.piecewise(x, [x < -0.5, x > 0.5], [np.sin, np.exp, lambda v: -v])


def _zscore(x):
    return sps.zscore(x)  # SciPy writes through its array-API helpers at a mask


sps = pytest.importorskip("scipy.stats")
SAME_COUNTS = {
    "x[mask] read and write": _mask_read_write,
    "piecewise": _piecewise,
    "zscore": _zscore,
}


def _same_counts(seed: int, size: int, n: int) -> np.ndarray:
    """Members that are permutations of one another: every mask selects as many elements."""
    rng = np.random.default_rng(seed)
    first = rng.normal(size=n)
    return np.stack([rng.permutation(first) for _ in range(size)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(SAME_COUNTS)),
    size=st.integers(1, 4),
    n=st.integers(2, 7),
    seed=st.integers(0, 2**16),
)
def test_masks_per_member_that_select_as_many_elements(name, size, n, seed):
    f = SAME_COUNTS[name]
    x = _same_counts(seed, size, n)
    _assert_tree_close(gt.vmap(f)(x), np.stack([f(m) for m in x]))
    loss = lambda x: np.sum(np.sin(f(x)))  # noqa: E731
    grads = np.stack([gt.grad(loss)(m) for m in x])
    _assert_tree_close(gt.vmap(gt.grad(loss))(x), grads)
    _assert_tree_close(gt.grad(lambda x: np.sum(gt.vmap(loss)(x)))(x), grads)
    jac = np.stack([gt.jacrev(f)(m) for m in x])
    _assert_tree_close(gt.vmap(gt.jacfwd(f))(x), jac)
    _assert_tree_close(gt.vmap(gt.jacrev(f))(x), jac)


def test_a_mask_per_member_is_one_batched_gather_not_a_loop():
    def recorded(size):
        x = _same_counts(0, size, 6)
        return [ins.prim.name for ins in gt.trace(gt.vmap(_mask_read_write), x).instructions]

    assert recorded(2) == recorded(5)


def test_masks_that_select_different_numbers_of_elements_are_refused_clearly():
    x = np.array([[1.0, -2.0, 3.0], [1.0, 2.0, 3.0]])
    with pytest.raises(gt.GradtapeError, match="different number of elements"):
        gt.vmap(_mask_read_write)(x)

    def write(x):
        y = x * 1.0
        y[x > 0] = np.array([5.0, 6.0])
        return y

    with pytest.raises(ValueError, match="cannot assign 2 input values"):
        gt.vmap(write)(x)


def test_histogram_edges_from_each_members_range():
    x = np.random.default_rng(2).normal(size=(3, 8))
    for bins in (4, "auto"):
        f = lambda x: np.histogram(x, bins=bins)[1]  # noqa: E731
        _assert_tree_close(gt.vmap(f)(x), np.stack([f(m) for m in x]))
        _assert_tree_close(gt.vmap(gt.jacrev(f))(x), np.stack([gt.jacrev(f)(m) for m in x]))
