"""scipy.special functions written in Python (not ufuncs), given Tracer-aware versions.

`logsumexp`, `polygamma`, `softmax`, `log_softmax`, `lambertw` and `multigammaln` are Python
functions of SciPy (`np.sinc`, which scipy.special re-exports, of NumPy). They are declared as
module functions (core.routes.MODULE_FUNCTIONS): a call with a Tracer argument runs
the version below (written with NumPy calls, so it is traced); any other call goes
to SciPy unchanged (gradtape/process.py installs the dispatchers). The ufuncs of
scipy.special need no wrapper (see elementwise.py).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GradtapeError
from ..core.routes import implements_module_function
from ..core.tracing import LevelKind, Tracer
from .elementwise import lambertw_real
from .stop import stop_gradient


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False):
    """log(sum(b * exp(a))) with the max shifted out (the shift carries no gradient)."""
    m = stop_gradient(np.max(a, axis=axis, keepdims=True))
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(a - m)
    if b is not None:
        e = b * e
    s = np.sum(e, axis=axis, keepdims=True)
    sign = np.sign(s)
    out = np.log(np.abs(s) if return_sign else s) + m
    if not keepdims:
        axes = tuple(range(np.ndim(a))) if axis is None else axis
        out = np.squeeze(out, axis=axes)
        sign = np.squeeze(sign, axis=axes)
    return (out, sign) if return_sign else out


def polygamma(n, x):
    """polygamma(n, x) for constant integer orders n, from digamma and the Hurwitz zeta."""
    import scipy.special as sp

    n = _concrete(n, "scipy.special.polygamma: the order n")
    if np.ndim(n) == 0:
        n = int(n)
        if n == 0:
            return sp.digamma(x)
        return (-1.0) ** (n + 1) * sp.gamma(n + 1.0) * sp.zeta(n + 1.0, x)
    n = np.asarray(n)
    m = np.where(n == 0, 1, n)  # the zeta branch at a finite point where n is 0
    return np.where(
        n == 0, sp.digamma(x), (-1.0) ** (m + 1) * sp.gamma(m + 1.0) * sp.zeta(m + 1.0, x)
    )


def softmax(x, axis=None):
    return np.exp(log_softmax(x, axis=axis))


def log_softmax(x, axis=None):
    m = stop_gradient(np.max(x, axis=axis, keepdims=True))
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _concrete(v, what: str):
    """A plain value for an argument that must be a constant (an order, a dimension, a branch)."""
    if type(v) is Tracer:
        w = v
        while type(w) is Tracer:
            if w._level.kind is LevelKind.DIFFERENTIATE:
                raise GradtapeError(
                    f"{what} has no derivative; pass it as a constant (or "
                    "through gradtape.stop_gradient)."
                )
            w = w._value
        return np.asarray(v.tolist())  # a guard on its value when staging
    return v


_MINUS_INV_E = -math.exp(-1.0)


def lambertw(z, k=0, tol=1e-8):
    """The real branches of Lambert's W, as a real value (SciPy returns it as complex).

    Branch 0 is real for z >= -1/e, branch -1 for -1/e <= z < 0; other inputs would give
    complex values, which gradtape does not differentiate: refused.
    """
    k = _concrete(k, "scipy.special.lambertw: the branch k")
    if np.ndim(k) != 0 or int(k) not in (0, -1):
        raise GradtapeError(
            f"scipy.special.lambertw(z, k={k!r}) on a traced value: only the real branches k=0 "
            "and k=-1 are differentiated (the others are complex). Pass z through "
            "gradtape.stop_gradient if it needs no derivative."
        )
    k = int(k)
    real = z >= _MINUS_INV_E if k == 0 else (z >= _MINUS_INV_E) & (z < 0)
    if not np.all(real):
        raise GradtapeError(
            f"scipy.special.lambertw(z, k={k}) would be complex for some z (branch 0 is real "
            "for z >= -1/e, branch -1 for -1/e <= z < 0): gradtape does not differentiate "
            "complex values."
        )
    return lambertw_real(z, k)


def multigammaln(a, d):
    """The log of the multivariate gamma function, as SciPy computes it."""
    import scipy.special as sp

    d = _concrete(d, "scipy.special.multigammaln: the dimension d")
    if np.ndim(d) != 0 or np.floor(d) != d:
        raise ValueError("d should be a positive integer (dimension)")
    d = int(d)
    if np.any(a <= 0.5 * (d - 1)):
        raise ValueError(f"condition a > 0.5 * (d-1) ({0.5 * (d - 1)}) not met")
    res = (d * (d - 1) * 0.25) * math.log(math.pi)
    for j in range(1, d + 1):
        res = res + sp.gammaln(a - (j - 1.0) / 2)
    return res


def _exact_refused(name: str):
    raise GradtapeError(
        f"scipy.special.{name}(..., exact=True) of a traced value: an exact integer count has no "
        f"derivative. Use exact=False (a float), or pass the arguments through "
        "gradtape.stop_gradient."
    )


def comb(N, k, *, exact=False, repetition=False):
    """scipy.special.comb with exact=False on traced values: binom(N, k), 0 where k > N,
    N < 0 or k < 0 (SciPy's rule, written with np.where instead of a write into the result)."""
    import scipy.special as sp

    if exact:
        _exact_refused("comb")
    N, k = np.asarray(N), np.asarray(k)
    if repetition:  # C(N + k - 1, k), with C(N, 0) = 1 for N >= 0
        return np.where((k == 0) & (N >= 0), 1.0, comb(N + k - 1, k))
    inside = (k <= N) & (N >= 0) & (k >= 0)
    return np.where(inside, sp.binom(N, k), 0.0)


def perm(N, k, exact=False):
    """scipy.special.perm with exact=False on traced values: poch(N - k + 1, k), 0 where k > N,
    N < 0 or k < 0."""
    import scipy.special as sp

    if exact:
        _exact_refused("perm")
    N, k = np.asarray(N), np.asarray(k)
    inside = (k <= N) & (N >= 0) & (k >= 0)
    return np.where(inside, sp.poch(N - k + 1, k), 0.0)


for _name, _traced in {
    "comb": comb,
    "perm": perm,
    "logsumexp": logsumexp,
    "polygamma": polygamma,
    "softmax": softmax,
    "log_softmax": log_softmax,
    "lambertw": lambertw,
    "multigammaln": multigammaln,
}.items():
    implements_module_function("scipy.special", _name)(_traced)
