"""scipy.signal.convolve and correlate on traced values: SciPy's values, and derivatives in both
operands (N-D, every mode, either operand larger, real and complex) against differences."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import compile_backends

import gradtape as gt

signal = pytest.importorskip("scipy.signal")

SHAPES = [((4,), (2,)), ((3,), (5,)), ((4, 3), (2, 2)), ((2, 2), (4, 3)), ((3, 4, 2), (2, 4, 1))]


def _operands(rng, s1, s2, complex_):
    a, b = rng.normal(size=s1), rng.normal(size=s2)
    if complex_:
        a, b = a + 1j * rng.normal(size=s1), b + 1j * rng.normal(size=s2)
    return a, b


def _central_vjp(loss, args, i, h=1e-6):
    """d loss / d args[i] by central differences, as a JAX-convention cotangent."""
    arr = args[i]
    out = np.zeros(arr.shape, arr.dtype)
    steps = (1.0, 1j) if np.iscomplexobj(arr) else (1.0,)
    for k in np.ndindex(arr.shape):
        for step in steps:
            e = np.zeros(arr.shape, arr.dtype)
            e[k] = h * step
            plus = [x + e if j == i else x for j, x in enumerate(args)]
            minus = [x - e if j == i else x for j, x in enumerate(args)]
            out[k] += np.conj(step) * (loss(*plus) - loss(*minus)) / (2 * h)
    return out


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("name", ["convolve", "correlate"])
def test_values_and_both_modes_of_differentiation(name, shapes, mode, complex_):
    function = getattr(signal, name)
    rng = np.random.default_rng(5)
    a, b = _operands(rng, *shapes, complex_)
    if mode == "valid" and not (
        all(n >= m for n, m in zip(*shapes)) or all(m >= n for n, m in zip(*shapes))
    ):
        pytest.skip("SciPy refuses these shapes in valid mode")
    expected = function(a, b, mode)
    out, vjp_fn = gt.vjp(lambda x, y: function(x, y, mode), a, b)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    u = rng.normal(size=out.shape) + (1j * rng.normal(size=out.shape) if complex_ else 0)
    cts = vjp_fn(u)

    def loss(x, y):
        return np.real(np.sum(u * function(x, y, mode)))

    for i in (0, 1):
        np.testing.assert_allclose(cts[i], _central_vjp(loss, (a, b), i), atol=1e-6)
    ta, tb = _operands(rng, *shapes, complex_)
    _, tangent = gt.jvp(lambda x, y: function(x, y, mode), (a, b), (ta, tb))
    h = 1e-6
    reference = (
        function(a + h * ta, b + h * tb, mode) - function(a - h * ta, b - h * tb, mode)
    ) / (2 * h)
    np.testing.assert_allclose(tangent, reference, atol=1e-6)


@pytest.mark.parametrize("backend", compile_backends())
def test_a_smoothing_loss_compiles_and_has_second_derivatives(backend):
    kernel = np.array([0.25, 0.5, 0.25])

    def loss(x):
        smooth = signal.convolve(x, kernel, mode="same")
        return np.sum((smooth - np.sin(x)) ** 2) + np.sum(signal.correlate(x, x, "full") ** 2)

    x = np.linspace(-1.0, 1.0, 9)
    compiled = gt.compile(gt.grad(loss), backend=backend)
    np.testing.assert_allclose(compiled(x), gt.grad(loss)(x), rtol=1e-12)
    v = np.cos(np.arange(9.0))
    h = 1e-5
    hv = gt.hvp(loss, x, v)
    reference = (gt.grad(loss)(x + h * v) - gt.grad(loss)(x - h * v)) / (2 * h)
    np.testing.assert_allclose(hv, reference, rtol=1e-6, atol=1e-6)


def test_shapes_scipy_refuses_are_refused_the_same_way():
    with pytest.raises(ValueError, match="valid"):
        gt.grad(lambda x: np.sum(signal.convolve(x, np.ones((1, 4)), "valid")))(np.ones((2, 2)))
    with pytest.raises(ValueError, match="dimensionality"):
        gt.grad(lambda x: np.sum(signal.convolve(x, np.ones(2))))(np.ones((2, 2)))
