"""Forward mode, Jacobians, Hessians and nesting, against references that are not gradtape.

Every rule is checked through `jvp` against central differences of the function (float64),
through the dot-product test <u, J v> (jvp) == <J^T u, v> (vjp), and through jacfwd and
jacrev (the batched interpreters) against a finite-difference Jacobian; then the same three
checks on grad(f) (second order). The rules come from the tables: every differentiable
ufunc (tests/conftest.py's domain table) and every other registered primitive (CASES below,
with a test that fails when a primitive has no case).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import scipy.special as sp
from conftest import (
    BINARY_SHAPES,
    DOMAINS,
    TERNARY_SHAPES,
    UNARY_SHAPES,
    argument_strategy,
    differentiable_ufuncs,
    ufunc_id,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradtape as gt
from gradtape.core.primitive import REGISTRY, Primitive
from gradtape.core.pytree import tree_flatten, tree_map
from gradtape.core.tracing import GradtapeError, current_levels
from gradtape.rules import indexing, reductions, shape
from gradtape.transforms import forward as forward_module

DTYPES = st.sampled_from([np.float64, np.float32])
FEW = settings(max_examples=6, deadline=None)


# --- numerical references (float64, no gradtape) ------------------------------------------------
def _f64(x):
    return x if type(x) is float else np.asarray(x, np.float64)


def _flat(tree) -> np.ndarray:
    leaves, _ = tree_flatten(tree)
    if not leaves:
        return np.zeros(0)
    return np.concatenate([np.ravel(np.asarray(leaf, np.float64)) for leaf in leaves])


def _random_like(x, rng):
    if type(x) is float:  # a Python float (np.float64 is an array scalar here)
        return float(rng.uniform(-1, 1))
    x = np.asarray(x)
    return rng.uniform(-1, 1, x.shape).astype(x.dtype)


def directional_fd(f, primals, tangents, step=6e-6) -> np.ndarray:
    """(f(x + h v) - f(x - h v)) / 2h in float64, flattened over the output's leaves."""
    scale = max([1.0] + [float(np.max(np.abs(_f64(p)), initial=0.0)) for p in primals])
    h = step * scale
    with np.errstate(all="ignore"):
        plus = f(*[_f64(p) + h * _f64(t) for p, t in zip(primals, tangents)])
        minus = f(*[_f64(p) - h * _f64(t) for p, t in zip(primals, tangents)])
    return (_flat(plus) - _flat(minus)) / (2 * h)


def fd_jacobian(f, primals, step=6e-6) -> np.ndarray:
    """The Jacobian of the flattened output by the flattened primals, column by column."""
    sizes = [int(np.size(p)) for p in primals]
    cols = []
    for a, p in enumerate(primals):
        for k in range(sizes[a]):
            tangents = [np.zeros(np.shape(q)) if type(q) is not float else 0.0 for q in primals]
            if type(p) is float:
                tangents[a] = 1.0
            else:
                tangents[a].reshape(-1)[k] = 1.0
            cols.append(directional_fd(f, primals, tangents, step))
    return np.stack(cols, axis=1)


def _dense(jac, out_template, primals) -> np.ndarray:
    """A gradtape Jacobian (argnums a tuple of all primals) as one matrix."""
    out_leaves, _ = tree_flatten(out_template)
    jac_leaves, _ = tree_flatten(jac)  # per output leaf: one block per primal
    rows, j = [], 0
    for o in out_leaves:
        blocks = []
        for p in primals:
            b = np.asarray(jac_leaves[j], np.float64)
            assert b.shape == np.shape(o) + np.shape(p), (b.shape, np.shape(o), np.shape(p))
            blocks.append(b.reshape(int(np.size(o)), int(np.size(p))))
            j += 1
        rows.append(np.concatenate(blocks, axis=1))
    return np.concatenate(rows, axis=0)


def _close(actual, expected, tol, what):
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale, err_msg=what)


def check_forward(f, primals, tol, step=6e-6, f_ref=None, jacobians=True):
    """jvp vs central differences, the dot-product test against vjp, and jacfwd/jacrev vs
    a finite-difference Jacobian. `f_ref` (default f): f for the finite differences, with
    any constants it closes over in float64."""
    f_ref = f if f_ref is None else f_ref
    rng = np.random.default_rng(0)
    primals = tuple(primals)
    tangents = tuple(_random_like(p, rng) for p in primals)
    out, t_out = gt.jvp(f, primals, tangents)
    for o, t in zip(tree_flatten(out)[0], tree_flatten(t_out)[0]):
        assert np.shape(t) == np.shape(o)
    jv = _flat(t_out)
    _close(jv, directional_fd(f_ref, primals, tangents, step), tol, "jvp vs central differences")

    u = tree_map(lambda o: _random_like(o, rng), out)
    value, vjp_fn = gt.vjp(f, *primals)
    cts = vjp_fn(u)
    lhs, rhs = float(np.dot(_flat(u), jv)), float(np.dot(_flat(cts), _flat(tangents)))
    size = (
        np.linalg.norm(_flat(u)) * np.linalg.norm(jv)
        + np.linalg.norm(_flat(cts)) * np.linalg.norm(_flat(tangents))
        + 1.0
    )
    assert abs(lhs - rhs) <= tol * size, f"<u, Jv> = {lhs} but <J^T u, v> = {rhs}"

    if jacobians:
        expected = fd_jacobian(f_ref, primals, step)
        nums = tuple(range(len(primals)))
        for name, jac in (("jacfwd", gt.jacfwd), ("jacrev", gt.jacrev)):
            got = _dense(jac(f, argnums=nums)(*primals), out, primals)
            _close(got, expected, tol, f"{name} vs finite differences")


def check_second_order(f, primals, tol, step=6e-6, f_ref=None, jacobians=True):
    """The checks of check_forward applied to grad(sum(w * f))."""
    out = f(*primals)
    weights = [
        np.linspace(0.5, 1.5, max(int(np.size(o)), 1))[: int(np.size(o))].reshape(np.shape(o))
        for o in tree_flatten(out)[0]
    ]

    def gradient_of(func):
        def scalar(*p):
            leaves = tree_flatten(func(*p))[0]
            return sum(np.sum(w * o) for w, o in zip(weights, leaves))

        return gt.grad(scalar, argnums=tuple(range(len(primals))))

    g_ref = gradient_of(f_ref) if f_ref is not None else None
    check_forward(gradient_of(f), primals, tol, step, g_ref, jacobians)


# --- every elementwise rule ---------------------------------------------------------------------
UFUNCS = differentiable_ufuncs()


def _draw_ufunc_args(data, ufunc, dtype, second=False):
    domain = DOMAINS[ufunc.__name__]
    shapes = data.draw(
        st.sampled_from(
            UNARY_SHAPES
            if domain.arity == 1
            else BINARY_SHAPES
            if domain.arity == 2
            else TERNARY_SHAPES
        )
    )
    shapes = (shapes,) if domain.arity == 1 else shapes
    args = [
        data.draw(argument_strategy(s, iv, dtype), label=f"arg{i}")
        for i, (s, iv) in enumerate(zip(shapes, domain.args))
    ]
    diff = domain.second_args if second else domain.diff_args

    def with_args(constants):
        def f(*d):
            a = list(constants)
            for i, x in zip(diff, d):
                a[i] = x
            return ufunc(*a)

        return f

    f_ref = with_args([a if type(a) is float else np.asarray(a, np.float64) for a in args])
    return with_args(args), tuple(args[i] for i in diff), f_ref


@pytest.mark.parametrize("ufunc", UFUNCS, ids=ufunc_id)
@FEW
@given(data=st.data(), dtype=DTYPES)
def test_ufunc_jvp(ufunc, data, dtype):
    f, primals, f_ref = _draw_ufunc_args(data, ufunc, dtype)
    check_forward(f, primals, 2e-3 if dtype == np.float32 else 1e-5, f_ref=f_ref)


@pytest.mark.parametrize("ufunc", UFUNCS, ids=ufunc_id)
@FEW
@given(data=st.data(), dtype=DTYPES)
def test_ufunc_second_order(ufunc, data, dtype):
    f, primals, f_ref = _draw_ufunc_args(data, ufunc, dtype, second=True)
    check_second_order(f, primals, 1e-2 if dtype == np.float32 else 2e-5, f_ref=f_ref)


# --- every other rule: (function, inputs) generators ------------------------------------------
def _values(draw, shape, dtype, lo=-2.0, hi=2.0):
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def _distinct(draw, shape, dtype):
    """Values at least 0.3 apart (max/min/sort have no ties, so no kinks)."""
    n = int(np.prod(shape))
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    rng = np.random.default_rng(seed)
    return (
        (rng.permutation(n) * 0.3 - 0.15 * n + rng.uniform(0, 0.05, n)).reshape(shape).astype(dtype)
    )


SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


def _axis(draw, ndim):
    if ndim == 0 or draw(st.booleans(), label="axis None"):
        return None
    return tuple(draw(st.sets(st.integers(0, ndim - 1), min_size=1), label="axes"))


@st.composite
def reduction_case(draw, func, lo=-2.0, hi=2.0, distinct=False):
    dtype = draw(DTYPES)
    s = draw(SHAPES)
    x = _distinct(draw, s, dtype) if distinct else _values(draw, s, dtype, lo, hi)
    axis = _axis(draw, len(s))
    keepdims = draw(st.booleans())
    return (lambda x: func(x, axis=axis, keepdims=keepdims)), (x,), dtype


@st.composite
def cumulative_case(draw, func, lo=-2.0, hi=2.0):
    dtype = draw(DTYPES)
    s = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=4))
    x = _values(draw, s, dtype, lo, hi)
    axis = draw(st.one_of(st.none(), st.integers(-len(s), len(s) - 1)))
    return (lambda x: func(x, axis=axis)), (x,), dtype


@st.composite
def reshape_case(draw):
    dtype = draw(DTYPES)
    s = draw(SHAPES)
    x = _values(draw, s, dtype)
    new = draw(st.sampled_from([(-1,), tuple(reversed(s)), s + (1,), (1,) + s]))
    return (lambda x: np.reshape(x, new)), (x,), dtype


@st.composite
def transpose_case(draw):
    dtype = draw(DTYPES)
    s = draw(hnp.array_shapes(min_dims=1, max_dims=4, max_side=3))
    x = _values(draw, s, dtype)
    axes = tuple(draw(st.permutations(range(len(s)))))
    return (lambda x: np.transpose(x, axes) + 0.0), (x,), dtype


@st.composite
def broadcast_case(draw):
    dtype = draw(DTYPES)
    target = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=3))
    nd = draw(st.integers(0, len(target)))
    small = tuple(d if draw(st.booleans()) else 1 for d in target[len(target) - nd :])
    x = _values(draw, small, dtype)
    return (lambda x: np.broadcast_to(x, target)), (x,), dtype


@st.composite
def concatenate_case(draw):
    dtype = draw(DTYPES)
    s = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=3))
    axis = draw(st.integers(0, len(s) - 1))
    s2 = s[:axis] + (draw(st.integers(1, 3)),) + s[axis + 1 :]
    x, y = _values(draw, s, dtype), _values(draw, s2, dtype)
    const = _values(draw, s, dtype)
    return (lambda x, y: np.concatenate([x, const, y], axis=axis)), (x, y), dtype


@st.composite
def astype_case(draw):
    """A cast both ways; the finite differences take a long step (the cast to float32 rounds,
    and the function is linear, so a long step is exact)."""
    dtype = draw(DTYPES)
    other = np.float32 if dtype == np.float64 else np.float64
    x = _values(draw, draw(SHAPES), dtype)
    return (lambda x: x.astype(other) * 1.5), (x,), np.float32, 1e-2


@st.composite
def pad_case(draw):
    dtype = draw(DTYPES)
    s = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=3))
    pw = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in s)
    x = _values(draw, s, dtype)
    return (lambda x: np.pad(x, pw, constant_values=0.5)), (x,), dtype


BASIC_INDICES = [
    (0,),
    (slice(1, 3),),
    (Ellipsis, 1),
    (None, slice(None), 2),
    (slice(None, None, -1), 0, slice(1, None)),
    (-1, Ellipsis, None),
]
ADVANCED_INDICES = [
    (np.array([0, 2, 2]),),
    (slice(None), np.array([1, 0, 1])),
    (np.array([0, 1]), slice(None), np.array([2, 0])),
    (0, slice(None), np.array([1, 2])),
    (np.array([[0], [3]]), np.array([1, 4])),
    (Ellipsis, np.array([2, 0])),
    (np.array([True, False, True, True]),),
]
# setitem with a repeated position keeps one write: those indices are for scatter_add only
SET_INDICES = [
    i
    for i in ADVANCED_INDICES
    if not any(
        isinstance(e, np.ndarray) and e.dtype != bool and len(np.unique(e)) < e.size for e in i
    )
]
X_SHAPE = (4, 5, 3)


@st.composite
def getitem_case(draw, indices):
    dtype = draw(DTYPES)
    idx = draw(st.sampled_from(indices))
    x = _values(draw, X_SHAPE, dtype)
    return (lambda x: x[idx] * 1.0), (x,), dtype


@st.composite
def write_case(draw, indices, add_at):
    dtype = draw(DTYPES)
    idx = draw(st.sampled_from(indices))
    x = _values(draw, X_SHAPE, dtype)
    target = np.zeros(X_SHAPE)[idx].shape
    vshape = target[draw(st.integers(0, len(target))) :]
    v = _values(draw, vshape, dtype)

    def f(x, v):
        if add_at:
            acc = np.zeros_like(x)
            np.add.at(acc, idx, v * v)
            return acc + x
        y = x * 1.0
        y[idx] = v * v
        return y

    return f, (x, v), dtype


@st.composite
def dynamic_index_case(draw, write, scatter=False):
    """x[i, 1:] with i a traced integer (as in a loop body): the dyn_* primitives."""
    dtype = draw(DTYPES)
    x = _values(draw, X_SHAPE, dtype)
    v = _values(draw, X_SHAPE[1:], dtype)
    i = np.int64(draw(st.integers(0, X_SHAPE[0] - 1)))
    template = indexing.normalize_index((indexing._SLOT, slice(1, None)))
    if scatter:
        return (
            (
                lambda x, v: indexing.dyn_scatter_add_p(
                    x, v[1:] ** 2, i, template=template, positions=(0,)
                )
            ),
            (x, v),
            dtype,
        )
    if write:
        return (
            (
                lambda x, v: indexing.dyn_setitem_p(
                    x, v[1:] ** 2, i, template=template, positions=(0,)
                )
            ),
            (x, v),
            dtype,
        )
    return (
        lambda x: indexing.dyn_getitem_p(x, i, template=template, positions=(0,)) * 1.0,
        (x,),
        dtype,
    )


@st.composite
def scan_case(draw):
    """A scan with a carry, per-step outputs and a closed-over traced value; fori_loop too."""
    dtype = draw(DTYPES)
    c0 = _values(draw, (2,), dtype, 0.5, 1.5)
    xs = _values(draw, (draw(st.integers(1, 4)), 2), dtype)

    def f(c0, xs):
        def body(c, x):
            return c * np.sin(x) + 0.5 * x * c0, np.sum(c * x)

        carry, ys = gt.scan(body, c0, xs)
        return carry, ys, gt.fori_loop(0, len(xs), lambda i, c: np.cos(c) * xs[i], c0)

    return f, (c0, xs), dtype


@st.composite
def scan_bwd_case(draw):
    """The gradient of a scan: its backward loop (hessian-vector products go through it)."""
    dtype = draw(DTYPES)
    c0 = _values(draw, (2,), dtype, 0.5, 1.5)
    xs = _values(draw, (draw(st.integers(1, 3)), 2), dtype)

    def loss(c0, xs):
        carry, ys = gt.scan(lambda c, x: (np.sin(c * x) + c0 * x, np.sum(c * c)), c0, xs)
        return np.sum(carry) + np.sum(ys)

    return gt.grad(loss, argnums=(0, 1)), (c0, xs), dtype


@st.composite
def while_case(draw):
    dtype = draw(DTYPES)
    x = _values(draw, (2,), dtype, 0.5, 1.5)

    def f(x):
        def body(c):
            v, k = c
            return np.sin(v) * x + v, k + 1.0

        return gt.while_loop(lambda c: c[1] < 3.0, body, (x * x, 0.0))[0]

    return f, (x,), dtype


@st.composite
def where_case(draw):
    dtype = draw(DTYPES)
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3))
    c = _values(draw, shapes.input_shapes[0], np.float64) > 0
    x = _values(draw, shapes.input_shapes[1], dtype)
    y = _values(draw, shapes.input_shapes[2], dtype)
    return (lambda x, y: np.where(c, x * x, y)), (x, y), dtype


@st.composite
def full_like_case(draw):
    dtype = draw(DTYPES)
    x = _values(draw, draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=4)), dtype)

    def f(x):
        y = np.ones_like(x)
        y[0] = np.sin(x[0])
        return y * x

    return f, (x,), dtype


@gt.custom_jvp
def softplus(x):
    return np.log1p(np.exp(x))


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softplus(x), t * sp.expit(x)


@gt.custom_vjp
def cube(x):
    return x**3


cube.defvjp(lambda x: (x**3, x), lambda x, g: (3 * x * x * g,))
cube.defjvp(lambda primals, tangents: (primals[0] ** 3, 3 * primals[0] ** 2 * tangents[0]))


@st.composite
def custom_case(draw, func):
    dtype = draw(DTYPES)
    x = _values(draw, draw(SHAPES), dtype)
    return (lambda x: func(x) * 1.0), (x,), dtype


def _linalg_cases() -> dict:
    """Cases for the linear-algebra primitives (their JVPs live in rules/linalg.py)."""

    @st.composite
    def matmul(draw):
        dtype = draw(DTYPES)
        a_shape, b_shape = draw(
            st.sampled_from(
                [
                    ((3,), (3,)),
                    ((2, 3), (3,)),
                    ((3,), (3, 2)),
                    ((2, 3), (3, 4)),
                    ((2, 2, 3), (3, 2)),
                ]
            )
        )
        a, b = _values(draw, a_shape, dtype), _values(draw, b_shape, dtype)
        return (lambda a, b: a @ b), (a, b), dtype

    @st.composite
    def einsum(draw):
        dtype = draw(DTYPES)
        a, b = _values(draw, (2, 3), dtype), _values(draw, (3, 4), dtype)
        return (lambda a, b: np.einsum("ij,jk->ik", a, b)), (a, b), dtype

    @st.composite
    def square(draw, func, spd=False):
        dtype = np.float64
        n = draw(st.integers(1, 3))
        a = _values(draw, (n, n), dtype)
        a = a @ a.T + n * np.eye(n) if spd else a + 3 * np.eye(n)
        return func, (a,), dtype

    @st.composite
    def solve(draw):
        n = draw(st.integers(1, 3))
        a = _values(draw, (n, n), np.float64) + 3 * np.eye(n)
        b = _values(draw, (n, 2), np.float64)
        return (lambda a, b: np.linalg.solve(a, b)), (a, b), np.float64

    @st.composite
    def stacked_solve(draw):
        n = draw(st.integers(1, 3))
        a = _values(draw, (2, n, n), np.float64) + 3 * np.eye(n)
        b = _values(draw, (2, n, 2), np.float64)
        return (lambda a, b: np.linalg.solve(a, b)), (a, b), np.float64

    @st.composite
    def triangular(draw):
        n = draw(st.integers(1, 3))
        a = _values(draw, (n, n), np.float64) + 3 * np.eye(n)
        b = _values(draw, (n, 2), np.float64)
        return (lambda a, b: linalg.triangular_solve(a, b, lower=True)), (a, b), np.float64

    @st.composite
    def general(draw, func):
        """A real matrix with well separated eigenvalues, a complex pair among them."""
        n = draw(st.integers(2, 3))
        d = np.diag(np.arange(1.0, n + 1) * 1.5)
        d[:2, :2] = [[1.0, 2.0], [-2.0, 1.0]]
        return func, (d + 0.2 * _values(draw, (n, n), np.float64),), np.float64

    def eig_parts(a):  # real outputs: the complex helpers are part of the path
        w, v = np.linalg.eig(a)
        return linalg._re(w), linalg._im(w), linalg._re(v * linalg._cj(v[..., :1, :]))

    def sym(f):
        return lambda a: f(0.5 * (a + a.T))

    from gradtape.rules import linalg

    return {
        "matmul": matmul(),
        "einsum": einsum(),
        "solve": stacked_solve(),
        "lu_solve": solve(),
        "triangular_solve": triangular(),
        "eig": general(eig_parts),
        "linalg_real": general(lambda a: linalg._re(np.linalg.eigvals(a))),
        "linalg_imag": general(lambda a: linalg._im(np.linalg.eigvals(a))),
        "linalg_conj": general(lambda a: linalg._im(linalg._cj(np.linalg.eigvals(a)))),
        "svd": square(lambda a: (lambda u, s, vh: (u @ vh, s))(*np.linalg.svd(a))),
        "pinv": square(np.linalg.pinv),
        "inv": square(np.linalg.inv),
        "det": square(np.linalg.det),
        "slogdet": square(lambda a: np.linalg.slogdet(a)[1]),
        "cholesky": square(sym(np.linalg.cholesky), spd=True),
        "eigh": square(sym(lambda a: tuple(np.linalg.eigh(a))), spd=True),
        "qr": square(lambda a: tuple(np.linalg.qr(a))),
        "qr complete": square(lambda a: tuple(np.linalg.qr(a[:, :1], "complete"))),
    }


CASES = {
    "reduce_sum": reduction_case(np.sum),
    "reduce_prod": reduction_case(np.prod, 0.5, 1.5),
    "reduce_max": reduction_case(np.max, distinct=True),
    "reduce_min": reduction_case(np.min, distinct=True),
    "cumsum": cumulative_case(np.cumsum),
    "cumprod": cumulative_case(np.cumprod, 0.5, 1.5),
    "reshape": reshape_case(),
    "transpose": transpose_case(),
    "broadcast_to": broadcast_case(),
    "concatenate": concatenate_case(),
    "astype": astype_case(),
    "pad": pad_case(),
    "full_like": full_like_case(),
    "getitem": getitem_case(BASIC_INDICES),
    "getitem advanced": getitem_case(ADVANCED_INDICES),
    "setitem": write_case(BASIC_INDICES, add_at=False),
    "setitem advanced": write_case(SET_INDICES, add_at=False),
    "scatter_add": write_case(ADVANCED_INDICES, add_at=True),
    "where": where_case(),
    "dyn_getitem": dynamic_index_case(write=False),
    "dyn_setitem": dynamic_index_case(write=True),
    "dyn_scatter_add": dynamic_index_case(write=True, scatter=True),
    "scan": scan_case(),
    "scan_bwd": scan_bwd_case(),
    "while_loop": while_case(),
    "custom_jvp": custom_case(softplus),
    "custom_vjp": custom_case(cube),
    **{k: v for k, v in _linalg_cases().items() if k in REGISTRY},
}


def test_every_primitive_has_a_case():
    """Every differentiable primitive of the rule modules has a case above (or is elementwise;
    transparent primitives are differentiated through their implementation)."""
    from gradtape.control import loops
    from gradtape.rules import linalg

    names = {
        p.name
        for mod in (reductions, shape, indexing, linalg, loops)
        for p in vars(mod).values()
        if isinstance(p, Primitive) and not p.nondiff and p.partials is None and not p.transparent
    }
    covered = {k.split()[0] for k in CASES}
    assert names - covered == set(), "add a case to CASES for these primitives"


@pytest.mark.parametrize("name", sorted(CASES))
@FEW
@given(data=st.data())
def test_rule_jvp(name, data):
    f, primals, dtype, *step = data.draw(CASES[name])
    check_forward(f, primals, 2e-3 if dtype == np.float32 else 1e-5, *step)


@pytest.mark.parametrize("name", sorted(CASES))
@FEW
@given(data=st.data())
def test_rule_second_order(name, data):
    f, primals, dtype, *step = data.draw(CASES[name])
    check_second_order(f, primals, 1e-2 if dtype == np.float32 else 2e-5, *step)


# --- Jacobians: layout, modes, chunks ---------------------------------------------------------
def test_jacobian_layout_follows_jax():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")

    params = {"w": np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]]), "b": np.array([0.1, -0.2])}
    x = np.array([0.3, -1.1, 0.8])

    def make(m):
        def f(p, x):
            h = m.tanh(m.sum(p["w"] * x, axis=1) + p["b"])
            return {"h": h, "s": m.sum(h * h)}, m.exp(x[0]) * p["b"]

        return f

    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        for ours, theirs in (
            (gt.jacfwd, jax.jacfwd),
            (gt.jacrev, jax.jacrev),
            (lambda f, argnums: gt.jacobian(f, argnums), jax.jacfwd),
        ):
            for argnums in (0, 1, (0, 1)):
                got = ours(make(np), argnums=argnums)(params, x)
                want = theirs(make(jnp), argnums=argnums)(params, x)
                got_leaves, got_td = tree_flatten(got)
                want_leaves = jax.tree_util.tree_leaves(want)
                assert len(got_leaves) == len(want_leaves)
                assert str(got_td) == str(
                    tree_flatten(tree_map(np.asarray, jax.tree_util.tree_map(np.asarray, want)))[1]
                )
                for g, w in zip(got_leaves, want_leaves):
                    assert g.shape == w.shape
                    np.testing.assert_allclose(g, np.asarray(w), rtol=1e-12, atol=1e-12)
    finally:
        jax.config.update("jax_enable_x64", x64)


@pytest.mark.parametrize("mode", ["auto", "forward", "reverse"])
@pytest.mark.parametrize("n, m", [(2, 7), (7, 2), (4, 4)])
def test_jacobian_modes_agree_with_finite_differences(mode, n, m):
    rng = np.random.default_rng(n * 10 + m)
    w = rng.normal(size=(m, n))
    x = rng.normal(size=n)

    def f(x):
        return np.sin(np.sum(w * x, axis=1)) * np.sum(x * x) + x[0]

    expected = fd_jacobian(f, (x,))
    got = gt.jacobian(f, mode=mode)(x)
    assert got.shape == (m, n)
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-8)


def test_jacobian_in_chunks(monkeypatch):
    """Large batches go through in chunks of directions (here: a few at a time)."""
    monkeypatch.setattr(forward_module, "_MAX_BATCH_ELEMENTS", 25)
    x = np.linspace(-1, 1, 10)

    def f(x):
        return np.cumsum(np.exp(x) * x[::-1])[2:]

    expected = fd_jacobian(f, (x,))
    np.testing.assert_allclose(gt.jacfwd(f)(x), expected, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(gt.jacrev(f)(x), expected, rtol=1e-7, atol=1e-9)


def test_jacobian_dtypes_and_constant_outputs():
    x = np.linspace(0.1, 1, 4).astype(np.float32)
    jf = gt.jacfwd(lambda x: (np.sin(x), np.ones(2, np.float32)))(x)
    assert jf[0].dtype == np.float32 and jf[1].dtype == np.float32
    np.testing.assert_allclose(jf[0], np.diag(np.cos(x)), rtol=1e-6)
    assert jf[1].shape == (2, 4) and not jf[1].any()
    jr = gt.jacrev(lambda x: np.sin(x) * 2.0)(x)
    assert jr.dtype == np.float32
    np.testing.assert_allclose(jr, np.diag(2 * np.cos(x)), rtol=1e-6)


def test_jacobian_has_aux():
    x = np.array([1.0, 2.0])
    jac, aux = gt.jacfwd(lambda x: (x**2, {"n": np.sum(x)}), has_aux=True)(x)
    np.testing.assert_allclose(jac, np.diag(2 * x))
    assert aux == {"n": 3.0} and not hasattr(aux["n"], "_var")
    jac, aux = gt.jacrev(lambda x: (x**2, "label"), has_aux=True)(x)
    np.testing.assert_allclose(jac, np.diag(2 * x))
    assert aux == "label"


def test_jacrev_through_masked_branch_is_exact():
    """The backward pass is recorded once at a generic cotangent; masks that depend on the
    cotangent being zero stay right for every row."""
    x = np.array([0.0, 1.0, 4.0, -1.0])

    def f(x):
        with np.errstate(all="ignore"):
            return np.where(x > 0, np.sqrt(x), 0.0) * np.array([1.0, 2.0, 3.0, 4.0])

    expected = np.diag([0.0, 1.0, 0.75, 0.0])
    np.testing.assert_array_equal(gt.jacrev(f)(x), expected)
    np.testing.assert_array_equal(gt.jacfwd(f)(x), expected)


# --- Hessians and Hessian-vector products of real functions -------------------------------------
DATA = np.random.default_rng(1).normal(0.7, 2.0, size=50)


def normal_loglik(theta):
    mu, log_sigma = theta[0], theta[1]
    z = (DATA - mu) * np.exp(-log_sigma)
    return np.sum(-0.5 * z * z - log_sigma - 0.5 * np.log(2 * np.pi))


def normal_loglik_hessian(theta):
    mu, s = theta
    r = DATA - mu
    e = np.exp(-2 * s)
    off = -2 * np.sum(r) * e
    return np.array([[-DATA.size * e, off], [off, -2 * np.sum(r * r) * e]])


X_LOGIT = np.random.default_rng(2).normal(size=(40, 3))
Y_LOGIT = (np.random.default_rng(3).random(40) < 0.4).astype(float)


def logistic_loglik(beta):
    z = X_LOGIT @ beta
    return np.sum(Y_LOGIT * z - np.logaddexp(0.0, z))


def logistic_loglik_hessian(beta):
    p = sp.expit(X_LOGIT @ beta)
    return -(X_LOGIT.T * (p * (1 - p))) @ X_LOGIT


def rosenbrock(x):
    return np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


HESSIAN_CASES = [
    ("normal log-likelihood", normal_loglik, normal_loglik_hessian, np.array([0.2, 0.4])),
    ("logistic regression", logistic_loglik, logistic_loglik_hessian, np.array([0.3, -0.5, 0.8])),
    ("rosenbrock", rosenbrock, scipy.optimize.rosen_hess, np.array([-1.2, 1.0, 0.7, 1.3, 0.2])),
]


def _fd_hessian(f, x):
    """Central differences of the gradient given by the closed-form-checked grad."""
    g = gt.grad(f)
    h = 1e-5
    cols = [(g(x + h * e) - g(x - h * e)) / (2 * h) for e in np.eye(x.size)]
    return np.stack(cols, axis=1)


@pytest.mark.parametrize(
    "name, f, closed_form, x", HESSIAN_CASES, ids=[c[0] for c in HESSIAN_CASES]
)
def test_hessian(name, f, closed_form, x):
    hess = gt.hessian(f)(x)
    expected = closed_form(x)
    np.testing.assert_allclose(hess, expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(hess, hess.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hess, _fd_hessian(f, x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gt.jacfwd(gt.jacrev(f))(x), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gt.jacrev(gt.jacfwd(f))(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "name, f, closed_form, x", HESSIAN_CASES, ids=[c[0] for c in HESSIAN_CASES]
)
def test_hvp(name, f, closed_form, x):
    v = np.linspace(-1, 1, x.size)
    np.testing.assert_allclose(gt.hvp(f, x, v), closed_form(x) @ v, rtol=1e-10, atol=1e-10)


def test_hvp_rosenbrock_large_matches_scipy():
    x = np.random.default_rng(4).uniform(-1, 1.5, 1000)
    v = np.random.default_rng(5).normal(size=1000)
    np.testing.assert_allclose(
        gt.hvp(rosenbrock, x, v), scipy.optimize.rosen_hess_prod(x, v), rtol=1e-11, atol=1e-9
    )


def test_hessian_of_pytree_argument_and_float32():
    def f(p):
        return np.sum(p["a"] ** 3) * p["b"] + p["b"] ** 2

    p = {"a": np.array([1.0, 2.0], np.float32), "b": np.float32(3.0)}
    h = gt.hessian(f)(p)
    assert h["a"]["a"].shape == (2, 2) and h["a"]["b"].shape == (2,) and h["b"]["b"].shape == ()
    assert h["a"]["a"].dtype == np.float32
    np.testing.assert_allclose(h["a"]["a"], np.diag(6 * p["a"] * p["b"]), rtol=1e-6)
    np.testing.assert_allclose(h["a"]["b"], 3 * p["a"] ** 2, rtol=1e-6)
    np.testing.assert_allclose(h["b"]["a"], 3 * p["a"] ** 2, rtol=1e-6)
    np.testing.assert_allclose(h["b"]["b"], 2.0)


def test_hessian_with_argnums_and_aux():
    def f(x, y):
        return np.sum(x * x * y), "aux"

    (hxx, hxy), aux = gt.hessian(f, argnums=(0, 1), has_aux=True)(np.array([1.0, 2.0]), 3.0)
    assert aux == "aux"
    np.testing.assert_allclose(hxx[0], 2 * 3.0 * np.eye(2))
    np.testing.assert_allclose(hxx[1], [2.0, 4.0])


# --- nesting and perturbation confusion ----------------------------------------------------------
def f_scalar(x):
    return x * x * np.sin(x)


def f3(x):  # the third derivative of x^2 sin x
    return 6 * np.cos(x) - 6 * x * np.sin(x) - x * x * np.cos(x)


def f2(x):
    return 2 * np.sin(x) + 4 * x * np.cos(x) - x * x * np.sin(x)


def test_grad_grad_grad():
    for x in (0.3, -1.7, 2.5):
        assert gt.grad(gt.grad(gt.grad(f_scalar)))(x) == pytest.approx(f3(x), rel=1e-12)


def test_jvp_of_grad_and_grad_of_jvp():
    x = 0.9
    assert gt.jvp(gt.grad(f_scalar), (x,), (2.0,))[1] == pytest.approx(2 * f2(x), rel=1e-12)
    g = gt.grad(lambda x: gt.jvp(f_scalar, (x,), (1.0,))[1])
    assert g(x) == pytest.approx(f2(x), rel=1e-12)
    third = gt.jvp(lambda x: gt.jvp(gt.grad(f_scalar), (x,), (1.0,))[1], (x,), (1.0,))[1]
    assert third == pytest.approx(f3(x), rel=1e-12)


def test_third_derivative_tensor():
    x = np.array([0.5, -1.0, 2.0])
    t = gt.jacfwd(gt.hessian(lambda x: np.sum(x**3) + x[0] * x[1] * x[2]))(x)
    expected = np.zeros((3, 3, 3))
    expected[np.arange(3), np.arange(3), np.arange(3)] = 6.0
    for p in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
        expected[p] = 1.0
    np.testing.assert_allclose(t, expected, atol=1e-12)


def test_grad_of_jacobian():
    w = np.array([[1.0, 2.0], [0.5, -1.0], [0.3, 0.2]])

    def frob(x):
        j = gt.jacfwd(lambda x: np.tanh(np.sum(w * x, axis=1)))(x)
        return np.sum(j * j)

    x = np.array([0.4, -0.3])
    h = 1e-6
    fd = np.array([(frob(x + h * e) - frob(x - h * e)) / (2 * h) for e in np.eye(2)])
    np.testing.assert_allclose(gt.grad(frob)(x), fd, rtol=1e-6)
    np.testing.assert_allclose(
        gt.grad(lambda x: np.sum(gt.jacrev(lambda x: np.tanh(np.sum(w * x, axis=1)))(x) ** 2))(x),
        fd,
        rtol=1e-6,
    )


def test_no_perturbation_confusion():
    assert gt.grad(lambda x: x * gt.grad(lambda y: x + y)(1.0))(1.0) == 1.0
    jvp_inner = gt.jvp(lambda x: x * gt.jvp(lambda y: x + y, (1.0,), (1.0,))[1], (1.0,), (1.0,))
    assert jvp_inner == (1.0, 1.0)
    # mixed: d/dx [x * d/dy (x y)] = d/dx x^2 = 2x
    assert gt.jvp(lambda x: x * gt.grad(lambda y: x * y)(1.0), (3.0,), (1.0,))[1] == 6.0
    assert gt.grad(lambda x: x * gt.jvp(lambda y: x * y, (1.0,), (1.0,))[1])(3.0) == 6.0
    assert gt.hvp(lambda x: x * gt.grad(lambda y: x * y * y)(1.0), 2.0, 1.0) == 4.0


# --- custom rules ---------------------------------------------------------------------------------
def test_custom_jvp_rule_is_used_in_both_modes():
    x = np.array([1000.0, 0.0, -3.0])  # the body's own derivative overflows at 1000
    with np.errstate(over="ignore"):
        _, t = gt.jvp(lambda x: softplus(x), (x,), (np.ones(3),))
        g = gt.grad(lambda x: np.sum(softplus(x)))(x)
        h = gt.hessian(lambda x: np.sum(softplus(x)))(x)
    np.testing.assert_allclose(t, sp.expit(x), rtol=1e-14)
    np.testing.assert_allclose(g, sp.expit(x), rtol=1e-14)
    np.testing.assert_allclose(h, np.diag(sp.expit(x) * sp.expit(-x)), rtol=1e-12, atol=1e-300)


def test_custom_jvp_rule_not_the_body():
    @gt.custom_jvp
    def f(x, y):
        return x * y

    @f.defjvp
    def f_jvp(primals, tangents):  # deliberately not the body's derivative
        (x, y), (tx, ty) = primals, tangents
        return f(x, y), 3.0 * tx + 5.0 * ty

    x, y = np.array([1.0, 2.0]), np.array([4.0, -1.0])
    assert f_jvp.__name__ == "f_jvp"  # defjvp returns the rule (a decorator)
    np.testing.assert_allclose(gt.jvp(f, (x, y), (np.ones(2), np.zeros(2)))[1], 3.0)
    gx, gy = gt.grad(lambda x, y: np.sum(f(x, y)), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx, 3.0)
    np.testing.assert_allclose(gy, 5.0)
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(f(x, y)))(x), 3.0)  # y: zero tangent
    np.testing.assert_allclose(gt.jacrev(f)(x, y), 3.0 * np.eye(2))
    np.testing.assert_allclose(gt.jacfwd(f, argnums=1)(x, y), 5.0 * np.eye(2))
    np.testing.assert_allclose(f(x, y), x * y)  # plain calls run the body
    assert len(gt.trace(f, x, y)) == 1  # staging traces the body


def test_custom_vjp_under_forward_mode():
    x = np.array([0.5, -2.0])
    np.testing.assert_allclose(gt.jvp(cube, (x,), (np.ones(2),))[1], 3 * x * x)
    np.testing.assert_allclose(gt.hessian(lambda x: np.sum(cube(x)))(x), np.diag(6 * x))

    @gt.custom_vjp
    def no_jvp(x):
        return np.sin(x)

    no_jvp.defvjp(lambda x: (np.sin(x), x), lambda x, g: (np.cos(x) * g,))
    np.testing.assert_allclose(gt.jacrev(no_jvp)(x), np.diag(np.cos(x)))
    with pytest.raises(GradtapeError, match=r"no forward-mode rule.*defjvp"):
        gt.jvp(no_jvp, (x,), (np.ones(2),))
    with pytest.raises(GradtapeError, match="defjvp"):
        gt.jacfwd(no_jvp)(x)
    assert current_levels() == []


def test_jacrev_gives_a_custom_vjp_bwd_plain_cotangents():
    """A user's bwd may not be traceable: jacrev runs it once per row on plain arrays."""
    seen = []

    @gt.custom_vjp
    def f(x):
        return np.sin(x)

    def f_bwd(x, g):
        seen.append(type(g))
        return (np.cos(x) * g,)

    f.defvjp(lambda x: (np.sin(x), x), f_bwd)
    x = np.array([0.5, -2.0, 1.0])
    np.testing.assert_allclose(gt.jacrev(f)(x), np.diag(np.cos(x)))
    assert seen == [np.ndarray] * 3


def test_custom_jvp_without_rule_is_an_error():
    @gt.custom_jvp
    def f(x):
        return x

    with pytest.raises(GradtapeError, match="defjvp"):
        gt.grad(lambda x: np.sum(f(x)))(np.ones(2))


# --- bad input --------------------------------------------------------------------------------
def test_jvp_tangent_mismatches():
    x = np.ones(3)
    f = np.sin
    with pytest.raises(GradtapeError, match=r"shape \(2,\).*shape \(3,\)"):
        gt.jvp(f, (x,), (np.ones(2),))
    with pytest.raises(GradtapeError, match="dtype float32.*float64"):
        gt.jvp(f, (x,), (np.ones(3, np.float32),))
    with pytest.raises(GradtapeError, match="structure"):
        gt.jvp(lambda p: p[0] * p[1], ((x, x),), ([x, x],))
    with pytest.raises(GradtapeError, match="structure"):
        gt.jvp(lambda p: p["a"], ({"a": x},), ({"b": x},))
    with pytest.raises(GradtapeError, match="2 primals but 1 tangents"):
        gt.jvp(lambda a, b: a * b, (x, x), (x,))
    with pytest.raises(GradtapeError, match="tuples"):
        gt.jvp(f, x, x)
    with pytest.raises(GradtapeError, match="str"):
        gt.jvp(f, (x,), ("one",))
    with pytest.raises(GradtapeError, match="int"):
        gt.jvp(f, (np.arange(3),), (np.arange(3),))
    # a Python number takes its primal's dtype
    assert gt.jvp(lambda x: x * 2, (np.float32(1.5),), (1.0,))[1].dtype == np.float32


def test_jacobian_of_non_array_output():
    x = np.ones(2)
    for jac in (gt.jacfwd, gt.jacrev, gt.jacobian):
        with pytest.raises(GradtapeError, match="str.*not an array"):
            jac(lambda x: "nope")(x)
        with pytest.raises(GradtapeError, match="int64.*no derivative"):
            jac(lambda x: np.argsort(x))(x)
    with pytest.raises(GradtapeError, match="not an array"):
        gt.jvp(lambda x: (x, object()), (x,), (x,))
    with pytest.raises(GradtapeError, match="mode"):
        gt.jacobian(np.sin, mode="sideways")


def test_hessian_of_non_scalar():
    with pytest.raises(GradtapeError, match=r"hessian of .* scalar output.*shape \(2,\)"):
        gt.hessian(np.sin)(np.ones(2))
    with pytest.raises(GradtapeError, match=r"hvp of .* scalar output"):
        gt.hvp(lambda x: x * 2, np.ones(2), np.ones(2))
    with pytest.raises(GradtapeError, match="scalar output.*str"):
        gt.hessian(lambda x: "x")(np.ones(2))


def test_raising_function_leaves_no_state():
    def bad(x):
        y = np.sin(x)
        raise ValueError("inside")
        return y

    for call in (
        lambda: gt.jvp(bad, (np.ones(2),), (np.ones(2),)),
        lambda: gt.jacfwd(bad)(np.ones(2)),
        lambda: gt.jacrev(bad)(np.ones(2)),
        lambda: gt.hessian(bad)(np.ones(2)),
        lambda: gt.hvp(bad, 1.0, 1.0),
        lambda: gt.jvp(lambda x: gt.jvp(bad, (x,), (x,))[1], (1.0,), (1.0,)),
    ):
        with pytest.raises(ValueError, match="inside"):
            call()
        assert current_levels() == []


def test_leaked_tracer_is_reported():
    leaked = []

    def f(x):
        leaked.append(x)
        return x * 2

    gt.jvp(f, (1.0,), (1.0,))
    with pytest.raises(GradtapeError, match="finished transformation"):
        gt.jvp(lambda y: y * leaked[0], (1.0,), (1.0,))


def test_forward_mode_under_compile():
    """compile records the forward interpreter's work too; replays match the eager results."""
    x = np.array([0.3, -1.0, 2.0])

    def f(x):
        return np.sin(x) * x[::-1] + softplus(x)

    jac = gt.compile(gt.jacfwd(f))
    hvp = gt.compile(lambda x, v: gt.hvp(lambda x: np.sum(f(x) ** 2), x, v))
    for scale in (1.0, 2.0):
        np.testing.assert_allclose(
            jac(x * scale), fd_jacobian(f, (x * scale,)), rtol=1e-7, atol=1e-9
        )
        v = np.array([1.0, 0.5, -0.25])
        g = gt.grad(lambda x: np.sum(f(x) ** 2))
        h = 1e-5
        np.testing.assert_allclose(
            hvp(x * scale, v), (g(x * scale + h * v) - g(x * scale - h * v)) / (2 * h), rtol=1e-6
        )
