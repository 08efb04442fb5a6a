"""scipy.linalg rules, checked against numbers gradtape does not compute.

References: central differences of SciPy's own functions (values must match SciPy's to
rounding), the adjoint identity between gradtape.jvp and gradtape.vjp, and JAX's
jax.scipy.linalg where it is installed. Shapes, batches, options and values are generated.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg as sl
from conftest import central_difference_grad, compile_backends
from hypothesis import given, settings
from hypothesis import strategies as st
from test_linalg import (
    assert_close,
    central_jvp,
    check_gradients,
    check_values,
    check_vjp,
    hermitian_spread,
    normal,
    spd,
    well_conditioned,
)

import gradtape as gt
from gradtape.rules import scipy_linalg as sla

SETTINGS = settings(max_examples=12, deadline=None)
FEW = settings(max_examples=4, deadline=None)
SEEDS = st.integers(0, 2**32 - 1)
SIZES = st.integers(1, 4)
BATCHES = [(), (2,), (2, 1)]


def _mT(x):
    return np.swapaxes(x, -1, -2)


def check_forward(f, *args, rtol=1e-6, seed=3):
    """gradtape.jvp vs central differences, and <u, J v> == <J^T u, v> with gradtape.vjp."""
    rng = np.random.default_rng(seed)
    tangents = tuple(normal(rng, np.shape(a)) for a in args)
    out, t_out = gt.jvp(f, args, tangents)
    leaves = list(t_out) if isinstance(t_out, (tuple, list)) else [t_out]
    for got, ref in zip(leaves, central_jvp(f, args, tangents)):
        assert_close(got, ref, rtol)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    us = [normal(rng, np.shape(o)) for o in outs]
    cts = gt.vjp(f, *args)[1](type(out)(us) if isinstance(out, (tuple, list)) else us[0])
    lhs = sum(np.sum(u * t) for u, t in zip(us, leaves))
    rhs = sum(np.sum(c * t) for c, t in zip(cts, tangents))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-9, atol=1e-9 * max(1.0, abs(rhs)))


def check_hessian_vector(f, x, seed: int = 11, rtol: float = 1e-5):
    """grad of <grad f, v> (reverse over reverse) and hvp (forward over reverse) vs central
    differences of grad f along v."""
    v = np.random.default_rng(seed).standard_normal(x.shape)
    g = gt.grad(f)
    h = 1e-5
    ref = (g(x + h * v) - g(x - h * v)) / (2 * h)
    assert_close(gt.grad(lambda y: np.sum(g(y) * v))(x), ref, rtol)
    assert_close(gt.hvp(f, x, v), ref, rtol)


# --- installation ---------------------------------------------------------------------------------
def test_wrappers_are_installed_and_plain_calls_go_to_scipy():
    for name in sla._RULES:
        f = getattr(sl, name)
        assert hasattr(f, "__gradtape_original__"), name
        assert f.__name__ == name and f.__doc__ == f.__gradtape_original__.__doc__
    a = spd(np.random.default_rng(0), (), 3)
    c = sl.cho_factor(a)
    np.testing.assert_array_equal(
        sl.cho_solve(c, np.ones(3)), sl.cho_solve.__gradtape_original__(c, np.ones(3))
    )


def test_import_hook_wraps_scipy_linalg_imported_after_gradtape():
    code = (
        "import sys, gradtape\n"
        "from scipy.linalg import cho_solve, expm\n"
        "assert hasattr(cho_solve, '__gradtape_original__')\n"
        "assert hasattr(expm, '__gradtape_original__')\n"
        "import numpy as np\n"
        "g = gradtape.grad(lambda a: np.sum(expm(a)))(np.eye(2))\n"
        "assert np.allclose(g, np.e)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- Cholesky -------------------------------------------------------------------------------------
@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES), lower=st.booleans())
def test_cholesky_and_cho_factor_gradients(seed, n, batch, lower):
    rng = np.random.default_rng(seed)
    a = spd(rng, batch, n)
    check_gradients(lambda x: sl.cholesky(x, lower=lower), a)
    if not batch:
        check_gradients(lambda x: sl.cho_factor(x, lower=lower)[0], a)


@SETTINGS
@given(
    seed=SEEDS,
    n=SIZES,
    lower=st.booleans(),
    k=st.sampled_from([None, 1, 3]),
    batch_b=st.sampled_from(BATCHES),
)
def test_cho_solve_gradients(seed, n, lower, k, batch_b):
    rng = np.random.default_rng(seed)
    a = spd(rng, (), n)
    b = normal(rng, (n,) if k is None else batch_b + (n, k))
    check_gradients(lambda x, y: sl.cho_solve(sl.cho_factor(x, lower=lower), y), a, b)
    # the factor itself: only its triangle is read
    unread = np.triu(np.ones((n, n)), 1) if lower else np.tril(np.ones((n, n)), -1)
    c = sl.cho_factor(a, lower=lower)[0] + 7.0 * unread
    g = gt.grad(lambda x: np.sum(np.sin(sl.cho_solve((x, lower), b))))(c)
    assert np.all(g[unread == 1] == 0)
    check_gradients(lambda x: sl.cho_solve((x, lower), b), c)


def test_cho_solve_of_stacked_factors():
    rng = np.random.default_rng(4)
    a, b = spd(rng, (2,), 3), normal(rng, (2, 3, 2))
    check_gradients(lambda x, y: sl.cho_solve((np.linalg.cholesky(x), True), y), a, b)


def test_cho_solve_backward_reuses_the_factor():
    """The backward pass of cho_solve solves with the factor: no new factorization, and the
    Cholesky rule's own backward pass is one instruction (trmm and sygst), not general solves."""
    rng = np.random.default_rng(5)
    a, b = spd(rng, (), 4), normal(rng, (4,))
    tape = gt.trace(gt.grad(lambda x: np.sum(sl.cho_solve(sl.cho_factor(x), b) ** 2)), a)
    names = [ins.prim.name for ins in tape.instructions]
    assert names.count("cholesky") == 1 and names.count("cho_solve") == 2
    assert "solve" not in names and "lu_factors" not in names
    assert names.count("cholesky_backward") == 1


# --- triangular solves ----------------------------------------------------------------------------
@SETTINGS
@given(
    seed=SEEDS,
    n=SIZES,
    batch=st.sampled_from(BATCHES),
    lower=st.booleans(),
    trans=st.sampled_from([0, 1, 2, "N", "T", "C"]),
    unit=st.booleans(),
    k=st.sampled_from([None, 2]),
)
def test_solve_triangular_gradients(seed, n, batch, lower, trans, unit, k):
    rng = np.random.default_rng(seed)
    a = well_conditioned(rng, batch, n)
    b = normal(rng, (n,) if k is None else batch + (n, k))
    f = lambda x, y: sl.solve_triangular(
        x,
        y,
        trans=trans,
        lower=lower,  # noqa: E731
        unit_diagonal=unit,
    )
    check_gradients(f, a, b)
    ga = gt.grad(lambda x: np.sum(np.sin(f(x, b))))(a)  # nothing outside what LAPACK reads
    read = np.tri(n, k=-1 if unit else 0, dtype=bool)
    assert np.all(ga[..., ~(read if lower else read.T)] == 0)


@FEW
@given(seed=SEEDS)
def test_solve_triangular_forward_and_second_order(seed):
    rng = np.random.default_rng(seed)
    a, b = well_conditioned(rng, (), 3), normal(rng, (3, 2))
    check_forward(lambda x, y: sl.solve_triangular(x, y, lower=True, trans=1), a, b)
    check_hessian_vector(lambda x: np.sum(np.sin(sl.solve_triangular(x, b))), a)


# --- LU -------------------------------------------------------------------------------------------
@SETTINGS
@given(seed=SEEDS, n=SIZES, trans=st.sampled_from([0, 1, 2]), k=st.sampled_from([None, 2]))
def test_lu_factor_and_lu_solve_gradients(seed, n, trans, k):
    rng = np.random.default_rng(seed)
    a, b = well_conditioned(rng, (), n), normal(rng, (n,) if k is None else (n, k))
    check_gradients(lambda x, y: sl.lu_solve(sl.lu_factor(x), y, trans=trans), a, b)
    check_gradients(lambda x: sl.lu_factor(x)[0], normal(rng, (n, n)))
    lu, piv = sl.lu_factor(a)
    check_gradients(lambda x: sl.lu_solve((x, piv), b, trans=trans), lu)


@SETTINGS
@given(
    seed=SEEDS,
    m=SIZES,
    n=SIZES,
    batch=st.sampled_from(BATCHES),
    mode=st.sampled_from(["p", "permute_l", "p_indices"]),
)
def test_lu_gradients(seed, m, n, batch, mode):
    rng = np.random.default_rng(seed)
    a = normal(rng, batch + (m, n))
    kw = {"permute_l": mode == "permute_l", "p_indices": mode == "p_indices"}
    outs = sl.lu(a, **kw)
    assert all(np.array_equal(o, r) for o, r in zip(gt.vjp(lambda x: sl.lu(x, **kw), a)[0], outs))
    check_gradients(lambda x: sl.lu(x, **kw)[-2:], a)


def test_lu_solve_backward_reuses_the_factors():
    a, b = well_conditioned(np.random.default_rng(6), (), 4), np.ones(4)
    tape = gt.trace(gt.grad(lambda x: np.sum(np.sin(sl.lu_solve(sl.lu_factor(x), b)))), a)
    names = [ins.prim.name for ins in tape.instructions]
    assert names.count("lu") == 1 and names.count("lu_solve_factors") == 2


# --- solve, inv, det -----------------------------------------------------------------------------
ASSUME = [
    None,
    "gen",
    "sym",
    "pos",
    "upper triangular",
    "lower triangular",
    "diagonal",
    "tridiagonal",
]


@SETTINGS
@given(
    seed=SEEDS,
    n=SIZES,
    assume_a=st.sampled_from(ASSUME),
    lower=st.booleans(),
    transposed=st.booleans(),
    k=st.sampled_from([None, 2]),
)
def test_solve_gradients(seed, n, assume_a, lower, transposed, k):
    rng = np.random.default_rng(seed)
    a = spd(rng, (), n) + (0.3 * normal(rng, (n, n)) if assume_a in (None, "gen") else 0)
    b = normal(rng, (n,) if k is None else (n, k))
    f = lambda x, y: sl.solve(
        x,
        y,
        assume_a=assume_a,
        lower=lower,  # noqa: E731
        transposed=transposed and assume_a in (None, "gen"),
    )
    check_gradients(f, a, b)


def test_solve_of_stacked_matrices_and_the_factor_reuse():
    rng = np.random.default_rng(7)
    a, b = well_conditioned(rng, (2,), 3), normal(rng, (2, 3, 2))
    check_gradients(sl.solve, a, b)
    s = spd(rng, (), 4)
    tape = gt.trace(gt.grad(lambda x: np.sum(np.sin(sl.solve(x, np.ones(4), assume_a="pos")))), s)
    names = [ins.prim.name for ins in tape.instructions]
    assert names.count("cho_factors") == 1 and names.count("pos_solve") == 2
    tape = gt.trace(gt.grad(lambda x: np.sum(np.sin(sl.solve(x, np.ones(4))))), s)
    names = [ins.prim.name for ins in tape.instructions]
    assert names.count("lu_factors") == 1 and names.count("lu_solve") == 2


@SETTINGS
@given(
    seed=SEEDS,
    n=SIZES,
    assume_a=st.sampled_from([None, "gen", "sym", "pos", "upper triangular", "diagonal"]),
    lower=st.booleans(),
)
def test_inv_and_det_gradients(seed, n, assume_a, lower):
    rng = np.random.default_rng(seed)
    a = spd(rng, (), n)
    check_gradients(lambda x: sl.inv(x, assume_a=assume_a, lower=lower), a)
    check_gradients(sl.det, well_conditioned(rng, (2,), n))


def test_singular_matrices_raise_as_scipy_and_numpy_do():
    a = np.ones((3, 3))
    with pytest.raises(np.linalg.LinAlgError):
        gt.grad(lambda x: np.sum(sl.solve(x, np.ones(3))))(a)
    with pytest.raises(np.linalg.LinAlgError):
        gt.grad(lambda x: np.sum(sl.solve_triangular(x - np.triu(x), np.ones(3))))(a)
    with pytest.raises(np.linalg.LinAlgError):
        gt.grad(lambda x: np.sum(sl.cholesky(x)))(-np.eye(3))


# --- eigh -----------------------------------------------------------------------------------------
def _symmetric_spread(rng, n):
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (q * (np.arange(1.0, n + 1) + rng.uniform(0, 0.3, n))) @ q.T


@SETTINGS
@given(seed=SEEDS, n=SIZES, lower=st.booleans(), general=st.booleans())
def test_eigh_gradients(seed, n, lower, general):
    rng = np.random.default_rng(seed)
    a, b = _symmetric_spread(rng, n), (spd(rng, (), n) if general else None)

    def f(x, y=None):
        w, v = sl.eigh(x, y, lower=lower)
        return w, v * np.sign(v[:1])  # a sign-free function of the eigenvectors

    check_gradients(lambda x: f(x, b), a)
    if general:
        check_gradients(lambda y: f(a, y), b)
        check_gradients(lambda y: sl.eigvalsh(a, y, lower=lower), b)
        check_forward(lambda x, y: f(x, y), a, b)


@SETTINGS
@given(seed=SEEDS, general=st.booleans(), by_value=st.booleans())
def test_eigh_subsets_are_scipys_with_their_signs(seed, general, by_value):
    """A subset is selected from all the eigenpairs (their derivatives need the others); its
    eigenvectors take the signs SciPy's subset driver gives, on every replay."""
    rng = np.random.default_rng(seed)
    n = 5
    a = normal(rng, (n, n))
    a = a @ a.T + 0.5 * np.eye(n)
    b = np.eye(n) * 2 + 0.05 * (a + a.T) / n if general else None
    subset = {"subset_by_value": (0.5, 6.0)} if by_value else {"subset_by_index": [1, 3]}

    def f(x):
        return sl.eigh(x, b, **subset)

    compiled = gt.compile(f, backend="numpy")
    for x in (a, a + np.diag(normal(rng, (n,)) * 0.3)):
        want_w, want_v = f(x)
        got_w, got_v = compiled(x)
        np.testing.assert_allclose(got_w, want_w, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_v, want_v, rtol=1e-10, atol=1e-10)
    weights = np.arange(n * 3.0).reshape(n, 3)
    if not by_value:
        check_gradients(lambda x: sl.eigh(x, b, eigvals_only=True, **subset), a)
        check_gradients(lambda x: np.sum(f(x)[1] * weights), a)


def test_eigh_refusals_are_clear():
    a = np.eye(3) * [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="not valid"):
        gt.grad(lambda x: np.sum(sl.eigh(x, subset_by_index=[1, 3])[0]))(a)
    with pytest.raises(gt.GradtapeError, match="type"):
        gt.grad(lambda x: np.sum(sl.eigh(x, np.eye(3), type=2)[0]))(a)


# --- matrix functions -----------------------------------------------------------------------------
@SETTINGS
@given(seed=SEEDS, n=SIZES, batch=st.sampled_from(BATCHES))
def test_expm_gradients(seed, n, batch):
    rng = np.random.default_rng(seed)
    a = 0.5 * normal(rng, batch + (n, n))
    check_gradients(sl.expm, a)
    if not batch:
        check_forward(sl.expm, a)


@SETTINGS
@given(seed=SEEDS, n=SIZES, name=st.sampled_from(["sqrtm", "logm", "funm exp", "funm sin"]))
def test_matrix_function_gradients(seed, n, name):
    rng = np.random.default_rng(seed)
    a = spd(rng, (), n) / n if name in ("sqrtm", "logm") else 0.5 * normal(rng, (n, n))
    f = {
        "sqrtm": sl.sqrtm,
        "logm": sl.logm,
        "funm exp": lambda x: sl.funm(x, np.exp),
        "funm sin": lambda x: sl.funm(x, np.sin),
    }[name]
    check_gradients(f, a)
    check_forward(f, a, rtol=1e-5)


def test_matrix_function_second_derivatives():
    rng = np.random.default_rng(8)
    a, c = 0.5 * normal(rng, (3, 3)), normal(rng, (3, 3))
    check_hessian_vector(lambda x: np.sum(c * sl.expm(x)), a)
    check_hessian_vector(lambda x: np.sum(c * sl.sqrtm(x)), spd(rng, (), 3))


def test_complex_expm_follows_jax_convention():
    rng = np.random.default_rng(9)
    a = 0.4 * (normal(rng, (3, 3)) + 1j * normal(rng, (3, 3)))
    u = normal(rng, (3, 3)) + 1j * normal(rng, (3, 3))
    g = gt.vjp(sl.expm, a)[1](u)[0]
    loss = lambda x: np.real(np.sum(u * sl.expm.__gradtape_original__(x)))  # noqa: E731
    ref = np.zeros((3, 3), complex)
    for i in np.ndindex(3, 3):
        e = np.zeros((3, 3))
        e[i] = 1e-6
        ref[i] = ((loss(a + e) - loss(a - e)) - 1j * (loss(a + 1j * e) - loss(a - 1j * e))) / 2e-6
    assert_close(g, ref, 1e-6)


def test_matrix_function_refusals_are_clear():
    with pytest.raises(gt.GradtapeError, match="complex"):
        gt.grad(lambda x: np.sum(sl.sqrtm(x)))(-np.eye(2) + 0.1)
    with pytest.raises(gt.GradtapeError, match="scipy.linalg.cho_factor.*complex"):
        gt.vjp(lambda x: sl.cho_factor(x)[0], np.eye(2) + 0j)


@pytest.mark.parametrize("lower", [False, True])
def test_complex_cholesky_reads_the_triangle_scipy_reads(lower):
    a = hermitian_spread(np.random.default_rng(4), (), 3)
    check_values(lambda x: sl.cholesky(x, lower=lower), a)
    check_vjp(lambda x: sl.cholesky(x, lower=lower), a)


# --- matrix equations -----------------------------------------------------------------------------
@SETTINGS
@given(seed=SEEDS, n=SIZES, m=SIZES)
def test_sylvester_and_lyapunov_gradients(seed, n, m):
    rng = np.random.default_rng(seed)
    a, b, q = spd(rng, (), n), spd(rng, (), m), normal(rng, (n, m))
    check_gradients(sl.solve_sylvester, a, b, q)
    qn = normal(rng, (n, n))
    check_gradients(sl.solve_continuous_lyapunov, -a, qn)
    stable = 0.5 * well_conditioned(rng, (), n) / 1.5
    check_gradients(sl.solve_discrete_lyapunov, stable, qn)
    check_gradients(lambda x, y: sl.solve_discrete_lyapunov(x, y, method="bilinear"), stable, qn)
    check_forward(sl.solve_sylvester, a, b, q)


def test_matrix_equation_second_derivatives():
    rng = np.random.default_rng(10)
    a, q = spd(rng, (), 3), normal(rng, (3, 3))
    check_hessian_vector(lambda x: np.sum(np.sin(sl.solve_sylvester(x, a, q))), a)
    check_hessian_vector(
        lambda x: np.sum(q * sl.solve_discrete_lyapunov(0.3 * x, q)), well_conditioned(rng, (), 3)
    )


# --- banded, block diagonal -----------------------------------------------------------------------
@SETTINGS
@given(
    seed=SEEDS,
    n=st.integers(1, 6),
    nl=st.integers(0, 2),
    nu=st.integers(0, 2),
    k=st.sampled_from([None, 1, 3]),
)
def test_solve_banded_gradients(seed, n, nl, nu, k):
    rng = np.random.default_rng(seed)
    ab = 0.3 * normal(rng, (nl + nu + 1, n))
    ab[nu] += 3.0  # a dominant diagonal
    b = normal(rng, (n,) if k is None else (n, k))
    check_gradients(lambda x, y: sl.solve_banded((nl, nu), x, y), ab, b)
    g = gt.grad(lambda x: np.sum(np.sin(sl.solve_banded((nl, nu), x, b))))(ab)
    for d in range(nl + nu + 1):  # entries outside the matrix are not read
        shift = d - nu
        outside = [j for j in range(n) if not 0 <= j + shift < n]
        assert np.all(g[d, outside] == 0)


def test_block_diag_gradients():
    rng = np.random.default_rng(11)
    a, b, c = normal(rng, (2, 3)), normal(rng, (3,)), normal(rng, (1, 1))
    check_gradients(lambda x, y, z: sl.block_diag(x, y, z, 2.0), a, b, c)


# --- where JAX is installed: its rules as an oracle -----------------------------------------------
@pytest.fixture(scope="module")
def jax_modules():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl

    return jax, jnp, jsl


def test_gradients_match_jax(jax_modules):
    jax, jnp, jsl = jax_modules
    rng = np.random.default_rng(12)
    n = 4
    a, s, b, c = (
        0.5 * normal(rng, (n, n)),
        spd(rng, (), n),
        normal(rng, (n, 2)),
        normal(rng, (n, n)),
    )
    w = well_conditioned(rng, (), n)
    cases = [
        (lambda x: np.sum(c * sl.expm(x)), lambda x: jnp.sum(c * jsl.expm(x)), a),
        # through a symmetric parametrization: gradtape's rule reads one triangle, as LAPACK
        (
            lambda x: np.sum(np.sin(sl.cho_solve(sl.cho_factor(x + x.T, lower=True), b))),
            lambda x: jnp.sum(jnp.sin(jsl.cho_solve(jsl.cho_factor(x + x.T, lower=True), b))),
            s,
        ),
        (
            lambda x: np.sum(np.sin(sl.solve_triangular(x, b, lower=True, trans=1))),
            lambda x: jnp.sum(jnp.sin(jsl.solve_triangular(x, b, lower=True, trans=1))),
            w,
        ),
        (
            lambda x: np.sum(np.sin(sl.lu_solve(sl.lu_factor(x), b))),
            lambda x: jnp.sum(jnp.sin(jsl.lu_solve(jsl.lu_factor(x), b))),
            w,
        ),
        (
            lambda x: np.sum(c * sl.lu(x)[1]) + np.sum(c * sl.lu(x)[2]),
            lambda x: jnp.sum(c * jsl.lu(x)[1]) + jnp.sum(c * jsl.lu(x)[2]),
            w,
        ),
        (
            lambda x: np.sum(c * sl.block_diag(x, x)[:n, :n]),
            lambda x: jnp.sum(c * jsl.block_diag(x, x)[:n, :n]),
            a,
        ),
    ]
    for i, (f, jf, x) in enumerate(cases):
        np.testing.assert_allclose(
            gt.grad(f)(x),
            np.asarray(jax.jit(jax.grad(jf))(x)),
            rtol=1e-8,
            atol=1e-10,
            err_msg=f"case {i}",
        )


# --- a real use: a Gaussian-process marginal likelihood -------------------------------------------
def _gp_nll(theta, x, y):
    """Negative log marginal likelihood of an RBF Gaussian process (what one writes in SciPy)."""
    length, signal, noise = np.exp(theta)
    d2 = (x[:, None] - x[None, :]) ** 2
    k = signal * np.exp(-0.5 * d2 / length**2) + noise * np.eye(len(x))
    chol = sl.cholesky(k, lower=True)
    alpha = sl.cho_solve((chol, True), y)
    return 0.5 * y @ alpha + np.sum(np.log(np.diag(chol))) + 0.5 * len(x) * np.log(2 * np.pi)


def test_gaussian_process_likelihood_gradient_and_compile():
    rng = np.random.default_rng(13)
    x = np.sort(rng.uniform(0, 5, 30))
    y = np.sin(x) + 0.1 * rng.standard_normal(30)
    theta = np.array([0.1, -0.2, -2.0])
    value, g = gt.value_and_grad(_gp_nll)(theta, x, y)
    assert_close(g, central_difference_grad(_gp_nll, (theta, x, y), 0), 1e-6)
    for backend in compile_backends():
        vg = gt.compile(gt.value_and_grad(_gp_nll), backend=backend)
        for t in (theta, theta + 0.3):
            v2, g2 = vg(t, x, y)
            v3, g3 = gt.value_and_grad(_gp_nll)(t, x, y)
            np.testing.assert_allclose(v2, v3, rtol=1e-10)
            np.testing.assert_allclose(g2, g3, rtol=1e-8, atol=1e-12)
    check_values(lambda t: _gp_nll(t, x, y), theta)


def test_second_derivatives_of_factored_solves():
    rng = np.random.default_rng(14)
    a, s, b = well_conditioned(rng, (), 3), spd(rng, (), 3), normal(rng, (3, 2))
    check_hessian_vector(lambda x: np.sum(np.sin(sl.lu_solve(sl.lu_factor(x), b))), a)
    check_hessian_vector(lambda x: np.sum(np.sin(sl.cho_solve(sl.cho_factor(x), b))), s)
    check_hessian_vector(lambda x: np.sum(np.sin(sl.solve(x, b, assume_a="pos"))), s)
    check_hessian_vector(lambda x: np.sum(sl.lu(x)[1] ** 3) + np.sum(sl.lu(x)[2] ** 3), a)
    ab = np.stack([0.3 * normal(rng, (4,)), 3.0 + normal(rng, (4,)), 0.3 * normal(rng, (4,))])
    check_hessian_vector(
        lambda x: np.sum(np.sin(sl.solve_banded((1, 1), x, b[:, 0].repeat(2)[:4]))), ab
    )
    check_hessian_vector(lambda x: np.sum(sl.eigh(x, s)[0] ** 3), s + a @ a.T)


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=pytest.mark.native)])
def test_compiled_gradients_match_eager(backend):
    rng = np.random.default_rng(15)
    a, s, b = well_conditioned(rng, (), 4), spd(rng, (), 4), normal(rng, (4, 2))
    ab = np.stack([0.3 * normal(rng, (4,)), 3.0 + normal(rng, (4,))])

    def f(x, y):
        return (
            np.sum(np.sin(sl.lu_solve(sl.lu_factor(x), b)))
            + np.sum(sl.expm(0.2 * x))
            + np.sum(sl.solve_triangular(y, b, lower=True) ** 2)
            + np.sum(sl.solve(y, b, assume_a="pos") ** 2)
            + np.sum(sl.sqrtm(y))
            + np.sum(sl.solve_banded((1, 0), ab * x[0, 0], b))
            + np.sum(sl.solve_sylvester(x, y, b @ b.T))
        )

    vg = gt.compile(gt.value_and_grad(f, argnums=(0, 1)), backend=backend)
    for x, y in ((a, s), (a + 0.1, s + 0.2 * np.eye(4))):
        v, (gx, gy) = vg(x, y)
        v0, (gx0, gy0) = gt.value_and_grad(f, argnums=(0, 1))(x, y)
        np.testing.assert_allclose(v, v0, rtol=1e-10)
        np.testing.assert_allclose(gx, gx0, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(gy, gy0, rtol=1e-8, atol=1e-10)


# SciPy's names for NumPy's factorizations, and the structured matrices: SciPy's values, and
# gradients against central differences, forward mode against reverse
_W = np.cos(np.arange(40.0)).reshape(4, 10)
_NAMED = {
    "svd": lambda a: sl.svd(a, full_matrices=False)[1],
    "svd uv": lambda a: np.abs(sl.svd(a, full_matrices=False)[0][:, :2]),
    "svdvals": lambda a: sl.svdvals(a),
    "qr full": lambda a: sl.qr(a[:, :3])[1],
    "qr economic": lambda a: np.abs(sl.qr(a, mode="economic")[0]),
    "qr r": lambda a: sl.qr(a, mode="r")[0],
    "pinv": lambda a: sl.pinv(a[:, :3]),
    "pinv rtol": lambda a: sl.pinv(a[:3], rtol=1e-8),
    "lstsq": lambda a: sl.lstsq(a[:, :3], _W[0, :4])[0],
    "lstsq residues": lambda a: sl.lstsq(a[:, :3], _W[:2, :4].T)[1],
    "toeplitz": lambda a: sl.toeplitz(a[0], a[1, :3]),
    "toeplitz c": lambda a: sl.toeplitz(a[0]),
    "circulant": lambda a: sl.circulant(a[1]),
    "hankel": lambda a: sl.hankel(a[0, :3], a[1]),
    "hankel c": lambda a: sl.hankel(a[2]),
}


@pytest.mark.parametrize("name", _NAMED)
def test_scipy_names_of_factorizations_and_structured_matrices(name):
    f = _NAMED[name]
    a = np.array(
        [[2.0, 0.3, -0.5, 0.1], [0.4, 1.5, 0.2, -0.3], [-0.2, 0.6, 1.8, 0.5], [0.3, -0.1, 0.4, 1.2]]
    )
    expected = f(a)
    weights = _W.reshape(-1)[: np.size(expected)].reshape(np.shape(expected))

    def loss(a):
        return np.sum(weights * f(a))

    value, grad = gt.value_and_grad(loss)(a)
    np.testing.assert_allclose(value, np.sum(weights * expected), rtol=1e-12)
    np.testing.assert_allclose(grad, central_difference_grad(loss, (a,), 0), rtol=1e-6, atol=1e-8)
    direction = np.sin(np.arange(16.0)).reshape(4, 4)
    _, tangent = gt.jvp(loss, (a,), (direction,))
    np.testing.assert_allclose(tangent, np.sum(grad * direction), rtol=1e-9)


@pytest.mark.parametrize(
    "call, phrase",
    [
        (lambda a: sl.qr(a, pivoting=True), "pivoting=True"),
        (lambda a: sl.qr(a, mode="raw"), "mode='raw'"),
        (lambda a: sl.pinv(a, atol=1e-3), "atol"),
        (lambda a: sl.toeplitz(a), "batch"),
    ],
)
def test_scipy_factorization_options_without_a_rule_are_refused(call, phrase):
    with pytest.raises(gt.GradtapeError, match=phrase):
        gt.grad(lambda a: np.sum(call(a)[0]))(np.eye(3) + 0.1)
