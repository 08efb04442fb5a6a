"""nutpie's expand function of elementwise constraints (real, positive, interval), written
directly as native code: it gives each constraint's transform, also far out in the tails,
and refuses wrong sizes; a model of such constraints compiles one program only."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba import export

gtn = pytest.importorskip("gradtape.nutpie", exc_type=ImportError)

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed"),
]

DOUBLE_P = ctypes.POINTER(ctypes.c_double)
EXPAND = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, DOUBLE_P, DOUBLE_P, ctypes.c_void_p
)

SHAPES = {
    "a": (),
    "sigma": gtn.positive(),
    "scales": gtn.positive((2, 2)),
    "p": gtn.interval(0.0, 1.0, shape=3),
    "rho": gtn.interval(-2.5, 7.0),
    "beta": (2,),
}


def _expand(layout, u: np.ndarray) -> tuple[int, np.ndarray]:
    segments = [
        (c.elementwise[0], start, c.size, *(c.elementwise[1:] or (0.0, 0.0)))
        for c, start in zip(layout.constraints, layout.starts)
    ]
    function = EXPAND(export.elementwise_expand(layout.size, segments).address)
    out = np.full(layout.size, -7.0)
    u = np.ascontiguousarray(u, np.float64)
    status = function(
        layout.size, layout.size, u.ctypes.data_as(DOUBLE_P), out.ctypes.data_as(DOUBLE_P), None
    )
    return status, out


def _transformed(layout, u: np.ndarray) -> np.ndarray:
    params, _ = layout.split(u)
    return np.concatenate([np.reshape(params[name], -1) for name in layout.names])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.5, 5.0, 40.0, 700.0]))
def test_expand_is_each_constraints_transform(seed, scale):
    layout = gtn._layout(SHAPES)
    u = np.random.default_rng(seed).normal(0.0, scale, size=layout.size)
    status, out = _expand(layout, u)
    assert status == 0
    with np.errstate(over="ignore"):
        expected = _transformed(layout, u)
    np.testing.assert_allclose(out, expected, rtol=4e-16 * 8, atol=0.0)


def test_expand_tails_and_sizes():
    layout = gtn._layout({"p": gtn.interval(-1.0, 3.0, shape=4), "s": gtn.positive(2)})
    u = np.array([-800.0, -40.0, 40.0, 800.0, -800.0, 800.0])
    status, out = _expand(layout, u)
    assert status == 0
    np.testing.assert_array_equal(out[:4], [-1.0, -1.0 + 4.0 / (1.0 + np.exp(40.0)), 3.0, 3.0])
    assert out[4] == 0.0 and out[5] == np.inf  # exp underflows and overflows as NumPy's
    segments = [("exp", 0, 2, 0.0, 0.0)]
    function = EXPAND(export.elementwise_expand(2, segments).address)
    out = np.zeros(2)
    status = function(2, 3, u.ctypes.data_as(DOUBLE_P), out.ctypes.data_as(DOUBLE_P), None)
    assert status == export.STATUS_WRONG_SIZE
    again = export.elementwise_expand(2, segments)  # one function per layout, built once
    assert again.address == export.elementwise_expand(2, list(segments)).address


def test_a_model_of_elementwise_constraints_compiles_one_program():
    y = np.array([0.3, 1.9, 1.1])

    def logp(p):
        return -0.5 * np.sum((y - p["mu"]) ** 2) / p["sigma"] ** 2 - 3.0 * np.log(p["sigma"])

    model = gtn.from_logp(logp, shapes={"mu": gtn.interval(-5.0, 5.0), "sigma": gtn.positive()})
    assert model.expand_func is None  # no second program: the expand function is written
    u = np.array([0.4, -0.2])
    function = EXPAND(model.compiled_expand_func.address)
    out = np.zeros(2)
    pair = model.user_data
    status = function(
        2, 2, u.ctypes.data_as(DOUBLE_P), out.ctypes.data_as(DOUBLE_P), pair.ctypes.data
    )
    assert status == 0
    np.testing.assert_allclose(out, [-5.0 + 10.0 / (1.0 + np.exp(-0.4)), np.exp(-0.2)], rtol=1e-15)
