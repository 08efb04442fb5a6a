"""Linear algebra: contractions, factorizations and matrix functions.

Primitives (each with a VJP per argument and a JVP, written with NumPy calls so that they
are traced again for higher derivatives): matmul, einsum, inv, det, slogdet, solve, the
LU-factored solve, the triangular solve, cholesky (and its backward step), eigh, eig, svd,
pinv and qr. Everything else is a composition of them: dot, inner, outer, vdot, tensordot,
multi_dot, kron, matrix_power, tensorsolve, tensorinv, trace, eigvals, eigvalsh, lstsq, cond
and norm. All accept stacks of matrices where NumPy does.

Routines that read one triangle of their input (cholesky, eigh, eigvalsh: the lower one
by default) get the exact derivative of what NumPy computes: the gradient lives on that
triangle (off-diagonal entries count twice, the other triangle gets zero). For symmetric
perturbations this agrees with the symmetric gradients of JAX, autograd and PyTorch.

Degenerate spectra. Eigenvector and singular-vector derivatives divide by gaps between
eigenvalues (singular values). Where two of them coincide (to rounding), the vectors of that
block are any basis of its subspace: the reverse rules then give the gradient of a loss that
does not depend on that basis (the part of the cotangent that would rotate the basis is zero
to rounding), and NaN where the loss does depend on it. In the same way, eigenvalue (singular
value) cotangents that differ within a block give NaN: the individual values are not
differentiable there, symmetric functions of them are. The forward rules cannot see the loss:
they take no rotation within a block (right for basis-independent results downstream).

Complex numbers follow JAX's convention: the cotangent of z = x + iy is dL/dx - i dL/dy, so
the VJP of a holomorphic function is the plain transpose of its derivative (no conjugation).
matmul, einsum, inv, det, slogdet, solve, eig, eigh, svd, pinv, lstsq, norm, matrix_power and
kron accept complex input; cholesky and qr refuse it with a GradtapeError.
"""

from __future__ import annotations

import functools
import operator
import string
from collections import Counter

import numpy as np

from ..core import tracing as trace
from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.routes import UFUNCS, implements
from ..core.tracing import bind
from ._complex import complex_rules
from ._util import dtype_of, ndim_of, normalize_axis, shape_of, unbroadcast
from .stop import stop_gradient

# the result types NumPy gives these functions (named tuples in NumPy 2, plain tuples before)
_SlogdetResult = type(np.linalg.slogdet(np.eye(1)))
_EighResult = type(np.linalg.eigh(np.eye(1)))
_EigResult = type(np.linalg.eig(np.eye(1)))
_QRResult = type(np.linalg.qr(np.eye(1)))
_SVDResult = type(np.linalg.svd(np.eye(1)))


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


def _real_dtype(dtype) -> np.dtype:
    return np.finfo(np.dtype(dtype)).dtype


def _eye(n: int, dtype):
    return np.eye(n, dtype=_real_dtype(dtype))


def _diag_embed(d):
    """A stack of diagonal matrices from a stack of vectors (..., n) -> (..., n, n)."""
    n = shape_of(d)[-1]
    return np.expand_dims(d, -1) * _eye(n, dtype_of(d))


def _diag_part(x):
    return np.diagonal(x, axis1=-2, axis2=-1)


def _add(x, y):
    return y if x is None else x + y


def _primitive(name: str, raw, **rules) -> Primitive:
    """A primitive whose implementation `raw` takes plain arrays only: called with Tracers of
    a lower level (grad of grad, grad under compile), it is recorded there instead."""
    prim = Primitive(name, raw, **rules)

    def impl(*args, **params):
        for a in args:
            if type(a) is trace.Tracer:
                return bind(prim, args, params)
        return raw(*args, **params)

    impl.__name__ = impl.__qualname__ = f"{name}_impl"
    prim.impl = impl
    return prim


# --- complex helpers: real part, imaginary part, conjugate ----------------------------------------
# (private primitives with correct rules for complex values; a real value passes through)
def _is_complex(x) -> bool:
    return dtype_of(x).kind == "c"


_real_p = _primitive(
    "linalg_real",
    np.real,
    vjps=(lambda g, ans, x: g,),
    jvp=lambda ts, ans, x: _re(ts[0]),
    jvp_batched=True,
)
_imag_p = _primitive(
    "linalg_imag",
    np.imag,
    vjps=(lambda g, ans, x: g * (-1j),),
    jvp=lambda ts, ans, x: _im(ts[0]),
    jvp_batched=True,
)
_conj_p = _primitive(
    "linalg_conj",
    np.conj,
    vjps=(lambda g, ans, x: _cj(g),),
    jvp=lambda ts, ans, x: _cj(ts[0]),
    jvp_batched=True,
)


def _re(x):
    return _real_p.impl(x) if _is_complex(x) else x


def _im(x):
    return _imag_p.impl(x) if _is_complex(x) else np.zeros_like(x)


def _cj(x):
    return _conj_p.impl(x) if _is_complex(x) else x


def _mH(x):
    """The conjugate transpose of a stack of matrices."""
    return _cj(_mT(x))


def _like_input(ct, x):
    """A cotangent for input `x`: its real part when `x` is real (JAX's convention)."""
    return _re(ct) if ct is not None and not _is_complex(x) else ct


def _refuse_complex(what: str, *xs) -> None:
    for x in xs:
        if x is not None and _is_complex(x):
            raise GradtapeError(
                f"{what} of complex input has no derivative rule in gradtape yet. Split it into "
                "real and imaginary parts, or use stop_gradient if no derivative is needed."
            )


# --- degenerate spectra ---------------------------------------------------------------------------
_UNDEFINED_TOL = float(np.sqrt(np.finfo(np.float64).eps))  # relative size of a nonzero cotangent


def _coinciding(w):
    """(..., n, n) mask of the off-diagonal pairs (i, j) with w_i == w_j to rounding."""
    w = stop_gradient(w)
    n = shape_of(w)[-1]
    mag = np.abs(w)
    eps = np.finfo(_real_dtype(dtype_of(w))).eps
    tol = (64 * max(n, 1) * eps) * np.max(mag, axis=-1, keepdims=True) if n else mag
    gaps = np.abs(np.expand_dims(w, -2) - np.expand_dims(w, -1))
    return (gaps <= np.expand_dims(tol, -1)) & ~np.eye(n, dtype=bool)


def _nonzero_to_rounding(x, scale_of, axes=(-2, -1)):
    """Where |x| is not zero to rounding, relative to the largest entry of `scale_of` over
    `axes` (per matrix of a stack, by default)."""
    x, scale_of = stop_gradient(x), stop_gradient(scale_of)
    scale = np.max(np.abs(scale_of), axis=axes, keepdims=True)
    return np.abs(x) > _UNDEFINED_TOL * scale


def _inverse_gaps(gaps, pairs, undefined=None):
    """1 / gaps off the diagonal and away from coinciding pairs; 0 on the diagonal and at the
    pairs, NaN at the pairs where `undefined` (the derivative does not exist there)."""
    n = shape_of(gaps)[-1]
    skip = pairs | np.eye(n, dtype=bool)
    inv = np.where(skip, 0, 1 / np.where(skip, 1, gaps))
    if undefined is not None:
        inv = np.where(pairs & undefined, np.nan, inv)
    return inv


def _poison(x, undefined):
    """x, with NaN in the matrices of the stack where `undefined` (shape (...,) or scalar)."""
    return x + np.expand_dims(np.where(undefined, np.nan, 0.0), (-2, -1)).astype(
        _real_dtype(dtype_of(x))
    )


def _spread_within_blocks(v, pairs):
    """Where v_i != v_j (to rounding, relative to max|v|) for a coinciding pair: (...,) mask."""
    d = np.expand_dims(v, -2) - np.expand_dims(v, -1)
    return np.any(pairs & _nonzero_to_rounding(d, np.expand_dims(v, -1)), axis=(-2, -1))


# --- LAPACK through SciPy (optional): factorizations reused by backward passes --------------------
@functools.cache
def _lapack_funcs(names: tuple, dtype_char: str):
    try:
        from scipy.linalg import lapack
    except ImportError:  # SciPy is optional: the rules then refactor with NumPy
        return None
    return lapack.get_lapack_funcs(names, dtype=np.dtype(dtype_char))


def _lapack(names: tuple, dtype):
    dtype = np.dtype(dtype)
    if dtype.char not in "fdFD":
        return None
    return _lapack_funcs(names, dtype.char)


def _columns(b, n: int):
    """A stack of right-hand sides (..., n, k) as one (n, N*k) matrix, and how to undo it."""
    shape = shape_of(b)
    if len(shape) == 2:
        return b, lambda x: x
    flat = np.reshape(np.moveaxis(b, -2, 0), (n, -1))
    return flat, lambda x: np.moveaxis(np.reshape(x, (n,) + shape[:-2] + shape[-1:]), 0, -2)


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
    lead, core = shape[: len(shape) - primal_ndim], shape[len(shape) - primal_ndim :]
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
        lead = shape_of(t)[: ndim_of(t) - nd]
        t_stack = _matrix_stack(t, nd, left, rank)
        other = _matrix_stack(b if left else a, nb if left else na, not left, rank)
        prod = np.matmul(t_stack, other) if left else np.matmul(other, t_stack)
        out = _add(out, np.reshape(prod, lead + shape_of(ans)))
    return out


# the JVPs of this file take tangents with extra leading axes (a batch of directions)
matmul_p = Primitive(
    "matmul", np.matmul, vjps=(_matmul_vjp_a, _matmul_vjp_b), jvp=_matmul_jvp, jvp_batched=True
)
UFUNCS[np.matmul] = matmul_p  # np.matmul and `@` reach it through __array_ufunc__
implements(getattr(np.linalg, "matmul", None))(lambda x1, x2, /: np.matmul(x1, x2))


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
            args = operands[:i] + (t,) + operands[i + 1 :]
            out = _add(out, np.einsum(spec, *args, optimize=optimize))
    return out


# subscripts: explicit, no ellipsis, no label twice in one operand, one size per label
einsum_p = Primitive(
    "einsum", _einsum_impl, vjps=_einsum_vjp, jvp=_einsum_jvp, variadic=True, jvp_batched=True
)


def _sublist_to_str(sub) -> str:
    return "".join("..." if s is Ellipsis else string.ascii_letters[int(s)] for s in sub)


def _einsum_args(args) -> tuple[str, list]:
    """Subscripts and operands from either calling convention of np.einsum."""
    if isinstance(args[0], str):
        return args[0].replace(" ", ""), [_operand(x) for x in args[1:]]
    n = len(args) // 2
    subs = ",".join(_sublist_to_str(s) for s in args[1 : 2 * n : 2])
    if len(args) % 2:
        subs += "->" + _sublist_to_str(args[-1])
    return subs, [_operand(x) for x in args[0 : 2 * n : 2]]


def _take_diagonals(op, sub: str):
    """Resolve labels repeated within one operand (`ii`) by taking the diagonal."""
    for c, n in Counter(sub).items():
        for _ in range(n - 1):
            i = sub.index(c)
            j = sub.index(c, i + 1)
            op = np.diagonal(op, axis1=i, axis2=j)
            sub = sub[:i] + sub[i + 1 : j] + sub[j + 1 :] + c
    return op, sub


def _normalize_einsum(subs: str, ops: list) -> tuple[str, list]:
    """Explicit subscripts with the ellipsis spelled out, diagonals taken, and size-1 axes that
    broadcast squeezed out of their operands: the form the einsum primitive records."""
    lhs, arrow, out = subs.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ops):
        raise ValueError(
            "more operands provided to einstein sum function than specified in the "
            "subscripts string"
            if len(ops) > len(ins)
            else "fewer operands provided to einstein sum function than specified in the "
            "subscripts string"
        )
    spare = [c for c in string.ascii_letters if c not in subs]
    n_ell = [ndim_of(op) - (len(s) - 3) if "..." in s else 0 for s, op in zip(ins, ops)]
    ell = "".join(spare[: max(n_ell, default=0)])
    if not arrow:
        counts = Counter("".join(s.replace("...", "") for s in ins))
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1))
    out = out.replace("...", ell)
    ins = [s.replace("...", ell[len(ell) - k :] if k else "") for s, k in zip(ins, n_ell)]
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
@implements(np.tensordot, getattr(np.linalg, "tensordot", None))
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


@implements(np.outer, getattr(np.linalg, "outer", None))
def outer(a, b, out=None):
    """A (k, 1) @ (1, n) matmul: its VJP is two matrix-vector products, no (k, n) temporaries."""
    if out is not None:
        raise GradtapeError("np.outer(..., out=...) cannot be traced; assign the result instead.")
    return np.matmul(np.reshape(_operand(a), (-1, 1)), np.reshape(_operand(b), (1, -1)))


@implements(np.vdot)
def vdot(a, b):
    """np.vdot: the dot product of the raveled arrays, the first one conjugated."""
    a = np.ravel(_operand(a))
    if dtype_of(a).kind == "c":
        a = np.conjugate(a)
    return np.matmul(a, np.ravel(_operand(b)))


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


# --- kron, matrix_power, tensorsolve, tensorinv: compositions, as NumPy writes them ---------------
@implements(np.kron)
def kron(a, b):
    """Outer product of every pair of entries, reshaped (NumPy's own algorithm, on Tracers)."""
    a, b = _operand(a), _operand(b)
    nda, ndb = ndim_of(a), ndim_of(b)
    if nda < ndb:
        a = np.reshape(a, (1,) * (ndb - nda) + shape_of(a))
        nda = ndb
    nd = max(nda, ndb)
    if nda == 0 or ndb == 0:
        return a * b
    as_, bs = shape_of(a), (1,) * max(0, nda - ndb) + shape_of(b)
    b = np.reshape(b, bs)
    a_arr = np.expand_dims(a, tuple(range(1, nd * 2, 2)))
    b_arr = np.expand_dims(b, tuple(range(0, nd * 2, 2)))
    return np.reshape(a_arr * b_arr, tuple(x * y for x, y in zip(as_, bs)))


def _check_square(a, what: str = "array") -> None:
    shape = shape_of(a)
    if len(shape) < 2:
        raise np.linalg.LinAlgError(
            f"{len(shape)}-dimensional {what} given. Array must be at least two-dimensional"
        )
    if shape[-1] != shape[-2]:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")


@implements(np.linalg.matrix_power)
def matrix_power(a, n):
    """Repeated squaring with matmul; inv first for negative powers (as NumPy does)."""
    a = _operand(a)
    _check_square(a)
    try:
        n = operator.index(n)
    except TypeError as e:
        raise TypeError("exponent must be an integer") from e
    if n == 0:  # the identity: no derivative
        return np.broadcast_to(np.eye(shape_of(a)[-1], dtype=dtype_of(a)), shape_of(a)).copy()
    if n < 0:
        a = np.linalg.inv(a)
        n = -n
    if n == 1:
        return a
    if n == 2:
        return np.matmul(a, a)
    if n == 3:
        return np.matmul(np.matmul(a, a), a)
    z = result = None
    while n > 0:
        z = a if z is None else np.matmul(z, z)
        n, bit = divmod(n, 2)
        if bit:
            result = z if result is None else np.matmul(result, z)
    return result


@implements(np.linalg.tensorsolve)
def tensorsolve(a, b, axes=None):
    """Reshape to one square system, solve, reshape back (NumPy's algorithm)."""
    a, b = _operand(a), _operand(b)
    an = ndim_of(a)
    if axes is not None:
        allaxes = list(range(an))
        for k in axes:
            allaxes.remove(k)
            allaxes.insert(an, k)
        a = np.transpose(a, allaxes)
    oldshape = shape_of(a)[-(an - ndim_of(b)) :]
    prod = int(np.prod(oldshape))
    if int(np.prod(shape_of(a))) != prod**2:
        raise np.linalg.LinAlgError(
            "Input arrays must satisfy the requirement prod(a.shape[b.ndim:]) == "
            "prod(a.shape[:b.ndim])"
        )
    x = np.linalg.solve(np.reshape(a, (prod, prod)), np.ravel(b))
    return np.reshape(x, oldshape)


@implements(np.linalg.tensorinv)
def tensorinv(a, ind=2):
    """Reshape to one square matrix, invert, reshape back (NumPy's algorithm)."""
    a = _operand(a)
    oldshape = shape_of(a)
    if ind <= 0:
        raise ValueError("Invalid ind argument.")
    invshape = oldshape[ind:] + oldshape[:ind]
    prod = int(np.prod(oldshape[ind:]))
    ia = np.linalg.inv(np.reshape(a, (prod, -1)))
    return np.reshape(ia, invshape)


if hasattr(np.linalg, "trace"):
    implements(np.linalg.trace)(
        lambda x, /, *, offset=0, dtype=None: np.trace(x, offset, axis1=-2, axis2=-1, dtype=dtype)
    )


# --- inverse, determinants ------------------------------------------------------------------------
def _inv_vjp(g, ans, a):
    inv_t = _mT(ans)
    return _like_input(-np.matmul(inv_t, np.matmul(g, inv_t)), a)


inv_p = Primitive(
    "inv",
    lambda a: np.linalg.inv(a),
    vjps=(_inv_vjp,),
    jvp=lambda ts, ans, a: -np.matmul(ans, np.matmul(ts[0], ans)),
    jvp_batched=True,
)
implements(np.linalg.inv)(lambda a: bind(inv_p, (a,), {}))


def _products_of_others(s):
    """p[..., i] = prod_{j != i} s[..., j], without dividing (zeros allowed)."""
    ones = np.ones(s.shape[:-1] + (1,), s.dtype)
    left = np.cumprod(np.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)
    right = np.cumprod(np.concatenate([ones, s[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
    return left * right


def _cofactor_from_svd(a):
    """The cofactor matrix adj(a)^T of concrete matrices, singular ones too (from the SVD)."""
    u, s, vh = np.linalg.svd(a)
    phase = np.linalg.det(u) * np.linalg.det(vh)
    cof = np.matmul(np.conj(u) * np.expand_dims(_products_of_others(s), -2), np.conj(vh))
    return np.expand_dims(phase, (-2, -1)) * cof


def _cofactor(a, ans):
    """adj(a)^T = det(a) inv(a)^T, the derivative of det: from the SVD where a is singular."""
    if type(a) is np.ndarray and type(ans) is np.ndarray or isinstance(ans, np.generic):
        try:
            return np.expand_dims(ans, (-2, -1)) * _mT(np.linalg.inv(a))
        except np.linalg.LinAlgError:
            return _cofactor_from_svd(a)
    return np.expand_dims(ans, (-2, -1)) * _mT(np.linalg.inv(a))


det_p = Primitive(
    "det",
    lambda a: np.linalg.det(a),
    vjps=(lambda g, ans, a: _like_input(np.expand_dims(g, (-2, -1)) * _cofactor(a, ans), a),),
    jvp=lambda ts, ans, a: np.sum(_cofactor(a, ans) * ts[0], axis=(-2, -1)),
    jvp_batched=True,
)
implements(np.linalg.det)(lambda a: bind(det_p, (a,), {}))


def _slogdet_vjp(g, ans, a):
    g_sign, g_log = g
    scale = g_log
    if _is_complex(ans[0]):  # the sign moves on the unit circle: d sign = i sign Im(tr(inv(a) da))
        scale = g_log + 1j * _im(ans[0] * g_sign)
    return _like_input(np.expand_dims(scale, (-2, -1)) * _mT(np.linalg.inv(a)), a)


def _slogdet_jvp(ts, ans, a):
    t = np.sum(_mT(np.linalg.inv(a)) * ts[0], axis=(-2, -1))  # tr(inv(a) da)
    if _is_complex(ans[0]):
        return ans[0] * (1j * _im(t)), _re(t)
    return np.zeros(shape_of(t), dtype_of(ans[0])), t


slogdet_p = Primitive(
    "slogdet",
    lambda a: tuple(np.linalg.slogdet(a)),
    vjps=(_slogdet_vjp,),
    jvp=_slogdet_jvp,
    multiple_results=True,
    jvp_batched=True,
)
implements(np.linalg.slogdet)(lambda a: _named(_SlogdetResult, *bind(slogdet_p, (a,), {})))


# --- solve: one LU factorization, reused by the backward pass -------------------------------------
def _stacked(t, x, rank: int):
    """Tangent `t` of matrix stack `x` (maybe with leading direction axes) with ones inserted so
    that it broadcasts against stacks of `rank` batch axes."""
    return _matrix_stack(t, ndim_of(x), True, rank)


def _solve_vjp_all(g, ans, args, params, invars):
    """Both cotangents from one solve with a^T: the b cotangent is reused for a's."""
    a, b = args
    gb = np.linalg.solve(_mT(a), g)
    ga = None if invars[0] is None else unbroadcast(-np.matmul(gb, _mT(ans)), shape_of(a))
    return ga, (None if invars[1] is None else unbroadcast(gb, shape_of(b)))


def _solve_jvp(ts, ans, a, b):
    rank = ndim_of(ans) - 2
    ta, tb = (None if t is None else _stacked(t, x, rank) for t, x in zip(ts, (a, b)))
    rhs = tb if ta is None else (-np.matmul(ta, ans) if tb is None else tb - np.matmul(ta, ans))
    return np.linalg.solve(a, rhs)


# b is always a stack of matrices here: a vector right-hand side is made a column first
solve_p = Primitive(
    "solve",
    lambda a, b: np.linalg.solve(a, b),
    vjps=(
        lambda g, ans, a, b: _solve_vjp_all(g, ans, (a, b), {}, (True, None))[0],
        lambda g, ans, a, b: _solve_vjp_all(g, ans, (a, b), {}, (None, True))[1],
    ),
    jvp=_solve_jvp,
    jvp_batched=True,
)
solve_p.vjp_all = _solve_vjp_all


def _getrf(a):
    """LU factors of a concrete matrix or stack of matrices (LAPACK getrf, one call per
    matrix); a singular matrix raises as NumPy."""
    (getrf,) = _lapack(("getrf",), a.dtype)
    if a.ndim == 2:
        lu, piv, info = getrf(a)
        if info > 0:
            raise np.linalg.LinAlgError("Singular matrix")
        return lu, piv
    n = a.shape[-1]
    lu = np.empty(a.shape, a.dtype)
    piv = np.empty(a.shape[:-1], np.int32)
    for index in np.ndindex(a.shape[:-2]):
        lu[index], piv[index], info = getrf(a[index])
        if info > 0:
            raise np.linalg.LinAlgError("Singular matrix")
    assert piv.shape[-1] == n
    return lu, piv


# the factors are a constant to every derivative: the rules below differentiate through `a`
lu_factors_p = _primitive("lu_factors", lambda a: _getrf(a), nondiff=True, multiple_results=True)


def _lu_solve_raw(a, lu, piv, b, trans):
    (getrs,) = _lapack(("getrs",), lu.dtype)
    b = np.asarray(b, lu.dtype)
    if lu.ndim == 2:
        flat, undo = _columns(b, lu.shape[-1])
        x, info = getrs(lu, piv, flat, trans=trans)
        return undo(x)
    # a stack of factorizations: one getrs per matrix of the broadcast batch
    batch = np.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    lu = np.broadcast_to(lu, batch + lu.shape[-2:])
    piv = np.broadcast_to(piv, batch + piv.shape[-1:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    x = np.empty(b.shape, lu.dtype)
    for index in np.ndindex(batch):
        x[index], info = getrs(lu[index], piv[index], b[index], trans=trans)
    return x


def _lu_solve_vjp_all(g, ans, args, params, invars):
    a, lu, piv, b = args
    trans = params["trans"]
    gb = lu_solve_p.impl(a, lu, piv, g, trans=1 - trans)
    ga = None
    if invars[0] is not None:
        outer = np.matmul(gb, _mT(ans)) if trans == 0 else np.matmul(ans, _mT(gb))
        ga = unbroadcast(-outer, shape_of(a))
    return ga, None, None, (None if invars[3] is None else unbroadcast(gb, shape_of(b)))


def _lu_solve_jvp(ts, ans, a, lu, piv, b, trans):
    ta, tb = ts[0], ts[3]
    rhs = None if tb is None else _stacked(tb, b, ndim_of(ans) - 2)
    if ta is not None:
        ta = _stacked(ta if trans == 0 else _mT(ta), a, ndim_of(ans) - 2)
        rhs = -np.matmul(ta, ans) if rhs is None else rhs - np.matmul(ta, ans)
    return None if rhs is None else lu_solve_p.impl(a, lu, piv, rhs, trans=trans)


# x = op(a)^-1 b from the LU factors of a (a matrix or a stack; b any stack of matrices that
# broadcasts against it); op: trans
lu_solve_p = _primitive("lu_solve", _lu_solve_raw, jvp=_lu_solve_jvp, jvp_batched=True)
lu_solve_p.vjp_all = _lu_solve_vjp_all


def _solve_dtype(a, b) -> np.dtype:
    dt = np.result_type(dtype_of(a), dtype_of(b))
    return dt if dt.kind in "fc" else np.dtype(np.float64)


# Stacks of matrices smaller than this are solved by NumPy's batched solve, and refactored by
# the backward pass: one LAPACK call per matrix from Python costs more than their factorization
# (measured: 100 matrices of 16 x 16, batched solve and refactoring 0.31 ms, factors reused
# 0.43 ms; 50 of 32 x 32, 0.54 ms against 0.41 ms).
STACKED_LU_MIN_SIZE = 32


@implements(np.linalg.solve)
def solve(a, b):
    """One LU factorization per matrix, reused by the backward pass (SciPy present): for a
    single matrix, and for stacks of matrices from STACKED_LU_MIN_SIZE on; smaller stacks are
    solved by NumPy, and their backward pass solves with a^T."""
    a, b = _operand(a), _operand(b)
    _check_square(a)
    vector = ndim_of(b) == 1
    bm = np.expand_dims(b, -1) if vector else b
    n = shape_of(a)[-1]
    if ndim_of(bm) < 2 or shape_of(bm)[-2] != n:
        raise ValueError(
            f"solve: Input operand 1 has a mismatch in its core dimension 0, with "
            f"gufunc signature (m,m),(m,n)->(m,n) (size {shape_of(bm)[-2]} is "
            f"different from {n})"
        )
    dt = _solve_dtype(a, b)
    reuse = ndim_of(a) == 2 or n >= STACKED_LU_MIN_SIZE
    if reuse and n and _lapack(("getrf",), dt) is not None:
        a, bm = (x if dtype_of(x) == dt else x.astype(dt) for x in (a, bm))
        lu, piv = lu_factors_p.impl(a)
        x = lu_solve_p.impl(a, lu, piv, bm, trans=0)
    else:
        x = bind(solve_p, (a, bm), {})
    return np.reshape(x, shape_of(x)[:-1]) if vector else x


# --- triangular solve -------------------------------------------------------------------------
def _triangle_of(a, lower: bool, unit: bool):
    """The triangle a triangular solve reads (the unit diagonal it assumes included)."""
    n = shape_of(a)[-1]
    t = a * _tri(n, _real_dtype(dtype_of(a)), lower, k=1 if unit else 0)
    return t + _eye(n, dtype_of(a)) if unit else t


def _trisolve_raw(a, b, lower, trans, unit):
    dt = np.result_type(a, b)
    n = a.shape[-1]
    trtrs = _lapack(("trtrs",), dt) if n else None
    if trtrs is not None and (a.ndim == 2 or n >= 16):
        (trtrs,) = trtrs
        if a.ndim == 2:
            flat, undo = _columns(np.asarray(b, dt), n)
            x, info = trtrs(np.asarray(a, dt), flat, lower=lower, trans=trans, unitdiag=unit)
            if info > 0:
                raise np.linalg.LinAlgError(
                    f"singular matrix: resolution failed at diagonal {info - 1}"
                )
            return undo(x)
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a_b = np.broadcast_to(a, shape + a.shape[-2:])
        b_b = np.broadcast_to(b, shape + b.shape[-2:])
        out = np.empty(shape + b.shape[-2:], dt)
        for i in np.ndindex(shape):
            out[i] = _trisolve_raw(a_b[i], b_b[i], lower, trans, unit)
        return out
    m = _triangle_of(a, lower, unit)
    return np.linalg.solve(_mT(m) if trans else m, b)


def _trisolve_vjp_all(g, ans, args, params, invars):
    a, b = args
    lower, trans, unit = params["lower"], params["trans"], params["unit"]
    gb = triangular_solve_p.impl(a, g, lower=lower, trans=1 - trans, unit=unit)
    ga = None
    if invars[0] is not None:
        outer = -np.matmul(gb, _mT(ans)) if trans == 0 else -np.matmul(ans, _mT(gb))
        n = shape_of(a)[-1]
        ga = unbroadcast(
            outer * _tri(n, _real_dtype(dtype_of(a)), lower, k=1 if unit else 0), shape_of(a)
        )
    return ga, (None if invars[1] is None else unbroadcast(gb, shape_of(b)))


def _trisolve_jvp(ts, ans, a, b, lower, trans, unit):
    ta, tb = ts
    rhs = None if tb is None else _stacked(tb, b, ndim_of(ans) - 2)
    if ta is not None:
        n = shape_of(a)[-1]
        ta = ta * _tri(n, _real_dtype(dtype_of(a)), lower, k=1 if unit else 0)
        ta = _stacked(ta if trans == 0 else _mT(ta), a, ndim_of(ans) - 2)
        rhs = -np.matmul(ta, ans) if rhs is None else rhs - np.matmul(ta, ans)
    return (
        None
        if rhs is None
        else triangular_solve_p.impl(a, rhs, lower=lower, trans=trans, unit=unit)
    )


# x = op(T)^-1 b, T the lower or upper triangle of a (with a unit diagonal if `unit`); b is a
# stack of matrices; op: transposed if `trans`. Reads only that triangle, like LAPACK.
triangular_solve_p = _primitive(
    "triangular_solve", _trisolve_raw, jvp=_trisolve_jvp, jvp_batched=True
)
triangular_solve_p.vjp_all = _trisolve_vjp_all


def triangular_solve(a, b, lower: bool, trans: int = 0, unit: bool = False):
    """`op(T)^-1 b` for a vector or a stack of matrices b (T: a triangle of a)."""
    vector = ndim_of(b) == 1
    bm = np.expand_dims(b, -1) if vector else b
    x = triangular_solve_p.impl(a, bm, lower=bool(lower), trans=int(trans), unit=bool(unit))
    return np.reshape(x, shape_of(x)[:-1]) if vector else x


# --- cholesky ----------------------------------------------------------------------------------
def _phi(x, lower: bool):
    """One triangle of `x` with its diagonal halved."""
    n = shape_of(x)[-1]
    return x * (_tri(n, dtype_of(x), lower) - 0.5 * np.eye(n, dtype=dtype_of(x)))


def _symmetric_read(t, lower: bool):
    """The symmetric matrix a routine reading only one triangle of `t` works with."""
    n = shape_of(t)[-1]
    return t * _tri(n, dtype_of(t), lower) + _mT(t * _tri(n, dtype_of(t), lower, k=1))


@functools.cache
def _blas_funcs(names: tuple, dtype_char: str):
    from scipy.linalg import blas

    return blas.get_blas_funcs(names, dtype=np.dtype(dtype_char))


@functools.lru_cache(maxsize=8)
def _lower_triangle_mask(n: int) -> np.ndarray:
    """The read-only boolean mask of the lower triangle (diagonal included) of an n x n matrix,
    kept for the last few sizes: np.tril builds it anew on every call."""
    mask = np.tri(n, dtype=bool)
    mask.flags.writeable = False
    return mask


def _cholesky_backward_lapack(low, low_bar):
    """phi(L^-T M L^-1) with M = P + P^T, P = phi(L^T Lbar), for one real matrix, from trmm and
    sygst (about 2 n^3 flops, against 4 n^3 for a product and two triangular solves)."""
    (trmm,) = _blas_funcs(("trmm",), low.dtype.char)
    (sygst,) = _lapack(("sygst",), low.dtype)
    n = low.shape[-1]
    lower, zero = _lower_triangle_mask(n), np.zeros((), low.dtype)
    # the upper triangle of M is that of Q^T = Lbar^T L (diagonal included), the rest is not
    # read; Lbar's strict upper triangle is zeroed (a fresh copy trmm overwrites), so a NaN or
    # an infinity there cannot reach the result through trmm's products with L's zeros
    qt = trmm(1.0, low, np.where(lower, low_bar, zero).T, side=1, lower=1, overwrite_b=1)
    # sygst gives inv(L) A inv(L^T) for a lower L: with rows and columns in reverse order (J),
    # J L^T J is lower and J inv(L^T) M inv(L) J = inv(J L^T J) (J M J) inv(J L^T J)^T
    c, info = sygst(qt[::-1, ::-1], low.T[::-1, ::-1], itype=1, lower=1, overwrite_a=1)
    # C is symmetric: its lower triangle, from the upper one, C-contiguous (so the numba
    # backend's wrapper hands it to the next kernel without a copy)
    out = np.ascontiguousarray(np.where(lower, c[::-1, ::-1].T, zero))
    out.reshape(-1)[:: n + 1] *= 0.5  # the diagonal, through a strided view of the buffer
    return out


def _cholesky_backward(low, low_bar):
    """The VJP of the lower Cholesky factor: abar = phi(S + S^T), S = L^-T phi(L^T Lbar) L^-1
    (Murray, 2016), on the lower triangle (complex: S = L^-T phi(L^T Lbar) conj(L)^-1 and
    phi(S + S^H)). One real matrix on concrete values: trmm and sygst; otherwise (stacks,
    complex values, Tracers) triangular solves, which are primitives themselves."""
    if (
        type(low) is np.ndarray
        and type(low_bar) is np.ndarray
        and low.ndim == 2
        and low_bar.ndim == 2
        and low.dtype == low_bar.dtype
        and low.dtype.char in "fd"
        and low.shape[-1]
        and _lapack(("sygst",), low.dtype) is not None
    ):
        return _cholesky_backward_lapack(low, low_bar)
    # complex (JAX's convention, the transpose of the JVP under Re sum(u v)):
    # S = L^-T phi(L^T Lbar) conj(L)^-1, abar = phi(S + S^H); real: conj(L) = L
    p = _phi(np.matmul(_mT(low), low_bar), lower=True)
    x = triangular_solve_p.impl(low, p, lower=True, trans=1, unit=False)  # L^-T P
    s = _mT(triangular_solve_p.impl(_cj(low), _mT(x), lower=True, trans=1, unit=False))
    return _phi(s + _mH(s), lower=True)


# recorded as one instruction when staging (compile: its LAPACK path runs), differentiated
# through its implementation (the triangular solves) otherwise
cholesky_backward_p = Primitive("cholesky_backward", _cholesky_backward, transparent=True)


def _cholesky_vjp(g, ans, a, upper):
    # upper: U = L^H, read from the upper triangle (the conjugate transpose of the lower case)
    low, low_bar = (_mH(ans), _mH(g)) if upper else (ans, g)
    abar = bind(cholesky_backward_p, (low, low_bar), {})
    return _mH(abar) if upper else abar


def _cholesky_jvp(ts, ans, a, upper):
    # dL = L phi(L^-1 dA L^-H), with dA the symmetric (Hermitian) matrix read from the tangent
    low = _mH(ans) if upper else ans
    read = _hermitian_read if _is_complex(ans) else _symmetric_read
    sym = _stacked(read(ts[0], lower=not upper), a, ndim_of(ans) - 2)
    y = triangular_solve_p.impl(low, sym, lower=True, trans=0, unit=False)
    x = _mT(triangular_solve_p.impl(_cj(low), _mT(y), lower=True, trans=0, unit=False))
    d = np.matmul(low, _phi(x, lower=True))
    return _mH(d) if upper else d


cholesky_p = Primitive(
    "cholesky",
    lambda a, upper: np.linalg.cholesky(a, upper=upper),
    vjps=(_cholesky_vjp,),
    jvp=_cholesky_jvp,
    jvp_batched=True,
)


@implements(np.linalg.cholesky)
def cholesky(a, /, *, upper=False):
    """The Cholesky factor of a real symmetric or complex Hermitian matrix (or a stack), read
    from one triangle as NumPy does (the imaginary part of the diagonal is not read)."""
    return bind(cholesky_p, (a,), {"upper": bool(upper)})


# --- eigh, eigvalsh (real symmetric and complex Hermitian) ----------------------------------------
def _hermitian_read(t, lower: bool):
    """The Hermitian matrix a routine reading one triangle of `t` works with (the imaginary part
    of the diagonal is not read)."""
    n = shape_of(t)[-1]
    strict = t * _tri(n, _real_dtype(dtype_of(t)), lower, k=1)
    return strict + _mH(strict) + _re(t) * _eye(n, dtype_of(t))


def _hermitian_fold(s, lower: bool):
    """The transpose of _hermitian_read: a cotangent of the Hermitian matrix onto the triangle."""
    n = shape_of(s)[-1]
    return (s + _mH(s)) * _tri(n, _real_dtype(dtype_of(s)), lower, k=1) + _re(s) * _eye(
        n, dtype_of(s)
    )


def _eigh_vjp_all(g, ans, args, params, invars):
    (a,), (w, v), (w_bar, v_bar) = args, ans, g
    pairs = _coinciding(w)
    undefined = np.zeros(shape_of(w)[:-1], bool)
    inner = 0
    if w_bar is not None:
        inner = _diag_embed(w_bar)
        undefined = undefined | _spread_within_blocks(w_bar, pairs)
    if v_bar is not None:
        k = np.matmul(_mT(v), v_bar)
        # a rotation of a block of coinciding eigenvalues, or (complex) a phase, changes the
        # loss: the eigenvectors are not defined there, nor is the gradient
        basis = _nonzero_to_rounding(k - _mH(k), k)
        if _is_complex(k):
            undefined = undefined | np.any(
                _nonzero_to_rounding(_diag_embed(_im(_diag_part(k))), k), axis=(-2, -1)
            )
        gaps = np.expand_dims(w, -2) - np.expand_dims(w, -1)
        inner = inner + _inverse_gaps(gaps, pairs, basis) * k
    s = np.matmul(_cj(v), np.matmul(inner, _mT(v)))
    return (_like_input(_poison(_hermitian_fold(s, params["UPLO"] == "L"), undefined), a),)


def _eigh_jvp(ts, ans, a, UPLO):
    w, v = ans
    h = _hermitian_read(ts[0], lower=UPLO == "L")
    hv = np.matmul(h, v)
    dw = _re(np.sum(_cj(v) * hv, axis=-2))
    gaps = np.expand_dims(w, -2) - np.expand_dims(w, -1)
    dv = np.matmul(v, _inverse_gaps(gaps, _coinciding(w)) * np.matmul(_mH(v), hv))
    return dw, dv


eigh_p = Primitive(
    "eigh",
    lambda a, UPLO: tuple(np.linalg.eigh(a, UPLO=UPLO)),
    jvp=_eigh_jvp,
    multiple_results=True,
    jvp_batched=True,
)
eigh_p.vjp_all = _eigh_vjp_all


@implements(np.linalg.eigh)
def eigh(a, UPLO="L"):
    if UPLO not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    return _named(_EighResult, *bind(eigh_p, (a,), {"UPLO": UPLO}))


@implements(np.linalg.eigvalsh)
def eigvalsh(a, UPLO="L"):
    """Through eigh: the derivative of the eigenvalues needs the eigenvectors anyway."""
    return eigh(a, UPLO)[0]


# --- eig, eigvals (general matrices: complex eigenvalues and eigenvectors) -----------------------
def _complex_dtype(dtype) -> np.dtype:
    return np.result_type(dtype, np.complex64)


def _eig_raw(a):
    w, v = np.linalg.eig(a)
    dt = _complex_dtype(a.dtype)
    return w.astype(dt, copy=False), v.astype(dt, copy=False)


def _largest_entries(v):
    """A one-hot mask of the entry of largest modulus of each eigenvector (LAPACK makes it real)."""
    k = np.argmax(np.abs(stop_gradient(v)), axis=-2)
    n = shape_of(v)[-2]
    return (np.arange(n).reshape((n, 1)) == np.expand_dims(k, -2)).astype(_real_dtype(dtype_of(v)))


def _eig_vjp_all(g, ans, args, params, invars):
    """Transpose of the JVP below: abar = V^-T (F o (V^T Ubar) + diag(wbar)) V^T, where Ubar is
    the eigenvector cotangent with LAPACK's normalization (unit norm, largest entry real)."""
    (a,), (w, v), (w_bar, v_bar) = args, ans, g
    pairs = _coinciding(w)
    undefined = np.zeros(shape_of(w)[:-1], bool)
    p_bar = 0
    if w_bar is not None:
        p_bar = _diag_embed(w_bar)
        undefined = undefined | _spread_within_blocks(w_bar, pairs)
    if v_bar is not None:
        s = np.sum(v_bar * v, axis=-2)
        mask = _largest_entries(v)
        v_top = _re(np.sum(mask * v, axis=-2))
        u_bar = (
            v_bar
            - _cj(v) * np.expand_dims(_re(s), -2)
            - 1j * mask * np.expand_dims(_im(s) / v_top, -2)
        )
        k = np.matmul(_mT(v), u_bar)
        gaps = np.expand_dims(w, -2) - np.expand_dims(w, -1)
        p_bar = p_bar + _inverse_gaps(gaps, pairs, _nonzero_to_rounding(k, k)) * k
    rhs = np.expand_dims(w_bar, -1) * _mT(v) if v_bar is None else np.matmul(p_bar, _mT(v))
    abar = np.linalg.solve(_mT(v), rhs)
    return (_like_input(_poison(abar, undefined), a),)


def _eig_jvp(ts, ans, a):
    # JAX's rule: P = V^-1 dA V, dw = diag(P), dV = V (F o P) + V diag(c) (normalization)
    w, v = ans
    p = np.matmul(np.linalg.solve(v, ts[0]), v)
    dw = _diag_part(p)
    gaps = np.expand_dims(w, -2) - np.expand_dims(w, -1)
    u = np.matmul(v, _inverse_gaps(gaps, _coinciding(w)) * p)
    mask = _largest_entries(v)
    c = -_re(np.sum(_cj(v) * u, axis=-2)) - 1j * (
        _im(np.sum(mask * u, axis=-2)) / _re(np.sum(mask * v, axis=-2))
    )
    return dw, u + v * np.expand_dims(c, -2)


eig_p = _primitive("eig", _eig_raw, jvp=_eig_jvp, multiple_results=True, jvp_batched=True)
eig_p.vjp_all = _eig_vjp_all
_all_real_p = _primitive("linalg_all_real", lambda w: np.all(np.imag(w) == 0), nondiff=True)


@implements(np.linalg.eig)
def eig(a):
    """Complex eigenvalues and eigenvectors; real ones (as NumPy returns them) when a is real and
    every eigenvalue is (a guard: a compiled function records both cases)."""
    a = _operand(a)
    _check_square(a)
    w, v = eig_p.impl(a)
    if not _is_complex(a) and bool(_all_real_p.impl(w)):
        w, v = _re(w), _re(v)
    return _named(_EigResult, w, v)


@implements(np.linalg.eigvals)
def eigvals(a):
    return eig(a)[0]


# --- svd --------------------------------------------------------------------------------------
def _zero_singular(s, m: int, n: int):
    """Singular values that are zero to rounding (NumPy's matrix_rank tolerance)."""
    s = stop_gradient(s)
    eps = np.finfo(_real_dtype(dtype_of(s))).eps
    return s <= max(m, n) * eps * np.max(s, axis=-1, keepdims=True)


def _nonzero_columns(x, scale_of):
    """(..., k): the columns of x that are not zero to rounding (relative to max|scale_of|)."""
    return np.any(_nonzero_to_rounding(x, scale_of), axis=-2)


def _complement_basis_used(p, g):
    """Whether the loss depends on the basis of a complement block P (cotangent G): it does not
    when P^T G is Hermitian (rotations within the complement leave it unchanged)."""
    c = np.matmul(_mT(p), g)
    return np.any(_nonzero_to_rounding(c - _mH(c), g), axis=(-2, -1))


def _svd_vjp_all(g, ans, args, params, invars):
    """Townsend's formula (complex: with the phase term of JAX's JVP), transposed."""
    (a,), (u, s, vh), (gu, gs, gvh) = args, ans, g
    m, n = shape_of(a)[-2:]
    k = min(m, n)
    full = params["full_matrices"]
    cplx = _is_complex(u)
    undefined = np.zeros(shape_of(s)[:-1], bool)
    uk = u[..., :, :k] if full and m > k else u
    vhk = vh[..., :k, :] if full and n > k else vh
    if gu is not None and full and m > k:  # extra columns: minimal rotation, basis-independent
        up, gup, gu = u[..., :, k:], gu[..., :, k:], gu[..., :, :k]
        undefined = undefined | _complement_basis_used(up, gup)
        gu = gu - np.matmul(_cj(up), np.matmul(_mH(gup), _cj(uk)))
    gv = None
    if gvh is not None:
        gv = _mH(gvh)
        if full and n > k:
            vp, gvp, gv = _mH(vh[..., k:, :]), gv[..., :, k:], gv[..., :, :k]
            undefined = undefined | _complement_basis_used(vp, gvp)
            gv = gv - np.matmul(_cj(vp), np.matmul(_mH(gvp), _mT(vhk)))
    pairs = _coinciding(s)
    zero = _zero_singular(s, m, n)
    zero_pairs = pairs & np.expand_dims(zero, -1) & np.expand_dims(zero, -2)
    sinv = np.where(zero, 0, 1 / np.where(zero, 1, s))
    inner = 0
    if gs is not None:
        inner = _diag_embed(gs)
        undefined = (
            undefined
            | _spread_within_blocks(gs, pairs)
            | np.any(
                zero & _nonzero_to_rounding(np.expand_dims(gs, -1), np.expand_dims(gs, -1))[..., 0],
                axis=-1,
            )
        )
    anti_u = anti_v = j = kv = None
    if gu is not None:
        j = np.matmul(_mT(uk), gu)
        anti_u = j - _mH(j)
    if gv is not None:
        kv = np.matmul(_cj(vhk), gv)  # V^T gv
        anti_v = kv - _mH(kv)
    anti = anti_u if anti_v is None else (anti_v if anti_u is None else anti_u + anti_v)
    if anti is not None:
        # F o (A S + S B) (F = 1 / (s_j^2 - s_i^2)) split as (A + B) / (2 (s_j - s_i)) +
        # (A - B) / (2 (s_j + s_i)): only the first divides by a gap that can vanish, and A + B
        # is what turns the basis of a block of equal singular values
        scale = gu if gv is None else gv
        diff = anti if anti_v is None else (anti_u - anti_v if anti_u is not None else -anti_v)
        within = _nonzero_to_rounding(anti, scale)
        apart = zero_pairs & _nonzero_to_rounding(diff, scale)  # two zeros: U and V turn freely
        row, col = np.expand_dims(s, -1), np.expand_dims(s, -2)
        inner = inner + 0.5 * (
            _inverse_gaps(col - row, pairs, within) * anti
            + _inverse_gaps(col + row, zero_pairs, apart) * diff
        )
        if cplx:  # the phase of each pair (u_j, v_j) is free: the loss must not see it
            row = np.max(np.abs(stop_gradient(scale)), axis=-2)
            phase = _im(_diag_part(j if kv is None else (kv if j is None else j + kv)))
            undefined = undefined | np.any(_nonzero_to_rounding(phase, row, (-1,)), -1)
            if j is not None:
                inner = inner + _diag_embed(1j * _im(_diag_part(j)) * sinv)
                undefined = undefined | np.any(
                    zero & _nonzero_to_rounding(_im(_diag_part(j)), row, (-1,)), axis=-1
                )
    abar = np.matmul(_cj(uk), np.matmul(inner, _cj(vhk)))
    if gu is not None and m > k:
        rest = gu - np.matmul(_cj(uk), j)
        undefined = undefined | np.any(zero & _nonzero_columns(rest, gu), axis=-1)
        abar = abar + np.matmul(rest * np.expand_dims(sinv, -2), _cj(vhk))
    if gv is not None and n > k:
        rest = _mH(gv) - np.matmul(_mH(kv), _cj(vhk))
        undefined = undefined | np.any(zero & _nonzero_columns(_mT(rest), gv), axis=-1)
        abar = abar + np.matmul(_cj(uk), np.expand_dims(sinv, -1) * rest)
    return (_like_input(_poison(abar, undefined), a),)


def _svd_jvp(ts, ans, a, full_matrices):
    u, s, vh = ans
    m, n = shape_of(a)[-2:]
    k = min(m, n)
    uk = u[..., :, :k] if full_matrices and m > k else u
    vhk = vh[..., :k, :] if full_matrices and n > k else vh
    v = _mH(vhk)
    da = ts[0]
    ds_mat = np.matmul(_mH(uk), np.matmul(da, v))
    ds = _re(_diag_part(ds_mat))
    zero = _zero_singular(s, m, n)
    sinv = np.where(zero, 0, 1 / np.where(zero, 1, s))
    row, col = np.expand_dims(s, -1), np.expand_dims(s, -2)
    pairs = _coinciding(s)
    g_minus = _inverse_gaps(col - row, pairs)  # no rotation within a block of equal values
    g_plus = _inverse_gaps(col + row, pairs & np.expand_dims(zero, -1) & np.expand_dims(zero, -2))
    sym, skew = 0.5 * (ds_mat + _mH(ds_mat)), 0.5 * (ds_mat - _mH(ds_mat))
    du_inner = g_minus * sym + g_plus * skew
    dv_inner = g_minus * sym - g_plus * skew
    if _is_complex(ds_mat):
        du_inner = du_inner + _diag_embed(1j * _im(_diag_part(ds_mat)) * sinv)
    du = np.matmul(uk, du_inner)
    dv = np.matmul(v, dv_inner)
    if m > k:
        du = du + (np.matmul(da, v) - np.matmul(uk, ds_mat)) * np.expand_dims(sinv, -2)
    if n > k:
        dv = dv + (np.matmul(_mH(da), uk) - np.matmul(v, _mH(ds_mat))) * np.expand_dims(sinv, -2)
    if full_matrices and m > k:  # the extra columns turn with the first ones (minimal rotation)
        up = u[..., :, k:]
        du = np.concatenate([du, -np.matmul(uk, np.matmul(_mH(du), up))], axis=-1)
    if full_matrices and n > k:
        vp = _mH(vh[..., k:, :])
        dv = np.concatenate([dv, -np.matmul(v, np.matmul(_mH(dv), vp))], axis=-1)
    return du, ds, _mH(dv)


svd_p = _primitive(
    "svd",
    lambda a, full_matrices: tuple(np.linalg.svd(a, full_matrices=full_matrices)),
    jvp=_svd_jvp,
    multiple_results=True,
    jvp_batched=True,
)
svd_p.vjp_all = _svd_vjp_all


def _svd_hermitian(a, full_matrices, compute_uv):
    """NumPy's algorithm for hermitian=True, on Tracers: through eigh (one triangle read)."""
    if not compute_uv:
        return np.sort(np.abs(np.linalg.eigvalsh(a)), axis=-1)[..., ::-1]
    w, u = np.linalg.eigh(a)
    sgn = np.sign(stop_gradient(w))
    s = np.abs(w)
    sidx = np.argsort(stop_gradient(s), axis=-1)[..., ::-1]
    sgn = np.take_along_axis(sgn, sidx, axis=-1)
    s = np.take_along_axis(s, sidx, axis=-1)
    # the indices spelled out to u's shape: gradtape's take_along_axis does not broadcast them
    u = np.take_along_axis(u, np.broadcast_to(np.expand_dims(sidx, -2), shape_of(u)), axis=-1)
    return _named(_SVDResult, u, s, _mH(u * np.expand_dims(sgn, -2)))


@implements(np.linalg.svd)
def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """U, S, Vh (reduced or full) or S alone; derivatives as the module docstring says."""
    a = _operand(a)
    if ndim_of(a) < 2:
        raise np.linalg.LinAlgError(
            f"{ndim_of(a)}-dimensional array given. Array must be at least two-dimensional"
        )
    if hermitian:
        return _svd_hermitian(a, full_matrices, compute_uv)
    if not compute_uv:
        return svd_p.impl(a, full_matrices=False)[1]
    return _named(_SVDResult, *svd_p.impl(a, full_matrices=bool(full_matrices)))


if hasattr(np.linalg, "svdvals"):
    implements(np.linalg.svdvals)(lambda x, /: svd(x, compute_uv=False))


# --- pinv, lstsq, cond ---------------------------------------------------------------------------
def _pinv_vjp(g, ans, a, rcond, hermitian):
    """Transpose of the JVP below (complex: with JAX's convention)."""
    if hermitian:  # NumPy reads the lower triangle (through eigh)
        a = _hermitian_read(a, True)
    x, y = ans, _mH(g)
    xc, ac = _cj(x), _cj(a)
    t1 = -np.matmul(_mT(x), np.matmul(g, _mT(x)))
    t2 = np.matmul(y - np.matmul(ac, np.matmul(xc, y)), np.matmul(xc, _mT(x)))
    t3 = np.matmul(np.matmul(_mT(x), xc), y - np.matmul(np.matmul(y, xc), ac))
    abar = t1 + t2 + t3
    return _like_input(_hermitian_fold(abar, True) if hermitian else abar, ans)


def _pinv_jvp(ts, ans, a, rcond, hermitian):
    """dX = -X dA X + X X^H dA^H (I - A X) + (I - X A) dA^H X^H X (Golub and Pereyra, 1973):
    the derivative at the rank the cutoff sees."""
    x, da = ans, ts[0]
    if hermitian:
        a, da = _hermitian_read(a, True), _hermitian_read(da, True)
    dah = _mH(da)
    xh = _mH(x)
    t2 = np.matmul(np.matmul(x, xh), dah - np.matmul(np.matmul(dah, a), x))
    t3 = np.matmul(dah - np.matmul(x, np.matmul(a, dah)), np.matmul(xh, x))
    return -np.matmul(x, np.matmul(da, x)) + t2 + t3


pinv_p = _primitive(
    "pinv",
    lambda a, rcond, hermitian: np.linalg.pinv(a, rcond=np.asarray(rcond), hermitian=hermitian),
    vjps=(_pinv_vjp,),
    jvp=_pinv_jvp,
    jvp_batched=True,
)


@implements(np.linalg.pinv)
def pinv(a, rcond=None, hermitian=False, *, rtol=np._NoValue):
    """The Moore-Penrose inverse; its derivative at the numerical rank the cutoff sees."""
    a = _operand(a)
    if rcond is None:
        if rtol is np._NoValue:
            rcond = 1e-15
        elif rtol is None:
            rcond = max(shape_of(a)[-2:]) * np.finfo(dtype_of(a)).eps
        else:
            rcond = rtol
    elif rtol is not np._NoValue:
        raise ValueError("`rtol` and `rcond` can't be both set.")
    rcond = np.asarray(rcond)
    rcond = float(rcond) if rcond.ndim == 0 else tuple(rcond.tolist())
    m, n = shape_of(a)[-2:]
    if m == 0 or n == 0:
        return np.empty(shape_of(a)[:-2] + (n, m), dtype=dtype_of(a))
    return pinv_p.impl(a, rcond=rcond, hermitian=bool(hermitian))


def _abs2(x):
    return _re(x * _cj(x)) if _is_complex(x) else x * x


@implements(np.linalg.lstsq)
def lstsq(a, b, rcond=None):
    """x = pinv(a) b (the minimum-norm solution, as LAPACK's gelsd, with the same cutoff), the
    residuals, the rank (a guard when residuals are returned) and the singular values."""
    a, b = _operand(a), _operand(b)
    is_1d = ndim_of(b) == 1
    bm = np.expand_dims(b, -1) if is_1d else b
    if ndim_of(a) != 2 or ndim_of(bm) != 2:
        bad = a if ndim_of(a) != 2 else b
        raise np.linalg.LinAlgError(
            f"{ndim_of(bad)}-dimensional array given. Array must be two-dimensional"
        )
    m, n = shape_of(a)
    if shape_of(bm)[0] != m:
        raise np.linalg.LinAlgError("Incompatible dimensions")
    t = _solve_dtype(a, b)
    a, bm = (x if dtype_of(x) == t else x.astype(t) for x in (a, bm))
    if rcond is None:
        rcond = np.finfo(t).eps * max(n, m)
    s = np.linalg.svd(a, compute_uv=False)
    rank = np.sum(stop_gradient(s) > rcond * np.max(stop_gradient(s), initial=0)).astype(np.int32)
    x = np.matmul(pinv_p.impl(a, rcond=float(rcond), hermitian=False), bm)
    if m > n and int(rank) == n:
        resids = np.sum(_abs2(bm - np.matmul(a, x)), axis=0)
    else:
        resids = np.zeros((0,), _real_dtype(t))
    if is_1d:
        x = np.reshape(x, (n,))
    return x, resids, rank, s


@implements(np.linalg.cond)
def cond(x, p=None):
    """From the singular values (p None, 2, -2) or from norm(x, p) * norm(inv(x), p)."""
    x = _operand(x)
    if p is None or p in (2, -2):
        s = np.linalg.svd(x, compute_uv=False)
        return s[..., -1] / s[..., 0] if p == -2 else s[..., 0] / s[..., -1]
    _check_square(x)
    return np.linalg.norm(x, p, axis=(-2, -1)) * np.linalg.norm(np.linalg.inv(x), p, axis=(-2, -1))


# --- qr ----------------------------------------------------------------------------------------
def _right_solve_transposed(x, r):
    """`x @ inv(r)^T` (r upper triangular)."""
    return _mT(triangular_solve_p.impl(r, _mT(x), lower=False, trans=0, unit=False))


def _right_solve(x, r):
    """`x @ inv(r)` (r upper triangular)."""
    return _mT(triangular_solve_p.impl(r, _mT(x), lower=False, trans=1, unit=False))


def _complement_factor(q):
    """Z = Q_pn (Q_nn - I)^-1, from the first n columns Q of a Householder Q (JAX's rule for the
    extra columns of a complete QR: arXiv 2409.13374)."""
    n = shape_of(q)[-1]
    q_nn, q_pn = q[..., :n, :], q[..., n:, :]
    return _mT(np.linalg.solve(_mT(q_nn - np.eye(n, dtype=dtype_of(q))), _mT(q_pn)))


def _qr_vjp(g, ans, a, complete):
    # abar = (Qbar + Q copyltu(M)) R^-T, M = R Rbar^T - Qbar^T Q (Liao et al., 2019); m >= n
    (q, r), (q_bar, r_bar) = ans, g
    n = shape_of(a)[-1]
    if complete and shape_of(q)[-1] > n:
        q_mn, q_mp = q[..., :n], q[..., n:]
        g_mp, q_bar, r_bar, r = q_bar[..., n:], q_bar[..., :n], r_bar[..., :n, :], r[..., :n, :]
        z = _complement_factor(q_mn)
        # dQ_mp = dQ_mn Z^T - W (dQ_pn - Z dQ_nn)^T, W = Q_mn + Q_mp Z: transposed
        e = -np.matmul(_mT(g_mp), q_mn + np.matmul(q_mp, z))
        q_bar = q_bar + np.matmul(g_mp, z) + np.concatenate([-np.matmul(_mT(z), e), e], axis=-2)
        q = q_mn
    # complex (JAX's convention): abar = (Qbar + conj(Q) H) R^-T, H the Hermitian matrix read
    # from the upper triangle of M^T = Rbar R^T - Q^T Qbar (R's diagonal stays real: LAPACK
    # fixes the phase of Q's columns)
    m_t = np.matmul(r_bar, _mT(r)) - np.matmul(_mT(q), q_bar)
    read = _hermitian_read if _is_complex(m_t) else _symmetric_read
    return _right_solve_transposed(q_bar + np.matmul(_cj(q), read(m_t, lower=False)), r)


def _qr_jvp(ts, ans, a, complete):
    q, r = ans
    n = shape_of(a)[-1]
    full = complete and shape_of(q)[-1] > n
    q_mn, r_nn = (q[..., :n], r[..., :n, :]) if full else (q, r)
    x = _right_solve(ts[0], r_nn)  # dA R^-1
    qtx = np.matmul(_mH(q_mn), x)
    low = qtx * _tri(n, _real_dtype(dtype_of(r)), True, k=1)
    omega = low - _mH(low)  # Q^H dQ: antihermitian
    if _is_complex(qtx):  # its imaginary diagonal keeps R's diagonal real (JAX's rule)
        omega = omega + 1j * _im(qtx) * _eye(n, _real_dtype(dtype_of(r)))
    dq, dr = np.matmul(q_mn, omega - qtx) + x, np.matmul(qtx - omega, r_nn)
    if full:
        q_mp = q[..., n:]
        z = _complement_factor(q_mn)
        w = q_mn + np.matmul(q_mp, z)
        dq_mp = np.matmul(dq, _mT(z)) - np.matmul(
            w, _mT(dq[..., n:, :] - np.matmul(z, dq[..., :n, :]))
        )
        dq = np.concatenate([dq, dq_mp], axis=-1)
        rows = shape_of(a)[-2] - n
        dr = np.concatenate([dr, np.zeros(shape_of(dr)[:-2] + (rows, n), dtype_of(dr))], axis=-2)
    return dq, dr


# QR of a tall (or square) matrix, reduced or complete; wide matrices are composed from it below
qr_p = Primitive(
    "qr",
    lambda a, complete: tuple(np.linalg.qr(a, "complete" if complete else "reduced")),
    vjps=(_qr_vjp,),
    jvp=_qr_jvp,
    multiple_results=True,
    jvp_batched=True,
)


@implements(np.linalg.qr)
def qr(a, mode="reduced"):
    """Reduced or complete QR (also mode='r').

    A wide matrix [X | Y] is factored as Q R with (Q, R_X) = qr(X) and R = [R_X | Q^T Y]. The
    extra columns of a complete Q (tall matrices) are LAPACK's Householder completion, and
    differentiated as such (JAX's rule).
    """
    a = _operand(a)
    if mode not in ("reduced", "r", "complete"):
        raise GradtapeError(
            f"np.linalg.qr(mode={mode!r}) has no derivative rule; use 'reduced', 'complete' or 'r'."
        )
    m, n = shape_of(a)[-2:]
    if _is_complex(a) and mode == "complete" and m > n:
        raise GradtapeError(
            "np.linalg.qr(a, mode='complete') of a complex tall matrix has no derivative rule in "
            "gradtape (the extra columns of Q): use mode='reduced', or split real and imaginary "
            "parts."
        )
    if m >= n:
        q, r = bind(qr_p, (a,), {"complete": mode == "complete" and m > n})
    else:
        q, r_left = bind(qr_p, (a[..., :m],), {"complete": False})
        r = np.concatenate([r_left, np.matmul(_mH(q), a[..., m:])], axis=-1)
    return r if mode == "r" else _named(_QRResult, q, r)


# --- norm -----------------------------------------------------------------------------------------
def _root(s, p):
    """`s ** (1/p)` with derivative 0 (not inf or nan) where s == 0: norms of zero stay finite."""
    zero = s == 0
    safe = np.where(zero, 1, s)
    return np.where(zero, 0, np.sqrt(safe) if p == 2 else safe ** (1.0 / p))


def _abs(x):
    """|x|; for complex x from the squared modulus (derivative 0 at 0, as for the norms)."""
    return _root(_abs2(x), 2) if _is_complex(x) else np.abs(x)


def _vector_norm(x, ord, axis, keepdims):
    if ord is None or ord == 2:
        return _root(np.sum(_abs2(x), axis=axis, keepdims=keepdims), 2)
    if isinstance(ord, str):
        raise ValueError(f"Invalid norm order '{ord}' for vectors")
    if ord == 0:  # the number of nonzeros: no derivative
        return np.sum(x != 0, axis=axis, keepdims=keepdims).astype(_real_dtype(dtype_of(x)))
    ax = _abs(x)
    if ord == np.inf:
        return np.max(ax, axis=axis, keepdims=keepdims)
    if ord == -np.inf:
        return np.min(ax, axis=axis, keepdims=keepdims)
    if ord == 1:
        return np.sum(ax, axis=axis, keepdims=keepdims)
    return _root(np.sum(ax**ord, axis=axis, keepdims=keepdims), ord)


def _singular_value_norm(y, ord):
    """ord 2 (largest singular value), -2 (smallest) or 'nuc' (their sum) of each matrix of y;
    a zero matrix has norm 0 with gradient 0, as the other norms of zero."""
    zero = np.all(stop_gradient(y) == 0, axis=(-2, -1))
    m, n = shape_of(y)[-2:]
    safe = y + np.expand_dims(zero, (-2, -1)) * np.eye(m, n, dtype=_real_dtype(dtype_of(y)))
    s = np.linalg.svd(safe, compute_uv=False)
    r = s[..., 0] if ord == 2 else (s[..., -1] if ord == -2 else np.sum(s, axis=-1))
    return np.where(zero, 0, r)


def _matrix_norm(x, ord, axes, keepdims):
    if ord in (None, "fro", "f"):
        return _root(np.sum(_abs2(x), axis=axes, keepdims=keepdims), 2)
    y = np.moveaxis(x, axes, (-2, -1))
    if ord in (2, -2, "nuc"):
        r = _singular_value_norm(y, ord)
    elif ord in (1, -1, np.inf, -np.inf):
        sums = np.sum(_abs(y), axis=-2 if ord in (1, -1) else -1)
        r = np.max(sums, axis=-1) if ord > 0 else np.min(sums, axis=-1)
    else:
        raise ValueError("Invalid norm order for matrices.")
    return np.expand_dims(r, tuple(sorted(axes))) if keepdims else r


@implements(np.linalg.norm)
def norm(x, ord=None, axis=None, keepdims=False):
    """Vector norms (any ord) and matrix norms ('fro', 'nuc', 1, -1, 2, -2, inf, -inf)."""
    x = _operand(x)
    nd = ndim_of(x)
    if axis is None:
        if ord is None:
            r = _root(np.sum(_abs2(x)), 2)
            return np.reshape(r, (1,) * nd) if keepdims else r
        if nd not in (1, 2):
            raise ValueError("Improper number of dimensions to norm.")
        axis = tuple(range(nd))
    axes = (
        (int(axis) % nd,)
        if isinstance(axis, (int, np.integer))
        else tuple(int(a) % nd for a in axis)
    )
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2 and axes[0] != axes[1]:
        return _matrix_norm(x, ord, axes, keepdims)
    raise ValueError("Improper number of dimensions to norm.")


@implements(getattr(np.linalg, "vector_norm", None))
def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    x = _operand(x)
    if axis is None:
        r = _vector_norm(np.ravel(x), ord, (0,), False)
        return np.reshape(r, (1,) * ndim_of(x)) if keepdims else r
    return _vector_norm(x, ord, normalize_axis(axis, ndim_of(x)), keepdims)


implements(getattr(np.linalg, "matrix_norm", None))(
    lambda x, /, *, keepdims=False, ord="fro": norm(x, ord, (-2, -1), keepdims)
)


# scipy.linalg's functions are wrapped when SciPy's linalg is imported (see scipy_linalg.py)


# complex values: these rules follow JAX's convention (transposes without conjugation under the
# pairing Re(sum u * v)) and are tested on complex matrices against JAX and finite differences
complex_rules(
    "cholesky",
    "qr",
    "svd",
    "eig",
    "eigh",
    "pinv",
    "slogdet",
    "linalg_conj",
    "linalg_real",
    "linalg_imag",
    "linalg_all_real",
    "cholesky_backward",
)
