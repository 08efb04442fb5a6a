"""The NaN-safe product of derivative rules (`nan_safe_multiply`): a zero cotangent or tangent
times an infinite or NaN local derivative contributes zero; its fast paths give the masked
product's numbers exactly, in every mode and backend; overflows in unselected branches."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import compile_backends
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradtape as gt
from gradtape.rules.elementwise import nan_safe_multiply, nan_safe_multiply_p


def masked_product(g, p):
    """The definition: g * p, with 0 where g is 0 and p is not finite."""
    with np.errstate(all="ignore"):
        return np.where((np.asarray(g) == 0) & ~np.isfinite(p), 0.0, np.multiply(g, p))


SPECIAL = st.sampled_from([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan, 1e308, 5e-324])


@settings(max_examples=150, deadline=None)
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4),
    data=st.data(),
)
def test_the_implementation_is_the_masked_product_for_every_shape_and_value(shapes, data):
    g_shape, p_shape = shapes.input_shapes
    g = data.draw(hnp.arrays(np.float64, g_shape, elements=SPECIAL))
    p = data.draw(hnp.arrays(np.float64, p_shape, elements=SPECIAL))
    with np.errstate(all="ignore"):
        got = nan_safe_multiply_p.impl(g, p)
    np.testing.assert_array_equal(got, masked_product(g, p))
    assert np.shape(got) == shapes.result_shape


def test_python_scalars_and_float32():
    values = [0.0, -0.0, 1.5, np.inf, -np.inf, np.nan]
    for g in values:
        for p in values:
            for kind in (float, np.float64):
                with np.errstate(all="ignore"):
                    got = nan_safe_multiply_p.impl(kind(g), kind(p))
                assert type(got) is type(kind(g) * kind(p))
                np.testing.assert_array_equal(got, masked_product(g, p))
    assert nan_safe_multiply_p.impl(0.0, np.inf) == 0.0
    assert np.isnan(nan_safe_multiply_p.impl(np.nan, 2.0))
    with np.errstate(all="ignore"):
        got = nan_safe_multiply_p.impl(np.zeros(3, np.float32), np.array([np.inf, 1.0, np.nan]))
    assert got.tolist() == [0.0, 0.0, 0.0]
    got = nan_safe_multiply_p.impl(np.ones(2, np.float32), np.float32(3.0))
    assert got.dtype == np.float32


G = np.array([0.0, 1.5, 0.0, -2.0, 3.0, np.inf, np.nan, 0.0, -0.0, 2.0])
P = np.array([np.inf, 2.0, 1.0, -0.5, np.nan, 0.0, 1.0, np.nan, -np.inf, np.inf])


@pytest.mark.parametrize("backend", compile_backends())
def test_a_recorded_product_is_masked_on_every_replay(backend):
    """Recorded once on finite inputs (the fast path), replayed where the mask matters."""

    def f(g, p):
        return nan_safe_multiply(g * 1.0, p * 1.0)

    compiled = gt.compile(f, backend=backend)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", gt.NativeFallbackWarning)
        finite = np.where(np.isfinite(P), np.abs(P), 1.0)
        for g, p in ((G + 1.0, finite), (G, P), (G + 1.0, P), (G, P[::-1].copy())):
            g, p = np.asarray(g, float), np.asarray(p, float)
            np.testing.assert_array_equal(compiled(g, p), masked_product(g, p))


def test_the_numpy_backend_writes_the_product_into_its_buffer():
    """No fresh array per call: the product goes into the pooled buffer, the mask in place."""

    def f(g, p):
        return nan_safe_multiply(g * 1.0, p * 1.0) * 2.0

    compiled = gt.compile(f, backend="numpy")
    g, p = np.asarray(G, float), np.asarray(P, float)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(compiled(g, p), masked_product(g, p) * 2.0)
        np.testing.assert_array_equal(compiled(g + 1.0, p), masked_product(g + 1.0, p) * 2.0)
    source = compiled.lowered(g, p).source
    assert "zero_nan_products" in source and "p_nan_safe_multiply" not in source


# the numpy backend's three ways of testing a product for the mask (see numpy_backend.py):
# a product read only by the sum after it is tested at the sum; a product of 0-d float64
# values is a scalar product; a product whose p dies there takes over p's buffer
SUMMED = {
    "full sum": lambda d: np.sum(d),
    "axis sum": lambda d: np.sum(d, axis=-1),
    "sum kept": lambda d: np.sum(d, axis=0, keepdims=True),
}


@settings(max_examples=40, deadline=None)
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
    how=st.sampled_from(sorted(SUMMED)),
    data=st.data(),
)
def test_a_product_tested_at_its_sum_gives_the_masked_numbers(shape, how, data):
    reduce = SUMMED[how]

    def f(g, p):
        return reduce(nan_safe_multiply(g * 1.0, p * 1.0))

    compiled = gt.compile(f, backend="numpy")
    finite = st.floats(-3, 3)
    g0 = data.draw(hnp.arrays(np.float64, shape, elements=finite))
    p0 = data.draw(hnp.arrays(np.float64, shape, elements=finite))
    compiled(g0, p0)
    body = compiled.lowered(g0, p0).source.split("def run")[1].splitlines()
    first = {
        key: next(i for i, line in enumerate(body) if key in line) for key in ("r_add", "isnan")
    }
    assert first["r_add"] < first["isnan"]  # the NaN test looks at the sum, not the product
    for _ in range(3):
        g = data.draw(hnp.arrays(np.float64, shape, elements=SPECIAL))
        p = data.draw(hnp.arrays(np.float64, shape, elements=SPECIAL))
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(compiled(g, p), reduce(masked_product(g, p)))


def test_a_product_tested_at_its_sum_keeps_g_for_the_redo():
    """g dies at the product but is read again when the sum finds a NaN: its buffer must not
    be taken by the sum's output or reused in between."""

    def f(g, p):
        d = nan_safe_multiply(np.exp(g) - 1.0, p * 2.0)  # g's buffer: a temporary
        return np.sum(d, axis=1) + np.sum(g)

    g = np.zeros((3, 3))
    p = np.array([[np.inf, 1.0, 2.0], [1.0, np.nan, 0.5], [3.0, 4.0, 5.0]])
    compiled = gt.compile(f, backend="numpy")
    with np.errstate(all="ignore"):
        for gg, pp in ((g + 1.0, np.ones((3, 3))), (g, p), (g + 0.5, p), (g, p * 0 + 1)):
            expected = np.sum(masked_product(np.exp(gg) - 1.0, pp * 2.0), axis=1) + np.sum(gg)
            np.testing.assert_array_equal(compiled(gg, pp), expected)


@pytest.mark.parametrize("g", [0.0, -0.0, 1.5, np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("p", [0.0, 2.0, np.inf, -np.inf, np.nan])
def test_a_product_of_scalars_is_masked_without_a_buffer(g, p):
    def f(x):
        return nan_safe_multiply(x[0] * 1.0, x[1] * 1.0) + 1.0

    compiled = gt.compile(f, backend="numpy")
    compiled(np.array([1.0, 2.0]))
    x = np.array([g, p])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(compiled(x), masked_product(g, p) + 1.0)
    assert "zero_nan_products" not in compiled.lowered(np.array([1.0, 2.0])).source


def test_a_product_takes_over_ps_buffer_and_still_masks():
    def f(g, p):
        q = p * 3.0  # dies at the product: its buffer becomes the product's
        return nan_safe_multiply(g * 1.0, q) * 2.0 + g

    compiled = gt.compile(f, backend="numpy")
    g, p = np.asarray(G, float), np.asarray(P, float)
    with np.errstate(all="ignore"):
        for gg in (g, g + 1.0, g[::-1].copy()):
            expected = masked_product(gg, p * 3.0) * 2.0 + gg
            np.testing.assert_array_equal(compiled(gg, p), expected)
    body = compiled.lowered(g + 1.0, np.ones_like(p)).source.split("def run")[1].splitlines()
    at = next(i for i, line in enumerate(body) if "zero_nan_products" in line)
    assert "smallest" in body[at]  # the product is tested, in place over q's buffer:
    assert body[at - 1].strip().endswith(", b0, b0)")


@pytest.mark.parametrize(
    "g_shape, p_shape, test",
    [
        ((), (6,), "== 0"),
        ((3, 1), (3, 4), "all"),
        ((6,), (), "isfinite"),
        ((1, 4), (3, 1), "isfinite"),  # the smaller factor
        ((2, 3), (2, 3), "smallest"),  # neither is smaller: the product
    ],
)
def test_a_broadcast_factor_is_tested_instead_of_the_product(g_shape, p_shape, test):
    """A g smaller than the product needs no mask unless it holds a zero; a smaller p none
    unless it is not finite; the numbers are the masked product's either way."""

    def f(g, p):
        return nan_safe_multiply(g * 1.0, p * 1.0) * 2.0

    compiled = gt.compile(f, backend="numpy")
    rng = np.random.default_rng(1)
    compiled(np.ones(g_shape), np.ones(p_shape))
    body = compiled.lowered(np.ones(g_shape), np.ones(p_shape)).source.split("def run")[1]
    (line,) = [line for line in body.splitlines() if "zero_nan_products" in line]
    assert test in line and ("smallest" in line) == (test == "smallest")
    for _ in range(20):
        g = rng.choice(np.array([0.0, -0.0, 1.5, np.nan, np.inf]), g_shape)
        p = rng.choice(np.array([0.0, 2.0, np.inf, -np.inf, np.nan]), p_shape)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(compiled(g, p), masked_product(g, p) * 2.0)


@pytest.mark.parametrize("argnum", [0, 1])
def test_its_derivatives_are_those_of_the_masked_product(argnum):
    """At points where both are finite it is g * p; where the mask holds, no derivative."""
    rng = np.random.default_rng(0)
    g, p = rng.normal(size=4), rng.normal(size=4)
    v = rng.normal(size=4)

    def f(g, p):
        return np.sum(nan_safe_multiply(g, p) ** 2)

    grad = gt.grad(f, argnums=argnum)(g, p)
    expected = 2 * g * p * (p if argnum == 0 else g)
    np.testing.assert_allclose(grad, expected, rtol=1e-13)
    args = [g, p]
    tangents = [np.zeros(4), np.zeros(4)]
    tangents[argnum] = v
    _, jvp = gt.jvp(f, tuple(args), tuple(tangents))
    np.testing.assert_allclose(jvp, grad @ v, rtol=1e-12)
    # second order: the Hessian in g is 2 p^2 on the diagonal
    if argnum == 0:
        np.testing.assert_allclose(
            gt.hessian(lambda g: f(g, p))(g), np.diag(2 * p * p), rtol=1e-12, atol=1e-14
        )


def test_masked_entries_pass_no_derivative_on_to_second_order():
    """p * log(p) masked at p = 0: the Hessian is finite there too (where's derivative, masked
    on the tangent as well)."""

    def f(p):
        return np.sum(np.where(p > 0, p * np.log(p), 0.0))

    p = np.array([0.0, 0.5, 2.0])
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(gt.hessian(f)(p), np.diag([0.0, 2.0, 0.5]))
        compiled = gt.compile(gt.hessian(f), backend="numpy")
        np.testing.assert_allclose(compiled(p), np.diag([0.0, 2.0, 0.5]))
        np.testing.assert_allclose(compiled(p + 1.0), np.diag(1.0 / (p + 1.0)))


OVERFLOWING = {
    "exp": (np.exp, np.exp),
    "expm1": (np.expm1, np.exp),
    "exp2": (np.exp2, lambda x: np.exp2(x) * np.log(2.0)),
    "sinh": (np.sinh, np.cosh),
    "cosh": (np.cosh, np.sinh),
}


@pytest.mark.parametrize("name", sorted(OVERFLOWING))
def test_an_overflow_in_an_unselected_branch_has_zero_derivative(name):
    fn, derivative = OVERFLOWING[name]

    def f(x):
        return np.sum(np.where(x < 700, fn(x), 0.0))

    x = np.array([1100.0, 1.0, -3.0, 2000.0])
    expected = np.where(x < 700, derivative(np.minimum(x, 700)), 0.0)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(gt.grad(f)(x), expected, rtol=1e-14)
        np.testing.assert_allclose(gt.jacfwd(f)(x), expected, rtol=1e-14)
        compiled = gt.compile(gt.grad(f), backend="numpy")
        np.testing.assert_allclose(compiled(x), expected, rtol=1e-14)
        np.testing.assert_allclose(compiled(x[::-1].copy()), expected[::-1], rtol=1e-14)
    # where the overflowing branch is selected, the derivative is the true infinity
    with np.errstate(all="ignore"):
        assert np.isinf(gt.grad(lambda x: np.sum(fn(x)))(np.array([1100.0])))[0]


def test_constant_factors_and_cotangents_record_a_plain_multiply():
    x = np.array([1.0, 4.0])
    tape = str(gt.trace(gt.grad(lambda x: np.sum(np.exp(x))), x))  # cotangent 1: no zero
    assert "nan_safe_multiply" not in tape
    tape = str(gt.trace(gt.grad(lambda x: np.sum(np.exp(x) ** 2)), x))  # traced cotangent
    assert "nan_safe_multiply" in tape


@pytest.mark.native
def test_the_numba_backend_fuses_the_product():
    from gradtape.compile.numba import backend as numba_backend

    if not numba_backend.available():
        pytest.skip("Numba is not installed")
    from gradtape.compile.numba.backend import lowered

    def f(p):
        return np.sum(np.where(p > 0, p * np.log(p), 0.0) * np.exp(p) ** 2)

    p = np.array([0.0, 0.5, 2.0, 0.0])
    compiled = gt.compile(gt.grad(f), backend="numba")
    with warnings.catch_warnings():
        warnings.simplefilter("error", numba_backend.NativeFallbackWarning)
        with np.errstate(all="ignore"):
            for q in (p, p[::-1].copy(), p + 1.0):
                np.testing.assert_allclose(compiled(q), gt.grad(f)(q), rtol=1e-13)
    assert lowered(compiled, p).tier == "native"


@pytest.mark.parametrize("backend", [None, *compile_backends()])
def test_the_setting_off_gives_plain_products_and_a_fresh_build(backend, monkeypatch):
    """GRADTAPE_NAN_SAFE=0: JAX's and autograd's numbers (NaN at the masked branch), eager and
    compiled; compile's memo keeps the two builds apart."""

    def f(p):
        return np.sum(np.where(p > 0, p * np.log(p), 0.0))

    def transform():
        return gt.grad(f) if backend is None else gt.compile(gt.grad(f), backend=backend)

    p = np.array([0.0, 0.5, 2.0])
    expected = np.array([0.0, np.log(0.5) + 1.0, np.log(2.0) + 1.0])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", gt.NativeFallbackWarning)
        np.testing.assert_allclose(transform()(p), expected, rtol=1e-14)
        monkeypatch.setenv("GRADTAPE_NAN_SAFE", "0")
        plain = transform()(p)
        assert np.isnan(plain[0]) and np.allclose(plain[1:], expected[1:], rtol=1e-14)
        monkeypatch.setenv("GRADTAPE_NAN_SAFE", "on")
        np.testing.assert_allclose(transform()(p), expected, rtol=1e-14)


def test_the_setting_is_read_as_the_others(monkeypatch):
    from gradtape import config

    for text, on in (("0", False), ("off", False), (" No ", False), ("1", True), ("", True)):
        monkeypatch.setenv("GRADTAPE_NAN_SAFE", text)
        assert config.nan_safe() is on
    monkeypatch.delenv("GRADTAPE_NAN_SAFE")
    assert config.nan_safe() is True
    assert "GRADTAPE_NAN_SAFE" in config.SETTINGS and "GRADTAPE_NAN_SAFE" in config.BUILD_SETTINGS
