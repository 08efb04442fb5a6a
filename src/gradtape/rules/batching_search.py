"""Batching rules (vmap) of the primitives without a derivative that reduce, compare, sort,
search and count, and of indexing with traced integers.

Each rule gives exactly what the primitive gives each member: NumPy's reductions, sorts and
searches work on each 1-d slice along their axis independently, so one call on the whole batch
(the axes moved behind the batch axis) is the per-member call. A case a rule cannot do that
way (an argument that is batched where NumPy takes one array for all, a value it must check
before it can trust the batched call) runs once per member (`tracing.loop_batch`).
"""

from __future__ import annotations

import inspect

import numpy as np

from ..core.primitive import REGISTRY
from ..core.tracing import loop_batch
from . import indexing, statistics
from ._util import dtype_of, ndim_of, shape_of
from .batching import _advanced_apart, _axis, _batch_size, _full_batch, _lift

_SIGNATURES: dict = {}


def _named_call(prim, args, batched, params) -> tuple[dict, set]:
    """The call's arguments by name (the NumPy function's signature) and the batched names."""
    sig = _SIGNATURES.get(prim.name)
    if sig is None:
        sig = _SIGNATURES[prim.name] = inspect.signature(prim.impl)
    call = dict(sig.bind(*args, **params).arguments)
    names = list(sig.parameters)[: len(args)]
    return call, {n for n, b in zip(names, batched) if b}


def _written_out(call: dict) -> bool:
    return call.get("out") is not None


def _member_axes(axis, nd: int) -> tuple:
    """The batched array's axes for a member's `axis` (None: all of the member's axes)."""
    if axis is None:
        return tuple(range(1, nd + 1))
    return tuple(_axis(int(a), nd) for a in np.atleast_1d(axis))


# --- argmax, argmin, nanargmax, nanargmin ------------------------------------------------------
def arg_reduction_batch(prim, args, batched, **params):
    """np.argmax(member, axis): the batch's argmax along the member's axis moved behind the
    batch axis; axis=None (the index in the flattened member) on the batch flattened per
    member."""
    call, names = _named_call(prim, args, batched, params)
    if _written_out(call) or names != {"a"}:
        return loop_batch(prim, args, batched, **params)
    a = call["a"]
    size, nd = shape_of(a)[0], ndim_of(a) - 1
    if call.get("axis") is None:
        out = prim(np.reshape(a, (size, -1)), axis=1)
        keepdims = call.get("keepdims", False)
        return np.reshape(out, (size,) + (1,) * nd) if keepdims is True else out
    keep = {"keepdims": call["keepdims"]} if "keepdims" in call else {}
    return prim(a, axis=_axis(int(call["axis"]), nd), **keep)


# --- any, all, count_nonzero --------------------------------------------------------------------
def predicate_reduction_batch(prim, args, batched, **params):
    """np.all(member, axis, keepdims, where): the batch reduced over the member's axes."""
    call, names = _named_call(prim, args, batched, params)
    if _written_out(call) or names != {"a"}:
        return loop_batch(prim, args, batched, **params)
    a = call["a"]
    nd = ndim_of(a) - 1
    where = call.get("where")
    if where is not None and ndim_of(where) > nd:
        return loop_batch(prim, args, batched, **params)
    rest = {k: call[k] for k in ("keepdims", "where") if k in call}
    return prim(a, axis=_member_axes(call.get("axis"), nd), **rest)


# --- isclose, allclose, array_equal -------------------------------------------------------------
_CLOSE_ARGUMENTS = ("a", "b", "rtol", "atol")


def _lifted_close_arguments(call: dict, names: set) -> dict:
    """isclose's array arguments, the batched ones lifted so that each member broadcasts
    against the unbatched ones as it would alone."""
    nd = max(ndim_of(call[k]) - (k in names) for k in _CLOSE_ARGUMENTS if k in call)
    return {k: _lift(call[k], nd) if k in names else call[k] for k in call}


def isclose_batch(prim, args, batched, **params):
    """np.isclose is elementwise in a, b, rtol and atol."""
    call, names = _named_call(prim, args, batched, params)
    call = _lifted_close_arguments(call, names)
    return prim(call.pop("a"), call.pop("b"), **call)


def allclose_batch(prim, args, batched, **params):
    """np.allclose is np.all of np.isclose: the batch's isclose, all over each member."""
    call, names = _named_call(prim, args, batched, params)
    call = _lifted_close_arguments(call, names)
    close = np.isclose(call.pop("a"), call.pop("b"), **call)
    return np.all(close, axis=tuple(range(1, ndim_of(close))))


def array_equal_batch(prim, args, batched, **params):
    """np.array_equal: members of different shapes are unequal; otherwise every element equal
    (NaN equal to NaN with equal_nan)."""
    call, names = _named_call(prim, args, batched, params)
    a1, a2 = call["a1"], call["a2"]
    size = _batch_size(args, batched)
    shape1 = shape_of(a1)[1:] if "a1" in names else shape_of(a1)
    shape2 = shape_of(a2)[1:] if "a2" in names else shape_of(a2)
    if shape1 != shape2:
        return np.zeros(size, dtype=bool)
    equal = np.equal(a1, a2)
    if call.get("equal_nan", False) and not _cannot_hold_nan(a1, a2):
        equal = equal | (np.isnan(a1) & np.isnan(a2))
    equal = _full_batch(equal, ndim_of(equal) == len(shape1) + 1, size)
    return np.all(equal, axis=tuple(range(1, len(shape1) + 1)))


def _cannot_hold_nan(*arrays) -> bool:
    return all(dtype_of(a).kind in "iub" for a in arrays)


# --- argsort, argpartition, lexsort, partition_index ------------------------------------------
def sort_batch(prim, args, batched, **params):
    """np.argsort / np.argpartition along the member's axis (axis=None: the flattened
    member): each 1-d slice is sorted on its own, so the batch sorts as its members."""
    call, names = _named_call(prim, args, batched, params)
    if names != {"a"} or call.get("order") is not None:
        return loop_batch(prim, args, batched, **params)
    a = call.pop("a")
    axis = call.pop("axis", -1)
    if axis is None:
        a, axis = np.reshape(a, (shape_of(a)[0], -1)), 1
    else:
        axis = _axis(int(axis), ndim_of(a) - 1)
    return prim(a, axis=axis, **call)


def lexsort_batch(prim, args, batched, axis):
    """np.lexsort of keys of one shape: every key with the batch axis, the axis moved."""
    size = _batch_size(args, batched)
    keys = [_full_batch(k, b, size) for k, b in zip(args, batched)]
    return prim(*keys, axis=_axis(axis, ndim_of(keys[0]) - 1))


def partition_index_batch(prim, args, batched, kth, axis):
    """The positions of np.partition's arrangement: np.argpartition's, for each member whose
    arrangement is np.partition's (the primitive falls back to a matching of sorted orders
    for a member whose is not; such a batch, or one of traced values, runs per member)."""
    (a,) = args
    if type(a) is not np.ndarray:
        return loop_batch(prim, args, batched, kth=kth, axis=axis)
    moved = _axis(axis, a.ndim - 1)
    index = np.argpartition(a, kth, axis=moved)
    got = np.take_along_axis(a, index, axis=moved)
    expected = np.partition(a, kth, axis=moved)
    same = (got == expected) | (got != got) & (expected != expected)
    if not np.all(same):
        return loop_batch(prim, args, batched, kth=kth, axis=axis)
    return index


# --- searchsorted, digitize, histogram bins ---------------------------------------------------
def searchsorted_batch(prim, args, batched, **params):
    """np.searchsorted(a, v): one sorted `a` for the whole batch of values `v` (a batched `a`
    runs per member)."""
    call, names = _named_call(prim, args, batched, params)
    if names != {"v"}:
        return loop_batch(prim, args, batched, **params)
    return prim(call.pop("a"), call.pop("v"), **call)


def digitize_batch(prim, args, batched, **params):
    """np.digitize(x, bins): one `bins` for the whole batch of `x` (batched bins: per member)."""
    call, names = _named_call(prim, args, batched, params)
    if names != {"x"}:
        return loop_batch(prim, args, batched, **params)
    return prim(call.pop("x"), call.pop("bins"), **call)


def bin_index_batch(prim, args, batched):
    """The histogram bin of each element: elementwise in the values for one set of edges."""
    if batched[1]:
        return loop_batch(prim, args, batched)
    return prim(*args)


def bincount_batch(prim, args, batched, minlength):
    """np.bincount(x, weights, minlength) of each member's x, with one length for all: the
    members' values shifted into disjoint ranges and counted at once (each bin adds the same
    weights in the same order as the member alone)."""
    x, weights = args
    if type(x) is not np.ndarray or batched[1] or (x.size and x.max() >= minlength):
        return loop_batch(prim, args, batched, minlength=minlength)
    size = x.shape[0]
    shifted = x + np.arange(size).reshape((size,) + (1,) * (x.ndim - 1)) * minlength
    w = None if weights is None else np.broadcast_to(weights, x.shape).ravel()
    counts = np.bincount(shifted.ravel(), w, minlength=size * minlength)
    return counts.reshape(size, minlength)


def bincount_shifted_batch(prim, args, batched, minlength):
    """Counts of idx + 1 below minlength (idx >= -1), each member's in its own row."""
    (idx,) = args
    if type(idx) is not np.ndarray or (idx.size and idx.min() < -1):
        return loop_batch(prim, args, batched, minlength=minlength)
    size, width = idx.shape[0], minlength + 1  # the last column takes what the member drops
    shifted = np.minimum(idx + 1, minlength)
    shifted = shifted + np.arange(size).reshape((size,) + (1,) * (idx.ndim - 1)) * width
    counts = np.bincount(shifted.ravel(), minlength=size * width).astype(np.intp)
    return counts.reshape(size, width)[:, :minlength]


# --- indexing with traced integers ------------------------------------------------------------
def _probe_index(template, positions) -> tuple:
    return indexing._fill(template, positions, [0] * len(positions))


def _gather(template, positions, iv, iv_batched, size: int) -> tuple:
    """(template, positions, integers) of an index whose traced integers differ per member:
    a leading arange picks each member's row. The batched integers are lifted to the members'
    common number of axes and the arange to one more, so that each member's integers
    broadcast as they would alone; NumPy puts the broadcast axes (the batch first) in front."""
    nd = max(ndim_of(v) - b for v, b in zip(iv, iv_batched))
    rows = np.arange(size).reshape((size,) + (1,) * nd)
    lifted = tuple(_lift(v, nd) if b else v for v, b in zip(iv, iv_batched))
    return (rows,) + tuple(template), tuple(p + 1 for p in positions), lifted


def _mixed_index(template) -> bool:
    """Whether a template holds array indices (then a per-member integer index changes where
    NumPy puts the indexed axes)."""
    return any(isinstance(p, np.ndarray) for p in template)


def dyn_getitem_batch(prim, args, batched, template, positions):
    """x[i] with traced integers i: one index for the batch (a leading slice), or, when the
    integers differ per member, each member's row picked with its own integers."""
    size = _batch_size(args, batched)
    x, iv = args[0], args[1:]
    if not any(batched[1:]):
        if _advanced_apart(_probe_index(template, positions)):
            return loop_batch(prim, args, batched, template=template, positions=positions)
        shifted = tuple(p + 1 for p in positions)
        return prim(x, *iv, template=(slice(None),) + tuple(template), positions=shifted)
    if _mixed_index(template):
        return loop_batch(prim, args, batched, template=template, positions=positions)
    gather, shifted, iv = _gather(template, positions, iv, batched[1:], size)
    return prim(_full_batch(x, batched[0], size), *iv, template=gather, positions=shifted)


def _target_ndim(member_shape: tuple, template, positions) -> int | None:
    """The number of axes of a member's x[idx] (None: the index does not fit)."""
    try:
        probe = np.broadcast_to(np.zeros((), np.int8), member_shape)
        return probe[_probe_index(template, positions)].ndim
    except IndexError:
        return None


def dyn_write_batch(prim, args, batched, template, positions):
    """x[i] = v and x[i] += v with traced integers i: each member writes into its own row of
    the batch (its own integers picking the row's elements when they differ per member)."""
    size = _batch_size(args, batched)
    x, v, iv = args[0], args[1], args[2:]
    member_shape = shape_of(x)[1:] if batched[0] else shape_of(x)
    iv_batched = any(batched[2:])
    nd = _target_ndim(member_shape, template, positions)
    if (
        nd is None
        or (not iv_batched and _advanced_apart(_probe_index(template, positions)))
        or (iv_batched and _mixed_index(template))
    ):
        return loop_batch(prim, args, batched, template=template, positions=positions)
    x = _full_batch(x, batched[0], size)
    v = _lift(v, nd) if batched[1] else v
    if iv_batched:
        full, shifted, iv = _gather(template, positions, iv, batched[2:], size)
    else:
        full, shifted = (slice(None),) + tuple(template), tuple(p + 1 for p in positions)
    return prim(x, v, *iv, template=full, positions=shifted)


def linalg_all_real_batch(prim, args, batched):
    """Whether all of each member's eigenvalues are real."""
    (w,) = args
    return np.all(np.imag(w) == 0, axis=tuple(range(1, ndim_of(w))))


def declare() -> None:
    """Give these primitives their batching rules (called once, after the declarations)."""
    rules = {
        arg_reduction_batch: ("argmax", "argmin", "nanargmax", "nanargmin"),
        predicate_reduction_batch: ("any", "all", "count_nonzero"),
        isclose_batch: ("isclose",),
        allclose_batch: ("allclose",),
        array_equal_batch: ("array_equal",),
        sort_batch: ("argsort", "argpartition"),
        searchsorted_batch: ("searchsorted",),
        digitize_batch: ("digitize",),
        linalg_all_real_batch: ("linalg_all_real",),
    }
    for rule, names in rules.items():
        for name in names:
            REGISTRY[name].batch = rule
    statistics._lexsort_p.batch = lexsort_batch
    indexing.partition_index_p.batch = partition_index_batch
    statistics._bin_index_p.batch = bin_index_batch
    statistics._plain_bincount_p.batch = bincount_batch
    statistics._bincount_p.batch = bincount_shifted_batch
    indexing.dyn_getitem_p.batch = dyn_getitem_batch
    indexing.dyn_setitem_p.batch = indexing.dyn_scatter_add_p.batch = dyn_write_batch
