"""The derivative of the regularized incomplete gamma function in its shape parameter.

``P(a, x) = gammainc(a, x)`` has no closed-form derivative in ``a``. It is computed the way
XLA computes JAX's ``igamma_grad_a``: the series or the continued fraction that give ``P`` (or
``Q = 1 - P``) are differentiated term by term in ``a`` while they are summed, until both the
value and its derivative have converged:

* ``x <= max(1, a)``: ``P = x^a e^-x / Gamma(a + 1) * sum_k x^k / ((a + 1) ... (a + k))``;
* otherwise ``Q = x^a e^-x / Gamma(a) * CF(a, x)``, Legendre's continued fraction, evaluated by
  the forward recurrence of its convergents (rescaled so they do not overflow).

Plain NumPy on whole arrays; each iteration works only on the entries that have not converged.
An entry that has not converged after ``MAX_TERMS`` terms (a shape parameter of about 10^8
with x near a) is NaN, never a number that is off.
"""

from __future__ import annotations

import numpy as np

MAX_TERMS = 20_000
_EPS = np.finfo(np.float64).eps
_RESCALE = 1.0 / _EPS


def _sp():
    import scipy.special

    return scipy.special


def gammainc_da(a, x) -> np.ndarray:
    """d/da gammainc(a, x), elementwise (float64; NaN outside a > 0, x >= 0)."""
    a, x = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(x, np.float64))
    out = np.full(a.shape, np.nan)
    valid = (a > 0) & np.isfinite(a) & (x >= 0)
    out[valid & ((x == 0) | np.isinf(x))] = 0.0  # P is 0 or 1 for every a there
    inside = valid & (x > 0) & np.isfinite(x)
    with np.errstate(all="ignore"):
        log_ax = _sp().xlogy(a, x) - x - _sp().gammaln(a)  # x^a e^-x / Gamma(a)
    # where x^a e^-x / Gamma(a) underflows, so do P's distance from 0 or 1 and its derivative
    tiny = inside & (log_ax < np.log(np.finfo(np.float64).tiny))
    out[tiny] = 0.0
    inside &= ~tiny
    by_fraction = inside & (x > 1) & (x > a)
    by_series = inside & ~by_fraction
    if by_series.any():
        out[by_series] = _by_series(a[by_series], x[by_series], log_ax[by_series])
    if by_fraction.any():
        out[by_fraction] = -_by_continued_fraction(
            a[by_fraction], x[by_fraction], log_ax[by_fraction]
        )
    return out if out.ndim else out[()]


def gammaincc_da(a, x) -> np.ndarray:
    """d/da gammaincc(a, x) = -d/da gammainc(a, x)."""
    return -gammainc_da(a, x)


def _by_series(a, x, log_ax):
    """dP/da from the power series, differentiated term by term."""
    n = a.size
    out = np.full(n, np.nan)
    r, c, total = a.copy(), np.ones(n), np.ones(n)
    dc, dtotal = np.zeros(n), np.zeros(n)
    left = np.arange(n)
    for _ in range(MAX_TERMS):
        r += 1.0
        ratio = x / r
        dc = dc * ratio - c * x / (r * r)
        dtotal += dc
        c *= ratio
        total += c
        # (the derivative's change is also measured against the value: where the derivative
        # is 0 its rounding noise never settles relative to itself)
        done = (c <= _EPS * total) & (np.abs(dc) <= _EPS * (np.abs(dtotal) + total))
        if done.any():
            at = left[done]
            dlog = np.log(x[done]) - _sp().digamma(a[done] + 1.0)
            # P = (x^a e^-x / Gamma(a + 1)) * total
            scale = np.exp(log_ax[done]) / a[done]
            out[at] = scale * (total[done] * dlog + dtotal[done])
            keep = ~done
            left, a, x, log_ax = left[keep], a[keep], x[keep], log_ax[keep]
            r, c, total, dc, dtotal = r[keep], c[keep], total[keep], dc[keep], dtotal[keep]
            if left.size == 0:
                break
    return out


def _by_continued_fraction(a, x, log_ax):
    """dQ/da from Legendre's continued fraction, its convergents differentiated in a."""
    n = a.size
    out = np.full(n, np.nan)
    y = 1.0 - a
    z = x + y + 1.0
    c = np.zeros(n)
    p_prev, q_prev = np.ones(n), x.copy()
    p, q = x + 1.0, z * x
    value = p / q
    dp_prev, dq_prev, dp, dq = np.zeros(n), np.zeros(n), np.zeros(n), -x.copy()
    dvalue = (dp - value * dq) / q
    left = np.arange(n)
    for _ in range(MAX_TERMS):
        c += 1.0
        y += 1.0
        z += 2.0
        yc = y * c
        p_next = p * z - p_prev * yc
        q_next = q * z - q_prev * yc
        dp_next = dp * z - p - dp_prev * yc + p_prev * c  # dy/da = dz/da = -1
        dq_next = dq * z - q - dq_prev * yc + q_prev * c
        nonzero = q_next != 0
        safe_q = np.where(nonzero, q_next, 1.0)
        new_value = np.where(nonzero, p_next / safe_q, value)
        new_dvalue = np.where(nonzero, (dp_next - new_value * dq_next) / safe_q, dvalue)
        converged = (
            nonzero
            & (np.abs(new_value - value) <= _EPS * np.abs(new_value))
            & (np.abs(new_dvalue - dvalue) <= _EPS * (np.abs(new_dvalue) + np.abs(new_value)))
        )
        value, dvalue = new_value, new_dvalue
        p_prev, q_prev, p, q = p, q, p_next, q_next
        dp_prev, dq_prev, dp, dq = dp, dq, dp_next, dq_next
        big = np.abs(p) > _RESCALE  # the convergents grow: rescale them and their derivatives
        if big.any():
            for array in (p_prev, q_prev, p, q, dp_prev, dq_prev, dp, dq):
                array[big] *= _EPS
        if converged.any():
            at = left[converged]
            dlog = np.log(x[converged]) - _sp().digamma(a[converged])
            # Q = (x^a e^-x / Gamma(a)) * value
            ax = np.exp(log_ax[converged])
            out[at] = ax * (value[converged] * dlog + dvalue[converged])
            keep = ~converged
            left, a, x, log_ax = left[keep], a[keep], x[keep], log_ax[keep]
            arrays = (y, z, c, value, dvalue, p_prev, q_prev, p, q, dp_prev, dq_prev, dp, dq)
            y, z, c, value, dvalue, p_prev, q_prev, p, q, dp_prev, dq_prev, dp, dq = (
                array[keep] for array in arrays
            )
            if left.size == 0:
                break
    return out
