"""Indexing: gathers with O(1) adjoints, functional writes, where, take, sort.

The VJP of `x[idx]` is a `SparseCotangent`: the reverse interpreter scatters all
of them into one buffer per variable, so reading k elements of a large traced
array costs O(k) in the backward pass, never a dense array per index.
"""

from __future__ import annotations

import numpy as np

from ..core import tracing as trace
from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements, implements_method, implements_ufunc_method
from ..core.tracing import bind
from ._util import batch_shape, dtype_of, lift_tangent, ndim_of, shape_of, unbroadcast


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
        if x._level.batch_size is not None:
            # a member of a vmap batch: one value for every member (or a clear error), never
            # the whole batch's values taken as one member's
            return np.asarray(x.tolist(), dtype=x.dtype)
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
                raise IndexError(
                    f"arrays used as indices must be of integer or boolean type, not {i.dtype}"
                )
            if i._level.batch_size is not None:  # each member's own: the batching rules
                out.append(i)  # of indexing take it out of the index
                continue
            i = _concrete(i)
        if isinstance(i, (bool, np.bool_)):
            out.append(np.asarray(i))
        elif isinstance(i, (int, np.integer)):
            out.append(int(i))
        elif isinstance(i, (list, np.ndarray)):
            out.append(np.asarray(i))
        elif isinstance(i, slice):
            out.append(
                slice(
                    *(
                        None if v is None else int(_concrete(v, "index"))
                        for v in (i.start, i.stop, i.step)
                    )
                )
            )
        else:
            out.append(i)
    return tuple(out)


def _getitem_vjp(g, ans, x, idx):
    return SparseCotangent(shape_of(x), dtype_of(x), idx, g, is_basic(idx))


# --- tangents with leading batch axes (jvp_batched) ---------------------------------------------
def _explicit_index(idx: tuple, ndim: int) -> tuple:
    """`idx` naming every axis of an `ndim`-dimensional array (Ellipsis expanded)."""
    used = sum(
        0
        if i is None or i is Ellipsis
        else i.ndim
        if isinstance(i, np.ndarray) and i.dtype == bool
        else 1
        for i in idx
    )
    fill = (slice(None),) * (ndim - used)
    for k, i in enumerate(idx):
        if i is Ellipsis:
            return idx[:k] + fill + idx[k + 1 :]
    return idx + fill


def _batch_last(t, k: int):
    return np.moveaxis(t, tuple(range(k)), tuple(range(-k, 0)))


def _batch_first(t, k: int):
    n = ndim_of(t)
    return np.moveaxis(t, tuple(range(n - k, n)), tuple(range(k)))


def _getitem_jvp(ts, ans, x, idx):
    t = ts[0]
    k = len(batch_shape(t, x))
    mask = _member_mask(idx)
    if mask is not None:  # the tangents' batch axes last: they follow the selected elements
        return _batch_first(_masked_read(_batch_last(t, k), mask), k)
    if k == 0:
        return t[idx]
    if is_basic(idx):
        return t[(slice(None),) * k + idx]
    # advanced indices can move the axes in front of them: index with the batch axes last
    r = _batch_last(t, k)[_explicit_index(idx, ndim_of(x)) + (slice(None),) * k]
    return _batch_first(r, k)


def _write_jvp(prim, ts, ans, x, v, idx):
    """The tangent of a functional write (scatter_add, setitem): the same write on tangents."""
    t_x, t_v = ts
    lead = batch_shape(t_x, x) if t_x is not None else batch_shape(t_v, v)
    if t_x is None:
        t_x = np.zeros(lead + shape_of(ans), dtype_of(ans))
    if t_v is None:
        t_v = np.zeros(lead + shape_of(v), dtype_of(ans))
    k = len(lead)
    mask = _member_mask(idx)
    if mask is not None:  # the tangents' batch axes last, behind each selected element's
        written = _masked_write(
            _batch_last(t_x, k), mask, _batch_last(t_v, k), add=prim is scatter_add_p
        )
        return _batch_first(written, k)
    if k == 0:
        return prim(t_x, t_v, idx=idx)
    # batch axes last: the written values then broadcast against x[idx] as they did
    idx = _explicit_index(idx, ndim_of(x)) + (slice(None),) * k
    return _batch_first(prim(_batch_last(t_x, k), _batch_last(t_v, k), idx=idx), k)


getitem_p = Primitive(
    "getitem",
    lambda x, idx: x[idx],
    vjps=(_getitem_vjp,),
    jvp=_getitem_jvp,
    linear=True,
    jvp_batched=True,
)


@implements_method("__getitem__")
def getitem(x, idx):
    mask = _member_mask(idx)
    if mask is not None:
        return _masked_read(x, mask)
    dynamic = _split_dynamic(idx)
    if dynamic is not None:
        template, positions, index_values = dynamic
        return bind(
            dyn_getitem_p, (x, *index_values), {"template": template, "positions": positions}
        )
    return bind(getitem_p, (x,), {"idx": normalize_index(idx)})


# --- indices that are traced integers (a loop counter inside scan/fori_loop, compile) ----------
class _Slot:
    """Placeholder for a traced integer index in a template."""

    __repr__ = lambda self: "?"  # noqa: E731


_SLOT = _Slot()


def _split_dynamic(idx):
    """(template, positions, values) if the index holds traced integers recorded on the tape.

    Only staging and loop-body levels record integer values; there a traced integer index
    becomes an input of the instruction instead of a guard, so a loop counter `x[i]` does
    not force a new recording at every step.
    """
    parts = idx if isinstance(idx, tuple) else (idx,)
    positions = tuple(
        k for k, e in enumerate(parts) if type(e) is trace.Tracer and e.dtype.kind in "iu"
    )
    if not positions:
        return None
    template = normalize_index(tuple(_SLOT if k in positions else e for k, e in enumerate(parts)))
    return template, positions, [parts[k] for k in positions]


def _fill(template, positions, values) -> tuple:
    idx = list(template)
    for p, v in zip(positions, values):
        idx[p] = v
    return tuple(idx)


def _any_traced(*values) -> bool:
    return any(type(a) is trace.Tracer for a in values)


def _traced_integers_vary(v) -> bool:
    """Whether a traced value is an array, or holds a member of a vmap batch at any level
    below (each member has its own values)."""
    if type(v) is trace.Tracer and v.ndim:
        return True
    while type(v) is trace.Tracer:
        if v._level.batch_size is not None:
            return True
        v = v._value
    return False


def _batched_integers(values) -> bool:
    """Whether traced integers are arrays or hold members of a vmap batch (at any level
    below): the read or write is then recorded with them, at their level. (A plain array at
    a traced scalar, a loop counter, keeps the concrete, guarded position.)"""
    return any(_traced_integers_vary(v) for v in values)


def _dyn_getitem_impl(x, *iv, template, positions):
    if not _any_traced(x) and _batched_integers(iv):
        # a plain x read at traced integers of a lower level (a member of a vmap batch
        # inside a gradient): the read is recorded there
        return bind(dyn_getitem_p, (x, *iv), {"template": template, "positions": positions})
    return x[_fill(template, positions, iv)]


dyn_getitem_p = Primitive(
    "dyn_getitem",
    _dyn_getitem_impl,
    vjps=lambda i, g, ans, x, *iv, template, positions: (
        SparseCotangent(shape_of(x), dtype_of(x), _fill(template, positions, iv), g, False)
        if i == 0
        else None
    ),
    jvp=lambda ts, ans, x, *iv, template, positions: getitem(ts[0], _fill(template, positions, iv)),
    variadic=True,
)


def _dyn_setitem_impl(x, v, *iv, template, positions):
    if _batched_integers(iv):
        # integers of a lower level (members of a vmap batch, arrays): recorded there
        return bind(dyn_setitem_p, (x, v, *iv), {"template": template, "positions": positions})
    return _setitem_impl(x, v, _fill(template, positions, iv))


dyn_setitem_p = Primitive(
    "dyn_setitem",
    _dyn_setitem_impl,
    vjps=lambda i, g, ans, x, v, *iv, template, positions: (
        _zero_at(g, _fill(template, positions, iv))
        if i == 0
        else _written_vjp(g, x, v, _fill(template, positions, iv))
        if i == 1
        else None
    ),
    jvp=lambda ts, ans, x, v, *iv, template, positions: _dyn_set_jvp(
        ts, ans, x, v, iv, template, positions
    ),
    variadic=True,
)


def _dyn_set_jvp(ts, ans, x, v, iv, template, positions):
    tx = ts[0] if ts[0] is not None else np.zeros(shape_of(ans), dtype_of(ans))
    tv = ts[1] if ts[1] is not None else np.zeros(shape_of(v), dtype_of(ans))
    return _dyn_setitem_impl(tx, tv, *iv, template=template, positions=positions)


def _scatter_add_impl(base, vals, idx):
    mask = _member_mask(idx)
    if mask is not None:
        return _masked_write(base, mask, vals, add=True)
    dynamic = _split_dynamic(idx) if _recorded_at_integers(idx, base, vals) else None
    if dynamic is not None:  # a plain base added to at integers of a lower level (vmap's members)
        template, positions, index_values = dynamic
        return bind(
            dyn_scatter_add_p,
            (base, vals, *index_values),
            {"template": template, "positions": positions},
        )
    if type(base) is trace.Tracer or type(vals) is trace.Tracer:
        # values of a lower level (higher-order derivatives): the write is recorded there
        return bind(scatter_add_p, (base, vals), {"idx": idx})
    out = base.copy()
    if is_basic(idx):
        out[idx] = out[idx] + vals
    else:
        np.add.at(out, idx, vals)
    return out


scatter_add_p = Primitive(
    "scatter_add",
    _scatter_add_impl,
    vjps=(
        lambda g, ans, base, vals, idx: g,
        lambda g, ans, base, vals, idx: unbroadcast(getitem(g, idx), shape_of(vals)),
    ),
    jvp=lambda ts, ans, base, vals, idx: _write_jvp(scatter_add_p, ts, ans, base, vals, idx),
    linear=True,
    jvp_batched=True,
)


def _recorded_at_integers(idx, x, v) -> bool:
    """A write whose static index holds traced integer arrays or members of a vmap batch:
    recorded as the write with traced integers, at their level."""
    return _batched_integers(p for p in idx if type(p) is trace.Tracer)


def _setitem_impl(x, v, idx):
    mask = _member_mask(idx)
    if mask is not None:
        return _masked_write(x, mask, v, add=False)
    dynamic = _split_dynamic(idx) if _recorded_at_integers(idx, x, v) else None
    if dynamic is not None:  # a plain x written at integers of a lower level (vmap's members)
        template, positions, index_values = dynamic
        return bind(
            dyn_setitem_p, (x, v, *index_values), {"template": template, "positions": positions}
        )
    if type(x) is trace.Tracer or type(v) is trace.Tracer:
        return bind(setitem_p, (x, v), {"idx": idx})  # recorded at the lower level
    if isinstance(x, np.generic):  # a 0-d value held as a NumPy scalar: written as a 0-d array
        out = np.array(x)
        out[idx] = v
        return out[()]
    out = x.copy()
    out[idx] = v
    return out


def _zero_at(g, idx):
    mask = _member_mask(idx)
    if mask is not None:
        return _masked_write(g, mask, np.zeros((), dtype_of(g)), add=False)
    if _batched_integers(p for p in idx if type(p) is trace.Tracer):
        return setitem(g, idx, np.zeros((), dtype_of(g)))
    c = g.copy()
    c[idx] = 0
    return c


def _traced_scalar(i) -> bool:
    return type(i) is trace.Tracer and i.ndim == 0


def _written_vjp(g, x, v, idx):
    """Cotangent of the value written by `x[idx] = v`: g at idx, except where a repeated
    index was overwritten by a later element (NumPy keeps the last write)."""
    picked = getitem(g, idx)
    # a traced integer (a loop counter, a member's argmax under vmap) is one position
    if is_basic(tuple(0 if _traced_scalar(i) else i for i in idx)) or not any(
        _integer_array(i) for i in idx
    ):  # (a boolean mask selects each position once)
        return unbroadcast(picked, shape_of(v))
    shape = shape_of(picked)
    order = np.arange(int(np.prod(shape))).reshape(shape)
    if any(_index_varies(i) for i in idx):
        survived = _survivors_traced(shape_of(x), idx, order)
        picked = np.where(survived, picked, 0)
    else:
        idx_c = tuple(_innermost(i) for i in idx)
        marker = np.full(shape_of(x), -1)
        marker[idx_c] = order
        survived = marker[idx_c] == order
        if not survived.all():
            picked = np.where(survived, picked, 0)
    return unbroadcast(picked, shape_of(v))


def _integer_array(part) -> bool:
    return isinstance(part, (np.ndarray, trace.Tracer)) and dtype_of(part).kind in "iu"


def _index_varies(part) -> bool:
    """Whether a traced index part may take other values than its concrete one where the
    write is replayed or mapped: an array of traced integers, or a member of a vmap batch
    (each member has its own integers)."""
    if type(part) is not trace.Tracer or dtype_of(part).kind not in "iu":
        return False
    return _traced_integers_vary(part)


def _survivors_traced(x_shape, idx, order):
    """Which elements of a write at `idx` survive later writes to the same position, as
    traced operations (so each member of a batch, each replay, gets its own mask)."""
    written = setitem(np.full(x_shape, -1), idx, order)
    return getitem(written, idx) == order


setitem_p = Primitive(
    "setitem",
    _setitem_impl,
    vjps=(
        lambda g, ans, x, v, idx: _zero_at(g, idx),
        lambda g, ans, x, v, idx: _written_vjp(g, x, v, idx),
    ),
    jvp=lambda ts, ans, x, v, idx: _write_jvp(setitem_p, ts, ans, x, v, idx),
    linear=True,
    jvp_batched=True,
)


def _member_mask(idx):
    """The boolean mask of `x[mask]` when it is a member of a vmap batch (each member
    selects its own elements), else None."""
    parts = idx if isinstance(idx, tuple) else (idx,)
    if len(parts) != 1 or not _batch_member(parts[0]) or dtype_of(parts[0]).kind != "b":
        return None
    return parts[0]


def _every_member(check) -> bool:
    """Whether a boolean holds for every member of the batches it belongs to: asked of the
    values one level below each batch level (a guard where that level records)."""
    while _batch_member(check):
        check = np.all(check._value)
    return bool(check)


def _masked_write(x, mask, v, add: bool):
    """x[mask] = v (x[mask] += v) with a mask that differs per member, as elementwise
    operations with one shape for every member: the k-th selected element takes v[k] (a
    gather at each member's running count of the mask), or v itself when it holds one value
    for all. Each member must select as many elements as v has (NumPy's rule)."""
    xs, ms = shape_of(x), shape_of(mask)
    if xs[: len(ms)] != ms:
        raise IndexError(
            f"boolean index did not match indexed array along axis 0; size of axis is "
            f"{xs[0] if xs else 0} but size of corresponding boolean axis is {ms[0] if ms else 0}"
        )
    rest = xs[len(ms) :]
    selected = np.reshape(mask, ms + (1,) * len(rest))
    v = _operand(v)
    vs = shape_of(v)
    lead = vs[0] if len(vs) > len(rest) else 1
    if lead != 1:
        count = np.sum(mask)
        if not _every_member(np.equal(count, lead)):
            counts = sorted({int(c) for c in np.ravel(_innermost(count))})
            raise ValueError(
                f"NumPy boolean array indexing assignment cannot assign {lead} input values "
                f"to the {counts} output values where the mask is true"
            )
        if lead == 0:  # no member selects an element
            return x
        rank = np.reshape(np.cumsum(np.ravel(mask).astype(np.intp)) - 1, ms)
        v = getitem(v, np.clip(rank, 0, lead - 1))  # (ms + the value's other axes)
        v = np.reshape(v, ms + (1,) * (len(xs) - ndim_of(v)) + shape_of(v)[len(ms) :])
    elif len(vs) > len(rest):
        v = np.reshape(v, vs[1:])
    if dtype_of(v) != dtype_of(x):
        v = (
            np.asarray(v).astype(dtype_of(x))
            if type(v) is not trace.Tracer
            else v.astype(dtype_of(x))
        )
    return np.where(selected, x + v if add else v, x)


def _masked_read(x, mask):
    """x[mask] with a mask that differs per member: each member's selected elements in
    order, a gather at the positions a stable argsort of the unselected-first order puts
    first. Every member must select as many elements (a batch has one shape)."""
    xs, ms = shape_of(x), shape_of(mask)
    if xs[: len(ms)] != ms:
        raise IndexError(
            f"boolean index did not match indexed array along axis 0; size of axis is "
            f"{xs[0] if xs else 0} but size of corresponding boolean axis is {ms[0] if ms else 0}"
        )
    count_traced = np.sum(mask)
    count = int(np.ravel(_innermost(count_traced))[0])
    if not _every_member(np.equal(count_traced, count)):
        raise GradtapeError(
            f"{trace.user_source_line()}: vmap: x[mask] with a boolean mask that is a member "
            "of the batch selects a different number of elements in different members, and a "
            "batch needs one shape. Write np.where(mask, value, x) for x[mask] = value, or "
            "np.sum(np.where(mask, x, 0)) for a sum over x[mask]."
        )
    flat = np.reshape(x, (int(np.prod(ms)),) + xs[len(ms) :])
    if count == 0:
        return flat[:0]
    order = np.argsort(np.logical_not(np.ravel(mask)), kind="stable")[:count]
    return getitem(flat, order)


@implements_method("__setitem__")
def setitem(x, idx, v):
    """`x[idx] = v` as a new value (the Tracer that called it is rebound to the result)."""
    if hasattr(v, "dtype") and dtype_of(v).kind == "c" and dtype_of(x).kind != "c":
        raise GradtapeError("cannot write a complex value into a real array")
    mask = _member_mask(idx)
    if mask is not None:
        return _masked_write(x, mask, v, add=False)
    dynamic = _split_dynamic(idx)
    if dynamic is not None:
        template, positions, index_values = dynamic
        return bind(
            dyn_setitem_p, (x, v, *index_values), {"template": template, "positions": positions}
        )
    return bind(setitem_p, (x, v), {"idx": normalize_index(idx)})


@implements_ufunc_method(np.add, "at")
def add_at(a, indices, b=None):
    """`np.add.at(a, indices, b)` on a traced `a`: rebinds `a` to the updated value."""
    if type(a) is not trace.Tracer:
        raise GradtapeError(
            "np.add.at writes traced values into a plain ndarray, which would cut the gradient. "
            "Start from a traced array instead: acc = np.zeros_like(x) (x traced), then "
            "np.add.at(acc, idx, values)."
        )
    mask = _member_mask(indices)
    if mask is not None:
        trace.assign(a, _masked_write(a, mask, b, add=True))
        return
    dynamic = _split_dynamic(indices)
    if dynamic is not None:  # a loop counter (or another traced integer) as the index: an
        # input of the instruction, as for x[i] = v, not the value seen while recording
        template, positions, index_values = dynamic
        trace.assign(
            a,
            bind(
                dyn_scatter_add_p,
                (a, b, *index_values),
                {"template": template, "positions": positions},
            ),
        )
        return
    trace.assign(a, bind(scatter_add_p, (a, b), {"idx": normalize_index(indices)}))


def _has_tracer(idx) -> bool:
    return any(type(i) is trace.Tracer for i in idx)


dyn_scatter_add_p = Primitive(
    "dyn_scatter_add",
    lambda base, vals, *iv, template, positions: _scatter_add_impl(
        base, vals, _fill(template, positions, iv)
    ),
    vjps=lambda i, g, ans, base, vals, *iv, template, positions: (
        g
        if i == 0
        else unbroadcast(getitem(g, _fill(template, positions, iv)), shape_of(vals))
        if i == 1
        else None
    ),
    jvp=lambda ts, ans, base, vals, *iv, template, positions: _scatter_add_impl(
        ts[0] if ts[0] is not None else np.zeros(shape_of(ans), dtype_of(ans)),
        ts[1] if ts[1] is not None else np.zeros(shape_of(vals), dtype_of(ans)),
        _fill(template, positions, iv),
    ),
    variadic=True,
)


def materialize(ct):
    """A dense array from a SparseCotangent (or a list of them)."""
    pieces = ct if isinstance(ct, list) else [ct]
    shape, dtype = pieces[0].shape, pieces[0].dtype
    if any(type(p.values) is trace.Tracer or _has_tracer(p.index) for p in pieces):
        buf = np.zeros(shape, dtype)
        for p in pieces:
            mask = _member_mask(p.index)
            if mask is not None:
                buf = _masked_write(buf, mask, p.values, add=True)
                continue
            dynamic = _split_dynamic(p.index)
            if dynamic is None:
                buf = bind(scatter_add_p, (buf, p.values), {"idx": p.index})
            else:
                template, positions, index_values = dynamic
                buf = bind(
                    dyn_scatter_add_p,
                    (buf, p.values, *index_values),
                    {"template": template, "positions": positions},
                )
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
    "where",
    lambda c, x, y: np.where(c, x, y),
    vjps=(
        None,
        lambda g, ans, c, x, y: unbroadcast(np.where(c, g, 0), shape_of(x)),
        lambda g, ans, c, x, y: unbroadcast(np.where(c, 0, g), shape_of(y)),
    ),
    jvp=lambda ts, ans, c, x, y: _where_jvp(ts, ans, c, x, y),
    linear=True,
    jvp_batched=True,
    native="@select",
)


def _where_jvp(ts, ans, c, x, y):
    nd = ndim_of(ans)
    lead = batch_shape(ts[1], x) if ts[1] is not None else batch_shape(ts[2], y)
    tx = 0 if ts[1] is None else lift_tangent(ts[1], x, nd)
    ty = 0 if ts[2] is None else lift_tangent(ts[2], y, nd)
    return np.broadcast_to(np.where(c, tx, ty), lead + shape_of(ans))


@implements(np.where)
def where(condition, x=None, y=None):
    if x is None and y is None:
        return np.nonzero(condition)
    return bind(where_p, (condition, x, y), {})


@implements(np.select)
def select(condlist, choicelist, default=0):
    for i, c in enumerate(condlist):  # NumPy refuses non-boolean conditions
        if np.result_type(dtype_of(c) if hasattr(c, "dtype") else np.asarray(c)) != np.bool_:
            raise TypeError(f"invalid entry {i} in condlist: should be boolean ndarray")
    out = default
    for c, ch in reversed(list(zip(condlist, choicelist))):
        out = where(c, ch, out)
    return np.broadcast_to(
        out,
        np.broadcast_shapes(*(shape_of(c) for c in condlist), *(shape_of(ch) for ch in choicelist)),
    )


@implements(np.take)
def take(a, indices, axis=None, out=None, mode="raise"):
    if axis is None:
        return getitem(np.ravel(a), indices)  # a may be a constant, indices traced
    return getitem(a, (slice(None),) * (int(axis) % ndim_of(a)) + (indices,))


def _along_axis_index(arr_shape, indices, axis):
    nd = len(arr_shape)
    ishape = shape_of(indices)
    idx = []
    for d in range(nd):
        if d == axis:
            idx.append(indices)  # a traced index stays data (no guard)
        else:
            shp = [1] * nd
            shp[d] = ishape[d]
            idx.append(np.arange(ishape[d]).reshape(shp))
    return tuple(idx)


@implements(np.take_along_axis)
def take_along_axis(arr, indices, axis=-1):
    if axis is None:
        return getitem(np.ravel(arr), indices)
    axis = int(axis) % ndim_of(arr)
    return getitem(arr, _along_axis_index(shape_of(arr), indices, axis))


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


# --- insert, delete, sliding windows: NumPy run on labels gives the gather ------------------------
def _labels(shape, start=0):
    return np.arange(start, start + int(np.prod(shape)), dtype=np.intp).reshape(shape)


def _operand(x):
    return x if type(x) is trace.Tracer else np.asanyarray(x)


@implements(np.delete)
def delete(arr, obj, axis=None):
    """np.delete: the positions NumPy keeps, gathered (obj may be an int, slice, list or mask)."""
    arr = _operand(arr)
    keep = np.delete(_labels(shape_of(arr)), _concrete(obj), axis=axis)
    return getitem(np.ravel(arr), keep)


@implements(np.insert)
def insert(arr, obj, values, axis=None):
    """np.insert: NumPy's placement of the original and the inserted values, as one gather
    (the values are cast to arr's dtype and broadcast as NumPy does; both are differentiable)."""
    arr = _operand(arr)
    values = _operand(values)
    if dtype_of(values) != dtype_of(arr):
        values = values.astype(dtype_of(arr))
    n = int(np.prod(shape_of(arr)))
    where_from = np.insert(
        _labels(shape_of(arr)), _concrete(obj), _labels(shape_of(values), n), axis=axis
    )
    pool = np.concatenate([np.ravel(arr), np.ravel(values)])
    return getitem(pool, where_from)


@implements(np.lib.stride_tricks.sliding_window_view)
def sliding_window_view(x, window_shape, axis=None, *, subok=False, writeable=False):
    """sliding_window_view: the windows as a gather (a copy: writing through it is refused)."""
    if writeable:
        raise GradtapeError(
            "sliding_window_view(..., writeable=True) writes through a view, "
            "which cannot be traced; build the result with np.stack instead."
        )
    x = _operand(x)
    windows = np.lib.stride_tricks.sliding_window_view(
        _labels(shape_of(x)), window_shape, axis=axis
    )
    return getitem(np.ravel(x), np.ascontiguousarray(windows))


# --- partition: NumPy's arrangement, as a gather -----------------------------------------------
def _partition_index_impl(a, kth, axis):
    """Positions whose values are np.partition(a, kth, axis), in its arrangement."""
    if type(a) is trace.Tracer:  # a value of an outer level (compile(grad(f))): recorded there
        return bind(partition_index_p, (a,), {"kth": kth, "axis": axis})
    index = np.argpartition(a, kth, axis=axis)
    expected = np.partition(a, kth, axis=axis)
    if np.array_equal(np.take_along_axis(a, index, axis=axis), expected, equal_nan=True):
        return index
    # another arrangement of the same values: match them through both sorted orders
    order_a = np.argsort(a, axis=axis, kind="stable")
    order_p = np.argsort(expected, axis=axis, kind="stable")
    index = np.empty_like(order_a)
    np.put_along_axis(index, order_p, order_a, axis=axis)
    return index


partition_index_p = Primitive("partition_index", _partition_index_impl, nondiff=True)


@implements(np.partition)
def partition(a, kth, axis=-1, kind="introselect", order=None):
    """np.partition: NumPy's arrangement of the values, gathered (the gradient follows them)."""
    if order is not None:
        raise GradtapeError(
            "np.partition(..., order=...) sorts structured arrays, which have no derivative."
        )
    if axis is None:
        a, axis = np.ravel(a), 0
    axis = int(axis) % max(ndim_of(a), 1)
    kth = _concrete(kth)
    kth = tuple(int(k) for k in np.atleast_1d(kth))
    return take_along_axis(a, bind(partition_index_p, (a,), {"kth": kth, "axis": axis}), axis)


# --- in-place writes on a traced array: functional updates, the caller's Tracer rebound -------
def _rebind(target, new):
    trace.assign(target, new)  # seen by every name bound to target and by its live views


def _traced_destination(a, name):
    if type(a) is not trace.Tracer:
        raise GradtapeError(
            f"np.{name} writes traced values into a plain ndarray, which would cut the "
            "gradient. Start from a traced array instead: y = np.zeros_like(x) (x traced), "
            f"then np.{name}(y, ...)."
        )


def _cyclic(values, n):
    """The first n of `values` flattened and repeated (how NumPy's flat writes fill)."""
    flat = np.ravel(_operand(values))
    m = shape_of(flat)[0]
    if m == 0:
        raise ValueError("cannot write from an empty array of values")
    return flat if m == n else getitem(flat, np.arange(n) % m)


@implements(np.fill_diagonal)
def fill_diagonal(a, val, wrap=False):
    """np.fill_diagonal on a traced array (values repeated as NumPy's flat write does)."""
    _traced_destination(a, "fill_diagonal")
    shape = shape_of(a)
    if len(shape) < 2:
        raise ValueError("array must be at least 2-d")
    end = None
    if len(shape) == 2:
        step = shape[1] + 1
        if not wrap:
            end = shape[1] * shape[1]
    else:
        if any(d != shape[0] for d in shape):
            raise ValueError("All dimensions of input must be of equal length")
        step = 1 + int(np.cumprod(shape[:-1]).sum())
    positions = np.arange(int(np.prod(shape)))[:end:step]
    flat = np.ravel(a).copy()  # written below: not a view of a
    flat[positions] = _cyclic(val, positions.size)
    _rebind(a, np.reshape(flat, shape))


def _batch_member(x) -> bool:
    """Whether `x` is a member of a vmap batch (its values differ per member)."""
    return type(x) is trace.Tracer and x._level.batch_size is not None


def _index_operand(indices):
    """Indices of a write: a member of a vmap batch stays traced (the batching rules of the
    writes give each member its own), any other value is concrete (a guard when staging)."""
    return indices if _batch_member(indices) else _concrete(indices)


def _flat_positions(ind, n: int, mode: str):
    """np.put's flat positions: wrapped, clipped, or checked against the size `n`."""
    if mode == "wrap":
        return ind % n
    if mode == "clip":
        return np.clip(ind, 0, n - 1)
    values = np.asarray(_innermost(ind))  # every member's, checked as each would be alone
    if values.size and (values.max() >= n or values.min() < -n):
        bad = values[(values >= n) | (values < -n)].ravel()[0]
        raise IndexError(f"index {bad} is out of bounds for axis 0 with size {n}")
    return ind


@implements(np.put)
def put(a, ind, v, mode="raise"):
    """np.put on a traced array: a.flat[ind] = v (values repeated; the last write wins)."""
    _traced_destination(a, "put")
    n = int(np.prod(shape_of(a)))
    ind = _index_operand(ind)
    ind = np.ravel(ind).astype(np.intp) if _batch_member(ind) else np.asarray(ind, np.intp).ravel()
    ind = _flat_positions(ind, n, mode)
    if shape_of(ind)[0] == 0:
        return
    flat = np.ravel(a).copy()  # written below: not a view of a
    flat[ind] = _cyclic(v, shape_of(ind)[0])
    _rebind(a, np.reshape(flat, shape_of(a)))


@implements(np.put_along_axis)
def put_along_axis(arr, indices, values, axis):
    """np.put_along_axis on a traced array."""
    _traced_destination(arr, "put_along_axis")
    indices = _index_operand(indices)
    if axis is None:
        flat = np.ravel(arr).copy()  # written below: not a view of arr
        flat[indices] = values
        _rebind(arr, np.reshape(flat, shape_of(arr)))
        return
    axis = int(axis) % ndim_of(arr)
    arr[_along_axis_index(shape_of(arr), indices, axis)] = values


@implements(np.place)
def place(arr, mask, vals):
    """np.place on a traced array: the masked entries take vals in turn (repeated)."""
    _traced_destination(arr, "place")
    if _batch_member(mask):
        _place_per_member_mask(arr, mask, vals)
        return
    mask = np.asarray(_concrete(mask), dtype=bool)
    n = int(np.count_nonzero(mask))
    if n:
        arr[mask] = _cyclic(vals, n)


def _place_per_member_mask(arr, mask, vals):
    """np.place with a mask that differs per member of a vmap batch: the k-th masked entry
    (in the flattened order) takes vals.flat[k % len(vals)], a gather at each member's
    running count, written with np.where (one shape for every member)."""
    flat_mask = np.ravel(np.broadcast_to(mask, shape_of(arr)))
    if np.any(np.asarray(_innermost(mask))) and int(np.prod(shape_of(vals))) == 0:
        raise ValueError("Cannot insert from an empty array!")
    if int(np.prod(shape_of(vals))) == 0:
        return
    flat_vals = np.ravel(_operand(vals))
    rank = np.cumsum(flat_mask.astype(np.intp)) - 1
    taken = flat_vals[rank % shape_of(flat_vals)[0]].astype(dtype_of(arr))
    _rebind(arr, np.reshape(np.where(flat_mask, taken, np.ravel(arr)), shape_of(arr)))


@implements(np.putmask)
def putmask(a, mask, values):
    """np.putmask on a traced array: a.flat[i] = values.flat[i % len(values)] where mask."""
    _traced_destination(a, "putmask")
    shape = shape_of(a)
    full = np.reshape(_cyclic(values, int(np.prod(shape))), shape)
    _rebind(a, np.where(mask, full, a))


@implements(np.copyto)
def copyto(dst, src, casting="same_kind", where=True):
    """np.copyto into a traced array."""
    _traced_destination(dst, "copyto")
    src = _operand(src)
    if not np.can_cast(dtype_of(src), dtype_of(dst), casting=casting):
        raise TypeError(
            f"Cannot cast array data from {dtype_of(src)!r} to {dtype_of(dst)!r} "
            f"according to the rule {casting!r}"
        )
    if dtype_of(src) != dtype_of(dst):
        src = src.astype(dtype_of(dst))
    _rebind(dst, np.where(where, src, dst))


@implements(np.extract)
def extract(condition, arr):
    """np.extract: the entries where condition holds (a gather)."""
    return take(np.ravel(_operand(arr)), np.nonzero(np.ravel(condition))[0])


@implements(np.compress)
def compress(condition, a, axis=None, out=None):
    """np.compress: the slices where condition holds along an axis (a gather)."""
    if out is not None:
        raise GradtapeError("np.compress(..., out=...) cannot be traced; assign the result.")
    a = _operand(a)
    cond = np.asarray(_concrete(condition), dtype=bool)
    if cond.ndim != 1:
        raise ValueError("condition must be a 1-d array")
    if axis is None:
        a, axis = np.ravel(a), 0
    n = shape_of(a)[axis]
    if cond.size > n:
        raise IndexError(f"index {n} is out of bounds for axis {axis} with size {n}")
    return take(a, np.flatnonzero(cond), axis=axis)
