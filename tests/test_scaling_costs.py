"""Costs that grow with the work: eager memory, the transform call layer, compile's memo.

Every check here counts (bytes, objects, builds); none times anything.
"""

from __future__ import annotations

import functools
import pickle
import tracemalloc

import numpy as np
import pytest

import gradtape as gt
from gradtape import config
from gradtape.compile import memo
from gradtape.core import tracing
from gradtape.core.ir import Released
from gradtape.core.primitive import REGISTRY, Primitive


def _chain(x):
    """The benchmark's chain: 30 elementwise operations and a sum."""
    y = x
    for _ in range(5):
        y = np.sin(y) * 0.5 + np.exp(-y * y)
    return np.sum(y)


def _peak_bytes(fn, *args) -> int:
    tracemalloc.start()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- eager memory: what no derivative rule reads is released ---------------------------------
def test_eager_grad_keeps_only_what_the_backward_pass_reads():
    """30 intermediates of N; the backward pass reads 2 per step (sin's input, exp's result):
    the peak is a small multiple of N, not one array per operation (it was 55 arrays)."""
    x = np.linspace(0.0, 1.0, 200_000)
    g = gt.grad(_chain)
    g(x[:16])  # imports and first-call state
    peak = _peak_bytes(g, x)
    assert peak < 18 * x.nbytes, f"peak {peak / x.nbytes:.1f} arrays of N"


def test_eager_grad_peak_is_at_most_autograds():
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")

    def chain(m, x):
        y = x
        for _ in range(5):
            y = m.sin(y) * 0.5 + m.exp(-y * y)
        return m.sum(y)

    x = np.linspace(0.0, 1.0, 200_000)
    ours = gt.grad(lambda x: chain(np, x))
    theirs = autograd.grad(lambda x: chain(anp, x))
    ours(x[:16])
    theirs(x[:16])
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-12)
    assert _peak_bytes(ours, x) <= _peak_bytes(theirs, x)


def _kept_everything(monkeypatch):
    monkeypatch.setattr(tracing, "_RELEASE_SIZE", 1 << 62)


def _many_operations(x, y):
    a = np.sin(x) * np.cos(y) + np.tanh(x * y) - np.log1p(x * x)
    b = np.sqrt(np.abs(a) + 1.0) / (1.0 + np.exp(-y)) + np.arctan2(x, y + 2.0)
    c = np.maximum(a, b) * np.minimum(x, y) + np.hypot(a, b) + np.logaddexp(a, y)
    d = np.power(np.abs(c) + 1.0, 1.5) + np.expm1(-np.abs(b)) + np.square(c) / (2.0 + x)
    e = d.reshape(-1, 10).T @ np.linspace(0.0, 1.0, d.size // 10) + np.cumsum(d)[:10]
    f = np.sum(np.sort(d)[::-1][:50] * np.arange(50)) + np.prod(1.0 + 0.001 * d[:20])
    return np.sum(e * e) + f + np.max(c) + np.mean(d**3) + np.std(a)


def test_released_values_give_the_same_gradient_as_keeping_everything(monkeypatch):
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0.1, 1.0, 500), rng.uniform(0.1, 1.0, 500)
    released = gt.grad(_many_operations, argnums=(0, 1))(x, y)
    _kept_everything(monkeypatch)
    kept = gt.grad(_many_operations, argnums=(0, 1))(x, y)
    for r, k in zip(released, kept):
        np.testing.assert_array_equal(r, k)


_UNARY = [
    np.sin, np.cos, np.tan, np.arcsin, np.arccos, np.arctan, np.sinh, np.cosh, np.tanh,
    np.arcsinh, np.arctanh, np.exp, np.exp2, np.expm1, np.log, np.log2, np.log10, np.log1p,
    np.sqrt, np.cbrt, np.square, np.reciprocal, np.negative, np.absolute, np.deg2rad,
]  # fmt: skip
_BINARY = [
    np.add, np.subtract, np.multiply, np.divide, np.power, np.arctan2, np.hypot, np.maximum,
    np.minimum, np.logaddexp, np.logaddexp2, np.fmax, np.fmin,
]  # fmt: skip


@pytest.mark.parametrize("ufunc", _UNARY + _BINARY, ids=lambda u: u.__name__)
def test_each_ufunc_gives_the_same_gradient_released_or_kept(ufunc, monkeypatch):
    rng = np.random.default_rng(2)
    x, y = rng.uniform(0.1, 0.9, 400), rng.uniform(0.1, 0.9, 400)

    def f(x, y):
        z = np.sin(x) + 0.5 * y  # an intermediate the ufunc reads
        out = ufunc(z) if ufunc.nin == 1 else ufunc(z, np.cos(y))
        return np.sum(out * out)

    released = gt.grad(f, argnums=(0, 1))(x, y)
    _kept_everything(monkeypatch)
    kept = gt.grad(f, argnums=(0, 1))(x, y)
    for r, k in zip(released, kept):
        np.testing.assert_array_equal(r, k)


def test_released_values_agree_with_finite_differences():
    rng = np.random.default_rng(1)
    x, y = rng.uniform(0.1, 1.0, 300), rng.uniform(0.1, 1.0, 300)
    direction = rng.normal(size=300)
    gx, _ = gt.grad(_many_operations, argnums=(0, 1))(x, y)
    h = 1e-6
    fd = (_many_operations(x + h * direction, y) - _many_operations(x - h * direction, y)) / (2 * h)
    assert gx @ direction == pytest.approx(fd, rel=1e-6)


def test_vjp_reads_follow_the_rules_code():
    assert REGISTRY["sin"].vjp_reads(1) == ((False, True),)  # cos(x): x, not sin(x)
    assert REGISTRY["exp"].vjp_reads(1) == ((True, False),)  # exp(x) itself
    assert REGISTRY["add"].vjp_reads(2) == ((False, False, False),) * 2  # shapes only
    # multiply: the rule of each argument reads the other one
    assert REGISTRY["multiply"].vjp_reads(2) == ((False, False, True), (False, True, False))
    shape_only = Primitive("test_shape_only", np.sin, vjps=(lambda g, ans, x: g * x.shape[0],))
    assert shape_only.vjp_reads(1) == ((False, False),)
    nested = Primitive(
        "test_reads_in_a_closure", np.sin, vjps=(lambda g, ans, x: (lambda: g * np.cos(x))(),)
    )
    assert nested.vjp_reads(1) == ((False, True),)
    passes_on = Primitive("test_passes_args_on", np.sin, vjps=(lambda g, *rest: g * rest[1],))
    assert passes_on.vjp_reads(1) == ((True, True),)


def test_a_rule_reading_a_released_value_fails_loudly():
    stand_in = Released((300,), np.dtype(float))
    assert stand_in.shape == (300,) and stand_in.ndim == 1 and stand_in.size == 300
    with pytest.raises(TypeError):
        stand_in * 2.0
    with pytest.raises(TypeError):
        np.cos(stand_in)
    with pytest.raises(RuntimeError, match="released"):
        np.asarray(stand_in)


def test_forward_mode_and_vjp_keep_what_they_read():
    x = np.linspace(0.1, 1.0, 400)
    _, vjp_fn = gt.vjp(lambda x: np.sin(x) * np.exp(x), x)
    first = vjp_fn(np.ones(400))[0]
    np.testing.assert_array_equal(vjp_fn(np.ones(400))[0], first)  # the tape is read twice
    np.testing.assert_allclose(first, np.cos(x) * np.exp(x) + np.sin(x) * np.exp(x))
    hvp = gt.hvp(_chain, x, np.ones(400))
    g = gt.grad(_chain)
    h = 1e-6
    np.testing.assert_allclose(hvp, (g(x + h) - g(x - h)) / (2 * h), rtol=1e-5, atol=1e-8)


# --- the transform's call layer --------------------------------------------------------------
def _square_sum(x):
    """Sum of squares."""
    return np.sum(x * x)


def test_a_transformed_function_calls_its_closure_with_no_python_layer():
    vg = gt.value_and_grad(_square_sum)
    assert isinstance(vg, functools.partial) and not vg.args and not vg.keywords
    assert vg.func.__code__.co_name == "value_and_grad_f"  # called from C: no wrapper frame
    assert (vg.__name__, vg.__doc__, vg.__wrapped__) == (
        "_square_sum",
        "Sum of squares.",
        _square_sum,
    )
    value, grad = vg(np.array([1.0, 2.0]))
    assert value == 5.0 and list(grad) == [2.0, 4.0]
    again = pickle.loads(pickle.dumps(vg))
    assert again.transformed == vg.transformed
    assert list(again(np.array([3.0]))[1]) == [6.0]


# --- compile's memo: settings read while building are part of the key ------------------------
def test_flipping_a_build_setting_builds_afresh(monkeypatch):
    def f(x):
        total = x[0] * 0.0
        for i in range(3):
            total = total + np.sin(x[i])
        return total

    monkeypatch.setenv(config.ROLL, "1")
    rolled = gt.compile(gt.grad(f), backend="numpy")
    assert gt.compile(gt.grad(f), backend="numpy") is rolled
    monkeypatch.setenv(config.ROLL, "0")
    unrolled = gt.compile(gt.grad(f), backend="numpy")
    assert unrolled is not rolled and unrolled._roll is False and rolled._roll is True
    monkeypatch.setenv(config.BUFFER_SETS, "2")
    assert gt.compile(gt.grad(f), backend="numpy") is not unrolled
    monkeypatch.delenv(config.BUFFER_SETS)
    assert gt.compile(gt.grad(f), backend="numpy") is unrolled
    monkeypatch.setenv(config.ROLL, "1")
    assert gt.compile(gt.grad(f), backend="numpy") is rolled
    x = np.array([0.1, 0.2, 0.3])
    np.testing.assert_allclose(rolled(x), unrolled(x))


def test_the_setting_is_read_when_built_not_when_first_called(monkeypatch):
    monkeypatch.setenv(config.ROLL, "0")
    cf = gt.compile(lambda x: np.sum(x * 3.0), backend="numpy")
    monkeypatch.setenv(config.ROLL, "1")
    cf(np.ones(3))
    assert cf._roll is False


def test_build_settings_reads_the_environment(monkeypatch):
    monkeypatch.setenv(config.ROLL, "0")
    monkeypatch.delenv(config.NUMBA, raising=False)
    settings = dict(zip(config.BUILD_SETTINGS, config.build_settings()))
    assert settings[config.ROLL] in ("0", b"0") and settings[config.NUMBA] is None


def test_memo_forgets_least_recently_used_first(monkeypatch):
    monkeypatch.setenv("GRADTAPE_MAX_COMPILED", "2")
    memo.forget_all()

    def make(c):
        return lambda x: x * c

    first = gt.compile(make(1.0), backend="numpy")
    gt.compile(make(2.0), backend="numpy")
    assert gt.compile(make(1.0), backend="numpy") is first  # used again: now the most recent
    gt.compile(make(3.0), backend="numpy")  # drops make(2.0)
    assert gt.compile(make(1.0), backend="numpy") is first
    assert len(memo._memo) == 2


# --- the user's line of each recorded operation: found when a message needs it ---------------
def test_the_recorded_offset_gives_the_line_the_frame_was_at():
    import sys

    from gradtape.core.ir import source_line_number

    def where():
        frame = sys._getframe(1)
        return frame.f_code, frame.f_lasti, frame.f_lineno

    found = [
        where(),
        (
            1,
            where(),  # a call on a continuation line of a statement
        )[1],
    ]
    for code, offset, lineno in found:
        assert source_line_number(code, offset) == lineno


def _refused_on_a_continuation_line(v, x):
    import scipy.special as sp

    y = np.sin(x)
    return np.sum(
        y * 2.0 + sp.jv(v, y)  # the line the refusal names
    )


def test_a_refusal_in_the_backward_pass_names_the_continuation_line():
    pytest.importorskip("scipy")
    with pytest.raises(gt.GradtapeError) as info:
        gt.grad(_refused_on_a_continuation_line, argnums=(0, 1))(np.ones(3), np.ones(3))
    message = str(info.value)
    assert "test_scaling_costs.py:" in message
    assert "+ sp.jv(v, y)  # the line the refusal names" in message
