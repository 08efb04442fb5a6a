"""Numerical edge cases: masked branches, division by zero, empty and all-NaN reductions,
reductions with where=/initial= through ndarray's methods, and complex values refused or
exact. Each behaviour is NumPy's value (with NumPy's warnings) and a gradient that is either
right or a clear error, never a silently different number."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import central_difference_grad

import gradtape as gt

X = np.array([-1.0, 0.5, 4.0, 2.0])
MASK = X > 0


def fd(f, x):
    return central_difference_grad(f, (x,), 0)


# --- ndarray methods take the keywords of their np. spellings ---------------------------------
METHOD_CASES = {
    "sum where": (lambda x: x.sum(where=MASK), lambda x: np.sum(x, where=MASK)),
    "sum initial": (lambda x: x.sum(initial=3.0), lambda x: np.sum(x, initial=3.0)),
    "mean where": (lambda x: x.mean(where=MASK), lambda x: np.mean(x, where=MASK)),
    "prod where initial": (
        lambda x: x.prod(where=MASK, initial=2.0),
        lambda x: np.prod(x, where=MASK, initial=2.0),
    ),
    "max initial": (lambda x: x.max(initial=3.0), lambda x: np.max(x, initial=3.0)),
    "max where": (
        lambda x: x.max(where=MASK, initial=-5.0),
        lambda x: np.max(x, where=MASK, initial=-5.0),
    ),
    "min where": (
        lambda x: x.min(where=MASK, initial=5.0),
        lambda x: np.min(x, where=MASK, initial=5.0),
    ),
    "var where": (lambda x: x.var(where=MASK), lambda x: np.var(x, where=MASK)),
    "std where ddof": (
        lambda x: x.std(where=MASK, ddof=1),
        lambda x: np.std(x, where=MASK, ddof=1),
    ),
    "var mean": (
        lambda x: x.var(mean=np.mean(x, keepdims=True)),
        lambda x: np.var(x, mean=np.mean(x, keepdims=True)),
    ),
}


@pytest.mark.parametrize("name", list(METHOD_CASES))
def test_reduction_methods_take_where_and_initial(name):
    method, function = METHOD_CASES[name]
    value, grad = gt.value_and_grad(method)(X)
    np.testing.assert_allclose(value, method(X), rtol=1e-14)
    np.testing.assert_allclose(value, function(X), rtol=1e-14)
    np.testing.assert_allclose(grad, fd(method, X), rtol=1e-6, atol=1e-8)
    compiled = gt.compile(gt.value_and_grad(method), backend="numpy")(X)
    np.testing.assert_allclose(compiled[0], value, rtol=1e-14)
    np.testing.assert_allclose(compiled[1], grad, rtol=1e-14)


def test_any_and_all_methods_take_where():
    def f(x):
        return x.sum() * (x.any(where=MASK) + x.all(where=~MASK))

    value, grad = gt.value_and_grad(f)(X)
    assert value == f(X)
    np.testing.assert_allclose(grad, np.full(4, 1.0 + (X[~MASK] > 0).all()))


# --- division by zero: NumPy's inf and nan, with its warning, in the value and the gradient -----
@pytest.mark.parametrize(
    "f",
    [
        lambda x: np.sum(x / 0.0),
        lambda x: np.sum(x) / 0,
        lambda x: np.sum(np.divide(x, 0.0)),
        lambda x: np.sum(x / np.float64(0.0)),
    ],
    ids=["x/0.0", "sum(x)/0", "np.divide(x, 0.0)", "x/float64(0)"],
)
def test_division_by_a_zero_constant_gives_numpys_inf(f):
    x = np.array([1.0, 2.0])
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        value, grad = gt.value_and_grad(f)(x)
    with np.errstate(all="ignore"):
        assert value == f(x)
    np.testing.assert_array_equal(grad, [np.inf, np.inf])
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        _, tangent = gt.jvp(f, (x,), (np.ones(2),))
    assert tangent == np.inf
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        compiled = gt.compile(gt.value_and_grad(f), backend="numpy")(x)
    np.testing.assert_array_equal(compiled[1], grad)


def test_division_by_a_python_zero_keeps_float32():
    x = np.ones(2, np.float32)
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        grad = gt.grad(lambda x: np.sum(x / 0.0))(x)
    assert grad.dtype == np.float32
    np.testing.assert_array_equal(grad, [np.inf, np.inf])


def test_std_with_ddof_of_one_element_is_numpys_nan():
    x = np.array([2.0])
    with warnings.catch_warnings(record=True) as numpy_warnings:
        warnings.simplefilter("always")
        expected = np.std(x, ddof=1)
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        value, grad = gt.value_and_grad(lambda x: np.std(x, ddof=1))(x)
    assert np.isnan(value) and np.isnan(expected)
    assert np.isnan(grad).all()
    assert any("Degrees of freedom" in str(w.message) for w in numpy_warnings)
    assert any("Degrees of freedom" in str(w.message) for w in ours)


# --- complex values: exact, or refused with the operation's name --------------------------------
Z = np.array([1.0 + 1.0j, -2.0 + 0.5j, 0.3 - 1.2j])


def test_sign_of_complex_values_is_refused_at_the_users_line():
    def f(z):
        return np.sum(np.abs(np.sign(z) + z) ** 2)

    with pytest.raises(gt.GradtapeError, match=r"sign of complex values.*zero derivative") as e:
        gt.grad(f)(Z)
    assert "test_numerical_edges.py" in str(e.value)
    # staged without a derivative, sign of complex values is just a value
    np.testing.assert_allclose(gt.compile(f, backend="numpy")(Z), f(Z), rtol=1e-14)
    # real values: sign has zero derivative, as before
    x = np.array([1.0, -2.0])
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(np.sign(x) * x))(x), np.sign(x))


def test_nondifferentiable_primitives_with_exact_complex_rules_are_not_refused():
    def f(z):
        return np.sum(np.abs(z * gt.stop_gradient(z) + np.rint(z * 3.0)) ** 2)

    def by_hand(z):  # |z c + r|^2 with c, r constants: 2 conj(z c + r) c (JAX's convention)
        return 2 * np.conj(z * z + np.rint(z * 3.0)) * z

    np.testing.assert_allclose(gt.grad(f)(Z), by_hand(Z), rtol=1e-12)


def test_a_nondifferentiable_complex_result_is_checked_against_the_declarations():
    from gradtape.core.primitive import REGISTRY

    declared = {name for name, prim in REGISTRY.items() if prim.nondiff and prim.complex_correct}
    assert {"rint", "stop_gradient"} <= declared
    assert declared <= {"rint", "stop_gradient", "cho_factors", "lu_factors"} | {
        "lu_permutation",  # integer results: the linear algebra rules declare them
        "linalg_all_real",
    }
    assert REGISTRY["sign"].complex_correct is False


def test_complex_to_real_casts_in_the_backward_pass_do_not_warn():
    x = np.array([1.0, 2.0])

    def f(x):
        return np.sum(np.abs(x.astype(np.complex128) * (1 + 2j)) ** 2)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(gt.grad(f)(x), 10 * x, rtol=1e-14)
        np.testing.assert_allclose(gt.jvp(f, (x,), (x,))[1], 10 * x @ x, rtol=1e-14)
        np.testing.assert_allclose(gt.hessian(f)(x), 10 * np.eye(2), rtol=1e-14)
        np.testing.assert_allclose(gt.compile(gt.grad(f), backend="numpy")(x), 10 * x, rtol=1e-14)


# --- masked branches: finite gradients in every mode and on both compiled backends ---------------
MASKED = {
    "p log p": (
        lambda p: np.sum(np.where(p > 0, p * np.log(p), 0.0)),
        lambda p: np.where(p > 0, np.log(np.where(p > 0, p, 1.0)) + 1.0, 0.0),
    ),
    "sqrt": (
        lambda x: np.sum(np.where(x > 0, np.sqrt(x), 0.0)),
        lambda x: np.where(x > 0, 0.5 / np.sqrt(np.where(x > 0, x, 1.0)), 0.0),
    ),
    "reciprocal": (
        lambda x: np.sum(np.where(x != 0, 1.0 / x, 0.0)),
        lambda x: np.where(x != 0, -1.0 / np.where(x != 0, x, 1.0) ** 2, 0.0),
    ),
    "log": (
        lambda x: np.sum(np.where(x > 0, np.log(x) * x**2, 0.0)),
        lambda x: np.where(x > 0, (2 * np.log(np.where(x > 0, x, 1.0)) + 1.0) * x, 0.0),
    ),
}
MASKED_AT = np.array([0.0, 0.5, 1.0, -1.0, 1000.0])


@pytest.mark.parametrize("name", list(MASKED))
def test_masked_branches_have_finite_gradients(name):
    f, grad_by_hand = MASKED[name]
    expected = grad_by_hand(MASKED_AT)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(gt.grad(f)(MASKED_AT), expected, rtol=1e-14)
        compiled = gt.compile(gt.grad(f), backend="numpy")(MASKED_AT)
        np.testing.assert_allclose(compiled, expected, rtol=1e-14)
        for k in range(MASKED_AT.size):  # forward mode, one direction at a time
            e = np.zeros(MASKED_AT.size)
            e[k] = 1.0
            np.testing.assert_allclose(gt.jvp(f, (MASKED_AT,), (e,))[1], expected[k], rtol=1e-14)
        np.testing.assert_allclose(gt.jacfwd(f)(MASKED_AT), expected, rtol=1e-14)


@pytest.mark.native
def test_masked_branches_on_the_numba_backend():
    from gradtape.compile.numba import backend as numba_backend

    if not numba_backend.available():
        pytest.skip("Numba is not installed")
    from gradtape.compile.numba.backend import lowered

    for name, (f, grad_by_hand) in MASKED.items():
        compiled = gt.compile(gt.grad(f), backend="numba")
        with warnings.catch_warnings():
            warnings.simplefilter("error", numba_backend.NativeFallbackWarning)
            with np.errstate(all="ignore"):
                for _ in range(2):
                    np.testing.assert_allclose(
                        compiled(MASKED_AT), grad_by_hand(MASKED_AT), rtol=1e-14, err_msg=name
                    )
        assert lowered(compiled, MASKED_AT).tier == "native", name


@pytest.mark.native
def test_the_numba_backend_says_complex_values_are_not_lowered():
    from gradtape.compile.numba import backend as numba_backend

    if not numba_backend.available():
        pytest.skip("Numba is not installed")

    def f(z):
        return np.sum(np.abs(np.exp(z) * z) ** 2)

    compiled = gt.compile(gt.value_and_grad(f), backend="numba")
    with pytest.warns(
        numba_backend.NativeFallbackWarning, match="complex values are not lowered"
    ) as w:
        value, grad = compiled(Z * 0.71)  # a scale of its own: warned once per message
    assert not any("no native translation" in str(m.message) for m in w)
    expected = gt.value_and_grad(f)(Z * 0.71)
    np.testing.assert_allclose(value, expected[0], rtol=1e-13)
    np.testing.assert_allclose(grad, expected[1], rtol=1e-13)


# --- empty and all-NaN reductions, where= and initial= -------------------------------------------
WHERE_CASES = {
    # name: (f, x, gradient by hand)
    "max where initial": (
        lambda x: np.max(x, where=x < 3, initial=0),
        np.array([1.0, 2.0, 4.0]),
        [0.0, 1.0, 0.0],
    ),
    "min where initial": (
        lambda x: np.min(x, where=x > 1.5, initial=10),
        np.array([1.0, 2.0, 4.0]),
        [0.0, 1.0, 0.0],
    ),
    "prod where": (
        lambda x: np.prod(x, where=x < 3),
        np.array([1.0, 2.0, 4.0]),
        [2.0, 1.0, 0.0],
    ),
    "max where, the selected entries at -inf": (
        lambda x: np.max(x, where=np.array([True, True, False]), initial=-np.inf),
        np.array([-np.inf, 1.0, 5.0]),
        [0.0, 1.0, 0.0],
    ),
    "nanmax of -inf and NaN": (lambda x: np.nanmax(x), np.array([-np.inf, np.nan]), [1.0, 0.0]),
    "nanmin of inf and NaN": (lambda x: np.nanmin(x), np.array([np.nan, np.inf]), [0.0, 1.0]),
    "nanmax of ties at -inf": (
        lambda x: np.nanmax(x),
        np.array([-np.inf, np.nan, -np.inf]),
        [0.5, 0.0, 0.5],
    ),
    "nanmax tied with a masked filler along an axis": (
        lambda x: np.sum(np.nanmax(x, axis=1) * np.array([1.0, 2.0])),
        np.array([[-np.inf, np.nan, 1.0], [np.nan, -np.inf, np.nan]]),
        [[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]],
    ),
}


@pytest.mark.parametrize("name", list(WHERE_CASES))
def test_masked_extremes_give_numpys_value_and_the_selected_entries_gradient(name):
    f, x, expected = WHERE_CASES[name]
    value, grad = gt.value_and_grad(f)(x)
    np.testing.assert_array_equal(value, f(x))
    np.testing.assert_allclose(grad, expected, rtol=1e-14)
    compiled = gt.compile(gt.value_and_grad(f), backend="numpy")(x)
    np.testing.assert_array_equal(compiled[0], value)
    np.testing.assert_allclose(compiled[1], expected, rtol=1e-14)


def test_a_masked_extreme_tied_with_a_finite_initial_keeps_numpys_value():
    x = np.array([0.1, 5.0, 0.1, 0.1])
    where = np.array([True, False, True, True])
    value, grad = gt.value_and_grad(lambda x: np.max(x, where=where, initial=0.1))(x)
    assert value == 0.1  # exactly, not a sum of three 0.1 divided by three
    # the entries share the derivative with initial= (a tie of np.maximum's): half of it
    np.testing.assert_allclose(grad, [1 / 6, 0.0, 1 / 6, 1 / 6], rtol=1e-14)


@pytest.mark.parametrize("reduction", [np.nanmax, np.nanmin])
def test_all_nan_slices_are_nan_with_numpys_warning(reduction):
    x = np.array([[np.nan, 1.0], [np.nan, 2.0]])
    with pytest.warns(RuntimeWarning, match="All-NaN slice"):
        value, grad = gt.value_and_grad(lambda x: np.sum(reduction(x, axis=0)))(x)
    assert np.isnan(value)
    np.testing.assert_array_equal(
        grad, [[0.0, reduction is np.nanmin], [0.0, reduction is np.nanmax]]
    )


def test_empty_reductions():
    empty = np.ones((0, 3))
    value, grad = gt.value_and_grad(lambda x: np.sum(np.prod(x, axis=0) * np.arange(3.0)))(empty)
    assert value == 3.0 and grad.shape == (0, 3)
    value, grad = gt.value_and_grad(lambda x: np.max(x, initial=1.5))(np.ones(0))
    assert value == 1.5 and grad.shape == (0,)
    value, grad = gt.value_and_grad(lambda x: np.sum(np.min(x, axis=0, initial=2.0)))(empty)
    assert value == 6.0 and grad.shape == (0, 3)
    with pytest.raises(ValueError, match="zero-size array"):
        gt.grad(lambda x: np.max(x))(np.ones(0))


# --- np.r_ and np.c_ ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("f", "same"),
    [
        (lambda x: np.sum(np.r_[x, 2 * x]), lambda x: np.sum(np.concatenate([x, 2 * x]))),
        (lambda x: np.sum(np.r_[0.5, x]), lambda x: np.sum(np.concatenate([[0.5], x]))),
        (
            lambda x: np.sum(np.c_[x, x**2] @ np.array([1.0, 3.0])),
            lambda x: np.sum(np.column_stack([x, x**2]) @ np.array([1.0, 3.0])),
        ),
    ],
)
def test_index_tricks_on_traced_values_concatenate_them(f, same):
    x = np.array([1.0, 2.0])
    np.testing.assert_allclose(gt.grad(f)(x), fd(f, x), rtol=1e-7)
    np.testing.assert_array_equal(gt.grad(f)(x), gt.grad(same)(x))
    # index tricks of constants inside a traced function are plain arrays, as ever
    np.testing.assert_array_equal(gt.grad(lambda x: np.sum(x[np.r_[0, 1]]))(x), [1.0, 1.0])


# --- the numba backend on edge inputs ------------------------------------------------------------
def _numba_backend():
    from gradtape.compile.numba import backend as numba_backend

    if not numba_backend.available():
        pytest.skip("Numba is not installed")
    return numba_backend


@pytest.mark.native
@pytest.mark.parametrize("backend", ["numba", "auto"])
def test_power_with_an_array_of_constant_exponents_on_the_numba_backend(backend):
    _numba_backend()
    exponents = np.array([1.0, 2.0, 3.0, 0.5])
    x = np.array([1.5, 0.5, 2.0, 4.0])

    def f(x):
        return np.sum(x**exponents)

    compiled = gt.compile(gt.value_and_grad(f), backend=backend)
    for _ in range(3):
        value, grad = compiled(x)
        np.testing.assert_allclose(value, f(x), rtol=1e-14)
        np.testing.assert_allclose(grad, exponents * x ** (exponents - 1), rtol=1e-14)


@pytest.mark.native
def test_a_strided_argument_with_a_zero_dimensional_one_on_the_numba_backend():
    numba_backend = _numba_backend()
    strided = np.arange(12.0).reshape(3, 4)[:, ::2]

    def f(a, s):
        return np.sum(a * s)

    compiled = gt.compile(gt.value_and_grad(f, argnums=(0, 1)), backend="numba")
    compiled(strided, np.float64(2.0))
    assert numba_backend.wait_for_kernels(600)
    for scale in (np.float64(2.0), np.array(2.0), np.array(3.0)):
        value, (grad_a, grad_s) = compiled(strided, scale)
        assert value == np.sum(strided * scale)
        np.testing.assert_array_equal(grad_a, np.full((3, 2), float(scale)))
        assert grad_s == np.sum(strided)


# --- out= arrays that share memory ---------------------------------------------------------------
def _two_results(x):
    return x * 2.0, x * 3.0


def _nested_results(x):
    return np.sum(x), (x * 2.0, x * 3.0)


def _unreplayable(x):  # x.item(1) of a whole array: runs eagerly, with a warning
    return x * x.item(1), x * 3.0


@pytest.mark.parametrize("f", [_two_results, _unreplayable], ids=["replayed", "eager"])
def test_out_arrays_that_share_memory_are_refused(f):
    x = np.array([1.0, 2.0])
    compiled = gt.compile(f, backend="numpy")
    b = np.zeros(2)
    big = np.zeros(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gt.CompileWarning)
        for out in [(b, b), (big[:2], big[1:])]:
            for _ in range(2):  # the call that records, and one that replays
                with pytest.raises(gt.GradtapeError, match="two out= arrays share memory"):
                    compiled(x, out=out)
        assert not b.any() and not big.any()  # nothing was written
        if f is _two_results:  # a replay writes results while it reads the arguments
            with pytest.raises(gt.GradtapeError, match="shares memory with an argument"):
                compiled(x, out=(x, b))
        else:  # an eager call computes every result first: NumPy's semantics
            y = x.copy()
            compiled(y, out=(y, b))
            np.testing.assert_array_equal(y, x * x[1])
            np.testing.assert_array_equal(b, x * 3.0)
            b[...] = 0.0
        first, second = np.zeros(2), np.zeros(2)
        compiled(x, out=(first, second))  # separate arrays, also views of one that do not overlap
        np.testing.assert_array_equal(second, x * 3.0)
        halves = np.zeros(4)
        compiled(x, out=(halves[:2], halves[2:]))
        np.testing.assert_array_equal(halves[2:], x * 3.0)


def test_nested_out_arrays_that_share_memory_are_refused():
    x = np.array([1.0, 2.0])
    compiled = gt.compile(_nested_results, backend="numpy")
    g = np.zeros(2)
    with pytest.raises(gt.GradtapeError, match="two out= arrays share memory"):
        compiled(x, out=(np.zeros(()), (g, g)))


@pytest.mark.native
@pytest.mark.parametrize(
    "f",
    [
        lambda x: np.quantile(x, 0.3),
        lambda x: np.sum(np.percentile(x, [10.0, 50.0, 90.0]) * np.array([1.0, 2.0, 3.0])),
        lambda x: np.median(x),
        lambda x: np.sum(x[:1] ** 2).reshape(()),
    ],
    ids=["quantile", "percentile", "median", "reshape of one element to a scalar"],
)
def test_quantiles_compile_to_native_kernels(f):
    numba_backend = _numba_backend()
    x = np.random.default_rng(3).normal(size=21)
    compiled = gt.compile(gt.value_and_grad(f), backend="numba")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            value, grad = compiled(x)
    assert not [w for w in caught if "could not compile" in str(w.message)]
    assert numba_backend.lowered(compiled, x).tier == "native"
    expected = gt.value_and_grad(f)(x)
    np.testing.assert_allclose(value, expected[0], rtol=1e-14)
    np.testing.assert_allclose(grad, expected[1], rtol=1e-14)
    np.testing.assert_allclose(grad, fd(f, x), rtol=1e-6, atol=1e-8)


@pytest.mark.native
def test_division_by_zero_on_the_numba_backend():
    _numba_backend()
    x = np.array([1.0, 2.0, 0.0])
    for f in (
        lambda x: np.sum(x / 0.0),
        lambda x: np.sum(x) / 0,
        lambda x: np.std(x[:1], ddof=1) + np.sum(x),
    ):
        compiled = gt.compile(gt.value_and_grad(f), backend="numba")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's, while recording
            with np.errstate(all="ignore"):
                expected = gt.value_and_grad(f)(x)
                for _ in range(2):
                    value, grad = compiled(x)
                    np.testing.assert_array_equal(value, expected[0])
                    np.testing.assert_array_equal(grad, expected[1])


def test_a_recorded_gradient_masks_only_where_a_zero_cotangent_can_meet_an_infinity():
    x = np.array([1.0, 4.0])
    # the cotangent of sqrt is the constant 1 (no zero): nothing to mask on replay
    assert "nan_safe_multiply" not in str(gt.trace(gt.grad(lambda x: np.sum(np.sqrt(x))), x))
    # a constant finite partial (3 * x): nothing to mask either
    assert "nan_safe_multiply" not in str(gt.trace(gt.grad(lambda x: np.sum(3.0 * x * x)), x))
    # a traced cotangent meeting a traced partial: one masked product, right on new inputs
    f = lambda x: np.sum(np.where(x > 0, x * np.log(x), 0.0))  # noqa: E731
    assert "nan_safe_multiply" in str(gt.trace(gt.grad(f), x))
    compiled = gt.compile(gt.grad(f), backend="numpy")
    with np.errstate(all="ignore"):
        compiled(x)
        np.testing.assert_allclose(compiled(np.array([0.0, 4.0])), [0.0, np.log(4.0) + 1.0])


def test_power_with_exponent_zero_has_zero_derivative_at_zero():
    """d/dx x**0 = 0, also at x = 0 (the rule's y * x**(y - 1) is 0 * inf there)."""
    assert gt.grad(lambda x: np.power(x, 0.0))(0.0) == 0.0
    assert gt.grad(lambda x: x**0.0)(0.0) == 0.0
    p = np.array([0.0, 1.0, 2.0])
    np.testing.assert_array_equal(gt.grad(lambda x: np.sum(x**p))(np.zeros(3)), [0.0, 1.0, 0.0])
    assert gt.jvp(lambda x: np.power(x, 0.0), (0.0,), (1.0,))[1] == 0.0
    assert gt.hessian(lambda x: x**0.0)(0.0) == 0.0
    compiled = gt.compile(gt.grad(lambda x: np.sum(x**p)), backend="numpy")
    np.testing.assert_array_equal(compiled(np.zeros(3)), [0.0, 1.0, 0.0])
