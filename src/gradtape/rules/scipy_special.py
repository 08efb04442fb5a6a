"""scipy.special functions written in Python (not ufuncs), given Tracer-aware versions.

`logsumexp`, `polygamma`, `softmax` and `log_softmax` convert their inputs with
`np.asarray`, so NumPy's protocols never show them a Tracer. They are declared as
module functions (core.routes.MODULE_FUNCTIONS): a call with a Tracer argument runs
the version below (written with NumPy calls, so it is traced); any other call goes
to SciPy unchanged (gradtape/process.py installs the dispatchers). The ufuncs of
scipy.special need no wrapper (see elementwise.py).
"""

from __future__ import annotations

import numpy as np

from ..core.routes import implements_module_function
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
    """polygamma(n, x) for a constant integer order n, from digamma and the Hurwitz zeta."""
    import scipy.special as sp

    n = int(n)
    if n == 0:
        return sp.digamma(x)
    return (-1.0) ** (n + 1) * sp.gamma(n + 1.0) * sp.zeta(n + 1.0, x)


def softmax(x, axis=None):
    return np.exp(log_softmax(x, axis=axis))


def log_softmax(x, axis=None):
    m = stop_gradient(np.max(x, axis=axis, keepdims=True))
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


for _name, _traced in {"logsumexp": logsumexp, "polygamma": polygamma, "softmax": softmax,
                      "log_softmax": log_softmax}.items():
    implements_module_function("scipy.special", _name)(_traced)
