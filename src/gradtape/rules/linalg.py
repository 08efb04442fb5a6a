"""Linear algebra: contractions and matrix functions.

Primitives (each with a VJP per argument and a JVP, written with NumPy calls so that they
are traced again for higher derivatives): matmul, einsum, inv, det, slogdet, solve,
cholesky, eigh and qr. Everything else is a composition of them: dot, inner, outer, vdot,
tensordot, multi_dot, eigvalsh, norm. All accept stacks of matrices where NumPy does.

Routines that read one triangle of their input (cholesky, eigh, eigvalsh: the lower one
by default) get the exact derivative of what NumPy computes: the gradient lives on that
triangle (off-diagonal entries count twice, the other triangle gets zero). For symmetric
perturbations this agrees with the symmetric gradients of JAX, autograd and PyTorch.
Eigenvector derivatives divide by eigenvalue gaps: they are infinite for repeated
eigenvalues (eigenvalue-only gradients, e.g. of eigvalsh, stay finite).
"""

from __future__ import annotations

import string
from collections import Counter

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import UFUNCS, implements
from ..core.tracing import bind
from ._util import dtype_of, ndim_of, normalize_axis, shape_of, unbroadcast

# the result types NumPy gives these functions (named tuples in NumPy 2, plain tuples before)
_SlogdetResult = type(np.linalg.slogdet(np.eye(1)))
_EighResult = type(np.linalg.eigh(np.eye(1)))
_QRResult = type(np.linalg.qr(np.eye(1)))


def _named(cls, *items):
    return cls(*items) if cls is not tuple else tuple(items)


def _operand(x):
    return x if hasattr(x, "shape") else np.asarray(x)


def _mT(x):
    """The matrix transpose of a stack of matrices (a view on arrays)."""
    return np.swapaxes(x, -1, -2)


def _tri(n: int, dtype, lower: bool, k: int = 0):
    """The 0/1 mask of the lower (or upper) triangle, `k` diagonals in from the main one."""
    mask = np.tri(n, n, -k, dtype=dtype) if lower else np.tri(n, n, -k, dtype=dtype).T
    return mask


def _phi(x, lower: bool):
    """One triangle of `x` with its diagonal halved."""
    n = shape_of(x)[-1]
    return x * (_tri(n, dtype_of(x), lower) - 0.5 * np.eye(n, dtype=dtype_of(x)))


def _symmetric_read(t, lower: bool):
    """The symmetric matrix a routine reading only one triangle of `t` works with."""
    n = shape_of(t)[-1]
    return t * _tri(n, dtype_of(t), lower) + _mT(t * _tri(n, dtype_of(t), lower, k=1))


def _is_zero(ct) -> bool:
    """A concrete all-zero cotangent (what the reverse interpreter passes for unused outputs)."""
    return isinstance(ct, np.ndarray) and not ct.any()


def _add(x, y):
    return y if x is None else x + y


# --- matmul ---------------------------------------------------------------------------------
def _matvec(m, v):
    """`m (..., p, q) @ v (..., q) -> (..., p)`."""
    if ndim_of(v) == 1:
        return np.matmul(m, v)
    r = np.matmul(m, np.expand_dims(v, -1))
    return np.reshape(r, shape_of(r)[:-1])


def _flat_rows(x):
    """A stack of matrices (..., p, q) as one (N*p, q) matrix (a view of contiguous arrays)."""
    return np.reshape(x, (-1, shape_of(x)[-1]))


def _matmul_vjp_a(g, ans, a, b):
    na, nb = ndim_of(a), ndim_of(b)
    if na == 1 and nb == 1:
        return g * b
    if na == 1:  # g (..., n), b (..., k, n)
        return unbroadcast(_matvec(b, g), shape_of(a))
    if nb == 1:  # g (..., m), b (k,): an outer product shaped like a
        return np.expand_dims(g, -1) * b
    return unbroadcast(np.matmul(g, _mT(b)), shape_of(a))


def _matmul_vjp_b(g, ans, a, b):
    na, nb = ndim_of(a), ndim_of(b)
    if na == 1 and nb == 1:
        return g * a
    if nb == 1:  # g (..., m), a (..., m, k): one matrix-vector product over all rows
        return np.matmul(np.reshape(g, (-1,)), _flat_rows(a))
    if na == 1:  # g (..., n), a (k,): an outer product shaped like b
        return np.expand_dims(a, -1) * np.expand_dims(g, -2)
    if nb == 2 and na > 2:  # batched a times one matrix: fold the batch into the rows
        return np.matmul(_mT(_flat_rows(a)), _flat_rows(g))
    return unbroadcast(np.matmul(_mT(a), g), shape_of(b))


def _matrix_stack(x, primal_ndim: int, left: bool, rank: int):
    """A matmul operand, or its tangent with extra leading (direction) axes, as a stack of
    matrices: a 1-D operand becomes a row (left) or a column (right), as matmul promotes it,
    and the stack axes are padded with ones to `rank`, so extra axes stay in front."""
    shape = shape_of(x)
    lead, core = shape[:len(shape) - primal_ndim], shape[len(shape) - primal_ndim:]
    if primal_ndim == 1:
        core = (1,) + core if left else core + (1,)
    return np.reshape(x, lead + (1,) * (rank - len(core) + 2) + core)


def _matmul_jvp(ts, ans, a, b):
    na, nb = ndim_of(a), ndim_of(b)
    rank = max(na, nb, 2) - 2
    out = None
    for t, left in zip(ts, (True, False)):
        if t is None:
            continue
        nd = na if left else nb
        lead = shape_of(t)[:ndim_of(t) - nd]
        t_stack = _matrix_stack(t, nd, left, rank)
        other = _matrix_stack(b if left else a, nb if left else na, not left, rank)
        prod = np.matmul(t_stack, other) if left else np.matmul(other, t_stack)
        out = _add(out, np.reshape(prod, lead + shape_of(ans)))
    return out


# the JVPs of this file take tangents with extra leading axes (a batch of directions)
matmul_p = Primitive("matmul", np.matmul, vjps=(_matmul_vjp_a, _matmul_vjp_b), jvp=_matmul_jvp,
                     jvp_batched=True)
UFUNCS[np.matmul] = matmul_p  # np.matmul and `@` reach it through __array_ufunc__
implements(np.linalg.matmul)(lambda x1, x2, /: np.matmul(x1, x2))


# --- einsum -----------------------------------------------------------------------------------
def _split(subscripts: str) -> tuple[list[str], str]:
    lhs, out = subscripts.split("->")
    return lhs.split(","), out


def _einsum_impl(*operands, subscripts, optimize):
    return np.einsum(subscripts, *operands, optimize=optimize)


def _einsum_vjp(i, g, ans, *operands, subscripts, optimize):
    ins, out = _split(subscripts)
    others = [k for k in range(len(operands)) if k != i]
    reachable = set(out).union(*(ins[k] for k in others))
    target = "".join(c for c in ins[i] if c in reachable)
    spec = ",".join([out] + [ins[k] for k in others]) + "->" + target
    ct = np.einsum(spec, g, *(operands[k] for k in others), optimize=optimize)
    if target != ins[i]:  # labels summed within operand i alone: broadcast back over them
        shape = shape_of(operands[i])
        kept = tuple(d if c in reachable else 1 for c, d in zip(ins[i], shape))
        ct = np.broadcast_to(np.reshape(ct, kept), shape)
    return ct


def _einsum_jvp(ts, ans, *operands, subscripts, optimize):
    ins, res = _split(subscripts)
    out = None
    for i, t in enumerate(ts):
        if t is not None:  # the ellipsis carries the tangent's extra leading axes, if any
            spec = ",".join("..." + s if k == i else s for k, s in enumerate(ins)) + "->..." + res
            args = operands[:i] + (t,) + operands[i + 1:]
            out = _add(out, np.einsum(spec, *args, optimize=optimize))
    return out


# subscripts: explicit, no ellipsis, no label twice in one operand, one size per label
einsum_p = Primitive("einsum", _einsum_impl, vjps=_einsum_vjp, jvp=_einsum_jvp, variadic=True,
                     jvp_batched=True)


def _sublist_to_str(sub) -> str:
    return "".join("..." if s is Ellipsis else string.ascii_letters[int(s)] for s in sub)


def _einsum_args(args) -> tuple[str, list]:
    """Subscripts and operands from either calling convention of np.einsum."""
    if isinstance(args[0], str):
        return args[0].replace(" ", ""), [_operand(x) for x in args[1:]]
    n = len(args) // 2
    subs = ",".join(_sublist_to_str(s) for s in args[1:2 * n:2])
    if len(args) % 2:
        subs += "->" + _sublist_to_str(args[-1])
    return subs, [_operand(x) for x in args[0:2 * n:2]]


def _take_diagonals(op, sub: str):
    """Resolve labels repeated within one operand (`ii`) by taking the diagonal."""
    for c, n in Counter(sub).items():
        for _ in range(n - 1):
            i = sub.index(c)
            j = sub.index(c, i + 1)
            op = np.diagonal(op, axis1=i, axis2=j)
            sub = sub[:i] + sub[i + 1:j] + sub[j + 1:] + c
    return op, sub


def _normalize_einsum(subs: str, ops: list) -> tuple[str, list]:
    """Explicit subscripts with the ellipsis spelled out, diagonals taken, and size-1 axes that
    broadcast squeezed out of their operands: the form the einsum primitive records."""
    lhs, arrow, out = subs.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ops):
        raise ValueError("more operands provided to einstein sum function than specified in the "
                         "subscripts string" if len(ops) > len(ins) else
                         "fewer operands provided to einstein sum function than specified in the "
                         "subscripts string")
    spare = [c for c in string.ascii_letters if c not in subs]
    n_ell = [ndim_of(op) - (len(s) - 3) if "..." in s else 0 for s, op in zip(ins, ops)]
    ell = "".join(spare[:max(n_ell, default=0)])
    if not arrow:
        counts = Counter("".join(s.replace("...", "") for s in ins))
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1))
    out = out.replace("...", ell)
    ins = [s.replace("...", ell[len(ell) - k:] if k else "") for s, k in zip(ins, n_ell)]
    pairs = [_take_diagonals(op, s) for op, s in zip(ops, ins)]
    sizes: dict = {}
    for op, s in pairs:
        for c, d in zip(s, shape_of(op)):
            if d != 1 or c not in sizes:
                sizes[c] = d
    ops, ins = [], []
    for op, s in pairs:
        shape = shape_of(op)
        keep = [k for k, c in enumerate(s) if shape[k] != 1 or sizes[c] == 1]
        if len(keep) < len(s):
            op = np.reshape(op, tuple(shape[k] for k in keep))
            s = "".join(s[k] for k in keep)
        ops.append(op)
        ins.append(s)
    return ",".join(ins) + "->" + out, ops


@implements(np.einsum)
def einsum(*operands, out=None, optimize=False, dtype=None, order="K", casting="safe"):
    """np.einsum on traced operands: normalized, then recorded as one einsum instruction."""
    if out is not None:
        raise GradtapeError("np.einsum(..., out=...) cannot be traced; assign the result instead.")
    subscripts, ops = _normalize_einsum(*_einsum_args(operands))
    ins, res = _split(subscripts)
    if len(ops) == 1 and sorted(ins[0]) == sorted(res):  # a pure transpose
        r = np.transpose(ops[0], tuple(ins[0].index(c) for c in res))
    else:
        optimize = optimize if isinstance(optimize, (bool, str)) else "greedy"  # not a path
        r = bind(einsum_p, tuple(ops), {"subscripts": subscripts, "optimize": optimize})
    return r if dtype is None else r.astype(dtype)


# --- compositions of matmul: dot, inner, outer, vdot, tensordot, multi_dot ----------------------
@implements(np.tensordot, np.linalg.tensordot)
def tensordot(a, b, axes=2):
    """Transpose and reshape both operands into matrices, then one matmul (as NumPy does)."""
    a, b = _operand(a), _operand(b)
    sa, sb = shape_of(a), shape_of(b)
    if isinstance(axes, (int, np.integer)):
        axes_a, axes_b = list(range(len(sa) - int(axes), len(sa))), list(range(int(axes)))
    else:
        axes_a, axes_b = ([x] if isinstance(x, (int, np.integer)) else list(x) for x in axes)
    axes_a = [int(x) % len(sa) for x in axes_a]
    axes_b = [int(x) % len(sb) for x in axes_b]
    if len(axes_a) != len(axes_b) or any(sa[i] != sb[j] for i, j in zip(axes_a, axes_b)):
        raise ValueError("shape-mismatch for sum")
    free_a = [i for i in range(len(sa)) if i not in axes_a]
    free_b = [i for i in range(len(sb)) if i not in axes_b]
    k = int(np.prod([sa[i] for i in axes_a]))
    a2 = np.reshape(np.transpose(a, free_a + axes_a), (-1, k))
    b2 = np.reshape(np.transpose(b, axes_b + free_b), (k, -1))
    out_shape = tuple(sa[i] for i in free_a) + tuple(sb[i] for i in free_b)
    return np.reshape(np.matmul(a2, b2), out_shape)


@implements(np.dot)
def dot(a, b, out=None):
    if out is not None:
        raise GradtapeError("np.dot(..., out=...) cannot be traced; assign the result instead.")
    a, b = _operand(a), _operand(b)
    if ndim_of(a) == 0 or ndim_of(b) == 0:
        return a * b
    if ndim_of(a) == 1 or ndim_of(b) <= 2:
        return np.matmul(a, b)
    return tensordot(a, b, axes=([-1], [-2]))


@implements(np.inner)
def inner(a, b):
    a, b = _operand(a), _operand(b)
    if ndim_of(a) == 0 or ndim_of(b) == 0:
        return a * b
    if ndim_of(b) == 1:
        return np.matmul(a, b)
    if ndim_of(b) == 2:
        return np.matmul(a, _mT(b))
    return tensordot(a, b, axes=([-1], [-1]))


@implements(np.outer, np.linalg.outer)
def outer(a, b, out=None):
    """A (k, 1) @ (1, n) matmul: its VJP is two matrix-vector products, no (k, n) temporaries."""
    if out is not None:
        raise GradtapeError("np.outer(..., out=...) cannot be traced; assign the result instead.")
    return np.matmul(np.reshape(_operand(a), (-1, 1)), np.reshape(_operand(b), (1, -1)))


@implements(np.vdot)
def vdot(a, b):
    return np.matmul(np.ravel(_operand(a)), np.ravel(_operand(b)))


def _chain_order(dims: list) -> list:
    """Split points of the cheapest parenthesization of a matrix chain (dims: n + 1 sizes)."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = None
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if cost[i][j] is None or c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k
    return split


def _chain_product(arrays: list, split: list, i: int, j: int):
    if i == j:
        return arrays[i]
    k = split[i][j]
    return np.matmul(_chain_product(arrays, split, i, k), _chain_product(arrays, split, k + 1, j))


@implements(np.linalg.multi_dot)
def multi_dot(arrays, *, out=None):
    """A chain of matmuls in the cheapest order (the first and last arrays may be 1-D)."""
    if out is not None:
        raise GradtapeError("multi_dot(..., out=...) cannot be traced; assign the result instead.")
    arrays = [_operand(x) for x in arrays]
    if len(arrays) < 2:
        raise ValueError("Expecting at least two arrays.")
    if len(arrays) == 2:
        return dot(arrays[0], arrays[1])
    first_1d, last_1d = ndim_of(arrays[0]) == 1, ndim_of(arrays[-1]) == 1
    if first_1d:
        arrays[0] = np.reshape(arrays[0], (1, -1))
    if last_1d:
        arrays[-1] = np.reshape(arrays[-1], (-1, 1))
    if any(ndim_of(x) != 2 for x in arrays):
        raise np.linalg.LinAlgError("multi_dot: the inner arrays must be two-dimensional")
    dims = [shape_of(x)[0] for x in arrays] + [shape_of(arrays[-1])[1]]
    r = _chain_product(arrays, _chain_order(dims), 0, len(arrays) - 1)
    if first_1d or last_1d:
        r = np.reshape(r, tuple(d for d, drop in zip(shape_of(r), (first_1d, last_1d)) if not drop))
    return r


# --- inverse, determinants, solve ----------------------------------------------------------------
def _inv_vjp(g, ans, a):
    inv_t = _mT(ans)
    return -np.matmul(inv_t, np.matmul(g, inv_t))


inv_p = Primitive(
    "inv", lambda a: np.linalg.inv(a), vjps=(_inv_vjp,),
    jvp=lambda ts, ans, a: -np.matmul(ans, np.matmul(ts[0], ans)), jvp_batched=True,
)
implements(np.linalg.inv)(lambda a: bind(inv_p, (a,), {}))


def _inv_transpose_times(scale, a):
    """`scale[..., None, None] * inv(a)^T`: the derivative of log|det a| scaled per matrix."""
    return np.expand_dims(scale, (-2, -1)) * _mT(np.linalg.inv(a))


def _dlogdet(a, t):
    """The directional derivative of log|det a| along t: trace(inv(a) @ t)."""
    return np.sum(_mT(np.linalg.inv(a)) * t, axis=(-2, -1))


det_p = Primitive(
    "det", lambda a: np.linalg.det(a),
    vjps=(lambda g, ans, a: _inv_transpose_times(g * ans, a),),
    jvp=lambda ts, ans, a: ans * _dlogdet(a, ts[0]), jvp_batched=True,
)
implements(np.linalg.det)(lambda a: bind(det_p, (a,), {}))

slogdet_p = Primitive(
    "slogdet", lambda a: tuple(np.linalg.slogdet(a)),
    vjps=(lambda g, ans, a: _inv_transpose_times(g[1], a),),  # the sign has no derivative
    jvp=lambda ts, ans, a: (np.zeros(shape_of(ans[0]), dtype_of(ans[0])), _dlogdet(a, ts[0])),
    multiple_results=True, jvp_batched=True,
)
implements(np.linalg.slogdet)(lambda a: _named(_SlogdetResult, *bind(slogdet_p, (a,), {})))


def _solve_vjp_all(g, ans, args, params, invars):
    """Both cotangents from one solve with a^T: the b cotangent is reused for a's."""
    a, b = args
    gb = np.linalg.solve(_mT(a), g)
    ga = None if invars[0] is None else unbroadcast(-np.matmul(gb, _mT(ans)), shape_of(a))
    return ga, (None if invars[1] is None else unbroadcast(gb, shape_of(b)))


def _solve_jvp(ts, ans, a, b):
    rank = ndim_of(ans) - 2
    ta, tb = (None if t is None else _matrix_stack(t, ndim_of(x), True, rank)
              for t, x in zip(ts, (a, b)))
    rhs = tb if ta is None else (-np.matmul(ta, ans) if tb is None else tb - np.matmul(ta, ans))
    return np.linalg.solve(a, rhs)


# b is always a stack of matrices here: a vector right-hand side is made a column first
solve_p = Primitive(
    "solve", lambda a, b: np.linalg.solve(a, b),
    vjps=(lambda g, ans, a, b: _solve_vjp_all(g, ans, (a, b), {}, (True, None))[0],
          lambda g, ans, a, b: _solve_vjp_all(g, ans, (a, b), {}, (None, True))[1]),
    jvp=_solve_jvp, jvp_batched=True,
)
solve_p.vjp_all = _solve_vjp_all


@implements(np.linalg.solve)
def solve(a, b):
    a, b = _operand(a), _operand(b)
    if ndim_of(b) == 1:
        x = bind(solve_p, (a, np.expand_dims(b, -1)), {})
        return np.reshape(x, shape_of(x)[:-1])
    return bind(solve_p, (a, b), {})


# --- cholesky ----------------------------------------------------------------------------------
def _cholesky_vjp(g, ans, a, upper):
    # with L the lower factor: abar = phi(S + S^T), S = L^-T phi(L^T Lbar) L^-1 (Murray, 2016)
    low, low_bar = (_mT(ans), _mT(g)) if upper else (ans, g)
    p = _phi(np.matmul(_mT(low), low_bar), lower=True)
    x = np.linalg.solve(_mT(low), p)
    s = _mT(np.linalg.solve(_mT(low), _mT(x)))
    return _phi(s + _mT(s), lower=not upper)


def _cholesky_jvp(ts, ans, a, upper):
    # dL = L phi(L^-1 dA L^-T), with dA the symmetric matrix read from the tangent
    low = _mT(ans) if upper else ans
    y = np.linalg.solve(low, _symmetric_read(ts[0], lower=not upper))
    x = _mT(np.linalg.solve(low, _mT(y)))
    d = np.matmul(low, _phi(x, lower=True))
    return _mT(d) if upper else d


cholesky_p = Primitive(
    "cholesky", lambda a, upper: np.linalg.cholesky(a, upper=upper),
    vjps=(_cholesky_vjp,), jvp=_cholesky_jvp, jvp_batched=True,
)


@implements(np.linalg.cholesky)
def cholesky(a, /, *, upper=False):
    return bind(cholesky_p, (a,), {"upper": bool(upper)})


# --- eigh, eigvalsh ------------------------------------------------------------------------------
def _inverse_gaps(w):
    """F[..., i, j] = 1 / (w_j - w_i) off the diagonal, 0 on it."""
    n = shape_of(w)[-1]
    eye = np.eye(n, dtype=bool)
    gaps = np.expand_dims(w, -2) - np.expand_dims(w, -1)
    return np.where(eye, 0, 1 / np.where(eye, 1, gaps))


def _eigh_vjp(g, ans, a, UPLO):
    (w, v), (w_bar, v_bar) = ans, g
    if _is_zero(v_bar):  # eigenvalues only: no division by eigenvalue gaps
        s = np.matmul(v * np.expand_dims(w_bar, -2), _mT(v))
    else:
        n = shape_of(w)[-1]
        inner = (_inverse_gaps(w) * np.matmul(_mT(v), v_bar)
                 + np.expand_dims(w_bar, -1) * np.eye(n, dtype=dtype_of(w)))
        s = np.matmul(v, np.matmul(inner, _mT(v)))
    return _phi(s + _mT(s), lower=UPLO == "L")


def _eigh_jvp(ts, ans, a, UPLO):
    w, v = ans
    da_v = np.matmul(_symmetric_read(ts[0], lower=UPLO == "L"), v)
    dw = np.sum(v * da_v, axis=-2)
    dv = np.matmul(v, _inverse_gaps(w) * np.matmul(_mT(v), da_v))
    return dw, dv


eigh_p = Primitive(
    "eigh", lambda a, UPLO: tuple(np.linalg.eigh(a, UPLO=UPLO)),
    vjps=(_eigh_vjp,), jvp=_eigh_jvp, multiple_results=True, jvp_batched=True,
)


@implements(np.linalg.eigh)
def eigh(a, UPLO="L"):
    if UPLO not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    return _named(_EighResult, *bind(eigh_p, (a,), {"UPLO": UPLO}))


@implements(np.linalg.eigvalsh)
def eigvalsh(a, UPLO="L"):
    """Through eigh: the derivative of the eigenvalues needs the eigenvectors anyway."""
    return eigh(a, UPLO)[0]


# --- qr ----------------------------------------------------------------------------------------
def _right_solve_transposed(x, r):
    """`x @ inv(r)^T`."""
    return _mT(np.linalg.solve(r, _mT(x)))


def _qr_vjp(g, ans, a):
    # abar = (Qbar + Q copyltu(M)) R^-T, M = R Rbar^T - Qbar^T Q (Liao et al., 2019); m >= n
    (q, r), (q_bar, r_bar) = ans, g
    m = np.matmul(r, _mT(r_bar)) - np.matmul(_mT(q_bar), q)
    return _right_solve_transposed(q_bar + np.matmul(q, _symmetric_read(m, lower=True)), r)


def _qr_jvp(ts, ans, a):
    q, r = ans
    x = _mT(np.linalg.solve(_mT(r), _mT(ts[0])))  # dA R^-1
    qtx = np.matmul(_mT(q), x)
    low = qtx * _tri(shape_of(r)[-1], dtype_of(r), True, k=1)
    omega = low - _mT(low)  # Q^T dQ: antisymmetric
    return np.matmul(q, omega - qtx) + x, np.matmul(qtx - omega, r)


# reduced QR of a tall (or square) matrix; wide matrices are composed from it below
qr_p = Primitive("qr", lambda a: tuple(np.linalg.qr(a)), vjps=(_qr_vjp,), jvp=_qr_jvp,
                 multiple_results=True, jvp_batched=True)


@implements(np.linalg.qr)
def qr(a, mode="reduced"):
    """Reduced QR (also mode='r', and 'complete' when it equals 'reduced': m <= n).

    A wide matrix [X | Y] is factored as Q R with (Q, R_X) = qr(X) and R = [R_X | Q^T Y].
    """
    m, n = shape_of(a)[-2:]
    if mode not in ("reduced", "r", "complete"):
        raise GradtapeError(f"np.linalg.qr(mode={mode!r}) has no derivative rule; use 'reduced'.")
    if mode == "complete" and m > n:
        raise GradtapeError("np.linalg.qr(mode='complete') of a tall matrix has no unique "
                            "derivative (the extra columns of Q are arbitrary); use 'reduced'.")
    if m >= n:
        q, r = bind(qr_p, (a,), {})
    else:
        q, r_left = bind(qr_p, (a[..., :m],), {})
        r = np.concatenate([r_left, np.matmul(_mT(q), a[..., m:])], axis=-1)
    return r if mode == "r" else _named(_QRResult, q, r)


# --- norm -----------------------------------------------------------------------------------------
def _root(s, p):
    """`s ** (1/p)` with derivative 0 (not inf or nan) where s == 0: norms of zero stay finite."""
    zero = s == 0
    safe = np.where(zero, 1, s)
    return np.where(zero, 0, np.sqrt(safe) if p == 2 else safe ** (1.0 / p))


def _vector_norm(x, ord, axis, keepdims):
    if ord is None or ord == 2:
        return _root(np.sum(x * x, axis=axis, keepdims=keepdims), 2)
    if isinstance(ord, str):
        raise ValueError(f"Invalid norm order '{ord}' for vectors")
    if ord == 0:  # the number of nonzeros: no derivative
        return np.sum(x != 0, axis=axis, keepdims=keepdims).astype(dtype_of(x))
    ax = np.abs(x)
    if ord == np.inf:
        return np.max(ax, axis=axis, keepdims=keepdims)
    if ord == -np.inf:
        return np.min(ax, axis=axis, keepdims=keepdims)
    if ord == 1:
        return np.sum(ax, axis=axis, keepdims=keepdims)
    return _root(np.sum(ax**ord, axis=axis, keepdims=keepdims), ord)


def _largest_singular_value(y):
    """The largest singular value of each matrix of y (..., m, n), from its smaller Gram matrix."""
    m, n = shape_of(y)[-2:]
    gram = np.matmul(_mT(y), y) if m >= n else np.matmul(y, _mT(y))
    w = np.linalg.eigvalsh(gram)
    return _root(w[..., -1], 2)


def _matrix_norm(x, ord, axes, keepdims):
    if ord in (None, "fro", "f"):
        return _root(np.sum(x * x, axis=axes, keepdims=keepdims), 2)
    y = np.moveaxis(x, axes, (-2, -1))
    if ord == 2:
        r = _largest_singular_value(y)
    elif ord in (1, -1, np.inf, -np.inf):
        sums = np.sum(np.abs(y), axis=-2 if ord in (1, -1) else -1)
        r = np.max(sums, axis=-1) if ord > 0 else np.min(sums, axis=-1)
    elif ord in (-2, "nuc"):
        raise GradtapeError(f"np.linalg.norm(ord={ord!r}) of a matrix needs the singular value "
                            "decomposition, which has no derivative rule yet.")
    else:
        raise ValueError("Invalid norm order for matrices.")
    return np.expand_dims(r, tuple(sorted(axes))) if keepdims else r


@implements(np.linalg.norm)
def norm(x, ord=None, axis=None, keepdims=False):
    """Vector norms (any ord) and matrix norms ('fro', 1, -1, inf, -inf, 2) as compositions."""
    x = _operand(x)
    nd = ndim_of(x)
    if axis is None:
        if ord is None:
            r = _root(np.sum(x * x), 2)
            return np.reshape(r, (1,) * nd) if keepdims else r
        if nd not in (1, 2):
            raise ValueError("Improper number of dimensions to norm.")
        axis = tuple(range(nd))
    axes = (int(axis) % nd,) if isinstance(axis, (int, np.integer)) else tuple(
        int(a) % nd for a in axis)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2 and axes[0] != axes[1]:
        return _matrix_norm(x, ord, axes, keepdims)
    raise ValueError("Improper number of dimensions to norm.")


@implements(np.linalg.vector_norm)
def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    x = _operand(x)
    if axis is None:
        r = _vector_norm(np.ravel(x), ord, (0,), False)
        return np.reshape(r, (1,) * ndim_of(x)) if keepdims else r
    return _vector_norm(x, ord, normalize_axis(axis, ndim_of(x)), keepdims)


implements(np.linalg.matrix_norm)(
    lambda x, /, *, keepdims=False, ord="fro": norm(x, ord, (-2, -1), keepdims))
