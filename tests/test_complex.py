"""Complex numbers: JAX's convention, exact or refused.

The references never use gradtape: central differences in the real and the imaginary
direction of every element (for a real loss L of complex z the gradient is dL/dx - i dL/dy,
what JAX's and autograd's grad return), and JAX itself where it is installed.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradtape as gt
from gradtape.core.primitive import REGISTRY
from gradtape.core.tracing import bind

try:
    import jax
    import jax.numpy as jnp
    import jax.scipy.special as jsp

    jax.config.update("jax_enable_x64", True)
except ImportError:  # JAX is an optional oracle
    jax = jnp = jsp = None

import scipy.special as sp

RNG = np.random.default_rng(20)
FEW = settings(max_examples=12, deadline=None)
# a complex value cast to real (imaginary part dropped) inside a rule is a bug here
pytestmark = pytest.mark.filterwarnings("error::numpy.exceptions.ComplexWarning")


# --- references ----------------------------------------------------------------------------
def fd_grad(L, z, h=1e-6):
    """dL/dx - i dL/dy per element of z (dL/dx for a real z), by central differences."""
    z = np.asarray(z)
    out = np.zeros(z.shape, z.dtype)
    directions = (1.0, 1j) if z.dtype.kind == "c" else (1.0,)
    for k in range(z.size):
        for d in directions:
            e = np.zeros(z.size, z.dtype)
            e[k] = d * h
            e = e.reshape(z.shape)
            slope = (float(L(z + e)) - float(L(z - e))) / (2 * h)
            out.reshape(-1)[k] += slope if d == 1.0 else -1j * slope
    return out


def fd_jvp(f, z, t, h=1e-6):
    """(f(z + h t) - f(z - h t)) / 2h."""
    return (np.asarray(f(z + h * t)) - np.asarray(f(z - h * t))) / (2 * h)


def random_complex(shape, lo=0.3, hi=2.0):
    """Values with real part in [lo, hi] and imaginary part in +-[0.1, 1.5]: away from the
    branch cuts of log, sqrt, power and the inverse trigonometric functions."""
    re = RNG.uniform(lo, hi, shape)
    im = RNG.uniform(0.1, 1.5, shape) * RNG.choice([-1.0, 1.0], shape)
    return re + 1j * im


def complex_arrays(shape):
    """A hypothesis strategy for complex arrays of `shape` in all four quadrants, with real
    parts in +-[0.3, 2] and imaginary parts in +-[0.1, 1.5]: off every branch cut (the real
    axis for log, sqrt, the inverse trigonometric and hyperbolic functions, the imaginary axis
    beyond +-1j for arctan and arcsinh)."""
    re = hnp.arrays(np.float64, shape, elements=st.floats(0.3, 2.0))
    im = hnp.arrays(np.float64, shape, elements=st.floats(0.1, 1.5))
    signs = hnp.arrays(np.complex128, shape, elements=st.sampled_from([1, -1, 1j, -1j]))
    # a quarter turn maps the quadrant Re > 0.3, Im > 0.1 onto the others (swapping the parts)
    return st.tuples(re, im, signs).map(lambda t: (t[0] + 1j * t[1]) * t[2])


def assert_close(a, b, rtol=1e-6, atol=1e-7, what=""):
    a, b = np.asarray(a), np.asarray(b)
    scale = max(1.0, float(np.max(np.abs(b), initial=0.0)))
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * scale, err_msg=what)


def _direction(a):
    """A random direction shaped like `a` (complex for a complex a)."""
    return random_complex(np.shape(a)) if np.iscomplexobj(a) else RNG.normal(size=np.shape(a))


def check_rule(f, args, jf=None, argnums=None, rtol=1e-6):
    """f's VJP and JVP at `args` (complex or real arrays) against central differences and JAX.

    The VJP with a random cotangent w is the gradient of the real loss L = Re(sum(w * f)): in
    JAX's convention dL(t) = Re(sum(vjp * t)) for every direction t, checked along random
    directions (complex ones for complex arguments) against central differences of L; the JVP
    along the same directions against central differences of f.
    """
    argnums = tuple(range(len(args))) if argnums is None else argnums
    out = f(*args)
    w = RNG.normal(size=np.shape(out)) + (
        1j * RNG.normal(size=np.shape(out)) if np.iscomplexobj(out) else 0
    )

    def loss(*a):
        return np.sum(np.real(w * f(*a)))

    _, vjp_fn = gt.vjp(f, *args)
    cts = vjp_fn(w)
    grads = gt.grad(loss, argnums=argnums)(*args)
    for i, g in zip(argnums, grads):
        assert np.asarray(cts[i]).dtype == np.asarray(args[i]).dtype, f"dtype of argument {i}"
        assert_close(g, cts[i], 1e-12, what=f"grad vs vjp, argument {i}")
    h = 1e-6
    for _ in range(2):
        ts = tuple(_direction(a) if i in argnums else np.zeros_like(a) for i, a in enumerate(args))

        def along(s, ts=ts):
            return tuple(a + s * t for a, t in zip(args, ts))

        slope = (loss(*along(h)) - loss(*along(-h))) / (2 * h)
        dot = sum(np.sum(np.real(np.asarray(cts[i]) * ts[i])) for i in argnums)
        scale = sum(np.sum(np.abs(np.asarray(cts[i]) * ts[i])) for i in argnums)
        assert abs(dot - slope) <= rtol * max(1.0, scale), (
            f"vjp . t = {dot}, central differences {slope}"
        )
        _, t_out = gt.jvp(f, args, ts)
        assert_close(t_out, (f(*along(h)) - f(*along(-h))) / (2 * h), rtol, what="jvp")
        if jf is not None and jax is not None:
            assert_close(t_out, jax.jvp(jf, args, ts)[1], 1e-9, what="jvp vs JAX")
    if jf is not None and jax is not None:
        j_out, j_vjp = jax.vjp(jf, *args)
        assert_close(out, j_out, 1e-10, what="value vs JAX")
        j_cts = j_vjp(w.astype(np.asarray(j_out).dtype))
        for i in argnums:
            assert_close(cts[i], j_cts[i], 1e-9, what=f"vjp vs JAX, argument {i}")


# --- the convention --------------------------------------------------------------------------
def test_abs_of_a_complex_intermediate():
    assert gt.grad(lambda t: np.abs(1j * t))(0.5) == 1.0
    assert gt.grad(lambda t: np.abs(1j * t))(-0.5) == -1.0


def test_gradient_of_squared_modulus_is_twice_the_conjugate():
    z = np.array([1 + 2j, 3 - 1j, -0.5 + 0.25j])
    expected = 2 * np.conj(z)
    np.testing.assert_allclose(gt.grad(lambda z: np.sum(np.abs(z) ** 2))(z), expected)
    np.testing.assert_allclose(gt.grad(lambda z: np.sum(np.real(z * z.conj())))(z), expected)
    np.testing.assert_allclose(gt.grad(lambda z: np.sum(z.real**2 + z.imag**2))(z), expected)
    if jax is not None:
        np.testing.assert_allclose(jax.grad(lambda z: jnp.sum(jnp.abs(z) ** 2))(z), expected)
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")
    np.testing.assert_allclose(autograd.grad(lambda z: anp.sum(anp.abs(z) ** 2))(z), expected)


def test_transposes_of_the_parts_follow_jax():
    z = np.array([1 + 2j, -3 + 0.5j])
    ct = np.array([0.7, -1.3])
    for f, expected in (
        (np.real, ct + 0j),
        (np.imag, -1j * ct),
        (np.abs, ct * np.conj(z) / np.abs(z)),
    ):
        got = gt.vjp(f, z)[1](ct)[0]
        assert got.dtype == np.complex128
        np.testing.assert_allclose(got, expected)
    cz = np.array([0.5 - 1j, 2 + 1j])
    np.testing.assert_allclose(gt.vjp(np.conj, z)[1](cz)[0], np.conj(cz))
    np.testing.assert_allclose(gt.vjp(lambda z: z.conjugate(), z)[1](cz)[0], np.conj(cz))
    # abs at 0: 0, as JAX
    np.testing.assert_array_equal(gt.vjp(np.abs, np.zeros(2, complex))[1](ct)[0], 0)


def test_tracer_parts_are_not_the_tracer():
    x = random_complex((3, 3))

    def hermitian_part(x):
        h = (x + x.conj().T) / 2
        return h, h.real, h.imag, x.conjugate(), np.real(x), np.imag(x)

    for got, want in zip(gt.jvp(hermitian_part, (x,), (x,))[0], hermitian_part(x)):
        np.testing.assert_array_equal(got, want)
    h = gt.jvp(lambda x: (x + x.conj().T) / 2, (x,), (x,))[0]
    np.testing.assert_array_equal(h, h.conj().T)  # Hermitian
    # a function's value is NumPy's
    f = lambda x: np.sum(np.abs(x + x.conj().T) ** 2) + np.sum(x.real * x.imag)  # noqa: E731
    assert gt.value_and_grad(f)(x)[0] == f(x)


def test_parts_of_real_tracers():
    x = np.array([1.5, -2.0])

    def f(x):
        assert x.real is x and np.real(x) is x
        z = x.conj() + 3 * x.imag + np.imag(x)
        return np.sum(z * x)

    np.testing.assert_allclose(gt.grad(f)(x), 2 * x)
    g = gt.grad(lambda x: np.sum(np.angle(x) + x))(np.array([1.5, -2.0]))
    np.testing.assert_array_equal(g, [1.0, 1.0])


def test_real_inputs_that_become_complex_get_real_gradients():
    x, y = 0.3, np.array([0.5, -1.5])

    def f(x, y):
        z = x + 1j * y
        return np.sum(np.abs(np.exp(z) * z) ** 2)

    gx, gy = gt.grad(f, argnums=(0, 1))(x, y)
    assert isinstance(gx, np.float64) and gy.dtype == np.float64
    assert_close(gx, fd_grad(lambda x: f(x, y), np.float64(x)))
    assert_close(gy, fd_grad(lambda y: f(x, y), y))
    if jax is not None:
        jf = lambda x, y: jnp.sum(jnp.abs(jnp.exp(x + 1j * y) * (x + 1j * y)) ** 2)  # noqa: E731
        jg = jax.grad(jf, argnums=(0, 1))(x, y)
        assert_close(gx, jg[0], 1e-10)
        assert_close(gy, jg[1], 1e-10)
    # float32 stays single precision through complex64
    x32 = np.array([0.25, 0.5], np.float32)
    g32 = gt.grad(lambda x: np.sum(np.abs(np.exp(1j * x) + x) ** 2))(x32)
    assert g32.dtype == np.float32
    assert_close(
        g32,
        fd_grad(lambda x: np.sum(np.abs(np.exp(1j * x) + x) ** 2), x32.astype(np.float64)),
        rtol=1e-4,
        atol=1e-4,
    )


def test_vjp_of_a_real_output_refuses_a_complex_cotangent():
    _, f_vjp = gt.vjp(np.abs, np.array([1 + 1j]))
    with pytest.raises(gt.GradtapeError, match="cotangent leaf 0 is complex"):
        f_vjp(np.array([1j]))


# --- holomorphic ------------------------------------------------------------------------------
def test_grad_holomorphic():
    z = random_complex(())
    f = lambda z: np.sin(z) * np.exp(z) + z**3  # noqa: E731
    fprime = np.cos(z) * np.exp(z) + np.sin(z) * np.exp(z) + 3 * z**2
    np.testing.assert_allclose(gt.grad(f, holomorphic=True)(z), fprime)
    v, g = gt.value_and_grad(f, holomorphic=True)(z)
    np.testing.assert_allclose(v, f(z), rtol=1e-15)  # (z**3 may round differently by an ulp)
    np.testing.assert_allclose(g, fprime)
    np.testing.assert_allclose(gt.grad(f, holomorphic=True)(complex(z)), fprime)
    with pytest.raises(gt.GradtapeError, match="pass holomorphic=True"):
        gt.grad(f)(z)
    with pytest.raises(gt.GradtapeError, match="holomorphic=True needs inputs with a complex"):
        gt.grad(f, holomorphic=True)(1.5)
    with pytest.raises(gt.GradtapeError, match="holomorphic=True needs outputs with a complex"):
        gt.grad(np.abs, holomorphic=True)(z)
    if jax is not None:
        jf = lambda z: jnp.sin(z) * jnp.exp(z) + z**3  # noqa: E731
        np.testing.assert_allclose(
            gt.grad(f, holomorphic=True)(z), jax.grad(jf, holomorphic=True)(z)
        )


def test_jacobians_holomorphic_and_not():
    M = random_complex((3, 3))
    z, x = random_complex(3), RNG.normal(size=3)

    def f(z):
        return np.tanh(M @ z) * z

    h = 1e-6
    J = np.stack([(f(z + h * e) - f(z - h * e)) / (2 * h) for e in np.eye(3)], axis=-1)
    for jac in (gt.jacfwd, gt.jacrev, gt.jacobian):
        assert_close(jac(f, holomorphic=True)(z), J)
    assert_close(
        gt.hessian(lambda z: np.sum(f(z)), holomorphic=True)(z),
        gt.jacfwd(gt.grad(lambda z: np.sum(f(z)), holomorphic=True), holomorphic=True)(z),
    )
    # real inputs, complex outputs: forward mode (jacobian picks it)
    g = lambda x: np.exp(1j * (M @ x))  # noqa: E731
    Jg = np.stack([(g(x + h * e) - g(x - h * e)) / (2 * h) for e in np.eye(3)], axis=-1)
    assert_close(gt.jacfwd(g)(x), Jg)
    assert_close(gt.jacobian(g)(x), Jg)
    # complex inputs, real outputs: reverse mode, rows are JAX's gradients
    r = lambda z: np.abs(M @ z) ** 2  # noqa: E731
    rows = np.stack([fd_grad(lambda z, i=i: r(z)[i], z) for i in range(3)])
    assert_close(gt.jacrev(r)(z), rows)
    assert_close(gt.jacobian(r)(z), rows)
    for bad, match in (
        (lambda: gt.jacfwd(r)(z), "forward mode needs real inputs"),
        (lambda: gt.jacrev(g)(x), "reverse mode needs real-valued outputs"),
        (lambda: gt.jacobian(f)(z), "needs real inputs"),
        (lambda: gt.jacobian(f, mode="reverse")(z), "real-valued outputs"),
        (lambda: gt.jacfwd(g, holomorphic=True)(x), "complex dtype"),
        (lambda: gt.hessian(lambda z: np.sum(r(z)))(z), "real and imaginary"),
    ):
        with pytest.raises(gt.GradtapeError, match=match):
            bad()
    if jax is not None:
        jfn = lambda z: jnp.tanh(jnp.asarray(M) @ z) * z  # noqa: E731
        assert_close(gt.jacrev(f, holomorphic=True)(z), jax.jacrev(jfn, holomorphic=True)(z), 1e-10)
        jr = lambda z: jnp.abs(jnp.asarray(M) @ z) ** 2  # noqa: E731
        assert_close(gt.jacrev(r)(z), jax.jacrev(jr)(z), 1e-10)


# --- the elementwise table --------------------------------------------------------------------
def _j(name):
    return None if jnp is None else getattr(jnp, name)


def _jsp(name):
    return None if jsp is None else getattr(jsp, name, None)


# name -> (numpy function, JAX function or None, arity)
ELEMENTWISE = {
    "add": (np.add, _j("add"), 2),
    "subtract": (np.subtract, _j("subtract"), 2),
    "multiply": (np.multiply, _j("multiply"), 2),
    "divide": (np.divide, _j("divide"), 2),
    "negative": (np.negative, _j("negative"), 1),
    "positive": (np.positive, _j("positive"), 1),
    "power": (np.power, _j("power"), 2),
    "float_power": (np.float_power, _j("float_power"), 2),
    "square": (np.square, _j("square"), 1),
    "reciprocal": (np.reciprocal, _j("reciprocal"), 1),
    "exp": (np.exp, _j("exp"), 1),
    "expm1": (np.expm1, _j("expm1"), 1),
    "exp2": (np.exp2, _j("exp2"), 1),
    "log": (np.log, _j("log"), 1),
    "log1p": (np.log1p, _j("log1p"), 1),
    "log2": (np.log2, _j("log2"), 1),
    "log10": (np.log10, _j("log10"), 1),
    "sqrt": (np.sqrt, _j("sqrt"), 1),
    "sin": (np.sin, _j("sin"), 1),
    "cos": (np.cos, _j("cos"), 1),
    "tan": (np.tan, _j("tan"), 1),
    "arcsin": (np.arcsin, _j("arcsin"), 1),
    "arccos": (np.arccos, _j("arccos"), 1),
    "arctan": (np.arctan, _j("arctan"), 1),
    "sinh": (np.sinh, _j("sinh"), 1),
    "cosh": (np.cosh, _j("cosh"), 1),
    "tanh": (np.tanh, _j("tanh"), 1),
    "arcsinh": (np.arcsinh, _j("arcsinh"), 1),
    "arccosh": (np.arccosh, _j("arccosh"), 1),
    "arctanh": (np.arctanh, _j("arctanh"), 1),
    "absolute": (np.absolute, _j("abs"), 1),
    "conjugate": (np.conjugate, _j("conjugate"), 1),
    "real": (np.real, _j("real"), 1),
    "imag": (np.imag, _j("imag"), 1),
    "gamma": (sp.gamma, None, 1),
    "erf": (sp.erf, None, 1),
    "erfc": (sp.erfc, None, 1),
    "ndtr": (sp.ndtr, None, 1),
    "log_ndtr": (sp.log_ndtr, None, 1),
    "xlogy": (sp.xlogy, _jsp("xlogy"), 2),
    "xlog1py": (sp.xlog1py, _jsp("xlog1py"), 2),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@FEW
@given(data=st.data())
def test_elementwise_complex_rules(name, data):
    f, jf, arity = ELEMENTWISE[name]
    if arity == 1:
        shapes = (data.draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)),)
    else:
        shapes = data.draw(
            hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3)
        ).input_shapes
    args = tuple(data.draw(complex_arrays(s)) for s in shapes)
    check_rule(f, args)


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n, (_, jf, _) in ELEMENTWISE.items()
        if jf is not None and n not in ("xlogy", "xlog1py")
    ),
)
def test_elementwise_complex_rules_against_jax(name):
    pytest.importorskip("jax")
    f, jf, arity = ELEMENTWISE[name]
    args = (random_complex((2, 3)), random_complex((3,)))[:arity]
    check_rule(f, args, jf)


@pytest.mark.parametrize("name", ["add", "multiply", "divide", "power", "subtract"])
def test_binary_rules_with_one_real_argument(name):
    f, jf, _ = ELEMENTWISE[name]
    x = RNG.uniform(0.5, 2.0, (2, 3))
    z = random_complex((3,))
    check_rule(f, (x, z), jf)
    check_rule(f, (z, x), jf)


def test_power_of_a_real_base_with_a_complex_exponent():
    x = np.array([-2.0, 0.5, 3.0])
    check_rule(lambda x, y: x**y, (x, random_complex(3)), argnums=(1,))
    check_rule(lambda x: x ** (1.5 - 0.5j), (np.abs(x),))


def test_arccosh_on_the_left_half_plane():
    # sqrt(z^2 - 1) has the wrong sign here; JAX's rule uses it
    z = np.array([-0.7 + 0.4j, -1.5 - 0.8j, 0.2 - 2.0j])
    check_rule(np.arccosh, (z,))


def test_angle():
    z = random_complex((2, 3)) * RNG.choice([-1, 1], (2, 3))
    check_rule(np.angle, (z,), _j("angle"))
    check_rule(lambda z: np.angle(z, deg=True), (z,))
    np.testing.assert_array_equal(gt.jvp(np.angle, (z,), (z,))[0], np.angle(z))


def test_var_and_std_of_complex_data_are_real():
    z = random_complex((3, 4)) * RNG.choice([-1, 1], (3, 4))
    for f, jf in ((np.var, _j("var")), (np.std, _j("std"))):
        for kw in ({}, {"axis": 0}, {"axis": 1, "ddof": 1, "keepdims": True}):
            got = gt.jvp(lambda z: f(z, **kw), (z,), (z,))[0]
            np.testing.assert_allclose(got, f(z, **kw), rtol=1e-15)
            assert got.dtype == np.float64
            check_rule(lambda z: f(z, **kw), (z,), None if jf is None else (lambda z: jf(z, **kw)))


@pytest.mark.parametrize(
    "reduction", ["sum", "mean", "prod", "cumsum", "cumprod", "trace", "average"]
)
def test_complex_reductions(reduction):
    z = random_complex((3, 4))
    f = {
        "sum": lambda z: np.sum(z, axis=1),
        "mean": lambda z: np.mean(z, axis=0, keepdims=True),
        "prod": lambda z: np.prod(z, axis=1),
        "cumsum": lambda z: np.cumsum(z, axis=1),
        "cumprod": lambda z: np.cumprod(z),
        "trace": lambda z: np.trace(z),
        "average": lambda z: np.average(z, axis=1, weights=np.arange(1.0, 5.0)),
    }[reduction]
    check_rule(f, (z,))
    zeros = z.copy()
    zeros[1, 2] = 0  # products with a zero stay exact
    if reduction in ("prod", "cumprod"):
        check_rule(f, (zeros,))


def test_contractions():
    a, b = random_complex((2, 3)), random_complex((3, 4))
    u, v = random_complex(3), random_complex(3)
    for f, jf, args in (
        (np.matmul, _j("matmul"), (a, b)),
        (np.dot, _j("dot"), (a, b)),
        (np.inner, _j("inner"), (u, v)),
        (np.outer, _j("outer"), (u, v)),
        (lambda a, b: np.einsum("ij,jk->ik", a, b), None, (a, b)),
        (lambda a, b: np.einsum("ij,ij->", a, b.T[:2]), None, (a, b)),
        (lambda a, b: np.tensordot(a, b, axes=1), None, (a, b)),
        (lambda u, v: np.real(u.conj() @ v), None, (u, v)),
    ):
        check_rule(f, args, jf)
    # a real matrix times a complex vector: the matrix's cotangent is real
    m = RNG.normal(size=(3, 3))
    check_rule(np.matmul, (m, u), _j("matmul"))


def test_vdot_conjugates_its_first_argument():
    u, v = random_complex(3), random_complex(3)
    np.testing.assert_allclose(gt.jvp(np.vdot, (u, v), (u, v))[0], np.vdot(u, v))
    for f in (
        lambda u: np.abs(np.vdot(u, v)) ** 2,
        lambda v: np.real(np.vdot(u, v) * (1 - 2j)),
    ):
        assert_close(gt.grad(f)(u), fd_grad(f, u))
    x = RNG.normal(size=3)
    assert_close(gt.grad(lambda x: np.imag(np.vdot(u, x * v)))(x), np.imag(np.conj(u) * v))


def test_norm_of_complex_values():
    u = random_complex(3)
    np.testing.assert_allclose(gt.jvp(np.linalg.norm, (u,), (u,))[0], np.linalg.norm(u))


def test_holomorphic_matrix_functions():
    a = random_complex((3, 3)) + 3 * np.eye(3)
    b = random_complex((3, 2))
    check_rule(np.linalg.inv, (a,), None if jnp is None else jnp.linalg.inv)
    check_rule(np.linalg.det, (a,), None if jnp is None else jnp.linalg.det)
    check_rule(np.linalg.solve, (a, b), None if jnp is None else jnp.linalg.solve)


def test_shapes_indexing_and_writes():
    z = random_complex((3, 4))

    def f(z):
        y = np.zeros_like(z)
        y[1:] = z[:-1] ** 2
        y[0, [0, 2]] = z[2, [1, 3]]
        w = np.concatenate([y, z.T.reshape(3, 4)], axis=0)
        w = np.where(np.abs(w) > 1.0, w, 2 * w)
        w = np.pad(w, ((1, 0), (0, 1)))
        acc = np.zeros_like(z)
        np.add.at(acc, ([0, 0, 2], [1, 1, 3]), z[0, :3])
        return (
            np.broadcast_to(w[None, :3], (2, 3, 5)) * 1.5
            + np.stack([acc[:, :1]] * 5, axis=-1)[:, :, 0]
        )

    check_rule(f, (z,))

    def mixed(x, z):  # real and complex operands: the real one's cotangent is the real part
        y = np.zeros_like(z)
        y[:2] = x[:2] * 2.0
        w = np.concatenate([x, z, np.where(np.real(z) > 1.0, x, z)])
        return np.stack([w[:4], y + x * z]) @ np.arange(1.0, 5.0)

    check_rule(mixed, (RNG.normal(size=4), random_complex(4)))
    with warnings.catch_warnings():
        # x.astype: the rule in rules/shape.py casts a complex cotangent with astype (right
        # numbers, NumPy's ComplexWarning); so does NumPy's own complex-to-real astype
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        check_rule(lambda x: x.astype(np.complex128) * (1 - 2j), (RNG.normal(size=3),))
        check_rule(lambda z: z.astype(np.float64), (z,))


def test_scan_with_a_complex_carry():
    phases = RNG.normal(size=(6, 2))

    def f(z0, w):
        def step(z, p):
            z = z * np.exp(1j * p * w) + 0.1 * z**2
            return z, np.abs(z) ** 2

        z, ys = gt.scan(step, z0, phases)
        return np.sum(ys) + np.real(np.sum(z))

    z0, w = random_complex(2) * 0.5, np.array([0.7, -0.3])
    check_rule(f, (z0, w))
    if jax is not None:

        def jf(z0, w):
            def step(z, p):
                z = z * jnp.exp(1j * p * w) + 0.1 * z**2
                return z, jnp.abs(z) ** 2

            z, ys = jax.lax.scan(step, z0, phases)
            return jnp.sum(ys) + jnp.real(jnp.sum(z))

        g = gt.grad(f, argnums=(0, 1))(z0, w)
        jg = jax.grad(jf, argnums=(0, 1))(z0, w)
        assert_close(g[0], jg[0], 1e-10)
        assert_close(g[1], jg[1], 1e-10)


# --- nested, compiled ------------------------------------------------------------------------
def _real_loss_of_complex_intermediates(x):
    z = np.exp(1j * x) * (1 + x**2) + np.sqrt(x + 2j)
    return (
        np.sum(np.abs(np.fft.fft(z)) ** 2 * np.angle(z + 3))
        + np.var(z)
        + np.real(np.sum(z.conj() * z * np.log(z)))
    )


def _jax_real_loss(x):
    z = jnp.exp(1j * x) * (1 + x**2) + jnp.sqrt(x + 2j)
    return (
        jnp.sum(jnp.abs(jnp.fft.fft(z)) ** 2 * jnp.angle(z + 3))
        + jnp.var(z)
        + jnp.real(jnp.sum(z.conj() * z * jnp.log(z)))
    )


def test_second_derivatives_of_real_losses_of_complex_intermediates():
    x = RNG.uniform(0.2, 1.0, 4)
    L = _real_loss_of_complex_intermediates
    H = gt.hessian(L)(x)
    h = 1e-5
    fd = np.stack([(gt.grad(L)(x + h * e) - gt.grad(L)(x - h * e)) / (2 * h) for e in np.eye(4)])
    assert_close(H, fd, 1e-6, 1e-6)
    assert_close(H, H.T, 1e-10)
    assert_close(gt.hvp(L, x, x[::-1].copy()), H @ x[::-1], 1e-9)
    assert_close(gt.jacrev(gt.grad(L))(x), H, 1e-9)
    assert_close(gt.jacfwd(gt.grad(L))(x), H, 1e-9)
    assert_close(gt.grad(lambda x: gt.grad(L)(x)[1])(x), H[1], 1e-9)
    if jax is not None:
        assert_close(H, jax.hessian(_jax_real_loss)(x), 1e-9)


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=pytest.mark.native)])
def test_compiled_and_eager_agree(backend):
    x = RNG.uniform(0.2, 1.0, 5)
    z = random_complex(5)
    L = _real_loss_of_complex_intermediates

    def M(z, w):
        return np.sum(np.abs(np.fft.ifft(z * w)) ** 2) + np.real(np.sum(np.conj(z) * np.sin(z)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the numba backend runs complex values through NumPy
        for f, args in (
            (gt.value_and_grad(L), (x,)),
            (gt.hessian(L), (x,)),
            (gt.grad(M, argnums=(0, 1)), (z, x)),
            (lambda z, w: gt.jvp(lambda z: np.fft.fft(z) * z, (z,), (w + 0j,)), (z, x)),
        ):
            c = gt.compile(f, backend=backend)
            for scale in (1.0, 1.0, 0.5):
                scaled = tuple(a * scale for a in args)
                got, want = c(*scaled), f(*scaled)
                for g, w in zip(
                    np.atleast_1d(np.asarray(got, dtype=object)),
                    np.atleast_1d(np.asarray(want, dtype=object)),
                ):
                    assert_close(
                        np.asarray(g, dtype=complex), np.asarray(w, dtype=complex), 1e-12, 1e-12
                    )


# --- refused ---------------------------------------------------------------------------------
# primitives whose complex values are refused, with a call that reaches them
REFUSED = {
    "reduce_max": lambda z: np.max(z),
    "reduce_min": lambda z: np.min(z, axis=0),
    "maximum": lambda z: np.maximum(z, 1.0),
    "minimum": lambda z: np.minimum(z, 1.0),
    "fmax": lambda z: np.fmax(z, 1.0),
    "fmin": lambda z: np.fmin(z, 1.0),
    "digamma": sp.digamma,
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_complex_rules_raise(name):
    z = random_complex((3, 3))
    f = REFUSED[name]
    loss = lambda z: np.sum(np.abs(f(z)) ** 2)  # noqa: E731
    refused = f"cannot differentiate {name} of complex|{name} of complex input has no derivative"
    with pytest.raises(gt.GradtapeError, match=refused):
        gt.grad(loss)(z)
    with pytest.raises(gt.GradtapeError, match=refused):
        gt.jvp(loss, (z,), (z,))
    # without differentiation the value is NumPy's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(gt.compile(f, backend="numpy")(z), f(z))


# every primitive with a derivative either has complex rules tested in this file (or in
# test_fft.py), refuses complex values, or NumPy rejects complex input for it
TESTED = set(ELEMENTWISE) | {
    "reduce_sum",
    "reduce_prod",
    "cumsum",
    "cumprod",
    "matmul",
    "einsum",
    "inv",
    "det",
    "solve",
    "reshape",
    "transpose",
    "broadcast_to",
    "concatenate",
    "pad",
    "full_like",
    "getitem",
    "setitem",
    "scatter_add",
    "where",
    "astype",
    "scan",
    "scan_bwd",
    "fft",
}
# checked through a loop body, where indices are traced integers, and while_loop's backward;
# the linear algebra rules' complex cases (or their own refusals of complex input) are tested
# in test_linalg.py and test_scipy_linalg.py, against JAX and finite differences
TESTED_ELSEWHERE = {"dyn_getitem", "dyn_setitem", "dyn_scatter_add", "while_loop"} | {
    "signal_convolve",  # test_scipy_signal.py
    "cholesky",
    "qr",
    # nondifferentiable with complex results (test_numerical_edges.py)
    "rint",
    "stop_gradient",
    "svd",
    "eig",
    "eigh",
    "pinv",
    "slogdet",
    "linalg_conj",
    "linalg_real",
    "linalg_imag",
    "linalg_all_real",
    "cholesky_backward",
    "expm",
    "cho_factors",
    "cho_solve",
    "lu",
    "lu_factors",
    "lu_permutation",
    "lu_solve",
    "lu_solve_factors",
    "pos_solve",
    "scipy_eigh",
    "scipy_eigh_general",
    "solve_banded",
    "solve_continuous_lyapunov",
    "solve_discrete_lyapunov",
    "solve_sylvester",
    "sqrtm",
    "logm",
    "triangular_solve",
}


def test_every_primitive_is_tested_or_refuses_complex_values():
    """Declared complex rules are tested; every elementwise rule not declared either is
    rejected by NumPy for complex input or refused by gradtape. Other primitives not declared
    are refused by the interpreters' one check (test_refused_complex_rules_raise)."""
    complex_correct = {name for name, prim in REGISTRY.items() if prim.complex_correct}
    assert complex_correct <= TESTED | TESTED_ELSEWHERE, "declared but not tested"
    for name, prim in sorted(REGISTRY.items()):
        if name in complex_correct or prim.nondiff or name in REFUSED or prim.partials is None:
            continue
        z = random_complex(3)
        args = (z,) * len(prim.partials)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with np.errstate(all="ignore"):
                    prim.impl(*args)
            except (TypeError, ValueError):
                continue
            with pytest.raises(gt.GradtapeError, match="complex"):
                gt.grad(lambda z: np.sum(np.abs(bind(prim, (z,) * len(args), {}))))(z)


def test_while_loop_and_traced_indices_with_complex_values():
    def f(z):
        def body(c):
            i, acc = c
            return i + 1, acc * z[i] + np.conj(z[i])

        _, acc = gt.while_loop(lambda c: c[0] < 3, body, (0, 1 + 0j))
        return np.abs(acc) ** 2

    z = random_complex(3)
    assert_close(gt.grad(f)(z), fd_grad(f, z))

    def g(z):
        def body(i, acc):
            y = acc.copy()
            y[i] = acc[i] * z[i] + 1j
            np.add.at(y, (i,), z[i])
            return y

        return np.sum(np.abs(gt.fori_loop(0, 3, body, np.ones(3, complex))) ** 2)

    assert_close(gt.grad(g)(z), fd_grad(g, z))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close(gt.compile(gt.grad(g), backend="numpy")(z), fd_grad(g, z))


def test_custom_rules_take_complex_values():
    @gt.custom_vjp
    def double(z):
        return 2 * z

    double.defvjp(lambda z: (double(z), None), lambda res, g: (2 * g,))

    @gt.custom_jvp
    def triple(z):
        return 3 * z

    triple.defjvp(lambda primals, tangents: (triple(primals[0]), 3 * tangents[0]))
    z = random_complex(3)
    assert_close(gt.grad(lambda z: np.sum(np.abs(double(z)) ** 2))(z), 8 * np.conj(z), 1e-12)
    assert_close(gt.grad(lambda z: np.sum(np.abs(triple(z)) ** 2))(z), 18 * np.conj(z), 1e-12)


def test_sign_of_complex_values_is_refused_or_exact():
    z = random_complex(3)
    f = lambda z: np.sum(np.real(np.sign(z) * (1 + 2j)))  # noqa: E731
    try:
        g = gt.grad(f)(z)
    except gt.GradtapeError as e:
        assert "sign of complex values" in str(e) and "test_complex.py" in str(e)
        return
    assert_close(g, fd_grad(f, z))


# --- what a demanding user writes -------------------------------------------------------------
def test_impedance_fit_by_least_squares():
    """A Randles circuit R0 + (R1 || C) fitted to measured complex impedances."""
    omega = np.logspace(-1, 4, 40)
    true = np.array([10.0, 50.0, 1e-4])

    def impedance(p, omega):
        r0, r1, c = p
        return r0 + r1 / (1 + 1j * omega * r1 * c)

    measured = impedance(true, omega) * (1 + 0.01 * RNG.normal(size=40))

    def loss(p):
        residual = (impedance(p, omega) - measured) / np.abs(measured)
        return np.sum(residual.real**2 + residual.imag**2)

    p = np.array([8.0, 40.0, 2e-4])
    g = gt.grad(loss)(p)
    assert g.dtype == np.float64
    assert_close(
        g,
        np.array(
            [(loss(p + h) - loss(p - h)) / (2 * np.linalg.norm(h)) for h in np.diag(p * 1e-6)]
        ),
        1e-5,
    )
    # Gauss-Newton from the Jacobian of the stacked real residuals
    res = lambda p: np.concatenate(
        [
            np.real(impedance(p, omega) - measured),  # noqa: E731
            np.imag(impedance(p, omega) - measured),
        ]
    )
    for _ in range(20):
        J = gt.jacobian(res)(p)
        p = p - np.linalg.lstsq(J, res(p), rcond=None)[0]
    np.testing.assert_allclose(p, true, rtol=0.05)
    if jax is not None:

        def jloss(p):
            r0, r1, c = p
            z = r0 + r1 / (1 + 1j * omega * r1 * c)
            residual = (z - measured) / jnp.abs(measured)
            return jnp.sum(residual.real**2 + residual.imag**2)

        q = np.array([8.0, 40.0, 2e-4])
        assert_close(gt.grad(loss)(q), jax.grad(jloss)(q), 1e-10)


def test_quantum_expectation_value():
    """<psi|H|psi> / <psi|psi> of a random Hermitian H, differentiated in psi and in H."""
    n = 4
    rng = np.random.default_rng(843)  # (its own draw: the descent below must converge for it)
    a = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    H = a + a.conj().T
    psi = rng.normal(size=n) + 1j * rng.normal(size=n)

    def energy(psi, H):
        return np.real(psi.conj() @ H @ psi) / np.sum(np.abs(psi) ** 2)

    g_psi, g_H = gt.grad(energy, argnums=(0, 1))(psi, H)
    e = energy(psi, H)
    norm2 = np.sum(np.abs(psi) ** 2)
    assert_close(g_psi, 2 * np.conj(H @ psi - e * psi) / norm2, 1e-10)
    assert_close(g_H, fd_grad(lambda H: energy(psi, H), H), 1e-6)
    assert_close(g_psi, fd_grad(lambda p: energy(p, H), psi), 1e-6)
    if jax is not None:
        jenergy = lambda psi, H: (
            jnp.real(psi.conj() @ H @ psi)
            / jnp.sum(  # noqa: E731
                jnp.abs(psi) ** 2
            )
        )
        jg = jax.grad(jenergy, argnums=(0, 1))(psi, H)
        assert_close(g_psi, jg[0], 1e-10)
        assert_close(g_H, jg[1], 1e-10)
    # the ground state by gradient descent on the Rayleigh quotient: the direction of steepest
    # ascent in the complex plane is the conjugate of the gradient
    for _ in range(300):
        psi = psi - 0.1 * np.conj(gt.grad(energy)(psi, H))
    np.testing.assert_allclose(energy(psi, H), np.linalg.eigvalsh(H)[0], rtol=1e-6)
