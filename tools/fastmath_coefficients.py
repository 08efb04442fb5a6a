"""Regenerate the polynomial coefficients and split constants of gradtape.compile.numba.fastmath.

Run `python tools/fastmath_coefficients.py` (needs mpmath) and paste the printed table into
fastmath.py. Each polynomial is a Remez minimax fit of relative error in 60-digit arithmetic,
then rounded to the target format; the printed error is that of the unrounded fit.
"""

from __future__ import annotations

from collections.abc import Callable

import mpmath as mp
import numpy as np

mp.mp.dps = 60


def remez(g: Callable, a, b, degree: int, iterations: int = 40, grid: int = 4000):
    """Coefficients (lowest first) of the degree-`degree` polynomial minimizing max |p/g - 1|."""
    a, b = mp.mpf(a), mp.mpf(b)
    m = degree + 2
    ref = [(a + b) / 2 - (b - a) / 2 * mp.cos(mp.pi * i / (m - 1)) for i in range(m)]
    xs = [a + (b - a) * (1 - mp.cos(mp.pi * i / grid)) / 2 for i in range(grid + 1)]
    gx = [g(x) for x in xs]
    for _ in range(iterations):
        system = mp.matrix(m, m)
        rhs = mp.matrix(m, 1)
        for i, x in enumerate(ref):
            gv = g(x)
            for j in range(degree + 1):
                system[i, j] = x**j
            system[i, degree + 1] = (-1) ** i * gv
            rhs[i] = gv
        sol = mp.lu_solve(system, rhs)
        coeffs = [sol[j] for j in range(degree + 1)]
        level = abs(sol[degree + 1])
        err = [(gv - mp.polyval(coeffs[::-1], x)) / gv for x, gv in zip(xs, gx)]
        extrema, start = [], 0
        for i in range(1, len(err) + 1):  # the largest error of each run of one sign
            if i == len(err) or mp.sign(err[i]) != mp.sign(err[start]):
                extrema.append(max(range(start, i), key=lambda t: abs(err[t])))
                start = i
        while len(extrema) > m:
            extrema.pop(0 if abs(err[extrema[0]]) < abs(err[extrema[-1]]) else -1)
        worst = max(abs(e) for e in err)
        if len(extrema) < m or worst - level < level * mp.mpf("1e-8"):
            break
        ref = [xs[k] for k in extrema]
    return coeffs, worst


def expm1_quotient(r):
    """(exp(r) - 1 - r) / r**2: exp(r) = 1 + r + r**2 P(r)."""
    if abs(r) < mp.mpf("1e-30"):
        return mp.mpf(1) / 2 + r / 6
    return (mp.expm1(r) - r) / r**2


def log_quotient(z):
    """(2 atanh(s) / s - 2) / z with z = s**2: log((1+s)/(1-s)) = 2s + s z T(z)."""
    if z < mp.mpf("1e-40"):
        return mp.mpf(2) / 3 + 2 * z / 5
    s = mp.sqrt(z)
    return (2 * mp.atanh(s) / s - 2) / z


def tanh_quotient(z):
    """(tanh(x) / x - 1) / z with z = x**2: tanh(x) = x + x z Q(z)."""
    if z < mp.mpf("1e-40"):
        return -mp.mpf(1) / 3 + 2 * z / 15
    x = mp.sqrt(z)
    return (mp.tanh(x) / x - 1) / z


def split(value, dtype, free_bits: int) -> tuple[float, float]:
    """value = hi + lo with hi's last `free_bits` significand bits zero (k * hi exact)."""
    nmant = np.finfo(dtype).nmant
    exponent = mp.floor(mp.log(abs(value), 2))
    quantum = mp.mpf(2) ** (exponent - nmant + free_bits)
    hi = mp.nint(value / quantum) * quantum
    return float(dtype(float(hi))), float(dtype(float(value - hi)))


def hex_literal(value: float) -> str:
    """float.hex without the trailing zeros of the significand."""
    head, exponent = value.hex().split("p")
    return f"{head.rstrip('0').rstrip('.')}p{exponent}" if "." in head else value.hex()


def show(name: str, values, dtype) -> None:
    body = ", ".join(f'"{hex_literal(float(dtype(float(v))))}"' for v in values)
    print(f"    {name}=_hex({body}),")


FORMATS = {  # dtype: (exp degree, log degree, tanh degree, bits left free in ln2_hi)
    np.float64: (10, 6, 10, 21),
    np.float32: (5, 2, 4, 9),
}
TANH_POLYNOMIAL_BELOW = 0.5625  # tanh's polynomial range; above it tanh(x) > 1/2

if __name__ == "__main__":
    half_ln2 = mp.log(2) / 2
    z_max = ((mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)) ** 2
    for dtype, (exp_degree, log_degree, tanh_degree, free_bits) in FORMATS.items():
        print(f"# {dtype.__name__}")
        coeffs, err = remez(expm1_quotient, -half_ln2 * 1.01, half_ln2 * 1.01, exp_degree)
        print(f"#   exp P: degree {exp_degree}, relative error {mp.nstr(err, 3)}")
        show("exp_poly", coeffs[::-1], dtype)
        coeffs, err = remez(log_quotient, 0, z_max * 1.01, log_degree)
        print(f"#   log T: degree {log_degree}, relative error {mp.nstr(err, 3)}")
        show("log_poly", coeffs[::-1], dtype)
        coeffs, err = remez(tanh_quotient, 0, TANH_POLYNOMIAL_BELOW**2, tanh_degree)
        print(f"#   tanh Q: degree {tanh_degree}, relative error {mp.nstr(err, 3)}")
        show("tanh_poly", coeffs[::-1], dtype)
        show("ln2_hi, ln2_lo", split(mp.log(2), dtype, free_bits), dtype)
