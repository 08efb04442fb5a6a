"""vmap of np.linalg.solve is one batched solve: its LU factorization and its solve from the
factors have batching rules, so a batched Newton step (a vmapped gradient, Hessian and solve)
is recorded as a program whose size does not depend on the batch size.

Without the rules each member ran its own factorization and solve, and the members' results
were stacked: a batch of 500 gave a program of about 3,000 instructions whose native kernels
passed 501 values in and out and concatenated 500 pieces, which Numba could not compile in
15 minutes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.compile.numba import codegen

RNG = np.random.default_rng(7)


def objective(theta, target):
    return np.sum(np.log1p(np.exp(theta - target))) + 0.05 * np.sum(theta**2)


def newton_step(theta, target):
    g = gt.grad(objective)(theta, target)
    h = gt.hessian(objective)(theta, target)
    return theta - np.linalg.solve(h, g)


def _members(f, *batches):
    return np.stack([f(*(b[i] for b in batches)) for i in range(len(batches[0]))])


def _program(f, *args):
    """The program `compile` builds for `f` on `args` (recorded on stage Tracers)."""
    cf = gt.compile(f, backend="numpy")
    _, variant = cf._variant_for(args, {})
    return variant.program


def _kernel_values(program) -> int:
    """The most values one native kernel of `program` passes in and out (Numba not needed)."""
    generated = codegen.generate(program)
    return max(len(k.args) + len(k.returns) for k in generated.kernels)


def _concatenated_pieces(program) -> int:
    return max(
        (len(ins.args) for ins in program.instructions if ins.prim.name == "concatenate"),
        default=0,
    )


def test_a_batched_newton_step_is_one_program_whatever_the_batch_size():
    sizes = {}
    for batch in (3, 60):
        thetas = RNG.normal(size=(batch, 4))
        targets = RNG.normal(size=(batch, 4))
        program = _program(gt.vmap(newton_step), thetas, targets)
        names = [ins.prim.name for ins in program.instructions]
        assert names.count("lu_factors") == 1 and names.count("lu_solve") == 1, names
        assert _concatenated_pieces(program) <= 2
        assert _kernel_values(program) <= 16
        sizes[batch] = len(program.instructions)
        np.testing.assert_allclose(
            gt.compile(gt.vmap(newton_step), backend="numpy")(thetas, targets),
            _members(newton_step, thetas, targets),
            rtol=1e-12,
            atol=1e-12,
        )
    assert sizes[3] == sizes[60], sizes


def test_the_documented_batched_newton_iteration_converges_on_the_numpy_backend():
    thetas = np.zeros((500, 4))
    targets = np.random.default_rng(1).normal(size=(500, 4))
    step = gt.compile(gt.vmap(newton_step), backend="numpy")
    for _ in range(8):
        thetas = step(thetas, targets)
    assert np.max(np.abs(gt.vmap(gt.grad(objective))(thetas, targets))) < 1e-8
    program = step._variant_for((thetas, targets), {})[1].program
    assert len(program.instructions) < 100 and _kernel_values(program) <= 16


def _spd_batch(batch, member_stack, n):
    m = RNG.normal(size=(batch, *member_stack, n, n))
    return m @ np.swapaxes(m, -1, -2) + n * np.eye(n)


# which arguments carry the batch: the matrix, the right-hand side, or both; members that are
# single matrices or stacks; right-hand sides that are vectors or matrices
CASES = [
    (0, 0, (), None),
    (0, None, (), None),
    (None, 0, (), None),
    (0, 0, (), 2),
    (None, 0, (), 3),
    (0, None, (), 2),
    (0, 0, (2,), 2),
    (0, None, (3,), 1),
]


@pytest.mark.parametrize("a_axis, b_axis, stack, columns", CASES)
def test_vmap_of_solve_matches_the_members_and_its_gradients(a_axis, b_axis, stack, columns):
    n, batch = 3, 4
    a = _spd_batch(batch, stack, n)
    b_member = (n,) if columns is None else (n, columns)
    b = RNG.normal(size=(batch, *b_member))
    a_in = a if a_axis == 0 else a[0]
    b_in = b if b_axis == 0 else b[0]
    in_axes = (a_axis, b_axis)

    def member(i):
        return (a[i] if a_axis == 0 else a_in), (b[i] if b_axis == 0 else b_in)

    got = gt.vmap(np.linalg.solve, in_axes=in_axes)(a_in, b_in)
    want = np.stack([np.linalg.solve(*member(i)) for i in range(batch)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    def loss(a, b):
        return np.sum(np.sin(gt.vmap(np.linalg.solve, in_axes=in_axes)(a, b)))

    for argnum in (0, 1):
        assert gt.check_grad(loss, a_in, b_in, argnums=argnum)

    def member_loss(a, b):
        return np.sum(np.sin(np.linalg.solve(a, b)))

    per_member = gt.vmap(gt.grad(member_loss, argnums=(0, 1)), in_axes=in_axes)(a_in, b_in)
    looped = [gt.grad(member_loss, argnums=(0, 1))(*member(i)) for i in range(batch)]
    for k in (0, 1):
        np.testing.assert_allclose(
            per_member[k], np.stack([g[k] for g in looped]), rtol=1e-10, atol=1e-12
        )
    # one factorization and one solve for the whole batch
    names = [ins.prim.name for ins in gt.trace(loss, a_in, b_in).instructions]
    assert names.count("lu_factors") <= 1 and names.count("lu_solve") <= 1, names


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5),
    batch=st.integers(1, 6),
    columns=st.sampled_from([None, 1, 2]),
    dtype=st.sampled_from([np.float64, np.float32]),
)
def test_hypothesis_vmap_of_solve_over_sizes_and_dtypes(n, batch, columns, dtype):
    a = _spd_batch(batch, (), n).astype(dtype)
    b = RNG.normal(size=(batch, n) if columns is None else (batch, n, columns)).astype(dtype)
    got = gt.vmap(np.linalg.solve)(a, b)
    want = np.stack([np.linalg.solve(a[i], b[i]) for i in range(batch)])
    assert got.dtype == want.dtype
    tol = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _cholesky_objective(a, b):
    """A Gaussian's negative log density: Cholesky factor, triangular solve, log-determinant."""
    scipy_linalg = pytest.importorskip("scipy.linalg")
    low = np.linalg.cholesky(a)
    z = scipy_linalg.solve_triangular(low, b, lower=True)
    return 0.5 * np.sum(z**2) + np.sum(np.log(np.diag(low)))


@pytest.mark.parametrize("in_axes", [(0, 0), (0, None), (None, 0)])
def test_vmap_of_gradients_through_cholesky_and_triangular_solves_is_batched(in_axes):
    def batch_of(size):
        a = _spd_batch(size, (), 4)
        b = RNG.normal(size=(size, 4))
        return (a if in_axes[0] == 0 else a[0]), (b if in_axes[1] == 0 else b[0])

    per_member = gt.vmap(gt.grad(_cholesky_objective, argnums=(0, 1)), in_axes=in_axes)
    counts = {}
    for size in (3, 30):
        a, b = batch_of(size)
        got = per_member(a, b)
        for i in range(size):
            member = (a[i] if in_axes[0] == 0 else a), (b[i] if in_axes[1] == 0 else b)
            want = gt.grad(_cholesky_objective, argnums=(0, 1))(*member)
            for k in (0, 1):
                np.testing.assert_allclose(got[k][i], want[k], rtol=1e-10, atol=1e-12)
        names = [ins.prim.name for ins in gt.trace(per_member, a, b).instructions]
        assert names.count("triangular_solve") <= 2 and names.count("cholesky_backward") <= 1
        counts[size] = len(names)
    assert counts[3] == counts[30], counts
    a, b = batch_of(3)
    for argnum in (0, 1):

        def total(a, b):
            return np.sum(gt.vmap(_cholesky_objective, in_axes=in_axes)(a, b))

        assert gt.check_grad(total, a, b, argnums=argnum)
