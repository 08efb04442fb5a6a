"""scipy.stats distributions on traced values: rules at the distribution level.

scipy.stats' generic methods (`rv_continuous.logpdf`, ...) check their arguments with boolean
masks and write the results into a plain array with `np.place`: a Tracer cannot pass through
that. So, as jax.scipy.stats does, each supported distribution has its standardized functions
written with NumPy and scipy.special calls (which are primitives), and the generic methods are
re-implemented on top of them with SciPy's own conventions: the same argument checks
(`dist._argcheck`), supports (`dist._get_support`, `_support_mask`, `_open_support_mask`),
`-inf`/`0`/`1` outside the support and NaN for invalid parameters. The standardized functions
are evaluated at a point inside the support where a value is masked out, so a masked entry
gives a zero derivative, never a NaN.

The methods of `rv_continuous` and `rv_discrete` (and of the multivariate distributions) are
module functions (core.routes.MODULE_FUNCTIONS): gradtape/process.py replaces them by
dispatchers when scipy.stats is imported, and a call with a Tracer among its arguments comes
here (`norm.logpdf(x, mu, s)`, frozen distributions `norm(mu, s).logpdf(x)` too). A
distribution without a rule raises an error naming it.

Counts (the `k` of a pmf, `n` of binom and multinomial) and the data of discrete
distributions have no derivative: differentiating them is refused. A discrete ppf is a step
function: its derivative is zero where it exists.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import implements_module_function
from ..core.tracing import LevelKind, Tracer, bind

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LN2 = math.log(2.0)


def _sp():
    import scipy.special

    return scipy.special


def _carries_derivative(v) -> bool:
    while type(v) is Tracer:
        if v._level.kind is LevelKind.DIFFERENTIATE:
            return True
        v = v._value
    return False


def _refuse_derivative(value, what: str) -> None:
    if _carries_derivative(value):
        raise GradtapeError(
            f"{what} has no derivative (a count or an integer parameter: the function is a "
            "step function of it). Pass it as a constant, or through gradtape.stop_gradient."
        )


# --- the standardized distributions ---------------------------------------------------------
_LOG_2PI = math.log(2 * math.pi)


class _Dist:
    """Standardized functions of one distribution (loc 0, scale 1); None: no rule."""

    logpdf = cdf = sf = logcdf = logsf = ppf = isf = None
    safe_shapes: tuple = ()  # valid shape values, used where the given ones are masked out
    counts: tuple = ()  # indices of shape parameters that are counts (no derivative)

    def __init__(self, **functions):
        for k, v in functions.items():
            setattr(self, k, v)


def _norm_logpdf(z):
    return -0.5 * z * z - _LOG_SQRT_2PI


def _gamma_logpdf(z, a):
    return _sp().xlogy(a - 1, z) - z - _sp().gammaln(a)


def _odds(y):
    """y / (1 - y): a beta variable as a beta-prime one."""
    return y / (1.0 - y)


def _t_logcdf(z, df):
    return np.log(_sp().stdtr(df, z))


def _log_normal_mass(a, b):
    """log(Phi(b) - Phi(a)) for a < b, without cancellation in either tail."""
    log_ndtr = _sp().log_ndtr
    right = a > 0  # both in the right tail: the difference of the upper tails
    lo = np.where(right, -b, a)
    hi = np.where(right, -a, b)
    top = log_ndtr(hi)
    return top + np.log(-np.expm1(log_ndtr(lo) - top))


def _truncnorm_logcdf(z, a, b):
    return _log_normal_mass(a, z) - _log_normal_mass(a, b)


def _truncnorm_logsf(z, a, b):
    return _log_normal_mass(z, b) - _log_normal_mass(a, b)


_GEV_SERIES = 1e-3  # |c z| below which log1p(-c z) / c is summed as its series


def _gev_log_tail(z, c):
    """log1p(-c z) / c, the logarithm of -log(cdf) of the standard GEV: -z at c = 0, with
    the derivative in c its limit there (the series in c z where |c z| is small)."""
    cz = c * z
    small = np.abs(cz) < _GEV_SERIES
    cz_small = np.where(small, cz, 0.0)
    series = -z * (
        1.0 + cz_small * (1 / 2 + cz_small * (1 / 3 + cz_small * (1 / 4 + cz_small / 5)))
    )
    c_safe = np.where(small, 1.0, c)
    return np.where(small, series, np.log1p(-np.where(small, 0.0, cz)) / c_safe)


def _gev_logpdf(z, c):
    log_tail = _gev_log_tail(z, c)
    cz = c * z
    value = -np.exp(log_tail) + log_tail - np.log1p(-cz)
    # at the finite end of the support (c z = 1) the density is 0, as SciPy says
    return np.where((cz == 1.0) | np.isneginf(cz), -np.inf, value)


CONTINUOUS = {
    "norm_gen": _Dist(
        logpdf=_norm_logpdf,
        cdf=lambda z: _sp().ndtr(z),
        sf=lambda z: _sp().ndtr(-z),
        logcdf=lambda z: _sp().log_ndtr(z),
        logsf=lambda z: _sp().log_ndtr(-z),
        ppf=lambda q: _sp().ndtri(q),
        isf=lambda q: -_sp().ndtri(q),
    ),
    "t_gen": _Dist(
        logpdf=lambda z, df: _t_logpdf(z, df),
        cdf=lambda z, df: _sp().stdtr(df, z),
        sf=lambda z, df: _sp().stdtr(df, -z),
        ppf=lambda q, df: _sp().stdtrit(df, q),
        isf=lambda q, df: -_sp().stdtrit(df, q),
        safe_shapes=(1.0,),
    ),
    # the normal truncated to [a, b] (standardized ends): the mass between the ends as a
    # difference of log_ndtr in the tail they lie in
    "truncnorm_gen": _Dist(
        logpdf=lambda z, a, b: _norm_logpdf(z) - _log_normal_mass(a, b),
        logcdf=_truncnorm_logcdf,
        logsf=_truncnorm_logsf,
        cdf=lambda z, a, b: np.exp(_truncnorm_logcdf(z, a, b)),
        sf=lambda z, a, b: np.exp(_truncnorm_logsf(z, a, b)),
        safe_shapes=(-1.0, 1.0),
    ),
    # pdf and logpdf only: its cdf needs Owen's T, which has no rule (refused by name)
    "skewnorm_gen": _Dist(
        logpdf=lambda z, a: _LN2 + _norm_logpdf(z) + _sp().log_ndtr(a * z),
        safe_shapes=(0.0,),
    ),
    "genextreme_gen": _Dist(
        logpdf=_gev_logpdf,
        cdf=lambda z, c: np.exp(-np.exp(_gev_log_tail(z, c))),
        sf=lambda z, c: -np.expm1(-np.exp(_gev_log_tail(z, c))),
        logcdf=lambda z, c: -np.exp(_gev_log_tail(z, c)),
        logsf=lambda z, c: np.log(-np.expm1(-np.exp(_gev_log_tail(z, c)))),
        safe_shapes=(0.5,),
    ),
    # pdf and logpdf only: its cdf is a series in kappa (SciPy's own), refused by name
    "vonmises_gen": _Dist(
        logpdf=lambda z, kappa: kappa * (np.cos(z) - 1.0) - _LOG_2PI - np.log(_sp().i0e(kappa)),
        safe_shapes=(1.0,),
    ),
    "cauchy_gen": _Dist(
        logpdf=lambda z: -math.log(math.pi) - np.log1p(z * z),
        cdf=lambda z: 0.5 + np.arctan(z) / math.pi,
        sf=lambda z: 0.5 - np.arctan(z) / math.pi,
        ppf=lambda q: np.tan(math.pi * q - math.pi / 2),
        isf=lambda q: np.tan(math.pi / 2 - math.pi * q),
    ),
    "laplace_gen": _Dist(
        logpdf=lambda z: -_LN2 - np.abs(z),
        cdf=lambda z: np.where(z > 0, 1.0 - 0.5 * np.exp(-np.abs(z)), 0.5 * np.exp(-np.abs(z))),
        sf=lambda z: np.where(z > 0, 0.5 * np.exp(-np.abs(z)), 1.0 - 0.5 * np.exp(-np.abs(z))),
        logcdf=lambda z: np.where(z > 0, np.log1p(-0.5 * np.exp(-np.abs(z))), -_LN2 - np.abs(z)),
        logsf=lambda z: np.where(z > 0, -_LN2 - np.abs(z), np.log1p(-0.5 * np.exp(-np.abs(z)))),
        ppf=lambda q: np.where(q > 0.5, -np.log(2 * (1 - q)), np.log(2 * q)),
        isf=lambda q: np.where(q < 0.5, -np.log(2 * q), np.log(2 * (1 - q))),
    ),
    "logistic_gen": _Dist(
        logpdf=lambda z: -np.abs(z) - 2 * np.log1p(np.exp(-np.abs(z))),
        cdf=lambda z: _sp().expit(z),
        sf=lambda z: _sp().expit(-z),
        logcdf=lambda z: _sp().log_expit(z),
        logsf=lambda z: _sp().log_expit(-z),
        ppf=lambda q: _sp().logit(q),
        isf=lambda q: -_sp().logit(q),
    ),
    "expon_gen": _Dist(
        logpdf=lambda z: -z,
        cdf=lambda z: -np.expm1(-z),
        sf=lambda z: np.exp(-z),
        logcdf=lambda z: np.log(-np.expm1(-z)),
        logsf=lambda z: -z,
        ppf=lambda q: -np.log1p(-q),
        isf=lambda q: -np.log(q),
    ),
    "gamma_gen": _Dist(
        logpdf=_gamma_logpdf,
        cdf=lambda z, a: _sp().gammainc(a, z),
        sf=lambda z, a: _sp().gammaincc(a, z),
        ppf=lambda q, a: _sp().gammaincinv(a, q),
        isf=lambda q, a: _sp().gammainccinv(a, q),
        safe_shapes=(1.0,),
    ),
    "invgamma_gen": _Dist(
        logpdf=lambda z, a: -(a + 1) * np.log(z) - _sp().gammaln(a) - 1.0 / z,
        cdf=lambda z, a: _sp().gammaincc(a, 1.0 / z),
        sf=lambda z, a: _sp().gammainc(a, 1.0 / z),
        ppf=lambda q, a: 1.0 / _sp().gammainccinv(a, q),
        isf=lambda q, a: 1.0 / _sp().gammaincinv(a, q),
        safe_shapes=(1.0,),
    ),
    "beta_gen": _Dist(
        logpdf=lambda z, a, b: (
            _sp().xlog1py(b - 1.0, -z) + _sp().xlogy(a - 1.0, z) - _sp().betaln(a, b)
        ),
        cdf=lambda z, a, b: _sp().betainc(a, b, z),
        sf=lambda z, a, b: _sp().betaincc(a, b, z),
        ppf=lambda q, a, b: _sp().betaincinv(a, b, q),
        isf=lambda q, a, b: _sp().betainccinv(a, b, q),
        safe_shapes=(2.0, 2.0),
    ),
    "lognorm_gen": _Dist(
        logpdf=lambda z, s: -np.log(z) - np.log(s) - _LOG_SQRT_2PI - 0.5 * (np.log(z) / s) ** 2,
        cdf=lambda z, s: _sp().ndtr(np.log(z) / s),
        sf=lambda z, s: _sp().ndtr(-np.log(z) / s),
        logcdf=lambda z, s: _sp().log_ndtr(np.log(z) / s),
        logsf=lambda z, s: _sp().log_ndtr(-np.log(z) / s),
        ppf=lambda q, s: np.exp(s * _sp().ndtri(q)),
        isf=lambda q, s: np.exp(-s * _sp().ndtri(q)),
        safe_shapes=(1.0,),
    ),
    "chi2_gen": _Dist(
        logpdf=lambda z, df: _gamma_logpdf(z / 2, df / 2) - _LN2,
        cdf=lambda z, df: _sp().gammainc(df / 2, z / 2),
        sf=lambda z, df: _sp().gammaincc(df / 2, z / 2),
        ppf=lambda q, df: 2 * _sp().gammaincinv(df / 2, q),
        isf=lambda q, df: 2 * _sp().gammainccinv(df / 2, q),
        safe_shapes=(1.0,),
    ),
    "halfnorm_gen": _Dist(
        logpdf=lambda z: 0.5 * math.log(2.0 / math.pi) - 0.5 * z * z,
        cdf=lambda z: _sp().erf(z / math.sqrt(2)),
        sf=lambda z: 2.0 * _sp().ndtr(-z),
        logcdf=lambda z: np.log(_sp().erf(z / math.sqrt(2))),
        logsf=lambda z: _LN2 + _sp().log_ndtr(-z),
        ppf=lambda q: _sp().ndtri((1 + q) / 2.0),
        isf=lambda q: -_sp().ndtri(q / 2.0),
    ),
    "uniform_gen": _Dist(
        logpdf=lambda z: np.zeros_like(z),
        cdf=lambda z: z,
        sf=lambda z: 1.0 - z,
        ppf=lambda q: q,
        isf=lambda q: 1.0 - q,
    ),
    "weibull_min_gen": _Dist(
        logpdf=lambda z, c: np.log(c) + _sp().xlogy(c - 1, z) - z**c,
        cdf=lambda z, c: -np.expm1(-(z**c)),
        sf=lambda z, c: np.exp(-(z**c)),
        logcdf=lambda z, c: np.log1p(-np.exp(-(z**c))),
        logsf=lambda z, c: -(z**c),
        ppf=lambda q, c: (-np.log1p(-q)) ** (1.0 / c),
        isf=lambda q, c: (-np.log(q)) ** (1.0 / c),
        safe_shapes=(1.0,),
    ),
    "pareto_gen": _Dist(
        logpdf=lambda z, b: np.log(b) - (b + 1) * np.log(z),
        cdf=lambda z, b: -np.expm1(-b * np.log(z)),
        sf=lambda z, b: np.exp(-b * np.log(z)),
        logsf=lambda z, b: -b * np.log(z),
        ppf=lambda q, b: np.power(1 - q, -1.0 / b),
        isf=lambda q, b: np.power(q, -1.0 / b),
        safe_shapes=(1.0,),
    ),
    "gumbel_r_gen": _Dist(
        logpdf=lambda z: -z - np.exp(-z),
        cdf=lambda z: np.exp(-np.exp(-z)),
        sf=lambda z: -np.expm1(-np.exp(-z)),
        logcdf=lambda z: -np.exp(-z),
        logsf=lambda z: np.log(-np.expm1(-np.exp(-z))),
        ppf=lambda q: -np.log(-np.log(q)),
        isf=lambda q: -np.log(-np.log1p(-q)),
    ),
    "gumbel_l_gen": _Dist(
        logpdf=lambda z: z - np.exp(z),
        cdf=lambda z: -np.expm1(-np.exp(z)),
        sf=lambda z: np.exp(-np.exp(z)),
        logcdf=lambda z: np.log(-np.expm1(-np.exp(z))),
        logsf=lambda z: -np.exp(z),
        ppf=lambda q: np.log(-np.log1p(-q)),
        isf=lambda q: np.log(-np.log(q)),
    ),
    "rayleigh_gen": _Dist(
        logpdf=lambda z: np.log(z) - 0.5 * z * z,
        cdf=lambda z: -np.expm1(-0.5 * z * z),
        sf=lambda z: np.exp(-0.5 * z * z),
        logcdf=lambda z: np.log(-np.expm1(-0.5 * z * z)),
        logsf=lambda z: -0.5 * z * z,
        ppf=lambda q: np.sqrt(-2.0 * np.log1p(-q)),
        isf=lambda q: np.sqrt(-2.0 * np.log(q)),
    ),
    "maxwell_gen": _Dist(
        logpdf=lambda z: 0.5 * math.log(2.0 / math.pi) + 2.0 * np.log(z) - 0.5 * z * z,
        cdf=lambda z: _sp().gammainc(1.5, 0.5 * z * z),
        sf=lambda z: _sp().gammaincc(1.5, 0.5 * z * z),
        ppf=lambda q: np.sqrt(2.0 * _sp().gammaincinv(1.5, q)),
        isf=lambda q: np.sqrt(2.0 * _sp().gammainccinv(1.5, q)),
    ),
    "halfcauchy_gen": _Dist(
        logpdf=lambda z: math.log(2.0 / math.pi) - np.log1p(z * z),
        cdf=lambda z: (2.0 / math.pi) * np.arctan(z),
        ppf=lambda q: np.tan(0.5 * math.pi * q),
        isf=lambda q: np.tan(0.5 * math.pi * (1.0 - q)),
    ),
    "halflogistic_gen": _Dist(
        logpdf=lambda z: _LN2 - z - 2.0 * np.log1p(np.exp(-z)),
        cdf=lambda z: np.tanh(0.5 * z),
        sf=lambda z: 2.0 * _sp().expit(-z),
        logsf=lambda z: _LN2 + _sp().log_expit(-z),
        ppf=lambda q: 2.0 * np.arctanh(q),
        isf=lambda q: 2.0 * np.arctanh(1.0 - q),
    ),
    "lomax_gen": _Dist(
        logpdf=lambda z, c: np.log(c) - (c + 1) * np.log1p(z),
        cdf=lambda z, c: -np.expm1(-c * np.log1p(z)),
        sf=lambda z, c: np.exp(-c * np.log1p(z)),
        logsf=lambda z, c: -c * np.log1p(z),
        ppf=lambda q, c: np.expm1(-np.log1p(-q) / c),
        isf=lambda q, c: np.expm1(-np.log(q) / c),
        safe_shapes=(1.0,),
    ),
    "fisk_gen": _Dist(
        logpdf=lambda z, c: np.log(c) + (c - 1) * np.log(z) - 2.0 * np.log1p(z**c),
        cdf=lambda z, c: 1.0 / (1.0 + z ** (-c)),
        sf=lambda z, c: 1.0 / (1.0 + z**c),
        ppf=lambda q, c: (q / (1.0 - q)) ** (1.0 / c),
        isf=lambda q, c: ((1.0 - q) / q) ** (1.0 / c),
        safe_shapes=(1.0,),
    ),
    "powerlaw_gen": _Dist(
        logpdf=lambda z, a: np.log(a) + _sp().xlogy(a - 1.0, z),
        cdf=lambda z, a: z**a,
        sf=lambda z, a: -np.expm1(a * np.log(z)),
        logcdf=lambda z, a: a * np.log(z),
        ppf=lambda q, a: q ** (1.0 / a),
        isf=lambda q, a: (1.0 - q) ** (1.0 / a),
        safe_shapes=(1.0,),
    ),
    "gompertz_gen": _Dist(
        logpdf=lambda z, c: np.log(c) + z - c * np.expm1(z),
        cdf=lambda z, c: -np.expm1(-c * np.expm1(z)),
        sf=lambda z, c: np.exp(-c * np.expm1(z)),  # (log sf as SciPy's: the log of this)
        ppf=lambda q, c: np.log1p(-np.log1p(-q) / c),
        isf=lambda q, c: np.log1p(-np.log(q) / c),
        safe_shapes=(1.0,),
    ),
    "invweibull_gen": _Dist(
        logpdf=lambda z, c: np.log(c) - (c + 1) * np.log(z) - z ** (-c),
        cdf=lambda z, c: np.exp(-(z ** (-c))),
        sf=lambda z, c: -np.expm1(-(z ** (-c))),
        logcdf=lambda z, c: -(z ** (-c)),
        ppf=lambda q, c: (-np.log(q)) ** (-1.0 / c),
        isf=lambda q, c: (-np.log1p(-q)) ** (-1.0 / c),
        safe_shapes=(1.0,),
    ),
    "nakagami_gen": _Dist(
        logpdf=lambda z, nu: (
            _LN2 + _sp().xlogy(nu, nu) - _sp().gammaln(nu) + _sp().xlogy(2 * nu - 1, z) - nu * z * z
        ),
        cdf=lambda z, nu: _sp().gammainc(nu, nu * z * z),
        sf=lambda z, nu: _sp().gammaincc(nu, nu * z * z),
        ppf=lambda q, nu: np.sqrt(_sp().gammaincinv(nu, q) / nu),
        isf=lambda q, nu: np.sqrt(_sp().gammainccinv(nu, q) / nu),
        safe_shapes=(1.0,),
    ),
    "betaprime_gen": _Dist(
        logpdf=lambda z, a, b: _sp().xlogy(a - 1.0, z) - (a + b) * np.log1p(z) - _sp().betaln(a, b),
        cdf=lambda z, a, b: _sp().betainc(a, b, z / (1.0 + z)),
        sf=lambda z, a, b: _sp().betaincc(a, b, z / (1.0 + z)),
        ppf=lambda q, a, b: _odds(_sp().betaincinv(a, b, q)),
        isf=lambda q, a, b: _odds(_sp().betainccinv(a, b, q)),
        safe_shapes=(2.0, 2.0),
    ),
    "f_gen": _Dist(
        logpdf=lambda z, n, m: (
            0.5 * _sp().xlogy(m, m)
            + 0.5 * _sp().xlogy(n, n)
            + _sp().xlogy(0.5 * n - 1.0, z)
            - 0.5 * (n + m) * np.log(m + n * z)
            - _sp().betaln(0.5 * n, 0.5 * m)
        ),
        cdf=lambda z, n, m: _sp().betainc(0.5 * n, 0.5 * m, n * z / (m + n * z)),
        sf=lambda z, n, m: _sp().betaincc(0.5 * n, 0.5 * m, n * z / (m + n * z)),
        ppf=lambda q, n, m: (m / n) * _odds(_sp().betaincinv(0.5 * n, 0.5 * m, q)),
        isf=lambda q, n, m: (m / n) * _odds(_sp().betainccinv(0.5 * n, 0.5 * m, q)),
        safe_shapes=(2.0, 2.0),
    ),
}


def _t_logpdf(z, df):
    from .elementwise import t_logpdf

    return t_logpdf(z, df)


def _binom_logpmf(k, n, p):
    return (
        _sp().gammaln(n + 1)
        - (_sp().gammaln(k + 1) + _sp().gammaln(n - k + 1))
        + _sp().xlogy(k, p)
        + _sp().xlog1py(n - k, -p)
    )


DISCRETE = {
    "poisson_gen": _Dist(
        logpmf=lambda k, mu: _sp().xlogy(k, mu) - _sp().gammaln(k + 1) - mu,
        cdf=lambda k, mu: _sp().pdtr(np.floor(k), mu),
        sf=lambda k, mu: _sp().pdtrc(np.floor(k), mu),
        safe_shapes=(1.0,),
    ),
    "binom_gen": _Dist(
        logpmf=_binom_logpmf,
        cdf=lambda k, n, p: _sp().bdtr(np.floor(k), n, p),
        sf=lambda k, n, p: _sp().bdtrc(np.floor(k), n, p),
        safe_shapes=(1.0, 0.5),
        counts=(0,),
    ),
    "bernoulli_gen": _Dist(
        logpmf=lambda k, p: _binom_logpmf(k, 1, p),
        cdf=lambda k, p: _sp().bdtr(np.floor(k), 1, p),
        sf=lambda k, p: _sp().bdtrc(np.floor(k), 1, p),
        safe_shapes=(0.5,),
    ),
    "nbinom_gen": _Dist(
        logpmf=lambda k, n, p: (
            _sp().gammaln(n + k)
            - _sp().gammaln(k + 1)
            - _sp().gammaln(n)
            + n * np.log(p)
            + _sp().xlog1py(k, -p)
        ),
        cdf=lambda k, n, p: _sp().betainc(n, np.floor(k) + 1, p),
        sf=lambda k, n, p: _sp().betaincc(n, np.floor(k) + 1, p),
        safe_shapes=(1.0, 0.5),
    ),
    "geom_gen": _Dist(
        logpmf=lambda k, p: _sp().xlog1py(k - 1, -p) + np.log(p),
        cdf=lambda k, p: -np.expm1(np.log1p(-p) * np.floor(k)),
        sf=lambda k, p: np.exp(np.log1p(-p) * np.floor(k)),
        logsf=lambda k, p: np.floor(k) * np.log1p(-p),
        safe_shapes=(0.5,),
    ),
}
for _rule_of in DISCRETE.values():
    _rule_of.logpdf = _rule_of.logpmf


# --- the generic methods, SciPy's conventions ---------------------------------------------
def _rule(dist, method: str, table: dict) -> _Dist:
    rule = table.get(type(dist).__name__)
    if rule is None or (getattr(rule, method, None) is None and method not in _DERIVED):
        kind = "pmf" if table is DISCRETE else "pdf"
        names = ", ".join(sorted(n[:-4] for n in table))
        raise GradtapeError(
            f"scipy.stats.{dist.name}.{method} has no gradtape rule (distributions with "
            f"{kind} rules: {names}). Give the computation a rule with gradtape.custom_vjp, "
            "or pass its traced inputs through gradtape.stop_gradient."
        )
    return rule


_DERIVED = {"pdf", "pmf", "logcdf", "logsf", "sf", "isf"}


def _as_arrays(x, shapes, loc, scale):
    """x, the shape parameters, loc and scale as arrays, as SciPy's methods take them (lists
    and Python numbers are converted; a traced value passes through np.asarray)."""
    return np.asarray(x), tuple(np.asarray(a) for a in shapes), np.asarray(loc), np.asarray(scale)


def _float_dtype(*xs):
    dt = np.result_type(*[getattr(x, "dtype", None) or np.result_type(x) for x in xs])
    return np.promote_types(dt, np.float64)


def _safe_shapes(rule, args, valid):
    """The shape parameters, with a valid value where they are not."""
    return tuple(
        np.where(valid, a, s) for a, s in zip(args, rule.safe_shapes or (1.0,) * len(args))
    )


def _inside_point(a, b):
    """A point inside (a, b) for masked entries."""
    a_fin, b_fin = np.isfinite(a), np.isfinite(b)
    return np.where(
        a_fin & b_fin,
        (np.where(a_fin, a, 0) + np.where(b_fin, b, 0)) / 2,
        np.where(a_fin, np.where(a_fin, a, 0) + 1, np.where(b_fin, b, 1) - 1),
    )


def _std(rule, method, z, shapes):
    """The standardized `method` at z (inside the support), derived when not given."""
    f = getattr(rule, method, None)
    if f is not None:
        return f(z, *shapes)
    if method in ("pdf", "pmf"):
        return np.exp(_std(rule, "logpdf", z, shapes))
    if method == "sf":
        return 1.0 - rule.cdf(z, *shapes)
    if method == "logcdf":
        return np.log(_std(rule, "cdf", z, shapes))
    if method == "logsf":
        return np.log(_std(rule, "sf", z, shapes))
    if method == "isf":
        return rule.ppf(1.0 - z, *shapes)
    raise AssertionError(method)


_OUTSIDE = {  # method: (value below the support, value above it)
    "pdf": (0.0, 0.0),
    "logpdf": (-np.inf, -np.inf),
    "cdf": (0.0, 1.0),
    "sf": (1.0, 0.0),
    "logcdf": (-np.inf, 0.0),
    "logsf": (0.0, -np.inf),
}


def _continuous_method(method: str):
    def traced(self, x, *args, **kwds):
        rule = _rule(self, method, CONTINUOUS)
        # as SciPy does: lists and scalars become arrays (a traced value passes through)
        x, shapes, loc, scale = _as_arrays(x, *self._parse_args(*args, **kwds))
        _a, _b = self._get_support(*shapes)
        valid = np.logical_and(self._argcheck(*shapes), scale > 0)
        safe_scale = np.where(scale > 0, scale, 1.0)
        shapes_ok = _safe_shapes(rule, shapes, valid)
        dtype = _float_dtype(x, loc, scale, *shapes)
        if method in ("ppf", "isf"):
            return _quantile(
                self, rule, method, x, shapes, shapes_ok, loc, scale, valid, _a, _b, dtype
            )
        z = (x - loc) / safe_scale
        if method in ("pdf", "logpdf"):
            inside = self._support_mask(z, *shapes)
        else:
            inside = self._open_support_mask(z, *shapes)
        good = np.logical_and(valid, inside)
        z_ok = np.where(good, z, _inside_point(_a, _b))
        value = _std(rule, method, z_ok, shapes_ok)
        if method == "logpdf":
            value = value - np.log(safe_scale)
        elif method == "pdf":
            value = value / safe_scale
        below, above = _OUTSIDE[method]
        if method in ("pdf", "logpdf"):
            outside = below
        else:
            outside = (
                np.where(z >= _b, above, below)
                if method in ("cdf", "logcdf")
                else np.where(z <= _a, below, above)
            )
        out = np.where(good, value, outside)
        out = np.where(valid & ~np.isnan(z), out, np.nan)
        return _result(out, dtype)

    traced.__name__ = method
    traced.__doc__ = f"rv_continuous.{method} on traced values (see the module docstring)."
    return traced


def _quantile(self, rule, method, q, shapes, shapes_ok, loc, scale, valid, _a, _b, dtype):
    valid = np.logical_and(valid, loc == loc)
    inner = (0 < q) & (q < 1)
    good = valid & inner
    q_ok = np.where(good, q, 0.5)
    value = _std(rule, method, q_ok, shapes_ok) * scale + loc
    low, high = (_a, _b) if method == "ppf" else (_b, _a)
    out = np.where(good, value, np.nan)
    out = np.where(valid & (q == 0), _bound(low, scale, loc), out)
    out = np.where(valid & (q == 1), _bound(high, scale, loc), out)
    return _result(out, dtype)


def _bound(end, scale, loc):
    """end * scale + loc, with no derivative through an infinite end (a NaN otherwise)."""
    finite = np.isfinite(end)
    return np.where(finite, np.where(finite, end, 0) * scale + loc, end)


def _result(out, dtype):
    if getattr(out, "dtype", dtype) != dtype:
        out = np.asarray(out, dtype=dtype)
    return out


_DISCRETE_OUTSIDE = {
    "pmf": (0.0, 0.0),
    "logpmf": (-np.inf, -np.inf),
    "cdf": (0.0, 1.0),
    "sf": (1.0, 0.0),
    "logcdf": (-np.inf, 0.0),
    "logsf": (0.0, -np.inf),
}


def _discrete_method(method: str):
    def traced(self, k, *args, **kwds):
        if method == "ppf":
            return _discrete_ppf(self, k, *args, **kwds)
        rule = _rule(self, method, DISCRETE)
        k, shapes, loc, _ = _as_arrays(k, *self._parse_args(*args, **kwds))
        _refuse_derivative(k, f"scipy.stats.{self.name}.{method}: k")
        _refuse_derivative(loc, f"scipy.stats.{self.name}.{method}: loc")
        for i in rule.counts:
            _refuse_derivative(shapes[i], f"scipy.stats.{self.name}.{method}: shape {i}")
        _a, _b = self._get_support(*shapes)
        valid = np.logical_and(self._argcheck(*shapes), True)
        shapes_ok = _safe_shapes(rule, shapes, valid)
        k = k - loc
        if method in ("pmf", "logpmf"):
            inside = (k >= _a) & (k <= _b) & (np.floor(k) == k)
        else:
            inside = (k >= _a) & (k < _b) & np.isfinite(k)
        good = np.logical_and(valid, inside)
        k_ok = np.where(good, k, _inside_point(_a, _b) if np.isfinite(_b) else _a)
        std_method = "logpdf" if method == "logpmf" else method
        value = _std(rule, std_method, np.floor(k_ok), shapes_ok)
        if method in ("pmf", "cdf", "sf"):
            value = np.clip(value, 0, 1)
        below, above = _DISCRETE_OUTSIDE[method]
        if method in ("pmf", "logpmf"):
            outside = below
        elif method in ("cdf", "logcdf"):
            outside = np.where(k >= _b, above, below)
        else:
            outside = np.where((k < _a) | np.isneginf(k), below, above)
        out = np.where(good, value, outside)
        out = np.where(valid & ~np.isnan(k), out, np.nan)
        return _result(out, np.float64)

    traced.__name__ = method
    traced.__doc__ = f"rv_discrete.{method} on traced values (see the module docstring)."
    return traced


# a discrete ppf is a step function of q and of the parameters: recorded (when staging) as one
# instruction that calls SciPy, with no derivative
discrete_ppf_p = Primitive(
    "discrete_ppf", lambda q, loc, *shapes, dist: dist.ppf(q, *shapes, loc=loc), nondiff=True
)


def _discrete_ppf(self, q, *args, **kwds):
    shapes, loc, _ = self._parse_args(*args, **kwds)
    return bind(discrete_ppf_p, (q, loc, *shapes), {"dist": self})


_STATS = "scipy.stats._distn_infrastructure"
for _m in ("pdf", "logpdf", "cdf", "logcdf", "sf", "logsf", "ppf", "isf"):
    implements_module_function(_STATS, f"rv_continuous.{_m}")(_continuous_method(_m))
for _m in ("pmf", "logpmf", "cdf", "logcdf", "sf", "logsf", "ppf"):
    implements_module_function(_STATS, f"rv_discrete.{_m}")(_discrete_method(_m))


# --- multivariate normal ------------------------------------------------------------------------
_MULTIVARIATE = "scipy.stats._multivariate"


def _mvn_parameters(mean, cov):
    """SciPy's _process_parameters_psd: dim, mean (dim,), cov (dim, dim)."""
    if mean is None:
        dim = 1 if cov is None or np.ndim(cov) < 2 else np.shape(cov)[0]
    else:
        mean = np.asarray(mean, dtype=float)
        dim = int(np.size(mean))
    mean = (
        np.zeros(dim) if mean is None else np.reshape(mean, (-1,)) if np.ndim(mean) == 0 else mean
    )
    cov = np.asarray(1.0 if cov is None else cov, dtype=float)
    if np.ndim(cov) == 0:
        cov = cov * np.eye(dim)
    elif np.ndim(cov) == 1:
        cov = np.diag(cov)
    if np.ndim(mean) != 1 or np.shape(mean)[0] != dim:
        raise ValueError(f"Array 'mean' must be a vector of length {dim}.")
    if np.shape(cov) != (dim, dim):
        raise ValueError(
            f"Array 'cov' must be at most two-dimensional, but cov.ndim = {np.ndim(cov)}"
            if np.ndim(cov) > 2
            else f"Dimension mismatch: array 'cov' is of shape {np.shape(cov)}, but "
            f"'mean' is a vector of length {dim}."
        )
    return dim, mean, cov


def _mvn_quantiles(x, dim):
    x = np.asarray(x, dtype=float)
    if np.ndim(x) == 0:
        x = np.reshape(x, (1,))
    if np.ndim(x) == 1:
        x = np.reshape(x, (-1, 1)) if dim == 1 else np.reshape(x, (1, -1))
    return x


def _squeeze(out):
    out = np.squeeze(out)
    return out


def _mvn_logpdf(x, mean, cov, allow_singular):
    dim, mean, cov = _mvn_parameters(mean, cov)
    x = _mvn_quantiles(x, dim)
    dev = x - mean
    batch = np.shape(dev)[:-1]
    flat = np.reshape(dev, (-1, dim))
    if type(cov) is not Tracer:
        # a constant covariance: SciPy's own factorization (pseudo-inverse when singular)
        from scipy.stats._multivariate import _PSD

        psd = _PSD(cov, allow_singular=allow_singular)
        maha = np.sum(np.square(flat @ psd.U), axis=-1)
        log_det, rank = psd.log_pdet, psd.rank
    else:
        try:
            chol = np.linalg.cholesky(cov)
        except np.linalg.LinAlgError:
            raise GradtapeError(
                "scipy.stats.multivariate_normal: the traced covariance is not positive "
                "definite; gradtape differentiates only the positive definite case (SciPy "
                "would use a pseudo-inverse with allow_singular=True, or raise)."
            ) from None
        white = np.linalg.solve(chol, np.transpose(flat))
        maha = np.sum(white * white, axis=0)
        log_det, rank = 2.0 * np.sum(np.log(np.diagonal(chol))), dim
    out = -0.5 * (rank * math.log(2 * math.pi) + log_det + maha)
    return _squeeze(np.reshape(out, batch))


def mvn_logpdf(self, x, mean=None, cov=1, allow_singular=False):
    """multivariate_normal.logpdf on traced values (x, mean and cov)."""
    return _mvn_logpdf(x, mean, cov, allow_singular)


def mvn_pdf(self, x, mean=None, cov=1, allow_singular=False):
    """multivariate_normal.pdf on traced values."""
    return np.exp(_mvn_logpdf(x, mean, cov, allow_singular))


def _mvn_refuse(name):
    def refuse(self, *args, **kwargs):
        raise GradtapeError(
            f"scipy.stats.multivariate_normal.{name} on traced values has no gradtape rule "
            "(it integrates numerically). Give it a rule with gradtape.custom_vjp, or pass "
            "its inputs through gradtape.stop_gradient."
        )

    return refuse


class TracedMultivariateNormal:
    """multivariate_normal(mean, cov) frozen with traced parameters: logpdf, pdf, mean, cov."""

    def __init__(self, mean=None, cov=1, allow_singular=False, seed=None, **kwds):
        self.dim, self.mean, self.cov = _mvn_parameters(mean, cov)
        self.allow_singular = allow_singular

    def logpdf(self, x):
        """Log-density at x."""
        return _mvn_logpdf(x, self.mean, self.cov, self.allow_singular)

    def pdf(self, x):
        """Density at x."""
        return np.exp(self.logpdf(x))

    def __getattr__(self, name):
        raise GradtapeError(
            f"multivariate_normal(...).{name} with traced parameters has no gradtape rule "
            "(logpdf and pdf do)."
        )


implements_module_function(_MULTIVARIATE, "multivariate_normal_gen.logpdf")(mvn_logpdf)
implements_module_function(_MULTIVARIATE, "multivariate_normal_gen.pdf")(mvn_pdf)
implements_module_function(_MULTIVARIATE, "multivariate_normal_gen.__call__")(
    lambda self, *args, **kwargs: TracedMultivariateNormal(*args, **kwargs)
)
implements_module_function(_MULTIVARIATE, "multivariate_normal_frozen.logpdf")(
    lambda self, x: _mvn_logpdf(x, self.mean, self.cov, self.allow_singular)
)
implements_module_function(_MULTIVARIATE, "multivariate_normal_frozen.pdf")(
    lambda self, x: np.exp(_mvn_logpdf(x, self.mean, self.cov, self.allow_singular))
)
for _m in ("cdf", "logcdf"):
    implements_module_function(_MULTIVARIATE, f"multivariate_normal_gen.{_m}")(_mvn_refuse(_m))
