"""Elementwise primitives: NumPy and scipy.special ufuncs, one table.

Each entry declares the local derivative of every argument once (`partials`);
the VJP (`g * d`, summed back over broadcasting) and the JVP (`sum t_i * d_i`)
are derived from it. A partial is a function `(ans, *args) -> d`, the number 1 or
-1 for linear arguments, or None where the derivative is not defined (an error
if that argument is differentiated). `safe=True` marks rules whose local
derivative can be infinite (sqrt at 0): their VJP maps a zero cotangent to zero,
so masked branches such as `np.where(x > 0, np.sqrt(x), 0.0)` stay finite.

Complex values (JAX's convention, see rules/_complex.py): for a holomorphic function the
partial is the complex derivative f'(z), and `g * f'(z)`, `t * f'(z)` are its VJP and JVP. For
a real-valued function of a complex argument (absolute) the partial is df/dx - i df/dy: the
VJP is `g * d` and the JVP the real part of `t * d`. The primitives whose partials are right
for complex values are declared at the end of this file; the others refuse complex values.
Conjugation, real and imaginary parts are linear primitives of their own.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import SCIPY_UFUNCS, UFUNCS, implements
from ..core.tracing import Tracer, bind
from ._complex import complex_rules
from ._util import batch_shape, dtype_of, lift_tangent, ndim_of, shape_of, unbroadcast

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
        if out is None:
            return None
        if dtype_of(out).kind == "c" and dtype_of(ans).kind != "c":
            out = np.real(out)  # a real function of complex arguments: Re(t * (df/dx - i df/dy))
        if shape_of(out) != lead + shape_of(ans):
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
    # x**y * log(x), with 0 where x == 0 (the limit used by JAX and autograd); a real x with a
    # complex result (a complex exponent) takes the complex logarithm
    if dtype_of(ans).kind == "c" and dtype_of(x).kind != "c":
        x = x + 0j
    return ans * np.log(np.where(x == 0, 1, x))


def _abs_partial(ans, x):
    """sign(x); for complex x, d|z|/dx - i d|z|/dy = conj(z) / |z| (0 at z = 0, as JAX)."""
    if dtype_of(x).kind == "c":
        return np.conjugate(x) / np.where(ans == 0, 1, ans)
    return np.sign(x)


def _arccosh_partial(ans, x):
    """1 / sqrt(x^2 - 1); for complex x the product of the roots, whose branch cuts are
    arccosh's (sqrt(z^2 - 1) has the wrong sign on half of the plane)."""
    if dtype_of(x).kind == "c":
        return 1 / (np.sqrt(x - 1) * np.sqrt(x + 1))
    return 1 / np.sqrt(x * x - 1)


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
absolute = _np("absolute", (_abs_partial,))
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
arccosh = _np("arccosh", (_arccosh_partial,), safe=True)
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


# --- complex numbers: conjugate, real and imaginary parts ---------------------------------------
def _as_complex(g, dtype):
    """A real cotangent as a complex one of `dtype` (traced: g + 0j, whose transpose is the
    real part; a traced cast would be differentiated through NumPy's discarding cast)."""
    if type(g) is Tracer:
        g = g + 0j
        return g if g.dtype == dtype else g.astype(dtype)
    return np.asarray(g).astype(dtype)


# Each is linear over the reals. Under the pairing Re(u * v) the transpose of conj is conj, that
# of Re is "the real cotangent as a complex number", that of Im is -1j times the cotangent.
conjugate = Primitive(
    "conjugate", np.conjugate,
    vjps=(lambda g, ans, x: np.conjugate(g),),
    jvp=lambda ts, ans, x: np.conjugate(ts[0]),
    linear=True, jvp_batched=True,
)
UFUNCS[np.conjugate] = conjugate  # np.conj is np.conjugate

# np.real(z) and np.imag(z) are views of a complex z: later writes into z are seen through them
real = Primitive(
    "real", np.real,
    vjps=(lambda g, ans, x: _as_complex(g, dtype_of(x)),),
    jvp=lambda ts, ans, x: np.real(ts[0]),
    linear=True, jvp_batched=True, aliases_input=True,
)
imag = Primitive(
    "imag", np.imag,
    vjps=(lambda g, ans, x: _as_complex(g, dtype_of(x)) * -1j,),
    jvp=lambda ts, ans, x: np.imag(ts[0]),
    linear=True, jvp_batched=True, aliases_input=True,
)


@implements(np.real)
def real_of(val):
    """np.real and x.real: the value itself for a real array (as NumPy: a view of it)."""
    if dtype_of(val).kind != "c":
        return val
    return bind(real, (val,), {})


@implements(np.imag)
def imag_of(val):
    """np.imag and x.imag: zeros for a real array."""
    if dtype_of(val).kind != "c":
        return np.zeros_like(val)
    return bind(imag, (val,), {})


@implements(np.angle)
def angle(z, deg=False):
    """np.angle, computed as NumPy does: arctan2 of the imaginary and real parts."""
    if dtype_of(z).kind == "c":
        a = np.arctan2(imag_of(z), real_of(z))
    else:
        a = np.arctan2(0, z)
    return a * (180 / math.pi) if deg else a


# --- what is right for complex values -------------------------------------------------------
# holomorphic: the partials above are the complex derivatives (branch cuts as NumPy's); absolute
# and the parts are real functions of a complex argument (see the module docstring). Everything
# else here refuses complex values: maximum, minimum, fmax and fmin order complex numbers
# lexicographically, digamma's derivative (polygamma) has no complex implementation in SciPy.
complex_rules(
    "add", "subtract", "multiply", "divide", "negative", "positive", "power", "float_power",
    "square", "reciprocal", "exp", "expm1", "exp2", "log", "log1p", "log2", "log10", "sqrt",
    "sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh",
    "arccosh", "arctanh", "gamma", "erf", "erfc", "ndtr", "log_ndtr", "xlogy", "xlog1py",
    "absolute", "conjugate", "real", "imag",
)
