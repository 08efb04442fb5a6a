"""Stacks of Cholesky solves in one batched computation: a stack of factors (vmap of
scipy.linalg.cho_solve, solve(assume_a="pos"), a user's stacked call) is solved by forward and
backward substitution over the whole stack at once when it holds enough matrices, and by one
LAPACK call per matrix otherwise; one factor with a stack of right-hand sides is one call.

The reference is LAPACK's potrs on each matrix alone (equal to rounding), and for the
derivatives gradtape's derivative of each member alone; JAX's vmap where installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.rules import scipy_linalg

sl = pytest.importorskip("scipy.linalg")


def _factors(rng, count: int, n: int, lower: bool):
    a = rng.normal(size=(count, n, n))
    spd = a @ np.swapaxes(a, -1, -2) + n * np.eye(n)
    return spd, np.stack([sl.cho_factor(m, lower=lower)[0] for m in spd])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    count=st.integers(1, 60),
    n=st.integers(1, 6),
    k=st.integers(1, 3),
    lower=st.booleans(),
    lead=st.sampled_from([(), (2,)]),
    b_shared=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_stack_of_factors_gives_each_matrix_its_own_solve(
    count, n, k, lower, lead, b_shared, seed
):
    """Substitution over the stack (when it holds at least 4n factors) or one call per
    matrix: either way each matrix's solution, broadcasting b against the factors."""
    rng = np.random.default_rng(seed)
    spd, c = _factors(rng, count, n, lower)
    c = np.broadcast_to(c, lead + c.shape)
    b = rng.normal(size=(n, k) if b_shared else lead + (count, n, k))
    got = scipy_linalg._potrs_raw(c, b, lower)
    bb = np.broadcast_to(b, lead + (count, n, k))
    want = np.empty(lead + (count, n, k))
    for idx in np.ndindex(lead + (count,)):
        want[idx] = sl.cho_solve((c[idx], lower), bb[idx])
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.einsum("...ij,...jk->...ik", spd, got), bb, atol=1e-9)


def test_substitution_is_taken_for_large_stacks_of_small_factors_only():
    assert scipy_linalg._substitution_pays((100, 5, 5))
    assert scipy_linalg._substitution_pays((4, 5, 3, 3))
    assert not scipy_linalg._substitution_pays((10, 16, 16))
    assert not scipy_linalg._substitution_pays((1000, 100, 100))
    assert not scipy_linalg._substitution_pays((100, 0, 0))


def test_one_factor_solves_a_stack_of_right_hand_sides_in_one_call():
    rng = np.random.default_rng(1)
    _, c = _factors(rng, 1, 4, True)
    b = rng.normal(size=(7, 4, 2))
    want = np.stack([sl.cho_solve((c[0], True), m) for m in b])
    np.testing.assert_allclose(scipy_linalg._potrs_raw(c[0], b, True), want, rtol=1e-12)


def test_a_singular_factor_gives_what_potrs_gives():
    """potrs does not check the factor: a zero on its diagonal gives inf and nan, without a
    warning, in the stacked solve too."""
    c = np.stack([np.eye(2)] * 12)
    c[3, 1, 1] = 0.0
    b = np.ones((12, 2, 1))
    with np.errstate(all="raise"):
        got = scipy_linalg._potrs_raw(c, b, True)
    with np.errstate(all="ignore"):
        want = sl.cho_solve((c[3], True), b[3], check_finite=False)
    np.testing.assert_array_equal(np.isfinite(got[3]), np.isfinite(want))
    np.testing.assert_array_equal(got[4], b[4])


def _logpdf(mu, cov, x):
    factor = sl.cho_factor(cov, lower=True)
    r = x - mu
    return -0.5 * r @ sl.cho_solve(factor, r) - np.sum(np.log(np.diag(factor[0])))


def _pos_solve(cov, b):
    return np.sum(np.sin(sl.solve(cov, b, assume_a="pos")))


@pytest.mark.parametrize("members", [3, 40])
def test_per_example_gradients_through_stacked_solves(members):
    """vmap(grad) of a log-density through cho_factor/cho_solve and of solve(assume_a="pos"),
    with batches on both sides of the substitution's threshold, against each member alone;
    forward mode against reverse mode."""
    rng = np.random.default_rng(members)
    n = 5
    covs, _ = _factors(rng, members, n, True)
    mus, xs = rng.normal(size=(members, n)), rng.normal(size=(members, n))
    grad = gt.grad(_logpdf, argnums=(0, 1))
    got = gt.vmap(grad)(mus, covs, xs)
    want = [np.stack(g) for g in zip(*[grad(m, c, x) for m, c, x in zip(mus, covs, xs)])]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    forward = gt.vmap(gt.jacfwd(_logpdf, argnums=1))(mus, covs, xs)
    np.testing.assert_allclose(forward, want[1], rtol=1e-10, atol=1e-12)
    pos = gt.vmap(gt.grad(_pos_solve, argnums=(0, 1)))(covs, xs)
    pos_want = [
        np.stack(g) for g in zip(*[gt.grad(_pos_solve, (0, 1))(c, x) for c, x in zip(covs, xs)])
    ]
    for g, w in zip(pos, pos_want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_jax_vmap_agrees_on_a_large_batch():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jsl = pytest.importorskip("jax.scipy.linalg")
    jnp = jax.numpy

    def jlogpdf(mu, cov, x):
        factor = jsl.cho_factor(cov, lower=True)
        r = x - mu
        return -0.5 * r @ jsl.cho_solve(factor, r) - jnp.sum(jnp.log(jnp.diag(factor[0])))

    rng = np.random.default_rng(3)
    covs, _ = _factors(rng, 50, 4, True)
    mus, xs = rng.normal(size=(50, 4)), rng.normal(size=(50, 4))
    want = jax.vmap(jax.grad(jlogpdf, argnums=(0, 1)))(mus, covs, xs)
    got = gt.vmap(gt.grad(_logpdf, argnums=(0, 1)))(mus, covs, xs)
    np.testing.assert_allclose(got[0], np.asarray(want[0]), rtol=1e-9, atol=1e-11)
    # SciPy's factor reads one triangle (so does gradtape's gradient), JAX's gradient is
    # symmetric: they agree on every symmetric direction
    np.testing.assert_allclose(
        _on_symmetric_directions(got[1]),
        _on_symmetric_directions(np.asarray(want[1])),
        rtol=1e-9,
        atol=1e-11,
    )


def _on_symmetric_directions(g):
    """g's pairing with the symmetric basis matrices: g_ij + g_ji off the diagonal, g_ii."""
    return g + np.swapaxes(g, -1, -2) - g * np.eye(g.shape[-1])
