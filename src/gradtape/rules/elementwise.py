"""Elementwise primitives: NumPy and scipy.special ufuncs, one table.

Each entry declares the local derivative of every argument once (`partials`);
the VJP (`g * d`, summed back over broadcasting) and the JVP (`sum t_i * d_i`)
are derived from it. A partial is a function `(ans, *args) -> d`, the number 1 or
-1 for linear arguments, or None where the derivative is not defined (an error
if that argument is differentiated). `safe=True` marks rules whose local
derivative can be infinite (sqrt at 0): their VJP maps a zero cotangent to zero,
so masked branches such as `np.where(x > 0, np.sqrt(x), 0.0)` stay finite.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import SCIPY_UFUNCS, UFUNCS, Primitive
from ._util import batch_shape, lift_tangent, ndim_of, shape_of, unbroadcast

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_SQRT_PI = math.sqrt(math.pi)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _sp():
    import scipy.special

    return scipy.special


def _scale(g, d):
    if d == 1:
        return g
    if d == -1:
        return -g
    return g * d


def _make_vjp(i: int, partial, safe: bool, name: str):
    if partial is None:
        def undefined(g, ans, *args):
            raise GradtapeError(
                f"the derivative of {name} with respect to argument {i} is not implemented; "
                "wrap that argument in gradtape.stop_gradient, or define the function with "
                "gradtape.custom_vjp."
            )
        return undefined
    if isinstance(partial, (int, float)):
        return lambda g, ans, *args: unbroadcast(_scale(g, partial), shape_of(args[i]))
    if safe:
        return lambda g, ans, *args: unbroadcast(_times_safe(g, partial, ans, args),
                                                 shape_of(args[i]))
    return lambda g, ans, *args: unbroadcast(g * partial(ans, *args), shape_of(args[i]))


def _times_safe(g, partial, ans, args):
    """g * partial, but 0 where g is 0 and the partial is infinite or NaN (a masked branch).

    The mask asks only where the partial is not finite: elsewhere g * partial is kept as
    recorded, so derivatives through g (higher order) are not cut where g happens to be 0.
    """
    p = partial(ans, *args)  # the interpreters silence the warnings of masked entries
    d = g * p
    finite = np.isfinite(p)  # the common case: one pass over the partial, no mask
    if isinstance(finite, (np.ndarray, np.bool_)) and finite.all():
        return d
    return np.where((g == 0) & ~finite, 0, d)


def _make_jvp(partials, safe: bool, name: str):
    """`sum_i t_i * partial_i`; the tangents may carry leading batch axes (jvp_batched)."""
    def jvp(tangents, ans, *args):
        out = None
        lead = None
        nd = ndim_of(ans)
        for i, t in enumerate(tangents):
            if t is None:
                continue
            p = partials[i]
            if p is None:
                _make_vjp(i, None, False, name)(None, None)
            if lead is None:
                lead = batch_shape(t, args[i])
            t = lift_tangent(t, args[i], nd)
            if isinstance(p, (int, float)):
                term = _scale(t, p)
            elif safe:
                term = _times_safe(t, p, ans, args)
            else:
                term = t * p(ans, *args)
            out = term if out is None else out + term
        if out is not None and shape_of(out) != lead + shape_of(ans):
            out = np.broadcast_to(out, lead + shape_of(ans))
        return out
    return jvp


def elementwise(name: str, impl, partials, *, safe: bool = False, ufunc=None,
                scipy_name: str | None = None, native=None) -> Primitive:
    """Declare an elementwise primitive from its local derivatives.

    `native`: its scalar expression in the native backend's fused loops (Primitive.native;
    the forms are described in compile/numba/scalar.py); None: it runs through NumPy there.
    """
    prim = Primitive(
        name, impl,
        vjps=tuple(_make_vjp(i, p, safe, name) for i, p in enumerate(partials)),
        jvp=_make_jvp(partials, safe, name), jvp_batched=True,
        partials=partials, safe=safe,
        linear=all(isinstance(p, (int, float)) for p in partials), native=native,
    )
    if ufunc is not None:
        UFUNCS[ufunc] = prim
    if scipy_name is not None:
        SCIPY_UFUNCS[scipy_name] = prim
    return prim


def nondiff(name: str, impl, ufunc=None, native=None) -> Primitive:
    """Declare an elementwise primitive with zero derivative (recorded only when staging);
    `native` as for `elementwise`."""
    prim = Primitive(name, impl, nondiff=True, native=native)
    if ufunc is not None:
        UFUNCS[ufunc] = prim
    return prim


def _np(name: str, partials, safe: bool = False, native=None) -> Primitive:
    uf = getattr(np, name)
    return elementwise(name, uf, partials, safe=safe, ufunc=uf, native=native)


def _spec(name: str, partials, safe: bool = False, native=None) -> Primitive:
    """A scipy.special ufunc: scipy is imported only when the function is first called."""
    return elementwise(name, lambda *a: getattr(_sp(), name)(*a), partials, safe=safe,
                       scipy_name=name, native=native)


def _power_dx(ans, x, y):
    return y * np.power(x, y - 1)


def _power_dy(ans, x, y):
    # x**y * log(x), with 0 where x == 0 (the limit used by JAX and autograd)
    return ans * np.log(np.where(x == 0, 1, x))


def _max_dx(ans, x, y):
    return (x > y) + 0.5 * (x == y)


def _min_dx(ans, x, y):
    return (x < y) + 0.5 * (x == y)


def _fmax_dx(ans, x, y):
    return _max_dx(ans, x, y) + np.isnan(y)  # fmax ignores a NaN: x is the result


def _fmin_dx(ans, x, y):
    return _min_dx(ans, x, y) + np.isnan(y)


# --- arithmetic -------------------------------------------------------------------------
add = _np("add", (1, 1), native=("signed:({0} + {1})", "np.add"))
subtract = _np("subtract", (1, -1), native=("signed:({0} - {1})", "np.subtract"))
multiply = _np("multiply", (lambda ans, x, y: y, lambda ans, x, y: x),
               native=("signed:({0} * {1})", "np.multiply"))
divide = _np("divide", (lambda ans, x, y: 1 / y, lambda ans, x, y: -ans / y), safe=True,
             native=("@invariant_divisor", "float:({0} / {1})", "np.divide"))
UFUNCS[np.true_divide] = divide
negative = _np("negative", (-1,), native=("signed:(-{0})", "np.negative"))
positive = _np("positive", (1,), native=("signed:(+{0})", "np.positive"))
power = _np("power", (_power_dx, _power_dy), safe=True, native=("@small_power", "np.power"))
float_power = _np("float_power", (_power_dx, _power_dy), safe=True, native="({0} ** {1})")
square = _np("square", (lambda ans, x: 2 * x,), native=("signed:({0} * {0})", "np.square"))
reciprocal = _np("reciprocal", (lambda ans, x: -ans * ans,), safe=True,
                 native=("float:({one} / {0})", "np.reciprocal"))
absolute = _np("absolute", (lambda ans, x: np.sign(x),), native=("float:abs({0})", "np.absolute"))
UFUNCS[np.fabs] = absolute
remainder = _np("remainder", (1, lambda ans, x, y: -np.floor_divide(x, y)), native="np.remainder")
fmod = _np("fmod", (1, lambda ans, x, y: -np.trunc(x / y)), native="np.fmod")
maximum = _np("maximum", (_max_dx, lambda ans, x, y: _max_dx(ans, y, x)), native="np.maximum")
minimum = _np("minimum", (_min_dx, lambda ans, x, y: _min_dx(ans, y, x)), native="np.minimum")
fmax = _np("fmax", (_fmax_dx, lambda ans, x, y: _fmax_dx(ans, y, x)), native="np.fmax")
fmin = _np("fmin", (_fmin_dx, lambda ans, x, y: _fmin_dx(ans, y, x)), native="np.fmin")
copysign = _np("copysign", (lambda ans, x, y: np.sign(x) * np.sign(ans), None),
               native="np.copysign")
hypot = _np("hypot", (lambda ans, x, y: x / ans, lambda ans, x, y: y / ans), safe=True,
            native="np.hypot")
arctan2 = _np("arctan2", (lambda ans, y, x: x / (x * x + y * y),
                          lambda ans, y, x: -y / (x * x + y * y)), safe=True, native="np.arctan2")
logaddexp = _np("logaddexp", (lambda ans, x, y: np.exp(x - ans), lambda ans, x, y: np.exp(y - ans)),
                native="float:fast_logaddexp")
logaddexp2 = _np("logaddexp2", (lambda ans, x, y: np.exp2(x - ans),
                                lambda ans, x, y: np.exp2(y - ans)), native="np.logaddexp2")

# --- exponentials and logarithms ----------------------------------------------------------
exp = _np("exp", (lambda ans, x: ans,), native="float:fast_exp")
expm1 = _np("expm1", (lambda ans, x: ans + 1,), native="float:fast_expm1")
exp2 = _np("exp2", (lambda ans, x: ans * _LN2,), native="np.exp2")
log = _np("log", (lambda ans, x: 1 / x,), safe=True, native="float:fast_log")
log1p = _np("log1p", (lambda ans, x: 1 / (1 + x),), safe=True, native="float:fast_log1p")
log2 = _np("log2", (lambda ans, x: 1 / (x * _LN2),), safe=True, native="np.log2")
log10 = _np("log10", (lambda ans, x: 1 / (x * _LN10),), safe=True, native="np.log10")
sqrt = _np("sqrt", (lambda ans, x: 0.5 / ans,), safe=True, native="np.sqrt")
cbrt = _np("cbrt", (lambda ans, x: 1 / (3 * ans * ans),), safe=True, native="np.cbrt")

# --- trigonometric and hyperbolic -------------------------------------------------------------
sin = _np("sin", (lambda ans, x: np.cos(x),), native="np.sin")
cos = _np("cos", (lambda ans, x: -np.sin(x),), native="np.cos")
tan = _np("tan", (lambda ans, x: 1 + ans * ans,), native="np.tan")
arcsin = _np("arcsin", (lambda ans, x: 1 / np.sqrt(1 - x * x),), safe=True, native="np.arcsin")
arccos = _np("arccos", (lambda ans, x: -1 / np.sqrt(1 - x * x),), safe=True, native="np.arccos")
arctan = _np("arctan", (lambda ans, x: 1 / (1 + x * x),), native="np.arctan")
sinh = _np("sinh", (lambda ans, x: np.cosh(x),), native="np.sinh")
cosh = _np("cosh", (lambda ans, x: np.sinh(x),), native="np.cosh")
tanh = _np("tanh", (lambda ans, x: 1 - ans * ans,), native="float:fast_tanh")
arcsinh = _np("arcsinh", (lambda ans, x: 1 / np.sqrt(x * x + 1),), native="np.arcsinh")
arccosh = _np("arccosh", (lambda ans, x: 1 / np.sqrt(x * x - 1),), safe=True, native="np.arccosh")
arctanh = _np("arctanh", (lambda ans, x: 1 / (1 - x * x),), safe=True, native="np.arctanh")
deg2rad = _np("deg2rad", (math.pi / 180,), native="np.deg2rad")
rad2deg = _np("rad2deg", (180 / math.pi,), native="np.rad2deg")
UFUNCS[np.radians] = deg2rad
UFUNCS[np.degrees] = rad2deg

# --- zero derivative: rounding, sign, comparisons, predicates -----------------------------
# (name, native form); NumPy's sign of -0.0 is +0.0 (Numba's keeps the sign)
_SIGN = "float:({one} if {0} > 0 else (-{one} if {0} < 0 else ({0} if {0} != {0} else {zero})))"
for _name, _native in (
        ("floor", "np.floor"), ("ceil", "np.ceil"), ("trunc", "np.trunc"), ("rint", "np.rint"),
        ("sign", (_SIGN, "np.sign")), ("floor_divide", "np.floor_divide"),
        ("signbit", "np.signbit"), ("greater", ("signed:({0} > {1})", "np.greater")),
        ("greater_equal", ("signed:({0} >= {1})", "np.greater_equal")),
        ("less", ("signed:({0} < {1})", "np.less")),
        ("less_equal", ("signed:({0} <= {1})", "np.less_equal")),
        ("equal", ("signed:({0} == {1})", "np.equal")),
        ("not_equal", ("signed:({0} != {1})", "np.not_equal")),
        ("logical_and", "np.logical_and"), ("logical_or", "np.logical_or"),
        ("logical_xor", "np.logical_xor"), ("logical_not", "np.logical_not"),
        ("isnan", "np.isnan"), ("isinf", "np.isinf"), ("isfinite", "np.isfinite"),
        ("heaviside", None), ("bitwise_and", "np.bitwise_and"), ("bitwise_or", "np.bitwise_or"),
        ("bitwise_xor", "np.bitwise_xor"), ("invert", "np.invert"),
        ("left_shift", "np.left_shift"), ("right_shift", "np.right_shift"),
        ("spacing", "np.spacing"), ("nextafter", "np.nextafter"), ("gcd", "np.gcd"),
        ("lcm", "np.lcm")):
    nondiff(_name, getattr(np, _name), getattr(np, _name), native=_native)

# --- scipy.special ------------------------------------------------------------------------------
gammaln = _spec("gammaln", (lambda ans, x: _sp().digamma(x),), native="float64:math.lgamma")
gamma = _spec("gamma", (lambda ans, x: ans * _sp().digamma(x),), native="float64:math.gamma")
digamma = _spec("digamma", (lambda ans, x: _sp().polygamma(1, x),))
SCIPY_UFUNCS["psi"] = digamma
zeta = _spec("zeta", (None, lambda ans, s, q: -s * _sp().zeta(s + 1, q)))
SCIPY_UFUNCS["_zeta"] = zeta  # scipy.special.zeta is a Python function calling this ufunc
erf = _spec("erf", (lambda ans, x: (2 / _SQRT_PI) * np.exp(-x * x),), native="float64:math.erf")
erfc = _spec("erfc", (lambda ans, x: (-2 / _SQRT_PI) * np.exp(-x * x),), native="float64:math.erfc")
erfinv = _spec("erfinv", (lambda ans, x: (_SQRT_PI / 2) * np.exp(ans * ans),))
expit = _spec("expit", (lambda ans, x: ans * (1 - ans),), native="float:fast_expit")
logit = _spec("logit", (lambda ans, x: 1 / (x * (1 - x)),), safe=True)
log_expit = _spec("log_expit", (lambda ans, x: _sp().expit(-x),), native="float:fast_log_expit")
xlogy = _spec("xlogy", (lambda ans, x, y: _sp().xlogy(1, y), lambda ans, x, y: x / y), safe=True,
               native="float64:xlogy")
xlog1py = _spec("xlog1py", (lambda ans, x, y: np.log1p(y), lambda ans, x, y: x / (1 + y)),
                safe=True)
ndtr = _spec("ndtr", (lambda ans, x: np.exp(-0.5 * x * x - _LOG_SQRT_2PI),), native="float64:ndtr")
log_ndtr = _spec("log_ndtr", (lambda ans, x: np.exp(-0.5 * x * x - _LOG_SQRT_2PI - ans),))
ndtri = _spec("ndtri", (lambda ans, x: np.exp(0.5 * ans * ans + _LOG_SQRT_2PI),), safe=True)
entr = _spec("entr", (lambda ans, x: -(np.log(x) + 1),), safe=True)
betaln = _spec("betaln", (lambda ans, a, b: _sp().digamma(a) - _sp().digamma(a + b),
                          lambda ans, a, b: _sp().digamma(b) - _sp().digamma(a + b)))
for _alias in ("expm1", "log1p", "exp2", "cbrt"):
    SCIPY_UFUNCS[_alias] = globals()[_alias]
SCIPY_UFUNCS["exp10"] = _spec("exp10", (lambda ans, x: ans * _LN10,))
