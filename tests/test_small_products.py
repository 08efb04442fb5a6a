"""Small products, reshapes and trailing reductions inside the numba backend's loops.

A product of a constant matrix of at most `matmul.SMALL_PRODUCT_COLUMNS` columns is a plain
member of its loop (the matrix passed as contiguous columns), a reshape of a loop's value
stays in that loop, and a sum over the trailing axes of a value of a nested loop is
accumulated in it (fusion.py). The plans are checked without Numba (fast tier); the compiled
kernels (native tier) against a hand-written NumPy gradient of the hierarchical Poisson
regression (the sampling benchmark's M3) over generated sizes, the numpy backend, and
central differences.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.compile import BACKENDS, register_backend
from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba import codegen, fusion, lowering, matmul, scalar

RNG = np.random.default_rng(20261125)
native = pytest.mark.native
needs_numba = pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed")


# --- the hierarchical Poisson regression, and its gradient by hand ----------------------------
def poisson_data(groups: int, rows: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 0.4, size=(groups * rows, k))
    eta = (x @ rng.normal(0.0, 0.3, k)).reshape(groups, rows) + rng.normal(1.0, 0.5, (groups, 1))
    y = rng.poisson(np.exp(eta)).astype(np.float64)
    return x, y


def poisson_logp(x, y):
    """The log-density of u = [mu, log sigma, z (groups), beta (k)] (as the benchmark's M3,
    sigma through exp with its log-Jacobian)."""
    groups, rows = y.shape
    k = x.shape[1]

    def logp(u):
        mu, log_sigma, z, beta = u[0], u[1], u[2 : 2 + groups], u[2 + groups : 2 + groups + k]
        sigma = np.exp(log_sigma)
        intercept = mu + sigma * z
        eta = (x @ beta).reshape(groups, rows) + intercept[:, None]
        return (
            np.sum(y * eta - np.exp(eta))
            - 0.5 * mu**2
            - 0.5 * sigma**2
            - 0.5 * np.sum(z**2)
            - 2.0 * np.sum(beta**2)
            + log_sigma
        )

    return logp


def poisson_value_and_grad(x, y, u):
    """The value and gradient of poisson_logp, derived by hand."""
    groups, rows = y.shape
    k = x.shape[1]
    mu, log_sigma, z, beta = u[0], u[1], u[2 : 2 + groups], u[2 + groups :]
    sigma = np.exp(log_sigma)
    eta = (x @ beta).reshape(groups, rows) + (mu + sigma * z)[:, None]
    rate = np.exp(eta)
    value = (
        np.sum(y * eta - rate)
        - 0.5 * mu**2
        - 0.5 * sigma**2
        - 0.5 * np.sum(z**2)
        - 2.0 * np.sum(beta**2)
        + log_sigma
    )
    residual = y - rate
    per_group = residual.sum(axis=1)
    grad = np.empty(2 + groups + k)
    grad[0] = per_group.sum() - mu
    grad[1] = sigma * (per_group @ z) - sigma**2 + 1.0
    grad[2 : 2 + groups] = sigma * per_group - z
    grad[2 + groups :] = residual.reshape(-1) @ x - 4.0 * beta
    return value, grad


# --- plans (no Numba) ---------------------------------------------------------------------------
_PROGRAMS: list = []


def _recording_lower(prog):
    _PROGRAMS.append(prog)
    return BACKENDS["numpy"](prog)


@pytest.fixture(scope="module", autouse=True)
def recording_backend():
    register_backend("record-small", _recording_lower)
    yield
    del BACKENDS["record-small"]


def program_of(f, *args):
    """The Program compile(f) records for these arguments."""
    before = len(_PROGRAMS)
    gt.compile(f, backend="record-small")(*args)
    (prog,) = _PROGRAMS[before:]
    return prog


def loops_of(prog) -> list:
    plan = fusion.plan(prog, scalar.fusable, lowering.lowerable)
    return [s for s in plan.stages if s.kind == fusion.LOOP]


def test_the_hierarchical_model_runs_forward_and_backward_in_one_nested_loop():
    x, y = poisson_data(6, 7, 5)
    u = RNG.normal(size=2 + 6 + 5) * 0.3
    prog = program_of(gt.value_and_grad(poisson_logp(x, y)), u)
    long_loops = [s for s in loops_of(prog) if fusion.size_of(s.shape) == 42]
    assert len(long_loops) == 1
    (loop,) = long_loops
    assert loop.nested and loop.shape == (6, 7)
    names = [ins.prim.name for ins in loop.members]
    # X @ beta, the reshape, exp, the row sums of the intercept's gradient, g @ X
    assert names.count("matmul") == 2
    assert "reshape" in names and "exp" in names and "reduce_sum" in names
    module = codegen.generate(prog).module
    assert "zb" not in module and "gb" not in module  # no blocked products
    assert "i = (i0) * " in module  # the flat index of the nested loop
    # X reaches the kernel once, as 5 contiguous columns
    consts = codegen.generate(prog).consts
    assert sum(c.shape == (5, 42) for c in consts) == 1
    assert not any(c.shape == (42, 5) for c in consts)


@pytest.mark.parametrize(
    "shape, vector_first, kind",
    [
        ((30, 4), False, "row"),
        ((4, 30), True, "row"),
        ((30, 4), True, "column"),
        ((4, 30), False, "column"),
    ],
)
def test_small_products_are_classified_by_their_long_axis(shape, vector_first, kind):
    m = RNG.normal(size=shape)
    length = shape[0] if vector_first else shape[1]
    v = RNG.normal(size=length)

    def f(v):
        return np.sum((v @ m) if vector_first else (m @ v))

    prog = program_of(f, v)
    (ins,) = [i for i in prog.instructions if i.prim.name == "matmul"]
    product = matmul.small_product(ins)
    assert product is not None and product.kind == kind and product.k == 4
    assert product.length == 30
    assert not matmul.matrix_member(ins)


def test_nine_columns_stay_a_blocked_product():
    m = RNG.normal(size=(30, matmul.SMALL_PRODUCT_COLUMNS + 1))
    prog = program_of(lambda v: np.sum(np.exp(m @ v)), RNG.normal(size=m.shape[1]))
    (ins,) = [i for i in prog.instructions if i.prim.name == "matmul"]
    assert matmul.small_product(ins) is None and matmul.matrix_member(ins)


def test_a_matrix_too_large_to_copy_stays_a_blocked_product(monkeypatch):
    m = RNG.normal(size=(30, 4))
    prog = program_of(lambda v: np.sum(np.exp(m @ v)), RNG.normal(size=4))
    (ins,) = [i for i in prog.instructions if i.prim.name == "matmul"]
    assert matmul.small_product(ins) is not None
    monkeypatch.setattr(matmul, "SMALL_PRODUCT_MAX_ELEMENTS", m.size - 1)
    assert matmul.small_product(ins) is None and matmul.matrix_member(ins)


def test_a_reshape_of_a_blocked_loop_does_not_nest_it():
    """A loop with a blocked product iterates flat: a member that needs axes opens its own."""
    m = RNG.normal(size=(12, 10))
    a = RNG.normal(size=(3, 1))

    def f(v):
        return np.sum(np.exp((m @ v).reshape(3, 4) + a))

    prog = program_of(gt.value_and_grad(f), RNG.normal(size=10) * 0.2)
    for loop in loops_of(prog):
        assert not (loop.nested and loop.blocked)


def test_equal_constants_are_one_kernel_argument():
    """The backward pass of y * eta holds y again: one argument, one stream."""
    x, y = poisson_data(4, 5, 3)
    prog = program_of(gt.value_and_grad(poisson_logp(x, y)), np.zeros(2 + 4 + 3))
    consts = codegen.generate(prog).consts
    assert sum(c.shape == y.shape and np.array_equal(c, y) for c in consts) == 1


# --- compiled (Numba) ------------------------------------------------------------------------
@native
@needs_numba
@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    groups=st.integers(2, 9),
    rows=st.integers(2, 12),
    k=st.integers(1, matmul.SMALL_PRODUCT_COLUMNS + 2),
    seed=st.integers(0, 2**16),
)
def test_generated_gradient_of_the_hierarchical_model_matches_the_hand_written(
    groups, rows, k, seed
):
    x, y = poisson_data(groups, rows, k, seed)
    u = np.random.default_rng(seed).normal(0.0, 0.3, 2 + groups + k)
    compiled = gt.compile(gt.value_and_grad(poisson_logp(x, y)), backend="numba")
    value, grad = compiled(u)
    expected_value, expected_grad = poisson_value_and_grad(x, y, u)
    assert numba_backend.lowered(compiled, u).tier == "native"
    np.testing.assert_allclose(value, expected_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-11, atol=1e-11)
    # the native handle computes the same numbers
    handle = gt.compile(gt.value_and_grad(poisson_logp(x, y))).as_native(u)
    value_h, grad_h = handle(u)
    np.testing.assert_allclose(value_h, expected_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad_h, expected_grad, rtol=1e-11, atol=1e-11)


X_TALL = RNG.normal(size=(37, 5))
X_WIDE = RNG.normal(size=(3, 41))
W_TALL = RNG.normal(size=37)
A_GROUPS = RNG.normal(size=(6, 1))
B_3D = RNG.normal(size=(6, 1, 3))
C_3D = RNG.normal(size=(1, 7, 1))


def row_product(v):  # X (N, k) @ v
    return np.sum(np.exp(0.3 * (X_TALL @ v)) * W_TALL)


def row_product_of_columns(v):  # v @ M with M (k, N)
    return np.sum(np.sin(v @ X_WIDE))


def column_accumulation(g):  # g @ X: the vector along the rows is traced
    return np.sum(np.tanh(g) @ X_TALL) ** 2


def column_accumulation_of_columns(g):  # M (k, N) @ g
    return np.sum(np.cos(X_WIDE @ np.exp(0.1 * g)))


def grouped_max_and_prod(v):
    eta = (X_TALL[:36] @ v).reshape(6, 6) + A_GROUPS
    return np.sum(eta.max(axis=1)) + np.sum(np.tanh(eta).prod(axis=1)) - np.sum(eta.min(axis=1))


def three_axes(v):
    """A nested loop over (6, 7, 3): operands broadcast along different axes, a reshape from
    the flat product, a sum over the two trailing axes."""
    flat = np.repeat(np.tile(X_TALL[:, :2], (4, 1))[:126], 1, axis=0) @ v[:2]
    eta = flat.reshape(6, 7, 3) * B_3D + C_3D
    return np.sum(np.sin(eta).sum(axis=(1, 2)) ** 2) + np.sum(eta[:, None, :, :] ** 2)


def float32_product(v):
    return np.sum(np.exp(X_TALL.astype(np.float32) @ v))


CASES = [
    (row_product, (5,)),
    (row_product_of_columns, (3,)),
    (column_accumulation, (37,)),
    (column_accumulation_of_columns, (41,)),
    (grouped_max_and_prod, (5,)),
    (three_axes, (5,)),
]


@native
@needs_numba
@pytest.mark.parametrize("f, shape", CASES, ids=[f.__name__ for f, _ in CASES])
def test_new_lowerings_match_the_numpy_backend_and_differences(f, shape):
    v = RNG.normal(0.0, 0.5, shape)
    native_vg = gt.compile(gt.value_and_grad(f), backend="numba")
    numpy_vg = gt.compile(gt.value_and_grad(f), backend="numpy")
    value, grad = native_vg(v)
    assert numba_backend.lowered(native_vg, v).tier == "native"
    ref_value, ref_grad = numpy_vg(v)
    np.testing.assert_allclose(value, ref_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(grad, central_difference_grad(f, (v,), 0), rtol=1e-6, atol=1e-7)


@native
@needs_numba
def test_float32_small_product_matches_numpy():
    v = RNG.normal(0.0, 0.5, 5).astype(np.float32)
    native_vg = gt.compile(gt.value_and_grad(float32_product), backend="numba")
    value, grad = native_vg(v)
    ref_value, ref_grad = gt.compile(gt.value_and_grad(float32_product), backend="numpy")(v)
    assert grad.dtype == np.float32
    np.testing.assert_allclose(value, ref_value, rtol=2e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=2e-5, atol=1e-5)


@native
@needs_numba
def test_small_products_are_in_the_llvm_generators_subset():
    """The kernels of small products are written in the forms the llvmlite generator
    translates (a module it refuses would go to Numba: seconds instead of a tenth)."""
    from gradtape.compile import llvm

    if not llvm.available():
        pytest.skip("the llvmlite generator is off or unavailable")
    before = len(llvm.refusals)
    for f, shape in CASES[:4]:
        gt.compile(gt.value_and_grad(f), backend="numba")(np.full(shape, 0.1))
    assert llvm.refusals[before:] == []
