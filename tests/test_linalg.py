"""Linear algebra rules, checked against numbers gradtape does not compute.

References: central differences and complex step of the plain NumPy functions, closed
forms (Gaussian log-likelihood), and the adjoint identity <u, J v> == <J^T u, v> between
each primitive's JVP rule and gradtape's VJP. Shapes, batches and values are generated.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_grad_matches, central_difference_grad
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.rules import linalg as la

SETTINGS = settings(max_examples=25, deadline=None)
PER_CASE = settings(max_examples=6, deadline=None)  # tests parametrized over the primitives
SEEDS = st.integers(0, 2**32 - 1)
BATCHES = [(), (2,), (1,), (2, 1), (3, 2)]
SIZES = st.integers(1, 4)


# --- independent references (central differences and complex step: tests/conftest.py) ----------
def _leaves(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _mT(x):
    return np.swapaxes(x, -1, -2)


def central_jvp(f, args: tuple, tangents: tuple, h: float = 1e-6) -> list:
    """The directional derivative of every output of f by central differences."""
    plus = _leaves(f(*(a + h * t for a, t in zip(args, tangents))))
    minus = _leaves(f(*(a - h * t for a, t in zip(args, tangents))))
    return [(p - m) / (2 * h) for p, m in zip(plus, minus)]


def assert_close(actual, expected, rtol: float = 1e-6):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


def projected(f, out_example, seed: int = 7):
    """A scalar function sum_k <C_k, f(...)_k> with fixed random C_k: it sees every output."""
    rng = np.random.default_rng(seed)
    cs = [rng.standard_normal(np.shape(o)) for o in _leaves(out_example)]
    return lambda *xs: sum(np.sum(c * o) for c, o in zip(cs, _leaves(f(*xs))))


def check_gradients(f, *args, holomorphic: bool = False, rtol: float | None = None):
    """The gradient of a projection of f w.r.t. every argument vs central differences, and
    vs the complex step where f is analytic (matmul, inv, solve, ...: not eigh or cholesky,
    which conjugate complex input). float32 arguments: float32 gradients, looser tolerance."""
    # contiguous copies: conftest's differences perturb a flat view, which a transposed or
    # sliced array would not be
    args = tuple(np.ascontiguousarray(a) for a in args)
    check_values(f, *args)
    assert_grad_matches(projected(f, f(*args)), *args, argnums=tuple(range(len(args))),
                        complex_step=holomorphic, require_complex_step=holomorphic, rtol=rtol)


def check_values(f, *args):
    """Traced, f computes what NumPy computes: same shapes, dtypes and (to rounding) values."""
    traced, expected = _leaves(gt.vjp(f, *args)[0]), _leaves(f(*args))
    assert len(traced) == len(expected)
    for t, e in zip(traced, expected):
        assert np.shape(t) == np.shape(e) and np.result_type(t) == np.result_type(e)
        tol = 1e-5 if np.result_type(e) == np.float32 else 1e-12
        np.testing.assert_allclose(t, e, rtol=tol, atol=tol)


def check_float32(f, *args):
    check_gradients(f, *(np.asarray(a, np.float32) for a in args))


# --- well-conditioned inputs ----------------------------------------------------------------------
def normal(rng, shape):
    return rng.standard_normal(shape)


def spd(rng, batch: tuple, n: int):
    """B B^T + n I: symmetric positive definite, condition number of order one."""
    b = rng.standard_normal(batch + (n, n))
    return b @ _mT(b) + n * np.eye(n)


def well_conditioned(rng, batch: tuple, n: int):
    """A non-symmetric matrix with singular values near 1 (some with negative determinant)."""
    return np.eye(n) * rng.choice([-1.0, 1.0], batch + (1, n)) + 0.3 * rng.standard_normal(
        batch + (n, n)) / np.sqrt(n)


def symmetric_spread(rng, batch: tuple, n: int):
    """A symmetric matrix with eigenvalue gaps of at least 0.7."""
    q, _ = np.linalg.qr(rng.standard_normal(batch + (n, n)))
    w = np.arange(1.0, n + 1) + rng.uniform(0, 0.3, batch + (n,))
    return (q * w[..., None, :]) @ _mT(q)


@st.composite
def matmul_shapes(draw):
    """Operand shapes for matmul/dot: 1-D and 2-D mixes and broadcast stacks."""
    m, k, n = draw(SIZES), draw(SIZES), draw(SIZES)
    ba, bb = draw(st.sampled_from(BATCHES)), draw(st.sampled_from(BATCHES))
    try:
        np.broadcast_shapes(ba, bb)
    except ValueError:
        assume(False)
    a = (k,) if draw(st.booleans()) else ba + (m, k)
    b = (k,) if draw(st.booleans()) else bb + (k, n)
    return a, b


# --- contractions -----------------------------------------------------------------------------
@SETTINGS
@given(shapes=matmul_shapes(), seed=SEEDS)
def test_matmul_gradients(shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = (normal(rng, s) for s in shapes)
    check_gradients(lambda x, y: x @ y, a, b, holomorphic=True)
    check_gradients(np.matmul, a, b)


@SETTINGS
@given(shapes=matmul_shapes(), seed=SEEDS)
def test_dot_and_inner_gradients(shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = (normal(rng, s) for s in shapes)
    check_gradients(np.dot, a, b, holomorphic=True)
    check_gradients(np.inner, a, _mT(b) if b.ndim > 1 else b, holomorphic=True)


@SETTINGS
@given(sa=st.lists(SIZES, min_size=1, max_size=3), sb=st.lists(SIZES, min_size=1, max_size=3),
       seed=SEEDS)
def test_dot_nd_outer_vdot_gradients(sa, sb, seed):
    rng = np.random.default_rng(seed)
    a = normal(rng, tuple(sa))
    b_shape = list(sb)
    b_shape.insert(max(len(sb) - 1, 0), sa[-1])  # b's second-to-last axis matches a's last
    b = normal(rng, tuple(b_shape))
    check_gradients(np.dot, a, b, holomorphic=True)
    check_gradients(np.outer, a, b, holomorphic=True)
    check_gradients(np.vdot, a, normal(rng, a.shape))
    check_gradients(lambda x: np.dot(2.0, x), a)


@SETTINGS
@given(seed=SEEDS, k=SIZES, case=st.sampled_from(["int", "pairs", "middle", "zero"]))
def test_tensordot_gradients(seed, k, case):
    rng = np.random.default_rng(seed)
    a, b = normal(rng, (2, k, 3)), normal(rng, (3, k, 2))
    axes = {"int": 1, "pairs": ([1, 2], [1, 0]), "middle": (1, 1), "zero": 0}[case]
    check_gradients(lambda x, y: np.tensordot(x, y, axes), a, b, holomorphic=True)


@SETTINGS
@given(seed=SEEDS, n=st.integers(3, 5), first_1d=st.booleans(), last_1d=st.booleans())
def test_multi_dot_gradients(seed, n, first_1d, last_1d):
    rng = np.random.default_rng(seed)
    dims = rng.integers(1, 5, n + 1)
    arrays = [normal(rng, (dims[i], dims[i + 1])) for i in range(n)]
    if first_1d:
        arrays[0] = arrays[0][0]
    if last_1d:
        arrays[-1] = arrays[-1][:, 0]
    check_gradients(lambda *xs: np.linalg.multi_dot(list(xs)), *arrays, holomorphic=True)


EINSUM_CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),  # implicit
    ("ij,kj", [(2, 3), (4, 3)]),
    ("i,i", [(3,), (3,)]),
    ("ii", [(3, 3)]),  # trace
    ("ii->i", [(3, 3)]),
    ("iij,jk->ik", [(2, 2, 3), (3, 4)]),  # repeated index within one operand
    ("ij->j", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("ij->ji", [(2, 3)]),
    ("i,j->ij", [(2,), (3,)]),
    ("ijk,jl,k->il", [(2, 3, 4), (3, 2), (4,)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    ("...ij,...jk->...ik", [(1, 2, 3), (4, 1, 3, 2)]),  # broadcast ellipsis
    ("...ij,...jk", [(2, 2, 3), (3, 4)]),
    ("i...->...", [(3, 2, 2)]),
    ("ij,ij->ij", [(1, 3), (2, 3)]),  # a size-1 label broadcast
    ("Ab,bC->AC", [(2, 3), (3, 2)]),
]


@pytest.mark.parametrize("subscripts,shapes", EINSUM_CASES)
@settings(max_examples=3, deadline=None)
@given(seed=SEEDS)
def test_einsum_gradients(subscripts, shapes, seed):
    rng = np.random.default_rng(seed)
    ops = [normal(rng, s) for s in shapes]
    check_gradients(lambda *xs: np.einsum(subscripts, *xs), *ops, holomorphic=True)
    gt_out = gt.vjp(lambda *xs: np.einsum(subscripts, *xs), *ops)[0]
    np.testing.assert_allclose(gt_out, np.einsum(subscripts, *ops), rtol=1e-12, atol=1e-12)


def test_einsum_sublist_format_and_optimize():
    rng = np.random.default_rng(0)
    a, b = normal(rng, (2, 3)), normal(rng, (3, 4))
    check_gradients(lambda x, y: np.einsum(x, [0, 1], y, [1, 2], [0, 2]), a, b)
    check_gradients(lambda x, y: np.einsum("ij,jk->ik", x, y, optimize=True), a, b)
    check_gradients(lambda x, y: np.einsum(x, [Ellipsis, 1], y, [1, 2]), a, b)


@SETTINGS
@given(shapes=matmul_shapes(), seed=SEEDS)
def test_matmul_float32(shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = (normal(rng, s) for s in shapes)
    check_float32(np.matmul, a, b)
    check_float32(lambda x, y: np.einsum("...j,...j->...", x, y), a, b[..., 0]
                  if b.ndim > 1 else b)


# --- norm --------------------------------------------------------------------------------------
VECTOR_ORDS = [None, 2, 1, np.inf, -np.inf, 3, 0.5, -2]
MATRIX_ORDS = [None, "fro", 1, -1, np.inf, -np.inf, 2]


@SETTINGS
@given(seed=SEEDS, ord=st.sampled_from(VECTOR_ORDS), axis=st.sampled_from([None, 0, -1, 1]),
       keepdims=st.booleans())
def test_vector_norm_gradients(seed, ord, axis, keepdims):
    rng = np.random.default_rng(seed)
    x = normal(rng, (3,) if axis is None else (3, 4))
    check_gradients(lambda y: np.linalg.norm(y, ord, axis, keepdims), x)


@SETTINGS
@given(seed=SEEDS, ord=st.sampled_from(MATRIX_ORDS),
       axis=st.sampled_from([None, (0, 1), (1, 0), (-1, 0), (0, 2)]), keepdims=st.booleans())
def test_matrix_norm_gradients(seed, ord, axis, keepdims):
    rng = np.random.default_rng(seed)
    x = normal(rng, (3, 4) if axis is None else (3, 4, 2))
    check_gradients(lambda y: np.linalg.norm(y, ord, axis, keepdims), x)


def test_norm_defaults_and_array_api_names():
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    check_gradients(np.linalg.norm, x)
    check_gradients(lambda y: np.linalg.norm(y, keepdims=True), x)
    check_gradients(lambda y: np.linalg.vector_norm(y, ord=3), x)
    check_gradients(lambda y: np.linalg.vector_norm(y, axis=(0, 2), keepdims=True), x)
    check_gradients(lambda y: np.linalg.matrix_norm(y, ord=1), x)


@pytest.mark.parametrize("ord,axis", [(None, None), (2, None), (3, None), (1, None),
                                      ("fro", (0, 1)), (2, (0, 1)), (None, 0)])
def test_norm_at_zero_is_finite(ord, axis):
    x = np.zeros((3, 3)) if axis is not None else np.zeros(3)
    g = gt.grad(lambda y: np.linalg.norm(y, ord, axis) if axis != 0 else
                np.sum(np.linalg.norm(y, ord, axis)))(x)
    assert np.all(np.isfinite(g))


def test_norm_errors_are_clear():
    x = np.ones((3, 3))
    with pytest.raises(gt.GradtapeError, match="singular value"):
        gt.grad(lambda y: np.linalg.norm(y, "nuc"))(x)
    with pytest.raises(ValueError, match="for vectors"):
        gt.grad(lambda y: np.linalg.norm(y, "fro", axis=0).sum())(x)


# --- matrix functions ----------------------------------------------------------------------------
@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES))
def test_inv_det_slogdet_gradients(seed, n, batch):
    rng = np.random.default_rng(seed)
    a = well_conditioned(rng, batch, n)
    check_gradients(np.linalg.inv, a, holomorphic=True)
    check_gradients(np.linalg.det, a, holomorphic=True)
    check_gradients(lambda x: np.linalg.slogdet(x)[1], a)
    check_gradients(lambda x: np.linalg.slogdet(x).sign * np.linalg.slogdet(x).logabsdet, a)


@SETTINGS
@given(seed=SEEDS, n=SIZES, batch_a=st.sampled_from(BATCHES), batch_b=st.sampled_from(BATCHES),
       k=st.sampled_from([None, 1, 3]))
def test_solve_gradients(seed, n, batch_a, batch_b, k):
    rng = np.random.default_rng(seed)
    if k is None:
        batch_b = ()  # a vector right-hand side (NumPy 2: only a 1-D b is a vector)
    try:
        np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        assume(False)
    a = well_conditioned(rng, batch_a, n)
    b = normal(rng, batch_b + (n,) + (() if k is None else (k,)))
    check_gradients(np.linalg.solve, a, b, holomorphic=True)
    check_gradients(lambda x: np.linalg.solve(x, b), a)
    check_gradients(lambda y: np.linalg.solve(a, y), b)


@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES), upper=st.booleans())
def test_cholesky_gradients(seed, n, batch, upper):
    """Exact derivative of NumPy's cholesky, which reads one triangle: any perturbation works."""
    rng = np.random.default_rng(seed)
    a = spd(rng, batch, n)
    check_gradients(lambda x: np.linalg.cholesky(x, upper=upper), a)
    # through a symmetric parametrization, as in the conventions of JAX and autograd
    b = normal(rng, batch + (n, n))
    check_gradients(lambda y: np.linalg.cholesky(y @ _mT(y) + n * np.eye(n), upper=upper), b)


def _sign_fixed(v):
    return v * np.sign(v[..., :1, :])


@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES), uplo=st.sampled_from("LU"))
def test_eigh_gradients(seed, n, batch, uplo):
    rng = np.random.default_rng(seed)
    a = symmetric_spread(rng, batch, n)
    check_gradients(lambda x: np.linalg.eigh(x, uplo).eigenvalues, a)
    check_gradients(lambda x: np.linalg.eigvalsh(x, uplo), a)
    check_gradients(lambda x: _sign_fixed(np.linalg.eigh(x, uplo).eigenvectors), a)
    check_gradients(lambda x: np.linalg.eigh(x, uplo)[1] ** 2, a)


def test_eigvalsh_with_repeated_eigenvalues_is_finite():
    g = gt.grad(lambda x: np.sum(np.linalg.eigvalsh(x) ** 2))(np.eye(3))
    np.testing.assert_allclose(g, 2 * np.eye(3), atol=1e-12)


@SETTINGS
@given(seed=SEEDS, m=SIZES, n=SIZES, batch=st.sampled_from(BATCHES), mode=st.sampled_from(
    ["reduced", "r"]))
def test_qr_gradients(seed, m, n, batch, mode):
    rng = np.random.default_rng(seed)
    a = normal(rng, batch + (m, n))
    check_gradients(lambda x: np.linalg.qr(x, mode), a)


def test_qr_complete_of_wide_matrix_and_tall_error():
    a = np.random.default_rng(3).standard_normal((2, 4))
    check_gradients(lambda x: np.linalg.qr(x, "complete"), a)
    with pytest.raises(gt.GradtapeError, match="complete"):
        gt.grad(lambda x: np.sum(np.linalg.qr(x, "complete")[0]))(a.T)


@SETTINGS
@given(seed=SEEDS, n=st.integers(2, 4))
def test_matrix_functions_float32(seed, n):
    rng = np.random.default_rng(seed)
    a, s = well_conditioned(rng, (2,), n), spd(rng, (), n)
    b = normal(rng, (2, n, 2))
    check_float32(np.linalg.inv, a)
    check_float32(np.linalg.solve, a, b)
    check_float32(lambda x: np.linalg.slogdet(x)[1], a)
    check_float32(np.linalg.cholesky, s)
    check_float32(np.linalg.eigvalsh, symmetric_spread(rng, (), n))


def test_results_match_numpy_and_keep_its_types():
    rng = np.random.default_rng(5)
    a = spd(rng, (2,), 3)

    def f(x):
        res = [np.linalg.eigh(x), np.linalg.slogdet(x), np.linalg.qr(x)]
        assert [type(r).__name__ for r in res] == ["EighResult", "SlogdetResult", "QRResult"]
        return [r for pair in res for r in pair] + [np.linalg.cholesky(x), np.linalg.inv(x)]

    out = gt.vjp(f, a)[0]
    ref = [r for pair in (np.linalg.eigh(a), np.linalg.slogdet(a), np.linalg.qr(a))
           for r in pair] + [np.linalg.cholesky(a), np.linalg.inv(a)]
    for o, r in zip(out, ref):
        np.testing.assert_array_equal(o, r)


def test_named_results_are_pytrees():
    """eigh, slogdet and qr return NumPy's named tuples, also from gradtape.vjp."""
    a = spd(np.random.default_rng(6), (), 3)
    out, vjp_fn = gt.vjp(np.linalg.eigh, a)
    assert type(out).__name__ == "EighResult"
    np.testing.assert_array_equal(out.eigenvalues, np.linalg.eigh(a).eigenvalues)
    ct = vjp_fn(type(out)(np.ones(3), np.zeros((3, 3))))[0]
    np.testing.assert_allclose(ct, np.eye(3), atol=1e-12)  # the sum of eigenvalues is the trace


# --- JVP rules: against central differences and against the VJP ------------------------------
def _matmul_args(rng, n, batch):
    return (normal(rng, batch + (n, 3)), normal(rng, (3, 2))), {}


PRIMITIVE_CASES = {
    "matmul": (la.matmul_p, _matmul_args),
    "matmul vec-mat": (la.matmul_p, lambda r, n, b: ((normal(r, (n,)), normal(r, b + (n, 2))),
                                                     {})),
    "matmul mat-vec": (la.matmul_p, lambda r, n, b: ((normal(r, b + (2, n)), normal(r, (n,))),
                                                     {})),
    "matmul vec-vec": (la.matmul_p, lambda r, n, b: ((normal(r, (n,)), normal(r, (n,))), {})),
    "einsum 3 operands": (la.einsum_p, lambda r, n, b: (
        (normal(r, (2, n, 3)), normal(r, (n, 2)), normal(r, (3,))),
        {"subscripts": "ijk,jl,k->il", "optimize": False})),
    "einsum own sum": (la.einsum_p, lambda r, n, b: (
        (normal(r, (2, n)), normal(r, (3,))), {"subscripts": "ij,k->k", "optimize": "greedy"})),
    "inv": (la.inv_p, lambda r, n, b: ((well_conditioned(r, b, n),), {})),
    "det": (la.det_p, lambda r, n, b: ((well_conditioned(r, b, n),), {})),
    "slogdet": (la.slogdet_p, lambda r, n, b: ((well_conditioned(r, b, n),), {})),
    "solve": (la.solve_p, lambda r, n, b: ((well_conditioned(r, b, n), normal(r, (n, 2))), {})),
    "cholesky": (la.cholesky_p, lambda r, n, b: ((spd(r, b, n),), {"upper": False})),
    "cholesky upper": (la.cholesky_p, lambda r, n, b: ((spd(r, b, n),), {"upper": True})),
    "eigh": (la.eigh_p, lambda r, n, b: ((symmetric_spread(r, b, n),), {"UPLO": "L"})),
    "eigh upper": (la.eigh_p, lambda r, n, b: ((symmetric_spread(r, b, n),), {"UPLO": "U"})),
    "qr": (la.qr_p, lambda r, n, b: ((normal(r, b + (n + 1, n)),), {})),
}


def _case(name, seed, n, batch):
    prim, make = PRIMITIVE_CASES[name]
    rng = np.random.default_rng(seed)
    args, params = make(rng, n, batch)
    tangents = tuple(normal(rng, np.shape(a)) for a in args)
    return prim, args, params, tangents, rng


def _impl(prim, params):
    def f(*xs):
        out = prim.impl(*xs, **params)
        if prim is la.eigh_p:  # fix the eigenvector signs so that differences are smooth
            out = (out[0], _sign_fixed(out[1]))
        return out
    return f


def _jvp_rule(prim, args, tangents, params):
    ans = prim.impl(*args, **params)
    return _leaves(prim.jvp(tangents, ans, *args, **params))


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
@PER_CASE
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES))
def test_jvp_rules_match_central_differences(name, seed, n, batch):
    prim, args, params, tangents, _ = _case(name, seed, n, batch)
    # all tangents, then each alone (the others None: no tangent)
    subsets = [tangents] + ([tuple(t if k == i else None for k, t in enumerate(tangents))
                             for i in range(len(args))] if len(args) > 1 else [])
    for ts in subsets:
        got = _jvp_rule(prim, args, ts, params)
        if prim is la.eigh_p:  # the tangent of the sign-fixed eigenvectors (signs are constant)
            got[1] = got[1] * np.sign(prim.impl(*args, **params)[1][..., :1, :])
        zeros = tuple(np.zeros(np.shape(a)) if t is None else t for a, t in zip(args, ts))
        ref = central_jvp(_impl(prim, params), args, zeros)
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert_close(g, r, 1e-6)


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
@PER_CASE
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES))
def test_jvp_and_vjp_are_adjoint(name, seed, n, batch):
    """<u, J v> from the JVP rule equals <J^T u, v> from gradtape.vjp."""
    prim, args, params, tangents, rng = _case(name, seed, n, batch)
    jv = _jvp_rule(prim, args, tangents, params)
    out, vjp_fn = gt.vjp(lambda *xs: prim(*xs, **params), *args)
    us = [normal(rng, np.shape(o)) for o in _leaves(out)]
    if prim is la.slogdet_p:
        us[0] = np.zeros_like(us[0])  # the sign: a zero derivative, any cotangent gives 0
    cts = vjp_fn(tuple(us) if prim.multiple_results else us[0])
    lhs = sum(np.sum(u * j) for u, j in zip(us, jv))
    rhs = sum(np.sum(c * t) for c, t in zip(cts, tangents))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-9, atol=1e-9 * max(1.0, abs(rhs)))


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
@PER_CASE
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES))
def test_batched_jvp_rules_match_one_direction_at_a_time(name, seed, n, batch):
    """Rules declared jvp_batched take tangents with a leading axis of directions."""
    prim, args, params, _, rng = _case(name, seed, n, batch)
    assert prim.jvp_batched
    directions = [tuple(normal(rng, (3,) + np.shape(a)) for a in args) for _ in range(2)]
    ans = prim.impl(*args, **params)
    for tangents in (directions[0], (directions[0][0],) + (None,) * (len(args) - 1),
                     (None,) * (len(args) - 1) + (directions[1][-1],)):
        batched = _leaves(prim.jvp(tangents, ans, *args, **params))
        for row in range(3):
            one = _leaves(prim.jvp(tuple(None if t is None else t[row] for t in tangents), ans,
                                   *args, **params))
            for b, o in zip(batched, one):
                assert_close(np.broadcast_to(b, (3,) + np.shape(o))[row], o, 1e-12)


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
@settings(max_examples=3, deadline=None)
@given(seed=SEEDS, n=st.integers(2, 3))
def test_jvp_rules_are_differentiable(name, seed, n):
    """The rules are NumPy code: grad of <u, jvp(x; v)> w.r.t. x matches central differences."""
    prim, args, params, tangents, rng = _case(name, seed, n, (2,))
    us = [normal(rng, np.shape(o)) for o in _leaves(prim.impl(*args, **params))]

    def pairing(x):
        all_args = (x,) + args[1:]
        ans = prim(*all_args, **params)
        return sum(np.sum(u * j) for u, j in zip(us, _leaves(prim.jvp(tangents, ans, *all_args,
                                                                        **params))))

    assert_close(gt.grad(pairing)(args[0]), central_difference_grad(pairing, args[:1], 0), 1e-5)


# --- second derivatives ------------------------------------------------------------------------
def check_hessian_vector(f, x, seed: int = 11, rtol: float = 1e-5):
    """grad of <grad f, v> (reverse over reverse) vs central differences of grad f along v."""
    v = np.random.default_rng(seed).standard_normal(x.shape)
    g = gt.grad(f)
    hv = gt.grad(lambda y: np.sum(g(y) * v))(x)
    h = 1e-5
    assert_close(hv, (g(x + h * v) - g(x - h * v)) / (2 * h), rtol)


@settings(max_examples=6, deadline=None)
@given(seed=SEEDS, n=st.integers(2, 4), batch=st.sampled_from([(), (2,)]))
def test_second_derivatives(seed, n, batch):
    rng = np.random.default_rng(seed)
    a, s, w = well_conditioned(rng, batch, n), spd(rng, batch, n), symmetric_spread(rng, batch, n)
    b = normal(rng, batch + (n, 2))
    c = normal(rng, batch + (n, n))
    check_hessian_vector(lambda x: np.sum(c * np.linalg.inv(x)), a)
    check_hessian_vector(lambda x: np.sum(np.sin(np.linalg.solve(x, b))), a)
    check_hessian_vector(lambda y: np.sum(np.sin(np.linalg.solve(a, y))) + np.sum(y**3), b)
    check_hessian_vector(lambda x: np.sum(c * np.linalg.cholesky(x)), s)
    check_hessian_vector(lambda x: np.sum(np.linalg.slogdet(x)[1]), a)
    check_hessian_vector(lambda x: np.sum(np.linalg.det(x) ** 2), a)
    check_hessian_vector(lambda x: np.sum(c * np.linalg.eigh(x)[0][..., None]), w)
    check_hessian_vector(lambda x: np.sum(c * np.linalg.eigh(x)[1] ** 2), w)
    check_hessian_vector(lambda x: np.sum(c * np.linalg.qr(x)[1]), a)
    check_hessian_vector(lambda x: np.sum(np.sin(np.einsum("...ij,...jk->...ik", x, x))), a)


# --- the public forward mode and Hessians, where the other transforms are present -------------
COMPOSITE_FUNCTIONS = {
    "dot nd": (lambda a, b: np.dot(a, b), [(2, 3), (2, 3, 2)]),
    "inner": (np.inner, [(2, 3), (4, 3)]),
    "outer": (np.outer, [(3,), (2,)]),
    "tensordot": (lambda a, b: np.tensordot(a, b, ([0, 2], [2, 0])), [(2, 3, 4), (4, 2, 2)]),
    "multi_dot": (lambda a, b, c: np.linalg.multi_dot([a, b, c]), [(3,), (3, 4), (4, 2)]),
    "einsum diagonal": (lambda a, b: np.einsum("iij,...j->...i", a, b), [(3, 3, 2), (2, 2)]),
    "norm fro": (lambda a: np.linalg.norm(a, axis=(0, 1)), [(3, 2, 2)]),
    "norm 2": (lambda a: np.linalg.norm(a, 2), [(3, 2)]),
    "qr wide": (lambda a: tuple(np.linalg.qr(a)), [(2, 3)]),
    "solve vector": (np.linalg.solve, [(3, 3), (3,)]),
}


@pytest.mark.parametrize("name", sorted(COMPOSITE_FUNCTIONS))
def test_public_jvp_of_compositions(name):
    f, shapes = COMPOSITE_FUNCTIONS[name]
    rng = np.random.default_rng(3)
    args = tuple(normal(rng, s) + (3 * np.eye(s[0]) if name == "solve vector" and len(s) == 2
                                   else 0) for s in shapes)
    tangents = tuple(normal(rng, s) for s in shapes)
    _, got = gt.jvp(f, args, tangents)
    for g, r in zip(_leaves(got), central_jvp(f, args, tangents)):
        assert_close(g, r, 1e-6)


def test_forward_over_reverse_hessians():
    rng = np.random.default_rng(4)
    s, b = spd(rng, (), 3), normal(rng, (3, 2))
    funcs = [lambda x: np.linalg.slogdet(x)[1], lambda x: np.sum(np.linalg.inv(x) ** 2),
             lambda x: np.sum(np.linalg.cholesky(x) ** 3), lambda x: np.sum(
                 np.sin(np.linalg.solve(x, b))), lambda x: np.sum(np.linalg.eigvalsh(x) ** 3)]
    for f in funcs:
        hess = gt.hessian(f)(s)
        grad = gt.grad(f)
        h = 1e-5
        for i in np.ndindex(3, 3):
            e = np.zeros((3, 3))
            e[i] = h
            assert_close(hess[i], (grad(s + e) - grad(s - e)) / (2 * h), 1e-5)


# --- a real use: Gaussian log-likelihood --------------------------------------------------------
def _gaussian_loglik(params, y):
    """Log-likelihood of rows of y under N(mu, S), S = B B^T + diag(exp(log_d))."""
    mu, b, log_d = params["mu"], params["b"], params["log_d"]
    cov = b @ b.T + np.diag(np.exp(log_d))
    chol = np.linalg.cholesky(cov)
    r = y - mu
    z = np.linalg.solve(chol, r.T)
    sign, logdet = np.linalg.slogdet(cov)
    n, d = y.shape
    return -0.5 * np.sum(z * z) - 0.5 * n * logdet - 0.5 * n * d * np.log(2 * np.pi)


def test_gaussian_loglik_gradient_matches_closed_form():
    rng = np.random.default_rng(42)
    d, n = 4, 30
    params = {"mu": rng.standard_normal(d), "b": rng.standard_normal((d, 2)),
              "log_d": rng.standard_normal(d) * 0.3}
    y = rng.standard_normal((n, d)) * 2 + 1
    value, g = gt.value_and_grad(_gaussian_loglik)(params, y)

    cov = params["b"] @ params["b"].T + np.diag(np.exp(params["log_d"]))
    from scipy.stats import multivariate_normal
    np.testing.assert_allclose(value, multivariate_normal(params["mu"], cov).logpdf(y).sum(),
                               rtol=1e-12)
    # closed form: dL/dS = (P R^T R P - n P) / 2 with P = S^-1 (symmetric), R = y - mu
    prec = np.linalg.inv(cov)
    r = y - params["mu"]
    ds = 0.5 * (prec @ r.T @ r @ prec - n * prec)
    np.testing.assert_allclose(g["mu"], prec @ r.sum(0), rtol=1e-10)
    np.testing.assert_allclose(g["b"], 2 * ds @ params["b"], rtol=1e-10)
    np.testing.assert_allclose(g["log_d"], np.diag(ds) * np.exp(params["log_d"]), rtol=1e-10)


# --- performance: what the gradient records ---------------------------------------------------
def _staged_grad(f, *args):
    """The tape of the whole gradient computation (forward and backward)."""
    return gt.trace(gt.grad(f, argnums=tuple(range(len(args)))), *args)


def test_matmul_gradient_records_only_the_necessary_products():
    x, w = np.ones((5, 3)), np.ones((3, 4))
    tape = _staged_grad(lambda a, b: np.sum(np.tanh(a @ b)), x, w)
    names = [ins.prim.name for ins in tape.instructions]
    assert names.count("matmul") == 3
    assert set(names) <= {"matmul", "tanh", "reduce_sum", "broadcast_to", "square", "subtract",
                          "multiply", "transpose"}
    # transposes are views: all that is materialized is the forward and the two products
    assert [i.outvars[0].shape for i in tape.instructions if i.prim.name == "matmul"] == [
        (5, 4), (5, 3), (3, 4)]


@pytest.mark.parametrize("sa,sb", [((7,), (7,)), ((7,), (7, 3)), ((3, 7), (7,)),
                                   ((7,), (2, 7, 3)), ((2, 3, 7), (7,)), ((2, 3, 7), (7, 4))])
def test_matmul_gradient_builds_no_large_temporaries(sa, sb):
    a, b = np.ones(sa), np.ones(sb)
    tape = _staged_grad(lambda x, y: np.sum(x @ y), a, b)
    largest = max(a.size, b.size, np.matmul(a, b).size)
    for ins in tape.instructions:
        for v in ins.outvars:
            assert int(np.prod(v.shape)) <= largest, ins
