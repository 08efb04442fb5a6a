"""Helpers that the numba backend's generated kernels import (this module imports Numba).

`reduce_add` and `reduce_mul` are a float + and * whose LLVM instruction carries the
`reassoc` and `nsz` flags, and nothing else: a loop accumulating with them vectorizes (LLVM
may reorder the additions of the reduction into vector lanes) while every other operation of
the kernel keeps IEEE semantics, so elementwise arithmetic equals NumPy's bit for bit. (Numba's
`fastmath=` applies to the whole function: `{"reassoc"}` would also let LLVM rewrite the user's
`(x + c1) + c2`.)
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

_REDUCTION_FLAGS = ("reassoc", "nsz", "contract")


def _flagged(opname: str):
    @intrinsic
    def op(typingctx, a, b):
        if not (isinstance(a, types.Float) and a == b):
            return None

        def codegen(context, builder, signature, args):
            return getattr(builder, opname)(args[0], args[1], flags=_REDUCTION_FLAGS)

        return a(a, b), codegen

    return op


@intrinsic
def prefer_wide_vectors(typingctx):
    """Let LLVM vectorize the calling kernel with the widest registers (AVX-512: 8 doubles).

    LLVM's tuning for recent x86 CPUs prefers 256-bit vectors; the fused loops here are
    compute-bound (polynomials), and 512-bit vectors run them about 1.4x faster (measured:
    sum of exp at N=10^5, 73 us against 105 us). A string function attribute, which llvmlite's
    attribute set does not list, so it is added to the set directly.
    """

    def codegen(context, builder, signature, args):
        set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    return types.none(), codegen


reduce_add = _flagged("fadd")
reduce_mul = _flagged("fmul")

_inline = njit(inline="always", error_model="numpy")


@_inline
def is_c(a):
    """Whether an array is C-contiguous (NumPy's rule: axes of length 1 do not count, and an
    empty array is contiguous whatever its strides: Numba may give it strides of 0)."""
    if a.size == 0:
        return True
    expected = a.itemsize
    for k in range(a.ndim - 1, -1, -1):
        n = a.shape[k]
        if n != 1 and a.strides[k] != expected:
            return False
        expected *= n
    return True


@_inline
def max_step(acc, x):
    """NumPy's maximum for a running max: NaN is sticky."""
    return x if (not (x <= acc)) and acc == acc else acc


@_inline
def min_step(acc, x):
    """NumPy's minimum for a running min: NaN is sticky."""
    return x if (not (x >= acc)) and acc == acc else acc


@_inline
def nan_safe_product(g, p):
    """g * p, 0 where g is 0 and p infinite or NaN. The product is NaN exactly when g or p is
    NaN or one is 0 and the other infinite, so a NaN product with g == 0 is the masked case; a
    select, with no branch, so loops with it vectorize."""
    d = g * p
    return d if (d == d) | (g != 0) else abs(g)


@_inline
def int_max_step(acc, x):
    return x if x > acc else acc


@_inline
def int_min_step(acc, x):
    return x if x < acc else acc


@njit(error_model="numpy")
def same_value(a, answer):
    """np.array_equal(a, answer, equal_nan=True) for the arrays a guard read (same shape)."""
    fa = a.ravel()
    fb = answer.ravel()
    if fa.size != fb.size:
        return False
    for i in range(fa.size):
        x, y = fa[i], fb[i]
        if x != y and not (x != x and y != y):
            return False
    return True


@njit(error_model="numpy")
def scatter_add_1d(base, index, values):
    """np.add.at(base, index, values) for a 1-d base, a 1-d index and values of its length."""
    n = base.shape[0]
    for j in range(index.shape[0]):
        k = index[j]
        if k < 0:
            k += n
        base[k] += values[j]


@njit(error_model="numpy")
def scatter_add_1d_scalar(base, index, value):
    n = base.shape[0]
    for j in range(index.shape[0]):
        k = index[j]
        if k < 0:
            k += n
        base[k] += value


_SQRT1_2 = math.sqrt(0.5)


@_inline
def ndtr(a):
    """scipy.special.ndtr (Cephes' formula, with libm's erf and erfc)."""
    x = a * _SQRT1_2
    z = abs(x)
    if z < _SQRT1_2:
        return 0.5 + 0.5 * math.erf(x)
    y = 0.5 * math.erfc(z)
    return 1.0 - y if x > 0 else y


@_inline
def xlogy(x, y):
    """scipy.special.xlogy: 0 where x == 0 (unless y is NaN), else x * log(y)."""
    if x == 0 and not np.isnan(y):
        return 0.0 * x
    return x * np.log(y)


@_inline
def copy_into(dst, src):
    """dst[...] = src for two C-contiguous arrays of one shape (native loops' carries)."""
    d = dst.reshape(dst.size)
    s = src.reshape(src.size)
    for i in range(d.size):
        d[i] = s[i]


@_inline
def add_into(dst, src):
    """dst += src for two C-contiguous arrays of one shape (cotangents summed over steps)."""
    d = dst.reshape(dst.size)
    s = src.reshape(src.size)
    for i in range(d.size):
        d[i] += s[i]
