"""scipy.optimize, scipy.integrate and scipy.signal helpers used inside losses.

`rosen`, `rosen_der`, `trapezoid` and `simpson` need no rule: they
convert their input with `np.asarray` (passed through, see rules/conversion.py) and compute
with NumPy. `rosen_hess` and `rosen_hess_prod` write traced values into a plain array made
with `np.zeros`, which cannot be traced: they get the versions below (the same formulas,
assembled with `np.concatenate` and `np.diag`). `scipy.signal.convolve` and `correlate`
(N-D, every mode) are one primitive: the full convolution cropped as SciPy crops it; its
derivatives are convolutions with the other operand flipped.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements_module_function
from ..core.tracing import Tracer
from ._complex import complex_rules
from ._util import dtype_of, ndim_of, shape_of
from .linalg import _cj


def _hess_diagonal(x):
    first = np.reshape(1200 * x[0] ** 2 - 400 * x[1] + 2, (1,))
    middle = 202 + 1200 * x[1:-1] ** 2 - 400 * x[2:]
    return np.concatenate([first, middle, np.array([200.0])])


def rosen_hess(x):
    """The Hessian of the Rosenbrock function (scipy.optimize.rosen_hess) on traced values."""
    x = np.atleast_1d(x)
    off = -400 * x[:-1]
    return np.diag(off, 1) + np.diag(off, -1) + np.diag(_hess_diagonal(x))


def rosen_hess_prod(x, p):
    """The Rosenbrock Hessian times p (scipy.optimize.rosen_hess_prod) on traced values."""
    x = np.atleast_1d(x)
    diagonal = _hess_diagonal(x)
    off = -400 * x[:-1]
    below = np.concatenate([np.zeros(1), off * p[:-1]])
    above = np.concatenate([off * p[1:], np.zeros(1)])
    return diagonal * p + below + above


for _module in ("scipy.optimize", "scipy.optimize._optimize"):
    implements_module_function(_module, "rosen_hess")(rosen_hess)
    implements_module_function(_module, "rosen_hess_prod")(rosen_hess_prod)


def cumulative_trapezoid(y, x=None, dx=1.0, axis=-1, initial=None):
    """scipy.integrate.cumulative_trapezoid on traced values (SciPy's goes through an array-API
    namespace that does not know a Tracer)."""
    y = np.moveaxis(y, axis, -1)
    if x is None:
        d = dx
    else:
        if np.ndim(x) == 1:
            d = x[1:] - x[:-1]
        else:
            x = np.moveaxis(x, axis, -1)
            d = x[..., 1:] - x[..., :-1]
    res = np.cumsum(d * (y[..., 1:] + y[..., :-1]) / 2.0, axis=-1)
    if initial is not None:
        if initial != 0:
            raise ValueError("`initial` must be `None` or `0`.")
        zero = np.zeros(np.shape(res)[:-1] + (1,))
        res = np.concatenate([zero, res], axis=-1)
    return np.moveaxis(res, -1, axis)


for _module in ("scipy.integrate", "scipy.integrate._quadrature"):
    implements_module_function(_module, "cumulative_trapezoid")(cumulative_trapezoid)


def odeint(func, y0, t, *args, **kwargs):
    """scipy.integrate.odeint with a traced argument: refused with what to write instead (it
    runs compiled Fortran on plain arrays; there is no rule for it yet)."""
    from ..core.ir import source_text
    from ..core.tracing import user_frame

    where = source_text(user_frame(1)) or "<unknown>"
    raise GradtapeError(
        f"scipy.integrate.odeint ({where}) has no derivative rule in gradtape: LSODA runs as "
        "compiled code on plain arrays, which would cut the gradient. Write the integration "
        "with gradtape.fori_loop or gradtape.scan (a fixed-step Runge-Kutta step as the "
        "body), or give the solve a rule with gradtape.custom_vjp."
    )


for _module in ("scipy.integrate", "scipy.integrate._odepack_py"):
    implements_module_function(_module, "odeint")(odeint)


# --- scipy.signal.convolve, correlate -------------------------------------------------------------
def _signal_original(name: str):
    import scipy.signal

    f = getattr(scipy.signal, name)
    return getattr(f, "__gradtape_original__", f)


def _crop(s1: tuple, s2: tuple, mode: str) -> tuple:
    """(start, shape) of SciPy's `mode` output inside the full convolution, per axis."""
    full = tuple(n + m - 1 for n, m in zip(s1, s2))
    if mode == "full":
        return (0,) * len(full), full
    shape = s1 if mode == "same" else tuple(abs(n - m) + 1 for n, m in zip(s1, s2))
    return tuple((f - k) // 2 for f, k in zip(full, shape)), shape


def _full_cotangent(g, s1, s2, mode):
    start, shape = _crop(s1, s2, mode)
    full = tuple(n + m - 1 for n, m in zip(s1, s2))
    if mode == "full":
        return g
    return np.pad(g, [(b, f - b - k) for b, f, k in zip(start, full, shape)])


def _convolve_vjp(i, g, ans, a, b, mode, method):
    """The transpose of a -> crop(a * b) (no conjugation: JAX's convention for complex values):
    the cotangent padded to the full output, convolved with the other operand flipped."""
    gf = _full_cotangent(g, shape_of(a), shape_of(b), mode)
    other = b if i == 0 else a
    return convolution_p(gf, np.flip(other), mode="valid", method=method)


def _convolve_jvp(ts, ans, a, b, mode, method):
    out = None
    if ts[0] is not None:
        out = convolution_p(ts[0], b, mode=mode, method=method)
    if ts[1] is not None:
        t = convolution_p(a, ts[1], mode=mode, method=method)
        out = t if out is None else out + t
    return out


# x = scipy.signal.convolve(a, b, mode, method): SciPy computes the value, the rules call it again
convolution_p = Primitive(
    "signal_convolve",
    lambda a, b, mode, method: _signal_original("convolve")(a, b, mode=mode, method=method),
    vjps=(
        lambda g, ans, a, b, mode, method: _convolve_vjp(0, g, ans, a, b, mode, method),
        lambda g, ans, a, b, mode, method: _convolve_vjp(1, g, ans, a, b, mode, method),
    ),
    jvp=_convolve_jvp,
)
complex_rules("signal_convolve")  # bilinear: the transposes above are JAX's convention


def _signal_operands(in1, in2, mode, what):
    a, b = np.asarray(in1), np.asarray(in2)
    if mode not in ("full", "same", "valid"):
        raise ValueError("acceptable mode flags are 'valid', 'same', or 'full'")
    if ndim_of(a) != ndim_of(b):
        raise ValueError("in1 and in2 should have the same dimensionality")
    if 0 in shape_of(a) or 0 in shape_of(b):
        raise GradtapeError(f"scipy.signal.{what} of an empty array has no derivative rule")
    if mode == "valid":
        s1, s2 = shape_of(a), shape_of(b)
        if not (all(n >= m for n, m in zip(s1, s2)) or all(m >= n for n, m in zip(s1, s2))):
            raise ValueError(
                "For 'valid' mode, one must be at least as large as the other in every dimension"
            )
    dt = np.result_type(dtype_of(a), dtype_of(b))
    if dt.kind not in "fc":
        dt = np.dtype(np.float64)
    return a.astype(dt) if dtype_of(a) != dt else a, b.astype(dt) if dtype_of(b) != dt else b


def signal_convolve(in1, in2, mode="full", method="auto"):
    """scipy.signal.convolve on traced values (any dimension, every mode; `method` is SciPy's)."""
    a, b = _signal_operands(in1, in2, mode, "convolve")
    return convolution_p(a, b, mode=mode, method=method)


def signal_correlate(in1, in2, mode="full", method="auto"):
    """scipy.signal.correlate: the convolution with in2 flipped and conjugated, as SciPy
    defines it."""
    a, b = _signal_operands(in1, in2, mode, "correlate")
    return convolution_p(a, _cj(np.flip(b)), mode=mode, method=method)


for _module in ("scipy.signal", "scipy.signal._signaltools"):
    implements_module_function(_module, "convolve")(signal_convolve)
    implements_module_function(_module, "correlate")(signal_correlate)


# --- scipy.signal.lfilter -----------------------------------------------------------------------
# y = lfilter(b, a, x): the causal filter B(z)/A(z) along one axis, linear in x. Its transpose is
# the same filter run backwards (flip, filter, flip); in b and a: y depends on b_k through
# z^-k / A applied to x, and on a_k through -z^-k / A applied to y.
def _lfilter_raw(b, a, x, axis):
    if type(b) is Tracer or type(a) is Tracer or type(x) is Tracer:  # recorded one level down
        return lfilter_p(b, a, x, axis=axis)
    return _signal_original("lfilter")(b, a, x, axis=axis)


def _delayed_sums(g, u, taps: int, axis: int):
    """[sum(g[k:] * u[:n - k]) over every element, for k < taps] (along `axis`)."""
    g, u = np.moveaxis(g, axis, -1), np.moveaxis(u, axis, -1)
    n = shape_of(g)[-1]
    return np.stack([np.sum(g[..., k:] * u[..., : n - k]) for k in range(taps)])


def _lfilter_vjp_b(g, ans, b, a, x, axis):
    u = lfilter_p(np.ones(1, dtype=dtype_of(a)), a, x, axis=axis)
    return _delayed_sums(g, u, shape_of(b)[0], axis).astype(dtype_of(b))


def _lfilter_vjp_a(g, ans, b, a, x, axis):
    v = lfilter_p(np.ones(1, dtype=dtype_of(a)), a, ans, axis=axis)
    return -_delayed_sums(g, v, shape_of(a)[0], axis).astype(dtype_of(a))


def _lfilter_vjp_x(g, ans, b, a, x, axis):
    flipped = lfilter_p(b, a, np.flip(g, axis), axis=axis)
    return np.flip(flipped, axis).astype(dtype_of(x))


def _lfilter_jvp(ts, ans, b, a, x, axis):
    tb, ta, tx = ts
    out = None if tx is None else lfilter_p(b, a, tx, axis=axis)
    if tb is not None:
        t = lfilter_p(tb, a, x, axis=axis)
        out = t if out is None else out + t
    if ta is not None:
        t = -lfilter_p(ta, a, ans, axis=axis)
        out = t if out is None else out + t
    return out


lfilter_p = Primitive(
    "signal_lfilter",
    _lfilter_raw,
    vjps=(_lfilter_vjp_b, _lfilter_vjp_a, _lfilter_vjp_x),
    jvp=_lfilter_jvp,
)


def signal_lfilter(b, a, x, axis=-1, zi=None):
    """scipy.signal.lfilter on traced values: in x, b and a (1-d coefficients, a[0] != 0), along
    any axis; initial conditions (zi) have no rule."""
    if zi is not None:
        raise GradtapeError(
            "scipy.signal.lfilter with initial conditions (zi=) has no derivative rule; prepend "
            "the samples that set them to x instead, or filter without zi."
        )
    b, a, x = np.asarray(b), np.asarray(a), np.asarray(x)
    if ndim_of(b) != 1 or ndim_of(a) != 1:
        raise GradtapeError("scipy.signal.lfilter on traced values takes 1-d b and a")
    if 0 in shape_of(x) or shape_of(a)[0] == 0 or shape_of(b)[0] == 0:
        raise GradtapeError("scipy.signal.lfilter of an empty array has no derivative rule")
    dt = np.result_type(dtype_of(b), dtype_of(a), dtype_of(x), np.float64)
    if dt.kind == "c":
        raise GradtapeError("scipy.signal.lfilter of complex values has no derivative rule")
    b, a, x = (v if dtype_of(v) == dt else v.astype(dt) for v in (b, a, x))
    return lfilter_p(b, a, x, axis=axis % max(ndim_of(x), 1))


for _module in ("scipy.signal", "scipy.signal._signaltools"):
    implements_module_function(_module, "lfilter")(signal_lfilter)
