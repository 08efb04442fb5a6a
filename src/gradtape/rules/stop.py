"""stop_gradient: a value treated as a constant by every transform."""

from __future__ import annotations

from ..core import tracing as trace
from ..core.primitive import Primitive
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import bind


def _stop_impl(x):
    # bind again one level down, until the value is concrete: the gradient stops at every level
    return bind(stop_gradient_p, (x,), {}) if type(x) is trace.Tracer else x


stop_gradient_p = Primitive("stop_gradient", _stop_impl, nondiff=True, identity=True)


def stop_gradient(x):
    """`x` as a constant: no derivative flows through it.

    Parameters
    ----------
    x : array, float or pytree of them
        Traced or plain values.

    Returns
    -------
    array, float or pytree
        The same values, treated as constants by every transform.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> print(gt.grad(lambda x: np.sum(x * gt.stop_gradient(x)))(np.array([1.0, 2.0])))
    [1. 2.]
    """
    leaves, td = tree_flatten(x)
    return tree_unflatten(td, [bind(stop_gradient_p, (v,), {}) for v in leaves])
