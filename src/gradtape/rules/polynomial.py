"""Polynomials: np.polyval and the poly* functions, and the evaluation functions of
np.polynomial (polyval, chebval, legval, hermval, hermeval, lagval, and Polynomial(c)(x) and
its kin, whose domain mapping is routed here).

Each is NumPy's own recurrence (Horner, Clenshaw) written again with the same operations in
the same order, so the value is NumPy's and the coefficients and the points are both
differentiable. np.polynomial's functions are Python functions that convert their arguments
with np.array; gradtape reaches them through `implements_module_function` (see
gradtape/process.py), and a call without traced arguments goes to NumPy unchanged.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.routes import implements, implements_module_function
from ._util import dtype_of, ndim_of, shape_of


def _traced(x) -> bool:
    return hasattr(x, "_var")


def _array(x):
    return x if _traced(x) else np.asanyarray(x)


def _no_complex(name, *xs):
    if any(dtype_of(_array(x)).kind == "c" for x in xs):
        raise GradtapeError(
            f"np.{name} of complex values cannot be traced: gradtape differentiates real functions."
        )


# --- np.polyval and the poly* functions ------------------------------------------------------
@implements(np.polyval)
def polyval(p, x):
    """np.polyval: Horner's rule, as NumPy writes it (differentiable in p and x)."""
    if isinstance(x, np.poly1d):
        raise GradtapeError("np.polyval with a poly1d as x cannot be traced.")
    p, x = _array(p), _array(x)
    _no_complex("polyval", p, x)
    y = np.zeros_like(x)
    for k in range(shape_of(p)[0] if ndim_of(p) else 1):
        y = y * x + (p[k] if ndim_of(p) else p)
    return y


@implements(np.polyfit)
def polyfit(x, y, deg, rcond=None, full=False, w=None, cov=False):
    """np.polyfit as NumPy computes it (Vandermonde columns scaled to unit norm, least squares
    with NumPy's cutoff), differentiable in x, y and w. With `full=True` it also returns
    (residuals, rank, singular values, rcond); `cov=` has no rule."""
    if cov:
        raise GradtapeError(
            "np.polyfit(cov=...) has no derivative rule; compute the fit's covariance from the "
            "Vandermonde matrix (np.vander) and the residuals instead."
        )
    x, y = _array(x), _array(y)
    _no_complex("polyfit", x, y, *(() if w is None else (w,)))
    order = int(deg) + 1
    if deg < 0:
        raise ValueError("expected deg >= 0")
    if ndim_of(x) != 1:
        raise TypeError("expected 1D vector for x")
    if shape_of(x)[0] == 0:
        raise TypeError("expected non-empty vector for x")
    if ndim_of(y) < 1 or ndim_of(y) > 2:
        raise TypeError("expected 1D or 2D array for y")
    if shape_of(x)[0] != shape_of(y)[0]:
        raise TypeError("expected x and y to have same length")
    dt = np.result_type(dtype_of(x), dtype_of(y), np.float64)
    x = x.astype(dt) if dtype_of(x) != dt else x
    if rcond is None:
        rcond = shape_of(x)[0] * np.finfo(dt).eps
    lhs = np.vander(x, order)
    rhs = y
    if w is not None:
        w = _array(w)
        if ndim_of(w) != 1:
            raise TypeError("expected a 1-d array for weights")
        if shape_of(w)[0] != shape_of(y)[0]:
            raise TypeError("expected w and y to have the same length")
        lhs = lhs * w[:, None]
        rhs = rhs * (w if ndim_of(rhs) == 1 else w[:, None])
    scale = np.sqrt(np.sum(lhs * lhs, axis=0))
    c, residuals, rank, s = np.linalg.lstsq(lhs / scale, rhs, rcond=rcond)
    c = (c.T / scale).T
    if rank != order and not full:
        import warnings

        warnings.warn("Polyfit may be poorly conditioned", np.exceptions.RankWarning, stacklevel=2)
    if full:
        return c, residuals, rank, s, rcond
    return c


@implements(np.polyder)
def polyder(p, m=1):
    """np.polyder: the coefficients times their powers."""
    m = int(m)
    if m < 0:
        raise ValueError("Order of derivative must be positive (see polyint)")
    p = _array(p)
    if m == 0:
        return p
    n = shape_of(p)[0] - 1
    return polyder(p[:-1] * np.arange(n, 0, -1), m - 1)


@implements(np.polyint)
def polyint(p, m=1, k=None):
    """np.polyint: the coefficients divided by their powers, integration constants appended."""
    m = int(m)
    if m < 0:
        raise ValueError("Order of integral must be positive (see polyder)")
    if k is None:
        k = np.zeros(m, float)
    k = np.atleast_1d(k)
    if shape_of(k)[0] == 1 and m > 1:
        k = k[0] * np.ones(m, float)
    if shape_of(k)[0] < m:
        raise ValueError("k must be a scalar or a rank-1 array of length 1 or >m.")
    p = _array(p)
    if m == 0:
        return p
    y = np.concatenate((p / np.arange(shape_of(p)[0], 0, -1), k[:1]))
    return polyint(y, m - 1, k=k[1:])


def _poly_combine(a1, a2, op):
    a1, a2 = np.atleast_1d(_array(a1)), np.atleast_1d(_array(a2))
    diff = shape_of(a2)[0] - shape_of(a1)[0]
    if diff > 0:
        a1 = np.concatenate((np.zeros(diff, dtype_of(a1)), a1))
    elif diff < 0:
        a2 = np.concatenate((np.zeros(-diff, dtype_of(a2)), a2))
    return op(a1, a2)


implements(np.polyadd)(lambda a1, a2: _poly_combine(a1, a2, np.add))
implements(np.polysub)(lambda a1, a2: _poly_combine(a1, a2, np.subtract))
implements(np.polymul)(
    lambda a1, a2: np.convolve(np.atleast_1d(_array(a1)), np.atleast_1d(_array(a2)))
)


@implements(np.polydiv)
def polydiv(u, v):
    """np.polydiv: NumPy's long division (the leading zeros of the remainder are trimmed as
    NumPy trims them; that choice records a guard)."""
    u = np.atleast_1d(_array(u)) + 0.0
    v = np.atleast_1d(_array(v)) + 0.0
    m, n = shape_of(u)[0] - 1, shape_of(v)[0] - 1
    scale = 1.0 / v[0]
    q = np.zeros((max(m - n + 1, 1),), np.result_type(dtype_of(u), dtype_of(v)))
    if _traced(u) or _traced(v):
        q = q + 0 * (u[0] + v[0])  # a traced array to write into
    r = u
    for k in range(m - n + 1):
        d = scale * r[k]
        q[k] = d
        r = np.concatenate([r[:k], r[k : k + n + 1] - d * v, r[k + n + 1 :]])
    while bool(np.isclose(r[0], 0, rtol=1e-14)) and shape_of(r)[-1] > 1:
        r = r[1:]
    return q, r


@implements(np.poly)
def poly(seq_of_zeros):
    """np.poly of roots (1-D): the product of the factors (x - root), by convolution."""
    seq = np.atleast_1d(_array(seq_of_zeros))
    if ndim_of(seq) != 1:
        raise GradtapeError(
            "np.poly of a matrix uses its eigenvalues, which cannot be traced; pass the roots."
        )
    _no_complex("poly", seq)
    a = np.ones((1,), dtype_of(seq) if dtype_of(seq).kind == "f" else np.float64)
    for k in range(shape_of(seq)[0]):
        a = np.convolve(a, np.stack([np.ones((), dtype_of(a)), -seq[k]]), mode="full")
    return a


# --- np.polynomial's evaluation functions ------------------------------------------------------
def _coefficients(c, x, tensor):
    c = np.atleast_1d(_array(c))
    if dtype_of(c).kind in "biu":
        c = c.astype(np.float64)
    if isinstance(x, (tuple, list)):
        x = np.asarray(x)
    _no_complex("polynomial", c, _array(x))
    if (isinstance(x, np.ndarray) or _traced(x)) and tensor:
        c = np.reshape(c, shape_of(c) + (1,) * ndim_of(x))
    return c, x


@implements_module_function("numpy.polynomial.polynomial", "polyval")
def polynomial_polyval(x, c, tensor=True):
    """np.polynomial.polynomial.polyval: Horner's rule, as NumPy writes it."""
    c, x = _coefficients(c, x, tensor)
    c0 = c[-1] + x * 0
    for i in range(2, shape_of(c)[0] + 1):
        c0 = c[-i] + c0 * x
    return c0


def _clenshaw(step, finish, prepare=None):
    def val(x, c, tensor=True):
        c, x = _coefficients(c, x, tensor)
        aux = prepare(x) if prepare is not None else x
        n = shape_of(c)[0]
        if n == 1:
            c0, c1 = c[0], 0
        elif n == 2:
            c0, c1 = c[0], c[1]
        else:
            nd = n
            c0, c1 = c[-2], c[-1]
            for i in range(3, n + 1):
                nd = nd - 1
                c0, c1 = step(c[-i], c0, c1, x, aux, nd)
        return finish(c0, c1, x, aux)

    return val


implements_module_function("numpy.polynomial.chebyshev", "chebval")(
    _clenshaw(
        lambda ci, c0, c1, x, x2, nd: (ci - c1, c0 + c1 * x2),
        lambda c0, c1, x, x2: c0 + c1 * x,
        prepare=lambda x: 2 * x,
    )
)
implements_module_function("numpy.polynomial.legendre", "legval")(
    _clenshaw(
        lambda ci, c0, c1, x, _, nd: (ci - c1 * ((nd - 1) / nd), c0 + c1 * x * ((2 * nd - 1) / nd)),
        lambda c0, c1, x, _: c0 + c1 * x,
    )
)
implements_module_function("numpy.polynomial.hermite", "hermval")(
    _clenshaw(
        lambda ci, c0, c1, x, x2, nd: (ci - c1 * (2 * (nd - 1)), c0 + c1 * x2),
        lambda c0, c1, x, x2: c0 + c1 * x2,
        prepare=lambda x: x * 2,
    )
)
implements_module_function("numpy.polynomial.hermite_e", "hermeval")(
    _clenshaw(
        lambda ci, c0, c1, x, _, nd: (ci - c1 * (nd - 1), c0 + c1 * x),
        lambda c0, c1, x, _: c0 + c1 * x,
    )
)
implements_module_function("numpy.polynomial.laguerre", "lagval")(
    _clenshaw(
        lambda ci, c0, c1, x, _, nd: (
            ci - (c1 * (nd - 1)) / nd,
            c0 + (c1 * ((2 * nd - 1) - x)) / nd,
        ),
        lambda c0, c1, x, _: c0 + c1 * (1 - x),
    )
)


@implements_module_function("numpy.polynomial.polyutils", "mapdomain")
def mapdomain(x, old, new):
    """The domain mapping of Polynomial(c)(x) and its kin: off + scl * x."""
    from numpy.polynomial.polyutils import mapparms

    off, scl = mapparms(old, new)
    return off + scl * x
