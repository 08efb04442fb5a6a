"""Shape primitives: reshape, transpose, broadcast, concatenate, casts, and their composites."""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements, implements_method
from ..core.tracing import bind
from ._util import batch_shape, dtype_of, lift_tangent, ndim_of, shape_of, unbroadcast

reshape_p = Primitive(
    "reshape", lambda x, shape: np.reshape(x, shape),
    vjps=(lambda g, ans, x, shape: np.reshape(g, shape_of(x)),),
    jvp=lambda ts, ans, x, shape: reshape_p(ts[0], shape=batch_shape(ts[0], x) + shape),
    linear=True, jvp_batched=True, aliases_input=True,
)

transpose_p = Primitive(
    "transpose", lambda x, axes: np.transpose(x, axes),
    vjps=(lambda g, ans, x, axes: np.transpose(g, tuple(np.argsort(axes))),),
    jvp=lambda ts, ans, x, axes: _transpose_tangent(ts[0], x, axes),
    linear=True, jvp_batched=True, aliases_input=True,
)


def _transpose_tangent(t, x, axes):
    k = len(batch_shape(t, x))
    return transpose_p(t, axes=tuple(range(k)) + tuple(a + k for a in axes))

broadcast_p = Primitive(
    "broadcast_to", lambda x, shape: np.broadcast_to(x, shape),
    vjps=(lambda g, ans, x, shape: unbroadcast(g, shape_of(x)),),
    jvp=lambda ts, ans, x, shape: broadcast_p(lift_tangent(ts[0], x, len(shape)),
                                              shape=batch_shape(ts[0], x) + shape),
    linear=True, jvp_batched=True, aliases_input=True,
)


def _concat_vjp(i, g, ans, *args, axis):
    start = sum(shape_of(a)[axis] for a in args[:i])
    idx = (slice(None),) * axis + (slice(start, start + shape_of(args[i])[axis]),)
    return g[idx]


def _concat_jvp(ts, ans, *args, axis):
    lead = next(batch_shape(t, a) for t, a in zip(ts, args) if t is not None)
    parts = [t if t is not None else np.zeros(lead + shape_of(a), dtype_of(ans))
             for t, a in zip(ts, args)]
    return concatenate_p(*parts, axis=axis + len(lead))


concatenate_p = Primitive(
    "concatenate", lambda *xs, axis: np.concatenate(xs, axis=axis),
    vjps=_concat_vjp, jvp=_concat_jvp, linear=True, variadic=True, jvp_batched=True,
)

astype_p = Primitive(
    "astype", lambda x, dtype: x.astype(dtype),
    vjps=(lambda g, ans, x, dtype: g.astype(dtype_of(x)),),
    jvp=lambda ts, ans, x, dtype: ts[0].astype(dtype), linear=True, jvp_batched=True,
)

# A fresh array shaped like a traced one: a Tracer with no derivative, so that functional
# writes (y = np.zeros_like(x); y[1:] = ...) are recorded.
full_like_p = Primitive(
    "full_like", lambda x, fill, dtype: np.full_like(x, fill, dtype=dtype),
    vjps=(None,), jvp=lambda ts, ans, x, fill, dtype: None, jvp_batched=True,
)


@implements_method("astype")
def astype(x, dtype):
    if dtype == dtype_of(x):
        return x
    return bind(astype_p, (x,), {"dtype": np.dtype(dtype)})


def transpose(x, axes=None):
    n = ndim_of(x)
    axes = tuple(reversed(range(n))) if axes is None else tuple(int(a) % n for a in axes)
    if axes == tuple(range(n)):
        return x
    return bind(transpose_p, (x,), {"axes": axes})


def _resolve_shape(x, newshape):
    if isinstance(newshape, (int, np.integer)):
        newshape = (int(newshape),)
    newshape = tuple(int(d) for d in newshape)
    if -1 in newshape:
        size = int(np.prod(shape_of(x)))
        known = int(np.prod([d for d in newshape if d != -1]))
        newshape = tuple(size // known if d == -1 else d for d in newshape)
    return newshape


@implements(np.reshape)
def reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    if order not in ("C", "A"):
        raise GradtapeError("reshape with order='F' is not supported while tracing; "
                            "use np.transpose and a C-order reshape.")
    shape = _resolve_shape(a, shape if shape is not None else newshape)
    if shape == shape_of(a):
        return a
    return bind(reshape_p, (a,), {"shape": shape})


implements(np.transpose)(lambda a, axes=None: transpose(a, axes))
implements(np.ravel)(lambda a, order="C": reshape(a, (-1,), order=order))


@implements(np.broadcast_to)
def broadcast_to(array, shape, subok=False):
    shape = tuple(shape) if not isinstance(shape, (int, np.integer)) else (int(shape),)
    if shape == shape_of(array):
        return array
    return bind(broadcast_p, (array,), {"shape": shape})


@implements(np.broadcast_arrays)
def broadcast_arrays(*args, subok=False):
    shape = np.broadcast_shapes(*(shape_of(a) for a in args))
    return tuple(broadcast_to(a, shape) for a in args)


@implements(np.moveaxis)
def moveaxis(a, source, destination):
    n = ndim_of(a)
    src = [source] if isinstance(source, (int, np.integer)) else list(source)
    dst = [destination] if isinstance(destination, (int, np.integer)) else list(destination)
    src = [s % n for s in src]
    dst = [d % n for d in dst]
    order = [i for i in range(n) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(a, order)


@implements(np.swapaxes)
def swapaxes(a, axis1, axis2):
    axes = list(range(ndim_of(a)))
    axes[axis1], axes[axis2] = axes[axis2], axes[axis1]
    return transpose(a, axes)


@implements(np.expand_dims)
def expand_dims(a, axis):
    shape = list(shape_of(a))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    n = len(shape) + len(axes)
    for ax in sorted(x % n for x in axes):
        shape.insert(ax, 1)
    return reshape(a, tuple(shape))


@implements(np.squeeze)
def squeeze(a, axis=None):
    shape = shape_of(a)
    if axis is None:
        axes = {i for i, d in enumerate(shape) if d == 1}
    else:
        axes = {int(x) % len(shape) for x in ((axis,) if isinstance(axis, (int, np.integer))
                                                else axis)}
        if any(shape[i] != 1 for i in axes):
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    return reshape(a, tuple(d for i, d in enumerate(shape) if i not in axes))


def _as_operand(x):
    return x if hasattr(x, "shape") else np.asarray(x)


@implements(np.concatenate)
def concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    arrays = [_as_operand(a) for a in arrays]
    if axis is None:
        arrays, axis = [reshape(a, (-1,)) for a in arrays], 0
    axis = int(axis) % ndim_of(arrays[0])
    if len(arrays) == 1:
        return arrays[0]
    return bind(concatenate_p, tuple(arrays), {"axis": axis})


@implements(np.stack)
def stack(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    arrays = [_as_operand(a) for a in arrays]
    n = ndim_of(arrays[0]) + 1
    return concatenate([expand_dims(a, int(axis) % n) for a in arrays], axis=int(axis) % n)


@implements(np.atleast_1d)
def atleast_1d(*arys):
    res = [reshape(a, (1,)) if ndim_of(a) == 0 else a for a in map(_as_operand, arys)]
    return res[0] if len(res) == 1 else tuple(res)


@implements(np.atleast_2d)
def atleast_2d(*arys):
    res = []
    for a in map(_as_operand, arys):
        nd = ndim_of(a)
        res.append(reshape(a, (1, 1)) if nd == 0 else reshape(a, (1,) + shape_of(a)) if nd == 1
                   else a)
    return res[0] if len(res) == 1 else tuple(res)


@implements(np.atleast_3d)
def atleast_3d(*arys):
    res = []
    for a in map(_as_operand, arys):
        s = shape_of(a)
        res.append(reshape(a, (1, 1, 1)) if len(s) == 0 else reshape(a, (1,) + s + (1,))
                   if len(s) == 1 else reshape(a, s + (1,)) if len(s) == 2 else a)
    return res[0] if len(res) == 1 else tuple(res)


@implements(np.hstack)
def hstack(tup, dtype=None, casting="same_kind"):
    arrs = atleast_1d(*tup)
    arrs = [arrs] if not isinstance(arrs, tuple) else list(arrs)
    return concatenate(arrs, axis=0 if ndim_of(arrs[0]) == 1 else 1)


@implements(np.vstack, np.row_stack) if hasattr(np, "row_stack") else implements(np.vstack)
def vstack(tup, dtype=None, casting="same_kind"):
    arrs = atleast_2d(*tup)
    arrs = [arrs] if not isinstance(arrs, tuple) else list(arrs)
    return concatenate(arrs, axis=0)


@implements(np.column_stack)
def column_stack(tup):
    arrs = [reshape(a, (-1, 1)) if ndim_of(a) < 2 else a for a in map(_as_operand, tup)]
    return concatenate(arrs, axis=1)


@implements(np.dstack)
def dstack(tup):
    arrs = atleast_3d(*tup)
    arrs = [arrs] if not isinstance(arrs, tuple) else list(arrs)
    return concatenate(arrs, axis=2)


@implements(np.split, np.array_split)
def split(ary, indices_or_sections, axis=0):
    n = shape_of(ary)[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        q, r = divmod(n, k)
        sizes = [q + 1] * r + [q] * (k - r)
        bounds = np.cumsum([0] + sizes)
    else:
        bounds = [0] + [min(int(i), n) for i in indices_or_sections] + [n]
    pre = (slice(None),) * (axis % ndim_of(ary))
    return [ary[pre + (slice(int(lo), int(hi)),)] for lo, hi in zip(bounds[:-1], bounds[1:])]


@implements(np.tile)
def tile(A, reps):
    reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps)
    shape = shape_of(A)
    nd = max(len(shape), len(reps))
    shape = (1,) * (nd - len(shape)) + shape
    reps = (1,) * (nd - len(reps)) + reps
    inter = tuple(x for pair in zip((1,) * nd, shape) for x in pair)
    big = tuple(x for pair in zip(reps, shape) for x in pair)
    out = broadcast_to(reshape(A, inter), big)
    return reshape(out, tuple(r * s for r, s in zip(reps, shape)))


@implements(np.repeat)
def repeat(a, repeats, axis=None):
    if axis is None:
        a, axis = reshape(a, (-1,)), 0
    axis = int(axis) % ndim_of(a)
    n = shape_of(a)[axis]
    index = np.repeat(np.arange(n), repeats)
    return a[(slice(None),) * axis + (index,)]


@implements(np.flip)
def flip(m, axis=None):
    axes = range(ndim_of(m)) if axis is None else (
        [axis] if isinstance(axis, (int, np.integer)) else axis)
    idx = [slice(None)] * ndim_of(m)
    for ax in axes:
        idx[ax] = slice(None, None, -1)
    return m[tuple(idx)]


implements(np.fliplr)(lambda m: flip(m, 1))
implements(np.flipud)(lambda m: flip(m, 0))


@implements(np.roll)
def roll(a, shift, axis=None):
    if axis is None:
        return reshape(roll(reshape(a, (-1,)), shift, 0), shape_of(a))
    shifts = (shift,) if isinstance(shift, (int, np.integer)) else shift
    axes = (axis,) if isinstance(axis, (int, np.integer)) else axis
    for s, ax in zip(shifts, axes):
        n = shape_of(a)[ax]
        index = (np.arange(n) - int(s)) % n
        a = a[(slice(None),) * (ax % ndim_of(a)) + (index,)]
    return a


def _pad_vjp(g, ans, x, pad_width, value):
    return g[tuple(slice(lo, lo + d) for (lo, _), d in zip(pad_width, shape_of(x)))]


pad_p = Primitive(
    "pad", lambda x, pad_width, value: np.pad(x, pad_width, mode="constant",
                                              constant_values=value),
    vjps=(_pad_vjp, None),
    jvp=lambda ts, ans, x, pad_width, value: pad_p(
        ts[0], pad_width=((0, 0),) * len(batch_shape(ts[0], x)) + pad_width, value=0),
    linear=True, jvp_batched=True,
)


@implements(np.pad)
def pad(array, pad_width, mode="constant", **kwargs):
    if mode != "constant":
        raise GradtapeError(f"np.pad(mode={mode!r}) has no rule; use mode='constant'.")
    value = kwargs.get("constant_values", 0)
    if not isinstance(value, (int, float)):
        raise GradtapeError("np.pad: only a scalar constant_values is supported while tracing.")
    nd = ndim_of(array)
    pw = np.broadcast_to(np.asarray(pad_width, dtype=int), (nd, 2))
    pw = tuple((int(lo), int(hi)) for lo, hi in pw)
    return bind(pad_p, (array,), {"pad_width": pw, "value": value})


def _full_like(a, fill, dtype=None):
    return bind(full_like_p, (a,), {"fill": fill, "dtype": dtype})


implements(np.zeros_like)(lambda a, dtype=None, order="K", subok=True, shape=None, **kw:
                          _full_like(a, 0, dtype) if shape is None else np.zeros(shape, dtype or
                                                                                dtype_of(a)))
implements(np.ones_like)(lambda a, dtype=None, order="K", subok=True, shape=None, **kw:
                         _full_like(a, 1, dtype) if shape is None else np.ones(shape, dtype or
                                                                              dtype_of(a)))
implements(np.empty_like)(lambda a, dtype=None, order="K", subok=True, shape=None, **kw:
                          _full_like(a, 0, dtype) if shape is None else np.zeros(shape, dtype or
                                                                                dtype_of(a)))
implements(np.full_like)(lambda a, fill_value, dtype=None, order="K", subok=True, shape=None, **kw:
                         _full_like(a, fill_value, dtype) if shape is None
                         else np.full(shape, fill_value, dtype or dtype_of(a)))
implements(np.copy)(lambda a, order="K", subok=False: a.copy())
implements(np.shape)(lambda a: shape_of(a))
implements(np.ndim)(lambda a: ndim_of(a))
implements(np.size)(lambda a, axis=None: int(np.prod(shape_of(a))) if axis is None
                    else shape_of(a)[axis])
implements(np.iscomplexobj)(lambda x: dtype_of(x).kind == "c")
implements(np.isrealobj)(lambda x: dtype_of(x).kind != "c")
implements(np.result_type)(lambda *arrays_and_dtypes: np.result_type(
    *(dtype_of(a) if hasattr(a, "_var") else a for a in arrays_and_dtypes)))
implements(np.around, np.round)(lambda a, decimals=0, out=None: np.rint(a) if decimals == 0
                                else np.rint(a * 10.0**decimals) / 10.0**decimals)
implements(np.clip)(lambda a, a_min=None, a_max=None, out=None, **kw: _clip(
    a, kw.get("min", a_min), kw.get("max", a_max)))


def _clip(a, lo, hi):
    if lo is not None:
        a = np.maximum(a, lo)
    if hi is not None:
        a = np.minimum(a, hi)
    return a
