"""The methods of every ufunc: outer, reduce, accumulate, reduceat and at.

`np.add.reduce` is np.sum, `np.multiply.accumulate` np.cumprod (rules/reductions.py); the
others are built here for every NumPy ufunc with a rule:

* `outer(A, B)` is the ufunc on A reshaped to broadcast against B (any binary ufunc).
* `reduce` and `accumulate` fold the ufunc along the axis in NumPy's order, so the values are
  NumPy's and each step is differentiated by the ufunc's own rule. `logaddexp.reduce` (a
  log-sum-exp) and the running maxima and minima (`maximum.accumulate`, ...) are one primitive
  each, whatever the length.
* `reduceat` reduces each slice; `at` applies the ufunc in place, in index order (repeated
  indices in turn), as a functional update of the traced array.

Arguments NumPy rejects are checked by NumPy itself, on a small dummy array of the same kind,
so the error is NumPy's own. `NONDIFFERENTIABLE` records why each ufunc without a derivative
has none (a test walks NumPy's ufuncs and checks that each has a rule, a reason, or an error).
"""

from __future__ import annotations

import functools

import numpy as np

from ..core import tracing as trace
from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import UFUNC_METHODS, UFUNCS, implements_ufunc_method
from ..core.tracing import bind
from ._util import dtype_of, ndim_of, normalize_axis, shape_of
from .indexing import SparseCotangent, _along_axis_index, normalize_index
from .reductions import _astype

_PIECEWISE_CONSTANT = "piecewise constant: its derivative is zero wherever it exists"
_BOOLEAN = "a boolean result"
_INTEGER = "defined on integers only"
NONDIFFERENTIABLE = {
    "floor": _PIECEWISE_CONSTANT,
    "ceil": _PIECEWISE_CONSTANT,
    "trunc": _PIECEWISE_CONSTANT,
    "rint": _PIECEWISE_CONSTANT,
    "sign": _PIECEWISE_CONSTANT,
    "floor_divide": _PIECEWISE_CONSTANT,
    "spacing": _PIECEWISE_CONSTANT,
    "signbit": _BOOLEAN,
    "greater": _BOOLEAN,
    "greater_equal": _BOOLEAN,
    "less": _BOOLEAN,
    "less_equal": _BOOLEAN,
    "equal": _BOOLEAN,
    "not_equal": _BOOLEAN,
    "logical_and": _BOOLEAN,
    "logical_or": _BOOLEAN,
    "logical_xor": _BOOLEAN,
    "logical_not": _BOOLEAN,
    "isnan": _BOOLEAN,
    "isinf": _BOOLEAN,
    "isfinite": _BOOLEAN,
    "isnat": "a boolean result (datetimes only)",
    "bitwise_and": _INTEGER,
    "bitwise_or": _INTEGER,
    "bitwise_xor": _INTEGER,
    "invert": _INTEGER,
    "left_shift": _INTEGER,
    "right_shift": _INTEGER,
    "gcd": _INTEGER,
    "lcm": _INTEGER,
    "bitwise_count": _INTEGER,
}


def _numpy_checks(ufunc, method, a, *args, **kwargs):
    """Let NumPy validate the call on a small array of a's dtype (raises NumPy's error)."""
    shape = tuple(min(d, 2) for d in shape_of(a))
    dummy = np.zeros(shape, dtype_of(a))
    kwargs = dict(kwargs)
    if not isinstance(kwargs.get("where", True), bool):
        kwargs["where"] = np.ones(shape, bool)
    if "initial" in kwargs and kwargs["initial"] is not None:
        kwargs["initial"] = np.zeros((), dtype_of(a))[()]
    with np.errstate(all="ignore"):
        getattr(ufunc, method)(dummy, *args, **kwargs)


def _no_out(out, ufunc, method):
    if out is not None and not (isinstance(out, tuple) and all(o is None for o in out)):
        raise GradtapeError(
            f"np.{ufunc.__name__}.{method}(..., out=...) writes into an array in "
            "place, which cannot be traced; assign the result instead."
        )


def _array(x):
    return x if hasattr(x, "_var") else np.asanyarray(x)


# --- outer -----------------------------------------------------------------------------------
def _outer(ufunc):
    def outer(A, B, **kwargs):
        _no_out(kwargs.pop("out", None), ufunc, "outer")
        A, B = _array(A), _array(B)
        return ufunc(np.reshape(A, shape_of(A) + (1,) * ndim_of(B)), B, **kwargs)

    return outer


# --- reduce and accumulate by folding, in NumPy's order --------------------------------------
def _lanes(a, axes):
    """a with the reduced axes moved last and merged: (array, kept shape)."""
    nd = ndim_of(a)
    keep = [i for i in range(nd) if i not in axes]
    order = keep + list(axes)
    if order != list(range(nd)):
        a = np.transpose(a, order)
    kept = tuple(shape_of(a)[: len(keep)])
    merged = int(np.prod([shape_of(a)[i] for i in range(len(keep), nd)], dtype=np.int64))
    return np.reshape(a, kept + (merged,)), kept


def _fold(ufunc, a, axis, keepdims, initial, where):
    shape = shape_of(a)
    axes = normalize_axis(axis, len(shape))
    flat, kept = _lanes(a, axes)
    n = shape_of(flat)[-1]
    mask = None
    if where is not True:
        mask, _ = _lanes(np.broadcast_to(where, shape), axes)
        if initial is None:  # NumPy starts a masked reduction from the identity
            initial = ufunc.identity
    r = None if initial is None else np.broadcast_to(initial, kept)
    for k in range(n):
        x = flat[..., k]
        step = x if r is None else ufunc(r, x)
        r = step if mask is None or r is None else np.where(mask[..., k], step, r)
    if r is None:  # an empty reduction: the identity (NumPy raised already if there is none)
        dt = (
            np.result_type(dtype_of(a), dtype_of(a))
            if initial is None
            else np.result_type(dtype_of(a), initial)
        )
        r = np.full(kept, ufunc.identity, dt)
    elif initial is not None and n == 0:
        r = _astype(r, np.result_type(dtype_of(a), dtype_of(r)))
    if keepdims:
        r = np.reshape(r, tuple(1 if i in axes else d for i, d in enumerate(shape)))
    return r


@functools.cache
def _reduce_is_a_fold(ufunc) -> bool:
    """Whether NumPy's ufunc.reduce is the left fold its ufunc.accumulate computes (NumPy 2.4's
    power.reduce and arctan2.reduce give f(x[0], x[-1]) instead)."""
    v = np.array([1.2, 0.7, 1.5, 0.9])
    with np.errstate(all="ignore"):
        try:
            return bool(np.array_equal(ufunc.reduce(v), ufunc.accumulate(v)[-1], equal_nan=True))
        except (TypeError, ValueError):
            return True


def _refuse_broken(ufunc, method):
    if not _reduce_is_a_fold(ufunc):
        raise GradtapeError(
            f"np.{ufunc.__name__}.{method} in this NumPy ({np.__version__}) does not compute the "
            f"fold np.{ufunc.__name__}.accumulate computes (it combines the first and the last "
            "element only), so gradtape refuses it rather than differentiate either number. "
            f"Write np.{ufunc.__name__}.accumulate(x, axis=...) and take its last element, or "
            "a loop."
        )


def _reduce(ufunc):
    special = _SPECIAL_REDUCE.get(ufunc)

    def reduce(array, axis=0, dtype=None, out=None, keepdims=False, initial=None, where=True):
        _no_out(out, ufunc, "reduce")
        a = _array(array)
        kwargs = {"axis": axis, "keepdims": keepdims}
        if initial is not None:
            kwargs["initial"] = initial
        if where is not True:
            kwargs["where"] = where
        _numpy_checks(ufunc, "reduce", a, dtype=dtype, **kwargs)
        _refuse_broken(ufunc, "reduce")
        if dtype is not None:
            a = _astype(a, dtype)
        if special is not None and initial is None and where is True and 0 not in shape_of(a):
            return special(a, axis, keepdims)
        return _fold(ufunc, a, axis, keepdims, initial, where)

    return reduce


def _accumulate(ufunc):
    special = _SPECIAL_ACCUMULATE.get(ufunc)

    def accumulate(array, axis=0, dtype=None, out=None):
        _no_out(out, ufunc, "accumulate")
        a = _array(array)
        _numpy_checks(ufunc, "accumulate", a, axis=axis, dtype=dtype)
        if dtype is not None:
            a = _astype(a, dtype)
        axis = 0 if axis is None else int(axis) % max(ndim_of(a), 1)
        if special is not None:
            return special(a, axis)
        n = shape_of(a)[axis]
        if n == 0:
            return a
        pre = (slice(None),) * axis
        r = a[pre + (0,)]
        steps = [r]
        for k in range(1, n):
            r = ufunc(r, a[pre + (k,)])
            steps.append(r)
        return np.stack(steps, axis=axis)

    return accumulate


def _reduceat(ufunc):
    def reduceat(array, indices, axis=0, dtype=None, out=None):
        _no_out(out, ufunc, "reduceat")
        a = _array(array)
        dummy_indices = np.clip(np.asarray(indices), 0, 1)
        _numpy_checks(ufunc, "reduceat", a, dummy_indices, axis=axis, dtype=dtype)
        _refuse_broken(ufunc, "reduceat")
        if dtype is not None:
            a = _astype(a, dtype)
        axis = int(axis) % ndim_of(a)
        n = shape_of(a)[axis]
        idx = [int(i) for i in np.asarray(indices).ravel()]
        if any(not 0 <= i < n for i in idx):
            raise IndexError(
                f"index {next(i for i in idx if not 0 <= i < n)} out-of-bounds "
                f"in {ufunc.__name__}.reduceat [0, {n})"
            )
        pre = (slice(None),) * axis
        parts = []
        for k, i in enumerate(idx):
            j = idx[k + 1] if k + 1 < len(idx) else n
            if i < j:
                parts.append(ufunc.reduce(a[pre + (slice(i, j),)], axis=axis, keepdims=True))
            else:
                parts.append(a[pre + (slice(i, i + 1),)])
        return np.concatenate(parts, axis=axis)

    return reduceat


# --- at: the ufunc applied in place, in index order ------------------------------------------
def _traced_basic_index(indices) -> bool:
    """Whether an index holds traced integer scalars and otherwise only ints, slices, None
    and Ellipsis (a basic index: no position is selected twice)."""
    parts = indices if isinstance(indices, tuple) else (indices,)
    traced = False
    for e in parts:
        if type(e) is trace.Tracer:
            if ndim_of(e) != 0 or dtype_of(e).kind not in "iu":
                return False
            traced = True
        elif not (isinstance(e, (int, np.integer, slice)) or e is None or e is Ellipsis):
            return False
    return traced


def _at(ufunc):
    def at(a, indices, b=None):
        if type(a) is not trace.Tracer:
            raise GradtapeError(
                f"np.{ufunc.__name__}.at writes traced values into a plain ndarray, which would "
                "cut the gradient. Start from a traced array instead: acc = np.zeros_like(x) "
                f"(x traced), then np.{ufunc.__name__}.at(acc, idx, values)."
            )
        if _traced_basic_index(indices):
            # a loop counter (or another traced integer) with slices: each position is
            # written once, so this is a[idx] = ufunc(a[idx], b), with the integers kept as
            # inputs of the recorded instructions (not the values seen while recording)
            current = a[indices]
            a[indices] = ufunc(current) if b is None else ufunc(current, b)
            return
        shape = shape_of(a)
        idx = normalize_index(indices)
        positions = np.arange(int(np.prod(shape))).reshape(shape)[idx]
        flat_pos = positions.ravel()
        values = None
        if b is not None:
            values = np.ravel(np.broadcast_to(_array(b), shape_of(positions)))
        # the k-th write to a position happens in round k: each round touches a position once
        n = flat_pos.size
        order = np.argsort(flat_pos, kind="stable")
        sorted_pos = flat_pos[order]
        run_start = np.ones(n, bool)
        run_start[1:] = sorted_pos[1:] != sorted_pos[:-1]
        ramp = np.arange(n)
        occurrence = np.empty(n, np.intp)
        occurrence[order] = ramp - np.maximum.accumulate(np.where(run_start, ramp, 0))
        flat = np.ravel(a).copy()  # written below: not a view of a
        for k in range(int(occurrence.max()) + 1 if n else 0):
            sel = np.flatnonzero(occurrence == k)
            pos = flat_pos[sel]
            current = flat[pos]
            new = ufunc(current) if values is None else ufunc(current, values[sel])
            flat[pos] = new
        new = np.reshape(flat, shape)
        trace.assign(a, new)

    return at


def _numpy_refuses(ufunc, method):
    """Unary ufuncs have no reduce, gufuncs no methods: raise NumPy's own error."""

    def refuse(*args, **kwargs):
        dummy = [
            np.zeros((1,) * max(ndim_of(x), 1), dtype_of(x)) if hasattr(x, "_var") else x
            for x in args
        ]
        getattr(ufunc, method)(*dummy, **kwargs)
        raise GradtapeError(f"np.{ufunc.__name__}.{method} cannot be traced.")

    return refuse


# --- primitives for the common long folds -----------------------------------------------------
def _logaddexp_reduce_vjp(g, ans, x, axes, keepdims, base2):
    shape = shape_of(x)
    kshape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    r = ans if keepdims else np.reshape(ans, kshape)
    gk = g if keepdims else np.reshape(g, kshape)
    return gk * (np.exp2(x - r) if base2 else np.exp(x - r))


def _logaddexp_reduce_jvp(ts, ans, x, axes, keepdims, base2):
    shape = shape_of(x)
    kshape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    r = ans if keepdims else np.reshape(ans, kshape)
    w = np.exp2(x - r) if base2 else np.exp(x - r)
    return np.sum(ts[0] * w, axis=axes, keepdims=keepdims)


logaddexp_reduce_p = Primitive(
    "logaddexp_reduce",
    lambda x, axes, keepdims, base2: (np.logaddexp2 if base2 else np.logaddexp).reduce(
        x, axis=axes, keepdims=keepdims
    ),
    vjps=(_logaddexp_reduce_vjp,),
    jvp=_logaddexp_reduce_jvp,
)


def _logaddexp_reduce(base2):
    def special(a, axis, keepdims):
        axes = normalize_axis(axis, ndim_of(a))
        return bind(
            logaddexp_reduce_p, (a,), {"axes": axes, "keepdims": bool(keepdims), "base2": base2}
        )

    return special


def _running_source(ans, x, axis):
    """For each output of a running maximum/minimum, the index of the element it comes from."""
    n = shape_of(x)[axis]
    pre = (slice(None),) * axis
    previous = np.concatenate([ans[pre + (slice(0, 1),)], ans[pre + (slice(None, -1),)]], axis=axis)
    changed = (ans != previous) & ~(np.isnan(ans) & np.isnan(previous))
    first = np.zeros(n, bool)
    first[0] = True
    first = np.reshape(first, (n,) + (1,) * (ndim_of(x) - axis - 1))
    ramp = np.reshape(np.arange(n), (n,) + (1,) * (ndim_of(x) - axis - 1))
    return np.maximum.accumulate(np.where(changed | first, ramp, 0), axis=axis)


def _running_vjp(g, ans, x, ufunc_name, axis):
    source = _running_source(ans, x, axis)
    return SparseCotangent(
        shape_of(x), dtype_of(x), _along_axis_index(shape_of(x), source, axis), g, False
    )


running_extreme_p = Primitive(
    "running_extreme",
    lambda x, ufunc_name, axis: getattr(np, ufunc_name).accumulate(x, axis=axis),
    vjps=(_running_vjp,),
    jvp=lambda ts, ans, x, ufunc_name, axis: np.take_along_axis(
        ts[0], _running_source(ans, x, axis), axis=axis
    ),
)


def _running(ufunc):
    def special(a, axis):
        if shape_of(a)[axis] == 0:
            return a
        return bind(running_extreme_p, (a,), {"ufunc_name": ufunc.__name__, "axis": axis})

    return special


_SPECIAL_REDUCE = {np.logaddexp: _logaddexp_reduce(False), np.logaddexp2: _logaddexp_reduce(True)}
_SPECIAL_ACCUMULATE = {uf: _running(uf) for uf in (np.maximum, np.minimum, np.fmax, np.fmin)}


def register_all() -> None:
    """Register the methods of every NumPy ufunc that has a rule and no method route yet."""
    for ufunc in sorted(
        {uf for uf in UFUNCS if isinstance(uf, np.ufunc)}, key=lambda uf: uf.__name__
    ):
        if getattr(np, ufunc.__name__, None) is not ufunc:
            continue  # scipy.special's: their methods stay unrouted (a clear error)
        binary = ufunc.nin == 2 and ufunc.nout == 1 and ufunc.signature is None
        methods = {
            "outer": _outer(ufunc) if binary else _numpy_refuses(ufunc, "outer"),
            "reduce": _reduce(ufunc) if binary else _numpy_refuses(ufunc, "reduce"),
            "accumulate": _accumulate(ufunc) if binary else _numpy_refuses(ufunc, "accumulate"),
            "reduceat": _reduceat(ufunc) if binary else _numpy_refuses(ufunc, "reduceat"),
            "at": _at(ufunc)
            if ufunc.signature is None and ufunc.nout == 1
            else _numpy_refuses(ufunc, "at"),
        }
        for method, impl in methods.items():
            if (ufunc, method) not in UFUNC_METHODS:
                implements_ufunc_method(ufunc, method)(impl)
