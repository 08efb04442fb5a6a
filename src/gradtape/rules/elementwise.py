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

from .. import config
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
    """The VJP rule of argument i from its partial: `g * partial(ans, *args)` (NaN-safe when
    `safe`), summed back to the argument's shape. The rule carries its partial as
    `elementwise_partial`, from which `Primitive.vjp_reads` tells what it reads."""
    if partial is None:

        def undefined(g, ans, *args):
            raise GradtapeError(
                f"the derivative of {name} with respect to argument {i} is not implemented; "
                "wrap that argument in gradtape.stop_gradient, or define the function with "
                "gradtape.custom_vjp."
            )

        rule = undefined
    elif isinstance(partial, (int, float)):

        def rule(g, ans, *args):
            d = g if partial == 1 else -g if partial == -1 else g * partial
            return _summed_to(d, args[i])

    elif safe:

        def rule(g, ans, *args):
            p = partial(ans, *args)  # (a finite Python number: nothing to mask)
            d = g * p if type(p) is float and p - p == 0 else _safe_product(g, p)
            return _summed_to(d, args[i])

    else:

        def rule(g, ans, *args):
            d = g * partial(ans, *args)
            arg = args[i]
            if type(d) is _ndarray and type(arg) is _ndarray and d.shape == arg.shape:
                return d  # (the common case at once)
            return _summed_to(d, arg)

    rule.elementwise_partial = partial
    return rule


def _summed_to(d, arg):
    """The cotangent `d` of an elementwise result summed back to the shape of argument `arg`
    (unbroadcast; at once when the shapes agree, the common case)."""
    shape = getattr(arg, "shape", None)
    if shape is None:
        shape = np.shape(arg)
    elif getattr(d, "shape", None) == shape:
        return d
    return unbroadcast(d, shape)


_add_reduce = np.add.reduce  # (np.sum's Python wrapper costs more than the sum at small sizes)
_ndarray = np.ndarray


def _times_safe(g, partial, ans, args):
    """g * partial(ans, *args), NaN-safe: see `_safe_product`."""
    return _safe_product(g, partial(ans, *args))


def _safe_product(g, p):
    """g * p, but 0 where g is 0 and the partial p is infinite or NaN (a masked branch).

    The mask asks only where the partial is not finite: elsewhere g * p is kept as
    recorded, so derivatives through g (higher order) are not cut where g happens to be 0.
    Concrete values (eager differentiation) pay one sum over the product: a zero times an
    infinite or NaN partial is NaN, so a product whose sum is not NaN needs no mask. A recorded
    product (compile, higher order) is a plain multiply when the partial is a finite constant or
    the cotangent a constant with no zero (a constant is the same on every replay), and one
    `nan_safe_multiply` instruction otherwise, which makes the same test on every replay.
    (The interpreters silence the warnings of masked entries.)
    """
    if type(p) is float and p - p == 0:  # a finite Python constant (x * 0.5): nothing to mask
        return g * p
    if not config.nan_safe():  # GRADTAPE_NAN_SAFE=0: JAX's and autograd's plain product
        return g * p
    traced_g = type(g) is Tracer
    traced_p = type(p) is Tracer
    if not traced_g and not traced_p:
        d = g * p
        if type(g) is np.ndarray and g.size > 1 and not any(g.strides) and g.item(0) != 0:
            return d  # one nonzero value broadcast (a sum's cotangent): nothing to mask
        total = _add_reduce(d, axis=None) if type(d) is np.ndarray else d
        if total == total:  # not NaN (a NumPy scalar compared: no ufunc call)
            return d
        return np.where((g == 0) & ~np.isfinite(p), 0, d)
    if not traced_p:  # a constant partial (c * x): finite now, finite on replay
        if np.isfinite(p).all():
            return g * p
    elif not traced_g and np.all(g != 0):  # a constant cotangent with no zero
        return g * p
    if dtype_of(g).kind == "c" or dtype_of(p).kind == "c":
        return np.where((g == 0) & ~np.isfinite(p), 0, g * p)
    return nan_safe_multiply(g, p)


def _nan_safe_multiply_impl(g, p):
    """g * p, with 0 where g is 0 and p is infinite or NaN.

    A zero times an infinity or a NaN is NaN, so when the product's sum is not NaN no entry
    needs the mask: one multiplication and one sum (a finite p broadcast against a larger g,
    such as a scalar, is tested instead), and the mask only where it changes something."""
    if type(g) is Tracer or type(p) is Tracer:  # recorded one level down
        return bind(nan_safe_multiply_p, (g, p), {})
    if isinstance(g, float) and isinstance(p, float):  # Python and NumPy float64 scalars
        d = g * p
        if d == d or g != 0:  # not NaN, or not a zero g's NaN
            return d
        return type(d)(0.0)  # g is 0 and p infinite or NaN
    d = np.multiply(g, p)
    if type(d) is not np.ndarray:
        if not np.isnan(d):
            return d
    elif 2 * np.size(p) <= d.size:
        if np.isfinite(p).all():
            return d
    elif not np.isnan(_add_reduce(d, axis=None)):
        return d
    return np.where((g == 0) & ~np.isfinite(p), 0, d)


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


def elementwise(
    name: str,
    impl,
    partials,
    *,
    safe: bool = False,
    ufunc=None,
    scipy_name: str | None = None,
    native=None,
) -> Primitive:
    """Declare an elementwise primitive from its local derivatives.

    `native`: its scalar expression in the native backend's fused loops (Primitive.native;
    the forms are described in compile/numba/scalar.py); None: it runs through NumPy there.
    """
    prim = Primitive(
        name,
        impl,
        vjps=tuple(_make_vjp(i, p, safe, name) for i, p in enumerate(partials)),
        jvp=_make_jvp(partials, safe, name),
        jvp_batched=True,
        partials=partials,
        safe=safe,
        linear=all(isinstance(p, (int, float)) for p in partials),
        native=native,
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
    return elementwise(
        name,
        lambda *a: getattr(_sp(), name)(*a),
        partials,
        safe=safe,
        scipy_name=name,
        native=native,
    )


def _power_dx(ans, x, y):
    d = y * np.power(x, y - 1)
    # d/dx x**0 = 0 everywhere, also at x = 0 where y * x**(y - 1) is 0 * inf (autograd's answer;
    # JAX gives nan there)
    if isinstance(y, Tracer):  # (only where x is 0 too: elsewhere d has its y-derivative)
        return np.where((y == 0) & (x == 0), 0, d)
    if np.any(np.asarray(y) == 0):
        return np.where(np.asarray(y) == 0, 0, d)
    return d


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


def _inverse(y):
    """1 / y, with NumPy's inf or nan (and its warning) for a Python zero: `x / 0.0` is inf in
    NumPy, and its derivative must not raise ZeroDivisionError. A Python number stays one, so
    it keeps NumPy's weak promotion (a float32 cotangent stays float32)."""
    if type(y) in (int, float, bool):
        return float(np.divide(1.0, y))
    if type(y) is complex:
        return complex(np.divide(1.0, y))
    return 1 / y


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
multiply = _np(
    "multiply",
    (lambda ans, x, y: y, lambda ans, x, y: x),
    safe=True,  # p * log(p) masked where p == 0: the zero cotangent meets log(0) = -inf
    native=("signed:({0} * {1})", "np.multiply"),
)


# the product of a cotangent (or tangent) g and a local derivative p in the rules above. Its
# derivatives are those of np.where((g == 0) & ~np.isfinite(p), 0, g * p) written out (the
# masked entries pass no derivative on, to every order)
def _nan_safe_mask(g, p):
    return (g == 0) & ~np.isfinite(p)


def _nan_safe_multiply_vjp(i: int):
    def vjp(ct, ans, g, p):
        masked = np.where(_nan_safe_mask(g, p), 0, ct)
        other = p if i == 0 else g
        return unbroadcast(_times_safe(masked, lambda *_: other, ans, ()), shape_of((g, p)[i]))

    return vjp


def _nan_safe_multiply_jvp(tangents, ans, g, p):
    nd = ndim_of(ans)
    out = None
    lead = None
    for t, arg, other in ((tangents[0], g, p), (tangents[1], p, g)):
        if t is None:
            continue
        if lead is None:
            lead = batch_shape(t, arg)
        term = _times_safe(lift_tangent(t, arg, nd), lambda *_: other, ans, ())
        out = term if out is None else out + term
    if out is None:
        return None
    out = np.where(_nan_safe_mask(g, p), 0, out)
    if shape_of(out) != lead + shape_of(ans):
        out = np.broadcast_to(out, lead + shape_of(ans))
    return out


nan_safe_multiply_p = elementwise(
    "nan_safe_multiply",
    _nan_safe_multiply_impl,
    (lambda ans, g, p: np.where(_nan_safe_mask(g, p), 0, p), lambda ans, g, p: g),
    safe=True,
    native=("@nan_safe_product", "({0} * {1})"),
)
nan_safe_multiply_p.vjps = (_nan_safe_multiply_vjp(0), _nan_safe_multiply_vjp(1))
nan_safe_multiply_p.jvp = _nan_safe_multiply_jvp


def nan_safe_multiply(g, p):
    """g * p with zero where g is zero and p infinite or NaN (one instruction when recorded)."""
    return bind(nan_safe_multiply_p, (g, p), {})


divide = _np(
    "divide",
    (lambda ans, x, y: _inverse(y), lambda ans, x, y: -ans / y),
    safe=True,
    native=("@invariant_divisor", "float:({0} / {1})", "np.divide"),
)
UFUNCS[np.true_divide] = divide
negative = _np("negative", (-1,), native=("signed:(-{0})", "np.negative"))
positive = _np("positive", (1,), native=("signed:(+{0})", "np.positive"))
power = _np("power", (_power_dx, _power_dy), safe=True, native=("@small_power", "np.power"))
float_power = _np("float_power", (_power_dx, _power_dy), safe=True, native="({0} ** {1})")
square = _np("square", (lambda ans, x: 2 * x,), native=("signed:({0} * {0})", "np.square"))
reciprocal = _np(
    "reciprocal",
    (lambda ans, x: -ans * ans,),
    safe=True,
    native=("float:({one} / {0})", "np.reciprocal"),
)
absolute = _np("absolute", (_abs_partial,), native=("float:abs({0})", "np.absolute"))
UFUNCS[np.fabs] = absolute
remainder = _np("remainder", (1, lambda ans, x, y: -np.floor_divide(x, y)), native="np.remainder")
fmod = _np("fmod", (1, lambda ans, x, y: -np.trunc(x / y)), native="np.fmod")
maximum = _np("maximum", (_max_dx, lambda ans, x, y: _max_dx(ans, y, x)), native="np.maximum")
minimum = _np("minimum", (_min_dx, lambda ans, x, y: _min_dx(ans, y, x)), native="np.minimum")
fmax = _np("fmax", (_fmax_dx, lambda ans, x, y: _fmax_dx(ans, y, x)), native="np.fmax")
fmin = _np("fmin", (_fmin_dx, lambda ans, x, y: _fmin_dx(ans, y, x)), native="np.fmin")
# in y a step function (the sign it takes): zero derivative, as np.sign's and JAX's
copysign = _np("copysign", (lambda ans, x, y: np.sign(x) * np.sign(ans), 0), native="np.copysign")
hypot = _np(
    "hypot", (lambda ans, x, y: x / ans, lambda ans, x, y: y / ans), safe=True, native="np.hypot"
)
arctan2 = _np(
    "arctan2",
    (lambda ans, y, x: x / (x * x + y * y), lambda ans, y, x: -y / (x * x + y * y)),
    safe=True,
    native="np.arctan2",
)
logaddexp = _np(
    "logaddexp",
    (lambda ans, x, y: np.exp(x - ans), lambda ans, x, y: np.exp(y - ans)),
    native="float:fast_logaddexp",
)
logaddexp2 = _np(
    "logaddexp2",
    (lambda ans, x, y: np.exp2(x - ans), lambda ans, x, y: np.exp2(y - ans)),
    native="np.logaddexp2",
)

# --- exponentials and logarithms ----------------------------------------------------------
# the exponentials overflow to inf where the function is defined: NaN-safe, so an overflow in
# an unselected branch (np.where(x < 700, np.exp(x), 0) at x = 1000) has a zero derivative
exp = _np("exp", (lambda ans, x: ans,), safe=True, native="float:fast_exp")
expm1 = _np("expm1", (lambda ans, x: ans + 1,), safe=True, native="float:fast_expm1")
exp2 = _np("exp2", (lambda ans, x: ans * _LN2,), safe=True, native="np.exp2")
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
sinh = _np("sinh", (lambda ans, x: np.cosh(x),), safe=True, native="np.sinh")
cosh = _np("cosh", (lambda ans, x: np.sinh(x),), safe=True, native="np.cosh")
tanh = _np("tanh", (lambda ans, x: 1 - ans * ans,), native="float:fast_tanh")
arcsinh = _np("arcsinh", (lambda ans, x: 1 / np.sqrt(x * x + 1),), native="np.arcsinh")
arccosh = _np("arccosh", (_arccosh_partial,), safe=True, native="np.arccosh")
arctanh = _np("arctanh", (lambda ans, x: 1 / (1 - x * x),), safe=True, native="np.arctanh")
deg2rad = _np("deg2rad", (math.pi / 180,), native="np.deg2rad")
rad2deg = _np("rad2deg", (180 / math.pi,), native="np.rad2deg")
UFUNCS[np.radians] = deg2rad
UFUNCS[np.degrees] = rad2deg

# --- zero derivative: rounding, sign, comparisons, predicates -----------------------------
# (name, native form); NumPy's sign of -0.0 is +0.0 (Numba's keeps the sign)
_SIGN = "float:({one} if {0} > 0 else (-{one} if {0} < 0 else ({0} if {0} != {0} else {zero})))"
for _name, _native in (
    ("floor", "np.floor"),
    ("ceil", "np.ceil"),
    ("trunc", "np.trunc"),
    ("rint", "np.rint"),
    ("sign", (_SIGN, "np.sign")),
    ("floor_divide", "np.floor_divide"),
    ("signbit", "np.signbit"),
    ("greater", ("signed:({0} > {1})", "np.greater")),
    ("greater_equal", ("signed:({0} >= {1})", "np.greater_equal")),
    ("less", ("signed:({0} < {1})", "np.less")),
    ("less_equal", ("signed:({0} <= {1})", "np.less_equal")),
    ("equal", ("signed:({0} == {1})", "np.equal")),
    ("not_equal", ("signed:({0} != {1})", "np.not_equal")),
    ("logical_and", "np.logical_and"),
    ("logical_or", "np.logical_or"),
    ("logical_xor", "np.logical_xor"),
    ("logical_not", "np.logical_not"),
    ("isnan", "np.isnan"),
    ("isinf", "np.isinf"),
    ("isfinite", "np.isfinite"),
    ("bitwise_and", "np.bitwise_and"),
    ("bitwise_or", "np.bitwise_or"),
    ("bitwise_xor", "np.bitwise_xor"),
    ("invert", "np.invert"),
    ("left_shift", "np.left_shift"),
    ("right_shift", "np.right_shift"),
    ("spacing", "np.spacing"),
    ("gcd", "np.gcd"),
    ("lcm", "np.lcm"),
):
    nondiff(_name, getattr(np, _name), getattr(np, _name), native=_native)

# --- scipy.special ------------------------------------------------------------------------------
gammaln = _spec("gammaln", (lambda ans, x: _sp().digamma(x),), native="float64:math.lgamma")
gamma = _spec("gamma", (lambda ans, x: ans * _sp().digamma(x),), native="float64:math.gamma")
digamma = _spec("digamma", (lambda ans, x: _sp().polygamma(1, x),), native="float64:digamma")
SCIPY_UFUNCS["psi"] = digamma
zeta = _spec("zeta", (None, lambda ans, s, q: -s * _sp().zeta(s + 1, q)))
SCIPY_UFUNCS["_zeta"] = zeta  # scipy.special.zeta is a Python function calling this ufunc
erf = _spec("erf", (lambda ans, x: (2 / _SQRT_PI) * np.exp(-x * x),), native="float64:math.erf")
erfc = _spec("erfc", (lambda ans, x: (-2 / _SQRT_PI) * np.exp(-x * x),), native="float64:math.erfc")
erfinv = _spec("erfinv", (lambda ans, x: (_SQRT_PI / 2) * np.exp(ans * ans),))
expit = _spec("expit", (lambda ans, x: ans * (1 - ans),), native="float:fast_expit")
logit = _spec("logit", (lambda ans, x: 1 / (x * (1 - x)),), safe=True, native="float64:logit")
log_expit = _spec("log_expit", (lambda ans, x: _sp().expit(-x),), native="float:fast_log_expit")
xlogy = _spec(
    "xlogy",
    (lambda ans, x, y: _sp().xlogy(1, y), lambda ans, x, y: x / y),
    safe=True,
    native="float64:xlogy",
)
xlog1py = _spec(
    "xlog1py",
    (lambda ans, x, y: np.log1p(y), lambda ans, x, y: x / (1 + y)),
    safe=True,
    native="float64:xlog1py",
)
ndtr = _spec("ndtr", (lambda ans, x: np.exp(-0.5 * x * x - _LOG_SQRT_2PI),), native="float64:ndtr")
log_ndtr = _spec(
    "log_ndtr",
    (lambda ans, x: np.exp(-0.5 * x * x - _LOG_SQRT_2PI - ans),),
    native="float64:log_ndtr",
)
ndtri = _spec("ndtri", (lambda ans, x: np.exp(0.5 * ans * ans + _LOG_SQRT_2PI),), safe=True)
entr = _spec("entr", (lambda ans, x: -(np.log(x) + 1),), safe=True, native="float64:entr")
betaln = _spec(
    "betaln",
    (
        lambda ans, a, b: _sp().digamma(a) - _sp().digamma(a + b),
        lambda ans, a, b: _sp().digamma(b) - _sp().digamma(a + b),
    ),
)
for _alias in ("expm1", "log1p", "exp2", "cbrt"):
    SCIPY_UFUNCS[_alias] = globals()[_alias]
SCIPY_UFUNCS["exp10"] = _spec("exp10", (lambda ans, x: ans * _LN10,))


# --- scipy.special, the long tail -----------------------------------------------------------------
# Bessel functions are differentiated in their argument (the recurrences below); their order
# has no closed-form derivative: differentiating it raises an error naming it. The derivatives
# of gammainc and betainc in their shape parameters are computed by their series and continued
# fractions (rules/incomplete_gamma.py, rules/incomplete_beta.py).
def _no_derivative(name: str, argument: str, why: str):
    """A partial that refuses: the derivative in `argument` of scipy.special.`name` is unknown."""

    def partial(ans, *args):
        raise GradtapeError(
            f"scipy.special.{name}: no derivative with respect to {argument} ({why}). If it is "
            "a constant, pass it through gradtape.stop_gradient; otherwise give the function a "
            "rule with gradtape.custom_vjp."
        )

    return partial


_ORDER = "the order of a Bessel function has no closed-form derivative"
_SHAPE = "the derivative in a shape parameter has no closed form"


def _sp_call(name: str):
    return lambda *a: getattr(_sp(), name)(*a)


def _sp_nondiff(name: str) -> Primitive:
    """A scipy.special ufunc with zero derivative (piecewise constant)."""
    prim = Primitive(name, _sp_call(name), nondiff=True)
    SCIPY_UFUNCS[name] = prim
    return prim


def _bessel(name: str, dz, safe: bool = True) -> Primitive:
    return _spec(name, (_no_derivative(name, "the order (argument 0)", _ORDER), dz), safe=safe)


def _iv2(x):
    """iv(2, x), with its leading term x^2 / 8 below 1e-150 (where SciPy's iv gives NaN)."""
    tiny = np.abs(x) < 1e-150
    return np.where(tiny, x * x / 8, _sp().iv(2, np.where(tiny, 1.0, x)))


jv = _bessel("jv", lambda ans, v, z: 0.5 * (_sp().jv(v - 1, z) - _sp().jv(v + 1, z)))
yv = _bessel("yv", lambda ans, v, z: 0.5 * (_sp().yv(v - 1, z) - _sp().yv(v + 1, z)))
iv = _bessel("iv", lambda ans, v, z: 0.5 * (_sp().iv(v - 1, z) + _sp().iv(v + 1, z)))
kv = _bessel("kv", lambda ans, v, z: -0.5 * (_sp().kv(v - 1, z) + _sp().kv(v + 1, z)))
# ive = iv exp(-|z|), kve = kv exp(z) (real z)
ive = _bessel(
    "ive", lambda ans, v, z: 0.5 * (_sp().ive(v - 1, z) + _sp().ive(v + 1, z)) - np.sign(z) * ans
)
kve = _bessel("kve", lambda ans, v, z: ans - 0.5 * (_sp().kve(v - 1, z) + _sp().kve(v + 1, z)))
yn = _bessel("yn", lambda ans, n, x: 0.5 * (_sp().yn(n - 1, x) - _sp().yn(n + 1, x)))
kn = _bessel("kn", lambda ans, n, x: -0.5 * (_sp().kn(n - 1, x) + _sp().kn(n + 1, x)))
j0 = _spec("j0", (lambda ans, x: -_sp().j1(x),))
j1 = _spec("j1", (lambda ans, x: 0.5 * (_sp().j0(x) - _sp().jv(2, x)),))
y0 = _spec("y0", (lambda ans, x: -_sp().y1(x),), safe=True)
y1 = _spec("y1", (lambda ans, x: 0.5 * (_sp().y0(x) - _sp().yn(2, x)),), safe=True)
i0 = _spec("i0", (lambda ans, x: _sp().i1(x),))
i1 = _spec("i1", (lambda ans, x: 0.5 * (_sp().i0(x) + _iv2(x)),))
i0e = _spec("i0e", (lambda ans, x: _sp().i1e(x) - np.sign(x) * ans,))
i1e = _spec("i1e", (lambda ans, x: 0.5 * (_sp().i0e(x) + _sp().ive(2, x)) - np.sign(x) * ans,))
k0 = _spec("k0", (lambda ans, x: -_sp().k1(x),), safe=True)
k1 = _spec("k1", (lambda ans, x: -0.5 * (_sp().k0(x) + _sp().kv(2, x)),), safe=True)
k0e = _spec("k0e", (lambda ans, x: ans - _sp().k1e(x),), safe=True)
k1e = _spec("k1e", (lambda ans, x: ans - 0.5 * (_sp().k0e(x) + _sp().kve(2, x)),), safe=True)


# incomplete gamma and beta functions: in x, exp(log of the integrand)
def _gammainc_dx(ans, a, x):
    return np.exp(_sp().xlogy(a - 1, x) - x - _sp().gammaln(a))


def _betainc_dx(ans, a, b, x):
    return np.exp(_sp().xlogy(a - 1, x) + _sp().xlog1py(b - 1, -x) - _sp().betaln(a, b))


def _no_second_derivative(functions: str, parameters: str):
    """A partial of a shape-parameter derivative, which is itself computed by a series."""

    def partial(ans, *args):
        raise GradtapeError(
            f"scipy.special.{functions}: a second derivative involving the shape parameter "
            f"{parameters} is not available (the first derivative in it is computed by a series "
            "that has no rule of its own). If it is a constant, pass it through "
            "gradtape.stop_gradient; otherwise give the function a rule with "
            "gradtape.custom_vjp."
        )

    return partial


def _incomplete_gamma_da(a, x):
    from . import incomplete_gamma

    return incomplete_gamma.gammainc_da(a, x)


# d/da gammainc(a, x): the series or continued fraction of gammainc differentiated term by term
# (rules/incomplete_gamma.py); its own derivatives are not known
_GAMMA_SECOND = _no_second_derivative("gammainc/gammaincc", "a")
gammainc_da = elementwise(
    "gammainc_da", _incomplete_gamma_da, (_GAMMA_SECOND, _GAMMA_SECOND), safe=True
)


def _gammainc_da(ans, a, x):
    return bind(gammainc_da, (a, x), {})


gammainc = _spec("gammainc", (_gammainc_da, _gammainc_dx), safe=True)
gammaincc = _spec(
    "gammaincc",
    (lambda ans, a, x: -_gammainc_da(ans, a, x), lambda ans, a, x: -_gammainc_dx(ans, a, x)),
    safe=True,
)


def _incomplete_beta_da(a, b, x):
    from . import incomplete_beta

    return incomplete_beta.betainc_da(a, b, x)


def _incomplete_beta_db(a, b, x):
    from . import incomplete_beta

    return incomplete_beta.betainc_db(a, b, x)


# d/da and d/db betainc(a, b, x): its continued fraction differentiated term by term
# (rules/incomplete_beta.py); their own derivatives are not known
_BETA_SECOND = _no_second_derivative("betainc/betaincc and the t distribution", "a or b")
betainc_da = elementwise("betainc_da", _incomplete_beta_da, (_BETA_SECOND,) * 3, safe=True)
betainc_db = elementwise("betainc_db", _incomplete_beta_db, (_BETA_SECOND,) * 3, safe=True)


def _betainc_da(ans, a, b, x):
    return bind(betainc_da, (a, b, x), {})


def _betainc_db(ans, a, b, x):
    return bind(betainc_db, (a, b, x), {})


betainc = _spec("betainc", (_betainc_da, _betainc_db, _betainc_dx), safe=True)
betaincc = _spec(
    "betaincc",
    (
        lambda ans, a, b, x: -_betainc_da(ans, a, b, x),
        lambda ans, a, b, x: -_betainc_db(ans, a, b, x),
        lambda ans, a, b, x: -_betainc_dx(ans, a, b, x),
    ),
    safe=True,
)
beta = _spec(
    "beta",
    (
        lambda ans, a, b: ans * (_sp().digamma(a) - _sp().digamma(a + b)),
        lambda ans, a, b: ans * (_sp().digamma(b) - _sp().digamma(a + b)),
    ),
)


def _rgamma_dx(ans, x):
    """-rgamma(x) digamma(x) for x >= 1/2; below, the derivative of the reflection formula
    rgamma(x) = sin(pi x) gamma(1 - x) / pi, smooth through the poles of gamma (to every order).
    """
    left = x < 0.5
    xl = np.where(left, x, 0.0)
    xr = np.where(left, 1.0, x)
    g = _sp().gamma(1 - xl)
    reflected = (np.cos(math.pi * xl) - np.sin(math.pi * xl) * _sp().digamma(1 - xl) / math.pi) * g
    return np.where(left, reflected, -_sp().rgamma(xr) * _sp().digamma(xr))


rgamma = _spec("rgamma", (_rgamma_dx,))
gammasgn = _sp_nondiff("gammasgn")
erfcinv = _spec("erfcinv", (lambda ans, y: (-_SQRT_PI / 2) * np.exp(ans * ans),), safe=True)
_zeta_in_x = _no_derivative(
    "zeta", "x (argument 0)", "the derivative of zeta in its argument has no closed form"
)
SCIPY_UFUNCS["_riemann_zeta"] = Primitive(  # zeta(x) without q: no differentiable argument
    "_riemann_zeta",
    lambda x: _sp()._ufuncs._riemann_zeta(x),
    vjps=(lambda g, ans, x: _zeta_in_x(ans, x),),
    jvp=lambda ts, ans, x: _zeta_in_x(ans, x),
)
rel_entr = _spec(
    "rel_entr",
    (lambda ans, x, y: np.log(x / y) + 1, lambda ans, x, y: -x / y),
    safe=True,
    native="float64:rel_entr",
)
kl_div = _spec(
    "kl_div",
    (lambda ans, x, y: np.log(x / y), lambda ans, x, y: 1 - x / y),
    safe=True,
    native="float64:kl_div",
)
huber = _spec(
    "huber",
    (
        lambda ans, d, r: np.where(np.abs(r) <= d, 0, np.abs(r) - d),
        lambda ans, d, r: np.where(np.abs(r) <= d, r, d * np.sign(r)),
    ),
    native="float64:huber",
)


# pseudo_huber = d sqrt(d^2 + r^2) - d^2 (d >= 0): with R = hypot(d, r), the partials are
# r^4 / ((R + d)^2 R) (no cancellation, |r| at d = 0) and d r / R, smooth wherever R > 0
def _pseudo_huber_parts(d, r):
    big = np.hypot(d, r)
    zero = big == 0
    return zero, np.where(zero, 1.0, big)


def _pseudo_huber_dd(ans, d, r):
    zero, big = _pseudo_huber_parts(d, r)
    r2 = r * r
    return np.where(zero, 0.0, r2 * r2 / ((big + d) ** 2 * big))


def _pseudo_huber_dr(ans, d, r):
    zero, big = _pseudo_huber_parts(d, r)
    return np.where(zero, 0.0, d * r / big)


pseudo_huber = _spec(
    "pseudo_huber", (_pseudo_huber_dd, _pseudo_huber_dr), native="float64:pseudo_huber"
)


# Removable singularities (sinc at 0, spence's derivative at 1): at the point itself the value
# and every derivative come from the Maclaurin series, so that derivatives of any order are
# exact there too (a constant branch of np.where would give 0 from the second order on).
def _maclaurin_coefficient(series: str, k: int) -> float:
    """The k-th derivative at 0 of sin(t)/t ("sinc") or log1p(u)/u ("log1p_over")."""
    if series == "sinc":
        return 0.0 if k % 2 else (-1.0) ** (k // 2) / (k + 1)
    return (-1.0) ** k * math.factorial(k) / (k + 1)  # sum_n (-u)^n / (n + 1)


def _maclaurin_impl(u, series, k):
    dtype = np.result_type(getattr(u, "dtype", None) or np.result_type(u), np.float16)
    return np.full(shape_of(u), _maclaurin_coefficient(series, k), dtype=dtype)


maclaurin = Primitive(
    "maclaurin",
    _maclaurin_impl,
    vjps=(lambda g, ans, u, series, k: g * maclaurin(u, series=series, k=k + 1),),
    jvp=lambda ts, ans, u, series, k: ts[0] * maclaurin(u, series=series, k=k + 1),
    jvp_batched=True,
    constant_valued=True,
)


def _spence_dz(ans, z):
    """log(z) / (1 - z), which is -log1p(u)/u with u = z - 1: -1 at z = 1, exactly."""
    u = z - 1
    at_one = u == 0
    safe_u = np.where(at_one, 1, u)
    return np.where(at_one, -maclaurin(u, series="log1p_over", k=0), -np.log1p(safe_u) / safe_u)


spence = _spec("spence", (_spence_dz,), safe=True)


def _lambertw_impl(z, k):
    return _sp().lambertw(z, k).real


# the real branches only (rules/scipy_special.py checks the input): W' = exp(-W) / (1 + W)
lambertw_real = elementwise(
    "lambertw", _lambertw_impl, (lambda ans, z, k: np.exp(-ans) / (1 + ans), None), safe=True
)


# --- the scipy.special functions behind scipy.stats' cdfs and ppfs ------------------------------
# An inverse's derivative in its probability is 1 / (the forward function's derivative at the
# answer), and in a shape parameter -(the forward function's derivative in it) / (its derivative
# in x), both at the answer.
def _gammainc_inv_dq(ans, a, q):
    return np.exp(_sp().gammaln(a) + ans - _sp().xlogy(a - 1, ans))


def _gammainc_inv_da(ans, a, q):
    # gammainc(a, ans) = q: d ans/da = -(dP/da) / (dP/dx) at x = ans
    return -_gammainc_da(None, a, ans) * _gammainc_inv_dq(ans, a, q)


gammaincinv = _spec("gammaincinv", (_gammainc_inv_da, _gammainc_inv_dq), safe=True)
gammainccinv = _spec(
    "gammainccinv",
    (_gammainc_inv_da, lambda ans, a, q: -_gammainc_inv_dq(ans, a, q)),
    safe=True,
)


def _betainc_inv(shape_partial):
    # betainc(a, b, ans) = q: d ans/d(a or b) = -(dI/d(a or b)) / (dI/dx) at x = ans
    return lambda ans, a, b, q: -shape_partial(None, a, b, ans) / _betainc_dx(None, a, b, ans)


betaincinv = _spec(
    "betaincinv",
    (
        _betainc_inv(_betainc_da),
        _betainc_inv(_betainc_db),
        lambda ans, a, b, q: 1 / _betainc_dx(None, a, b, ans),
    ),
    safe=True,
)
betainccinv = _spec(  # betaincc(a, b, ans) = q: the same shape derivatives as betaincinv's
    "betainccinv",
    (
        _betainc_inv(_betainc_da),
        _betainc_inv(_betainc_db),
        lambda ans, a, b, q: -1 / _betainc_dx(None, a, b, ans),
    ),
    safe=True,
)


def t_logpdf(t, df):
    """The log-density of Student's t (the normal's for df = inf), written with primitives."""
    finite = np.isfinite(df)
    d = np.where(finite, df, 1.0)
    log_t = (
        _sp().gammaln((d + 1) / 2)
        - _sp().gammaln(d / 2)
        - 0.5 * np.log(d * math.pi)
        - (d + 1) / 2 * np.log1p(t * t / d)
    )
    return np.where(finite, log_t, -0.5 * t * t - _LOG_SQRT_2PI)


def _stdtr_ddf(ans, df, t):
    """d/d(df) of Student's t cdf: stdtr(df, t) = 1 - tail for t >= 0 (its mirror image below),
    tail = I_x(df/2, 1/2) / 2 = (1 - I_y(1/2, df/2)) / 2 with x = df / (df + t^2) and
    y = t^2 / (df + t^2) = 1 - x, written in whichever of x and y is the smaller (the other
    rounds to 1 near the ends); 0 where the cdf does not depend on df (t = 0, an infinite df
    or t; also where t^2 underflows: the derivative is of the order of |t| there)."""
    square = t * t
    inside = np.isfinite(df) & np.isfinite(square) & (square != 0)  # (t^2 may underflow)
    d = np.where(inside, df, 1.0)
    t2 = np.where(inside, square, 1.0)
    x, y = d / (d + t2), t2 / (d + t2)
    dx = t2 / ((d + t2) * (d + t2))  # = -dy
    half = 0.5 * np.ones_like(x)
    in_x = 0.5 * (0.5 * _betainc_da(None, d / 2, half, x) + _betainc_dx(None, d / 2, half, x) * dx)
    in_y = -0.5 * (0.5 * _betainc_db(None, half, d / 2, y) - _betainc_dx(None, half, d / 2, y) * dx)
    d_tail = np.where(x < y, in_x, in_y)
    return np.where(inside, np.where(t >= 0, -d_tail, d_tail), 0.0)


def _stdtrit_ddf(ans, df, p):
    # stdtr(df, ans) = p: d ans/d(df) = -(d stdtr/d(df)) / (its density at ans)
    return -_stdtr_ddf(None, df, ans) * np.exp(-t_logpdf(ans, df))


stdtr = _spec("stdtr", (_stdtr_ddf, lambda ans, df, t: np.exp(t_logpdf(t, df))))
stdtrit = _spec("stdtrit", (_stdtrit_ddf, lambda ans, df, p: np.exp(-t_logpdf(ans, df))), safe=True)

_COUNT = "a count is an integer: the function is a step function of it"


def _poisson_pmf(k, m):
    """The Poisson pmf at floor(k) (0 below 0)."""
    k = np.floor(k)
    inside = k >= 0
    k = np.where(inside, k, 0)
    return np.where(inside, np.exp(_sp().xlogy(k, m) - m - _sp().gammaln(k + 1)), 0.0)


pdtr = _spec(
    "pdtr",
    (_no_derivative("pdtr", "k (argument 0)", _COUNT), lambda ans, k, m: -_poisson_pmf(k, m)),
)
pdtrc = _spec(
    "pdtrc",
    (_no_derivative("pdtrc", "k (argument 0)", _COUNT), lambda ans, k, m: _poisson_pmf(k, m)),
)


def _bdtr_dp(ans, k, n, p):
    """d/dp P(X <= k), X ~ binom(n, p): -n binom(n-1, p).pmf(floor k) (0 outside 0 <= k < n)."""
    k = np.floor(k)
    inside = (k >= 0) & (k < n)
    k = np.where(inside, k, 0)
    m = np.where(inside, n, 1)
    log_pmf = (
        _sp().gammaln(m)
        - _sp().gammaln(k + 1)
        - _sp().gammaln(m - k)
        + _sp().xlogy(k, p)
        + _sp().xlog1py(m - k - 1, -p)
    )
    return np.where(inside, -m * np.exp(log_pmf), 0.0)


bdtr = _spec(
    "bdtr",
    (
        _no_derivative("bdtr", "k (argument 0)", _COUNT),
        _no_derivative("bdtr", "n (argument 1)", _COUNT),
        _bdtr_dp,
    ),
)
bdtrc = _spec(
    "bdtrc",
    (
        _no_derivative("bdtrc", "k (argument 0)", _COUNT),
        _no_derivative("bdtrc", "n (argument 1)", _COUNT),
        lambda ans, k, n, p: -_bdtr_dp(ans, k, n, p),
    ),
)


# --- more of scipy.special: error-function relatives, exponential integrals, orthogonal
# polynomials (in x; their degree is a count), hypergeometric functions (in their argument),
# elliptic integrals, Box-Cox transforms, distribution functions in their continuous argument
_DEGREE = "the degree of a polynomial is a count"
_PARAMETER = "the derivative in a parameter of a hypergeometric function has no closed form"
_DEG = math.pi / 180.0

erfcx = _spec("erfcx", (lambda ans, x: 2.0 * x * ans - 2.0 / _SQRT_PI,))
erfi = _spec("erfi", (lambda ans, x: (2.0 / _SQRT_PI) * np.exp(x * x),))
dawsn = _spec("dawsn", (lambda ans, x: 1.0 - 2.0 * x * ans,))


def _exprel_dx(ans, x):
    """(e^x - exprel(x)) / x, by its series near 0 (1/2 + x/3 + x^2/8 + x^3/30 + x^4/144)."""
    small = np.abs(x) < 1e-3
    xs = np.where(small, x, 0.0)
    xl = np.where(small, 1.0, x)
    series = 0.5 + xs * (1.0 / 3.0 + xs * (1.0 / 8.0 + xs * (1.0 / 30.0 + xs / 144.0)))
    return np.where(small, series, (np.exp(xl) - _sp().exprel(xl)) / xl)


exprel = _spec("exprel", (_exprel_dx,))
cosm1 = _spec("cosm1", (lambda ans, x: -np.sin(x),))
powm1 = _spec(
    "powm1",
    (lambda ans, x, y: y * np.power(x, y - 1.0), lambda ans, x, y: (ans + 1.0) * np.log(x)),
    safe=True,
)
expi = _spec("expi", (lambda ans, x: np.exp(x) / x,), safe=True)
exp1 = _spec("exp1", (lambda ans, x: -np.exp(-x) / x,), safe=True)
expn = _spec(
    "expn",
    (
        _no_derivative("expn", "n (argument 0)", _DEGREE),
        lambda ans, n, x: np.where(
            n >= 1, -_sp().expn(np.maximum(n - 1, 0), x), -ans * (1.0 + 1.0 / x)
        ),
    ),
    safe=True,
)
sindg = _spec("sindg", (lambda ans, x: _DEG * _sp().cosdg(x),))
cosdg = _spec("cosdg", (lambda ans, x: -_DEG * _sp().sindg(x),))
tandg = _spec("tandg", (lambda ans, x: _DEG * (1.0 + ans * ans),), safe=True)
cotdg = _spec("cotdg", (lambda ans, x: -_DEG * (1.0 + ans * ans),), safe=True)
radian = _spec(
    "radian",
    (lambda ans, d, m, s: _DEG, lambda ans, d, m, s: _DEG / 60.0, lambda ans, d, m, s: _DEG / 3600),
)
owens_t = _spec(
    "owens_t",
    (
        lambda ans, h, a: (
            -0.5 * np.exp(-0.5 * h * h - _LOG_SQRT_2PI) * _sp().erf(a * h / math.sqrt(2.0))
        ),
        lambda ans, h, a: np.exp(-0.5 * h * h * (1.0 + a * a)) / (2.0 * math.pi * (1.0 + a * a)),
    ),
)
hyp0f1 = _spec(
    "hyp0f1",
    (
        _no_derivative("hyp0f1", "v (argument 0)", _PARAMETER),
        lambda ans, v, z: _sp().hyp0f1(v + 1.0, z) / v,
    ),
    safe=True,
)
hyp1f1 = _spec(
    "hyp1f1",
    (
        _no_derivative("hyp1f1", "a (argument 0)", _PARAMETER),
        _no_derivative("hyp1f1", "b (argument 1)", _PARAMETER),
        lambda ans, a, b, x: (a / b) * _sp().hyp1f1(a + 1.0, b + 1.0, x),
    ),
    safe=True,
)


def _polynomial(name: str, dx, parameters: int = 0) -> Primitive:
    """An orthogonal polynomial eval_<name>(n, [parameters,] x): no derivative in the degree
    or the parameters; dx(n, *parameters, x) in x (0 for the degree-0 polynomial)."""
    refusals = tuple(
        _no_derivative(name, f"argument {i}", _DEGREE if i == 0 else _PARAMETER)
        for i in range(parameters + 1)
    )
    return _spec(
        name, (*refusals, lambda ans, n, *rest: np.where(n == 0, 0.0, dx(n, *rest))), safe=True
    )


def _lower(n):
    """n - 1, and 0 for the degree-0 polynomial (whose derivative `_polynomial` makes 0)."""
    return np.where(n == 0, 0, n - 1)


eval_legendre = _polynomial("eval_legendre", lambda n, x: _sp().eval_gegenbauer(_lower(n), 1.5, x))
eval_chebyt = _polynomial("eval_chebyt", lambda n, x: n * _sp().eval_chebyu(_lower(n), x))
eval_chebyu = _polynomial(
    "eval_chebyu", lambda n, x: 2.0 * _sp().eval_gegenbauer(_lower(n), 2.0, x)
)
eval_gegenbauer = _polynomial(
    "eval_gegenbauer",
    lambda n, alpha, x: 2.0 * alpha * _sp().eval_gegenbauer(_lower(n), alpha + 1.0, x),
    parameters=1,
)
eval_laguerre = _polynomial(
    "eval_laguerre", lambda n, x: -_sp().eval_genlaguerre(_lower(n), 1.0, x)
)
eval_genlaguerre = _polynomial(
    "eval_genlaguerre",
    lambda n, alpha, x: -_sp().eval_genlaguerre(_lower(n), alpha + 1.0, x),
    parameters=1,
)
binom = _spec(
    "binom",
    (
        lambda ans, n, k: ans * (_sp().digamma(n + 1.0) - _sp().digamma(n - k + 1.0)),
        lambda ans, n, k: ans * (_sp().digamma(n - k + 1.0) - _sp().digamma(k + 1.0)),
    ),
    safe=True,
)
poch = _spec(
    "poch",
    (
        lambda ans, z, m: ans * (_sp().digamma(z + m) - _sp().digamma(z)),
        lambda ans, z, m: ans * _sp().digamma(z + m),
    ),
    safe=True,
)
loggamma = _spec("loggamma", (lambda ans, x: _sp().digamma(x),), safe=True)


def _ellipk_dm(ans, m):
    """(E(m) - (1 - m) K(m)) / (2 m (1 - m)), by its series near m = 0."""
    small = np.abs(m) < 1e-4
    ms = np.where(small, m, 0.0)
    ml = np.where(small, 0.5, m)
    series = (math.pi / 2) * (0.25 + ms * (9 / 32 + ms * (75 / 256 + ms * 1225 / 4096)))
    exact = (_sp().ellipe(ml) - (1.0 - ml) * _sp().ellipk(ml)) / (2.0 * ml * (1.0 - ml))
    return np.where(small, series, exact)


def _ellipe_dm(ans, m):
    """(E(m) - K(m)) / (2 m), by its series near m = 0."""
    small = np.abs(m) < 1e-4
    ms = np.where(small, m, 0.0)
    ml = np.where(small, 0.5, m)
    series = (math.pi / 2) * (-0.25 - ms * (3 / 32 + ms * (15 / 256 + ms * 175 / 4096)))
    return np.where(small, series, (_sp().ellipe(ml) - _sp().ellipk(ml)) / (2.0 * ml))


ellipk = _spec("ellipk", (_ellipk_dm,), safe=True)
ellipe = _spec("ellipe", (_ellipe_dm,), safe=True)
ellipkm1 = _spec(
    "ellipkm1",  # K(1 - p), with E(1 - p) - p K(1 - p) over 2 (1 - p) p
    (lambda ans, p: -(_sp().ellipe(1.0 - p) - p * ans) / (2.0 * (1.0 - p) * p),),
    safe=True,
)


def _boxcox_dlmbda(log_x, lmbda, ans):
    """d/dlmbda of (x^lmbda - 1) / lmbda: (x^lmbda log x - ans) / lmbda, by its series
    L^2/2 + lmbda L^3/3 + lmbda^2 L^4/8 + lmbda^3 L^5/30 where |lmbda L| is small (L = log x)."""
    t = lmbda * log_x
    small = np.abs(t) < 1e-3
    ls = np.where(small, lmbda, 0.0)
    safe_l = np.where(small, 1.0, lmbda)
    series = log_x * log_x * (0.5 + ls * log_x * (1 / 3 + ls * log_x * (1 / 8 + ls * log_x / 30)))
    return np.where(small, series, (np.exp(t) * log_x - ans) / safe_l)


boxcox = _spec(
    "boxcox",
    (
        lambda ans, x, lmbda: np.power(x, lmbda - 1.0),
        lambda ans, x, lmbda: _boxcox_dlmbda(np.log(x), lmbda, ans),
    ),
    safe=True,
)
boxcox1p = _spec(
    "boxcox1p",
    (
        lambda ans, x, lmbda: np.power(1.0 + x, lmbda - 1.0),
        lambda ans, x, lmbda: _boxcox_dlmbda(np.log1p(x), lmbda, ans),
    ),
    safe=True,
)
_INVERSE_LMBDA = "the inverse transform is differentiated in y only"
inv_boxcox = _spec(
    "inv_boxcox",
    (
        lambda ans, y, lmbda: ans / (1.0 + lmbda * y),
        _no_derivative("inv_boxcox", "lmbda (argument 1)", _INVERSE_LMBDA),
    ),
    safe=True,
)
inv_boxcox1p = _spec(
    "inv_boxcox1p",
    (
        lambda ans, y, lmbda: (1.0 + ans) / (1.0 + lmbda * y),
        _no_derivative("inv_boxcox1p", "lmbda (argument 1)", _INVERSE_LMBDA),
    ),
    safe=True,
)
ndtri_exp = _spec(
    "ndtri_exp", (lambda ans, y: np.exp(y + 0.5 * ans * ans + _LOG_SQRT_2PI),), safe=True
)


def _chdtr_dx(ans, v, x):
    return 0.5 * np.exp(_sp().xlogy(0.5 * v - 1.0, 0.5 * x) - 0.5 * x - _sp().gammaln(0.5 * v))


def _gdtr_density(a, b, x):
    """The gamma density of rate a and shape b at x, over a: d/dx gdtr is a times this."""
    return np.exp(_sp().xlogy(b - 1.0, a * x) - a * x - _sp().gammaln(b))


chdtr = _spec("chdtr", (_no_derivative("chdtr", "v (argument 0)", _SHAPE), _chdtr_dx), safe=True)
chdtrc = _spec(
    "chdtrc",
    (
        _no_derivative("chdtrc", "v (argument 0)", _SHAPE),
        lambda ans, v, x: -_chdtr_dx(ans, v, x),
    ),
    safe=True,
)
gdtr = _spec(
    "gdtr",
    (
        lambda ans, a, b, x: x * _gdtr_density(a, b, x),
        _no_derivative("gdtr", "b (argument 1)", _SHAPE),
        lambda ans, a, b, x: a * _gdtr_density(a, b, x),
    ),
    safe=True,
)
gdtrc = _spec(
    "gdtrc",
    (
        lambda ans, a, b, x: -x * _gdtr_density(a, b, x),
        _no_derivative("gdtrc", "b (argument 1)", _SHAPE),
        lambda ans, a, b, x: -a * _gdtr_density(a, b, x),
    ),
    safe=True,
)
round_ = _sp_nondiff("round")


# --- ufuncs with two outputs, an integer argument, or complex meaning -----------------------------
def _two_outputs(name: str, ufunc, vjps, jvp, batched: bool = True) -> Primitive:
    prim = Primitive(name, ufunc, vjps=vjps, jvp=jvp, multiple_results=True, jvp_batched=batched)
    UFUNCS[ufunc] = prim
    return prim


# modf(x) = (x - trunc(x), trunc(x)): the fractional part has derivative 1, the integral part 0
modf = _two_outputs(
    "modf", np.modf, vjps=(lambda g, ans, x: g[0],), jvp=lambda ts, ans, x: (ts[0], None)
)
# frexp(x) = (m, e) with x = m * 2**e: dm/dx = 2**-e (exact: ldexp), the exponent is an integer
frexp = _two_outputs(
    "frexp",
    np.frexp,
    vjps=(lambda g, ans, x: np.ldexp(g[0], -ans[1]),),
    jvp=lambda ts, ans, x: (np.ldexp(ts[0], -ans[1]), None),
)


def _divmod_jvp(ts, ans, x, y):
    t = None
    if ts[0] is not None:
        t = ts[0]
    if ts[1] is not None:
        t = -ts[1] * ans[0] if t is None else t - ts[1] * ans[0]
    return None, np.broadcast_to(t, shape_of(ans[1]))


# divmod(x, y) = (floor_divide(x, y), remainder(x, y)): the remainder's derivatives (1, -q)
divmod_ = _two_outputs(
    "divmod",
    np.divmod,
    vjps=(
        lambda g, ans, x, y: unbroadcast(g[1], shape_of(x)),
        lambda g, ans, x, y: unbroadcast(-g[1] * ans[0], shape_of(y)),
    ),
    jvp=_divmod_jvp,
    batched=False,
)

# ldexp(x, i) = x * 2**i; i is an integer (no derivative)
ldexp = Primitive(
    "ldexp",
    np.ldexp,
    vjps=(lambda g, ans, x, i: unbroadcast(np.ldexp(g, i), shape_of(x)), None),
    jvp=lambda ts, ans, x, i: np.broadcast_to(
        np.ldexp(lift_tangent(ts[0], x, ndim_of(ans)), i), batch_shape(ts[0], x) + shape_of(ans)
    ),
    jvp_batched=True,
)
UFUNCS[np.ldexp] = ldexp
for _name in ("bitwise_count", "isnat"):  # integer and datetime predicates
    if hasattr(np, _name):
        nondiff(_name, getattr(np, _name), getattr(np, _name))
# nextafter(x, y) moves x by one ulp towards y: d/dx = 1, d/dy = 0 (declared above as having no
# derivative at all, which gave a zero gradient in x)
nextafter = Primitive(
    "nextafter",
    np.nextafter,
    vjps=(lambda g, ans, x, y: unbroadcast(g, shape_of(x)), None),
    jvp=lambda ts, ans, x, y: (
        None
        if ts[0] is None
        else np.broadcast_to(
            lift_tangent(ts[0], x, ndim_of(ans)), batch_shape(ts[0], x) + shape_of(ans)
        )
    ),
    linear=False,
    jvp_batched=True,
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
    "heaviside",
    np.heaviside,
    vjps=(None, lambda g, ans, x, h0: unbroadcast(np.where(x == 0, g, 0), shape_of(h0))),
    jvp=_heaviside_jvp,
    jvp_batched=True,
)
UFUNCS[np.heaviside] = heaviside


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
    "conjugate",
    np.conjugate,
    vjps=(lambda g, ans, x: np.conjugate(g),),
    jvp=lambda ts, ans, x: np.conjugate(ts[0]),
    linear=True,
    jvp_batched=True,
)
UFUNCS[np.conjugate] = conjugate  # np.conj is np.conjugate

# np.real(z) and np.imag(z) are views of a complex z: later writes into z are seen through them
real = Primitive(
    "real",
    np.real,
    vjps=(lambda g, ans, x: _as_complex(g, dtype_of(x)),),
    jvp=lambda ts, ans, x: np.real(ts[0]),
    linear=True,
    jvp_batched=True,
    aliases_input=True,
)
imag = Primitive(
    "imag",
    np.imag,
    vjps=(lambda g, ans, x: _as_complex(g, dtype_of(x)) * -1j,),
    jvp=lambda ts, ans, x: np.imag(ts[0]),
    linear=True,
    jvp_batched=True,
    aliases_input=True,
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
    "add",
    "subtract",
    "multiply",
    "divide",
    "negative",
    "positive",
    "power",
    "float_power",
    "square",
    "reciprocal",
    "exp",
    "expm1",
    "exp2",
    "log",
    "log1p",
    "log2",
    "log10",
    "sqrt",
    "sin",
    "cos",
    "tan",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "arcsinh",
    "arccosh",
    "arctanh",
    "gamma",
    "erf",
    "erfc",
    "ndtr",
    "log_ndtr",
    "xlogy",
    "xlog1py",
    "absolute",
    "conjugate",
    "real",
    "imag",
)
