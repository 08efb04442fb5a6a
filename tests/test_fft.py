"""np.fft and scipy.fft: NumPy's values, derivatives checked against central differences in
the real and imaginary directions and against JAX's transpose rules, in both modes, eager and
compiled."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.fft as sfft
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_complex import RNG, assert_close, check_rule, fd_grad, jnp, random_complex

import gradtape as gt

FEW = settings(max_examples=10, deadline=None)
pytestmark = pytest.mark.filterwarnings("error::numpy.exceptions.ComplexWarning")
NORMS = [None, "backward", "ortho", "forward"]
ONE_AXIS = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
N_AXES = ["fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn"]
REAL_INPUT = {"rfft", "ihfft", "rfft2", "rfftn"}


def _jax_fft(name):
    return None if jnp is None else getattr(jnp.fft, name)


def _primal(f, *args):
    """f's value as recorded (the primal output of jvp)."""
    return gt.jvp(f, args, tuple(np.zeros_like(a) for a in args))[0]


def _input(data, shape, real: bool):
    values = hnp.arrays(np.float64, shape, elements=st.floats(-2.0, 2.0))
    if real:
        return data.draw(values)
    return data.draw(values) + 1j * data.draw(values)


@pytest.mark.parametrize("name", ONE_AXIS)
@FEW
@given(data=st.data())
def test_one_axis_transforms(name, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=5))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = data.draw(st.one_of(st.none(), st.integers(1, 7)))
    if name in ("irfft", "hfft") and n is None and shape[axis] < 2:
        n = 2
    norm = data.draw(st.sampled_from(NORMS))
    real = name in REAL_INPUT or data.draw(st.booleans())
    x = _input(data, shape, real)

    def f(x):
        return getattr(np.fft, name)(x, n=n, axis=axis, norm=norm)

    expected = f(x)
    got = _primal(f, x)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-14)
    check_rule(f, (x,))


@pytest.mark.parametrize("name", N_AXES)
@FEW
@given(data=st.data())
def test_n_axis_transforms(name, data):
    shape = data.draw(hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=4))
    if name.endswith("2"):
        axes = data.draw(st.sampled_from([(-2, -1), (0, 1), (1, 0)]))
    else:
        perm = data.draw(st.permutations(range(len(shape))))
        axes = tuple(perm[: data.draw(st.integers(1, len(shape)))])
    s = data.draw(st.one_of(st.none(), st.tuples(*(st.integers(1, 5) for _ in axes))))
    norm = data.draw(st.sampled_from(NORMS))
    real = name in REAL_INPUT or data.draw(st.booleans())
    x = _input(data, shape, real)

    def f(x):
        return getattr(np.fft, name)(x, s=s, axes=axes, norm=norm)

    expected = f(x)
    got = _primal(f, x)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-14)
    check_rule(f, (x,))


# JAX's transpose rules (jax/_src/lax/fft.py) as the reference, one case per function and norm
JAX_CASES = [
    (name, kw, real)
    for name in ONE_AXIS
    for kw, real in (
        ({"n": None, "axis": -1, "norm": None}, False),
        ({"n": 5, "axis": 0, "norm": "ortho"}, True),
        ({"n": 8, "axis": 1, "norm": "forward"}, False),
    )
] + [
    (name, kw, real)
    for name in N_AXES
    for kw, real in (
        ({"s": None, "axes": (0, 1), "norm": "backward"}, False),
        ({"s": (3, 5), "axes": (1, 0), "norm": "ortho"}, True),
        ({"s": (4, 3), "axes": (-2, -1), "norm": "forward"}, False),
    )
]


@pytest.mark.parametrize(
    "name,kw,real", JAX_CASES, ids=[f"{n}-{k['norm']}-{r}" for n, k, r in JAX_CASES]
)
def test_against_jax(name, kw, real):
    pytest.importorskip("jax")
    x = RNG.normal(size=(4, 6)) if real or name in REAL_INPUT else random_complex((4, 6))
    jf = _jax_fft(name)
    check_rule(lambda x: getattr(np.fft, name)(x, **kw), (x,), lambda x: jf(x, **kw))


@pytest.mark.parametrize("name", ["fftshift", "ifftshift"])
def test_shifts(name):
    z = random_complex((4, 5))
    for axes in (None, 0, (1,), (0, 1)):
        f = lambda z: getattr(np.fft, name)(z, axes=axes)  # noqa: E731
        np.testing.assert_array_equal(_primal(f, z), f(z))
        jf = _jax_fft(name)
        check_rule(f, (z,), None if jf is None else (lambda z: jf(z, axes=axes)))


def test_defaults_and_float32():
    x = RNG.normal(size=(3, 8))
    for name in ONE_AXIS + N_AXES:
        f = getattr(np.fft, name)
        np.testing.assert_allclose(_primal(f, x), f(x), rtol=1e-14, atol=1e-14)
    x32 = x.astype(np.float32)
    loss = lambda x: np.sum(np.abs(np.fft.rfft(x)) ** 2) + np.sum(np.real(np.fft.fft2(x)))  # noqa: E731
    g = gt.grad(loss)(x32)
    assert g.dtype == np.float32
    assert_close(g, gt.grad(loss)(x), 1e-4, 1e-4)


def test_frequencies():
    f = lambda d: np.sum(np.fft.fftfreq(8, d) ** 2) + np.sum(np.fft.rfftfreq(9, d))  # noqa: E731
    assert_close(gt.grad(f)(0.25), fd_grad(f, np.float64(0.25)), 1e-7)
    np.testing.assert_array_equal(
        np.fft.fftshift(np.fft.fftfreq(6)), np.fft.fftfreq(6)[[3, 4, 5, 0, 1, 2]]
    )


def test_errors():
    x = RNG.normal(size=4)
    with pytest.raises(gt.GradtapeError, match="out="):
        gt.grad(lambda x: np.sum(np.abs(np.fft.fft(x, out=np.empty(4, complex)))))(x)
    with pytest.raises(ValueError, match="Invalid number of FFT data points"):
        gt.grad(lambda x: np.sum(np.fft.irfft(x, n=0)))(x)
    with pytest.raises(ValueError, match="Invalid norm"):
        gt.grad(lambda x: np.sum(np.abs(np.fft.fft(x, norm="both"))))(x)
    with pytest.raises(TypeError):
        gt.grad(lambda z: np.sum(np.abs(np.fft.rfft(z))))(x + 1j)


# --- scipy.fft ------------------------------------------------------------------------------
def test_scipy_fft_is_numpys():
    x = RNG.normal(size=(4, 6))
    z = random_complex((4, 6))
    for name, arg, kw in (
        ("fft", z, {"n": 7, "workers": 2}),
        ("ifft", z, {"axis": 0}),
        ("rfft", x, {"norm": "ortho"}),
        ("irfft", z, {"n": 9}),
        ("hfft", z, {}),
        ("ihfft", x, {"overwrite_x": True}),
        ("fft2", z, {}),
        ("ifft2", z, {"s": (3, 5)}),
        ("rfft2", x, {}),
        ("irfft2", z, {}),
        ("fftn", z, {"s": (5, 5)}),
        ("ifftn", z, {"axes": (0,)}),
        ("rfftn", x, {"axes": (1, 0)}),
        ("irfftn", z, {"s": (4, 8)}),
        ("fftshift", z, {}),
        ("ifftshift", z, {"axes": 1}),
    ):
        f = lambda a: getattr(sfft, name)(a, **kw)  # noqa: E731
        expected = f(arg)
        got = _primal(f, arg)
        assert got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13, err_msg=name)
        check_rule(f, (arg,))
    with pytest.raises(gt.GradtapeError, match="scipy.fft.dct"):
        gt.grad(lambda x: np.sum(sfft.dct(x)))(x)
    with pytest.raises(gt.GradtapeError, match="plan"):
        gt.grad(lambda x: np.sum(np.abs(sfft.fft(x, plan=object()))))(x)
    np.testing.assert_array_equal(sfft.fft(x), sfft.fft.__gradtape_original__(x))  # untraced


# --- forward, reverse, nested, compiled ------------------------------------------------------
def _spectral_loss(x, lam):
    """A regularised power spectrum: smoothness of log power, plus a round trip."""
    power = np.abs(np.fft.rfft(x, norm="ortho")) ** 2
    logp = np.log(power + 1e-3)
    smooth = np.sum((logp[1:] - logp[:-1]) ** 2)
    back = np.fft.irfft(np.fft.rfft(x) * np.exp(-lam * np.arange(power.size)), n=x.size)
    return smooth + np.sum((back - x) ** 2) + lam * np.sum(power)


def _propagate(field, k, z):
    """Angular-spectrum propagation of a 2-D field over distance z."""
    ny, nx = field.shape
    fy = np.fft.fftfreq(ny)[:, None]
    fx = np.fft.fftfreq(nx)[None, :]
    kz = np.sqrt(k**2 - (2 * np.pi) ** 2 * (fx**2 + fy**2) + 0j)
    return np.fft.ifft2(np.fft.fft2(field) * np.exp(1j * kz * z))


def _intensity_loss(phase, k, z, target):
    field = np.exp(1j * phase)
    out = _propagate(field, k, z)
    return np.sum((np.abs(out) ** 2 - target) ** 2)


def test_power_spectrum_regularisation():
    x, lam = RNG.normal(size=16), 0.3
    g = gt.grad(_spectral_loss, argnums=(0, 1))(x, lam)
    assert_close(g[0], fd_grad(lambda x: _spectral_loss(x, lam), x), 1e-5, 1e-6)
    assert_close(g[1], fd_grad(lambda lam: _spectral_loss(x, lam), np.float64(lam)), 1e-5, 1e-6)
    H = gt.hessian(_spectral_loss)(x, lam)
    assert_close(H, gt.jacrev(gt.grad(_spectral_loss))(x, lam), 1e-8, 1e-8)
    t = RNG.normal(size=16)
    assert_close(gt.hvp(lambda x: _spectral_loss(x, lam), x, t), H @ t, 1e-8, 1e-8)


def test_field_propagation_with_ffts():
    phase = RNG.uniform(0, 2 * np.pi, (8, 8))
    target = RNG.uniform(0, 1, (8, 8))
    k, z = 3.0, 2.0
    g = gt.grad(_intensity_loss)(phase, k, z, target)
    assert g.dtype == np.float64
    assert_close(g, fd_grad(lambda p: _intensity_loss(p, k, z, target), phase), 1e-5, 1e-6)
    gz = gt.grad(_intensity_loss, argnums=2)(phase, k, z, target)
    assert_close(
        gz, fd_grad(lambda z: _intensity_loss(phase, k, z, target), np.float64(z)), 1e-5, 1e-6
    )
    t = RNG.normal(size=(8, 8))
    fwd = gt.jvp(lambda p: _intensity_loss(p, k, z, target), (phase,), (t,))[1]
    assert_close(fwd, np.sum(g * t), 1e-10)
    if jnp is not None:
        import jax

        def jloss(phase):
            ny, nx = phase.shape
            fy = jnp.fft.fftfreq(ny)[:, None]
            fx = jnp.fft.fftfreq(nx)[None, :]
            kz = jnp.sqrt(k**2 - (2 * jnp.pi) ** 2 * (fx**2 + fy**2) + 0j)
            out = jnp.fft.ifft2(jnp.fft.fft2(jnp.exp(1j * phase)) * jnp.exp(1j * kz * z))
            return jnp.sum((jnp.abs(out) ** 2 - target) ** 2)

        assert_close(g, jax.grad(jloss)(phase), 1e-10)


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=pytest.mark.native)])
def test_compiled_transforms_agree_with_eager(backend):
    phase = RNG.uniform(0, 2 * np.pi, (6, 8))
    target = RNG.uniform(0, 1, (6, 8))
    x = RNG.normal(size=12)
    cases = (
        (gt.value_and_grad(_intensity_loss), (phase, 3.0, 2.0, target)),
        (gt.grad(_spectral_loss, argnums=(0, 1)), (x, 0.3)),
        (gt.hessian(_spectral_loss), (x, 0.3)),
        (
            lambda x: gt.jvp(
                lambda x: np.fft.rfftn(x, axes=(1, 0), norm="forward"), (x,), (x * 0.5,)
            ),
            (phase,),
        ),
        (lambda z: gt.vjp(lambda z: np.fft.hfft(z, n=9), z)[1](x[:9]), (phase[0] + 1j,)),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the numba backend runs complex values through NumPy
        for f, args in cases:
            c = gt.compile(f, backend=backend)
            for scale in (1.0, 1.0, 0.7):
                scaled = tuple(a * scale for a in args)
                got, want = c(*scaled), f(*scaled)
                for g, w in zip(_leaves(got), _leaves(want)):
                    assert_close(g, w, 1e-12, 1e-12)


def _leaves(x):
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _leaves(item)]
    return [np.asarray(x)]
