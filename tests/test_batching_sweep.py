"""A sweep of vmap over functions of every family of primitives, composed with each
derivative: vmap(f), vmap(grad(f)), grad of vmap(f) summed, vmap(jacfwd(f)) and
vmap(jacrev(f)), each against gradtape's result for each member alone (the definition of
vmap), with members that differ (zeros in some members only, ties, other signs, other
pivots), so that a rule taking one member's path for the whole batch shows.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradtape as gt

sl = pytest.importorskip("scipy.linalg")
special = pytest.importorskip("scipy.special")


def _vectors(rng, size):
    x = rng.normal(size=(size, 6))
    x[0, 2] = 0.0  # a zero in one member only (cumprod, prod take another path there)
    x[-1, 4] = x[-1, 1]  # a tie in another
    return (x,)


def _matrices(rng, size):
    return (rng.normal(size=(size, 4, 4)) + 3 * np.eye(4),)


def _spd(rng, size):
    a = rng.normal(size=(size, 4, 4))
    return (a @ np.swapaxes(a, -1, -2) + 4 * np.eye(4),)


def _positive(rng, size):
    return (rng.uniform(0.3, 2.0, size=(size, 5)),)


def _matrix_vector(rng, size):
    return rng.normal(size=(size, 4, 4)) + 3 * np.eye(4), rng.normal(size=(size, 4))


FUNCTIONS = {
    "cumprod": (lambda x: np.cumprod(x), _vectors),
    "prod": (lambda x: np.prod(x) * x, _vectors),
    "cumsum and diff": (lambda x: np.diff(np.cumsum(x**2)), _vectors),
    "max min": (lambda x: np.max(x) * x + np.min(x[:4]), _vectors),
    "sort": (lambda x: np.sort(x) * np.arange(6.0), _vectors),
    "argsort gather": (lambda x: x[np.argsort(x)] ** 2, _vectors),
    "where": (lambda x: np.where(x > 0, x**2, np.sin(x)), _vectors),
    "clip abs": (lambda x: np.clip(x, -0.5, 0.5) + np.abs(x), _vectors),
    "norm": (lambda x: np.linalg.norm(x) * x, _vectors),
    "logsumexp": (lambda x: special.logsumexp(x) - x, _vectors),
    "softmax": (lambda x: special.softmax(x), _vectors),
    "median": (lambda x: np.median(x) + x, _vectors),
    "percentile": (lambda x: np.percentile(x, [20.0, 70.0]), _vectors),
    "std var": (lambda x: np.std(x) * x + np.var(x[:3]), _vectors),
    "convolve": (lambda x: np.convolve(x, x[::-1]), _vectors),
    "fft": (lambda x: np.abs(np.fft.rfft(x)) ** 2, _vectors),
    "interp": (lambda x: np.interp(x, [-1.0, 0.0, 1.0], [0.5, -1.0, 2.0]), _vectors),
    "outer einsum": (lambda x: np.einsum("i,j->ij", x, np.sin(x)), _vectors),
    "gammaln digamma": (lambda x: special.gammaln(x) * special.digamma(x), _positive),
    "log1p pow": (lambda x: np.log1p(x) ** 1.5 + x**x, _positive),
    "inv det": (lambda a: np.linalg.inv(a) * np.linalg.det(a), _matrices),
    "slogdet": (lambda a: np.linalg.slogdet(a)[1] * a, _matrices),
    "solve": (lambda a, b: np.linalg.solve(a, b), _matrix_vector),
    "lu_factor lu_solve": (lambda a, b: sl.lu_solve(sl.lu_factor(a), b), _matrix_vector),
    "lu": (lambda a: (lambda p, low, up: p @ low * up)(*sl.lu(a)), _matrices),
    "qr": (lambda a: np.linalg.qr(a)[1], _matrices),
    "svd": (lambda a: np.linalg.svd(a, compute_uv=False), _matrices),
    "eigh": (lambda a: np.linalg.eigh(a)[0], _spd),
    "cholesky cho_solve": (lambda a: sl.cho_solve(sl.cho_factor(a), a[0]), _spd),
    "expm": (lambda a: sl.expm(0.3 * a), _matrices),
    "solve_triangular": (lambda a, b: sl.solve_triangular(a, b, lower=True), _matrix_vector),
}
SIZE = 3


def _each(fn, args):
    outs = [fn(*(a[m] for a in args)) for m in range(SIZE)]
    return gt.tree_util.tree_map(lambda *ms: np.stack([np.asarray(m) for m in ms]), *outs)


def _assert_close(got, want, tol=1e-10):
    got_leaves, want_leaves = gt.tree_util.tree_leaves(got), gt.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _loss(f):
    return lambda *a: sum(np.sum(np.sin(leaf) * 0.7) for leaf in gt.tree_util.tree_leaves(f(*a)))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_composition_equals_each_member(name):
    f, draw = FUNCTIONS[name]
    args = draw(np.random.default_rng(0), SIZE)
    nums = tuple(range(len(args)))
    _assert_close(gt.vmap(f)(*args), _each(f, args))
    grad = gt.grad(_loss(f), argnums=nums)
    per_member = _each(grad, args)
    _assert_close(gt.vmap(grad)(*args), per_member)
    total = gt.grad(lambda *a: np.sum(gt.vmap(_loss(f))(*a)), argnums=nums)
    _assert_close(total(*args), per_member)
    for jac in (gt.jacfwd(f, argnums=nums), gt.jacrev(f, argnums=nums)):
        _assert_close(gt.vmap(jac)(*args), _each(jac, args))


def test_cumprod_where_only_some_members_hold_a_zero():
    """The quotient form of cumprod's derivative is exact only without zeros: a batch with
    a zero in one member takes the zero-safe form for all (it is exact for every member)."""
    x = np.array([[2.0, 0.0, 3.0, -1.0], [2.0, 1.0, 3.0, -1.0], [0.0, 0.0, 1.5, 2.0]])
    w = np.array([1.0, -2.0, 0.5, 3.0])
    loss = lambda x: np.sum(w * np.cumprod(x))  # noqa: E731
    want = np.stack([gt.grad(loss)(m) for m in x])
    np.testing.assert_array_equal(gt.vmap(gt.grad(loss))(x), want)
    np.testing.assert_array_equal(gt.vmap(gt.jacfwd(np.cumprod))(x), _each_row(x))
    compiled = gt.compile(gt.vmap(gt.grad(loss)), backend="numpy")
    np.testing.assert_array_equal(compiled(x[1:2]), want[1:2])
    np.testing.assert_array_equal(compiled(x[:1]), want[:1])


def _each_row(x):
    return np.stack([gt.jacrev(np.cumprod)(m) for m in x])


def test_histograms_with_each_members_own_edges_are_one_batched_search():
    """np.histogram(x, bins=5) takes its edges from each member's range: the bin of each
    element is a search of each member's edges, all members at once."""
    x = np.random.default_rng(0).normal(size=(4, 9))
    x[1, 3] = x[1].max()  # an element on the last edge
    f = lambda x: np.histogram(x, bins=5)[0]  # noqa: E731
    np.testing.assert_array_equal(gt.vmap(f)(x), np.stack([f(m) for m in x]))
    g = lambda x: np.sum(np.histogram(x, bins=5, weights=x**2)[0] * np.arange(5))  # noqa: E731
    np.testing.assert_allclose(
        gt.vmap(gt.grad(g))(x), np.stack([gt.grad(g)(m) for m in x]), rtol=1e-12
    )

    def recorded(size):
        return [ins.prim.name for ins in gt.trace(gt.vmap(f), x[:size]).instructions]

    assert recorded(2) == recorded(4)
