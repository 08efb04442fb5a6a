"""np.asarray, np.array & co. on traced values: the Tracer passes through (rules/conversion.py,
installed by process.py), in eager, compiled and nested modes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import assert_grad_matches, central_difference_grad, compile_backends
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradtape as gt
from gradtape.core.tracing import current_levels

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def defensive(x):
    """A library function's first lines: convert, then compute."""
    x = np.asarray(x, dtype=float)
    y = np.asanyarray(x)
    z = np.ascontiguousarray(y)
    return np.sum(np.sin(np.array(z)) * np.asfortranarray(z))


def stacked(x):
    a = np.array([x[0], x[1] * 2.0, 3.0])
    b = np.array([[x[0], 1.0], (2.0, x[2])])
    c = np.array([x[:2], np.ones(2)])
    return np.sum(a**2) + np.sum(np.exp(b)) + np.sum(c * c) + np.sum(np.asarray((x[1], x[2])))


CASES = {
    "defensive": defensive,
    "stacked": stacked,
    "ndmin": lambda x: np.sum(np.array(x[0], ndmin=2) * np.array(x, copy=True, ndmin=2)),
    "chkfinite": lambda x: np.sum(np.asarray_chkfinite(x) ** 3),
}


@pytest.mark.parametrize("name", CASES)
def test_gradient_through_conversions(name):
    f = CASES[name]
    x = np.array([0.3, -1.2, 2.0])
    assert_grad_matches(f, x, complex_step=name != "defensive")  # (dtype=float drops the step)
    # forward mode against reverse
    _, t = gt.jvp(f, (x,), (np.array([1.0, 2.0, -1.0]),))
    np.testing.assert_allclose(t, gt.grad(f)(x) @ np.array([1.0, 2.0, -1.0]), rtol=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_conversions_compiled_and_nested(name):
    f = CASES[name]
    x = np.array([0.3, -1.2, 2.0])
    expected = gt.grad(f)(x)
    for backend in compile_backends():
        cf = gt.compile(gt.grad(f), backend=backend)
        np.testing.assert_allclose(cf(x), expected, rtol=1e-12)
        np.testing.assert_allclose(cf(x + 0.5), gt.grad(f)(x + 0.5), rtol=1e-12)
    h = gt.hessian(f)(x)
    hh = gt.jacfwd(gt.grad(f))(x)
    np.testing.assert_allclose(h, hh, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        gt.jacobian(gt.grad(f), mode="reverse")(x), h, rtol=1e-10, atol=1e-12
    )


@given(
    hnp.arrays(
        np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), elements=st.floats(-3, 3)
    ),
    st.sampled_from([None, np.float32, np.float64]),
)
def test_asarray_keeps_the_value_and_casts_like_numpy(x, dtype):
    def f(x):
        y = np.asarray(x, dtype=dtype)
        assert y.dtype == np.asarray(np.zeros(1, x.dtype), dtype=dtype).dtype
        return np.sum(y * y)

    g = gt.grad(f)(x)
    expected = 2 * np.asarray(x, dtype=dtype).astype(np.float64)
    np.testing.assert_allclose(g, expected, rtol=1e-6 if dtype == np.float32 else 1e-12)
    assert np.asarray(g).dtype == x.dtype


def test_lists_follow_numpy_promotion_and_shapes():
    def f(x):
        a = np.array([x[0], 1.0])  # float32 Tracer and a Python float: float32 (NEP 50)
        assert a.dtype == np.float32 and a.shape == (2,)
        b = np.array([[x[0]], [x[1]]], dtype=np.float64)
        assert b.dtype == np.float64 and b.shape == (2, 1)
        return np.sum(a) + np.sum(b)

    g = gt.grad(f)(np.array([1.0, 2.0], np.float32))
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, [2.0, 1.0])
    with pytest.raises(ValueError, match="inhomogeneous"):
        gt.grad(lambda x: np.sum(np.array([x[:2], x])))(np.ones(3))


def test_copy_is_a_new_value_and_asarray_is_the_same():
    def f(x):
        y = np.array(x)
        y[0] = 10.0  # functional write on the copy
        z = np.asarray(x)
        assert z is x
        return np.sum(y * x)

    np.testing.assert_allclose(gt.grad(f)(np.array([1.0, 2.0, 3.0])), [10.0, 4.0, 6.0])


def test_casts_that_cut_or_are_refused():
    # float -> int: the value is cut, as NumPy cuts it: no gradient through it
    g = gt.grad(lambda x: np.sum(x * np.asarray(x, dtype=int)))(np.array([1.5, 2.5]))
    np.testing.assert_array_equal(g, [1.0, 2.0])
    with pytest.raises(gt.GradtapeError, match="complex"):
        gt.grad(lambda x: np.sum(np.asarray(x, dtype=complex).real))(np.ones(2))
    with pytest.raises(gt.GradtapeError, match="object"):
        gt.grad(lambda x: np.sum(np.array([x[0], x[1]], dtype=object)))(np.ones(2))
    with pytest.raises(ValueError, match="infs or NaNs"):
        gt.grad(lambda x: np.sum(np.asarray_chkfinite(x / 0.0)))(np.ones(2))
    assert current_levels() == []


def test_plain_array_method_names_the_spelling_that_works():
    with pytest.raises(gt.GradtapeError, match=r"X @ w or np.dot\(X, w\)"):
        gt.grad(lambda w: np.sum(np.ones((2, 3)).dot(w)))(np.ones(3))
    # the spellings that work
    X = np.arange(6.0).reshape(2, 3)
    for f in (lambda w: np.sum(X @ w), lambda w: np.sum(np.dot(X, w))):
        np.testing.assert_allclose(gt.grad(f)(np.ones(3)), X.sum(axis=0))


def test_plain_calls_go_to_numpy_unchanged():
    x = np.arange(6.0).reshape(2, 3)
    assert np.asarray(x) is x
    assert np.asarray(x, float, "C") is x
    assert np.asarray(x, dtype=np.float32).dtype == np.float32
    assert np.array([1, 2], ndmin=3).shape == (1, 1, 2)
    assert np.asarray([[1.0, 2.0]], order="F").flags.f_contiguous
    assert np.ascontiguousarray(x.T).flags.c_contiguous
    assert np.asfortranarray(x).flags.f_contiguous
    assert np.array(x, copy=None) is x
    assert type(np.asanyarray(np.ma.masked_array([1.0]))) is np.ma.MaskedArray
    assert np.asarray.__gradtape_original__ is not np.asarray
    assert np.asarray.__name__ == "asarray" and np.asarray.__doc__


def test_lists_are_stacked_only_on_the_tracing_thread():
    import threading

    results = []

    def other():
        results.append(np.array([[1.0, 2.0]]).shape)

    def f(x):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        return np.sum(np.array([x, x]))

    np.testing.assert_array_equal(gt.grad(f)(np.ones(2)), [2.0, 2.0])
    assert results == [(1, 2)]


def _run(code: str, **env) -> str:
    full_env = dict(os.environ, PYTHONPATH=SRC, **env)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.native
def test_bindings_made_before_import_and_numba_imported_first():
    out = _run("""
        import numpy as np, numba
        from numpy import asarray as early  # bound before gradtape is imported

        @numba.njit
        def before(x):
            return np.asarray(x).sum()

        before(np.ones(2))  # Numba's overloads are keyed by NumPy's functions
        import gradtape as gt

        def f(x):
            return np.sum(early(x) ** 2)

        @numba.njit
        def after(x):
            return np.asarray(x).sum() + np.ascontiguousarray(x).sum()

        print(gt.grad(f)(np.ones(2)), early is np.asarray, after(np.ones(2)))
    """)
    assert out.split() == ["[2.", "2.]", "True", "4.0"]


def test_numpy_left_alone_on_request():
    out = _run(
        """
        import numpy as np, gradtape as gt
        assert not hasattr(np.asarray, "__gradtape_original__")
        try:
            gt.grad(lambda x: np.sum(np.asarray(x)))(np.ones(2))
        except gt.GradtapeError as e:
            print("refused")
    """,
        GRADTAPE_PATCH_NUMPY="0",
    )
    assert out.strip() == "refused"


def test_overhead_is_measured():
    from gradtape import process

    timings = process.constructor_overhead(repeat=1, number=1000)
    assert set(timings) == {
        "asarray",
        "asanyarray",
        "array",
        "ascontiguousarray",
        "asfortranarray",
        "asarray_chkfinite",
    }


# np.vectorize on traced values: the function per element (its branches see numbers)
def _kinked(a, b):
    return a * a * b if a > 0 else -a * b


def test_vectorize_branches_per_element_with_broadcasting():
    x = np.array([[0.5, -1.0, 2.0], [-0.3, 0.7, 1.5]])
    y = np.array([1.5, -0.5, 2.0])
    f = np.vectorize(_kinked)

    def loss(x, y):
        return np.sum(np.cos(np.arange(6.0)).reshape(2, 3) * f(x, y))

    value, (gx, gy) = gt.value_and_grad(loss, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(value, loss(x, y), rtol=1e-14)
    np.testing.assert_allclose(gx, central_difference_grad(loss, (x, y), 0), rtol=1e-7)
    np.testing.assert_allclose(gy, central_difference_grad(loss, (x, y), 1), rtol=1e-7)


def test_vectorize_excluded_otypes_and_tuples():
    x = np.array([0.5, 1.5, -2.0])
    power = np.vectorize(lambda a, p: a**p, excluded={1})
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(power(x, 3)))(x), 3 * x**2)
    single = np.vectorize(lambda a: a * 2.0, otypes=[np.float32])
    out = gt.vjp(single, x)[0]
    assert out.dtype == np.float32
    pair = np.vectorize(lambda a: (a * a, 3.0 * a))
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(pair(x)[0] + pair(x)[1]))(x), 2 * x + 3.0)
    for backend in compile_backends():
        compiled = gt.compile(
            gt.grad(lambda x: np.sum(np.vectorize(_kinked)(x, 2.0))), backend=backend
        )
        np.testing.assert_allclose(compiled(x), np.where(x > 0, 4 * x, -2.0))


def test_vectorize_with_a_signature_is_refused():
    f = np.vectorize(lambda v: v.sum(), signature="(n)->()")
    with pytest.raises(gt.GradtapeError, match="signature"):
        gt.grad(lambda x: np.sum(f(x)))(np.ones((2, 3)))
