"""Shape primitives: reshape, transpose, broadcast, concatenate, casts, and their composites."""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements, implements_method
from ..core.tracing import bind
from ._util import batch_shape, dtype_of, lift_tangent, ndim_of, shape_of, unbroadcast

reshape_p = Primitive(
    "reshape",
    lambda x, shape: np.reshape(x, shape),
    vjps=(lambda g, ans, x, shape: np.reshape(g, shape_of(x)),),
    jvp=lambda ts, ans, x, shape: reshape_p(ts[0], shape=batch_shape(ts[0], x) + shape),
    linear=True,
    jvp_batched=True,
    aliases_input=True,
)

transpose_p = Primitive(
    "transpose",
    lambda x, axes: np.transpose(x, axes),
    vjps=(lambda g, ans, x, axes: np.transpose(g, tuple(np.argsort(axes))),),
    jvp=lambda ts, ans, x, axes: _transpose_tangent(ts[0], x, axes),
    linear=True,
    jvp_batched=True,
    aliases_input=True,
)


def _transpose_tangent(t, x, axes):
    k = len(batch_shape(t, x))
    return transpose_p(t, axes=tuple(range(k)) + tuple(a + k for a in axes))


broadcast_p = Primitive(
    "broadcast_to",
    lambda x, shape: np.broadcast_to(x, shape),
    vjps=(lambda g, ans, x, shape: unbroadcast(g, shape_of(x)),),
    jvp=lambda ts, ans, x, shape: broadcast_p(
        lift_tangent(ts[0], x, len(shape)), shape=batch_shape(ts[0], x) + shape
    ),
    linear=True,
    jvp_batched=True,
    native="@broadcast",
    aliases_input=True,
)


def _concat_vjp(i, g, ans, *args, axis):
    start = sum(shape_of(a)[axis] for a in args[:i])
    idx = (slice(None),) * axis + (slice(start, start + shape_of(args[i])[axis]),)
    return g[idx]


def _concat_jvp(ts, ans, *args, axis):
    lead = next(batch_shape(t, a) for t, a in zip(ts, args) if t is not None)
    parts = [
        t if t is not None else np.zeros(lead + shape_of(a), dtype_of(ans))
        for t, a in zip(ts, args)
    ]
    return concatenate_p(*parts, axis=axis + len(lead))


concatenate_p = Primitive(
    "concatenate",
    lambda *xs, axis: np.concatenate(xs, axis=axis),
    vjps=_concat_vjp,
    jvp=_concat_jvp,
    linear=True,
    variadic=True,
    jvp_batched=True,
)


def _cast(t, dtype):
    """A cotangent or tangent cast to `dtype`: from complex to real it is the real part (the
    transpose of the real-to-complex cast; `astype` would warn that it discards the rest)."""
    if dtype.kind != "c" and dtype_of(t).kind == "c":
        t = np.real(t)
    return t.astype(dtype)


astype_p = Primitive(
    "astype",
    lambda x, dtype: x.astype(dtype),
    vjps=(lambda g, ans, x, dtype: _cast(g, dtype_of(x)),),
    jvp=lambda ts, ans, x, dtype: _cast(ts[0], dtype),
    linear=True,
    jvp_batched=True,
    native="@convert",
)

# A fresh array shaped like a traced one: a Tracer with no derivative, so that functional
# writes (y = np.zeros_like(x); y[1:] = ...) are recorded.
full_like_p = Primitive(
    "full_like",
    lambda x, fill, dtype: np.full_like(x, fill, dtype=dtype),
    vjps=(None,),
    jvp=lambda ts, ans, x, fill, dtype: None,
    jvp_batched=True,
    constant_valued=True,
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
        if known == 0:  # NumPy's error (the unknown dimension is ambiguous)
            np.empty(shape_of(x), np.bool_).reshape(newshape)
        newshape = tuple(size // known if d == -1 else d for d in newshape)
    return newshape


@implements(np.reshape)
def reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    if order not in ("C", "A"):
        raise GradtapeError(
            "reshape with order='F' is not supported while tracing; "
            "use np.transpose and a C-order reshape."
        )
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
        axes = {
            int(x) % len(shape) for x in ((axis,) if isinstance(axis, (int, np.integer)) else axis)
        }
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
        res.append(
            reshape(a, (1, 1)) if nd == 0 else reshape(a, (1,) + shape_of(a)) if nd == 1 else a
        )
    return res[0] if len(res) == 1 else tuple(res)


@implements(np.atleast_3d)
def atleast_3d(*arys):
    res = []
    for a in map(_as_operand, arys):
        s = shape_of(a)
        res.append(
            reshape(a, (1, 1, 1))
            if len(s) == 0
            else reshape(a, (1,) + s + (1,))
            if len(s) == 1
            else reshape(a, s + (1,))
            if len(s) == 2
            else a
        )
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


@implements(np.array_split)
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
    axes = (
        range(ndim_of(m))
        if axis is None
        else ([axis] if isinstance(axis, (int, np.integer)) else axis)
    )
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
    "pad",
    lambda x, pad_width, value: np.pad(x, pad_width, mode="constant", constant_values=value),
    vjps=(_pad_vjp, None),
    jvp=lambda ts, ans, x, pad_width, value: pad_p(
        ts[0], pad_width=((0, 0),) * len(batch_shape(ts[0], x)) + pad_width, value=0
    ),
    linear=True,
    jvp_batched=True,
)


@implements(np.pad)
def pad(array, pad_width, mode="constant", **kwargs):
    value = kwargs.get("constant_values", 0)
    if mode != "constant" or not isinstance(value, (int, float)) or isinstance(pad_width, dict):
        return _pad_modes(array, pad_width, mode, kwargs)
    nd = ndim_of(array)
    pw = np.broadcast_to(np.asarray(pad_width, dtype=int), (nd, 2))
    pw = tuple((int(lo), int(hi)) for lo, hi in pw)
    return bind(pad_p, (array,), {"pad_width": pw, "value": value})


def _full_like(a, fill, dtype=None):
    return bind(full_like_p, (a,), {"fill": fill, "dtype": dtype})


implements(np.zeros_like)(
    lambda a, dtype=None, order="K", subok=True, shape=None, **kw: (
        _full_like(a, 0, dtype) if shape is None else np.zeros(shape, dtype or dtype_of(a))
    )
)
implements(np.ones_like)(
    lambda a, dtype=None, order="K", subok=True, shape=None, **kw: (
        _full_like(a, 1, dtype) if shape is None else np.ones(shape, dtype or dtype_of(a))
    )
)
implements(np.empty_like)(
    lambda a, dtype=None, order="K", subok=True, shape=None, **kw: (
        _full_like(a, 0, dtype) if shape is None else np.zeros(shape, dtype or dtype_of(a))
    )
)
implements(np.full_like)(
    lambda a, fill_value, dtype=None, order="K", subok=True, shape=None, **kw: (
        _full_like(a, fill_value, dtype)
        if shape is None
        else np.full(shape, fill_value, dtype or dtype_of(a))
    )
)
implements(np.copy)(lambda a, order="K", subok=False: a.copy())
implements(np.shape)(lambda a: shape_of(a))
implements(np.ndim)(lambda a: ndim_of(a))
implements(np.size)(
    lambda a, axis=None: int(np.prod(shape_of(a))) if axis is None else shape_of(a)[axis]
)
implements(np.iscomplexobj)(lambda x: dtype_of(x).kind == "c")
implements(np.isrealobj)(lambda x: dtype_of(x).kind != "c")
implements(np.result_type)(
    lambda *arrays_and_dtypes: np.result_type(
        *(dtype_of(a) if hasattr(a, "_var") else a for a in arrays_and_dtypes)
    )
)
implements(np.common_type)(
    # the scalar type of empty arrays of the same dtypes (a traced value answers with its dtype)
    lambda *arrays: np.common_type(*(np.empty(0, dtype_of(a)) for a in arrays))
)
implements(np.around, np.round)(
    lambda a, decimals=0, out=None: (
        np.rint(a) if decimals == 0 else np.rint(a * 10.0**decimals) / 10.0**decimals
    )
)
implements(np.clip)(
    lambda a, a_min=None, a_max=None, out=None, **kw: _clip(
        a, kw.get("min", a_min), kw.get("max", a_max)
    )
)


def _clip(a, lo, hi):
    if lo is not None:
        a = np.maximum(a, lo)
    if hi is not None:
        a = np.minimum(a, hi)
    return a


# --- np.pad in every mode: NumPy's algorithm, on a traced array ---------------------------------
# NumPy pads axis by axis, writing slices of the padded array from other slices of it; here the
# writes are functional (setitem on a Tracer), so every mode is NumPy's own arithmetic and is
# differentiable through the gathers, ramps and statistics it is made of.
def _as_pairs(x, ndim, as_index=False):
    """NumPy's broadcasting of pad_width, constant_values, end_values and stat_length."""
    if x is None:
        return ((None, None),) * ndim
    if hasattr(x, "_var"):  # traced values: broadcast without reading them
        if as_index:
            raise GradtapeError("np.pad: pad widths and stat_length must not be traced.")
        if ndim_of(x) == 0 or shape_of(x) in ((1,), (1, 1)):
            v = np.reshape(x, ())
            return ((v, v),) * ndim
        if shape_of(x) in ((2,), (1, 2)):
            v = np.reshape(x, (2,))
            return ((v[0], v[1]),) * ndim
        b = np.broadcast_to(x, (ndim, 2))
        return tuple((b[i, 0], b[i, 1]) for i in range(ndim))
    x = np.array(x)
    if as_index:
        x = np.round(x).astype(np.intp, copy=False)
    if x.ndim < 3:
        if x.size == 1:
            x = x.ravel()
            if as_index and x < 0:
                raise ValueError("index can't contain negative values")
            return ((x[0], x[0]),) * ndim
        if x.size == 2 and x.shape != (2, 1):
            x = x.ravel()
            if as_index and (x[0] < 0 or x[1] < 0):
                raise ValueError("index can't contain negative values")
            return ((x[0], x[1]),) * ndim
    if as_index and x.min() < 0:
        raise ValueError("index can't contain negative values")
    return tuple(tuple(p) for p in np.broadcast_to(x, (ndim, 2)).tolist())


class _Padded:
    """The padded array and, per axis, the region NumPy works on (its view `roi`): the axes
    before and at `axis` whole, the later ones restricted to the original area."""

    def __init__(self, array, pad_width):
        self.array = bind(pad_p, (array,), {"pad_width": pad_width, "value": 0})
        self.original = tuple(slice(lo, lo + d) for d, (lo, _) in zip(shape_of(array), pad_width))

    def index(self, axis, sl, roi=True):
        rest = (
            self.original[axis + 1 :] if roi else (slice(None),) * (len(self.original) - axis - 1)
        )
        return (slice(None),) * axis + (sl,) + rest

    def get(self, axis, sl, roi=True):
        return self.array[self.index(axis, sl, roi)]

    def set(self, axis, sl, value, roi=True):
        self.array[self.index(axis, sl, roi)] = value  # a functional write: rebinds the Tracer

    def length(self, axis):
        return shape_of(self.array)[axis]


def _pad_edges(p, axis, width, roi=True):
    lo = width[0]
    hi = p.length(axis) - width[1]
    return p.get(axis, slice(lo, lo + 1), roi), p.get(axis, slice(hi - 1, hi), roi)


def _pad_area(p, axis, width, values, roi=True):
    p.set(axis, slice(None, width[0]), values[0], roi)
    p.set(axis, slice(p.length(axis) - width[1], None), values[1], roi)


def _pad_ramps(p, axis, width, ends):
    edges = _pad_edges(p, axis, width)
    dt = dtype_of(p.array)
    left, right = (
        np.linspace(end, np.squeeze(edge, axis), num=w, endpoint=False, dtype=dt, axis=axis)
        for end, edge, w in zip(ends, edges, width)
    )
    return left, right[(slice(None),) * axis + (slice(None, None, -1),)]


def _pad_stats(p, axis, width, length, func):
    lo = width[0]
    hi = p.length(axis) - width[1]
    most = hi - lo
    left_n, right_n = length
    left_n = most if left_n is None or most < left_n else left_n
    right_n = most if right_n is None or most < right_n else right_n
    if (left_n == 0 or right_n == 0) and func in (np.amax, np.amin):
        raise ValueError("stat_length of 0 yields no value for padding")

    def stat(chunk):
        r = func(chunk, axis=axis, keepdims=True)
        return np.rint(r) if dtype_of(p.array).kind in "iu" else r

    left = stat(p.get(axis, slice(lo, lo + left_n)))
    if left_n == right_n == most:
        return left, left
    return left, stat(p.get(axis, slice(hi - right_n, hi)))


def _pad_reflect(p, axis, width, method, period, include_edge):
    left, right = width
    old = p.length(axis) - right - left
    if include_edge:
        old = old // period * period
        offset = 1
    else:
        old = (old - 1) // (period - 1) * (period - 1) + 1
        offset = 0
        old -= 1
    if left > 0:
        n = min(old, left)
        stop = left - offset
        chunk = p.get(axis, slice(stop + n, stop, -1))
        if method == "odd":
            chunk = 2 * p.get(axis, slice(left, left + 1)) - chunk
        p.set(axis, slice(left - n, left), chunk)
        left -= n
    if right > 0:
        n = min(old, right)
        start = -right + offset - 2
        chunk = p.get(axis, slice(start, start - n, -1))
        if method == "odd":
            chunk = 2 * p.get(axis, slice(-right - 1, -right)) - chunk
        start = p.length(axis) - right
        p.set(axis, slice(start, start + n), chunk)
        right -= n
    return left, right


def _pad_wrap(p, axis, width, period):
    left, right = width
    span = p.length(axis) - right - left
    span = span // period * period
    new_left = new_right = 0
    if left > 0:
        end = left + span
        chunk = p.get(axis, slice(end - min(span, left), end))
        if left > span:
            area = slice(left - span, left)
            new_left = left - span
        else:
            area = slice(None, left)
        p.set(axis, area, chunk)
    if right > 0:
        start = -right - span
        chunk = p.get(axis, slice(start, start + min(span, right)))
        if right > span:
            area = slice(-right, -right + span)
            new_right = right - span
        else:
            area = slice(-right, None)
        p.set(axis, area, chunk)
    return new_left, new_right


_PAD_KWARGS = {
    "empty": [],
    "edge": [],
    "wrap": [],
    "constant": ["constant_values"],
    "linear_ramp": ["end_values"],
    "maximum": ["stat_length"],
    "mean": ["stat_length"],
    "median": ["stat_length"],
    "minimum": ["stat_length"],
    "reflect": ["reflect_type"],
    "symmetric": ["reflect_type"],
}


def _pad_modes(array, pad_width, mode, kwargs):
    """np.pad for every mode, keyword and pad_width form, as NumPy computes it."""
    nd = ndim_of(array)
    if isinstance(pad_width, dict):
        seq = [(0, 0)] * nd
        for axis, width in pad_width.items():
            seq[axis] = (width, width) if isinstance(width, int) else tuple(width)
        pad_width = seq
    widths = np.asarray(pad_width)
    if widths.dtype.kind != "i":
        raise TypeError("`pad_width` must be of integral type.")
    widths = tuple((int(lo), int(hi)) for lo, hi in _as_pairs(widths, nd, as_index=True))
    if callable(mode):
        raise GradtapeError(
            "np.pad with a function as mode writes into views of the padded "
            "array, which cannot be traced; pad with a named mode, or build "
            "the border with np.concatenate."
        )
    if mode not in _PAD_KWARGS:
        raise ValueError(f"mode '{mode}' is not supported")
    unsupported = set(kwargs) - set(_PAD_KWARGS[mode])
    if unsupported:
        raise ValueError(f"unsupported keyword arguments for mode '{mode}': {unsupported}")
    p = _Padded(array, widths)
    shape = shape_of(array)
    size = int(np.prod(shape))
    if mode == "constant":
        values = _as_pairs(kwargs.get("constant_values", 0), nd)
        for axis in range(nd):
            _pad_area(p, axis, widths[axis], values[axis])
    elif mode == "empty":
        pass  # NumPy leaves the border uninitialised: zeros here
    elif size == 0:
        for axis, width in enumerate(widths):
            if shape[axis] == 0 and any(width):
                raise ValueError(
                    f"can't extend empty axis {axis} using modes other than 'constant' or 'empty'"
                )
    elif mode == "edge":
        for axis in range(nd):
            _pad_area(p, axis, widths[axis], _pad_edges(p, axis, widths[axis]))
    elif mode == "linear_ramp":
        ends = _as_pairs(kwargs.get("end_values", 0), nd)
        for axis in range(nd):
            _pad_area(p, axis, widths[axis], _pad_ramps(p, axis, widths[axis], ends[axis]))
    elif mode in ("maximum", "minimum", "mean", "median"):
        func = {"maximum": np.amax, "minimum": np.amin, "mean": np.mean, "median": np.median}[mode]
        lengths = _as_pairs(kwargs.get("stat_length"), nd, as_index=True)
        for axis in range(nd):
            stats = _pad_stats(p, axis, widths[axis], lengths[axis], func)
            _pad_area(p, axis, widths[axis], stats)
    elif mode in ("reflect", "symmetric"):
        method = kwargs.get("reflect_type", "even")
        for axis, (left, right) in enumerate(widths):
            if shape[axis] == 1 and (left > 0 or right > 0):
                edges = _pad_edges(p, axis, (left, right), roi=False)
                _pad_area(p, axis, (left, right), edges, roi=False)
                continue
            while left > 0 or right > 0:
                left, right = _pad_reflect(
                    p, axis, (left, right), method, shape[axis], mode == "symmetric"
                )
    elif mode == "wrap":
        for axis, (left, right) in enumerate(widths):
            period = p.length(axis) - right - left
            while left > 0 or right > 0:
                left, right = _pad_wrap(p, axis, (left, right), period)
    return p.array


# --- more shapes --------------------------------------------------------------------------------
@implements(np.append)
def append(arr, values, axis=None):
    """np.append: a concatenation (the values are flattened when axis is None)."""
    arr = _as_operand(arr)
    if axis is None:
        if ndim_of(arr) != 1:
            arr = reshape(arr, (-1,))
        values = reshape(_as_operand(values), (-1,))
        axis = ndim_of(arr) - 1
    return np.concatenate((arr, values), axis=axis)


@implements(np.rot90)
def rot90(m, k=1, axes=(0, 1)):
    """np.rot90: flips and a transpose, as NumPy does."""
    axes = tuple(axes)
    if len(axes) != 2:
        raise ValueError("len(axes) must be 2.")
    nd = ndim_of(m)
    if axes[0] == axes[1] or abs(axes[0] - axes[1]) == nd:
        raise ValueError("Axes must be different.")
    if axes[0] >= nd or axes[0] < -nd or axes[1] >= nd or axes[1] < -nd:
        raise ValueError(f"Axes={axes} out of range for array of ndim={nd}.")
    k %= 4
    if k == 0:
        return m
    if k == 2:
        return flip(flip(m, axes[0]), axes[1])
    order = list(range(nd))
    order[axes[0]], order[axes[1]] = order[axes[1]], order[axes[0]]
    if k == 1:
        return transpose(flip(m, axes[1]), order)
    return flip(transpose(m, order), axes[1])


@implements(np.rollaxis)
def rollaxis(a, axis, start=0):
    """np.rollaxis: a transpose."""
    n = ndim_of(a)
    if not -n <= axis < n:
        raise np.exceptions.AxisError(axis, n)
    axis %= n
    if start < 0:
        start += n
    if not 0 <= start < n + 1:
        raise np.exceptions.AxisError(
            f"'start' arg requires {-n} <= start < {n + 1}, but {start} was passed in"
        )
    if axis < start:
        start -= 1
    if axis == start:
        return a
    order = list(range(n))
    order.remove(axis)
    order.insert(start, axis)
    return transpose(a, order)


@implements(np.split)
def split_equal(ary, indices_or_sections, axis=0):
    """np.split: np.array_split that insists on equal sections (NumPy's error otherwise)."""
    if isinstance(indices_or_sections, (int, np.integer)) and (
        shape_of(ary)[axis] % int(indices_or_sections)
    ):
        raise ValueError("array split does not result in an equal division")
    return split(ary, indices_or_sections, axis)


@implements(np.hsplit)
def hsplit(ary, indices_or_sections):
    """np.hsplit: np.split along the second axis (the first for 1-D arrays)."""
    if ndim_of(ary) == 0:
        raise ValueError("hsplit only works on arrays of 1 or more dimensions")
    return split_equal(ary, indices_or_sections, 1 if ndim_of(ary) > 1 else 0)


@implements(np.vsplit)
def vsplit(ary, indices_or_sections):
    """np.vsplit: np.split along the first axis (2-D and more)."""
    if ndim_of(ary) < 2:
        raise ValueError("vsplit only works on arrays of 2 or more dimensions")
    return split_equal(ary, indices_or_sections, 0)


@implements(np.dsplit)
def dsplit(ary, indices_or_sections):
    """np.dsplit: np.split along the third axis (3-D and more)."""
    if ndim_of(ary) < 3:
        raise ValueError("dsplit only works on arrays of 3 or more dimensions")
    return split_equal(ary, indices_or_sections, 2)


@implements(np.resize)
def resize(a, new_shape):
    """np.resize: the flattened array repeated cyclically into the new shape."""
    if isinstance(new_shape, (int, np.integer)):
        new_shape = (new_shape,)
    a = reshape(_as_operand(a), (-1,))
    new_size = 1
    for d in new_shape:
        new_size *= d
        if d < 0:
            raise ValueError("all elements of `new_shape` must be non-negative")
    if shape_of(a)[0] == 0 or new_size == 0:
        return np.zeros(tuple(new_shape), dtype_of(a))
    repeats = (new_size + shape_of(a)[0] - 1) // shape_of(a)[0]
    return reshape(concatenate((a,) * repeats)[:new_size], tuple(new_shape))


@implements(np.kron)
def kron(a, b):
    """np.kron: a broadcast product, reshaped (NumPy's construction)."""
    a, b = _as_operand(a), _as_operand(b)
    ndb, nda = ndim_of(b), ndim_of(a)
    if nda < ndb:
        a = reshape(a, (1,) * (ndb - nda) + shape_of(a))
        nda = ndb
    nd = max(ndb, nda)
    if nda == 0 or ndb == 0:
        return np.multiply(a, b)
    as_ = (1,) * max(0, ndb - nda) + shape_of(a)
    bs = (1,) * max(0, nda - ndb) + shape_of(b)
    a_arr = expand_dims(a, tuple(range(ndb - nda))) if ndb > nda else a
    b_arr = expand_dims(b, tuple(range(nda - ndb))) if nda > ndb else b
    a_arr = expand_dims(a_arr, tuple(range(1, nd * 2, 2)))
    b_arr = expand_dims(b_arr, tuple(range(0, nd * 2, 2)))
    return reshape(np.multiply(a_arr, b_arr), tuple(x * y for x, y in zip(as_, bs)))


@implements(np.diagflat)
def diagflat(v, k=0):
    """np.diagflat: np.diag of the flattened input."""
    return np.diag(reshape(_as_operand(v), (-1,)), k)


@implements(np.vander)
def vander(x, N=None, increasing=False):
    """np.vander: powers by a running product (NumPy's multiply.accumulate)."""
    x = _as_operand(x)
    if ndim_of(x) != 1:
        raise ValueError("x must be a one-dimensional array or sequence.")
    n = shape_of(x)[0]
    N = n if N is None else N
    dt = np.promote_types(dtype_of(x), int)
    if N == 0:
        return np.zeros((n, 0), dt)
    cols = [np.ones((n, 1), dt)]
    if N > 1:
        cols.append(np.cumprod(broadcast_to(reshape(astype(x, dt), (n, 1)), (n, N - 1)), axis=1))
    v = concatenate(cols, axis=1) if len(cols) > 1 else cols[0]
    return v if increasing else flip(v, 1)


@implements(np.block)
def block(arrays):
    """np.block: nested lists concatenated from the innermost, as NumPy assembles them."""

    def depth(x):
        return 1 + depth(x[0]) if isinstance(x, list) and x else (1 if isinstance(x, list) else 0)

    if isinstance(arrays, tuple):
        raise TypeError(
            "arrays is a tuple. Only lists can be used to arrange blocks, and "
            "np.block does not allow implicit conversion from tuple to ndarray."
        )
    list_ndim = depth(arrays)

    def leaves(x):
        return [y for item in x for y in leaves(item)] if isinstance(x, list) else [x]

    result_ndim = max([list_ndim] + [ndim_of(_as_operand(x)) for x in leaves(arrays)])

    def assemble(x, level):
        if isinstance(x, list):
            parts = [assemble(item, level + 1) for item in x]
            return concatenate(parts, axis=-(list_ndim - level))
        x = _as_operand(x)
        return reshape(x, (1,) * (result_ndim - ndim_of(x)) + shape_of(x))

    return assemble(arrays, 0)


@implements(np.apply_along_axis)
def apply_along_axis(func1d, axis, arr, *args, **kwargs):
    """np.apply_along_axis: func1d on each 1-D slice (one traced call per slice), stacked."""
    arr = _as_operand(arr)
    nd = ndim_of(arr)
    if not -nd <= axis < nd:
        raise np.exceptions.AxisError(axis, nd)
    axis %= nd
    dims = list(range(nd))
    view = transpose(arr, dims[:axis] + dims[axis + 1 :] + [axis])
    outer = shape_of(view)[:-1]
    if 0 in outer:
        raise ValueError("Cannot apply_along_axis when any iteration dimensions are 0")
    results = [_as_operand(func1d(view[ind], *args, **kwargs)) for ind in np.ndindex(outer)]
    res_nd = ndim_of(results[0])
    stacked = reshape(stack(results), outer + shape_of(results[0]))
    bdims = list(range(ndim_of(stacked)))
    permute = bdims[:axis] + bdims[len(bdims) - res_nd :] + bdims[axis : len(bdims) - res_nd]
    return transpose(stacked, permute)
