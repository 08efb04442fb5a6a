"""scipy.signal.convolve, correlate and lfilter on traced values: SciPy's values, and derivatives
operands (N-D, every mode, either operand larger, real and complex) against differences."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad, compile_backends

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


# signal.lfilter: in x, b and a, along any axis; SciPy's values, central differences,
# forward against reverse
_B, _A = np.array([0.5, 0.2, -0.1]), np.array([1.3, -0.4, 0.12])


@pytest.mark.parametrize("shape, axis", [((7,), -1), ((3, 6), 1), ((5, 2), 0), ((2, 4, 3), 1)])
@pytest.mark.parametrize("argnum", [0, 1, 2])
def test_lfilter_in_each_argument(shape, axis, argnum):
    x = np.cos(np.arange(np.prod(shape)) * 0.7).reshape(shape)
    weights = np.sin(np.arange(np.prod(shape)) + 1.0).reshape(shape)
    args = [_B, _A, x]

    def loss(v):
        a = list(args)
        a[argnum] = v
        return np.sum(weights * signal.lfilter(*a, axis=axis) ** 2)

    value, grad = gt.value_and_grad(loss)(args[argnum])
    np.testing.assert_allclose(value, loss(args[argnum]), rtol=1e-13)
    np.testing.assert_allclose(
        grad, central_difference_grad(loss, (args[argnum],), 0), rtol=1e-6, atol=1e-9
    )
    direction = np.cos(np.arange(np.size(args[argnum])) + 0.3).reshape(np.shape(args[argnum]))
    _, tangent = gt.jvp(loss, (args[argnum],), (direction,))
    np.testing.assert_allclose(tangent, np.sum(grad * direction), rtol=1e-9)


def test_lfilter_second_order_and_compiled():
    x = np.linspace(-1.0, 1.0, 6)

    def loss(a1):
        a = np.stack([1.0, a1, 0.1])
        return np.sum(signal.lfilter(_B, a, x) ** 2)

    h = gt.grad(gt.grad(loss))(-0.3)
    step = 1e-4
    fd = (gt.grad(loss)(-0.3 + step) - gt.grad(loss)(-0.3 - step)) / (2 * step)
    np.testing.assert_allclose(h, fd, rtol=1e-6)
    for backend in compile_backends():
        compiled = gt.compile(gt.value_and_grad(loss), backend=backend)
        np.testing.assert_allclose(compiled(-0.3)[1], gt.grad(loss)(-0.3), rtol=1e-12)


def test_lfilter_refusals():
    x = np.ones(4)
    with pytest.raises(gt.GradtapeError, match="zi="):
        gt.grad(lambda x: np.sum(signal.lfilter(_B, _A, x, zi=np.zeros(2))[0]))(x)
    with pytest.raises(gt.GradtapeError, match="complex"):
        gt.grad(lambda x: np.sum(np.abs(signal.lfilter(_B, _A, x + 1j))))(x)
