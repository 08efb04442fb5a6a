"""scipy.special functions as Numba scalar functions, for the native forms of their primitives.

Each computes what SciPy computes on every input (the edge values: zeros, signs of zero,
infinities, NaN, the poles) and is within a few units in the last place of SciPy's value
elsewhere (log_ndtr, through Numba's erfc: within 1e-13 relative), as
tests/test_scipy_special.py checks over each function's domain and its edge values. The
generated kernels import them by name (codegen's header), so a primitive names one in its
declaration: `native="float64:digamma"`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_inline = njit(inline="always", error_model="numpy")

_SQRT1_2 = math.sqrt(0.5)
_LOG_2 = math.log(2.0)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


# digamma as SciPy computes it (Cephes' psi): Boost's rational approximation on [1, 2], written
# around the positive root x0 = root1 + root2 + root3 as (x - x0) (Y + P(x - 1) / Q(x - 1)); an
# asymptotic series above 10; recurrences and the reflection formula between
_PSI_Y = float(np.float32(0.99558162689208984))
_PSI_ROOT1 = 1569415565.0 / 1073741824.0
_PSI_ROOT2 = (381566830.0 / 1073741824.0) / 1073741824.0
_PSI_ROOT3 = 0.9016312093258695918615325266959189453125e-19
_EULER = 0.57721566490153286061


@_inline
def _digamma_1_2(x):
    t = x - 1.0
    p = -0.0020713321167745952
    for c in (-0.045251321448739056, -0.28919126444774784, -0.65031853770896507):
        p = p * t + c
    p = (p * t - 0.32555031186804491) * t + 0.25479851061131551
    q = -0.55789841321675513e-6
    for c in (0.0021284987017821144, 0.054151797245674225, 0.43593529692665969):
        q = q * t + c
    q = ((q * t + 1.4606242909763515) * t + 2.0767117023730469) * t + 1.0
    g = x - _PSI_ROOT1
    g -= _PSI_ROOT2
    g -= _PSI_ROOT3
    return g * _PSI_Y + g * (p / q)


@_inline
def _digamma_large(x):
    y = 0.0
    if x < 1.0e17:
        z = 1.0 / (x * x)
        a = 8.33333333333333333333e-2
        for c in (
            -2.10927960927960927961e-2,
            7.57575757575757575758e-3,
            -4.16666666666666666667e-3,
            3.96825396825396825397e-3,
            -8.33333333333333333333e-3,
            8.33333333333333333333e-2,
        ):
            a = a * z + c
        y = z * a
    return math.log(x) - 0.5 / x - y


@_inline
def digamma(x):
    """scipy.special.psi: -inf at +0, +inf at -0, NaN at the other poles (negative integers)
    and at -inf."""
    if math.isnan(x) or x == math.inf:
        return x
    if x == -math.inf:
        return math.nan
    if x == 0.0:
        return -math.copysign(math.inf, x)
    y = 0.0
    if x < 0.0:
        fraction = x - np.trunc(x)  # exact; tan has period pi
        if fraction == 0.0:
            return math.nan
        y = -math.pi / math.tan(math.pi * fraction)
        x = 1.0 - x
    if x <= 10.0 and x == np.floor(x):
        n = int(x)
        for i in range(1, n):
            y += 1.0 / i
        return y - _EULER
    if x < 1.0:
        y -= 1.0 / x
        x += 1.0
    elif x < 10.0:
        while x > 2.0:
            x -= 1.0
            y += 1.0 / x
    if 1.0 <= x <= 2.0:
        return y + _digamma_1_2(x)
    return y + _digamma_large(x)


@_inline
def log_ndtr(x):
    """scipy.special.log_ndtr: log of the standard normal CDF, accurate in both tails."""
    if math.isnan(x):
        return x
    if x >= -1.0:
        return math.log1p(-0.5 * math.erfc(x * _SQRT1_2))
    t = -x * _SQRT1_2
    if t < 26.0:  # erfc(t) is a normal number: its logarithm keeps full relative precision
        return math.log(0.5 * math.erfc(t))
    if t == math.inf:
        return -math.inf
    # erfc(t) = exp(-t^2) erfcx(t), erfcx(t) = 1 / (t sqrt(pi)) * (1 - 1/(2t^2) + 3/(2t^2)^2 - ...)
    w = 1.0 / (2.0 * t * t)
    series = 1.0 - w * (1.0 - 3.0 * w * (1.0 - 5.0 * w * (1.0 - 7.0 * w * (1.0 - 9.0 * w))))
    return math.log(_INV_SQRT_PI * series / t) - _LOG_2 - t * t


@_inline
def logit(x):
    """scipy.special.logit: log(x / (1 - x)), by log1p differences around 1/2 (as SciPy)."""
    if x < 0.3 or x > 0.65:
        return math.log(x / (1.0 - x))
    s = 2.0 * (x - 0.5)
    return math.log1p(s) - math.log1p(-s)


@_inline
def xlog1py(x, y):
    """scipy.special.xlog1py: 0 where x == 0 (unless y is NaN), else x * log1p(y)."""
    if x == 0.0 and not math.isnan(y):
        return 0.0
    return x * math.log1p(y)


@_inline
def entr(x):
    """scipy.special.entr: -x log x for x > 0, 0 at 0, -inf below."""
    if math.isnan(x):
        return x
    if x > 0.0:
        return -x * math.log(x)
    if x == 0.0:
        return 0.0
    return -math.inf


@_inline
def rel_entr(x, y):
    """scipy.special.rel_entr: x log(x / y) for x, y > 0; 0 for x == 0, y >= 0; else inf."""
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if x > 0.0 and y > 0.0:
        ratio = x / y
        if 0.5 < ratio < 2.0:  # log1p keeps the digits of a ratio near 1
            return x * math.log1p((x - y) / y)
        if 2.2250738585072014e-308 < ratio < math.inf:
            return x * math.log(ratio)
        return x * (math.log(x) - math.log(y))  # the ratio under- or overflows
    if x == 0.0 and y >= 0.0:
        return 0.0
    return math.inf


@_inline
def kl_div(x, y):
    """scipy.special.kl_div: x log(x / y) - x + y for x, y > 0; y for x == 0, y >= 0; else inf."""
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if x > 0.0 and y > 0.0:
        return x * math.log(x / y) - x + y
    if x == 0.0 and y >= 0.0:
        return y
    return math.inf


@_inline
def huber(delta, r):
    """scipy.special.huber: r^2 / 2 inside |r| <= delta, linear outside; inf for delta < 0."""
    if delta < 0.0:
        return math.inf
    if abs(r) <= delta:
        return 0.5 * r * r
    return delta * (abs(r) - 0.5 * delta)


@_inline
def pseudo_huber(delta, r):
    """scipy.special.pseudo_huber: delta^2 (sqrt(1 + (r / delta)^2) - 1), without cancellation."""
    if delta < 0.0:
        return math.inf
    if delta == 0.0 or r == 0.0:
        return 0.0
    v = r / delta
    return delta * delta * math.expm1(0.5 * math.log1p(v * v))
