"""scipy.stats.wishart and invwishart on traced values: SciPy's values, gradients in the
matrices, the scale and the degrees of freedom against central differences (every entry,
as SciPy's functions read them), forward against reverse mode, frozen distributions, stacks
of matrices, SciPy's shape conventions and errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import central_difference_grad

import gradtape as gt

st = pytest.importorskip("scipy.stats")

RNG = np.random.default_rng(0)
_A, _B = RNG.normal(size=(3, 3)), RNG.normal(size=(3, 3))
X = _A @ _A.T + 3 * np.eye(3)
S = _B @ _B.T + np.eye(3)


def _cases(dist):
    return {
        "x": (lambda x: dist.logpdf(x, 5.0, S), X),
        "scale": (lambda b: dist.logpdf(X, 5.0, b @ b.T + np.eye(3)), _B),
        "df": (lambda df: dist.logpdf(X, df, S), 5.5),
        "frozen_pdf": (lambda b: 1e3 * dist(6, b @ b.T + np.eye(3)).pdf(X), _B),
        "stack": (lambda x: np.sum(dist.logpdf(np.stack([x, x + np.eye(3)], -1), 5.0, S)), X),
        "diagonal_scale": (lambda s: dist.logpdf(X, 5.0, np.exp(s)), np.array([0.1, -0.2, 0.3])),
        "one_dimension": (lambda s: np.sum(dist.logpdf(np.array([0.5, 2.0]), 3.0, np.exp(s))), 0.3),
    }


@pytest.mark.parametrize("case", list(_cases(st.wishart)))
@pytest.mark.parametrize("name", ["wishart", "invwishart"])
def test_values_and_gradients(name, case):
    f, x0 = _cases(getattr(st, name))[case]
    value, grad = gt.value_and_grad(f)(x0)
    np.testing.assert_allclose(value, f(x0), rtol=1e-12)
    np.testing.assert_allclose(grad, central_difference_grad(f, (x0,), 0), rtol=1e-6, atol=1e-9)
    direction = np.ones_like(np.asarray(x0, float))
    _, tangent = gt.jvp(f, (np.asarray(x0, float),), (direction,))
    np.testing.assert_allclose(tangent, np.sum(grad * direction), rtol=1e-9)


def test_errors_are_scipys():
    with pytest.raises(ValueError, match="greater than the dimension"):
        gt.grad(lambda df: st.wishart.logpdf(X, df, S))(1.5)
    with pytest.raises(np.linalg.LinAlgError):
        gt.grad(lambda x: st.invwishart.logpdf(x, 5.0, S))(-X)
    with pytest.raises(ValueError, match="Degrees of freedom must be a scalar"):
        gt.grad(lambda s: st.wishart.logpdf(X, [5.0, 6.0], s))(S)
