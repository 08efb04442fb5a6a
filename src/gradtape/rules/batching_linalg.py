"""Batching rules (vmap) of SciPy's linear algebra, the array API's matrix-vector functions,
the FFT, convolutions, padding and the few elementwise and reducing primitives declared
outside the categories of rules/batching.py.

SciPy's matrix functions, factorizations and solves take stacks of matrices (their LAPACK
calls run once per matrix, so a member's result is the one it gets alone): a batch is one
more leading axis. np.convolve has no stacked form: a batch of convolutions is one product
of sliding windows (the same sums, added in another order: equal to rounding). A case a
rule cannot do that way runs once per member (`tracing.loop_batch`).
"""

from __future__ import annotations

import numpy as np

from ..core.primitive import REGISTRY
from ..core.tracing import loop_batch
from . import fft, scipy_linalg, scipy_misc, sequences, ufunc_methods
from ._util import ndim_of, shape_of
from .batching import (
    _aligned,
    _aligned_stacks_batch,
    _axis,
    _batch_size,
    _full_batch,
    _lift,
    _member_ndim,
    cumulative_batch,
    elementwise_batch,
    reduction_batch,
    stacked_batch,
)
from .linalg import triangular_solve


def common_stack_batch(prim, args, batched, **params):
    """Stacks of matrices that SciPy pairs member by member: batched ones lifted to the
    members' common rank, then every argument spelled out to the common leading shape."""
    lifted = _aligned(args, batched)
    lead = np.broadcast_shapes(*(shape_of(a)[:-2] for a in lifted))
    return prim(*(np.broadcast_to(a, lead + shape_of(a)[-2:]) for a in lifted), **params)


def lu_solve_factors_batch(prim, args, batched, trans):
    """x = op(A)^-1 b from A's packed LU factors and pivots, as LAPACK's getrs computes it
    (the rows interchanged, then the unit lower and the upper triangular solve), for the
    whole batch at once: getrs takes one matrix."""
    lu, piv, b = args
    if (
        _member_ndim(lu, batched[0]) != 2
        or _member_ndim(piv, batched[1]) != 1
        or _member_ndim(b, batched[2]) != 2
    ):
        return loop_batch(prim, args, batched, trans=trans)
    size = _batch_size(args, batched)
    lu, piv, b = (_full_batch(a, f, size) for a, f in zip(args, batched))
    perm = scipy_linalg._permutation_p.impl(piv, shape_of(lu)[-1])
    if trans == 0:
        y = triangular_solve(lu, scipy_linalg._rows(b, perm), lower=True, unit=True)
        return triangular_solve(lu, y, lower=False)
    y = triangular_solve(lu, b, lower=False, trans=1)
    z = triangular_solve(lu, y, lower=True, trans=1, unit=True)
    return scipy_linalg._rows(z, np.argsort(perm, axis=-1))


def _gufunc_batch(core: tuple):
    """The rule of a generalized ufunc whose arguments have `core` trailing axes each: the
    batched ones lifted so that the members' stack axes line up."""

    def rule(prim, args, batched):
        stacks = [_member_ndim(a, b) - c for a, b, c in zip(args, batched, core)]
        if min(stacks) < 0:
            return loop_batch(prim, args, batched)
        s = max(stacks)
        return prim(*(_lift(a, s + c) if b else a for a, b, c in zip(args, batched, core)))

    return rule


def fft_batch(prim, args, batched, kind, axis, n, norm):
    """A one-axis transform along the member's axis, behind the batch axis."""
    (x,) = args
    return prim(x, kind=kind, axis=_axis(axis, ndim_of(x) - 1), n=n, norm=norm)


def pad_batch(prim, args, batched, pad_width, value):
    """The batch axis is not padded."""
    return prim(args[0], pad_width=((0, 0),) + tuple(pad_width), value=value)


_CONVOLVE_LENGTHS = {
    "full": lambda na, nv: na + nv - 1,
    "same": lambda na, nv: max(na, nv),
    "valid": lambda na, nv: max(na, nv) - min(na, nv) + 1,
}


def _convolve_offset(kind: str, mode: str, na: int, nv: int) -> int:
    """Where np.convolve's (np.correlate's) mode takes its values out of the full result."""
    lo = min(na, nv)
    if mode == "full":
        return 0
    if mode == "valid":
        return lo - 1
    return lo // 2 if kind == "correlate" and na < nv else (lo - 1) // 2


def convolution_batch(prim, args, batched, kind, mode):
    """np.convolve / np.correlate of 1-d members: the full result is the product of the
    sliding windows of the zero-padded `a` with the reversed `v`, then the mode's part."""
    a, v = args
    ba, bv = batched
    if _member_ndim(a, ba) != 1 or _member_ndim(v, bv) != 1 or mode not in _CONVOLVE_LENGTHS:
        return loop_batch(prim, args, batched, kind=kind, mode=mode)
    na, nv = shape_of(a)[-1], shape_of(v)[-1]
    if not na or not nv:
        return loop_batch(prim, args, batched, kind=kind, mode=mode)
    kernel = v if kind == "correlate" else v[..., ::-1]  # convolve reverses v, correlate not
    padded = np.pad(a, ((0, 0),) * ba + ((nv - 1, nv - 1),))
    index = np.arange(na + nv - 1)[:, None] + np.arange(nv)[None, :]
    windows = padded[..., index]
    subscripts = ("blk" if ba else "lk") + "," + ("bk" if bv else "k") + "->bl"
    full = np.einsum(subscripts, windows, kernel)
    start = _convolve_offset(kind, mode, na, nv)
    return full[:, start : start + _CONVOLVE_LENGTHS[mode](na, nv)]


def signal_convolve_batch(prim, args, batched, mode, method):
    """scipy.signal.convolve with one batched argument: the other gets a leading axis of
    length one, which every mode keeps as the batch axis when the batched argument is the
    first (for `valid`, when each of its members' axes is at least as long), and mode
    `full` keeps whichever is batched."""
    a, b = args
    ba, bb = batched
    nda, ndb = _member_ndim(a, ba), _member_ndim(b, bb)
    if ba == bb or nda != ndb:
        return loop_batch(prim, args, batched, mode=mode, method=method)
    if ba:
        longer = all(x >= y for x, y in zip(shape_of(a)[1:], shape_of(b)))
        if mode == "full" or mode == "same" or (mode == "valid" and longer):
            return prim(a, np.expand_dims(b, 0), mode=mode, method=method)
    elif mode == "full":
        return prim(np.expand_dims(a, 0), b, mode=mode, method=method)
    return loop_batch(prim, args, batched, mode=mode, method=method)


def lfilter_batch(prim, args, batched, axis):
    """scipy.signal.lfilter of a batch of signals with one filter: along the member's axis."""
    b, a, x = args
    if batched[0] or batched[1]:
        return loop_batch(prim, args, batched, axis=axis)
    return prim(b, a, x, axis=_axis(axis, ndim_of(x) - 1))


def declare() -> None:
    """Give these primitives their batching rules (called once, after the declarations)."""
    for name in ("cho_factors", "lu", "lu_permutation", "expm", "sqrtm", "logm", "scipy_eigh"):
        REGISTRY[name].batch = stacked_batch
    for name in ("cho_solve", "pos_solve"):
        REGISTRY[name].batch = _aligned_stacks_batch
    for name in (
        "scipy_eigh_general",
        "solve_sylvester",
        "solve_continuous_lyapunov",
        "solve_discrete_lyapunov",
    ):
        REGISTRY[name].batch = common_stack_batch
    scipy_linalg.lu_solve_factors_p.batch = lu_solve_factors_batch
    for name, core in (("matvec", (2, 1)), ("vecmat", (1, 2)), ("vecdot", (1, 1))):
        if name in REGISTRY:  # NumPy 2.2 and later
            REGISTRY[name].batch = _gufunc_batch(core)
    for name in ("real", "imag", "maclaurin", "discrete_ppf"):
        REGISTRY[name].batch = elementwise_batch
    ufunc_methods.logaddexp_reduce_p.batch = reduction_batch
    ufunc_methods.running_extreme_p.batch = cumulative_batch
    fft.fft_p.batch = fft_batch
    REGISTRY["pad"].batch = pad_batch
    sequences.convolution_p.batch = convolution_batch
    scipy_misc.convolution_p.batch = signal_convolve_batch
    scipy_misc.lfilter_p.batch = lfilter_batch
