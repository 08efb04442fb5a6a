"""A new input length that records the same program reuses its Program and lowered code.

Every check here counts (programs built, plans made, kernels generated) or compares numbers
with eager evaluation; none times anything.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.compile import dispatch, lengths, numpy_backend

RNG = np.random.default_rng(7)


def normal_logpdf(x):
    return np.sum(-0.5 * ((x - 0.3) / 1.7) ** 2 - np.log(1.7) - 0.9189385332046727)


def _assert_matches_eager(cf, f, x):
    value, grad = cf(x)
    want_value, want_grad = gt.value_and_grad(f)(x)
    np.testing.assert_allclose(value, want_value, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-13, atol=1e-14)
    assert np.shape(grad) == np.shape(want_grad)


@pytest.fixture
def counted(monkeypatch):
    """Counts of Programs simplified and numpy plans made while the test runs."""
    counts = {"programs": 0, "plans": 0}
    build, plan = dispatch.build_program, numpy_backend._plan

    def counting_build(*args, **kwargs):
        counts["programs"] += 1
        return build(*args, **kwargs)

    def counting_plan(*args, **kwargs):
        counts["plans"] += 1
        return plan(*args, **kwargs)

    monkeypatch.setattr(dispatch, "build_program", counting_build)
    monkeypatch.setattr(numpy_backend, "_plan", counting_plan)
    return counts


# --- the signature change -----------------------------------------------------------------
F64 = np.dtype(np.float64)


@pytest.mark.parametrize(
    "a, b, change",
    [
        ((((10,), F64),), (((11,), F64),), (10, 11)),
        ((((10, 3), F64),), (((12, 3), F64),), (10, 12)),
        ((((10,), F64), ((10,), F64)), (((12,), F64), ((12,), F64)), (10, 12)),
        ((((10, 3), F64),), (((10, 4), F64),), (3, 4)),
        ((((1,), F64),), (((2,), F64),), None),  # 1 broadcasts: never replaced
        ((((2,), F64),), (((0,), F64),), None),
        ((((5, 5), F64),), (((6, 5), F64),), None),  # 5 also stays: ambiguous
        ((((5, 6), F64),), (((6, 6), F64),), None),  # the new length is already there
        ((((5, 3), F64),), (((6, 4), F64),), None),  # two lengths changed
        ((((5,), F64),), (((6,), np.dtype(np.float32)),), None),
        ((((5,), F64),), (((5, 1), F64),), None),
    ],
)
def test_length_change(a, b, change):
    assert lengths.length_change(a, b) == change


def test_replaced_reaches_nested_parameters():
    params = {"shape": (10, 3), "index": (slice(0, 10, None), 3), "axes": [10], "flag": True}
    assert lengths.replaced(params, 10, 12) == {
        "shape": (12, 3),
        "index": (slice(0, 12, None), 3),
        "axes": [12],
        "flag": True,
    }
    assert lengths.replaced(np.int64(10), 10, 12) == 12
    assert lengths.replaced(10.0, 10, 12) == 10.0  # floats are values, not lengths


# --- the numpy backend: rebound, and right -----------------------------------------------------
def test_a_new_length_of_the_same_program_is_rebound(counted):
    cf = gt.compile(gt.value_and_grad(normal_logpdf), backend="numpy")
    _assert_matches_eager(cf, normal_logpdf, RNG.random(10))  # the template
    _assert_matches_eager(cf, normal_logpdf, RNG.random(11))  # checked in full once
    assert counted == {"programs": 2, "plans": 2}
    for n in range(12, 40):
        _assert_matches_eager(cf, normal_logpdf, RNG.random(n))
    assert counted == {"programs": 2, "plans": 2}  # recorded, but neither simplified nor planned
    assert cf.stats["recordings"] == 30
    # the rebound variant is that length's: its tape, its result shapes, its out= check
    x = RNG.random(25)
    assert cf.tape(x).inputs[0].shape == (25,)
    value, grad = np.empty(()), np.empty(25)
    cf(x, out=(value, grad))
    np.testing.assert_allclose(grad, gt.grad(normal_logpdf)(x), rtol=1e-13)
    with pytest.raises(gt.GradtapeError, match="shape"):
        cf(x, out=(value, np.empty(24)))


W = RNG.standard_normal(3)


def rows_model(x):
    rows = np.tanh(x) @ W
    return np.sum(rows.reshape(-1, 1) * rows[:, None] + np.exp(-x[:, 0:1]))


def test_two_dimensional_inputs_and_reshapes(counted):
    """Reshapes to the length, and zero gradients shaped like the input (constants of one
    repeated value, resized)."""
    cf = gt.compile(gt.value_and_grad(rows_model), backend="numpy")
    for n in (4, 5, 6, 9, 17):
        _assert_matches_eager(cf, rows_model, RNG.standard_normal((n, 3)))
    assert counted == {"programs": 2, "plans": 2}


def test_a_different_program_at_a_new_length_is_recorded_as_itself(counted):
    """Python that branches on the length records another program: never the template's."""

    def f(x):
        if x.shape[0] > 15:
            return np.sum(np.sin(x))
        return np.sum(np.cos(x) * x.shape[0])

    cf = gt.compile(gt.value_and_grad(f), backend="numpy")
    for n in (10, 11, 12, 13, 16, 17, 18, 14):
        _assert_matches_eager(cf, f, RNG.random(n))
    # 10 and 11 differ (the constant is the length), so each length is built in full;
    # above 15 the sine program is its own family's template, then rebound
    assert counted["programs"] >= 6


def test_constants_that_depend_on_the_length_are_never_rebound():
    def f(x):
        return np.sum(x * np.arange(x.shape[0]) + np.ones(x.shape[0]) * x)

    cf = gt.compile(gt.value_and_grad(f), backend="numpy")
    for n in (5, 6, 7, 8, 30):
        _assert_matches_eager(cf, f, RNG.random(n))


def test_a_fixed_size_equal_to_the_new_length_is_not_taken_for_the_length():
    c = np.linspace(0.5, 1.5, 7)

    def f(x):
        return np.sum(np.outer(np.sin(x), c) ** 2) + np.sum(c * np.sum(x))

    cf = gt.compile(gt.value_and_grad(f), backend="numpy")
    for n in (4, 5, 6, 7, 8, 9, 3):
        _assert_matches_eager(cf, f, RNG.random(n))


def test_guards_of_a_rebound_variant_still_select_the_path():
    def f(x):
        if np.sum(x) > 0:
            return np.sum(np.exp(x))
        return np.sum(x**3)

    cf = gt.compile(gt.value_and_grad(f), backend="numpy")
    for n in (6, 7, 8, 9):
        _assert_matches_eager(cf, f, RNG.random(n))
        _assert_matches_eager(cf, f, -RNG.random(n))  # the other branch: another variant
    stats = cf.stats["per_signature"]
    assert all(s["variants"] == 2 for s in stats.values())


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setenv("GRADTAPE_MAX_SIGNATURES", "16")
    cf = gt.compile(gt.value_and_grad(normal_logpdf), backend="numpy")
    for n in range(10, 210):
        cf(RNG.random(n))
    assert len(cf._signatures) == 16
    assert len(cf._lengths) == 1  # one family: one template
    for ndim in range(1, 12):  # a family per number of dimensions
        cf(RNG.random((2,) * ndim))
    assert len(cf._lengths) == dispatch._MAX_LENGTH_TEMPLATES
    assert len(cf._signatures) == 16


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=12))
def test_any_sequence_of_lengths_gives_eager_numbers(ns):
    def f(x):
        y = np.tanh(x) * 0.5 + x
        return np.sum(y * y) + np.mean(np.exp(-x)) if x.shape[0] else np.sum(y)

    cf = gt.compile(gt.value_and_grad(f), backend="numpy")
    for n in ns:
        x = np.linspace(-1.0, 1.0, n) + 0.1 * n
        value, grad = cf(x)
        want_value, want_grad = gt.value_and_grad(f)(x)
        np.testing.assert_allclose(value, want_value, rtol=1e-12)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-12)


# --- the numba backend: the kernel, module and wrapper text reused ------------------------------
@pytest.mark.native
@pytest.mark.parametrize(
    "backend, f, shape",
    [
        ("numba", normal_logpdf, ()),
        ("numba-tiered", normal_logpdf, ()),
        ("numba", rows_model, (3,)),
    ],
)
def test_a_new_length_is_rebound_on_the_numba_backend(monkeypatch, backend, f, shape):
    from gradtape.compile.numba import backend as numba_backend
    from gradtape.compile.numba import codegen

    if not numba_backend.available():
        pytest.skip("Numba is not installed")
    generated = []
    full = codegen._generate

    def counting(program, *options):
        generated.append(program)
        return full(program, *options)

    monkeypatch.setattr(codegen, "_generate", counting)
    cf = gt.compile(gt.value_and_grad(f), backend=backend)
    for n in (10, 11):
        _assert_matches_eager(cf, f, RNG.random((n, *shape)))
        cf.lowered(RNG.random((n, *shape))).wait(60.0)
    assert len(generated) == 2
    for n in range(12, 30):
        x = RNG.random((n, *shape))
        _assert_matches_eager(cf, f, x)
        lowered = cf.lowered(x)
        assert lowered.wait(60.0)
        _assert_matches_eager(cf, f, x)  # (native now)
        assert lowered.tier == "native"
    assert len(generated) == 2  # every later length: the same kernels, module and wrapper
