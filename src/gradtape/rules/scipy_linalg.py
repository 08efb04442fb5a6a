"""scipy.linalg on Tracers: factorizations, structured solves, matrix functions and equations.

SciPy's linalg functions are plain Python functions that convert their arguments with
`np.asarray` and call LAPACK: NumPy's override protocols never see them. So, as for the
Python-level functions of scipy.special, gradtape replaces the attributes of the scipy.linalg
module listed in `_RULES` by wrappers: a call with a Tracer argument (also inside the tuples
`cho_solve((c, lower), b)`, `lu_solve((lu, piv), b)` and `solve_banded((l, u), ab, b)` take)
runs the rule below; any other call goes to SciPy unchanged (the original function is the
wrapper's `__gradtape_original__`). They are declared as module functions
(core.routes.MODULE_FUNCTIONS); gradtape/process.py installs the dispatchers when scipy.linalg
is imported, or at once if it is loaded already.

The rules reuse the forward factorization: `cho_solve`'s backward pass solves with the
Cholesky factor it was given, `lu_solve`'s with the LU factors, `solve(assume_a="pos")` keeps
the Cholesky factor of the forward solve (a constant to the derivative rules, which
differentiate through `a` itself), and `solve` of a general matrix the LU factors. Matrix
functions (`expm`, `sqrtm`, `logm`) take their Frechet derivatives from the same function of
the block matrix [[A, E], [0, A]] (Higham's identity), so they nest to any order;
`expm` uses `expm_frechet` on concrete arrays. `funm` goes through the eigendecomposition
(distinct eigenvalues). Real input only, except `expm`: complex matrices raise a
GradtapeError elsewhere.
"""

from __future__ import annotations

import numpy as np

from ..core import tracing as trace
from ..core.errors import GradtapeError
from ..core.routes import implements_module_function
from ._complex import complex_rules
from ._util import dtype_of, ndim_of, shape_of, unbroadcast
from .linalg import (
    _coinciding,
    _columns,
    _diag_embed,
    _eigh_jvp,
    _eigh_vjp_all,
    _hermitian_fold,
    _hermitian_read,
    _im,
    _inverse_gaps,
    _lapack,
    _mT,
    _nonzero_to_rounding,
    _operand,
    _poison,
    _primitive,
    _re,
    _real_dtype,
    _refuse_complex,
    _solve_dtype,
    _spread_within_blocks,
    _stacked,
    _tri,
    eig_p,
    lu_factors_p,
    lu_solve_p,
    triangular_solve,
)
from .stop import stop_gradient

_installed = False


def _original(name: str):
    """SciPy's own function (what the wrapper calls for plain arrays)."""
    import scipy.linalg

    f = getattr(scipy.linalg, name)
    return getattr(f, "__gradtape_original__", f)


def _vector_rhs(b):
    """A right-hand side as a stack of matrices, and whether it was a vector."""
    vector = ndim_of(b) == 1
    return (np.expand_dims(b, -1) if vector else b), vector


def _unvector(x, vector: bool):
    return np.reshape(x, shape_of(x)[:-1]) if vector else x


def _trans_code(trans) -> int:
    codes = {0: 0, 1: 1, 2: 2, "N": 0, "T": 1, "C": 2}
    if trans not in codes:
        raise ValueError("Incorrect trans argument")
    return min(codes[trans], 1)  # real matrices: the conjugate transpose is the transpose


def _real_square(a, what: str):
    _refuse_complex(f"scipy.linalg.{what}", a)
    return _square(a)


def _square(a):
    a = _operand(a)
    if ndim_of(a) < 2 or shape_of(a)[-1] != shape_of(a)[-2]:
        raise ValueError("expected square matrix")
    return a


# --- cholesky, cho_factor, cho_solve --------------------------------------------------------------
def cholesky(a, lower=False, overwrite_a=False, check_finite=True):
    """The factor alone (the other triangle zero): NumPy's cholesky rule (real symmetric or
    complex Hermitian a, read from the triangle SciPy reads)."""
    return np.linalg.cholesky(_square(a), upper=not lower)


def cho_factor(a, lower=False, overwrite_a=False, check_finite=True):
    """(c, lower): the factor in one triangle; the other keeps a's entries, as LAPACK leaves
    them (their derivative is the identity; cho_solve does not read them)."""
    a = _real_square(a, "cho_factor")
    n = shape_of(a)[-1]
    factor = np.linalg.cholesky(a, upper=not lower)
    return factor + a * _tri(n, dtype_of(a), not lower, k=1), lower


def _potrs_raw(c, b, lower):
    dt = np.result_type(c, b)
    if c.ndim > 2 and dt.kind == "f" and _substitution_pays(c.shape):
        return _stacked_cholesky_solve(np.asarray(c, dt), np.asarray(b, dt), lower)
    (potrs,) = _lapack(("potrs",), dt)
    if c.ndim == 2:  # one factor: every right-hand side of the stack in one call
        flat, undo = _columns(np.asarray(b, dt), c.shape[-1])
        x, info = potrs(np.asarray(c, dt), flat, lower=lower)
        return undo(x)
    shape = np.broadcast_shapes(c.shape[:-2], b.shape[:-2])
    c_b = np.broadcast_to(c, shape + c.shape[-2:])
    b_b = np.broadcast_to(b, shape + b.shape[-2:])
    out = np.empty(shape + b.shape[-2:], dt)
    for i in np.ndindex(shape):
        out[i] = _potrs_raw(c_b[i], b_b[i], lower)
    return out


def _substitution_pays(shape: tuple) -> bool:
    """Whether a stack of factors is solved faster by 2n substitution steps over the whole
    stack than by one LAPACK call per matrix: a step costs about as much as two calls
    (measured: 100 factors of order 5, 4x faster; 1000 of order 3, 30x; 10 of order 16,
    5x slower), so the stack must hold at least 4n matrices."""
    n, count = shape[-1], int(np.prod(shape[:-2]))
    return 0 < n <= 64 and count >= 4 * n


def _stacked_cholesky_solve(c, b, lower):
    """x = A^-1 b for a stack of factors (A = L L^T, or U^T U = L L^T with L = U^T) read
    from one triangle of c: the forward substitution L y = b and the backward one L^T x = y
    that LAPACK's potrs does for each matrix (column-oriented, as the reference trsm), each
    step done for every matrix of the stack at once. Equal to potrs to rounding."""
    low = c if lower else np.swapaxes(c, -1, -2)
    shape = np.broadcast_shapes(c.shape[:-2], b.shape[:-2])
    x = np.array(np.broadcast_to(b, shape + b.shape[-2:]))
    low = np.broadcast_to(low, shape + low.shape[-2:])
    n = low.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore"):  # potrs does not check either
        for j in range(n):
            x[..., j, :] /= low[..., j, j, None]
            x[..., j + 1 :, :] -= low[..., j + 1 :, j, None] * x[..., j : j + 1, :]
        for j in range(n - 1, -1, -1):
            x[..., j, :] /= low[..., j, j, None]
            x[..., :j, :] -= low[..., j, :j, None] * x[..., j : j + 1, :]
    return x


def _factor_of(c, lower: bool):
    """The triangle of c that cho_solve reads."""
    return c * _tri(shape_of(c)[-1], dtype_of(c), lower)


def _cho_solve_vjp_all(g, ans, args, params, invars):
    c, b = args
    lower = params["lower"]
    gb = cho_solve_p.impl(c, g, lower=lower)
    gc = None
    if invars[0] is not None:
        # A = L L^T (or U^T U): Abar = -gb x^T, Lbar = (Abar + Abar^T) L, on L's triangle
        abar = -np.matmul(gb, _mT(ans))
        sym = abar + _mT(abar)
        f = _factor_of(c, lower)
        gc = np.matmul(sym, f) if lower else np.matmul(f, sym)
        gc = unbroadcast(gc * _tri(shape_of(c)[-1], dtype_of(c), lower), shape_of(c))
    return gc, (None if invars[1] is None else unbroadcast(gb, shape_of(b)))


def _cho_solve_jvp(ts, ans, c, b, lower):
    tc, tb = ts
    rhs = None if tb is None else _stacked(tb, b, ndim_of(ans) - 2)
    if tc is not None:
        f, df = _factor_of(c, lower), _stacked(_factor_of(tc, lower), c, ndim_of(ans) - 2)
        # dA x = (dL L^T + L dL^T) x (lower), (dU^T U + U^T dU) x (upper)
        if lower:
            da_x = np.matmul(df, np.matmul(_mT(f), ans)) + np.matmul(f, np.matmul(_mT(df), ans))
        else:
            da_x = np.matmul(_mT(df), np.matmul(f, ans)) + np.matmul(_mT(f), np.matmul(df, ans))
        rhs = -da_x if rhs is None else rhs - da_x
    return cho_solve_p.impl(c, rhs, lower=lower)


# x = A^-1 b with A = L L^T (lower) or U^T U, the factor read from one triangle of c
cho_solve_p = _primitive("cho_solve", _potrs_raw, jvp=_cho_solve_jvp, jvp_batched=True)
cho_solve_p.vjp_all = _cho_solve_vjp_all


def cho_solve(c_and_lower, b, overwrite_b=False, check_finite=True):
    """Solve with the factor of cho_factor; the backward pass solves with the same factor."""
    c, lower = c_and_lower
    c, b = _operand(c), _operand(b)
    _refuse_complex("scipy.linalg.cho_solve", c, b)
    bm, vector = _vector_rhs(b)
    if shape_of(c)[-1] != shape_of(c)[-2] or shape_of(bm)[-2] != shape_of(c)[-1]:
        raise ValueError(f"incompatible dimensions ({shape_of(c)} and {shape_of(b)})")
    dt = _solve_dtype(c, b)
    c, bm = (x if dtype_of(x) == dt else x.astype(dt) for x in (c, bm))
    return _unvector(cho_solve_p.impl(c, bm, lower=bool(lower)), vector)


# --- solve_triangular ----------------------------------------------------------------------------
def solve_triangular(
    a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False, check_finite=True
):
    """One triangular solve (LAPACK trtrs); its backward pass is one more, with op(a)^T."""
    a, b = _operand(a), _operand(b)
    _refuse_complex("scipy.linalg.solve_triangular", a, b)
    if ndim_of(a) < 2 or shape_of(a)[-1] != shape_of(a)[-2]:
        raise ValueError("expected square matrix")
    n = shape_of(a)[-1]
    if shape_of(b)[-1 if ndim_of(b) == 1 else -2] != n:
        raise ValueError(f"shapes of a {shape_of(a)} and b {shape_of(b)} are incompatible")
    dt = _solve_dtype(a, b)
    a, b = (x if dtype_of(x) == dt else x.astype(dt) for x in (a, b))
    return triangular_solve(
        a, b, lower=bool(lower), trans=_trans_code(trans), unit=bool(unit_diagonal)
    )


# --- LU: lu_factor, lu_solve, lu ------------------------------------------------------------------
def _getrf_raw(a):
    """Packed LU factors and LAPACK's pivots of each matrix of a stack (any m x n)."""
    (getrf,) = _lapack(("getrf",), a.dtype)
    if a.ndim == 2:
        lu, piv, info = getrf(a)
        if info < 0:
            raise ValueError(f"illegal value in {-info}th argument of internal getrf (lu_factor)")
        return lu, piv
    lus = np.empty(a.shape, a.dtype)
    pivs = np.empty(a.shape[:-2] + (min(a.shape[-2:]),), np.int32)
    for i in np.ndindex(a.shape[:-2]):
        lus[i], pivs[i] = _getrf_raw(a[i])
    return lus, pivs


def _permutation_raw(piv, m):
    """perm with a[perm] = L U, from LAPACK's row interchanges."""
    perm = np.broadcast_to(np.arange(m), piv.shape[:-1] + (m,)).copy()
    for idx in np.ndindex(piv.shape[:-1]):
        p = perm[idx]
        for i, j in enumerate(piv[idx]):
            p[i], p[j] = p[j], p[i]
    return perm


_permutation_p = _primitive("lu_permutation", _permutation_raw, nondiff=True)


def _rows(x, perm):
    """x[perm] for each matrix of a stack (perm: (..., m) row indices; x may have extra
    leading axes)."""
    idx = np.expand_dims(perm, -1)
    extra = ndim_of(x) - ndim_of(idx)
    if extra:
        idx = np.reshape(idx, (1,) * extra + shape_of(idx))
    # spelled out to x's shape: gradtape's take_along_axis does not broadcast the indices
    idx = np.broadcast_to(
        idx, np.broadcast_shapes(shape_of(x)[:-1], shape_of(idx)[:-1]) + shape_of(x)[-1:]
    )
    return np.take_along_axis(x, idx, axis=-2)


def _lu_parts(lu):
    """L (m x m, unit lower) and U (n x n, upper) of packed m x n factors, padded with the
    identity as JAX pads them, so that both are square and invertible."""
    m, n = shape_of(lu)[-2:]
    k = min(m, n)
    dt = _real_dtype(dtype_of(lu))
    low = lu[..., :, :k] * _tri(m, dt, True, k=1)[:, :k]
    if m > k:
        low = np.concatenate([low, np.zeros(shape_of(lu)[:-2] + (m, m - k), dtype_of(lu))], -1)
    low = low + np.eye(m, dtype=dt)
    up = lu[..., :k, :] * _tri(n, dt, False)[:k]
    if n > k:
        pad = np.concatenate([np.zeros((n - k, k), dt), np.eye(n - k, dtype=dt)], axis=-1)
        up = np.concatenate([up, np.broadcast_to(pad, shape_of(lu)[:-2] + pad.shape)], -2)
    return low, up


def _lu_masks(m: int, n: int, dt):
    """The strictly lower and the upper part of an m x n matrix."""
    strict = np.tri(m, n, -1, dtype=dt)
    return strict, 1 - strict


def _lu_jvp(ts, ans, a):
    # X = L^-1 P^T dA U^-1; dL = L tril(X, -1), dU = triu(X) U (De Hoog et al.; JAX's rule)
    lu, piv = ans
    m, n = shape_of(lu)[-2:]
    low, up = _lu_parts(lu)
    strict, upper = _lu_masks(m, n, _real_dtype(dtype_of(lu)))
    la = triangular_solve(low, _rows(ts[0], _permutation_p.impl(piv, m)), lower=True, unit=True)
    x = _mT(triangular_solve(up, _mT(la), lower=False, trans=1))
    return np.matmul(low, x * strict) + np.matmul(x * upper, up), None


def _lu_vjp_all(g, ans, args, params, invars):
    (lu, piv), g_lu = ans, g[0]
    m, n = shape_of(lu)[-2:]
    low, up = _lu_parts(lu)
    strict, upper = _lu_masks(m, n, _real_dtype(dtype_of(lu)))
    x_bar = np.matmul(_mT(low), g_lu) * strict + np.matmul(g_lu, _mT(up)) * upper
    la_bar = _mT(triangular_solve(up, _mT(x_bar), lower=False, trans=0))  # . U^-T
    perm_bar = triangular_solve(low, la_bar, lower=True, trans=1, unit=True)  # L^-T .
    inverse = np.argsort(_permutation_p.impl(piv, m), axis=-1)
    return (_rows(perm_bar, inverse),)


# packed LU factors with partial pivoting, (lu, piv) as LAPACK's getrf gives them (any m x n)
lu_p = _primitive("lu", _getrf_raw, jvp=_lu_jvp, multiple_results=True, jvp_batched=True)
lu_p.vjp_all = _lu_vjp_all


def lu_factor(a, overwrite_a=False, check_finite=True):
    """(lu, piv) as SciPy returns them; derivatives of the packed factors (pivots fixed)."""
    a = _operand(a)
    _refuse_complex("scipy.linalg.lu_factor", a)
    if ndim_of(a) != 2:
        raise GradtapeError(
            "scipy.linalg.lu_factor of a stack of matrices: SciPy itself does "
            "not return one; use scipy.linalg.lu."
        )
    if dtype_of(a).kind != "f":
        a = a.astype(np.float64)
    return tuple(lu_p.impl(a))


def _getrs_raw(lu, piv, b, trans):
    (getrs,) = _lapack(("getrs",), lu.dtype)
    flat, undo = _columns(np.asarray(b, lu.dtype), lu.shape[-1])
    x, info = getrs(lu, piv, flat, trans=trans)
    return undo(x)


def _lu_solve_factors_vjp_all(g, ans, args, params, invars):
    lu, piv, b = args
    trans = params["trans"]
    gb = lu_solve_factors_p.impl(lu, piv, g, trans=1 - trans)
    g_lu = None
    if invars[0] is not None:
        # A = P L U; Abar = -gb x^T (transposed for trans): Lbar = tril(P^T Abar U^T, -1),
        # Ubar = triu(L^T P^T Abar)
        abar = -np.matmul(gb, _mT(ans)) if trans == 0 else -np.matmul(ans, _mT(gb))
        n = shape_of(lu)[-1]
        low, up = _lu_parts(lu)
        pa = _rows(unbroadcast(abar, shape_of(lu)), _permutation_p.impl(piv, n))
        dt = _real_dtype(dtype_of(lu))
        g_lu = np.matmul(pa, _mT(up)) * _tri(n, dt, True, k=1) + np.matmul(_mT(low), pa) * _tri(
            n, dt, False
        )
    return g_lu, None, (None if invars[2] is None else unbroadcast(gb, shape_of(b)))


def _lu_solve_factors_jvp(ts, ans, lu, piv, b, trans):
    t_lu, _, tb = ts
    rhs = None if tb is None else _stacked(tb, b, ndim_of(ans) - 2)
    if t_lu is not None:
        n = shape_of(lu)[-1]
        dt = _real_dtype(dtype_of(lu))
        low, up = _lu_parts(lu)
        dl = _stacked(t_lu * _tri(n, dt, True, k=1), lu, ndim_of(ans) - 2)
        du = _stacked(t_lu * _tri(n, dt, False), lu, ndim_of(ans) - 2)
        inverse = np.argsort(_permutation_p.impl(piv, n), axis=-1)
        if trans == 0:  # dA x = P (dL (U x) + L (dU x))
            da_x = _rows(
                np.matmul(dl, np.matmul(up, ans)) + np.matmul(low, np.matmul(du, ans)), inverse
            )
        else:  # dA^T x = U^T dL^T P^T x + dU^T L^T P^T x
            px = _rows(ans, _permutation_p.impl(piv, n))
            da_x = np.matmul(_mT(up), np.matmul(_mT(dl), px)) + np.matmul(
                _mT(du), np.matmul(_mT(low), px)
            )
        rhs = -da_x if rhs is None else rhs - da_x
    return lu_solve_factors_p.impl(lu, piv, rhs, trans=trans)


lu_solve_factors_p = _primitive(
    "lu_solve_factors", _getrs_raw, jvp=_lu_solve_factors_jvp, jvp_batched=True
)
lu_solve_factors_p.vjp_all = _lu_solve_factors_vjp_all


def lu_solve(lu_and_piv, b, trans=0, overwrite_b=False, check_finite=True):
    """Solve with the factors of lu_factor; the backward pass solves with the same factors."""
    lu, piv = lu_and_piv
    lu, b = _operand(lu), _operand(b)
    _refuse_complex("scipy.linalg.lu_solve", lu, b)
    bm, vector = _vector_rhs(b)
    if shape_of(bm)[-2] != shape_of(lu)[-1]:
        raise ValueError(f"Shapes of lu {shape_of(lu)} and b {shape_of(b)} are incompatible")
    dt = _solve_dtype(lu, b)
    lu, bm = (x if dtype_of(x) == dt else x.astype(dt) for x in (lu, bm))
    return _unvector(lu_solve_factors_p.impl(lu, piv, bm, trans=_trans_code(trans)), vector)


def lu(a, permute_l=False, overwrite_a=False, check_finite=True, p_indices=False):
    """P, L, U (or P L, U; or the row indices of P) from the packed factors of lu_p."""
    a = _operand(a)
    _refuse_complex("scipy.linalg.lu", a)
    if dtype_of(a).kind != "f":
        a = a.astype(np.float64)
    m, n = shape_of(a)[-2:]
    k = min(m, n)
    packed, piv = lu_p.impl(a)
    dt = _real_dtype(dtype_of(a))
    low = packed[..., :, :k] * _tri(m, dt, True, k=1)[:, :k] + np.eye(m, k, dtype=dt)
    up = packed[..., :k, :] * _tri(max(m, n), dt, False)[:k, :n]
    inverse = np.argsort(_permutation_p.impl(piv, m), axis=-1)
    if permute_l:
        return _rows(low, inverse), up
    if p_indices:
        return inverse, low, up
    # P[i, j] = (inverse[i] == j): elementwise in the row indices, so a batch of them
    # (vmap) gives each member its own permutation
    rows = stop_gradient(np.expand_dims(inverse, -1))
    return (rows == np.arange(m)).astype(dt), low, up


# --- solve, inv, det ----------------------------------------------------------------------------
def _potrf_raw(a, lower):
    (potrf,) = _lapack(("potrf",), a.dtype)
    if a.ndim == 2:
        c, info = potrf(a, lower=lower, clean=False)
        if info > 0:
            raise np.linalg.LinAlgError("Matrix is singular or not positive definite.")
        return c
    out = np.empty(a.shape, a.dtype)
    for i in np.ndindex(a.shape[:-2]):
        out[i] = _potrf_raw(a[i], lower)
    return out


# the Cholesky factor of a symmetric positive definite solve: a constant to the rules below
_cho_factors_p = _primitive("cho_factors", _potrf_raw, nondiff=True)


def _pos_solve_vjp_all(g, ans, args, params, invars):
    a, c, b = args
    lower = params["lower"]
    gb = _pos_solve_p.impl(a, c, g, lower=lower)
    ga = None
    if invars[0] is not None:
        ga = unbroadcast(_hermitian_fold(-np.matmul(gb, _mT(ans)), lower), shape_of(a))
    return ga, None, (None if invars[2] is None else unbroadcast(gb, shape_of(b)))


def _pos_solve_jvp(ts, ans, a, c, b, lower):
    ta, _, tb = ts
    rhs = None if tb is None else _stacked(tb, b, ndim_of(ans) - 2)
    if ta is not None:
        da = _stacked(_hermitian_read(ta, lower), a, ndim_of(ans) - 2)
        rhs = -np.matmul(da, ans) if rhs is None else rhs - np.matmul(da, ans)
    return _pos_solve_p.impl(a, c, rhs, lower=lower)


# x = S^-1 b, S the symmetric matrix read from one triangle of a, c its Cholesky factor
_pos_solve_p = _primitive(
    "pos_solve",
    lambda a, c, b, lower: _potrs_raw(c, b, lower),
    jvp=_pos_solve_jvp,
    jvp_batched=True,
)
_pos_solve_p.vjp_all = _pos_solve_vjp_all

_ASSUME = {
    None: "gen",
    "gen": "gen",
    "general": "gen",
    "sym": "sym",
    "symmetric": "sym",
    "her": "sym",
    "hermitian": "sym",
    "pos": "pos",
    "positive definite": "pos",
    "diagonal": "diagonal",
    "tridiagonal": "tridiagonal",
    "upper triangular": "upper",
    "lower triangular": "lower",
}


def _band(n: int, dt, lower: int, upper: int):
    return np.tri(n, n, upper, dtype=dt) * (1 - np.tri(n, n, -lower - 1, dtype=dt))


def _general_solve(a, b, trans: int):
    """a^-1 b (a^-T b): one LU factorization (the LU rules of linalg.py); stacks by NumPy."""
    if ndim_of(a) == 2:
        lu, piv = lu_factors_p.impl(a)
        return lu_solve_p.impl(a, lu, piv, b, trans=trans)
    return np.linalg.solve(_mT(a) if trans else a, b)


def solve(
    a,
    b,
    lower=False,
    overwrite_a=False,
    overwrite_b=False,
    check_finite=True,
    assume_a=None,
    transposed=False,
):
    """assume_a: general (also None: the solution is the same whatever structure SciPy detects),
    'sym'/'her' and 'pos' (one triangle read, as SciPy reads it), the triangular ones,
    'diagonal' and 'tridiagonal' (the entries SciPy reads). 'banded' is refused."""
    a, b = _operand(a), _operand(b)
    _refuse_complex("scipy.linalg.solve", a, b)
    kind = _ASSUME.get(assume_a)
    if kind is None:
        raise GradtapeError(
            f"scipy.linalg.solve(assume_a={assume_a!r}) has no derivative rule; "
            "use 'general', 'sym', 'pos', a triangular one, 'diagonal' or "
            "'tridiagonal'."
        )
    if ndim_of(a) < 2 or shape_of(a)[-1] != shape_of(a)[-2]:
        raise ValueError("Input a needs to be a square matrix.")
    bm, vector = _vector_rhs(b)
    n = shape_of(a)[-1]
    if shape_of(bm)[-2] != n:
        raise ValueError("Input b has to have same number of rows as input a")
    dt = _solve_dtype(a, b)
    a, bm = (x if dtype_of(x) == dt else x.astype(dt) for x in (a, bm))
    trans = int(bool(transposed))
    if kind == "gen":
        x = _general_solve(a, bm, trans)
    elif kind == "sym":  # symmetric: transposing changes nothing
        x = _general_solve(_hermitian_read(a, bool(lower)), bm, 0)
    elif kind == "pos":
        c = _cho_factors_p.impl(a, lower=bool(lower))
        x = _pos_solve_p.impl(a, c, bm, lower=bool(lower))
    elif kind in ("upper", "lower"):
        x = triangular_solve(a, bm, lower=kind == "lower", trans=trans)
    elif kind == "diagonal":
        x = bm / np.expand_dims(np.diagonal(a, axis1=-2, axis2=-1), -1)
    else:  # tridiagonal
        x = _general_solve(a * _band(n, _real_dtype(dt), 1, 1), bm, trans)
    return _unvector(x, vector)


def inv(a, overwrite_a=False, check_finite=True, *, assume_a=None, lower=False):
    """The inverse of the matrix SciPy reads: general, one triangle (sym, pos), a triangle
    (upper/lower triangular) or the diagonal."""
    a = _real_square(a, "inv")
    kind = _ASSUME.get(assume_a)
    n = shape_of(a)[-1]
    if kind in (None, "tridiagonal"):
        raise GradtapeError(f"scipy.linalg.inv(assume_a={assume_a!r}) has no derivative rule.")
    if kind == "sym" or kind == "pos":
        a = _hermitian_read(a, bool(lower))
    elif kind in ("upper", "lower"):
        a = a * _tri(n, dtype_of(a), kind == "lower")
    elif kind == "diagonal":  # SciPy replaces the diagonal by its reciprocal, keeps the rest
        eye = np.eye(n, dtype=_real_dtype(dtype_of(a)))
        return a * (1 - eye) + _diag_embed(1 / np.diagonal(a, axis1=-2, axis2=-1))
    return np.linalg.inv(a)


def det(a, overwrite_a=False, check_finite=True):
    return np.linalg.det(_real_square(a, "det"))


# --- eigh: standard and generalized -------------------------------------------------------------
def _scipy_eigh_raw(a, UPLO, driver):
    w, v = _original("eigh")(a, lower=UPLO == "L", driver=driver)
    return w, v


# the standard problem with SciPy's drivers: the rules of NumPy's eigh
scipy_eigh_p = _primitive(
    "scipy_eigh",
    _scipy_eigh_raw,
    jvp=lambda ts, ans, a, UPLO, driver: _eigh_jvp(ts, ans, a, UPLO),
    multiple_results=True,
    jvp_batched=True,
)
scipy_eigh_p.vjp_all = _eigh_vjp_all


def _eigh_general_raw(a, b, lower, driver):
    w, v = _original("eigh")(a, b, lower=lower, driver=driver)
    return w, v


def _eigh_general_vjp_all(g, ans, args, params, invars):
    """A v = w B v, V^T B V = I: transpose of the JVP below."""
    (w, v), (w_bar, v_bar) = ans, g
    lower = params["lower"]
    pairs = _coinciding(w)
    undefined = np.zeros(shape_of(w)[:-1], bool)
    q_bar = r_bar = 0
    if w_bar is not None:
        q_bar = _diag_embed(w_bar)
        r_bar = _diag_embed(-w * w_bar)
        undefined = undefined | _spread_within_blocks(w_bar, pairs)
    if v_bar is not None:
        k = np.matmul(_mT(v), v_bar)
        gaps = np.expand_dims(w, -2) - np.expand_dims(w, -1)
        fk = _inverse_gaps(gaps, pairs, _nonzero_to_rounding(k - _mT(k), k)) * k
        q_bar = q_bar + fk
        r_bar = (
            r_bar
            - fk * np.expand_dims(w, -2)
            - 0.5 * _diag_embed(np.diagonal(k, axis1=-2, axis2=-1))
        )
    ga = gb = None
    if invars[0] is not None:
        ga = _poison(_hermitian_fold(np.matmul(v, np.matmul(q_bar, _mT(v))), lower), undefined)
    if invars[1] is not None:
        gb = _poison(_hermitian_fold(np.matmul(v, np.matmul(r_bar, _mT(v))), lower), undefined)
    return ga, gb


def _eigh_general_jvp(ts, ans, a, b, lower, driver):
    w, v = ans
    ta, tb = ts
    q = 0 if ta is None else np.matmul(_mT(v), np.matmul(_hermitian_read(ta, lower), v))
    r = 0 if tb is None else np.matmul(_mT(v), np.matmul(_hermitian_read(tb, lower), v))
    qd = 0 if ta is None else np.diagonal(q, axis1=-2, axis2=-1)
    rd = 0 if tb is None else np.diagonal(r, axis1=-2, axis2=-1)
    dw = qd - w * rd
    gaps = np.expand_dims(w, -2) - np.expand_dims(w, -1)
    c = _inverse_gaps(gaps, _coinciding(w)) * (q - np.expand_dims(w, -2) * r)
    if tb is not None:
        c = c - 0.5 * _diag_embed(rd)
    return dw, np.matmul(v, c)


scipy_eigh_general_p = _primitive(
    "scipy_eigh_general",
    _eigh_general_raw,
    jvp=_eigh_general_jvp,
    multiple_results=True,
    jvp_batched=True,
)
scipy_eigh_general_p.vjp_all = _eigh_general_vjp_all


def _subset_signs_raw(a, v, b=None, *, lower, index):
    """+-1 per column of v: the sign that makes it SciPy's eigenvector of that subset."""
    import scipy.linalg

    _, expected = scipy.linalg.eigh(a, b, lower=lower, subset_by_index=list(index))
    return np.where(np.sum(v * expected, axis=0) < 0, -1.0, 1.0)


_subset_signs_p = _primitive("eigh_subset_signs", _subset_signs_raw, nondiff=True)


def eigh(
    a,
    b=None,
    *,
    lower=True,
    eigvals_only=False,
    overwrite_a=False,
    overwrite_b=False,
    type=1,
    check_finite=True,
    subset_by_index=None,
    subset_by_value=None,
    driver=None,
):
    """Standard and generalized (type 1) symmetric problems; one triangle of each matrix read.
    A subset (by index, or by value in (lo, hi]) is selected from all of them, as SciPy's."""
    a = _real_square(a, "eigh")
    if subset_by_index is not None or subset_by_value is not None:
        if subset_by_index is not None and subset_by_value is not None:
            raise ValueError("Either index or value subset can be requested.")
        w, v = eigh(a, b, lower=lower, type=type, driver=None)
        if subset_by_index is not None:
            first, last = (int(i) for i in subset_by_index)
            if not 0 <= first <= last < shape_of(w)[-1]:
                raise ValueError(f"Requested eigenvalue indices are not valid: {subset_by_index}")
        else:
            lo, hi = subset_by_value
            inside = np.flatnonzero((w > lo) & (w <= hi))  # (guards: the recorded selection)
            if len(inside) == 0:
                empty = w[:0]
                return empty if eigvals_only else (empty, v[:, :0])
            first, last = int(inside[0]), int(inside[-1])
        w, v = w[first : last + 1], v[:, first : last + 1]
        if eigvals_only:
            return w
        # SciPy computes a subset with another LAPACK driver, whose eigenvectors may have the
        # other sign: take SciPy's (a sign per vector is locally constant: no derivative)
        signs = _subset_signs_p.impl(a, v, b, lower=bool(lower), index=(first, last))
        return w, v * signs
    if b is None:
        w, v = scipy_eigh_p.impl(a, UPLO="L" if lower else "U", driver=driver)
    else:
        b = _real_square(b, "eigh")
        if type != 1:
            raise GradtapeError(
                f"scipy.linalg.eigh(type={type}) has no derivative rule; type 1 (a v = w b v) has."
            )
        w, v = scipy_eigh_general_p.impl(a, b, lower=bool(lower), driver=driver)
    return w if eigvals_only else (w, v)


def eigvalsh(
    a,
    b=None,
    *,
    lower=True,
    overwrite_a=False,
    overwrite_b=False,
    type=1,
    check_finite=True,
    subset_by_index=None,
    subset_by_value=None,
    driver=None,
):
    return eigh(
        a,
        b,
        lower=lower,
        eigvals_only=True,
        type=type,
        subset_by_index=subset_by_index,
        subset_by_value=subset_by_value,
        driver=driver,
    )


# --- matrix functions: expm, sqrtm, logm (Frechet derivatives by the block identity), funm --------
def _block(a, e):
    """[[a, e], [0, a]] for stacks of matrices (e may carry extra leading axes)."""
    lead = np.broadcast_shapes(shape_of(a)[:-2], shape_of(e)[:-2])
    a = np.broadcast_to(a, lead + shape_of(a)[-2:])
    e = np.broadcast_to(e, lead + shape_of(e)[-2:])
    top = np.concatenate([a, e], axis=-1)
    bottom = np.concatenate([np.zeros_like(a), a], axis=-1)
    return np.concatenate([top, bottom], axis=-2)


def _frechet(prim, a, e):
    """The Frechet derivative L_f(a, e) = f([[a, e], [0, a]])[:n, n:]."""
    n = shape_of(a)[-1]
    return prim.impl(_block(a, e))[..., :n, n:]


def _expm_frechet(a, e):
    """L_exp(a, e): SciPy's expm_frechet on concrete matrices, the block identity on Tracers."""
    if type(a) is trace.Tracer or type(e) is trace.Tracer:
        return _frechet(expm_p, a, e)
    if a.ndim != 2 or e.ndim != 2:
        shape = np.broadcast_shapes(a.shape[:-2], e.shape[:-2])
        a_b = np.broadcast_to(a, shape + a.shape[-2:])
        e_b = np.broadcast_to(e, shape + e.shape[-2:])
        out = np.empty(shape + e.shape[-2:], np.result_type(a, e))
        for i in np.ndindex(shape):
            out[i] = _expm_frechet(a_b[i], e_b[i])
        return out
    from scipy.linalg import expm_frechet

    return expm_frechet(a, e, compute_expm=False, check_finite=False)


def _matrix_function(name: str, frechet=None):
    """A primary matrix function f of SciPy's: its JVP is L_f(A, dA) and its VJP L_f(A^T, G)
    (f(A^T) = f(A)^T), with L_f from `frechet` or from the block identity."""

    def raw(a):
        out = _original(name)(a)
        if np.iscomplexobj(out) and not np.iscomplexobj(a):
            raise GradtapeError(
                f"scipy.linalg.{name} of this real matrix is complex (negative "
                "real eigenvalues): gradtape differentiates real results only."
            )
        return out

    def derivative(a, e):
        return frechet(a, e) if frechet is not None else _frechet(prim, a, e)

    prim = _primitive(
        name,
        raw,
        vjps=(lambda g, ans, a: derivative(_mT(a), g),),
        jvp=lambda ts, ans, a: derivative(a, ts[0]),
    )
    return prim


expm_p = _matrix_function("expm", frechet=_expm_frechet)
sqrtm_p = _matrix_function("sqrtm")
logm_p = _matrix_function("logm")


def expm(A):
    """exp(A) (SciPy's value); its derivatives are Frechet derivatives of exp at A and A^T."""
    a = _operand(A)
    if ndim_of(a) < 2 or shape_of(a)[-1] != shape_of(a)[-2]:
        raise ValueError("expected a square matrix")
    return expm_p.impl(a)


def sqrtm(A, disp=True, blocksize=64):
    return sqrtm_p.impl(_real_square(A, "sqrtm"))


def logm(A, disp=True):
    return logm_p.impl(_real_square(A, "logm"))


def funm(A, func, disp=True):
    """V func(w) V^-1 from the eigendecomposition (distinct eigenvalues: the derivative is that
    of eig); real when A is real and the result's imaginary part is rounding, as SciPy makes it."""
    a = _real_square(A, "funm")
    if not disp:
        raise GradtapeError(
            "scipy.linalg.funm(..., disp=False) (the error estimate) is not "
            "supported on traced values; use disp=True."
        )
    w, v = eig_p.impl(a)
    fw = func(w)
    f = np.matmul(v * np.expand_dims(fw, -2), np.linalg.inv(v))
    # SciPy keeps the real part when the imaginary one is within 1e6 eps (1e3 for float32)
    eps = np.finfo(_real_dtype(dtype_of(a))).eps
    tol = eps * (1e3 if _real_dtype(dtype_of(a)) == np.float32 else 1e6)
    if bool(np.all(np.abs(stop_gradient(_im(f))) <= tol)):
        return _re(f)
    raise GradtapeError(
        "scipy.linalg.funm of this real matrix is complex: gradtape "
        "differentiates real results only."
    )


# --- matrix equations -----------------------------------------------------------------------------
def _sylvester_vjp_all(g, ans, args, params, invars):
    a, b, q = args
    y = sylvester_p.impl(_mT(a), _mT(b), g)
    return (
        None if invars[0] is None else unbroadcast(-np.matmul(y, _mT(ans)), shape_of(a)),
        None if invars[1] is None else unbroadcast(-np.matmul(_mT(ans), y), shape_of(b)),
        None if invars[2] is None else unbroadcast(y, shape_of(q)),
    )


def _sylvester_jvp(ts, ans, a, b, q):
    ta, tb, tq = ts
    rhs = 0 if tq is None else tq
    if ta is not None:
        rhs = rhs - np.matmul(ta, ans)
    if tb is not None:
        rhs = rhs - np.matmul(ans, tb)
    return sylvester_p.impl(a, b, rhs)


# A X + X B = Q
sylvester_p = _primitive(
    "solve_sylvester", lambda a, b, q: _original("solve_sylvester")(a, b, q), jvp=_sylvester_jvp
)
sylvester_p.vjp_all = _sylvester_vjp_all


def solve_sylvester(a, b, q):
    """A X + X B = Q; derivatives solve the same equation (with A^T, B^T for the gradient)."""
    a, b, q = _real_square(a, "solve_sylvester"), _real_square(b, "solve_sylvester"), _operand(q)
    _refuse_complex("scipy.linalg.solve_sylvester", q)
    return sylvester_p.impl(a, b, q)


def _clyap_vjp_all(g, ans, args, params, invars):
    a, q = args
    y = clyap_p.impl(_mT(a), g)
    ga = None if invars[0] is None else -(np.matmul(y, _mT(ans)) + np.matmul(_mT(y), ans))
    return (
        None if ga is None else unbroadcast(ga, shape_of(a)),
        None if invars[1] is None else unbroadcast(y, shape_of(q)),
    )


def _clyap_jvp(ts, ans, a, q):
    ta, tq = ts
    rhs = 0 if tq is None else tq
    if ta is not None:
        rhs = rhs - np.matmul(ta, ans) - np.matmul(ans, _mT(ta))
    return clyap_p.impl(a, rhs)


# A X + X A^T = Q
clyap_p = _primitive(
    "solve_continuous_lyapunov",
    lambda a, q: _original("solve_continuous_lyapunov")(a, q),
    jvp=_clyap_jvp,
)
clyap_p.vjp_all = _clyap_vjp_all


def solve_continuous_lyapunov(a, q):
    a = _real_square(a, "solve_continuous_lyapunov")
    q = _operand(q)
    _refuse_complex("scipy.linalg.solve_continuous_lyapunov", q)
    return clyap_p.impl(a, q)


def _dlyap_vjp_all(g, ans, args, params, invars):
    a, q = args
    c = dlyap_p.impl(_mT(a), g, method=params["method"])
    ga = None
    if invars[0] is not None:
        ga = np.matmul(c, np.matmul(a, _mT(ans))) + np.matmul(_mT(c), np.matmul(a, ans))
        ga = unbroadcast(ga, shape_of(a))
    return ga, (None if invars[1] is None else unbroadcast(c, shape_of(q)))


def _dlyap_jvp(ts, ans, a, q, method):
    ta, tq = ts
    rhs = 0 if tq is None else tq
    if ta is not None:
        rhs = rhs + np.matmul(ta, np.matmul(ans, _mT(a))) + np.matmul(a, np.matmul(ans, _mT(ta)))
    return dlyap_p.impl(a, rhs, method=method)


# A X A^T - X + Q = 0
dlyap_p = _primitive(
    "solve_discrete_lyapunov",
    lambda a, q, method: _original("solve_discrete_lyapunov")(a, q, method),
    jvp=_dlyap_jvp,
)
dlyap_p.vjp_all = _dlyap_vjp_all


def solve_discrete_lyapunov(a, q, method=None):
    a = _real_square(a, "solve_discrete_lyapunov")
    q = _operand(q)
    _refuse_complex("scipy.linalg.solve_discrete_lyapunov", q)
    return dlyap_p.impl(a, q, method=method)


# --- solve_banded ---------------------------------------------------------------------------------
def _band_index(n: int, nl: int, nu: int):
    """Row index i = j + d - nu of entry (d, j) of the diagonal-ordered form, and whether it is
    inside the matrix."""
    d = np.arange(nl + nu + 1).reshape(-1, 1)
    i = np.arange(n).reshape(1, -1) + d - nu
    valid = (i >= 0) & (i < n)
    return np.clip(i, 0, max(n - 1, 0)), valid


def _banded_times(ab, x, nl: int, nu: int):
    """A x for the banded A stored as ab (nl + nu + 1, n); x (..., n, k)."""
    n = shape_of(ab)[-1]
    _, valid = _band_index(n, nl, nu)
    # (A x)[i] = sum_d ab[d, j] x[j], i = j + d - nu: scatter each diagonal's products
    prods = np.expand_dims(ab * valid, -1) * np.expand_dims(x, -3)  # (..., d, n, k)
    out = 0
    for d in range(nl + nu + 1):
        shift = d - nu
        piece = prods[..., d, :, :]
        if shift > 0:
            piece = np.concatenate(
                [np.zeros_like(piece[..., :shift, :]), piece[..., : n - shift, :]], axis=-2
            )
        elif shift < 0:
            piece = np.concatenate(
                [piece[..., -shift:, :], np.zeros_like(piece[..., :-shift, :])], axis=-2
            )
        out = out + piece
    return out


def _banded_transpose(ab, nl: int, nu: int):
    """The diagonal-ordered form of A^T (nu lower, nl upper diagonals)."""
    n = shape_of(ab)[-1]
    rows = []
    for d2 in range(nl + nu + 1):  # row d2 of A^T's form holds A's diagonal d = nl + nu - d2
        d = nl + nu - d2
        shift = d - nu  # A^T[j, i] = A[i, j] = ab[d, j], stored at column i = j + shift
        row = ab[..., d, :]
        if shift > 0:
            row = np.concatenate([np.zeros_like(row[..., :shift]), row[..., : n - shift]], -1)
        elif shift < 0:
            row = np.concatenate([row[..., -shift:], np.zeros_like(row[..., :-shift])], -1)
        rows.append(row)
    return np.stack(rows, axis=-2)


def _banded_vjp_all(g, ans, args, params, invars):
    ab, b = args
    nl, nu = params["nl"], params["nu"]
    gb = banded_p.impl(_banded_transpose(ab, nl, nu), g, nl=nu, nu=nl)
    gab = None
    if invars[0] is not None:  # Abar = -gb x^T on the band: entry (d, j) is row i = j + d - nu
        n = shape_of(ab)[-1]
        rows, valid = _band_index(n, nl, nu)
        gathered = np.take(gb, rows.ravel(), axis=-2)  # (..., (d * n), k)
        gathered = np.reshape(gathered, shape_of(gb)[:-2] + rows.shape + shape_of(gb)[-1:])
        gab = -np.sum(gathered * np.expand_dims(ans, -3), axis=-1) * valid
        gab = unbroadcast(gab, shape_of(ab))
    return gab, (None if invars[1] is None else unbroadcast(gb, shape_of(b)))


def _banded_jvp(ts, ans, ab, b, nl, nu):
    tab, tb = ts
    rhs = None if tb is None else _stacked(tb, b, ndim_of(ans) - 2)
    if tab is not None:
        da_x = _banded_times(tab, ans, nl, nu)
        rhs = -da_x if rhs is None else rhs - da_x
    return banded_p.impl(ab, rhs, nl=nl, nu=nu)


def _banded_raw(ab, b, nl, nu):
    if b.ndim > 2:
        flat, undo = _columns(b, ab.shape[-1])
        return undo(_banded_raw(ab, flat, nl, nu))
    return _original("solve_banded")((nl, nu), ab, b)


banded_p = _primitive("solve_banded", _banded_raw, jvp=_banded_jvp)
banded_p.vjp_all = _banded_vjp_all


def solve_banded(l_and_u, ab, b, overwrite_ab=False, overwrite_b=False, check_finite=True):
    """The banded matrix in diagonal-ordered form; entries outside the matrix are not read
    (their gradient is zero)."""
    nl, nu = (int(x) for x in l_and_u)
    ab, b = _operand(ab), _operand(b)
    _refuse_complex("scipy.linalg.solve_banded", ab, b)
    if ndim_of(ab) != 2:
        raise GradtapeError(
            "scipy.linalg.solve_banded of a stack of banded matrices has no derivative rule yet."
        )
    if shape_of(ab)[0] != nl + nu + 1:
        raise ValueError(
            f"invalid values for the number of lower and upper diagonals: l+u+1 "
            f"({nl + nu + 1}) does not equal ab.shape[0] ({shape_of(ab)[0]})"
        )
    bm, vector = _vector_rhs(b)
    dt = _solve_dtype(ab, b)
    ab, bm = (x if dtype_of(x) == dt else x.astype(dt) for x in (ab, bm))
    return _unvector(banded_p.impl(ab, bm, nl=nl, nu=nu), vector)


# --- block_diag ---------------------------------------------------------------------------------
def block_diag(*arrs):
    """Blocks padded with zeros and stacked (0-d and 1-d arrays are rows, as in SciPy)."""
    if not arrs:
        return np.empty((1, 0))
    blocks = []
    for a in arrs:
        a = _operand(a)
        if ndim_of(a) > 2:
            raise GradtapeError("scipy.linalg.block_diag of stacks of matrices has no rule yet.")
        blocks.append(np.reshape(a, (1, -1) if ndim_of(a) < 2 else shape_of(a)))
    dt = np.result_type(*[dtype_of(x) for x in blocks])
    total = sum(shape_of(x)[1] for x in blocks)
    rows, col = [], 0
    for x in blocks:
        r, c = shape_of(x)
        rows.append(
            np.pad(x.astype(dt) if dtype_of(x) != dt else x, ((0, 0), (col, total - col - c)))
        )
        col += c
    return np.concatenate(rows, axis=0)


# --- SciPy's names for NumPy's factorizations ---------------------------------------------------
def svd(
    a,
    full_matrices=True,
    compute_uv=True,
    overwrite_a=False,
    check_finite=True,
    lapack_driver="gesdd",
):
    """NumPy's svd rule: SciPy's drivers compute the same factorization."""
    out = np.linalg.svd(_operand(a), full_matrices=full_matrices, compute_uv=compute_uv)
    return tuple(out) if compute_uv else out


def svdvals(a, overwrite_a=False, check_finite=True):
    return np.linalg.svd(_operand(a), compute_uv=False)


_QR_MODES = {"full": "complete", "economic": "reduced", "r": "r"}


def qr(a, overwrite_a=False, lwork=None, mode="full", pivoting=False, check_finite=True):
    """NumPy's qr rule under SciPy's mode names; mode="r" returns (R,) as SciPy does."""
    if pivoting:
        raise GradtapeError(
            "scipy.linalg.qr(pivoting=True) has no derivative rule (the column permutation "
            "changes with the values); use pivoting=False."
        )
    if mode not in _QR_MODES:
        raise GradtapeError(
            f"scipy.linalg.qr(mode={mode!r}) has no derivative rule; use mode='full', "
            "'economic' or 'r'."
        )
    out = np.linalg.qr(_operand(a), mode=_QR_MODES[mode])
    return (out,) if mode == "r" else tuple(out)


def pinv(a, *, atol=None, rtol=None, return_rank=False, check_finite=True):
    """NumPy's pinv rule with SciPy's cutoff: singular values below rtol * the largest (rtol
    max(M, N) eps unless given) are dropped."""
    if return_rank or (atol is not None and atol != 0):
        raise GradtapeError(
            "scipy.linalg.pinv with atol or return_rank has no derivative rule; use rtol."
        )
    a = _operand(a)
    if rtol is None:
        rtol = max(shape_of(a)[-2:]) * np.finfo(_real_dtype(dtype_of(a))).eps
    return np.linalg.pinv(a, rtol=rtol)


def lstsq(
    a,
    b,
    cond=None,
    overwrite_a=False,
    overwrite_b=False,
    check_finite=True,
    lapack_driver=None,
):
    """NumPy's lstsq rule; cond=None is LAPACK's machine-precision cutoff, as in SciPy."""
    a, b = _operand(a), _operand(b)
    if cond is None:
        cond = np.finfo(_real_dtype(dtype_of(a))).eps
    x, residues, rank, s = np.linalg.lstsq(a, b, rcond=cond)
    return x, residues, rank, s


# --- structured matrices: an index table into the given values -----------------------------------
def _vector(v, name: str):
    v = _operand(v)
    if ndim_of(v) > 1:
        raise GradtapeError(
            f"scipy.linalg.{name} of a batch of vectors has no rule; build each matrix from a "
            "1-d vector."
        )
    return np.reshape(v, (-1,))


def toeplitz(c, r=None):
    """T[i, j] = c[i - j] below the diagonal, r[j - i] above (r[0] is ignored)."""
    c = _vector(c, "toeplitz")
    r = np.conjugate(c) if r is None else _vector(r, "toeplitz")
    m, n = shape_of(c)[0], shape_of(r)[0]
    values = np.concatenate((c[::-1], r[1:]))
    return values[(m - 1) - np.arange(m)[:, None] + np.arange(n)[None, :]]


def circulant(c):
    """C[i, j] = c[(i - j) mod n]."""
    c = _vector(c, "circulant")
    n = shape_of(c)[0]
    return c[(np.arange(n)[:, None] - np.arange(n)[None, :]) % n]


def hankel(c, r=None):
    """H[i, j] = c[i + j] within c, then r[i + j - len(c) + 1] (r[0] is ignored)."""
    c = _vector(c, "hankel")
    r = np.zeros_like(c) if r is None else _vector(r, "hankel")
    m, n = shape_of(c)[0], shape_of(r)[0]
    values = np.concatenate((c, r[1:]))
    return values[np.arange(m)[:, None] + np.arange(n)[None, :]]


# --- installation -------------------------------------------------------------------------------
_RULES = {
    f.__name__: f
    for f in (
        cholesky,
        cho_factor,
        cho_solve,
        solve_triangular,
        lu_factor,
        lu_solve,
        lu,
        solve,
        inv,
        det,
        eigh,
        eigvalsh,
        expm,
        sqrtm,
        logm,
        funm,
        solve_sylvester,
        solve_continuous_lyapunov,
        solve_discrete_lyapunov,
        solve_banded,
        block_diag,
        svd,
        svdvals,
        qr,
        pinv,
        lstsq,
        toeplitz,
        circulant,
        hankel,
    )
}


for _name, _traced in _RULES.items():
    implements_module_function("scipy.linalg", _name)(_traced)


# expm follows JAX's convention on complex matrices (tested against JAX); the other rules here
# refuse complex input themselves, with a message naming the function
complex_rules(
    "expm",
    "cho_factors",
    "cho_solve",
    "lu",
    "lu_factors",
    "lu_permutation",
    "lu_solve",
    "lu_solve_factors",
    "pos_solve",
    "scipy_eigh",
    "scipy_eigh_general",
    "solve_banded",
    "solve_continuous_lyapunov",
    "solve_discrete_lyapunov",
    "solve_sylvester",
    "sqrtm",
    "logm",
    "triangular_solve",
)
