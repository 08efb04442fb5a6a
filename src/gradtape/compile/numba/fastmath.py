"""Vectorizable exp, expm1, log, log1p, tanh, logaddexp, softplus, expit for Numba loops.

LLVM turns a Numba loop over `np.exp` into `llvm.exp.v4f64` and then into one libm call per
element (PyPI's llvmlite has no SVML), so a fused loop is several times slower than NumPy.
These functions are plain arithmetic on the value and its bits (Cody-Waite range reduction,
Remez minimax polynomials, powers of two built from exponent bits, clamps and selects
instead of branches), so they inline into the caller's loop and LLVM vectorizes it.

Use them inside `@njit` code: `s += fast_exp(x[i])` (from Python they work on scalars).
Each name is one generic function dispatched by argument type with
`numba.extending.overload`: float32 arguments get float32 arithmetic with shorter
polynomials (twice the lanes per vector), everything else (float64, integers, booleans,
float32 mixed with float64) gets float64, like NumPy's ufuncs. One algorithm text serves
both formats: `_make_kernels` closes over a table of constants per format, so a float32
kernel contains no float64 operation. (`generated_jit` is gone from Numba, and one `@njit`
body cannot choose its constants by type; `overload` compiles each format once, on first
use, and converting wrappers send other argument types to the float64 kernel.)

Inlining and floating-point flags. A kernel is compiled with fastmath `{"contract"}` only
(FMA allowed, no reassociation) and with Numba's `forceinline=True`: it stays a function of
its own that LLVM must inline (`alwaysinline`), and LLVM keeps each instruction's own flags
when it does. The calling loop may therefore allow `{"reassoc", "contract", "nsz", "arcp"}`
for its reduction. Numba's `inline="always"` would be wrong here: it inlines at the Numba-IR
level, the body then takes the caller's flags, LLVM folds `(t + shift) - shift` and
reassociates the range reduction, and exp is off by up to 40% (measured). Without any
forced inlining LLVM leaves the larger kernels (tanh, softplus) as scalar calls and the loop
does not vectorize. Flags `nnan`/`ninf` in a caller let LLVM assume that no NaN or infinity
flows through, which defeats the special-value handling below.

Special values follow NumPy: NaN propagates; exp(+inf) = inf, exp(-inf) = 0, overflow gives
inf and underflow 0; log(0) = -inf, log(x < 0) = nan, log(inf) = inf; log1p(-1) = -inf,
log1p(x < -1) = nan; expm1(-inf) = -1; tanh(+-inf) = +-1; logaddexp(inf, inf) = inf;
signed zeros are kept (expm1, log1p, tanh of -0.0 are -0.0). Subnormals are handled, not
flushed: exp applies 2**n in two exact factors, so a subnormal result is rounded from the
full-precision one (double rounding: up to 0.75 ulp of the subnormal, measured), and
subnormal arguments of log and log1p are scaled into the normal range first.

Accuracy. exp is the plain fast version (< 1 ulp); the composite functions use exp as an
unevaluated sum hi + lo and correct their divisions with an FMA residual (`llvm.fma`: one
instruction on x86-64 CPUs with AVX2 and on AArch64), so their error stays near half an ulp
plus that of their last step instead of adding up the errors of their parts. Maximum error
in ulps of the exact result, measured by tests/test_fastmath.py against np.longdouble
references over the whole finite range, the branch points, the overflow and underflow
thresholds and the special values (run it as a script for this table):

    function     float64  float32   NumPy 2.4 on the same inputs (AVX-512), float64 float32
    exp            0.93     0.95                                             0.68    2.12
    expm1          0.84     0.82                                             0.52    2.51
    log            0.76     0.76                                             0.59    3.15
    log1p          0.82     0.82                                             0.59    1.75
    tanh           0.70     0.70                                             1.14    1.36
    expit          0.75     0.75    (scipy.special.expit flushes subnormal results to 0)
    softplus       1.11     1.15    np.logaddexp(0, x)                       1.35    1.36
    log_expit      1.00     1.15    scipy.special.log_expit                  1.30    1.41
    logaddexp      1.16     1.44                                             1.47    1.79

logaddexp(x, y) = max(x, y) + log1p(exp(-|x - y|)) cancels when max(x, y) < 0 (NumPy's
formula too), so its error is in ulps of max(|result|, |x|, |y|), the scale of its
sensitivity to its arguments. The tests assert these bounds rounded up to 0.25 ulp.

`FAST_FUNCTIONS` maps the functions' names (without `fast_`) to them, for tests and
benchmarks; the numba backend's kernels call the functions that elementwise primitives name
in their native forms (`native="float:fast_exp"`). Importing this module imports Numba: only
the numba backend imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

#: fastmath flags of every kernel: FMA contraction only, no reassociation.
KERNEL_FLAGS = frozenset({"contract"})
#: Numba options of every kernel; NumPy's error model: x / 0 is inf or nan, not an exception.
KERNEL_OPTIONS = {"fastmath": set(KERNEL_FLAGS), "error_model": "numpy", "forceinline": True}


# --- bits ------------------------------------------------------------------------------------
@intrinsic
def _bits(typingctx, x):
    """The IEEE bits of a float as a signed integer of the same width (an LLVM bitcast)."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(x.bitwidth))

    return types.Integer.from_bitwidth(x.bitwidth)(x), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c with one rounding (llvm.fma: one instruction on every CPU with AVX2 or NEON)."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


@intrinsic
def _from_bits(typingctx, bits, like):
    """The float of `like`'s type whose bits are the low bits of the integer `bits`."""
    if not isinstance(bits, types.Integer) or not isinstance(like, types.Float):
        return None
    width = like.bitwidth

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth > width:
            value = builder.trunc(value, ir.IntType(width))
        elif bits.bitwidth < width:
            value = builder.sext(value, ir.IntType(width))
        return builder.bitcast(value, context.get_value_type(like))

    return like(bits, like), codegen


# --- constants per format ----------------------------------------------------------------------
def _hex(*values: str) -> tuple[float, ...]:
    return tuple(float.fromhex(v) for v in values)


class _Format(NamedTuple):
    """What the kernels need to know about a float format; polynomials highest degree first.

    The polynomials come from tools/fastmath_coefficients.py (Remez fits of relative error):
    exp_poly P(r) = (exp(r) - 1 - r) / r**2 on |r| <= ln2/2; log_poly T(z) with
    log((1+s)/(1-s)) = 2s + s z T(z), z = s**2 <= (3 - 2 sqrt 2)**2; tanh_poly Q(z) with
    tanh(x) = x + x z Q(z), z = x**2 <= TANH_POLYNOMIAL_BELOW**2. ln2_hi has its low
    significand bits zero, so k * ln2_hi is exact for every exponent k.
    """

    dtype: type
    exp_poly: tuple[float, ...]
    log_poly: tuple[float, ...]
    tanh_poly: tuple[float, ...]
    ln2_hi: float
    ln2_lo: float


TANH_POLYNOMIAL_BELOW = 0.5625  # above it tanh(x) > 1/2: 1 - 2/(e**2x + 1) does not cancel

_FORMATS = {
    64: _Format(
        np.float64,
        exp_poly=_hex(
            "0x1.1f1ad80d77cdcp-29",
            "0x1.af526a0582a4ep-26",
            "0x1.27e511b94ad3bp-22",
            "0x1.71de0004c3f0cp-19",
            "0x1.a01a018f6a7dep-16",
            "0x1.a01a01ac984e1p-13",
            "0x1.6c16c16c1a4cbp-10",
            "0x1.111111110ff98p-7",
            "0x1.555555555554ep-5",
            "0x1.5555555555557p-3",
            "0x1p-1",
        ),
        log_poly=_hex(
            "0x1.2ba1c7c45f428p-3",
            "0x1.39f8622e3162dp-3",
            "0x1.7462e338a59a3p-3",
            "0x1.c71c6240656fdp-3",
            "0x1.2492492e74197p-2",
            "0x1.9999999994e37p-2",
            "0x1.5555555555558p-1",
        ),
        tanh_poly=_hex(
            "-0x1.50005558531a5p-16",
            "0x1.616ff0dd26219p-14",
            "-0x1.eaf4c18b23076p-13",
            "0x1.34ad364b9b56p-11",
            "-0x1.7d954648161a9p-10",
            "0x1.d6d30f9f49b17p-9",
            "-0x1.226e32217a455p-7",
            "0x1.664f48727d931p-6",
            "-0x1.ba1ba1b9f19fdp-5",
            "0x1.1111111110fbep-3",
            "-0x1.5555555555555p-2",
        ),
        ln2_hi=float.fromhex("0x1.62e42ffp-1"),
        ln2_lo=float.fromhex("-0x1.718432a1b0e26p-35"),
    ),
    32: _Format(
        np.float32,
        exp_poly=_hex(
            "0x1.a07488p-13",
            "0x1.6d48d4p-10",
            "0x1.11114ep-7",
            "0x1.5554e4p-5",
            "0x1.555556p-3",
            "0x1p-1",
        ),
        log_poly=_hex("0x1.2f02cp-2", "0x1.997b8ap-2", "0x1.55555cp-1"),
        tanh_poly=_hex(
            "-0x1.ababa8p-8", "0x1.5c6166p-6", "-0x1.b99036p-5", "0x1.110fb4p-3", "-0x1.555554p-2"
        ),
        ln2_hi=float.fromhex("0x1.62e4p-1"),
        ln2_lo=float.fromhex("0x1.7f7d1cp-20"),
    ),
}


def _int_bits(value: float, dtype: type) -> int:
    """The bits of `value` in `dtype` as a Python int."""
    return int(np.array(value, dtype).view(f"i{np.dtype(dtype).itemsize}"))


# --- the kernels -------------------------------------------------------------------------------
def _make_kernels(fmt: _Format) -> dict[str, Callable]:
    """Python kernels for one format, closing over its constants; `overload` compiles them.

    A kernel is only called with arguments of its format. Every float constant is of the
    format's type, so float32 kernels stay in float32. Integer work happens on the bits
    (Numba widens it to int64; only the low bits are used).
    Helpers are inlined into each kernel at the Numba-IR level (they share its flags).
    Composite functions carry exp's result as an unevaluated sum hi + lo and correct their
    divisions with an FMA residual, so their error stays near half an ulp instead of adding
    up the errors of their parts.
    """
    F = fmt.dtype
    info = np.finfo(F)
    MANT = int(info.nmant)  # explicit significand bits: 52 or 23
    BIAS = int(info.maxexp) - 1  # 1023 or 127
    LN2 = math.log(2.0)
    ZERO, HALF, ONE, TWO = F(0.0), F(0.5), F(1.0), F(2.0)
    INF, NAN, LN2_F = F(np.inf), F(np.nan), F(LN2)
    INV_LN2 = F(1.0 / LN2)
    LN2_HI, LN2_LO = F(fmt.ln2_hi), F(fmt.ln2_lo)
    EXP_POLY = tuple(F(c) for c in fmt.exp_poly)
    LOG_POLY = tuple(F(c) for c in fmt.log_poly)
    TANH_POLY = tuple(F(c) for c in fmt.tanh_poly)
    # x * INV_LN2 + SHIFT rounds to an integer n held in the low significand bits.
    SHIFT = F(1.5 * 2.0**MANT)
    SHIFT_BITS = _int_bits(SHIFT, F)
    # exp: n stays within [-(BIAS + MANT + 20), BIAS + 16]: both halves of 2**n are normal,
    # while results beyond the overflow and underflow thresholds still round to inf and 0.
    EXP_LO, EXP_HI = F(-(BIAS + MANT + 20) * LN2), F((BIAS + 16) * LN2)
    # expm1: below EXPM1_LO the result rounds to -1; n <= BIAS + 1 keeps 2**(n-1) finite.
    EXPM1_LO, EXPM1_HI = F(-(MANT + 8) * LN2), F((BIAS + 1.25) * LN2)
    EXPM1_TINY = F(2.0 ** -(MANT + 2))  # expm1(x) rounds to x below this
    TANH_HI = F((MANT + 8) * LN2 / 2)  # tanh rounds to 1 above this
    TANH_POLY_BELOW = F(TANH_POLYNOMIAL_BELOW)
    # log: significand m in [sqrt(1/2), sqrt(2)); subnormals scaled by 2**(MANT + 2) first.
    SQRT_HALF_BITS = _int_bits(math.sqrt(0.5), F)
    ONE_BITS = _int_bits(1.0, F)
    MANT_MASK = (1 << MANT) - 1
    MIN_NORMAL = F(info.smallest_normal)
    SUBNORMAL_SCALE = F(2.0 ** (MANT + 2))
    SUBNORMAL_SHIFT = F(MANT + 2)
    # float(e) for a small integer e: the bits of 2**MANT with e in the low bits, minus 2**MANT.
    MAGIC = F(2.0**MANT)
    MAGIC_BITS = _int_bits(MAGIC, F)
    MAGIC_PLUS_BIAS = F(2.0**MANT + BIAS)

    helper = njit(inline="always", **KERNEL_OPTIONS)

    @helper
    def polynomial(coefficients, x):
        acc = coefficients[0]
        for c in coefficients[1:]:
            acc = acc * x + c
        return acc

    @helper
    def power_of_two(n, like):
        """2**n (a float of like's type) for n within the normal exponent range."""
        return _from_bits((n + BIAS) << MANT, like)

    @helper
    def scaled(value, n):
        """value * 2**n in two exact steps: one rounding even where the result is subnormal."""
        half = n >> 1
        return value * power_of_two(half, value) * power_of_two(n - half, value)

    @helper
    def reduce_exp(x):
        """(r, c, n): x = n ln2 + r + c with |r| <= ln2/2, c the rounding error of r."""
        shifted = x * INV_LN2 + SHIFT
        n = shifted - SHIFT
        hi = x - n * LN2_HI  # exact
        lo = n * LN2_LO
        r = hi - lo
        return r, (hi - r) - lo, _bits(shifted) - SHIFT_BITS

    @helper
    def expm1_tail(r, c):
        """exp(r + c) - 1 - r for |r| <= ln2/2 and tiny c: the small part, accurate."""
        return r * r * polynomial(EXP_POLY, r) + (c * r + c)

    @helper
    def exp_pair(x):
        """(hi, lo, n) with e**x = (hi + lo) 2**n, hi + lo good to ~2**-(MANT + 5)."""
        x = EXP_HI if x > EXP_HI else x
        x = EXP_LO if x < EXP_LO else x
        r, c, n = reduce_exp(x)
        tail = expm1_tail(r, c)
        m_hi = r + tail
        m_lo = (r - m_hi) + tail  # |r| >= |tail|: exact
        hi = ONE + m_hi
        return hi, ((ONE - hi) + m_hi) + m_lo, n

    @helper
    def reciprocal_pair(d_hi, d_lo):
        """(hi, lo) with hi + lo = 1 / (d_hi + d_lo), from one division and an FMA residual."""
        hi = ONE / d_hi
        residual = _fma(-hi, d_hi, ONE) - hi * d_lo
        return hi, residual * hi

    @helper
    def log_normal_plus(u, c, k_offset):
        """log(u) + c - k_offset ln2 for a normal u > 0 and a small c (garbage elsewhere)."""
        bits = _bits(u) + (ONE_BITS - SQRT_HALF_BITS)  # carries into the exponent if m >= sqrt2
        k = (_from_bits((bits >> MANT) | MAGIC_BITS, u) - MAGIC_PLUS_BIAS) - k_offset
        f = _from_bits((bits & MANT_MASK) + SQRT_HALF_BITS, u) - ONE
        half_f2 = HALF * f * f
        s = f / (TWO + f)
        z = s * s
        tail = z * polynomial(LOG_POLY, z)
        return k * LN2_HI - ((half_f2 - (s * (half_f2 + tail) + (k * LN2_LO + c))) - f)

    @helper
    def log_plus(u, c):
        """log(u) + c for u > 0 finite, subnormals included (garbage elsewhere)."""
        subnormal = u < MIN_NORMAL
        return log_normal_plus(
            u * SUBNORMAL_SCALE if subnormal else u, c, SUBNORMAL_SHIFT if subnormal else ZERO
        )

    @helper
    def log_special(u, value):
        """value where u is positive and finite; -inf, inf or nan per log's special cases."""
        special = -INF if u == ZERO else (u + INF if not (u < ZERO) else NAN)
        return value if (u > ZERO) & (u < INF) else special

    @helper
    def log1p_pair(x, x_lo):
        """log(1 + x + x_lo) for a tiny x_lo."""
        u = ONE + x
        # 1 + x - u exactly (plus x_lo), divided by u: log(1 + x) = log(u) + c to first order
        c = ((ONE - (u - x) if x >= ONE else x - (u - ONE)) + x_lo) / u
        return log_special(u, log_plus(u, c))

    @helper
    def softplus_of(x):
        """log(1 + e**x) = max(x, 0) + log1p(e) with e = e**-|x| in [0, 1]."""
        hi, lo, n = exp_pair(-abs(x))
        e_hi, e_lo = scaled(hi, n), scaled(lo, n)
        e = e_hi + e_lo
        u = ONE + e  # in [1, 2]: no special case of log1p applies
        c = ((e - (u - ONE)) + ((e_hi - e) + e_lo)) / u  # 1 + e_hi + e_lo - u, over u
        value = (x if x > ZERO else ZERO) + log_normal_plus(u, c, ZERO)
        return value if x == x else x

    def exp(x):
        x = EXP_HI if x > EXP_HI else x
        x = EXP_LO if x < EXP_LO else x
        r, _, n = reduce_exp(x)  # without the correction c and the pair: 1.5x faster, < 1 ulp
        return scaled(ONE + (r * r * polynomial(EXP_POLY, r) + r), n)

    def expm1(x):
        clamped = EXPM1_HI if x > EXPM1_HI else x
        clamped = EXPM1_LO if clamped < EXPM1_LO else clamped
        r, c, n = reduce_exp(clamped)
        # 2**n e**r - 1 = 2 (a + b + t) with s = 2**(n-1): a = s - 1/2 (its rounding error
        # a_lo), b = s r exact, t = s (e**r - 1 - r) small; a + b is summed exactly (TwoSum).
        scale = power_of_two(n - 1, x)
        a = scale - HALF
        a_lo = (scale - a) - HALF
        b = scale * r
        head = a + b
        b_part = head - a
        error = (a - (head - b_part)) + (b - b_part)
        value = TWO * (head + ((error + a_lo) + scale * expm1_tail(r, c)))
        return x if abs(x) < EXPM1_TINY else value

    def log(x):
        return log_special(x, log_plus(x, ZERO))

    def log1p(x):
        value = log1p_pair(x, ZERO)
        return x if x == ZERO else value  # keeps -0.0

    def tanh(x):
        a = abs(x)
        a = TANH_HI if a > TANH_HI else a
        z = a * a
        small = _fma(a, z * polynomial(TANH_POLY, z), a)
        # 1 - 2 / (e**2a + 1) with e**2a = (hi + lo) 2**n and the division corrected
        hi, lo, n = exp_pair(a + a)
        scale = power_of_two(n, a)
        e_hi = hi * scale
        d_hi = e_hi + ONE
        d_lo = ((e_hi - d_hi) + ONE) + lo * scale
        q_hi, q_lo = reciprocal_pair(d_hi, d_lo)
        q_hi, q_lo = q_hi + q_hi, q_lo + q_lo
        t = ONE - q_hi
        large = t + (((ONE - t) - q_hi) - q_lo)
        return math.copysign(small if a < TANH_POLY_BELOW else large, x)

    def expit(x):
        # e = e**-|x|; x >= 0: 1 / (1 + e); x < 0: e / (1 + e)
        hi, lo, n = exp_pair(-abs(x))
        e_hi = scaled(hi, n)
        e_lo = scaled(lo, n)
        d_hi = ONE + e_hi
        d_lo = ((ONE - d_hi) + e_hi) + e_lo
        g_hi, g_lo = reciprocal_pair(d_hi, d_lo)
        p = e_hi * g_hi
        p_lo = _fma(e_hi, g_hi, -p) + (e_hi * g_lo + e_lo * g_hi)
        return g_hi + g_lo if x >= ZERO else p + p_lo

    def softplus(x):
        return softplus_of(x)

    def log_expit(x):
        return -softplus_of(-x)  # -0.0 where it underflows, like scipy's

    def logaddexp(x, y):
        larger = x if x > y else y
        value = larger + softplus_of(-abs(x - y))
        return x + LN2_F if x == y else value  # equal infinities: x - y is nan

    return {
        "exp": exp,
        "expm1": expm1,
        "log": log,
        "log1p": log1p,
        "tanh": tanh,
        "expit": expit,
        "softplus": softplus,
        "log_expit": log_expit,
        "logaddexp": logaddexp,
    }


# --- the public generic functions --------------------------------------------------------------
def _from_python(function: Callable, *args: Any) -> Any:
    """Call a fast function from Python on scalars (compiles a small wrapper once per arity)."""
    caller = _PYTHON_CALLERS.get(function)
    if caller is None:
        if len(args) == 1:
            caller = njit(lambda x: function(x))
        else:
            caller = njit(lambda x, y: function(x, y))
        _PYTHON_CALLERS[function] = caller
    return caller(*args)


_PYTHON_CALLERS: dict[Callable, Callable] = {}


def fast_exp(x):
    """e**x."""
    return _from_python(fast_exp, x)


def fast_expm1(x):
    """e**x - 1, accurate for small |x|."""
    return _from_python(fast_expm1, x)


def fast_log(x):
    """Natural logarithm."""
    return _from_python(fast_log, x)


def fast_log1p(x):
    """log(1 + x), accurate for small |x|."""
    return _from_python(fast_log1p, x)


def fast_tanh(x):
    """Hyperbolic tangent."""
    return _from_python(fast_tanh, x)


def fast_expit(x):
    """The logistic sigmoid 1 / (1 + e**-x), without overflow."""
    return _from_python(fast_expit, x)


def fast_softplus(x):
    """log(1 + e**x), without overflow."""
    return _from_python(fast_softplus, x)


def fast_log_expit(x):
    """log(expit(x)) = -softplus(-x), without overflow."""
    return _from_python(fast_log_expit, x)


def fast_logaddexp(x, y):
    """log(e**x + e**y), without overflow."""
    return _from_python(fast_logaddexp, x, y)


#: name -> fast function (tests, benchmarks).
FAST_FUNCTIONS: dict[str, Callable] = {
    "exp": fast_exp,
    "expm1": fast_expm1,
    "log": fast_log,
    "log1p": fast_log1p,
    "tanh": fast_tanh,
    "expit": fast_expit,
    "log_expit": fast_log_expit,
    "softplus": fast_softplus,
    "logaddexp": fast_logaddexp,
}

_KERNELS = {bits: _make_kernels(fmt) for bits, fmt in _FORMATS.items()}
_REAL = (types.Float, types.Integer, types.Boolean)


def _format_of(*args) -> int | None:
    """32 when every argument is float32, 64 for other real numbers, None otherwise."""
    if not all(isinstance(a, _REAL) for a in args):
        return None
    if any(isinstance(a, types.Float) and a.bitwidth not in (32, 64) for a in args):
        return None
    return 32 if all(isinstance(a, types.Float) and a.bitwidth == 32 for a in args) else 64


def _register(name: str, function: Callable) -> None:
    """Numba: calls of `function` compile the kernel of the arguments' format, once per format.

    Arguments already of that format get the kernel; others (integers, booleans, a float32
    next to a float64) get a wrapper converting them, so the kernel is not compiled again.
    """

    def implementation(*args):
        bits = _format_of(*args)
        if bits is None:
            return None
        if all(a == types.float64 if bits == 64 else a == types.float32 for a in args):
            return _KERNELS[bits][name]
        if len(args) == 1:
            return lambda x: function(np.float64(x))
        return lambda x, y: function(np.float64(x), np.float64(y))

    if function.__code__.co_argcount == 2:

        def select(x, y):
            return implementation(x, y)
    else:

        def select(x):
            return implementation(x)

    overload(function, jit_options=KERNEL_OPTIONS)(select)


for _name, _function in FAST_FUNCTIONS.items():
    _register(_name, _function)


def elementwise_loop(function: Callable, fastmath: bool | set[str] = False) -> Callable:
    """An @njit loop `loop(out, *args)` setting out[i] = function(args[0][i], ...) on 1-d arrays.

    For tests and benchmarks: the fused loops of the numba backend are generated elsewhere.
    """
    if function.__code__.co_argcount == 2:

        def loop(out, x, y):
            for i in range(out.size):
                out[i] = function(x[i], y[i])
    else:

        def loop(out, x):
            for i in range(out.size):
                out[i] = function(x[i])

    return njit(fastmath=fastmath)(loop)
