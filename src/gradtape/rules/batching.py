"""Batching rules (vmap), declared per category of primitive in one place.

A batching rule is `rule(prim, args, batched, **params) -> out`: `args` are the arguments one
level below the vmap, `batched[i]` says whether argument i carries the batch (as its first
axis); the result carries the batch as its first axis. Each rule rewrites the call as one call
of the same (or another) primitive on the whole batch, so a batched function is recorded as a
tape of ordinary primitives: the backends fuse it like any other.

The categories: elementwise ufuncs (every ufunc without a core signature, scipy.special's
ufuncs, where, astype), reductions with axes, cumulative reductions, shape operations, static
indexing, matmul and einsum, and the linear-algebra functions that broadcast over leading
axes. batching_search.py (predicates, sorts, searches, counts, traced-integer indexing) and
batching_linalg.py (SciPy's linear algebra, the FFT, convolutions, padding) give the others
theirs. A primitive with none runs once per member of the batch (`tracing.loop_batch`): those
whose output's shape depends on each member's values, and a few more; tests/test_registry.py
lists them with the reason for each, so a gap stays visible.
"""

from __future__ import annotations

import numpy as np

from ..core import routes
from ..core.primitive import REGISTRY, Primitive
from ..core.tracing import loop_batch
from . import elementwise as _elementwise_rules  # noqa: F401  (declares real and imag)
from . import indexing, linalg, reductions, shape, stop
from ._util import ndim_of, shape_of


def _batch_size(args, batched) -> int:
    return next(shape_of(a)[0] for a, b in zip(args, batched) if b)


def _member_ndim(a, b: bool) -> int:
    return ndim_of(a) - 1 if b else ndim_of(a)


def _lift(a, ndim: int):
    """A batched argument (batch first) reshaped so its member has `ndim` axes (ones inserted
    after the batch axis): it then broadcasts against unbatched arguments as its member would."""
    s = shape_of(a)
    missing = ndim - (len(s) - 1)
    if missing <= 0:
        return a
    return np.reshape(a, s[:1] + (1,) * missing + s[1:])


def _aligned(args, batched) -> list:
    """Batched arguments lifted to the members' common number of axes; others unchanged."""
    nd = max(_member_ndim(a, b) for a, b in zip(args, batched))
    return [_lift(a, nd) if b else a for a, b in zip(args, batched)]


def _full_batch(a, b: bool, size: int):
    """An argument with the batch axis: unbatched ones broadcast along a new first axis."""
    return a if b else np.broadcast_to(a, (size,) + shape_of(a))


def _axis(axis: int, member_ndim: int) -> int:
    return (axis % member_ndim if member_ndim else 0) + 1


# --- elementwise: broadcasting is per member ----------------------------------------------------
def elementwise_batch(prim: Primitive, args, batched, **params):
    out = prim(*_aligned(args, batched), **params)
    if prim.multiple_results:  # an output that does not depend on a batched argument
        size = _batch_size(args, batched)
        return type(out)(
            o if shape_of(o)[:1] == (size,) else _full_batch(o, False, size) for o in out
        )
    return out


# --- reductions over axes, cumulative reductions --------------------------------------------------
def reduction_batch(prim: Primitive, args, batched, axes, **params):
    nd = _member_ndim(args[0], batched[0])
    axes = tuple(range(1, nd + 1)) if axes is None else tuple(_axis(a, nd) for a in axes)
    return prim(*args, axes=axes, **params)


def cumulative_batch(prim: Primitive, args, batched, axis, **params):
    return prim(*args, axis=_axis(axis, _member_ndim(args[0], batched[0])), **params)


# --- shape operations -----------------------------------------------------------------------------
def _reshape_batch(prim, args, batched, shape):
    return prim(args[0], shape=(shape_of(args[0])[0],) + tuple(shape))


def _transpose_batch(prim, args, batched, axes):
    nd = _member_ndim(args[0], True)
    axes = tuple(range(nd))[::-1] if axes is None else axes
    return prim(args[0], axes=(0,) + tuple(a % nd + 1 for a in axes))


def _broadcast_batch(prim, args, batched, shape):
    x = _lift(args[0], len(shape))
    return prim(x, shape=(shape_of(x)[0],) + tuple(shape))


def _concatenate_batch(prim, args, batched, axis):
    size = _batch_size(args, batched)
    parts = [_full_batch(a, b, size) for a, b in zip(args, batched)]
    return prim(*parts, axis=_axis(axis, _member_ndim(args[0], batched[0])))


def _full_like_batch(prim, args, batched, fill, dtype):
    return prim(args[0], fill=fill, dtype=dtype)


# --- static indexing ---------------------------------------------------------------------
def _advanced_apart(idx: tuple) -> bool:
    """Whether the index's advanced parts are separated by a slice, None or Ellipsis (NumPy
    moves their axes first then, which a leading batch slice would change). With an array
    in the index, an integer is an advanced part too (`x[0, :, [1, 2]]`)."""
    if not any(isinstance(p, np.ndarray) for p in idx):
        return False
    positions = [
        i
        for i, p in enumerate(idx)
        if isinstance(p, (np.ndarray, int, np.integer)) and not isinstance(p, bool)
    ]
    return positions[-1] - positions[0] + 1 != len(positions)


def _getitem_batch(prim, args, batched, idx):
    if _advanced_apart(idx):
        return loop_batch(prim, args, batched, idx=idx)
    return prim(args[0], idx=(slice(None),) + tuple(idx))


def _write_batch(prim, args, batched, idx):
    """x[idx] = v and x[idx] += v: each member writes into its own row of the batch."""
    if _advanced_apart(idx):
        return loop_batch(prim, args, batched, idx=idx)
    x, v = args
    size = _batch_size(args, batched)
    x = _full_batch(x, batched[0], size)
    if batched[1]:
        target = np.broadcast_to(np.zeros((), np.int8), shape_of(x)[1:])[idx]
        v = _lift(v, target.ndim)
    return prim(x, v, idx=(slice(None),) + tuple(idx))


# --- matmul and einsum ----------------------------------------------------------------------------
def _matmul_batch(prim, args, batched):
    a, b = args
    ba, bb = batched
    na, nb = _member_ndim(a, ba), _member_ndim(b, bb)
    if ba and not bb and (na >= 2 and nb <= na or na == 1 and nb <= 2):
        return prim(a, b)  # the batch axis is one of a's leading (or row) axes
    if bb and not ba and nb >= 2 and na <= nb:
        return prim(a, b)
    if bb and not ba and nb == 1 and na <= 2:  # a @ v for each v: the rows of V @ a.T
        return prim(b, a if na == 1 else np.transpose(a))
    # general: vectors as matrices, members aligned, then the added axes removed
    a2 = np.expand_dims(a, -2) if na == 1 else a
    b2 = np.expand_dims(b, -1) if nb == 1 else b
    nd = max(max(na, 2), max(nb, 2))
    a2 = _lift(a2, nd) if ba else a2
    b2 = _lift(b2, nd) if bb else b2
    out = prim(a2, b2)
    if nb == 1:
        out = np.squeeze(out, axis=-1)
    if na == 1:
        out = np.squeeze(out, axis=-1 if nb == 1 else -2)
    return out


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _einsum_batch(prim, args, batched, subscripts, optimize):
    ins, out = subscripts.split("->")
    ins = ins.split(",")
    letter = next(c for c in _LETTERS if c not in subscripts)
    ins = [letter + s if b else s for s, b in zip(ins, batched)]
    return prim(*args, subscripts=",".join(ins) + "->" + letter + out, optimize=optimize)


# --- linear algebra over stacks of matrices ----------------------------------------------------
def stacked_batch(prim: Primitive, args, batched, **params):
    """One argument, a stack of matrices: the batch is one more leading axis."""
    return prim(*args, **params)


def _solve_batch(prim, args, batched):
    a, b = args
    ba, bb = batched
    vector = _member_ndim(b, bb) == 1 and _member_ndim(a, ba) == 2
    if vector:
        b = np.expand_dims(b, -1)
    nd = max(_member_ndim(a, ba), _member_ndim(b, bb))
    out = prim(_lift(a, nd) if ba else a, _lift(b, nd) if bb else b)
    return np.squeeze(out, axis=-1) if vector else out


def _aligned_stacks_batch(prim, args, batched, **params):
    """Arguments that are all stacks of matrices broadcasting against each other (a
    triangular solve's, the Cholesky factor's backward pass): batched ones lifted to the
    members' common rank, one call."""
    return prim(*_aligned(args, batched), **params)


def _lu_solve_batch(prim, args, batched, trans):
    """x = op(a)^-1 b from the LU factors of `a` (np.linalg.solve of one matrix): `a`, its
    factors and `b` broadcast as stacks of matrices, so each batched one gets its member's
    stack axes (lifted) behind the batch axis, and the whole batch is one call."""
    a, lu, piv, b = args
    nd = max(
        _member_ndim(a, batched[0]),
        _member_ndim(lu, batched[1]),
        _member_ndim(piv, batched[2]) + 1,
        _member_ndim(b, batched[3]),
    )
    a, lu, b = (_lift(x, nd) if batched[i] else x for i, x in ((0, a), (1, lu), (3, b)))
    piv = _lift(piv, nd - 1) if batched[2] else piv
    return prim(a, lu, piv, b, trans=trans)


def declare() -> None:
    """Give each category its batching rule (called once, when the rules are declared)."""
    elementwise = set(routes.SCIPY_UFUNCS.values())
    elementwise.update(p for u, p in routes.UFUNCS.items() if getattr(u, "signature", 1) is None)
    elementwise.update(p for p in REGISTRY.values() if p.partials is not None)
    elementwise.update((indexing.where_p, shape.astype_p, stop.stop_gradient_p))
    for prim in elementwise:
        if prim.batch is None:
            prim.batch = elementwise_batch
    for prim in (
        reductions.reduce_sum,
        reductions.reduce_prod,
        reductions.reduce_max,
        reductions.reduce_min,
    ):
        prim.batch = reduction_batch
    reductions.cumsum_p.batch = reductions.cumprod_p.batch = cumulative_batch
    shape.reshape_p.batch = _reshape_batch
    shape.transpose_p.batch = _transpose_batch
    shape.broadcast_p.batch = _broadcast_batch
    shape.concatenate_p.batch = _concatenate_batch
    shape.full_like_p.batch = _full_like_batch
    # static indexing and writes (_getitem_batch, _write_batch) are given by batching_search,
    # whose rules first take out the index's parts that are members of the batch
    linalg.matmul_p.batch = _matmul_batch
    linalg.einsum_p.batch = _einsum_batch
    linalg.solve_p.batch = _solve_batch
    linalg.lu_solve_p.batch = _lu_solve_batch
    linalg.triangular_solve_p.batch = _aligned_stacks_batch
    linalg.cholesky_backward_p.batch = _aligned_stacks_batch
    for prim in (
        linalg.inv_p,
        linalg.lu_factors_p,
        linalg.det_p,
        linalg.slogdet_p,
        linalg.cholesky_p,
        linalg.eigh_p,
        linalg.svd_p,
        linalg.qr_p,
        linalg.pinv_p,
        linalg.eig_p,
        linalg._real_p,
        linalg._imag_p,
        linalg._conj_p,
    ):
        prim.batch = stacked_batch
