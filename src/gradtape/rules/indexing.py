"""Indexing: gathers with O(1) adjoints, functional writes, where, take, sort.

The VJP of `x[idx]` is a `SparseCotangent`: the reverse interpreter scatters all
of them into one buffer per variable, so reading k elements of a large traced
array costs O(k) in the backward pass, never a dense array per index.
"""

from __future__ import annotations

import numpy as np

from .. import trace
from ..primitives import Primitive, implements
from ..trace import GradtapeError, bind
from ._util import dtype_of, ndim_of, shape_of, unbroadcast


class SparseCotangent:
    """`values` to be added at `index` of a zero array of `shape` (produced by getitem's VJP)."""

    __slots__ = ("shape", "dtype", "index", "values", "basic")

    def __init__(self, shape, dtype, index, values, basic):
        self.shape = shape
        self.dtype = dtype
        self.index = index
        self.values = values
        self.basic = basic


def is_basic(idx: tuple) -> bool:
    """True when the index has no arrays (no repeated positions: `buf[idx] += v` is exact)."""
    return all(isinstance(i, (int, slice)) or i is None or i is Ellipsis for i in idx)


def _concrete(x, kind="value"):
    """The concrete value of a Tracer used as an index, recording a guard at each level."""
    while type(x) is trace.Tracer:
        x._level.add_guard(x._var, kind, np.array(_innermost(x)))
        x = x._value
    return x


def _innermost(x):
    while type(x) is trace.Tracer:
        x = x._value
    return x


def normalize_index(idx) -> tuple:
    """A hashable-ish tuple of ints, slices, None, Ellipsis and integer/bool ndarrays."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    out = []
    for i in idx:
        if type(i) is trace.Tracer:
            if i.dtype.kind not in "iub":
                raise IndexError(f"arrays used as indices must be of integer or boolean type, "
                                 f"not {i.dtype}")
            i = _concrete(i)
        if isinstance(i, (bool, np.bool_)):
            out.append(np.asarray(i))
        elif isinstance(i, (int, np.integer)):
            out.append(int(i))
        elif isinstance(i, (list, np.ndarray)):
            out.append(np.asarray(i))
        elif isinstance(i, slice):
            out.append(slice(*(None if v is None else int(_concrete(v, "index"))
                               for v in (i.start, i.stop, i.step))))
        else:
            out.append(i)
    return tuple(out)


def _getitem_vjp(g, ans, x, idx):
    return SparseCotangent(shape_of(x), dtype_of(x), idx, g, is_basic(idx))


getitem_p = Primitive(
    "getitem", lambda x, idx: x[idx],
    vjps=(_getitem_vjp,), jvp=lambda ts, ans, x, idx: ts[0][idx], linear=True,
)


def getitem(x, idx):
    return bind(getitem_p, (x, ), {"idx": normalize_index(idx)})


def _scatter_add_impl(base, vals, idx):
    out = base.copy()
    if is_basic(idx):
        out[idx] = out[idx] + vals
    else:
        np.add.at(out, idx, vals)
    return out


scatter_add_p = Primitive(
    "scatter_add", _scatter_add_impl,
    vjps=(lambda g, ans, base, vals, idx: g,
          lambda g, ans, base, vals, idx: unbroadcast(g[idx], shape_of(vals))),
    jvp=lambda ts, ans, base, vals, idx: scatter_add_p(
        ts[0] if ts[0] is not None else np.zeros(shape_of(ans), dtype_of(ans)),
        ts[1] if ts[1] is not None else np.zeros(shape_of(vals), dtype_of(ans)), idx=idx),
    linear=True,
)


def _setitem_impl(x, v, idx):
    out = x.copy()
    out[idx] = v
    return out


def _zero_at(g, idx):
    c = g.copy()
    c[idx] = 0
    return c


setitem_p = Primitive(
    "setitem", _setitem_impl,
    vjps=(lambda g, ans, x, v, idx: _zero_at(g, idx),
          lambda g, ans, x, v, idx: unbroadcast(g[idx], shape_of(v))),
    jvp=lambda ts, ans, x, v, idx: setitem_p(
        ts[0] if ts[0] is not None else np.zeros(shape_of(ans), dtype_of(ans)),
        ts[1] if ts[1] is not None else np.zeros(shape_of(v), dtype_of(ans)), idx=idx),
    linear=True,
)


def setitem(x, idx, v):
    """`x[idx] = v` as a new value (the Tracer that called it is rebound to the result)."""
    if hasattr(v, "dtype") and dtype_of(v).kind == "c" and dtype_of(x).kind != "c":
        raise GradtapeError("cannot write a complex value into a real array")
    return bind(setitem_p, (x, v), {"idx": normalize_index(idx)})


def add_at(a, indices, b=None):
    """`np.add.at(a, indices, b)` on a traced `a`: rebinds `a` to the updated value."""
    if type(a) is not trace.Tracer:
        raise GradtapeError(
            "np.add.at writes traced values into a plain ndarray, which would cut the gradient. "
            "Start from a traced array instead: acc = np.zeros_like(x) (x traced), then "
            "np.add.at(acc, idx, values)."
        )
    new = bind(scatter_add_p, (a, b), {"idx": normalize_index(indices)})
    a._value, a._var, a._level = new._value, new._var, new._level


def materialize(ct):
    """A dense array from a SparseCotangent (or a list of them)."""
    pieces = ct if isinstance(ct, list) else [ct]
    shape, dtype = pieces[0].shape, pieces[0].dtype
    if any(type(p.values) is trace.Tracer for p in pieces):
        buf = np.zeros(shape, dtype)
        for p in pieces:
            buf = bind(scatter_add_p, (buf, p.values), {"idx": p.index})
        return buf
    buf = np.zeros(shape, dtype)
    for p in pieces:
        if p.basic:
            buf[p.index] += p.values
        else:
            np.add.at(buf, p.index, p.values)
    return buf


# --- where, select, take, sort ----------------------------------------------------------------
where_p = Primitive(
    "where", lambda c, x, y: np.where(c, x, y),
    vjps=(None,
          lambda g, ans, c, x, y: unbroadcast(np.where(c, g, 0), shape_of(x)),
          lambda g, ans, c, x, y: unbroadcast(np.where(c, 0, g), shape_of(y))),
    jvp=lambda ts, ans, c, x, y: np.broadcast_to(np.where(
        c, 0 if ts[1] is None else ts[1], 0 if ts[2] is None else ts[2]), shape_of(ans)),
    linear=True,
)


@implements(np.where)
def where(condition, x=None, y=None):
    if x is None and y is None:
        return np.nonzero(condition)
    return bind(where_p, (condition, x, y), {})


@implements(np.select)
def select(condlist, choicelist, default=0):
    out = default
    for c, ch in reversed(list(zip(condlist, choicelist))):
        out = where(c, ch, out)
    return np.broadcast_to(out, np.broadcast_shapes(*(shape_of(c) for c in condlist),
                                                    *(shape_of(ch) for ch in choicelist)))


@implements(np.take)
def take(a, indices, axis=None, out=None, mode="raise"):
    if axis is None:
        return np.ravel(a)[indices]
    return a[(slice(None),) * (int(axis) % ndim_of(a)) + (indices,)]


def _along_axis_index(arr_shape, indices, axis):
    nd = len(arr_shape)
    ishape = shape_of(indices)
    idx = []
    for d in range(nd):
        if d == axis:
            idx.append(_concrete(indices))
        else:
            shp = [1] * nd
            shp[d] = ishape[d]
            idx.append(np.arange(ishape[d]).reshape(shp))
    return tuple(idx)


@implements(np.take_along_axis)
def take_along_axis(arr, indices, axis=-1):
    if axis is None:
        return np.ravel(arr)[indices]
    axis = int(axis) % ndim_of(arr)
    return arr[_along_axis_index(shape_of(arr), indices, axis)]


@implements(np.sort)
def sort(a, axis=-1, kind=None, order=None, stable=None):
    if axis is None:
        a, axis = np.ravel(a), 0
    return take_along_axis(a, np.argsort(a, axis=axis), axis)


@implements(np.diagonal)
def diagonal(a, offset=0, axis1=0, axis2=1):
    a = np.moveaxis(a, (axis1, axis2), (-2, -1))
    n, m = shape_of(a)[-2:]
    i = np.arange(max(0, -offset), min(n, m - offset))
    return a[..., i, i + offset]


@implements(np.trace)
def trace_(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    return np.sum(diagonal(a, offset, axis1, axis2), axis=-1)


@implements(np.diag)
def diag(v, k=0):
    if ndim_of(v) == 2:
        return diagonal(v, k)
    n = shape_of(v)[0] + abs(k)
    out = np.zeros((n, n), dtype_of(v))
    i = np.arange(shape_of(v)[0])
    return bind(scatter_add_p, (out, v), {"idx": (i + max(0, -k), i + max(0, k))})


def _triangle(m, k, upper):
    shape = shape_of(m)
    mask = np.tri(shape[-2], shape[-1], k - 1 if upper else k, dtype=bool)
    return np.where(~mask if upper else mask, m, 0)


implements(np.triu)(lambda m, k=0: _triangle(m, k, True))
implements(np.tril)(lambda m, k=0: _triangle(m, k, False))
