"""Lists and tuples of traced values where NumPy takes an array, np.r_/np.c_, casts to NumPy
scalar types, and np.std over one element: gradients checked against central differences,
forward mode against reverse mode, eagerly, compiled and nested."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from conftest import assert_grad_matches, central_difference_grad, compile_backends
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

X = np.array([0.3, -1.2, 2.0, 0.7])
W = np.array([[1.0, -0.5], [0.25, 2.0]])

# NumPy functions given a list or tuple that holds traced values (and plain numbers), with no
# traced value among their direct arguments: NumPy's dispatch sees only the list
LIST_CASES = {
    "mean": lambda x: np.mean([x[0], x[1] + 2.0]),
    "mean_tuple": lambda x: np.mean((x[0], x[1] * x[2])),
    "std": lambda x: np.std([x[0], x[1], 3.0]),
    "var": lambda x: np.var((x[0], x[1] + 2.0, x[3])),
    "norm": lambda x: np.linalg.norm([x[0], x[1] + 2.0]),
    "norm_matrix": lambda x: np.linalg.norm([[x[0], x[1]], [1.0, x[2]]], "fro"),
    "sum_of_arrays": lambda x: np.sum([x, 2.0 * x]),
    "sum_axis": lambda x: np.sum(np.sum([x[:2], x[2:]], axis=0) ** 2),
    "max": lambda x: np.max([x[0], x[1], x[2] * 0.5]),
    "min": lambda x: np.min([[x[0], x[1]], [x[2], x[3]]]),
    "prod": lambda x: np.prod([x[0], x[1], 2.0]),
    "dot_plain_weights": lambda x: np.dot([x[0], x[1]], np.array([1.5, -2.0])),
    "dot_nested": lambda x: np.sum(np.dot([[x[0], x[1]], [x[2], 1.0]], W)),
    "average": lambda x: np.average([x[0], x[1], x[2]], weights=[1.0, 2.0, 3.0]),
    "median": lambda x: np.median([x[0], x[1], x[2]]),
    "cumsum": lambda x: np.sum(np.cumsum([x[0], x[1], x[2]]) ** 2),
    "diff": lambda x: np.sum(np.diff([x[0], x[1] ** 2, x[2]]) ** 2),
    "det": lambda x: np.linalg.det([[x[0], x[1]], [x[2], x[3]]]),
    "where": lambda x: np.sum(np.where([True, False], [x[0], x[1]], 0.5)),
    "concatenate_nested": lambda x: np.sum(np.concatenate([[x[0], x[1]], x[2:]]) ** 2),
    "stack_of_lists": lambda x: np.sum(np.stack([[x[0], x[1]], [x[2], 1.0]]) ** 3),
    "einsum": lambda x: np.einsum("i,i->", [x[0], x[1]], [x[2], 2.0]),
    "trapezoid": lambda x: np.trapezoid([x[0], x[1] ** 2, x[2]]),
    "clip": lambda x: np.sum(np.clip([x[0], x[1], x[2]], -1.0, 1.0)),
    "transpose": lambda x: np.sum(np.transpose([[x[0], x[1]], [x[2], x[3]]]) * W),
    "reshape": lambda x: np.sum(np.reshape([x[0], x[1], x[2], x[3]], (2, 2)) @ W),
    "append_list": lambda x: np.sum(np.append([x[0], 1.0], [x[1], x[2]]) ** 2),
    "outer": lambda x: np.sum(np.outer([x[0], x[1]], [1.0, x[2]])),
    "polyval": lambda x: np.polyval([x[0], x[1], 1.0], x[2]),
}


@pytest.mark.parametrize("name", sorted(LIST_CASES))
def test_a_list_of_traced_values_is_stacked_where_numpy_takes_an_array(name):
    f = LIST_CASES[name]
    assert_grad_matches(f, X, complex_step=False)


@pytest.mark.parametrize("name", sorted(LIST_CASES))
def test_lists_of_traced_values_forward_mode_agrees_with_reverse_mode(name):
    f = LIST_CASES[name]
    v = np.array([0.5, -1.0, 0.25, 2.0])
    _, tangent = gt.jvp(f, (X,), (v,))
    np.testing.assert_allclose(tangent, gt.grad(f)(X) @ v, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", compile_backends())
@pytest.mark.parametrize("name", ["mean", "std", "norm", "dot_plain_weights", "median", "det"])
def test_lists_of_traced_values_compile(name, backend):
    f = LIST_CASES[name]
    compiled = gt.compile(gt.value_and_grad(f), backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gt.NativeFallbackWarning)
        for x in (X, X[::-1].copy(), X + 0.5):
            value, grad = compiled(x)
            np.testing.assert_allclose(value, f(x), rtol=1e-12)
            np.testing.assert_allclose(grad, gt.grad(f)(x), rtol=1e-10, atol=1e-14)


def test_lists_of_traced_values_second_derivatives():
    f = LIST_CASES["norm"]
    hess = gt.hessian(f)(X)
    grad = gt.grad(f)
    h = 1e-6
    numeric = np.stack(
        [(grad(X + h * e) - grad(X - h * e)) / (2 * h) for e in np.eye(len(X))], axis=1
    )
    np.testing.assert_allclose(hess, numeric, rtol=1e-6, atol=1e-8)


def test_the_values_are_numpys_and_plain_lists_are_untouched():
    for name, f in LIST_CASES.items():
        value = gt.value_and_grad(f)(X)[0]
        np.testing.assert_allclose(value, f(X), rtol=1e-13, err_msg=name)
    # outside a trace the same calls on plain lists run NumPy's own code
    assert np.mean([1.0, 2.0]) == 1.5
    assert np.concatenate([[1.0], (2.0, 3.0)]).tolist() == [1.0, 2.0, 3.0]
    assert np.linalg.norm([3.0, 4.0]) == 5.0


def test_a_plain_list_inside_a_trace_stays_a_constant():
    def f(x):
        return x[0] * np.mean([1.0, 2.0, 4.0]) + np.sum(np.stack([[1.0, 2.0], [3.0, 4.0]]))

    assert gt.grad(f)(X).tolist() == [7.0 / 3.0, 0.0, 0.0, 0.0]


def test_ufunc_with_a_traced_argument_stacks_a_list_argument():
    def f(x):
        return np.sum(np.add([x[0], 1.0], x[:2]) * np.multiply((x[2], x[3]), x[1:3]))

    assert_grad_matches(f, X, complex_step=False)


def test_ufunc_given_only_a_list_names_what_to_write():
    with pytest.raises(gt.GradtapeError, match=r"np\.exp\(np\.array\(\[a, b\]\)\)") as e:
        gt.grad(lambda x: np.sum(np.exp([x[0], x[1]])))(X)
    assert "test_array_likes.py" in str(e.value)
    # what it says to write works
    g = gt.grad(lambda x: np.sum(np.exp(np.array([x[0], x[1]]))))(X)
    np.testing.assert_allclose(g, [np.exp(X[0]), np.exp(X[1]), 0.0, 0.0])


def test_lists_with_shapes_numpy_refuses_raise_numpys_kind_of_error():
    with pytest.raises(ValueError, match="inhomogeneous"):
        gt.grad(lambda x: np.mean([x[:2], x[:3]]))(X)


def test_nested_levels_see_their_own_lists():
    # a list mixing values of two levels (grad of grad): stacked at the higher one
    def inner(y, x):
        return np.mean([y, x[0] * y]) ** 2

    def outer(x):
        return gt.grad(inner)(x[1], x)

    assert_grad_matches(outer, X, complex_step=False)


@settings(max_examples=25, deadline=None)
@given(
    count=st.integers(1, 4),
    shape=st.sampled_from([(), (1,), (3,), (2, 3)]),
    reduce=st.sampled_from(["mean", "std", "sum", "max", "prod", "norm"]),
    as_tuple=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_lists_of_any_shape_match_the_stacked_array(count, shape, reduce, as_tuple, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, *shape)) + 0.1
    reduction = {
        "mean": np.mean,
        "std": np.std,
        "sum": np.sum,
        "max": np.max,
        "prod": np.prod,
        "norm": lambda a: np.linalg.norm(np.ravel(a)) if np.ndim(a) > 2 else np.linalg.norm(a),
    }[reduce]

    def listed(x):
        items = [x[i] * (i + 1.0) for i in range(count)]
        return reduction(tuple(items) if as_tuple else items)

    def stacked(x):
        return reduction(np.stack([x[i] * (i + 1.0) for i in range(count)]))

    if reduce == "std" and count * int(np.prod(shape)) == 1:
        pass  # one element: covered by the std tests below
    np.testing.assert_allclose(listed(x), stacked(x), rtol=1e-12)
    np.testing.assert_allclose(gt.grad(listed)(x), gt.grad(stacked)(x), rtol=1e-10, atol=1e-12)


def test_numpy_dispatchers_are_wrapped_once_and_numpy_alone_when_asked():
    from gradtape import process

    gt.grad(lambda x: np.mean([x, x]))(1.0)
    wrapped = len(process._WRAPPED_DISPATCHERS)
    assert wrapped > 150  # np.mean's, np.dot's (multiarray.py), np.linalg.norm's, ...
    gt.grad(lambda x: np.mean([x, x]))(1.0)
    assert len(process._WRAPPED_DISPATCHERS) == wrapped
    code = textwrap.dedent(
        """
        import numpy as np, gradtape as gt
        try:
            gt.grad(lambda x: np.mean([x, x]))(1.0)
        except gt.GradtapeError:
            print("refused")
        """
    )
    env = dict(os.environ, PYTHONPATH=SRC, GRADTAPE_PATCH_NUMPY="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "refused", out.stderr


# --- np.r_ and np.c_ -------------------------------------------------------------------------
A = np.arange(6.0).reshape(3, 2) / 7.0
C = np.linspace(-1.0, 1.0, 6).reshape(3, 2)

INDEX_TRICKS = {
    "r_one": (lambda x: np.r_[x], A),
    "r_twice": (lambda x: np.r_[x, x], A),
    "r_constant": (lambda x: np.r_[x, C, x], A),
    "r_slice": (lambda x: np.r_[x, np.ones(2), 1:5, 0:1:3j], X),
    "r_scalars": (lambda x: np.r_[x[0], 2.5, x[1:3], x[3]], X),
    "r_directive_axis": (lambda x: np.r_["-1", x, C], A),
    "r_directive_ndmin": (lambda x: np.r_["0,2", x, x[::-1]], X),
    "r_directive_trans": (lambda x: np.r_["0,2,0", x, x * 2.0], X),
    "c_": (lambda x: np.c_[x, C, x], A),
    "c_vectors": (lambda x: np.c_[x, x**2, np.ones(4)], X),
}


@pytest.mark.parametrize("name", sorted(INDEX_TRICKS))
def test_index_tricks_concatenate_traced_values(name):
    f, x = INDEX_TRICKS[name]
    expected = f(x)
    value, vjp = gt.vjp(f, x)
    assert value.shape == expected.shape and value.dtype == expected.dtype
    np.testing.assert_array_equal(value, expected)
    cotangent = np.random.default_rng(1).normal(size=expected.shape)

    def scalar(y):
        return np.sum(f(y) * cotangent)

    np.testing.assert_allclose(
        vjp(cotangent)[0], central_difference_grad(scalar, (x,), 0), rtol=1e-7, atol=1e-9
    )
    tangent = np.random.default_rng(2).normal(size=x.shape)
    _, jvp_out = gt.jvp(f, (x,), (tangent,))
    np.testing.assert_allclose(np.sum(jvp_out * cotangent), np.sum(vjp(cotangent)[0] * tangent))


@pytest.mark.parametrize("backend", compile_backends())
def test_index_tricks_compile(backend):
    def f(x):
        return np.sum(np.r_[x, 1:3, x**2] * np.arange(10.0)) + np.sum(np.c_[x, x] ** 3)

    compiled = gt.compile(gt.value_and_grad(f), backend=backend)
    for x in (X, X + 1.0):
        value, grad = compiled(x)
        np.testing.assert_allclose(value, f(x), rtol=1e-12)
        np.testing.assert_allclose(grad, central_difference_grad(f, (x,), 0), rtol=1e-7)


def test_index_tricks_matrix_forms_are_refused_by_name():
    with pytest.raises(gt.GradtapeError, match=r"np\.r_\['r'.*np\.matrix.*np\.concatenate") as e:
        gt.grad(lambda x: np.sum(np.r_["r", x, x]))(X)
    assert "test_array_likes.py" in str(e.value)
    with pytest.raises(gt.GradtapeError, match=r"np\.c_\['c'"):
        gt.grad(lambda x: np.sum(np.c_["c", x, x]))(X)


def test_index_tricks_of_constants_are_plain_arrays():
    assert gt.grad(lambda x: np.sum(x[np.r_[0, 2:4]]))(X).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert np.r_[1:3, 5].tolist() == [1, 2, 5]


# --- casts to NumPy scalar types, float(), np.append of a list --------------------------------
def test_integer_cast_of_a_traced_array_is_a_guarded_constant():
    """np.int64(W[:, -1]) as indices: zero derivative (as autograd), and a compiled function
    checks the cast's value on every call."""

    def f(w):
        rows = np.int64(w[:, -1])
        assert rows.dtype == np.int64
        return np.sum(w[:, :-1][rows] ** 2)

    w = np.random.default_rng(0).normal(size=(5, 4))
    w[:, -1] = [0.5, 1.5, 2.5, 3.5, 4.5]  # central differences stay on one side of an integer
    w2 = w.copy()
    w2[:, -1] = [4.5, 4.5, 0.5, 0.5, 1.5]
    assert_grad_matches(f, w, complex_step=False)
    compiled = gt.compile(gt.value_and_grad(f), backend="numpy")
    for v in (w, w2, w):
        value, grad = compiled(v)
        np.testing.assert_allclose(value, f(v))
        np.testing.assert_allclose(grad, gt.grad(f)(v))
    assert "guard value" in str(gt.trace(f, w))


def test_float_casts_of_traced_values_name_the_line_and_what_to_write():
    with pytest.raises(gt.GradtapeError, match=r"float\(\).*cut the gradient") as e:
        gt.grad(lambda x: float(x[0]) * x[1])(X)
    assert "test_array_likes.py" in str(e.value)
    with pytest.raises(gt.GradtapeError, match=r"x\.astype\(np\.float32\)") as e:
        gt.grad(lambda x: np.sum(np.float32(x)))(X)
    assert "test_array_likes.py" in str(e.value)
    # what it says to write keeps the gradient
    assert gt.grad(lambda x: np.sum(x.astype(np.float32)))(X).tolist() == [1.0] * 4


def test_int_of_a_traced_scalar_records_a_guard():
    def f(x):
        return x[int(x[3] > 0.0)] * 2.0

    assert gt.grad(f)(X).tolist() == [0.0, 2.0, 0.0, 0.0]
    assert "guard" in str(gt.trace(f, X))


def test_append_with_respect_to_a_list():
    """autograd's check_grads(np.append)([1., 2., 3.], 4.): the gradient of a list is a list."""

    def f(a, b):
        return np.sum(np.append(a, b) * np.array([1.0, 2.0, 3.0, 4.0]))

    ga, gb = gt.grad(f, argnums=(0, 1))([1.0, 2.0, 3.0], 4.0)
    assert [float(g) for g in ga] == [1.0, 2.0, 3.0] and gb == 4.0

    def g2(a, b):
        return np.sum(np.append(a, b, axis=0) ** 2)

    ga, gb = gt.grad(g2, argnums=(0, 1))([[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]])
    assert np.asarray(ga).tolist() == [[2.0, 4.0], [6.0, 8.0]]
    assert np.asarray(gb).tolist() == [[10.0, 12.0]]


# --- np.std over one element ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("f", "x"),
    [
        (np.std, 3.5),
        (np.std, np.array(0.7)),
        (lambda d: np.sum(np.std(d, axis=0)), np.array([[0.3, -1.0, 2.0]])),
        (lambda d: np.sum(np.std(d, axis=1, keepdims=True)), np.array([[0.3], [2.0]])),
    ],
)
def test_std_over_one_element_has_zero_derivatives_to_second_order(f, x):
    """The deviation of one element from its mean is 0 whatever the element: the standard
    deviation is constant, and its derivatives are exactly 0 (autograd's too; JAX gives NaN)."""
    grad = gt.grad(f)(x)
    assert np.all(np.asarray(grad) == 0.0)
    hess = gt.hessian(f)(x)
    assert np.all(np.asarray(hess) == 0.0)
    tangent = np.ones_like(np.asarray(x, dtype=float))
    assert np.all(np.asarray(gt.jvp(gt.grad(f), (x,), (tangent,))[1]) == 0.0)
    np.testing.assert_array_equal(gt.value_and_grad(f)(x)[0], f(x))


def test_std_keeps_numpys_value_and_nan_where_it_is_not_differentiable():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert np.isnan(gt.value_and_grad(np.std)(np.inf)[0])  # NumPy's NaN for inf - inf
        # several equal elements: a cone, no derivative (NaN, as JAX and autograd give)
        assert np.all(np.isnan(gt.grad(np.std)(np.ones(3))))
    # one element with ddof=1 is NumPy's NaN (no degrees of freedom left)
    with pytest.warns(RuntimeWarning):
        assert np.isnan(gt.value_and_grad(lambda x: np.std(x, ddof=1))(np.ones(1))[0])
    # away from zero variance it is the usual gradient
    assert_grad_matches(lambda x: np.std(x, axis=0)[1], np.arange(6.0).reshape(3, 2) ** 1.5)


def test_lists_and_index_tricks_under_vmap():
    xs = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(gt.vmap(lambda x: np.mean([x, 2 * x, 1.0]))(xs), (3 * xs + 1) / 3)
    norms = gt.vmap(gt.grad(lambda x: np.linalg.norm([x, 2 * x, 1.0])))(xs)
    np.testing.assert_allclose(norms, 5 * xs / np.sqrt(5 * xs**2 + 1))
    rows = gt.vmap(lambda x: np.sum(np.r_[x, 0:2] ** 2))(np.ones((3, 2)))
    np.testing.assert_allclose(rows, [3.0, 3.0, 3.0])


def test_wrapping_a_dispatcher_twice_leaves_it_as_it_is():
    # a first trace interrupted (Ctrl-C) while it wraps NumPy's dispatchers is finished by the
    # next one: functions wrapped already are left alone (wrapping again was a SyntaxError)
    from gradtape import process

    gt.grad(lambda x: np.mean([x[0], x[1]]))(np.ones(2))  # the first trace wraps them
    wrapped = process._WRAPPED_DISPATCHERS[:20]
    codes = [fn.__code__ for fn in wrapped]
    assert all(process._wrap_dispatcher(fn) for fn in wrapped)
    assert [fn.__code__ for fn in wrapped] == codes
    g = gt.grad(lambda x: np.mean([x[0], x[1] * 2.0]))(np.ones(2))
    np.testing.assert_allclose(g, [0.5, 1.0])
    assert np.mean([1.0, 2.0]) == 1.5
