"""scipy.optimize and scipy.integrate helpers used inside losses.

`rosen`, `rosen_der`, `trapezoid` and `simpson` need no rule: they
convert their input with `np.asarray` (passed through, see rules/conversion.py) and compute
with NumPy. `rosen_hess` and `rosen_hess_prod` write traced values into a plain array made
with `np.zeros`, which cannot be traced: they get the versions below (the same formulas,
assembled with `np.concatenate` and `np.diag`).
"""

from __future__ import annotations

import numpy as np

from ..core.routes import implements_module_function


def _hess_diagonal(x):
    first = np.reshape(1200 * x[0] ** 2 - 400 * x[1] + 2, (1,))
    middle = 202 + 1200 * x[1:-1] ** 2 - 400 * x[2:]
    return np.concatenate([first, middle, np.array([200.0])])


def rosen_hess(x):
    """The Hessian of the Rosenbrock function (scipy.optimize.rosen_hess) on traced values."""
    x = np.atleast_1d(x)
    off = -400 * x[:-1]
    return np.diag(off, 1) + np.diag(off, -1) + np.diag(_hess_diagonal(x))


def rosen_hess_prod(x, p):
    """The Rosenbrock Hessian times p (scipy.optimize.rosen_hess_prod) on traced values."""
    x = np.atleast_1d(x)
    diagonal = _hess_diagonal(x)
    off = -400 * x[:-1]
    below = np.concatenate([np.zeros(1), off * p[:-1]])
    above = np.concatenate([off * p[1:], np.zeros(1)])
    return diagonal * p + below + above


for _module in ("scipy.optimize", "scipy.optimize._optimize"):
    implements_module_function(_module, "rosen_hess")(rosen_hess)
    implements_module_function(_module, "rosen_hess_prod")(rosen_hess_prod)


def cumulative_trapezoid(y, x=None, dx=1.0, axis=-1, initial=None):
    """scipy.integrate.cumulative_trapezoid on traced values (SciPy's goes through an array-API
    namespace that does not know a Tracer)."""
    y = np.moveaxis(y, axis, -1)
    if x is None:
        d = dx
    else:
        if np.ndim(x) == 1:
            d = x[1:] - x[:-1]
        else:
            x = np.moveaxis(x, axis, -1)
            d = x[..., 1:] - x[..., :-1]
    res = np.cumsum(d * (y[..., 1:] + y[..., :-1]) / 2.0, axis=-1)
    if initial is not None:
        if initial != 0:
            raise ValueError("`initial` must be `None` or `0`.")
        zero = np.zeros(np.shape(res)[:-1] + (1,))
        res = np.concatenate([zero, res], axis=-1)
    return np.moveaxis(res, -1, axis)


for _module in ("scipy.integrate", "scipy.integrate._quadrature"):
    implements_module_function(_module, "cumulative_trapezoid")(cumulative_trapezoid)
