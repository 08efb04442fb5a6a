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
from ..core.primitive import Primitive
from ..core.routes import SCIPY_UFUNCS, UFUNCS
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
                scipy_name: str | None = None) -> Primitive:
    """Declare an elementwise primitive from its local derivatives."""
    prim = Primitive(
        name, impl,
        vjps=tuple(_make_vjp(i, p, safe, name) for i, p in enumerate(partials)),
        jvp=_make_jvp(partials, safe, name), jvp_batched=True,
        partials=partials, safe=safe,
        linear=all(isinstance(p, (int, float)) for p in partials),
    )
    if ufunc is not None:
        UFUNCS[ufunc] = prim
    if scipy_name is not None:
        SCIPY_UFUNCS[scipy_name] = prim
    return prim


def nondiff(name: str, impl, ufunc=None) -> Primitive:
    """Declare an elementwise primitive with zero derivative (recorded only when staging)."""
    prim = Primitive(name, impl, nondiff=True)
    if ufunc is not None:
        UFUNCS[ufunc] = prim
    return prim


def _np(name: str, partials, safe: bool = False) -> Primitive:
    uf = getattr(np, name)
    return elementwise(name, uf, partials, safe=safe, ufunc=uf)


def _spec(name: str, partials, safe: bool = False) -> Primitive:
    """A scipy.special ufunc: scipy is imported only when the function is first called."""
    return elementwise(name, lambda *a: getattr(_sp(), name)(*a), partials, safe=safe,
                       scipy_name=name)


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
add = _np("add", (1, 1))
subtract = _np("subtract", (1, -1))
multiply = _np("multiply", (lambda ans, x, y: y, lambda ans, x, y: x))
divide = _np("divide", (lambda ans, x, y: 1 / y, lambda ans, x, y: -ans / y), safe=True)
UFUNCS[np.true_divide] = divide
negative = _np("negative", (-1,))
positive = _np("positive", (1,))
power = _np("power", (_power_dx, _power_dy), safe=True)
float_power = _np("float_power", (_power_dx, _power_dy), safe=True)
square = _np("square", (lambda ans, x: 2 * x,))
reciprocal = _np("reciprocal", (lambda ans, x: -ans * ans,), safe=True)
absolute = _np("absolute", (lambda ans, x: np.sign(x),))
UFUNCS[np.fabs] = absolute
remainder = _np("remainder", (1, lambda ans, x, y: -np.floor_divide(x, y)))
fmod = _np("fmod", (1, lambda ans, x, y: -np.trunc(x / y)))
maximum = _np("maximum", (_max_dx, lambda ans, x, y: _max_dx(ans, y, x)))
minimum = _np("minimum", (_min_dx, lambda ans, x, y: _min_dx(ans, y, x)))
fmax = _np("fmax", (_fmax_dx, lambda ans, x, y: _fmax_dx(ans, y, x)))
fmin = _np("fmin", (_fmin_dx, lambda ans, x, y: _fmin_dx(ans, y, x)))
copysign = _np("copysign", (lambda ans, x, y: np.sign(x) * np.sign(ans), None))
hypot = _np("hypot", (lambda ans, x, y: x / ans, lambda ans, x, y: y / ans), safe=True)
arctan2 = _np("arctan2", (lambda ans, y, x: x / (x * x + y * y),
                          lambda ans, y, x: -y / (x * x + y * y)), safe=True)
logaddexp = _np("logaddexp", (lambda ans, x, y: np.exp(x - ans), lambda ans, x, y: np.exp(y - ans)))
logaddexp2 = _np("logaddexp2", (lambda ans, x, y: np.exp2(x - ans),
                                lambda ans, x, y: np.exp2(y - ans)))

# --- exponentials and logarithms ----------------------------------------------------------
exp = _np("exp", (lambda ans, x: ans,))
expm1 = _np("expm1", (lambda ans, x: ans + 1,))
exp2 = _np("exp2", (lambda ans, x: ans * _LN2,))
log = _np("log", (lambda ans, x: 1 / x,), safe=True)
log1p = _np("log1p", (lambda ans, x: 1 / (1 + x),), safe=True)
log2 = _np("log2", (lambda ans, x: 1 / (x * _LN2),), safe=True)
log10 = _np("log10", (lambda ans, x: 1 / (x * _LN10),), safe=True)
sqrt = _np("sqrt", (lambda ans, x: 0.5 / ans,), safe=True)
cbrt = _np("cbrt", (lambda ans, x: 1 / (3 * ans * ans),), safe=True)

# --- trigonometric and hyperbolic -------------------------------------------------------------
sin = _np("sin", (lambda ans, x: np.cos(x),))
cos = _np("cos", (lambda ans, x: -np.sin(x),))
tan = _np("tan", (lambda ans, x: 1 + ans * ans,))
arcsin = _np("arcsin", (lambda ans, x: 1 / np.sqrt(1 - x * x),), safe=True)
arccos = _np("arccos", (lambda ans, x: -1 / np.sqrt(1 - x * x),), safe=True)
arctan = _np("arctan", (lambda ans, x: 1 / (1 + x * x),))
sinh = _np("sinh", (lambda ans, x: np.cosh(x),))
cosh = _np("cosh", (lambda ans, x: np.sinh(x),))
tanh = _np("tanh", (lambda ans, x: 1 - ans * ans,))
arcsinh = _np("arcsinh", (lambda ans, x: 1 / np.sqrt(x * x + 1),))
arccosh = _np("arccosh", (lambda ans, x: 1 / np.sqrt(x * x - 1),), safe=True)
arctanh = _np("arctanh", (lambda ans, x: 1 / (1 - x * x),), safe=True)
deg2rad = _np("deg2rad", (math.pi / 180,))
rad2deg = _np("rad2deg", (180 / math.pi,))
UFUNCS[np.radians] = deg2rad
UFUNCS[np.degrees] = rad2deg

# --- zero derivative: rounding, sign, comparisons, predicates -----------------------------
for _name in ("floor", "ceil", "trunc", "rint", "sign", "floor_divide", "signbit", "greater",
              "greater_equal", "less", "less_equal", "equal", "not_equal", "logical_and",
              "logical_or", "logical_xor", "logical_not", "isnan", "isinf", "isfinite",
              "heaviside", "bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift",
              "right_shift", "spacing", "nextafter", "gcd", "lcm"):
    nondiff(_name, getattr(np, _name), getattr(np, _name))

# --- scipy.special ------------------------------------------------------------------------------
gammaln = _spec("gammaln", (lambda ans, x: _sp().digamma(x),))
gamma = _spec("gamma", (lambda ans, x: ans * _sp().digamma(x),))
digamma = _spec("digamma", (lambda ans, x: _sp().polygamma(1, x),))
SCIPY_UFUNCS["psi"] = digamma
zeta = _spec("zeta", (None, lambda ans, s, q: -s * _sp().zeta(s + 1, q)))
SCIPY_UFUNCS["_zeta"] = zeta  # scipy.special.zeta is a Python function calling this ufunc
erf = _spec("erf", (lambda ans, x: (2 / _SQRT_PI) * np.exp(-x * x),))
erfc = _spec("erfc", (lambda ans, x: (-2 / _SQRT_PI) * np.exp(-x * x),))
erfinv = _spec("erfinv", (lambda ans, x: (_SQRT_PI / 2) * np.exp(ans * ans),))
expit = _spec("expit", (lambda ans, x: ans * (1 - ans),))
logit = _spec("logit", (lambda ans, x: 1 / (x * (1 - x)),), safe=True)
log_expit = _spec("log_expit", (lambda ans, x: _sp().expit(-x),))
xlogy = _spec("xlogy", (lambda ans, x, y: _sp().xlogy(1, y), lambda ans, x, y: x / y), safe=True)
xlog1py = _spec("xlog1py", (lambda ans, x, y: np.log1p(y), lambda ans, x, y: x / (1 + y)),
                safe=True)
ndtr = _spec("ndtr", (lambda ans, x: np.exp(-0.5 * x * x - _LOG_SQRT_2PI),))
log_ndtr = _spec("log_ndtr", (lambda ans, x: np.exp(-0.5 * x * x - _LOG_SQRT_2PI - ans),))
ndtri = _spec("ndtri", (lambda ans, x: np.exp(0.5 * ans * ans + _LOG_SQRT_2PI),), safe=True)
entr = _spec("entr", (lambda ans, x: -(np.log(x) + 1),), safe=True)
betaln = _spec("betaln", (lambda ans, a, b: _sp().digamma(a) - _sp().digamma(a + b),
                          lambda ans, a, b: _sp().digamma(b) - _sp().digamma(a + b)))
for _alias in ("expm1", "log1p", "exp2", "cbrt"):
    SCIPY_UFUNCS[_alias] = globals()[_alias]
SCIPY_UFUNCS["exp10"] = _spec("exp10", (lambda ans, x: ans * _LN10,))


# --- ufuncs with two outputs, an integer argument, or complex meaning -----------------------------
def _two_outputs(name: str, ufunc, vjps, jvp, batched: bool = True) -> Primitive:
    prim = Primitive(name, ufunc, vjps=vjps, jvp=jvp, multiple_results=True, jvp_batched=batched)
    UFUNCS[ufunc] = prim
    return prim


# modf(x) = (x - trunc(x), trunc(x)): the fractional part has derivative 1, the integral part 0
modf = _two_outputs("modf", np.modf, vjps=(lambda g, ans, x: g[0],),
                    jvp=lambda ts, ans, x: (ts[0], None))
# frexp(x) = (m, e) with x = m * 2**e: dm/dx = 2**-e (exact: ldexp), the exponent is an integer
frexp = _two_outputs("frexp", np.frexp, vjps=(lambda g, ans, x: np.ldexp(g[0], -ans[1]),),
                     jvp=lambda ts, ans, x: (np.ldexp(ts[0], -ans[1]), None))


def _divmod_jvp(ts, ans, x, y):
    t = None
    if ts[0] is not None:
        t = ts[0]
    if ts[1] is not None:
        t = -ts[1] * ans[0] if t is None else t - ts[1] * ans[0]
    return None, np.broadcast_to(t, shape_of(ans[1]))


# divmod(x, y) = (floor_divide(x, y), remainder(x, y)): the remainder's derivatives (1, -q)
divmod_ = _two_outputs(
    "divmod", np.divmod,
    vjps=(lambda g, ans, x, y: unbroadcast(g[1], shape_of(x)),
          lambda g, ans, x, y: unbroadcast(-g[1] * ans[0], shape_of(y))),
    jvp=_divmod_jvp, batched=False)

# ldexp(x, i) = x * 2**i; i is an integer (no derivative)
ldexp = Primitive(
    "ldexp", np.ldexp,
    vjps=(lambda g, ans, x, i: unbroadcast(np.ldexp(g, i), shape_of(x)), None),
    jvp=lambda ts, ans, x, i: np.broadcast_to(
        np.ldexp(lift_tangent(ts[0], x, ndim_of(ans)), i),
        batch_shape(ts[0], x) + shape_of(ans)),
    jvp_batched=True,
)
UFUNCS[np.ldexp] = ldexp
# conjugate: the identity on real values, conj on complex ones (linear)
conjugate = Primitive("conjugate", np.conjugate, vjps=(lambda g, ans, x: np.conjugate(g),),
                      jvp=lambda ts, ans, x: np.conjugate(ts[0]), linear=True,
                      jvp_batched=True)
UFUNCS[np.conjugate] = conjugate
for _name in ("bitwise_count", "isnat"):  # integer and datetime predicates
    if hasattr(np, _name):
        nondiff(_name, getattr(np, _name), getattr(np, _name))
# nextafter(x, y) moves x by one ulp towards y: d/dx = 1, d/dy = 0 (declared above as having no
# derivative at all, which gave a zero gradient in x)
nextafter = Primitive(
    "nextafter", np.nextafter, vjps=(lambda g, ans, x, y: unbroadcast(g, shape_of(x)), None),
    jvp=lambda ts, ans, x, y: None if ts[0] is None else np.broadcast_to(
        lift_tangent(ts[0], x, ndim_of(ans)), batch_shape(ts[0], x) + shape_of(ans)),
    linear=False, jvp_batched=True,
)
UFUNCS[np.nextafter] = nextafter


# heaviside(x, h0) is h0 where x == 0: d/dh0 = (x == 0), d/dx = 0 (declared above with no
# derivative at all, which gave a zero gradient in h0)
def _heaviside_jvp(ts, ans, x, h0):
    if ts[1] is None:
        return None
    t = np.where(x == 0, lift_tangent(ts[1], h0, ndim_of(ans)), 0)
    return np.broadcast_to(t, batch_shape(ts[1], h0) + shape_of(ans))


heaviside = Primitive(
    "heaviside", np.heaviside,
    vjps=(None, lambda g, ans, x, h0: unbroadcast(np.where(x == 0, g, 0), shape_of(h0))),
    jvp=_heaviside_jvp, jvp_batched=True,
)
UFUNCS[np.heaviside] = heaviside
