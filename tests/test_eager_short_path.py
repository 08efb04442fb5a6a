"""Eager grad's short path per operation: `bind` records a one-result differentiable primitive
on an open DIFFERENTIATE level in one frame, the reverse pass runs the elementwise VJP rules
inline, and release_unread follows a plan cached per primitive. Each check compares what the
short path records and computes with the general path's, or counts calls; none times anything.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradtape as gt
from gradtape.core import tracing
from gradtape.core.ir import Released, source_text
from gradtape.core.tracing import LevelKind, new_level
from gradtape.rules import elementwise


def _mixed(x):
    c = np.linspace(0.5, 1.5, x.shape[-1] if x.ndim else 1).astype(x.dtype)
    y = np.sin(x) * 0.5 + np.exp(-x * x) - c * x
    y = y / (1.0 + x * x) - np.sqrt(np.abs(x) + 1.0)
    y = np.where(x > 0, y, 2.0 * y)  # a comparison (no derivative) and a select
    return np.sum(y**2) + np.sum(np.tanh(y) * c)


def _record(f, x, short: bool):
    """f recorded on a DIFFERENTIATE level, by bind's short path or (short=False) its
    general path (`_record`), as grad records it."""
    with new_level(LevelKind.DIFFERENTIATE) as level:
        level.releases = True
        level.differentiates = short
        out = f(level.new_input(x))
    return level.tape, out


def _same_value(a, b) -> bool:
    if type(a) is Released or type(b) is Released:
        return type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype
    if type(a) is tracing.Tracer or type(b) is tracing.Tracer:
        return a is b
    return np.shape(a) == np.shape(b) and np.array_equal(a, b, equal_nan=True)


@settings(max_examples=30, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.float64, np.float32]),
        shape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=40),
        elements=st.floats(-3, 3, width=32),
    )
)
def test_the_short_path_records_what_the_general_path_records(x):
    short, out_short = _record(_mixed, x, True)
    general, out_general = _record(_mixed, x, False)
    assert len(short.instructions) == len(general.instructions) > 10
    for a, b in zip(short.instructions, general.instructions):
        assert a.prim is b.prim and a.params == b.params
        assert [v and (v.id, v.shape, v.dtype) for v in a.invars] == [
            v and (v.id, v.shape, v.dtype) for v in b.invars
        ]
        assert [(v.id, v.shape, v.dtype) for v in a.outvars] == [
            (v.id, v.shape, v.dtype) for v in b.outvars
        ]
        assert _same_value(a.out, b.out)
        assert all(_same_value(p, q) for p, q in zip(a.args, b.args))
        assert source_text(a.source) == source_text(b.source) is not None
    np.testing.assert_array_equal(out_short._value, out_general._value)


def test_the_short_path_takes_every_plain_operation_of_grad(monkeypatch):
    general = []
    original = tracing._record
    monkeypatch.setattr(
        tracing,
        "_record",
        lambda top, prim, *a: general.append(prim.name) or original(top, prim, *a),
    )
    x = np.linspace(-1.0, 1.0, 6)  # (not 0, where |x| has its kink)
    g = gt.grad(_mixed)(x)
    # only the comparison (no derivative: not plain_differentiable) takes the general path
    assert general == ["greater"]
    general.clear()
    monkeypatch.setattr(tracing, "_record", original)
    np.testing.assert_allclose(g, gt.grad(_mixed)(x), rtol=0, atol=0)
    eps = 1e-6
    fd = [(_mixed(x + eps * e) - _mixed(x - eps * e)) / (2 * eps) for e in np.eye(6)]
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def _sin_chain(x):
    y = x
    for _ in range(100):
        y = np.sin(y) * 0.5
    return np.sum(y)


def _python_calls(fn) -> int:
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_python_calls_per_operation_of_an_eager_gradient():
    """The chain's 200 operations, recorded and differentiated: per operation nine Python calls
    (the override or operator, bind, the Var, Instruction and Tracer; in the reverse pass the
    rule, its partial, the sum back to the argument's shape, and dropping the values)."""
    x = np.linspace(0.0, 1.0, 10)
    g = gt.grad(_sin_chain)
    g(x)
    short = _python_calls(lambda: g(x))
    long = _python_calls(lambda: gt.grad(lambda x: _sin_chain(_sin_chain(x)))(x))
    per_operation = (long - short) / 201
    assert per_operation <= 9.2, per_operation


@pytest.mark.parametrize("route", ["operator", "ufunc", "method"])
def test_a_backward_error_names_the_users_line_on_every_route(route):
    """An error raised by a derivative rule names the line that recorded the operation."""

    def f(x):
        if route == "operator":
            y = x * np.inf  # the line named below
        elif route == "ufunc":
            y = np.multiply(x, np.inf)  # the line named below
        else:
            y = x.__mul__(np.inf)  # the line named below
        return np.sum(y)

    with new_level(LevelKind.DIFFERENTIATE) as level:
        f(level.new_input(np.ones(3)))
    (mul,) = [ins for ins in level.tape.instructions if ins.prim is elementwise.multiply]
    assert "the line named below" in source_text(mul.source)
    assert source_text(mul.source).startswith("test_eager_short_path.py:")


def test_a_writable_constant_array_is_frozen_on_the_short_path():
    c = np.array([1.0, 2.0, 3.0])

    def f(x):
        y = np.sin(x) * c  # recorded with c as it is now
        c[:] = 0.0  # a scratch buffer written after its use
        return np.sum(y)

    g = gt.grad(f)(np.array([0.1, 0.2, 0.3]))
    np.testing.assert_allclose(g, np.cos([0.1, 0.2, 0.3]) * [1.0, 2.0, 3.0], rtol=1e-15)


def test_released_values_follow_the_rules_reads():
    x = np.linspace(0.0, 1.0, 1000)
    with new_level(LevelKind.DIFFERENTIATE) as level:
        level.releases = True
        t = level.new_input(x)
        y = np.sin(t) * 2.0  # sin reads its argument, multiply by a constant reads nothing
        z = np.exp(y) * y  # exp reads its result; a product of two traced values reads both
        np.sum(z)
    sin, scale, exp, product, total = level.tape.instructions
    assert type(sin.out) is Released and type(sin.args[0]) is np.ndarray
    assert type(scale.out) is Released and type(scale.args[0]) is Released
    assert scale.args[1] == 2.0
    assert type(exp.out) is np.ndarray and type(exp.args[0]) is Released
    assert all(type(a) is np.ndarray for a in product.args) and type(product.out) is Released
    assert total.prim.name == "reduce_sum"
    # and the gradient through them
    g = gt.grad(lambda x: np.sum(np.exp(np.sin(x) * 2.0) * np.sin(x) * 2.0))(x)
    s = np.sin(x) * 2.0
    np.testing.assert_allclose(g, (np.exp(s) * s + np.exp(s)) * 2.0 * np.cos(x), rtol=1e-13)


def test_derived_rules_declare_what_they_read():
    assert elementwise.sin.vjp_reads(1) == ((False, True),)
    assert elementwise.exp.vjp_reads(1) == ((True, False),)
    assert elementwise.add.vjp_reads(2) == ((False, False, False), (False, False, False))
    assert elementwise.multiply.vjp_reads(2) == ((False, False, True), (False, True, False))
    assert elementwise.sin.vjps[0].elementwise_partial is elementwise.sin.partials[0]


def test_a_closed_level_still_refuses_its_tracers():
    leaked = []
    gt.grad(lambda x: leaked.append(x) or np.sum(x))(np.ones(2))
    with pytest.raises(gt.GradtapeError, match="finished transformation"):
        gt.grad(lambda y: np.sum(np.sin(leaked[0]) * y))(np.ones(2))
