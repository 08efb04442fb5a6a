"""NumPy 2's array-API names: vecdot, matvec, vecmat (gufuncs), np.astype, unstack,
matrix_transpose, and the np.linalg spellings (vecdot, matrix_transpose, diagonal, trace).

The three gufuncs are primitives (they reach gradtape through `__array_ufunc__` as ufuncs do);
their derivatives are products with the other operand, written with the same gufuncs. Complex
operands are refused: vecdot conjugates its first argument, and gradtape differentiates real
functions.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import UFUNCS, implements
from ._util import dtype_of, ndim_of, shape_of, unbroadcast


def _real(name, *xs):
    if any(dtype_of(x).kind == "c" for x in xs):
        raise GradtapeError(
            f"np.{name} of complex values cannot be traced (it conjugates; "
            "gradtape differentiates real functions)."
        )


def _vecdot_impl(x1, x2):
    _real("vecdot", x1, x2)
    return np.vecdot(x1, x2)


def _matvec_impl(a, v):
    _real("matvec", a, v)
    return np.matvec(a, v)


def _vecmat_impl(v, a):
    _real("vecmat", v, a)
    return np.vecmat(v, a)


def _expand(g):
    return np.expand_dims(g, -1)


def _sum_of(*terms):
    out = None
    for t in terms:
        if t is not None:
            out = t if out is None else out + t
    return out


if hasattr(np, "vecdot") and isinstance(np.vecdot, np.ufunc):
    vecdot_p = Primitive(
        "vecdot",
        _vecdot_impl,
        vjps=(
            lambda g, ans, x1, x2: unbroadcast(_expand(g) * x2, shape_of(x1)),
            lambda g, ans, x1, x2: unbroadcast(_expand(g) * x1, shape_of(x2)),
        ),
        jvp=lambda ts, ans, x1, x2: _sum_of(
            None if ts[0] is None else np.vecdot(ts[0], x2),
            None if ts[1] is None else np.vecdot(x1, ts[1]),
        ),
    )
    UFUNCS[np.vecdot] = vecdot_p

if hasattr(np, "matvec") and isinstance(np.matvec, np.ufunc):
    matvec_p = Primitive(
        "matvec",
        _matvec_impl,
        vjps=(
            lambda g, ans, a, v: unbroadcast(_expand(g) * np.expand_dims(v, -2), shape_of(a)),
            lambda g, ans, a, v: unbroadcast(np.vecmat(g, a), shape_of(v)),
        ),
        jvp=lambda ts, ans, a, v: _sum_of(
            None if ts[0] is None else np.matvec(ts[0], v),
            None if ts[1] is None else np.matvec(a, ts[1]),
        ),
    )
    UFUNCS[np.matvec] = matvec_p
    vecmat_p = Primitive(
        "vecmat",
        _vecmat_impl,
        vjps=(
            lambda g, ans, v, a: unbroadcast(np.matvec(a, g), shape_of(v)),
            lambda g, ans, v, a: unbroadcast(_expand(v) * np.expand_dims(g, -2), shape_of(a)),
        ),
        jvp=lambda ts, ans, v, a: _sum_of(
            None if ts[0] is None else np.vecmat(ts[0], a),
            None if ts[1] is None else np.vecmat(v, ts[1]),
        ),
    )
    UFUNCS[np.vecmat] = vecmat_p


if hasattr(np, "astype"):

    @implements(np.astype)
    def astype(x, dtype, /, *, copy=True, device=None):
        """np.astype (NumPy 2): the method."""
        return x.astype(dtype)


if hasattr(np, "unstack"):

    @implements(np.unstack)
    def unstack(x, /, *, axis=0):
        """np.unstack (NumPy 2): the slices along an axis, as a tuple."""
        if ndim_of(x) == 0:
            raise ValueError("Input array must be at least 1-d.")
        moved = np.moveaxis(x, axis, 0)
        return tuple(moved[i] for i in range(shape_of(moved)[0]))


def _matrix_transpose(x):
    if ndim_of(x) < 2:
        raise ValueError(f"Input array must be at least 2-dimensional, but it is {ndim_of(x)}")
    return np.swapaxes(x, -1, -2)


for _f in (getattr(np, "matrix_transpose", None), getattr(np.linalg, "matrix_transpose", None)):
    if _f is not None:
        implements(_f)(lambda x, /: _matrix_transpose(x))

if hasattr(np.linalg, "vecdot"):

    @implements(np.linalg.vecdot)
    def linalg_vecdot(x1, x2, /, *, axis=-1):
        """np.linalg.vecdot: np.vecdot along `axis`."""
        return np.vecdot(np.moveaxis(x1, axis, -1), np.moveaxis(x2, axis, -1))


if hasattr(np.linalg, "diagonal"):
    implements(np.linalg.diagonal)(lambda x, /, *, offset=0: np.diagonal(x, offset, -2, -1))
    implements(np.linalg.trace)(
        lambda x, /, *, offset=0, dtype=None: np.trace(x, offset, -2, -1, dtype=dtype)
    )
