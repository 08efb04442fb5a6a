"""Helpers shared by rules: written with NumPy calls, so they work on arrays and Tracers alike."""

from __future__ import annotations

import numpy as np


def unbroadcast(g, shape: tuple):
    """Sum a cotangent of a broadcast result back to an argument's `shape`."""
    gshape = getattr(g, "shape", None)
    if gshape == shape:
        return g
    if gshape is None:
        gshape = np.shape(g)
    nlead = len(gshape) - len(shape)
    if nlead < 0:
        return np.broadcast_to(g, shape)
    axes = tuple(range(nlead)) + tuple(
        i + nlead for i, d in enumerate(shape) if d == 1 and gshape[i + nlead] != 1
    )
    if axes:
        g = np.sum(g, axis=axes)
    if np.shape(g) != shape:
        g = np.reshape(g, shape)
    return g


def shape_of(x) -> tuple:
    s = getattr(x, "shape", None)
    return s if s is not None else np.shape(x)


def ndim_of(x) -> int:
    return len(shape_of(x))


def dtype_of(x) -> np.dtype:
    dt = getattr(x, "dtype", None)
    return dt if dt is not None else np.result_type(x)


def normalize_axis(axis, ndim: int):
    """None, an int or a tuple of ints -> a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(sorted(int(a) % ndim if ndim else 0 for a in axis))


def expand_reduced(g, shape: tuple, axes: tuple, keepdims: bool):
    """Reshape the cotangent of a reduction so it broadcasts against the reduced input."""
    if keepdims or not axes:
        return g
    kshape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return np.reshape(g, kshape)


# --- batched tangents: jvp rules declared `jvp_batched` accept tangents with leading batch axes
def batch_shape(t, x) -> tuple:
    """The leading batch axes of tangent `t` of argument `x` (() for a single direction)."""
    s = shape_of(t)
    return s[: len(s) - ndim_of(x)]


def shift_axes(axes: tuple, k: int) -> tuple:
    """Axes of an argument as axes of its tangent with `k` leading batch axes."""
    return tuple(a + k for a in axes) if k else axes


def lift_tangent(t, x, ndim: int):
    """Tangent `t` of `x` (with leading batch axes) shaped to broadcast against a result of
    `ndim` dimensions: ones are inserted between the batch axes and the argument's axes."""
    xnd = ndim_of(x)
    s = shape_of(t)
    k = len(s) - xnd
    if k == 0 or xnd == ndim:
        return t
    return np.reshape(t, s[:k] + (1,) * (ndim - xnd) + s[k:])
