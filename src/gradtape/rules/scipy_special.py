"""scipy.special functions written in Python (not ufuncs), given Tracer-aware versions.

`logsumexp`, `polygamma`, `softmax` and `log_softmax` convert their inputs with
`np.asarray`, which a Tracer refuses. When scipy.special is loaded, gradtape
wraps these module attributes: a call with a Tracer argument runs the version
below (written with NumPy calls, so it is traced); any other call goes to SciPy
unchanged. The ufuncs of scipy.special need no wrapper (see elementwise.py).
The wrappers are installed the moment scipy.special is imported (an import hook),
so `from scipy.special import logsumexp` written after `import gradtape` gets them.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys

import numpy as np

from ..core import tracing as trace
from .control import stop_gradient

_installed = False


def _has_tracer(args, kwargs) -> bool:
    return any(type(a) is trace.Tracer for a in args) or any(
        type(v) is trace.Tracer for v in kwargs.values())


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


_RULES = {"logsumexp": logsumexp, "polygamma": polygamma, "softmax": softmax,
          "log_softmax": log_softmax}


def _wrap(original, traced):
    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        if _has_tracer(args, kwargs):
            return traced(*args, **kwargs)
        return original(*args, **kwargs)

    dispatch.__gradtape_original__ = original
    return dispatch


def install_if_loaded() -> None:
    """Wrap the functions above in scipy.special, once, as soon as SciPy is imported."""
    global _installed
    special = sys.modules.get("scipy.special")
    if _installed or special is None:
        return
    _installed = True
    for name, traced in _RULES.items():
        original = getattr(special, name, None)
        if original is not None and not hasattr(original, "__gradtape_original__"):
            setattr(special, name, _wrap(original, traced))


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: makes the loader of scipy.special install the wrappers after it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "scipy.special" or _installed:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            install_if_loaded()

        loader.exec_module = exec_then_install
        return spec


def install_on_import() -> None:
    """Wrap scipy.special's functions now if it is loaded, else as soon as it is imported."""
    install_if_loaded()
    if not _installed and not any(isinstance(f, _InstallOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallOnImport())
