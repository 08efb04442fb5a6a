"""The derivatives of the regularized incomplete beta function in its shape parameters.

``I_x(a, b) = betainc(a, b, x)`` has no closed-form derivative in ``a`` or ``b``. It is
computed from the continued fraction that gives the function (Numerical Recipes' ``betacf``),

    I_x(a, b) = x^a (1 - x)^b / (a B(a, b)) / K,   K = 1 + d1 / (1 + d2 / (1 + ...)),
    d(2m+1) = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)),
    d(2m) = m (b - m) x / ((a + 2m - 1)(a + 2m)),

whose convergents (the forward recurrence, rescaled so they stay in range) are differentiated
in ``a`` and ``b`` while they are summed, until the fraction and both derivatives have
converged. It converges fast for ``x < (a + 1) / (a + b + 2)``; beyond, the symmetry
``I_x(a, b) = 1 - I_{1-x}(b, a)`` is used.

Plain NumPy on whole arrays; each iteration works only on the entries that have not converged.
An entry that has not converged after ``MAX_TERMS`` terms is NaN, never a number that is off.
"""

from __future__ import annotations

import numpy as np

MAX_TERMS = 20_000
_EPS = np.finfo(np.float64).eps
_TOLERANCE = 2 * _EPS  # (the last bit of a convergent may flip between terms)


def _sp():
    import scipy.special

    return scipy.special


def betainc_dab(a, b, x) -> tuple[np.ndarray, np.ndarray]:
    """(d/da, d/db) of betainc(a, b, x), elementwise (float64; NaN outside a, b > 0 and
    0 <= x <= 1)."""
    a, b, x = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in (a, b, x)))
    da, db = np.full(a.shape, np.nan), np.full(a.shape, np.nan)
    valid = (a > 0) & (b > 0) & np.isfinite(a) & np.isfinite(b) & (x >= 0) & (x <= 1)
    edge = valid & ((x == 0) | (x == 1))  # I is 0 or 1 for every a, b
    da[edge], db[edge] = 0.0, 0.0
    inside = valid & ~edge
    swapped = inside & (x > (a + 1.0) / (a + b + 2.0))
    direct = inside & ~swapped
    if direct.any():
        da[direct], db[direct] = _by_continued_fraction(a[direct], b[direct], x[direct])
    if swapped.any():  # I_x(a, b) = 1 - I_{1-x}(b, a)
        d_b, d_a = _by_continued_fraction(b[swapped], a[swapped], 1.0 - x[swapped])
        da[swapped], db[swapped] = -d_a, -d_b
    if da.ndim == 0:
        return da[()], db[()]
    return da, db


def betainc_da(a, b, x) -> np.ndarray:
    """d/da betainc(a, b, x)."""
    return betainc_dab(a, b, x)[0]


def betainc_db(a, b, x) -> np.ndarray:
    """d/db betainc(a, b, x)."""
    return betainc_dab(a, b, x)[1]


def _by_continued_fraction(a, b, x):
    """(dI/da, dI/db) where x < (a + 1) / (a + b + 2)."""
    sp = _sp()
    n = a.size
    da_out, db_out = np.full(n, np.nan), np.full(n, np.nan)
    with np.errstate(all="ignore"):
        log_front = (
            sp.xlogy(a, x) + sp.xlog1py(b, -x) - np.log(a) - sp.betaln(a, b)
        )  # x^a (1 - x)^b / (a B(a, b))
    # convergents A/B of K and their derivatives in a (suffix _a) and b (suffix _b)
    A_prev, A, B_prev, B = np.ones(n), np.ones(n), np.zeros(n), np.ones(n)
    zeros = [np.zeros(n) for _ in range(8)]
    A_prev_a, A_a, B_prev_a, B_a, A_prev_b, A_b, B_prev_b, B_b = zeros
    value, value_a, value_b = np.ones(n), np.zeros(n), np.zeros(n)
    left = np.arange(n)
    for k in range(1, MAX_TERMS):
        m = k // 2
        if k % 2:  # d(2m+1)
            d = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
            d_a = d * (1 / (a + m) + 1 / (a + b + m) - 1 / (a + 2 * m) - 1 / (a + 2 * m + 1))
            d_b = d / (a + b + m)
        else:  # d(2m)
            denominator = (a + 2 * m - 1) * (a + 2 * m)
            d = m * (b - m) * x / denominator
            d_a = -d * (1 / (a + 2 * m - 1) + 1 / (a + 2 * m))
            d_b = m * x / denominator
        A_next = A + d * A_prev
        B_next = B + d * B_prev
        A_next_a = A_a + d * A_prev_a + d_a * A_prev
        B_next_a = B_a + d * B_prev_a + d_a * B_prev
        A_next_b = A_b + d * A_prev_b + d_b * A_prev
        B_next_b = B_b + d * B_prev_b + d_b * B_prev
        A_prev, A, B_prev, B = A, A_next, B, B_next
        A_prev_a, A_a, B_prev_a, B_a = A_a, A_next_a, B_a, B_next_a
        A_prev_b, A_b, B_prev_b, B_b = A_b, A_next_b, B_b, B_next_b
        # rescale all convergents alike where they grow or shrink out of range
        size = np.abs(B)
        scale = np.where(size > 1 / _EPS, _EPS, np.where(size < _EPS, 1 / _EPS, 1.0))
        if (scale != 1.0).any():
            for array in (A_prev, A, B_prev, B, A_prev_a, A_a, B_prev_a, B_a):
                array *= scale
            for array in (A_prev_b, A_b, B_prev_b, B_b):
                array *= scale
        new_value = A / B
        new_a = (A_a * B - A * B_a) / (B * B)  # dK/da
        new_b = (A_b * B - A * B_b) / (B * B)
        # the derivatives are measured against K too: where one is 0 (b = 1 ends the fraction,
        # so dK/da is 0) it is rounding noise that never settles relative to itself
        tolerance = _TOLERANCE * np.abs(new_value)
        converged = (
            (np.abs(new_value - value) <= tolerance)
            & (np.abs(new_a - value_a) <= _TOLERANCE * np.abs(new_a) + tolerance)
            & (np.abs(new_b - value_b) <= _TOLERANCE * np.abs(new_b) + tolerance)
        )
        value, value_a, value_b = new_value, new_a, new_b
        if k % 2 == 0 and converged.any():  # (after whole pairs of terms)
            at = left[converged]
            aa, bb, xx = a[converged], b[converged], x[converged]
            K, K_a, K_b = value[converged], value_a[converged], value_b[converged]
            I = np.exp(log_front[converged]) / K
            psi_ab = sp.digamma(aa + bb)
            dlog_a = np.log(xx) - 1 / aa - sp.digamma(aa) + psi_ab - K_a / K
            dlog_b = np.log1p(-xx) - sp.digamma(bb) + psi_ab - K_b / K
            da_out[at], db_out[at] = I * dlog_a, I * dlog_b
            keep = ~converged
            left, a, b, x, log_front = left[keep], a[keep], b[keep], x[keep], log_front[keep]
            state = (A_prev, A, B_prev, B, A_prev_a, A_a, B_prev_a, B_a)
            A_prev, A, B_prev, B, A_prev_a, A_a, B_prev_a, B_a = (s[keep] for s in state)
            state = (A_prev_b, A_b, B_prev_b, B_b, value, value_a, value_b)
            A_prev_b, A_b, B_prev_b, B_b, value, value_a, value_b = (s[keep] for s in state)
            if left.size == 0:
                break
    return da_out, db_out
