"""scipy.interpolate.CubicSpline (and evaluating any PPoly) on traced values.

A cubic spline's coefficients are a linear function of the values `y` (and of the
derivatives a clamped end condition gives): SciPy computes them with a banded solve that
writes into plain arrays, and evaluates the piecewise polynomial in compiled code, both of
which would cut the gradient. Here, for traced `y`, the coefficients are SciPy's own spline
of each unit vector (computed once per construction, on plain arrays) contracted with `y`,
so they are SciPy's to rounding and their derivatives exact; and a PPoly whose coefficients
or evaluation points are traced is evaluated with NumPy (Horner's rule in the interval each
point falls in, the intervals half-open as SciPy's, the last one closed). Derivatives of the
spline (`nu`) are supported; antiderivatives (`nu < 0`), traced knots and decreasing
breakpoints raise an error that says so.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GradtapeError
from ..core.routes import implements_module_function
from ._util import shape_of


def _is_traced(value) -> bool:
    return hasattr(value, "_var")


def _plain_bc(bc_type, columns: int):
    """bc_type with every given derivative value set to 0 for `columns` unit vectors (the
    spline's linear part), and bc_type as given (its affine part, None if it has no values);
    refuses traced values."""
    if isinstance(bc_type, str):
        return bc_type, None
    ends = []
    for end in bc_type:
        if isinstance(end, str):
            ends.append(end)
            continue
        order, value = end
        if _is_traced(value):
            raise GradtapeError(
                "scipy.interpolate.CubicSpline: a traced derivative value in bc_type is not "
                "supported; pass a constant (gradtape.stop_gradient), or add the end "
                "condition's effect yourself"
            )
        ends.append((order, np.zeros(columns)))
    return tuple(ends), bc_type


@implements_module_function("scipy.interpolate._cubic", "CubicSpline.__init__")
def cubic_spline_init(self, x, y, axis=0, bc_type="not-a-knot", extrapolate=None):
    """CubicSpline(x, y) with traced values y: SciPy's spline of each unit vector, contracted."""
    from scipy.interpolate import CubicSpline

    build = CubicSpline.__init__.__gradtape_original__
    if _is_traced(x):
        raise GradtapeError(
            "scipy.interpolate.CubicSpline: traced knots x are not supported (the spline is "
            "differentiated in its values y); pass the knots as a constant array"
        )
    y = np.asarray(y)
    values = np.moveaxis(y, axis % y.ndim, 0)  # (n, ...rest)
    n = shape_of(values)[0]
    periodic = bc_type == "periodic" or (
        not isinstance(bc_type, str) and any(e == "periodic" for e in bc_type)
    )
    free = n - 1 if periodic else n  # periodic: y[-1] is y[0]
    basis = np.eye(n)[:free]
    if periodic:
        if not bool(np.all(values[0] == values[-1])):
            raise ValueError(
                "The first and last `y` point along axis must be identical (within machine "
                "precision) when bc_type='periodic'."
            )
        basis[0, -1] = 1.0
    linear_bc, given_bc = _plain_bc(bc_type, free)
    unit = object.__new__(CubicSpline)
    build(unit, x, basis.T, axis=0, bc_type=linear_bc, extrapolate=extrapolate)
    _copy_state(unit, self)
    # (4, n - 1, free) against (free, ...rest)
    coefficients = np.tensordot(unit._c, values[:free], axes=([2], [0]))
    if given_bc is not None:
        offset = object.__new__(CubicSpline)
        zeros = np.zeros((n, *shape_of(values)[1:]))
        build(offset, x, zeros, axis=0, bc_type=given_bc, extrapolate=extrapolate)
        coefficients = coefficients + offset._c
    self._c = coefficients
    self.axis = axis % y.ndim


def _copy_state(source, target) -> None:
    """Every attribute of a spline: its slots (SciPy's PPoly keeps its state in slots) and
    its instance dictionary."""
    for cls in type(source).__mro__:
        for name in cls.__dict__.get("__slots__", ()):
            if hasattr(source, name):
                setattr(target, name, getattr(source, name))
    target.__dict__.update(getattr(source, "__dict__", {}))


def _falling_factorial(p: int, nu: int) -> int:
    return math.prod(range(p - nu + 1, p + 1))


@implements_module_function("scipy.interpolate._interpolate", "PPoly.__call__")
def ppoly_call(self, x, nu=0, extrapolate=None):
    """PPoly(x) with traced coefficients or points: Horner's rule in each point's interval."""
    if extrapolate is None:
        extrapolate = self.extrapolate
    if nu < 0:
        raise GradtapeError(
            "scipy.interpolate.PPoly: nu < 0 (an antiderivative) on traced values is not "
            "supported; integrate the spline with .antiderivative() outside the traced code"
        )
    breaks = np.asarray(self._x)
    if _is_traced(breaks) or (breaks.size > 1 and breaks[-1] < breaks[0]):
        raise GradtapeError(
            "scipy.interpolate.PPoly: traced or decreasing breakpoints are not supported on "
            "traced values; use constant, increasing breakpoints"
        )
    x = np.asarray(x)
    x_shape = shape_of(x)
    flat = np.reshape(x, (-1,))
    if extrapolate == "periodic":
        flat = breaks[0] + (flat - breaks[0]) % (breaks[-1] - breaks[0])
        extrapolate = False
    c = self._c
    k, m = shape_of(c)[:2]
    rest = shape_of(c)[2:]
    c = np.reshape(c, (k, m, -1))
    if nu >= k:
        values = np.zeros((shape_of(flat)[0], shape_of(c)[2])) * c[0, :1]
    else:
        if nu:
            factors = np.array([_falling_factorial(k - 1 - j, nu) for j in range(k - nu)], float)
            c = c[: k - nu] * factors[:, None, None]
        interval = np.clip(np.searchsorted(breaks, flat, side="right") - 1, 0, m - 1)
        offset = (flat - breaks[interval])[:, None]
        local = c[:, interval, :]  # (k - nu, points, rest)
        values = local[0]
        for j in range(1, shape_of(local)[0]):
            values = values * offset + local[j]
    if not extrapolate:
        inside = (flat >= breaks[0]) & (flat <= breaks[-1])
        values = np.where(inside[:, None], values, np.nan)
    out = np.reshape(values, x_shape + rest)
    if self.axis != 0:
        order = list(range(len(shape_of(out))))
        ndim_x = len(x_shape)
        order = order[ndim_x : ndim_x + self.axis] + order[:ndim_x] + order[ndim_x + self.axis :]
        out = np.transpose(out, order)
    return out
