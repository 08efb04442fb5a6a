"""Linear algebra rules, checked against numbers gradtape does not compute.

References: central differences and complex step of the plain NumPy functions, closed
forms (Gaussian log-likelihood), the adjoint identity <u, J v> == <J^T u, v> between each
primitive's JVP rule and gradtape's VJP, and JAX where it is installed. Shapes, batches and
values are generated. Complex values follow JAX's convention: the cotangent of z = x + iy is
dL/dx - i dL/dy, and <u, v> is Re sum(u * v).
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
    plus = _leaves(f(*(a if t is None else a + h * t for a, t in zip(args, tangents))))
    minus = _leaves(f(*(a if t is None else a - h * t for a, t in zip(args, tangents))))
    return [(p - m) / (2 * h) for p, m in zip(plus, minus)]


def assert_close(actual, expected, rtol: float = 1e-6):
    dt = np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected) else np.float64
    actual, expected = np.asarray(actual, dt), np.asarray(expected, dt)
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
    args = tuple(np.array(a, order="C") for a in args)
    check_values(f, *args)
    assert_grad_matches(
        projected(f, f(*args)),
        *args,
        argnums=tuple(range(len(args))),
        complex_step=holomorphic,
        require_complex_step=holomorphic,
        rtol=rtol,
    )


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
        batch + (n, n)
    ) / np.sqrt(n)


def symmetric_spread(rng, batch: tuple, n: int):
    """A symmetric matrix with eigenvalue gaps of at least 0.7."""
    q, _ = np.linalg.qr(rng.standard_normal(batch + (n, n)))
    w = np.arange(1.0, n + 1) + rng.uniform(0, 0.3, batch + (n,))
    return (q * w[..., None, :]) @ _mT(q)


def complex_normal(rng, shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def complex_conditioned(rng, batch: tuple, n: int):
    return np.eye(n) * np.exp(
        1j * rng.uniform(0, 2 * np.pi, batch + (1, n))
    ) + 0.3 * complex_normal(rng, batch + (n, n)) / np.sqrt(n)


def _unitary(rng, shape, complex_: bool):
    m = complex_normal(rng, shape) if complex_ else rng.standard_normal(shape)
    return np.linalg.qr(m)[0]


def hermitian_spread(rng, batch: tuple, n: int):
    """A complex Hermitian matrix with eigenvalue gaps of at least 0.7."""
    q = _unitary(rng, batch + (n, n), True)
    w = np.arange(1.0, n + 1) + rng.uniform(0, 0.3, batch + (n,))
    return (q * w[..., None, :]) @ np.conj(_mT(q))


def spread_singular(rng, batch: tuple, m: int, n: int, complex_: bool = False):
    """An m x n matrix with singular values at least 0.5 apart (and from zero)."""
    k = min(m, n)
    u, v = _unitary(rng, batch + (m, k), complex_), _unitary(rng, batch + (n, k), complex_)
    s = np.arange(k, 0, -1) * 0.8 + 0.3 + rng.uniform(0, 0.2, batch + (k,))
    return (u * s[..., None, :]) @ np.conj(_mT(v))


def general_spread(rng, batch: tuple, n: int):
    """A real non-symmetric matrix with well separated eigenvalues, a complex pair among them
    when n >= 2 (a rotation block), behind a well-conditioned similarity."""
    d = np.zeros(batch + (n, n))
    d[..., range(n), range(n)] = np.arange(1.0, n + 1) * 1.5
    if n >= 2:
        d[..., 0, 1], d[..., 1, 0], d[..., 1, 1] = 1.0, -1.0, 1.5
    p = np.eye(n) + 0.3 * rng.standard_normal(batch + (n, n)) / np.sqrt(n)
    return p @ d @ np.linalg.inv(p)


def complex_general_spread(rng, batch: tuple, n: int):
    w = np.arange(1.0, n + 1) * 1.5 * np.exp(1j * rng.uniform(0, 2 * np.pi, batch + (n,)))
    p = np.eye(n) + 0.3 * complex_normal(rng, batch + (n, n)) / np.sqrt(n)
    return (p * w[..., None, :]) @ np.linalg.inv(p)


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
@given(
    sa=st.lists(SIZES, min_size=1, max_size=3),
    sb=st.lists(SIZES, min_size=1, max_size=3),
    seed=SEEDS,
)
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
    check_float32(lambda x, y: np.einsum("...j,...j->...", x, y), a, normal(rng, a.shape))


# --- norm --------------------------------------------------------------------------------------
VECTOR_ORDS = [None, 2, 1, np.inf, -np.inf, 3, 0.5, -2]
MATRIX_ORDS = [None, "fro", 1, -1, np.inf, -np.inf, 2, -2, "nuc"]


@SETTINGS
@given(
    seed=SEEDS,
    ord=st.sampled_from(VECTOR_ORDS),
    axis=st.sampled_from([None, 0, -1, 1]),
    keepdims=st.booleans(),
)
def test_vector_norm_gradients(seed, ord, axis, keepdims):
    rng = np.random.default_rng(seed)
    x = normal(rng, (3,) if axis is None else (3, 4))
    check_gradients(lambda y: np.linalg.norm(y, ord, axis, keepdims), x)


@SETTINGS
@given(
    seed=SEEDS,
    ord=st.sampled_from(MATRIX_ORDS),
    axis=st.sampled_from([None, (0, 1), (1, 0), (-1, 0), (0, 2)]),
    keepdims=st.booleans(),
)
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


@pytest.mark.parametrize(
    "ord,axis",
    [(None, None), (2, None), (3, None), (1, None), ("fro", (0, 1)), (2, (0, 1)), (None, 0)],
)
def test_norm_at_zero_is_finite(ord, axis):
    x = np.zeros((3, 3)) if axis is not None else np.zeros(3)
    g = gt.grad(
        lambda y: (
            np.linalg.norm(y, ord, axis) if axis != 0 else np.sum(np.linalg.norm(y, ord, axis))
        )
    )(x)
    assert np.all(np.isfinite(g))


def test_norm_errors_are_clear():
    x = np.ones((3, 3))
    with pytest.raises(ValueError, match="for vectors"):
        gt.grad(lambda y: np.linalg.norm(y, "fro", axis=0).sum())(x)
    with pytest.raises(ValueError, match="Invalid norm order"):
        gt.grad(lambda y: np.linalg.norm(y, 3))(x)


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
@given(
    seed=SEEDS,
    n=SIZES,
    batch_a=st.sampled_from(BATCHES),
    batch_b=st.sampled_from(BATCHES),
    k=st.sampled_from([None, 1, 3]),
)
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


@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES), upper=st.booleans())
def test_complex_cholesky_gradients(seed, n, batch, upper):
    """Hermitian input, read from one triangle as NumPy reads it (the imaginary part of the
    diagonal is not read): vjp and jvp against differences of NumPy's own cholesky."""
    a = hermitian_spread(np.random.default_rng(seed), batch, n)
    check_values(lambda x: np.linalg.cholesky(x, upper=upper), a)
    check_vjp(lambda x: np.linalg.cholesky(x, upper=upper), a)


@SETTINGS
@given(
    seed=SEEDS,
    m=SIZES,
    n=SIZES,
    batch=st.sampled_from(BATCHES),
    mode=st.sampled_from(["reduced", "r", "complete"]),
)
def test_complex_qr_gradients(seed, m, n, batch, mode):
    """Q and R of complex matrices (tall, square, wide; R's diagonal is real, which fixes the
    phase of Q's columns) against differences of NumPy's qr; complete mode of a tall matrix
    is refused."""
    a = complex_normal(np.random.default_rng(seed), batch + (m, n))

    def f(x):
        out = np.linalg.qr(x, mode=mode)
        return out if mode == "r" else tuple(out)

    if mode == "complete" and m > n:
        with pytest.raises(gt.GradtapeError, match="complete.*complex"):
            gt.vjp(f, a)
        return
    check_values(f, a)
    check_vjp(f, a)


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
@given(
    seed=SEEDS,
    m=SIZES,
    n=SIZES,
    batch=st.sampled_from(BATCHES),
    mode=st.sampled_from(["reduced", "r"]),
)
def test_qr_gradients(seed, m, n, batch, mode):
    rng = np.random.default_rng(seed)
    a = normal(rng, batch + (m, n))
    check_gradients(lambda x: np.linalg.qr(x, mode), a)


@SETTINGS
@given(seed=SEEDS, m=SIZES, n=SIZES, batch=st.sampled_from(BATCHES))
def test_qr_complete_gradients(seed, m, n, batch):
    """The extra columns of a tall complete Q are LAPACK's Householder completion: a smooth
    function of the matrix, differentiated as such (any loss on them)."""
    rng = np.random.default_rng(seed)
    a = normal(rng, batch + (m + n, n)) if m > 1 else normal(rng, batch + (n, n + m))
    check_gradients(lambda x: np.linalg.qr(x, "complete"), a)


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
    wide = spread_singular(rng, (2,), n, n + 1)
    check_float32(lambda x: np.linalg.svd(x, compute_uv=False), wide)
    check_float32(np.linalg.pinv, wide)
    check_float32(lambda x: np.linalg.lstsq(x, np.ones(n, np.float32))[0], wide[0])
    check_float32(lambda x: np.linalg.solve(x, np.ones(n, np.float32)), a[0])
    check_float32(np.linalg.eigvals, symmetric_spread(rng, (), n) + 0.1 * np.tri(n))


def test_results_match_numpy_and_keep_its_types():
    rng = np.random.default_rng(5)
    a = spd(rng, (2,), 3)

    def f(x):
        res = [np.linalg.eigh(x), np.linalg.slogdet(x), np.linalg.qr(x)]
        assert [type(r).__name__ for r in res] == ["EighResult", "SlogdetResult", "QRResult"]
        return [r for pair in res for r in pair] + [np.linalg.cholesky(x), np.linalg.inv(x)]

    out = gt.vjp(f, a)[0]
    ref = [
        r for pair in (np.linalg.eigh(a), np.linalg.slogdet(a), np.linalg.qr(a)) for r in pair
    ] + [np.linalg.cholesky(a), np.linalg.inv(a)]
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
    "matmul vec-mat": (la.matmul_p, lambda r, n, b: ((normal(r, (n,)), normal(r, b + (n, 2))), {})),
    "matmul mat-vec": (la.matmul_p, lambda r, n, b: ((normal(r, b + (2, n)), normal(r, (n,))), {})),
    "matmul vec-vec": (la.matmul_p, lambda r, n, b: ((normal(r, (n,)), normal(r, (n,))), {})),
    "einsum 3 operands": (
        la.einsum_p,
        lambda r, n, b: (
            (normal(r, (2, n, 3)), normal(r, (n, 2)), normal(r, (3,))),
            {"subscripts": "ijk,jl,k->il", "optimize": False},
        ),
    ),
    "einsum own sum": (
        la.einsum_p,
        lambda r, n, b: (
            (normal(r, (2, n)), normal(r, (3,))),
            {"subscripts": "ij,k->k", "optimize": "greedy"},
        ),
    ),
    "inv": (la.inv_p, lambda r, n, b: ((well_conditioned(r, b, n),), {})),
    "det": (la.det_p, lambda r, n, b: ((well_conditioned(r, b, n),), {})),
    "slogdet": (la.slogdet_p, lambda r, n, b: ((well_conditioned(r, b, n),), {})),
    "solve": (la.solve_p, lambda r, n, b: ((well_conditioned(r, b, n), normal(r, (n, 2))), {})),
    "cholesky": (la.cholesky_p, lambda r, n, b: ((spd(r, b, n),), {"upper": False})),
    "cholesky upper": (la.cholesky_p, lambda r, n, b: ((spd(r, b, n),), {"upper": True})),
    "eigh": (la.eigh_p, lambda r, n, b: ((symmetric_spread(r, b, n),), {"UPLO": "L"})),
    "eigh upper": (la.eigh_p, lambda r, n, b: ((symmetric_spread(r, b, n),), {"UPLO": "U"})),
    "qr": (la.qr_p, lambda r, n, b: ((normal(r, b + (n + 1, n)),), {"complete": False})),
    "qr complete": (la.qr_p, lambda r, n, b: ((normal(r, b + (n + 2, n)),), {"complete": True})),
    "lu_solve": (la.lu_solve_p, lambda r, n, b: _lu_solve_args(r, n, 0)),
    "lu_solve transposed": (la.lu_solve_p, lambda r, n, b: _lu_solve_args(r, n, 1)),
    "triangular_solve lower": (
        la.triangular_solve_p,
        lambda r, n, b: (
            (well_conditioned(r, b, n), normal(r, b + (n, 2))),
            {"lower": True, "trans": 0, "unit": False},
        ),
    ),
    "triangular_solve upper unit trans": (
        la.triangular_solve_p,
        lambda r, n, b: (
            (well_conditioned(r, b, n), normal(r, (n, 2))),
            {"lower": False, "trans": 1, "unit": True},
        ),
    ),
    "svd": (
        la.svd_p,
        lambda r, n, b: ((spread_singular(r, b, n + 1, n),), {"full_matrices": False}),
    ),
    "svd full": (
        la.svd_p,
        lambda r, n, b: ((spread_singular(r, b, n, n + 2),), {"full_matrices": True}),
    ),
    "eig": (la.eig_p, lambda r, n, b: ((general_spread(r, b, n),), {})),
    "pinv": (
        la.pinv_p,
        lambda r, n, b: ((spread_singular(r, b, n + 1, n),), {"rcond": 1e-15, "hermitian": False}),
    ),
    # complex input (JAX's convention)
    "inv complex": (la.inv_p, lambda r, n, b: ((complex_conditioned(r, b, n),), {})),
    "det complex": (la.det_p, lambda r, n, b: ((complex_conditioned(r, b, n),), {})),
    "slogdet complex": (la.slogdet_p, lambda r, n, b: ((complex_conditioned(r, b, n),), {})),
    "solve complex": (
        la.solve_p,
        lambda r, n, b: ((complex_conditioned(r, b, n), complex_normal(r, (n, 2))), {}),
    ),
    "eigh complex": (la.eigh_p, lambda r, n, b: ((hermitian_spread(r, b, n),), {"UPLO": "U"})),
    "eig complex": (la.eig_p, lambda r, n, b: ((complex_general_spread(r, b, n),), {})),
    "cholesky complex": (
        la.cholesky_p,
        lambda r, n, b: ((hermitian_spread(r, b, n),), {"upper": False}),
    ),
    "cholesky complex upper": (
        la.cholesky_p,
        lambda r, n, b: ((hermitian_spread(r, b, n),), {"upper": True}),
    ),
    "qr complex": (
        la.qr_p,
        lambda r, n, b: ((complex_normal(r, b + (n + 1, n)),), {"complete": False}),
    ),
    "svd complex": (
        la.svd_p,
        lambda r, n, b: ((spread_singular(r, b, n + 1, n, True),), {"full_matrices": False}),
    ),
    "svd complex full": (
        la.svd_p,
        lambda r, n, b: ((spread_singular(r, b, n, n + 1, True),), {"full_matrices": True}),
    ),
    "pinv complex": (
        la.pinv_p,
        lambda r, n, b: (
            (spread_singular(r, b, n, n + 1, True),),
            {"rcond": 1e-15, "hermitian": False},
        ),
    ),
}


def _lu_solve_args(rng, n, trans):
    a = well_conditioned(rng, (), n)
    lu, piv = la.lu_factors_p.impl(a)
    return (a, lu, piv, normal(rng, (2, n, 2))), {"trans": trans}


def _smooth(prim, out, ans, tangent=None):
    """The outputs of `prim` (or, with `tangent`, their tangents at `ans`) as smooth functions:
    eigh's and svd's vectors as the outer products v_j v_j^H and u_j vh_j (free of the sign or
    phase LAPACK picks), eig's with the sign of their largest entry (LAPACK makes it real),
    the extra columns of a full SVD as their projector."""
    if prim not in (la.eigh_p, la.eig_p, la.svd_p):
        return list(_leaves(tangent if tangent is not None else out))
    x = tangent if tangent is not None else out
    if prim is la.eig_p:
        v = ans[1]
        top = np.take_along_axis(v, np.argmax(np.abs(v), axis=-2)[..., None, :], axis=-2)
        return [x[0], x[1] * np.conj(top) / np.abs(top)]

    def outer(p, q):  # the products p_j q_j of column j of p and row j of q
        return np.einsum("...ij,...jk->...jik", p, q)

    if prim is la.eigh_p:
        v = ans[1]
        vecs = (
            outer(x[1], np.conj(_mT(x[1])))
            if tangent is None
            else outer(x[1], np.conj(_mT(v))) + outer(v, np.conj(_mT(x[1])))
        )
        return [x[0], vecs]
    u, s, vh = x
    k = s.shape[-1]
    uk, vhk = ans[0][..., :k], ans[2][..., :k, :]
    parts = [
        s,
        outer(u[..., :k], vh[..., :k, :])
        if tangent is None
        else outer(u[..., :k], vhk) + outer(uk, vh[..., :k, :]),
    ]
    for full, t, a in (
        (u.shape[-1] > k, u[..., k:], ans[0][..., k:]),
        (vh.shape[-2] > k, _mT(vh[..., k:, :]), _mT(ans[2][..., k:, :])),
    ):
        if full:  # the projector P P^H and its tangent dP P^H + P dP^H
            p = (
                t @ np.conj(_mT(t))
                if tangent is None
                else t @ np.conj(_mT(a)) + a @ np.conj(_mT(t))
            )
            parts.append(p)
    return parts


def _like(rng, x):
    """A random tangent or cotangent like x (complex where x is complex)."""
    return complex_normal(rng, np.shape(x)) if np.iscomplexobj(x) else normal(rng, np.shape(x))


def _case(name, seed, n, batch):
    prim, make = PRIMITIVE_CASES[name]
    rng = np.random.default_rng(seed)
    args, params = make(rng, n, batch)
    fixed = (1, 2) if prim is la.lu_solve_p else ()  # the factors: constants to the rules
    tangents = tuple(
        None if np.asarray(a).dtype.kind not in "fc" or i in fixed else _like(rng, a)
        for i, a in enumerate(args)
    )
    return prim, args, params, tangents, rng


def _consistent(prim, params):
    """The primitive as a function of its differentiable arguments: lu_solve's factors are
    those of the (perturbed) matrix, as they are when np.linalg.solve records it."""
    if prim is la.lu_solve_p:
        return lambda a, lu, piv, b: prim(a, *la.lu_factors_p.impl(a), b, **params)
    return lambda *xs: prim(*xs, **params)


def _impl(prim, params, ans):
    """The primitive's implementation as a smooth function near `ans` (see _smooth)."""
    f = _consistent(prim, params)
    return lambda *xs: _smooth(prim, f(*xs), ans)


def _gauge_free(prim, ans, us):
    """Cotangents with no component along the free phases of eigh's and svd's vectors and the
    free basis of a full SVD's extra columns (the VJP gives NaN for those: no derivative)."""
    if prim is la.eigh_p and np.iscomplexobj(ans[1]):
        v = ans[1]
        k = _mT(v) @ us[1]
        us[1] = (
            us[1] - np.conj(v) * (1j * np.imag(np.diagonal(k, axis1=-2, axis2=-1)))[..., None, :]
        )
    if prim is la.svd_p:
        u, s, vh = ans
        k = s.shape[-1]
        gu, gv = us[0], np.conj(_mT(us[2]))
        for full, basis, g in (
            (u.shape[-1] > k, u[..., k:], gu[..., k:]),
            (vh.shape[-2] > k, np.conj(_mT(vh[..., k:, :])), gv[..., k:]),
        ):
            if full:  # no rotation of the extra columns among themselves
                c = _mT(basis) @ g
                g -= np.conj(basis) @ (0.5 * (c - np.conj(_mT(c))))
        if np.iscomplexobj(u):
            j = np.diagonal(_mT(u[..., :k]) @ gu[..., :k], axis1=-2, axis2=-1)
            kk = np.diagonal(np.conj(vh[..., :k, :]) @ gv[..., :k], axis1=-2, axis2=-1)
            gu[..., :k] -= np.conj(u[..., :k]) * (1j * np.imag(j + kk))[..., None, :]
        us[0], us[2] = gu, np.conj(_mT(gv))
    return us


def _jvp_rule(prim, args, tangents, params):
    ans = prim.impl(*args, **params)
    return _leaves(prim.jvp(tangents, ans, *args, **params))


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
@PER_CASE
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES))
def test_jvp_rules_match_central_differences(name, seed, n, batch):
    prim, args, params, tangents, _ = _case(name, seed, n, batch)
    # all tangents, then each alone (the others None: no tangent)
    subsets = [tangents] + (
        [
            tuple(t if k == i else None for k, t in enumerate(tangents))
            for i in range(len(args))
            if tangents[i] is not None
        ]
        if len(args) > 1
        else []
    )
    ans = prim.impl(*args, **params)
    for ts in subsets:
        got = _smooth(prim, None, ans, tuple(_jvp_rule(prim, args, ts, params)))
        zeros = tuple(
            t
            if t is not None
            else (np.zeros(np.shape(a)) if np.asarray(a).dtype.kind in "fc" else None)
            for a, t in zip(args, ts)
        )
        ref = central_jvp(_impl(prim, params, ans), args, zeros)
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert_close(g, r, 1e-6)


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
@PER_CASE
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES))
def test_jvp_and_vjp_are_adjoint(name, seed, n, batch):
    """<u, J v> from the JVP rule equals <J^T u, v> from gradtape.vjp (Re sum(u * v))."""
    prim, args, params, tangents, rng = _case(name, seed, n, batch)
    jv = _jvp_rule(prim, args, tangents, params)
    diff = [i for i, t in enumerate(tangents) if t is not None]
    f = _consistent(prim, params)
    out, vjp_fn = gt.vjp(
        lambda *xs: f(*[xs[diff.index(i)] if i in diff else a for i, a in enumerate(args)]),
        *[args[i] for i in diff],
    )
    us = _gauge_free(prim, out, [_like(rng, o) for o in _leaves(out)])
    if prim is la.slogdet_p and not np.iscomplexobj(args[0]):
        us[0] = np.zeros_like(us[0])  # the sign: a zero derivative, any cotangent gives 0
    cts = vjp_fn(tuple(us) if prim.multiple_results else us[0])
    lhs = sum(np.real(np.sum(u * j)) for u, j in zip(us, jv) if j is not None)
    rhs = sum(np.real(np.sum(c * tangents[i])) for c, i in zip(cts, diff))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-9, atol=1e-9 * max(1.0, abs(rhs)))


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
@PER_CASE
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES))
def test_batched_jvp_rules_match_one_direction_at_a_time(name, seed, n, batch):
    """Rules declared jvp_batched take tangents with a leading axis of directions."""
    prim, args, params, tangents, rng = _case(name, seed, n, batch)
    assert prim.jvp_batched
    directions = [
        tuple(
            None if t is None else np.stack([_like(rng, a) for _ in range(3)])
            for a, t in zip(args, tangents)
        )
        for _ in range(2)
    ]
    diff = [i for i, t in enumerate(tangents) if t is not None]
    first_only = tuple(t if i == diff[0] else None for i, t in enumerate(directions[0]))
    last_only = tuple(t if i == diff[-1] else None for i, t in enumerate(directions[1]))
    ans = prim.impl(*args, **params)
    for ts in (directions[0], first_only, last_only):
        batched = _leaves(prim.jvp(ts, ans, *args, **params))
        for row in range(3):
            one = _leaves(
                prim.jvp(tuple(None if t is None else t[row] for t in ts), ans, *args, **params)
            )
            for b, o in zip(batched, one):
                if o is not None:
                    assert_close(np.broadcast_to(b, (3,) + np.shape(o))[row], o, 1e-12)


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
@settings(max_examples=3, deadline=None)
@given(seed=SEEDS, n=st.integers(2, 3))
def test_jvp_rules_are_differentiable(name, seed, n):
    """The rules are NumPy code: grad of <u, jvp(x; v)> w.r.t. x matches central differences."""
    prim, args, params, tangents, rng = _case(name, seed, n, (2,))
    if np.iscomplexobj(args[0]) or prim in (la.eig_p, la.svd_p):
        return  # complex values: the pairing needs Re, which np.real on a Tracer is not yet
    us = [normal(rng, np.shape(o)) for o in _leaves(prim.impl(*args, **params))]

    f = _consistent(prim, params)

    def pairing(x):
        all_args = (x,) + args[1:]
        if prim is la.lu_solve_p:
            all_args = (x, *la.lu_factors_p.impl(x), args[3])
        ans = f(*all_args)
        return sum(
            np.sum(u * j)
            for u, j in zip(us, _leaves(prim.jvp(tangents, ans, *all_args, **params)))
            if j is not None
        )

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
    args = tuple(
        normal(rng, s) + (3 * np.eye(s[0]) if name == "solve vector" and len(s) == 2 else 0)
        for s in shapes
    )
    tangents = tuple(normal(rng, s) for s in shapes)
    _, got = gt.jvp(f, args, tangents)
    for g, r in zip(_leaves(got), central_jvp(f, args, tangents)):
        assert_close(g, r, 1e-6)


def test_forward_over_reverse_hessians():
    rng = np.random.default_rng(4)
    s, b = spd(rng, (), 3), normal(rng, (3, 2))
    funcs = [
        lambda x: np.linalg.slogdet(x)[1],
        lambda x: np.sum(np.linalg.inv(x) ** 2),
        lambda x: np.sum(np.linalg.cholesky(x) ** 3),
        lambda x: np.sum(np.sin(np.linalg.solve(x, b))),
        lambda x: np.sum(np.linalg.eigvalsh(x) ** 3),
    ]
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
    params = {
        "mu": rng.standard_normal(d),
        "b": rng.standard_normal((d, 2)),
        "log_d": rng.standard_normal(d) * 0.3,
    }
    y = rng.standard_normal((n, d)) * 2 + 1
    value, g = gt.value_and_grad(_gaussian_loglik)(params, y)

    cov = params["b"] @ params["b"].T + np.diag(np.exp(params["log_d"]))
    from scipy.stats import multivariate_normal

    np.testing.assert_allclose(
        value, multivariate_normal(params["mu"], cov).logpdf(y).sum(), rtol=1e-12
    )
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
    assert set(names) <= {
        "matmul",
        "tanh",
        "reduce_sum",
        "broadcast_to",
        "square",
        "subtract",
        "multiply",
        "transpose",
    }
    # transposes are views: all that is materialized is the forward and the two products
    assert [i.outvars[0].shape for i in tape.instructions if i.prim.name == "matmul"] == [
        (5, 4),
        (5, 3),
        (3, 4),
    ]


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((7,), (7,)),
        ((7,), (7, 3)),
        ((3, 7), (7,)),
        ((7,), (2, 7, 3)),
        ((2, 3, 7), (7,)),
        ((2, 3, 7), (7, 4)),
    ],
)
def test_matmul_gradient_builds_no_large_temporaries(sa, sb):
    a, b = np.ones(sa), np.ones(sb)
    tape = _staged_grad(lambda x, y: np.sum(x @ y), a, b)
    largest = max(a.size, b.size, np.matmul(a, b).size)
    for ins in tape.instructions:
        for v in ins.outvars:
            assert int(np.prod(v.shape)) <= largest, ins


# --- SVD, eig, pinv, lstsq and the other compositions --------------------------------------------
def check_vjp(f, *args, rtol: float = 1e-6, seed: int = 0):
    """gradtape.vjp with random cotangents (complex where the output is) against central
    differences of Re sum(u * f) in the real and imaginary part of each argument (JAX's
    convention: the cotangent of z = x + iy is dL/dx - i dL/dy); then gradtape.jvp against
    central differences of f. Works for real and complex arguments and outputs."""
    rng = np.random.default_rng(seed)
    args = tuple(np.array(a) for a in args)
    out, vjp_fn = gt.vjp(f, *args)
    us = [_like(rng, o) for o in _leaves(out)]
    cts = vjp_fn(type(out)(us) if isinstance(out, (tuple, list)) else us[0])

    def loss(*xs):
        return sum(np.real(np.sum(u * o)) for u, o in zip(us, _leaves(f(*xs))))

    h = 1e-6
    for i, (a, ct) in enumerate(zip(args, cts)):
        ref = np.zeros(a.shape, a.dtype)
        for k in np.ndindex(a.shape):
            steps = (1.0, 1j) if np.iscomplexobj(a) else (1.0,)
            for step in steps:
                e = np.zeros(a.shape, a.dtype)
                e[k] = h * step
                moved = [x + e if j == i else x for j, x in enumerate(args)]
                back = [x - e if j == i else x for j, x in enumerate(args)]
                ref[k] += np.conj(step) * (loss(*moved) - loss(*back)) / (2 * h)
        assert_close(ct, ref, rtol)
    tangents = tuple(_like(rng, a) for a in args)
    _, t_out = gt.jvp(f, args, tangents)
    for got, want in zip(_leaves(t_out), central_jvp(f, args, tangents)):
        assert_close(got, want, rtol)


def _outer_products(u, vh):
    """u_j vh_j for each j: sign- and phase-free functions of singular vectors."""
    return np.einsum("...ij,...jk->...jik", u, vh)


@SETTINGS
@given(
    seed=SEEDS,
    m=SIZES,
    n=SIZES,
    batch=st.sampled_from(BATCHES),
    full=st.booleans(),
    complex_=st.booleans(),
)
def test_svd_gradients(seed, m, n, batch, full, complex_):
    """Singular values; vectors through u_j vh_j (free of the sign or phase LAPACK picks);
    the extra columns of a full SVD through their projector (free of their basis)."""
    rng = np.random.default_rng(seed)
    a = spread_singular(rng, batch, m, n, complex_)
    k = min(m, n)

    def f(x):
        u, s, vh = np.linalg.svd(x, full_matrices=full)
        out = [s, _outer_products(u[..., :k], vh[..., :k, :])]
        if full and m > k:
            out.append(u[..., k:] @ la._mH(u[..., k:]))
        if full and n > k:
            out.append(la._mH(vh[..., k:, :]) @ vh[..., k:, :])
        return tuple(out)

    check_vjp(f, a)
    check_vjp(lambda x: np.linalg.svd(x, compute_uv=False), a)
    if not complex_:
        check_gradients(lambda x: np.linalg.svd(x, compute_uv=False), a)


@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES), complex_=st.booleans())
def test_svd_hermitian_and_svdvals(seed, n, batch, complex_):
    rng = np.random.default_rng(seed)
    h = hermitian_spread(rng, batch, n) if complex_ else symmetric_spread(rng, batch, n)
    h = h - 2.2 * np.eye(n)  # indefinite: signs move into vh
    check_vjp(lambda x: np.linalg.svd(x, hermitian=True, compute_uv=False), h)
    check_vjp(
        lambda x: (lambda u, s, vh: _outer_products(u, vh))(*np.linalg.svd(x, hermitian=True)), h
    )
    check_vjp(np.linalg.svdvals, spread_singular(rng, batch, n + 1, n, complex_))


@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES), complex_=st.booleans())
def test_eig_gradients(seed, n, batch, complex_):
    """Complex eigenvalues and eigenvectors (unit norm, largest entry real: LAPACK's
    normalization, differentiated as JAX does) of general real and complex matrices."""
    rng = np.random.default_rng(seed)
    a = complex_general_spread(rng, batch, n) if complex_ else general_spread(rng, batch, n)
    check_vjp(lambda x: tuple(np.linalg.eig(x)), a)
    check_vjp(np.linalg.eigvals, a)


def test_eig_of_real_matrices_keeps_numpy_dtypes_and_guards_them():
    rng = np.random.default_rng(1)
    sym, rot = symmetric_spread(rng, (), 3), general_spread(rng, (), 3)
    for a, kind in ((sym, "f"), (rot, "c")):
        w, v = gt.vjp(np.linalg.eig, a)[0]
        assert w.dtype.kind == v.dtype.kind == kind
        assert type(gt.vjp(np.linalg.eig, a)[0]).__name__ == "EigResult"
    # a real loss of the eigenvalues of a matrix whose eigenvalues are real
    check_gradients(lambda x: np.linalg.eigvals(x), sym + 0.1 * np.triu(sym))
    f = gt.compile(
        gt.value_and_grad(lambda x: np.sum(np.linalg.eigvals(x @ x.T) ** 2)), backend="numpy"
    )
    for x in (sym, rot):
        np.testing.assert_allclose(
            f(x)[1], gt.grad(lambda y: np.sum(np.linalg.eigvals(y @ y.T) ** 2))(x), rtol=1e-10
        )


@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES), uplo=st.sampled_from("LU"))
def test_complex_hermitian_eigh_gradients(seed, n, batch, uplo):
    rng = np.random.default_rng(seed)
    h = hermitian_spread(rng, batch, n)
    lower = np.tri(n, dtype=bool) if uplo == "L" else np.tri(n, dtype=bool).T
    h = np.where(lower, h, 5.0 + 2j)  # the other triangle is not read
    check_vjp(lambda x: np.linalg.eigvalsh(x, uplo), h)
    check_vjp(
        lambda x: (lambda w, v: (w, _outer_products(v, la._mH(v))))(*np.linalg.eigh(x, uplo)), h
    )


@SETTINGS
@given(
    seed=SEEDS,
    m=SIZES,
    n=SIZES,
    batch=st.sampled_from(BATCHES),
    complex_=st.booleans(),
    hermitian=st.booleans(),
)
def test_pinv_gradients(seed, m, n, batch, complex_, hermitian):
    rng = np.random.default_rng(seed)
    if hermitian:
        a = hermitian_spread(rng, batch, n) if complex_ else symmetric_spread(rng, batch, n)
    else:
        a = spread_singular(rng, batch, m, n, complex_)
    check_vjp(lambda x: np.linalg.pinv(x, hermitian=hermitian), a)


def test_pinv_and_lstsq_of_rank_deficient_matrices():
    """At a fixed rank: differentiated along a parametrization that keeps the rank."""
    rng = np.random.default_rng(2)
    p, q, b = normal(rng, (5, 2)), normal(rng, (4, 2)), normal(rng, (5,))
    check_gradients(lambda x, y: np.linalg.pinv(x @ y.T), p, q)
    check_gradients(lambda x, y: np.linalg.lstsq(x @ y.T, b)[0], p, q)
    assert (
        np.linalg.lstsq(p @ q.T, b)[2]
        == gt.vjp(lambda x: np.linalg.lstsq(x, b), p @ q.T)[0][2]
        == 2
    )


@SETTINGS
@given(seed=SEEDS, m=SIZES, n=SIZES, k=st.sampled_from([None, 1, 2]), complex_=st.booleans())
def test_lstsq_gradients(seed, m, n, k, complex_):
    rng = np.random.default_rng(seed)
    a = spread_singular(rng, (), m, n, complex_)
    b = (complex_normal if complex_ else normal)(rng, (m,) if k is None else (m, k))
    check_vjp(lambda x, y: np.linalg.lstsq(x, y)[0], a, b)
    check_vjp(lambda x, y: np.linalg.lstsq(x, y)[3], a, b)
    if m > n:
        check_vjp(lambda x, y: np.linalg.lstsq(x, y)[1], a, b)
    out, ref = gt.vjp(lambda x: np.linalg.lstsq(x, b), a)[0], np.linalg.lstsq(a, b)
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o, r, rtol=1e-10, atol=1e-12)
        assert np.result_type(o) == np.result_type(r) and np.shape(o) == np.shape(r)


@SETTINGS
@given(
    seed=SEEDS,
    n=SIZES,
    batch=st.sampled_from(BATCHES),
    p=st.integers(-3, 6),
    complex_=st.booleans(),
)
def test_matrix_power_gradients(seed, n, batch, p, complex_):
    rng = np.random.default_rng(seed)
    a = complex_conditioned(rng, batch, n) if complex_ else well_conditioned(rng, batch, n)
    check_vjp(lambda x: np.linalg.matrix_power(x, p), a)


@SETTINGS
@given(
    seed=SEEDS,
    sa=st.lists(SIZES, min_size=0, max_size=3),
    sb=st.lists(SIZES, min_size=0, max_size=3),
    complex_=st.booleans(),
)
def test_kron_gradients(seed, sa, sb, complex_):
    rng = np.random.default_rng(seed)
    make = complex_normal if complex_ else normal
    a, b = make(rng, tuple(sa)), make(rng, tuple(sb))
    check_vjp(np.kron, a, b)


@SETTINGS
@given(seed=SEEDS, case=st.sampled_from(["2x3", "axes", "inv1", "inv2"]))
def test_tensorsolve_and_tensorinv_gradients(seed, case):
    rng = np.random.default_rng(seed)
    if case == "2x3":
        a, b = well_conditioned(rng, (), 6).reshape(2, 3, 6), normal(rng, (2, 3))
        check_gradients(np.linalg.tensorsolve, a, b, holomorphic=True)
    elif case == "axes":
        a, b = well_conditioned(rng, (), 6).reshape(6, 2, 3), normal(rng, (2, 3))
        check_gradients(lambda x, y: np.linalg.tensorsolve(x, y, axes=(0,)), a, b)
    elif case == "inv1":
        check_gradients(
            lambda x: np.linalg.tensorinv(x, 1),
            well_conditioned(rng, (), 6).reshape(6, 2, 3),
            holomorphic=True,
        )
    else:
        check_gradients(np.linalg.tensorinv, well_conditioned(rng, (), 6).reshape(2, 3, 6))


@SETTINGS
@given(seed=SEEDS, batch=st.sampled_from(BATCHES), offset=st.integers(-1, 1))
def test_trace_gradients(seed, batch, offset):
    rng = np.random.default_rng(seed)
    x = normal(rng, batch + (3, 4))
    check_gradients(lambda y: np.trace(y, offset, axis1=-2, axis2=-1), x, holomorphic=True)
    check_gradients(lambda y: np.linalg.trace(y, offset=offset), x)


MORE_EINSUM_CASES = [
    ("iii->i", [(3, 3, 3)]),
    ("ii->", [(3, 3)]),
    (",i->i", [(), (3,)]),
    ("...i,...i->...", [(2, 3), (3,)]),
    ("i...i", [(3, 2, 3)]),
    ("ij...,jk...->ik...", [(2, 3, 4), (3, 2, 4)]),
    ("ijk->kji", [(2, 3, 4)]),
    ("i,i,i->", [(3,), (3,), (3,)]),
    ("bij,bjk,bkl->bil", [(2, 3, 2), (2, 2, 4), (2, 4, 1)]),
]


@pytest.mark.parametrize("subscripts,shapes", MORE_EINSUM_CASES)
def test_einsum_more_forms(subscripts, shapes):
    rng = np.random.default_rng(3)
    ops = [normal(rng, s) for s in shapes]
    check_gradients(lambda *xs: np.einsum(subscripts, *xs), *ops, holomorphic=True)
    check_vjp(lambda *xs: np.einsum(subscripts, *xs), *(o * (1 + 0.5j) for o in ops))
    x = normal(rng, (2, 3, 3))
    check_gradients(lambda y: np.einsum(y, [Ellipsis, 0, 0], [Ellipsis]), x)
    check_gradients(lambda y: np.einsum("ij,jk", y[0], y[1], optimize=["einsum_path", (0, 1)]), x)


@SETTINGS
@given(seed=SEEDS, ord=st.sampled_from(VECTOR_ORDS), matrix_ord=st.sampled_from(MATRIX_ORDS))
def test_complex_norm_gradients(seed, ord, matrix_ord):
    rng = np.random.default_rng(seed)
    check_vjp(lambda y: np.linalg.norm(y, ord), complex_normal(rng, (4,)))
    check_vjp(
        lambda y: np.linalg.norm(y, matrix_ord, axis=(-2, -1)),
        spread_singular(rng, (2,), 3, 2, True),
    )


@SETTINGS
@given(seed=SEEDS, n=SIZES, p=st.sampled_from([None, 2, -2, 1, -1, np.inf, "fro", "nuc"]))
def test_cond_gradients(seed, n, p):
    rng = np.random.default_rng(seed)
    check_gradients(lambda x: np.linalg.cond(x, p), spread_singular(rng, (2,), n, n))


# --- degenerate spectra: the gradient where it is defined, NaN where it is not --------------------
def _repeated(rng, values, complex_=False):
    q = _unitary(rng, (len(values), len(values)), complex_)
    return (q * np.asarray(values)) @ np.conj(_mT(q))


def test_eigh_with_repeated_eigenvalues():
    rng = np.random.default_rng(4)
    a = _repeated(rng, [1.0, 1.0, 2.0, 3.0])
    c = normal(rng, (4, 4))
    sym = lambda f: lambda x: f(0.5 * (x + x.T))  # noqa: E731
    # functions of the eigenvalues symmetric within the block, and the block's projector
    check_gradients(sym(lambda x: np.sum(np.linalg.eigvalsh(x) ** 2)), a)
    check_gradients(sym(lambda x: np.linalg.eigvalsh(x)[2:]), a)
    check_gradients(sym(lambda x: (lambda w, v: v[:, :2] @ v[:, :2].T)(*np.linalg.eigh(x))), a)
    # not differentiable: one eigenvalue of the block, one vector of it
    for f in (
        lambda x: np.linalg.eigvalsh(x)[0],
        lambda x: np.sum(c[:, :1] * np.linalg.eigh(x)[1][:, :1] ** 2),
    ):
        assert np.all(np.isnan(gt.grad(f)(a)))
    # complex Hermitian: the same, and a phase-dependent loss is NaN too
    h = _repeated(rng, [1.0, 1.0, 2.0], True)
    proj = lambda x: (lambda w, v: v[:, :2] @ la._mH(v[:, :2]))(*np.linalg.eigh(x))  # noqa
    check_vjp(proj, h)
    ct = gt.vjp(lambda x: np.linalg.eigh(x)[1], h)[1](complex_normal(rng, (3, 3)))[0]
    assert np.all(np.isnan(ct))


def test_svd_with_repeated_and_zero_singular_values():
    rng = np.random.default_rng(5)
    u, v = _unitary(rng, (5, 4), False), _unitary(rng, (4, 4), False)
    a = (u * [2.0, 2.0, 1.0, 0.5]) @ v.T
    check_gradients(lambda x: np.linalg.norm(x, "nuc"), a)
    check_gradients(lambda x: (lambda u, _, vh: u @ vh)(*np.linalg.svd(x, False)), a)
    check_gradients(np.linalg.pinv, np.eye(3) * 2.0)
    for f in (lambda x: np.linalg.norm(x, 2), lambda x: np.linalg.svd(x)[0][0, 0] ** 2):
        assert np.all(np.isnan(gt.grad(f)(a)))
    # zero singular values: the nuclear norm has a kink there; norms of zero stay finite
    low_rank = np.outer(u[:, 0], v[:, 0])
    assert np.all(np.isnan(gt.grad(lambda x: np.linalg.norm(x, "nuc"))(low_rank)))
    check_gradients(lambda x: np.linalg.norm(x), low_rank)
    for ord in (2, -2, "nuc"):
        zero = np.zeros((3, 2))
        np.testing.assert_array_equal(gt.grad(lambda x: np.linalg.norm(x, ord))(zero), 0)


def test_eig_with_repeated_eigenvalues():
    rng = np.random.default_rng(6)
    p = np.eye(3) + 0.3 * normal(rng, (3, 3))
    a = p @ np.diag([1.0, 1.0, 2.0]) @ np.linalg.inv(p)
    check_gradients(lambda x: np.sum(np.linalg.eigvals(x)), a)  # the trace
    assert np.all(np.isnan(gt.grad(lambda x: np.sort(np.linalg.eigvals(x))[0])(a)))


# --- singular matrices ----------------------------------------------------------------------------
def test_singular_matrices_raise_numpys_error():
    a = np.ones((3, 3))
    for f in (
        np.linalg.inv,
        lambda x: np.linalg.solve(x, np.ones(3)),
        lambda x: np.linalg.solve(np.stack([x, x]), np.ones((2, 3, 1))),
        lambda x: np.linalg.matrix_power(x, -2),
        lambda x: np.linalg.tensorinv(x, 1),
    ):
        with pytest.raises(np.linalg.LinAlgError) as numpy_error:
            f(a)
        with pytest.raises(np.linalg.LinAlgError) as traced_error:
            gt.grad(lambda x: np.sum(f(x)))(a)
        assert str(traced_error.value) == str(numpy_error.value)


def test_det_of_singular_matrices_has_the_cofactor_gradient():
    rng = np.random.default_rng(7)
    a = normal(rng, (2, 3, 3))
    a[0, 2] = a[0, 0] + a[0, 1]  # numerically singular
    a[1, 2] = 0.0  # exactly singular
    check_gradients(np.linalg.det, a)
    check_forward_rule = gt.jvp(np.linalg.det, (a,), (np.ones_like(a),))[1]
    np.testing.assert_allclose(
        check_forward_rule, central_jvp(np.linalg.det, (a,), (np.ones_like(a),))[0], atol=1e-8
    )


# --- speed: what the backward pass recomputes -----------------------------------------------------
def test_solve_backward_reuses_the_lu_factors():
    a, b = well_conditioned(np.random.default_rng(8), (), 4), np.ones((4, 2))
    tape = _staged_grad(lambda x, y: np.sum(np.sin(np.linalg.solve(x, y))), a, b)
    names = [ins.prim.name for ins in tape.instructions]
    assert names.count("lu_factors") == 1 and names.count("lu_solve") == 2
    assert "solve" not in names and "inv" not in names


def test_stacked_solve_backward_reuses_the_lu_factors():
    a = well_conditioned(np.random.default_rng(8), (3,), la.STACKED_LU_MIN_SIZE)
    b = np.ones((la.STACKED_LU_MIN_SIZE, 2))
    tape = _staged_grad(lambda x, y: np.sum(np.sin(np.linalg.solve(x, y))), a, b)
    names = [ins.prim.name for ins in tape.instructions]
    assert names.count("lu_factors") == 1 and names.count("lu_solve") == 2
    assert "solve" not in names and "inv" not in names
    with pytest.raises(np.linalg.LinAlgError, match="Singular matrix"):
        gt.grad(lambda x: np.sum(np.linalg.solve(x, b)))(np.zeros_like(a))


@pytest.mark.parametrize(
    "batch_a, batch_b, k",
    [((2,), (), 1), ((2,), (2,), 3), ((3, 2), (2,), 2), ((2, 1), (3,), 1), ((), (2,), 2)]
    + [((2,), (), None), ((3, 1), (), None)],
)
@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
def test_solve_of_stacks_through_their_lu_factors(monkeypatch, batch_a, batch_b, k, dtype):
    """Every batch shape (broadcasting either way) on the stacked LU path, small matrices
    included (the size threshold lowered), against differences, forward mode and NumPy."""
    monkeypatch.setattr(la, "STACKED_LU_MIN_SIZE", 1)
    rng = np.random.default_rng(11)
    n = 3
    a = well_conditioned(rng, batch_a, n)
    b = normal(rng, batch_b + (n,) + (() if k is None else (k,)))
    if dtype == np.complex128:
        a = a + 0.3j * well_conditioned(rng, batch_a, n)
        b = b + 1j * normal(rng, b.shape)
    a, b = a.astype(dtype), b.astype(dtype)
    value, _ = gt.vjp(np.linalg.solve, a, b)
    np.testing.assert_allclose(value, np.linalg.solve(a, b), rtol=1e-5)
    assert value.dtype == np.linalg.solve(a, b).dtype
    names = [ins.prim.name for ins in gt.trace(np.linalg.solve, a, b).instructions]
    assert "lu_solve" in names and "solve" not in names
    if dtype == np.complex128:
        check_vjp(np.linalg.solve, a, b)
    else:
        check_gradients(np.linalg.solve, a, b)


def test_cholesky_backward_is_one_instruction_and_traced_through_when_differentiated():
    """Staged, the backward pass of cholesky is one instruction (its LAPACK path: trmm and
    sygst); differentiated again, it is traced through (triangular solves)."""
    s = spd(np.random.default_rng(9), (), 4)
    tape = _staged_grad(lambda x: np.sum(np.linalg.cholesky(x) ** 2), s)
    names = [ins.prim.name for ins in tape.instructions]
    assert names.count("cholesky_backward") == 1 and "solve" not in names
    f = lambda x: np.sum(np.sin(np.linalg.cholesky(x)))  # noqa: E731
    tape = gt.trace(lambda x: gt.hvp(f, x, np.ones_like(x)), s)
    assert "triangular_solve" in [ins.prim.name for ins in tape.instructions]
    check_hessian_vector(f, s)
    for lapack_path in (s, s.astype(np.float32)):
        low, low_bar = np.linalg.cholesky(lapack_path), np.tril(np.ones_like(lapack_path))
        generic = la._cholesky_backward(low[None], low_bar[None])[0]
        np.testing.assert_allclose(
            la._cholesky_backward(low, low_bar),
            generic,
            rtol=1e-5 if low.dtype == np.float32 else 1e-12,
            atol=1e-6,
        )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [1, 5, 70, 130])
def test_cholesky_backward_lapack_path_reads_the_lower_triangle_of_the_cotangent(n, dtype):
    """The LAPACK path (trmm, sygst) gives the triangular solves' result from the cotangent's
    lower triangle alone: a full cotangent, with a NaN and an infinity in its strict upper
    triangle, gives the finite result of its lower triangle; the result is lower triangular and
    C-contiguous (sizes across sygst's blocking of 64)."""
    rng = np.random.default_rng(n)
    low = np.linalg.cholesky(spd(rng, (), n)).astype(dtype)
    low_bar = rng.standard_normal((n, n)).astype(dtype)
    generic = la._cholesky_backward(low[None], np.tril(low_bar)[None])[0]
    if n > 1:
        low_bar[0, n - 1], low_bar[n // 2 - 1 if n > 2 else 0, n - 1] = np.nan, np.inf
    result = la._cholesky_backward(low, low_bar)
    assert result.dtype == dtype and result.flags.c_contiguous
    assert np.all(np.isfinite(result)) and not np.any(np.triu(result, 1))
    tol = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(result, generic, rtol=tol, atol=tol * np.abs(generic).max())


# --- second derivatives of the new rules ----------------------------------------------------------
@settings(max_examples=4, deadline=None)
@given(seed=SEEDS, n=st.integers(2, 3))
def test_second_derivatives_of_decompositions(seed, n):
    rng = np.random.default_rng(seed)
    a, c = spread_singular(rng, (), n + 1, n), normal(rng, (n + 1, n))
    g = general_spread(rng, (), n)
    check_hessian_vector(lambda x: np.sum(np.linalg.svd(x, compute_uv=False) ** 3), a)
    check_hessian_vector(lambda x: np.sum(c * np.linalg.pinv(x).T), a)
    check_hessian_vector(lambda x: np.sum(np.linalg.lstsq(x, c[:, 0])[0] ** 2), a)
    check_hessian_vector(lambda x: np.sum(c[:n] * la._re(np.linalg.eig(x)[1]) ** 2), g)
    check_hessian_vector(lambda x: np.sum(np.sin(np.linalg.solve(x, c[:n]))), g)
    check_hessian_vector(lambda x: np.sum(c * np.linalg.qr(x, "complete")[0][:, :n]), a)
    for f in (
        lambda x: np.sum(np.linalg.svd(x, compute_uv=False) ** 3),
        lambda x: np.sum(np.sin(np.linalg.solve(x, c[:n]))),
    ):
        x = a if f.__code__.co_names.count("svd") else g
        v = normal(rng, x.shape)
        h = 1e-5
        grad = gt.grad(f)
        assert_close(gt.hvp(f, x, v), (grad(x + h * v) - grad(x - h * v)) / (2 * h), 1e-5)


# --- JAX as an oracle, where it is installed ------------------------------------------------------
@pytest.fixture(scope="module")
def jax_modules():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    return jax, jnp


def test_gradients_match_jax(jax_modules):
    """JAX's rules for svd, eig, eigh, qr (reduced and complete), pinv, lstsq, slogdet, det."""
    jax, jnp = jax_modules
    rng = np.random.default_rng(10)
    a, c = spread_singular(rng, (2,), 5, 3), normal(rng, (2, 5, 3))
    sq, cs, q5 = general_spread(rng, (), 3), normal(rng, (3, 3)), normal(rng, (5, 5))
    cases = [
        ("svd", lambda np_, x: np_.sum(np_.linalg.svd(x, compute_uv=False) ** 2), a),
        (
            "svd u vh",
            lambda np_, x: np_.sum(
                c * (lambda u, s, vh: u @ vh)(*np_.linalg.svd(x, full_matrices=False))
            ),
            a,
        ),
        (
            "eigvals",
            lambda np_, x: (
                np_.sum(np_.linalg.eigvals(x) ** 2).real
                if np_ is not np
                else np.sum(la._re(np.linalg.eigvals(x) ** 2))
            ),
            sq,
        ),
        (
            "eigh",
            lambda np_, x: np_.sum(cs * (lambda w, v: (v * w) @ v.T)(*np_.linalg.eigh(x + x.T))),
            sq,
        ),
        ("qr", lambda np_, x: np_.sum(c * np_.linalg.qr(x)[0]), a),
        ("qr complete", lambda np_, x: np_.sum(np_.linalg.qr(x[0], mode="complete")[0] * q5), a),
        ("pinv", lambda np_, x: np_.sum(c * np_.swapaxes(np_.linalg.pinv(x), -1, -2)), a),
        ("lstsq", lambda np_, x: np_.sum(np_.linalg.lstsq(x[0], c[0, :, 0])[0] ** 2), a),
        ("slogdet", lambda np_, x: np_.linalg.slogdet(x)[1], sq),
        ("det", lambda np_, x: np_.linalg.det(x), sq),
        ("matrix_power", lambda np_, x: np_.sum(cs * np_.linalg.matrix_power(x, -3)), sq),
        ("kron", lambda np_, x: np_.sum(np_.kron(x, cs) ** 2), sq),
        ("norm nuc", lambda np_, x: np_.linalg.norm(x[0], "nuc"), a),
        ("norm -2", lambda np_, x: np_.linalg.norm(x[0], -2), a),
    ]
    for name, f, x in cases:
        ours = gt.grad(lambda y: f(np, y))(x)
        theirs = np.asarray(jax.jit(jax.grad(lambda y: f(jnp, y)))(jnp.asarray(x)))
        np.testing.assert_allclose(ours, theirs, rtol=1e-7, atol=1e-9, err_msg=name)


def _flat_pair(m, pair):
    """Two arrays as one vector (m: numpy or jax.numpy)."""
    return m.concatenate([pair[0].ravel(), pair[1].ravel()])


def test_complex_gradients_match_jax(jax_modules):
    """The complex convention is JAX's: compare vjps with complex cotangents."""
    jax, jnp = jax_modules
    rng = np.random.default_rng(11)
    a = complex_general_spread(rng, (), 3)
    h = hermitian_spread(rng, (), 3)
    s = spread_singular(rng, (), 4, 3, True)
    cases = [
        ("inv", lambda m: m.linalg.inv, a),
        ("det", lambda m: m.linalg.det, a),
        ("eigvals", lambda m: m.linalg.eigvals, a),
        ("eigvalsh", lambda m: m.linalg.eigvalsh, h),  # ours reads one triangle: folded below
        ("svdvals", lambda m: lambda x: m.linalg.svd(x, compute_uv=False), s),
        ("pinv", lambda m: m.linalg.pinv, s),
        ("solve", lambda m: lambda x: m.linalg.solve(x, a[:, 0]), a),
        ("qr", lambda m: lambda x: _flat_pair(m, m.linalg.qr(x)), s),
        ("qr wide", lambda m: lambda x: _flat_pair(m, m.linalg.qr(x.T)), s),
        # through a Hermitian parametrization: JAX symmetrizes, NumPy reads one triangle
        ("cholesky", lambda m: lambda x: m.linalg.cholesky(x @ x.conj().T + 3 * m.eye(3)), a),
        (
            "cholesky upper",
            lambda m: lambda x: m.linalg.cholesky(x @ x.conj().T + 3 * m.eye(3), upper=True),
            a,
        ),
    ]
    for name, f, x in cases:
        out, vjp_fn = gt.vjp(f(np), x)
        u = _like(rng, out)
        ours = vjp_fn(u)[0]
        theirs = np.asarray(
            jax.jit(lambda y, c: jax.vjp(f(jnp), y)[1](c)[0])(jnp.asarray(x), jnp.asarray(u))
        )
        if name == "eigvalsh":  # JAX's Hermitian gradient, onto the triangle NumPy reads
            theirs = la._hermitian_fold(theirs, True)
        np.testing.assert_allclose(ours, theirs, rtol=1e-7, atol=1e-9, err_msg=name)


def test_eigenvector_gradients_match_jax(jax_modules):
    """eig's vectors with LAPACK's normalization, as JAX differentiates them."""
    jax, jnp = jax_modules
    from jax import lax

    rng = np.random.default_rng(12)
    for a in (general_spread(rng, (), 4), complex_general_spread(rng, (), 3)):
        c = normal(rng, a.shape)
        ours = gt.vjp(lambda x: la._abs2(np.linalg.eig(x)[1].astype(complex)), a)[1](c)[0]
        theirs = jax.vjp(
            lambda x: (
                jnp.abs(
                    lax.linalg.eig(x, compute_left_eigenvectors=False, enable_eigvec_derivs=True)[1]
                )
                ** 2
            ),
            jnp.asarray(a),
        )[1](jnp.asarray(c))[0]
        np.testing.assert_allclose(ours, np.asarray(theirs), rtol=1e-7, atol=1e-9)


DECOMPOSITION_LOSSES = {
    "eigh": lambda x: np.sum(np.linalg.eigh(x @ x.T)[1] ** 2 * np.arange(4)),
    "svd": lambda x: (
        np.sum((lambda u, s, vh: u @ vh)(*np.linalg.svd(x, False)) ** 3) + np.linalg.norm(x, "nuc")
    ),
    "eig": lambda x: np.sum(la._re(np.linalg.eigvals(x[:3] @ x[1:].T)) ** 2),
    "pinv": lambda x: np.sum(np.linalg.pinv(x) ** 2),
    "lstsq": lambda x: np.sum(np.linalg.lstsq(x, np.ones(4))[0] ** 2),
    "qr complete": lambda x: np.sum(
        np.linalg.qr(x, "complete")[0][:, 3:] ** 2 * np.arange(4)[:, None]
    ),
    "det": lambda x: np.linalg.det(x[:3]) + np.linalg.slogdet(x[:3] @ x[:3].T)[1],
}


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=pytest.mark.native)])
@pytest.mark.parametrize("name", sorted(DECOMPOSITION_LOSSES))
def test_compiled_decompositions_match_eager(name, backend):
    f = DECOMPOSITION_LOSSES[name]
    a = spread_singular(np.random.default_rng(13), (), 4, 3)
    vg = gt.compile(gt.value_and_grad(f), backend=backend)
    for x in (a, a + 0.1):
        v, g = vg(x)
        v0, g0 = gt.value_and_grad(f)(x)
        np.testing.assert_allclose(v, v0, rtol=1e-12)
        np.testing.assert_allclose(g, g0, rtol=1e-8, atol=1e-10)
