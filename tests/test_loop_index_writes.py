"""Writes at a loop counter inside fori_loop and scan: `np.add.at(y, i, v)`, the other
ufuncs' `.at`, and `y[i] = v`, compiled (the counter is an input of the recorded
instruction, not the value it had while the body was recorded) against eager and against
central differences."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import central_difference_grad, compile_backends

import gradtape as gt

X = np.array([0.7, 1.3, 0.4, 0.9])

INDEX_FORMS = {  # name: (index at counter i, shape of the carried array)
    "i": (lambda i: i, (4,)),
    "(i,)": (lambda i: (i,), (4,)),
    "(i, slice)": (lambda i: (i, slice(None)), (4, 2)),
}


def _objective(ufunc: str, index, shape):
    def f(x):
        def body(i, acc):
            y = acc.copy()
            getattr(np, ufunc).at(y, index(i), x[i])
            return y * 1.1

        return np.sum(gt.fori_loop(0, 4, body, np.full(shape, 1.5)) ** 2)

    return f


@pytest.mark.parametrize("backend", compile_backends())
@pytest.mark.parametrize("form", INDEX_FORMS)
@pytest.mark.parametrize("ufunc", ["add", "subtract", "multiply", "maximum"])
def test_ufunc_at_a_loop_counter(ufunc, form, backend):
    f = _objective(ufunc, *INDEX_FORMS[form])
    eager = gt.grad(f)(X)
    np.testing.assert_allclose(eager, central_difference_grad(f, (X,), 0), rtol=1e-6, atol=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = gt.compile(gt.value_and_grad(f), backend=backend)
        for x in (X, X[::-1].copy()):
            value, grad = compiled(x)
            np.testing.assert_allclose(value, f(x), rtol=1e-12)
            np.testing.assert_allclose(grad, gt.grad(f)(x), rtol=1e-12)


@pytest.mark.parametrize("backend", compile_backends())
def test_add_at_a_counter_in_a_scan(backend):
    def f(x):
        def step(acc, xi_i):
            xi, i = xi_i
            y = acc.copy()
            np.add.at(y, i, xi**2)
            return y, np.sum(y)

        _, ys = gt.scan(step, np.zeros(4), (x, np.arange(4)))
        return np.sum(ys)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grad = gt.compile(gt.grad(f), backend=backend)(X)
    np.testing.assert_allclose(grad, central_difference_grad(f, (X,), 0), rtol=1e-6)
