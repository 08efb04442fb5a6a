"""check_grad: compare gradtape's gradient with complex-step and central finite differences."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .core.pytree import tree_flatten, tree_unflatten


@dataclass
class GradCheck:
    """The worst errors of gradtape's gradient against each numerical reference (`check_grad`).

    Attributes
    ----------
    max_error_fd : float
        The worst relative error against central differences.
    max_error_cs : float or None
        The worst relative error against the complex step; None where `f` rejects complex input.
    tolerance : float
        The relative error that passes.
    gradient : array or pytree
        gradtape's gradient.
    fd_gradient : array or pytree
        The central-difference gradient.
    ok : bool
        Whether either reference agrees within `tolerance` (also the object's truth value).

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> result = gt.check_grad(lambda x: np.sum(x**2), np.array([1.0, 2.0]))
    >>> result.ok, result.max_error_cs
    (True, 0.0)
    """

    max_error_fd: float
    max_error_cs: float | None  # None where the function does not accept complex input
    tolerance: float
    gradient: object
    fd_gradient: object

    @property
    def ok(self) -> bool:
        errs = [self.max_error_fd] + ([self.max_error_cs] if self.max_error_cs is not None else [])
        return min(errs) <= self.tolerance

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        cs = "n/a (no complex support)" if self.max_error_cs is None else f"{self.max_error_cs:.3g}"
        return (
            f"check_grad: {'OK' if self.ok else 'FAILED'} — worst relative error vs central "
            f"differences {self.max_error_fd:.3g}, vs complex step {cs} "
            f"(tolerance {self.tolerance:g})"
        )


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    if a.size == 0:
        return 0.0
    scale = np.maximum(1.0, np.abs(b))
    return float(np.max(np.abs(a - b) / scale))


def check_grad(
    f: Callable, *args, argnums: int = 0, eps: float | None = None, tolerance: float | None = None
) -> GradCheck:
    """Compare `grad(f, argnums)(*args)` with numerical derivatives of f; report the worst error.

    Complex step (exact to rounding) is used where f accepts complex input; central
    differences always. The check passes when either reference agrees within `tolerance`.

    Parameters
    ----------
    f : callable
        A scalar function of `*args`.
    *args
        The point at which to check.
    argnums : int, default 0
        The argument to differentiate.
    eps : float, optional
        The central-difference step (default: about eps^(1/3) times each element's scale).
    tolerance : float, optional
        The relative error that passes (default 1e-5; larger for float32 arguments).

    Returns
    -------
    GradCheck
        Truthy when the check passes; prints the worst errors.

    Raises
    ------
    GradtapeError
        When gradtape cannot differentiate `f`.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> result = gt.check_grad(lambda x: np.sum(np.exp(x)), np.array([1.0, 2.0]))
    >>> bool(result)
    True
    """
    from .transforms.reverse import grad

    g = grad(f, argnums)(*args)
    leaves, td = tree_flatten(args[argnums])
    g_leaves, _ = tree_flatten(g)
    flat = (
        np.concatenate([np.ravel(np.asarray(x, dtype=np.float64)) for x in leaves])
        if leaves
        else np.zeros(0)
    )
    sizes = [np.size(x) for x in leaves]
    shapes = [np.shape(x) for x in leaves]
    dtype32 = any(np.asarray(x).dtype == np.float32 for x in leaves)
    tol = tolerance if tolerance is not None else (2e-2 if dtype32 else 1e-5)

    def call(vec, dtype):
        parts, i = [], 0
        for n, s in zip(sizes, shapes):
            parts.append(vec[i : i + n].reshape(s).astype(dtype))
            i += n
        new = list(args)
        new[argnums] = tree_unflatten(td, parts)
        return f(*new)

    h = (
        eps
        if eps is not None
        else (np.finfo(np.float64).eps ** (1 / 3))
        * max(1.0, float(np.max(np.abs(flat))) if flat.size else 1.0)
    )
    fd = np.empty_like(flat)
    for i in range(flat.size):
        e = np.zeros_like(flat)
        e[i] = h
        fd[i] = (float(call(flat + e, np.float64)) - float(call(flat - e, np.float64))) / (2 * h)
    cs = np.empty_like(flat)
    try:
        with np.errstate(all="ignore"):
            for i in range(flat.size):
                e = np.zeros(flat.size, complex)
                e[i] = 1e-30j
                v = call(flat + e, np.complex128)
                if not np.iscomplexobj(v):
                    raise TypeError
                cs[i] = np.imag(v) / 1e-30
        err_cs = _rel_err(_flat(g_leaves), cs)
    except Exception:
        err_cs = None
    gflat = _flat(g_leaves)
    return GradCheck(_rel_err(gflat, fd), err_cs, tol, g, fd)


def _flat(leaves) -> np.ndarray:
    if not leaves:
        return np.zeros(0)
    return np.concatenate([np.ravel(np.asarray(x, dtype=np.float64)) for x in leaves])
