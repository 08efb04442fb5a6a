"""NumPy's elementwise functions written in Python (not ufuncs): sinc, i0, nan_to_num, fix,
angle, imag, isreal, iscomplex, real_if_close, piecewise.

sinc and i0 are primitives whose value is NumPy's own and whose derivative is declared (so it
is exact at 0 too, to every order); the others are compositions of rules.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GradtapeError
from ..core.routes import implements
from ..core.tracing import bind
from ._util import dtype_of, ndim_of, shape_of
from .elementwise import elementwise
from .elementwise import i1 as scipy_i1_p

# --- sinc -----------------------------------------------------------------------------------------
# d sinc/dx = (cos(pi x) - sinc(x)) / x, which cancels near 0: there, its Taylor series (odd,
# five terms: exact to rounding for |x| < 0.1, and every derivative at 0 is right)
_SINC_SERIES = tuple(
    (-1) ** k * 2 * k * math.pi ** (2 * k) / math.factorial(2 * k + 1) for k in range(1, 6)
)


def _sinc_derivative(ans, x):
    x2 = x * x
    series = 0.0
    for c in reversed(_SINC_SERIES):
        series = series * x2 + c
    series = series * x
    general = (np.cos(np.pi * x) - ans) / np.where(x == 0, 1, x)
    return np.where(np.abs(x) < 0.1, series, general)


sinc_p = elementwise("sinc", np.sinc, (_sinc_derivative,))


@implements(np.sinc)
def sinc(x):
    """np.sinc: sin(pi x) / (pi x), NumPy's value; derivative exact at 0."""
    if dtype_of(x).kind == "c":
        raise GradtapeError("np.sinc of complex values cannot be traced.")
    return bind(sinc_p, (x,), {})


# --- i0 (its derivative is i1, from scipy.special) ----------------------------------------------
def _scipy_special(name):
    try:
        import scipy.special
    except ImportError:  # pragma: no cover - scipy is installed with the tests
        raise GradtapeError(
            f"the derivative of np.i0 is scipy.special.{name}: install SciPy "
            "to differentiate np.i0."
        ) from None
    return getattr(scipy.special, name)


# np.i0's derivative is scipy.special.i1, declared with the scipy.special ufuncs
i0_p = elementwise("numpy_i0", np.i0, (lambda ans, x: bind(_scipy_i1(), (x,), {}),))


def _scipy_i1():
    _scipy_special("i1")  # a clear error when SciPy is missing
    return scipy_i1_p


@implements(np.i0)
def i0(x):
    """np.i0: the modified Bessel function of order 0 (NumPy's value; derivative i1)."""
    if dtype_of(x).kind == "c":
        raise GradtapeError("np.i0 of complex values cannot be traced.")
    return bind(i0_p, (x,), {})


# --- replacing, rounding, complex parts -------------------------------------------------------
def _real_only(name, x):
    if dtype_of(x).kind == "c":
        raise GradtapeError(
            f"np.{name} of complex values cannot be traced: gradtape "
            "differentiates real functions. Split real and imaginary parts."
        )


@implements(np.nan_to_num)
def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """np.nan_to_num: finite entries keep derivative 1, replaced ones have none."""
    _real_only("nan_to_num", x)
    if dtype_of(x).kind != "f":
        return x
    info = np.finfo(dtype_of(x))
    big = info.max if posinf is None else posinf
    small = info.min if neginf is None else neginf
    x = np.where(np.isnan(x), nan, x)
    x = np.where(x == np.inf, big, x)
    return np.where(x == -np.inf, small, x)


@implements(np.isposinf)
def isposinf(x, out=None):
    """np.isposinf on a traced value (no derivative)."""
    _real_only("isposinf", x)
    return np.isinf(x) & ~np.signbit(x)


@implements(np.isneginf)
def isneginf(x, out=None):
    """np.isneginf on a traced value (no derivative)."""
    _real_only("isneginf", x)
    return np.isinf(x) & np.signbit(x)


@implements(np.fix)
def fix(x, out=None):
    """np.fix: rounding towards zero (zero derivative)."""
    if out is not None:
        raise GradtapeError("np.fix(..., out=...) cannot be traced; assign the result.")
    return np.trunc(x)


implements(np.isreal)(
    lambda x: np.ones(shape_of(x), bool) if dtype_of(x).kind != "c" else _real_only("isreal", x)
)
implements(np.iscomplex)(
    lambda x: np.zeros(shape_of(x), bool) if dtype_of(x).kind != "c" else _real_only("iscomplex", x)
)


@implements(np.real_if_close)
def real_if_close(a, tol=100):
    """np.real_if_close of a real value: the value itself."""
    _real_only("real_if_close", a)
    return a


# --- piecewise --------------------------------------------------------------------------------
@implements(np.piecewise)
def piecewise(x, condlist, funclist, *args, **kw):
    """np.piecewise: each function sees only its entries (as in NumPy); the result is written
    functionally, so every piece is differentiated. A traced condition records a guard."""
    nd = ndim_of(x)
    n2 = len(funclist)
    if not isinstance(condlist, (list, tuple)) or (
        condlist and np.isscalar(condlist[0]) and nd != 0
    ):
        condlist = [condlist]
    masks = [
        c if hasattr(c, "_var") else np.broadcast_to(np.asarray(c, dtype=bool), shape_of(x))
        for c in condlist
    ]
    n = len(masks)
    if n == n2 - 1:
        masks.append(~np.any(np.stack(masks), axis=0))
        n += 1
    elif n != n2:
        raise ValueError(f"with {n} condition(s), either {n} or {n + 1} functions are expected")
    y = np.zeros_like(x)
    for mask, func in zip(masks, funclist):
        if not callable(func):
            y[mask] = func
        elif bool(np.any(mask)):  # a traced mask: bool() records a guard
            y[mask] = func(x[mask], *args, **kw)
    return y
