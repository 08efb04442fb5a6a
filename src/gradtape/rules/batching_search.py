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

from ..core import tracing
from ..core.errors import GradtapeError
from ..core.primitive import REGISTRY
from ..core.tracing import loop_batch
from . import indexing, statistics
from ._util import dtype_of, ndim_of, shape_of
from .batching import (
    _advanced_apart,
    _axis,
    _batch_size,
    _full_batch,
    _getitem_batch,
    _lift,
    _write_batch,
)

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
    for a member whose is not: such a batch runs per member). Traced values (a compiled
    program) are one call on the batch: where the whole batch's check fails, each member's
    positions come from the matching of sorted orders, which picks the same values (a tie
    may send its gradient to another of the equal elements)."""
    (a,) = args
    moved = _axis(axis, ndim_of(a) - 1)
    if type(a) is not np.ndarray:
        return prim(a, kth=kth, axis=moved)
    index = np.argpartition(a, kth, axis=moved)
    got = np.take_along_axis(a, index, axis=moved)
    expected = np.partition(a, kth, axis=moved)
    same = (got == expected) | (got != got) & (expected != expected)
    if not np.all(same):
        return loop_batch(prim, args, batched, kth=kth, axis=axis)
    return index


# --- searchsorted, digitize, histogram bins ---------------------------------------------------
def searchsorted_batch(prim, args, batched, **params):
    """np.searchsorted(a, v): one sorted `a` for the whole batch of values `v` is one call; a
    batched `a` is searched by a binary search of every member's values at once."""
    call, names = _named_call(prim, args, batched, params)
    if names == {"v"}:
        return prim(call.pop("a"), call.pop("v"), **call)
    if "sorter" in names:
        return loop_batch(prim, args, batched, **params)
    a, v = call["a"], call["v"]
    if ndim_of(a) != 2 or dtype_of(a).kind not in "iubf" or dtype_of(v).kind not in "iubf":
        return loop_batch(prim, args, batched, **params)
    if call.get("sorter") is not None:
        a = np.take_along_axis(a, _full_batch(call["sorter"], False, shape_of(a)[0]), axis=1)
    return _binary_search(a, v, "v" in names, call.get("side", "left") == "right")


def _before(x, y):
    """x < y in NumPy's sort order (NaN after every number)."""
    if dtype_of(x).kind != "f" and dtype_of(y).kind != "f":
        return x < y
    return (x < y) | (np.isnan(y) & ~np.isnan(x))


def _binary_search(a, v, v_batched: bool, right: bool):
    """NumPy's binary search (the first index whose element is not before v, or, for the
    right side, after v) in each member's sorted row of `a` (batch, n), for each of the
    member's values `v`, all members at once: ceil(log2(n + 1)) steps of gathers."""
    size, n = shape_of(a)
    values = np.reshape(v, (size, -1)) if v_batched else np.reshape(v, (1, -1))
    values = np.broadcast_to(values, (size, shape_of(values)[1]))
    lo = np.zeros(shape_of(values), np.intp)
    hi = np.full(shape_of(values), n, np.intp)
    for _ in range(int(n).bit_length()):
        mid = (lo + hi) // 2
        probe = np.take_along_axis(a, np.minimum(mid, max(n - 1, 0)), axis=1)
        go_right = ~_before(values, probe) if right else _before(probe, values)
        open_ = lo < hi
        lo = np.where(open_ & go_right, mid + 1, lo)
        hi = np.where(open_ & ~go_right, mid, hi)
    member = shape_of(v)[1:] if v_batched else shape_of(v)
    return np.reshape(lo, (size,) + tuple(member))


def digitize_batch(prim, args, batched, **params):
    """np.digitize(x, bins): one `bins` for the whole batch of `x` is one call; batched
    increasing (decreasing) bins are NumPy's search of each member's bins (reversed), all
    members at once. Bins whose direction differs between members run per member."""
    call, names = _named_call(prim, args, batched, params)
    if names == {"x"}:
        return prim(call.pop("x"), call.pop("bins"), **call)
    bins, x = call["bins"], call["x"]
    kinds = dtype_of(bins).kind + dtype_of(x).kind
    if type(bins) is not np.ndarray or bins.ndim != 2 or set(kinds) - set("iubf"):
        return loop_batch(prim, args, batched, **params)
    steps = np.diff(bins, axis=1)
    right = bool(call.get("right", False))
    increasing = np.all(steps >= 0, axis=1)  # (NumPy counts constant bins as increasing)
    if np.all(increasing):  # NumPy: searchsorted(bins, x, side="left" if right else "right")
        return _binary_search(bins, x, "x" in names, not right)
    if not np.any(increasing) and np.all(steps <= 0):
        # NumPy: len(bins) - searchsorted(bins[::-1], x, side=...)
        found = _binary_search(bins[:, ::-1], x, "x" in names, not right)
        return bins.shape[1] - found
    return loop_batch(prim, args, batched, **params)


def bin_index_batch(prim, args, batched):
    """The histogram bin of each element: elementwise in the values for one set of edges;
    with each member's own edges (bins from each member's range), NumPy's search of each
    member's edges, all members at once, then the same two corrections as for one member
    (the last bin holds its right edge; -1 outside the edges)."""
    if not batched[1]:
        return prim(*args)
    a, edges = args
    if ndim_of(edges) != 2 or set(dtype_of(a).kind + dtype_of(edges).kind) - set("iuf"):
        return loop_batch(prim, args, batched)
    size, m = shape_of(edges)
    a = _full_batch(a, batched[0], size)
    idx = _binary_search(edges, a, True, True) - 1  # searchsorted(edges, a, side="right")
    column = (size,) + (1,) * (ndim_of(a) - 1)
    first, last = np.reshape(edges[:, 0], column), np.reshape(edges[:, m - 1], column)
    idx = np.where(a == last, m - 2, idx)
    return np.where((a >= first) & (a <= last), idx, -1)


def _row_offsets(x, width: int):
    """Each member's row number times `width`, shaped to broadcast against x (batch first)."""
    size = shape_of(x)[0]
    return np.reshape(np.arange(size) * width, (size,) + (1,) * (ndim_of(x) - 1))


def bincount_batch(prim, args, batched, minlength):
    """np.bincount(x, weights, minlength) of each member's x, with one length for all (the
    function that binds it makes minlength exceed every value): the members' values shifted
    into disjoint ranges and counted at once (each bin adds the same weights in the same
    order as the member alone)."""
    x, weights = args
    concrete = type(x) is np.ndarray
    if batched[1] or (concrete and x.size and (x.max() >= minlength or x.min() < 0)):
        return loop_batch(prim, args, batched, minlength=minlength)
    size = shape_of(x)[0]
    shifted = np.ravel(x + _row_offsets(x, minlength))
    w = None if weights is None else np.ravel(np.broadcast_to(weights, shape_of(x)))
    return np.reshape(prim(shifted, w, minlength=size * minlength), (size, minlength))


def bincount_shifted_batch(prim, args, batched, minlength):
    """Counts of idx + 1 below minlength (the histograms' bin indices, -1 outside every bin),
    each member's in its own row: what a member drops (idx + 1 >= minlength) goes to one
    more column of its row, cut off at the end."""
    (idx,) = args
    if type(idx) is np.ndarray and idx.size and idx.min() < -1:
        return loop_batch(prim, args, batched, minlength=minlength)
    size, width = shape_of(idx)[0], minlength + 1
    shifted = np.minimum(idx + 1, minlength) + _row_offsets(idx, width)
    counts = prim(np.ravel(shifted) - 1, minlength=size * width)
    return np.reshape(counts, (size, width))[:, :minlength]


# --- indexing with traced integers ------------------------------------------------------------
def _probe_index(template, positions, iv, iv_batched) -> tuple:
    """A member's index with zeros of each traced integer's shape: its arrangement."""
    probes = [
        np.zeros(shape_of(v)[1:] if b else shape_of(v), np.intp) for v, b in zip(iv, iv_batched)
    ]
    return indexing._fill(template, positions, [int(p) if not p.ndim else p for p in probes])


def _gather(template, positions, iv, iv_batched, size: int) -> tuple:
    """(template, positions, integers) of an index whose traced integers differ per member:
    a leading arange picks each member's row. The batched integers are lifted to the members'
    common number of axes and the arange to one more, so that each member's integers
    broadcast as they would alone; NumPy puts the broadcast axes (the batch first) in front."""
    nd = max(ndim_of(v) - b for v, b in zip(iv, iv_batched))
    nd = max([nd] + [p.ndim for p in template if isinstance(p, np.ndarray)])
    rows = np.arange(size).reshape((size,) + (1,) * nd)
    lifted = tuple(_lift(v, nd) if b else v for v, b in zip(iv, iv_batched))
    return (rows,) + tuple(template), tuple(p + 1 for p in positions), lifted


def _gather_reorders(template, positions, iv, iv_batched) -> bool:
    """Whether a leading per-member index would move the indexed axes elsewhere than behind
    the batch axis: NumPy puts the axes of a member's array indices where the first of them
    is when they are adjacent, and in front otherwise. So the gather keeps each member's
    arrangement when its array indices are apart or start the index (a boolean mask, which
    stands for several index arrays, is not handled)."""
    parts = _probe_index(template, positions, iv, iv_batched)
    if not any(isinstance(p, np.ndarray) for p in parts):
        return False
    if any(isinstance(p, np.ndarray) and p.dtype == bool for p in parts):
        return True
    return not _advanced_apart(parts) and not _is_advanced(parts[0])


def _leading_slices_as_ranges(template, positions, iv, iv_batched, member_shape):
    """The template with the slices before its (adjacent) array indices spelled as ranges
    over their axes, shaped to broadcast in front of the arrays' axes: the member's result
    is the same, and the index then starts with an array (None: the index has a None or
    an Ellipsis there, or no slices only before its arrays)."""
    parts = _probe_index(template, positions, iv, iv_batched)
    first = next(k for k, p in enumerate(parts) if _is_advanced(p))
    if not all(isinstance(p, slice) for p in parts[:first]) or first > len(member_shape):
        return None
    k = max(np.ndim(p) for p in parts if _is_advanced(p))
    ranges = tuple(
        np.arange(*parts[a].indices(member_shape[a])).reshape((-1,) + (1,) * (first - a - 1 + k))
        for a in range(first)
    )
    return ranges + tuple(template)[first:]


def _is_advanced(part) -> bool:
    return isinstance(part, (np.ndarray, int, np.integer)) and not isinstance(part, bool)


def dyn_getitem_batch(prim, args, batched, template, positions):
    """x[i] with traced integers i: one index for the batch (a leading slice), or, when the
    integers differ per member, each member's row picked with its own integers."""
    size = _batch_size(args, batched)
    x, iv = args[0], args[1:]
    if not any(batched[1:]):
        if _advanced_apart(_probe_index(template, positions, iv, batched[1:])):
            return loop_batch(prim, args, batched, template=template, positions=positions)
        shifted = tuple(p + 1 for p in positions)
        return prim(x, *iv, template=(slice(None),) + tuple(template), positions=shifted)
    if _gather_reorders(template, positions, iv, batched[1:]):
        member_shape = shape_of(x)[1:] if batched[0] else shape_of(x)
        spelled = _leading_slices_as_ranges(template, positions, iv, batched[1:], member_shape)
        if spelled is None:
            return loop_batch(prim, args, batched, template=template, positions=positions)
        template = spelled
    gather, shifted, iv = _gather(template, positions, iv, batched[1:], size)
    return prim(_full_batch(x, batched[0], size), *iv, template=gather, positions=shifted)


def _target_ndim(member_shape: tuple, index: tuple) -> int | None:
    """The number of axes of a member's x[index] (None: the index does not fit)."""
    try:
        return np.broadcast_to(np.zeros((), np.int8), member_shape)[index].ndim
    except IndexError:
        return None


def dyn_write_batch(prim, args, batched, template, positions):
    """x[i] = v and x[i] += v with traced integers i: each member writes into its own row of
    the batch (its own integers picking the row's elements when they differ per member)."""
    size = _batch_size(args, batched)
    x, v, iv = args[0], args[1], args[2:]
    member_shape = shape_of(x)[1:] if batched[0] else shape_of(x)
    iv_batched = any(batched[2:])
    probe = _probe_index(template, positions, iv, batched[2:])
    nd = _target_ndim(member_shape, probe)
    spelled = template
    if iv_batched and nd is not None and _gather_reorders(template, positions, iv, batched[2:]):
        spelled = _leading_slices_as_ranges(template, positions, iv, batched[2:], member_shape)
    if nd is None or spelled is None or (not iv_batched and _advanced_apart(probe)):
        return loop_batch(prim, args, batched, template=template, positions=positions)
    template = spelled
    x = _full_batch(x, batched[0], size)
    v = _lift(v, nd) if batched[1] else v
    if iv_batched:
        full, shifted, iv = _gather(template, positions, iv, batched[2:], size)
    else:
        full, shifted = (slice(None),) + tuple(template), tuple(p + 1 for p in positions)
    return prim(x, v, *iv, template=full, positions=shifted)


def _members_in(idx, level) -> list:
    """Which parts of a static index are members of the batch being mapped."""
    return [type(p) is tracing.Tracer and p._level is level for p in idx]


def _mask_refusal(what: str) -> GradtapeError:
    return GradtapeError(
        f"{tracing.user_source_line()}: vmap: {what} with a boolean mask that is a member of "
        "the batch: the number of elements it selects may differ between members, and a "
        "batch needs one shape. Write np.where(mask, value, x) for x[mask] = value, or "
        "np.sum(np.where(mask, x, 0)) for a sum over x[mask]."
    )


def _integer_index(idx, level, mine: list):
    """(template, positions, integers, batched) of a static index holding traced integers
    (a derivative rule's write at the index it was given; np.add.at's indices)."""
    positions = tuple(k for k, p in enumerate(idx) if type(p) is tracing.Tracer)
    template = tuple(indexing._SLOT if k in positions else p for k, p in enumerate(idx))
    values = [idx[k]._value if mine[k] else idx[k] for k in positions]
    return template, positions, values, [mine[k] for k in positions]


def _mask_write(prim, args, batched, mask):
    """x[mask] = v (x[mask] += v) with one value v per member: np.where of the mask."""
    x, v = args
    size = _batch_size(args, batched)
    x = _full_batch(x, batched[0], size)
    nd = ndim_of(x) - 1
    # a mask of the leading axes selects whole sub-arrays: its axes first, ones after
    m = np.reshape(mask, shape_of(mask) + (1,) * (nd + 1 - ndim_of(mask)))
    v = _lift(v, nd) if batched[1] else v
    written = x + v if prim is indexing.scatter_add_p else v
    return np.where(m, written, x)


def _static_write_batch(dynamic_prim):
    """The rule of x[idx] = v (x[idx] += v) whose static index may hold members of the batch
    (derivative rules write at the index they were given; np.add.at's indices): traced
    integers go to the rule of the primitive with traced integers, a boolean mask written
    with one value per member to np.where; other indices to the rule of static indexing."""

    def rule(prim, args, batched, idx):
        level = tracing.batching_level()
        mine = _members_in(idx, level)
        if not any(mine):
            return _write_batch(prim, args, batched, idx=idx)
        kinds = {dtype_of(p).kind for p, m in zip(idx, mine) if m}
        if "b" in kinds:
            value_ndim = ndim_of(args[1]) - batched[1]
            if len(idx) != 1 or value_ndim:
                raise _mask_refusal("a write x[mask] = values")
            return _mask_write(prim, args, batched, idx[0]._value)
        template, positions, values, flags = _integer_index(idx, level, mine)
        return dyn_write_batch(
            dynamic_prim,
            (*args, *values),
            (*batched, *flags),
            template=template,
            positions=positions,
        )

    return rule


def _masked_read_per_member(prim, args, batched, idx, mine):
    """x[mask] for each member with its own mask: members that select as many elements
    stack; otherwise the batch has no shape, which is refused clearly."""
    (x,) = args
    size = _batch_size(args, batched) if batched[0] else shape_of(idx[mine.index(True)]._value)[0]
    results = [
        prim(
            x[i] if batched[0] else x, idx=tuple(p._value[i] if m else p for p, m in zip(idx, mine))
        )
        for i in range(size)
    ]
    if len({shape_of(r) for r in results}) > 1:
        raise _mask_refusal("x[mask]")
    return np.stack(results)


def _static_read_batch(prim, args, batched, idx):
    """x[idx] whose static index may hold members of the batch: traced integers go to the
    rule of dyn_getitem; a boolean mask is refused (its selection's length is the member's)."""
    level = tracing.batching_level()
    mine = _members_in(idx, level)
    if not any(mine):
        return _getitem_batch(prim, args, batched, idx=idx)
    if any(dtype_of(p).kind == "b" for p, m in zip(idx, mine) if m):
        return _masked_read_per_member(prim, args, batched, idx, mine)
    template, positions, values, flags = _integer_index(idx, level, mine)
    return dyn_getitem_batch(
        indexing.dyn_getitem_p,
        (args[0], *values),
        (batched[0], *flags),
        template=template,
        positions=positions,
    )


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
    indexing.getitem_p.batch = _static_read_batch
    indexing.setitem_p.batch = _static_write_batch(indexing.dyn_setitem_p)
    indexing.scatter_add_p.batch = _static_write_batch(indexing.dyn_scatter_add_p)
