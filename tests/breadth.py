"""Checks shared by the tests of NumPy's wider API (statistics, sequences, padding, ufunc methods).

`check_rule(f, *args)` is the whole contract of one rule, against references that are not
gradtape: the value computed while tracing is NumPy's own; the gradient of a weighted sum of
the output agrees with central differences (float64); forward mode agrees with reverse mode
(<u, J t> == <J^T u, t>); and the function compiled with the numpy backend gives the same
value and gradient.
"""

from __future__ import annotations

import warnings

import numpy as np
from conftest import assert_grad_matches, weights_like

import gradtape as gt
from gradtape.core.pytree import tree_flatten


def traced_value(f, *args):
    """f(*args) computed on Tracers (every argument traced)."""
    return gt.vjp(f, *args)[0]


def assert_same_value(got, expected, exact: bool = False, rtol: float = 1e-12):
    """Same shape, dtype and values (NaNs where NumPy has them)."""
    got_leaves, expected_leaves = tree_flatten(got)[0], tree_flatten(expected)[0]
    assert len(got_leaves) == len(expected_leaves)
    for g, e in zip(got_leaves, expected_leaves):
        assert np.shape(g) == np.shape(e), f"shape {np.shape(g)}, NumPy's {np.shape(e)}"
        assert np.asarray(g).dtype == np.asarray(e).dtype, (
            f"dtype {np.asarray(g).dtype}, NumPy's {np.asarray(e).dtype}"
        )
        if exact:
            np.testing.assert_array_equal(g, e)
        else:
            tol = 1e-5 if np.asarray(e).dtype == np.float32 else rtol
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol * 1e-3, equal_nan=True)


def _flat(tree) -> np.ndarray:
    leaves = tree_flatten(tree)[0]
    if not leaves:
        return np.zeros(0)
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in leaves])


def _float_args(args) -> tuple:
    return tuple(
        i
        for i, a in enumerate(args)
        if isinstance(a, float) or (isinstance(a, np.ndarray) and a.dtype.kind == "f")
    )


def _weighted(f, out):
    leaves = tree_flatten(out)[0]
    weights = [weights_like(np.shape(o), np.float64) for o in leaves]

    def scalar(*a):
        return sum(np.sum(w * o) for w, o in zip(weights, tree_flatten(f(*a))[0]))

    return scalar


def check_forward_reverse(f, *args, argnums=None, tol=None):
    """jvp against vjp: <u, J t> == <J^T u, t> for random u, t."""
    nums = _float_args(args) if argnums is None else tuple(argnums)
    rng = np.random.default_rng(1)
    low = any(np.asarray(args[i]).dtype == np.float32 for i in nums)
    tol = tol if tol is not None else (2e-3 if low else 1e-9)

    def g(*diff):
        full = list(args)
        for i, d in zip(nums, diff):
            full[i] = d
        return f(*full)

    primals = tuple(args[i] for i in nums)
    tangents = tuple(
        float(rng.uniform(-1, 1))
        if isinstance(p, float)
        else rng.uniform(-1, 1, np.shape(p)).astype(np.asarray(p).dtype)
        for p in primals
    )
    out, t_out = gt.jvp(g, primals, tangents)
    value, vjp_fn = gt.vjp(g, *primals)
    u_leaves = [
        rng.uniform(-1, 1, np.shape(o)).astype(np.asarray(o).dtype) for o in tree_flatten(value)[0]
    ]
    u = _unflatten_like(value, u_leaves)
    cts = vjp_fn(u)
    lhs = float(np.dot(_flat(u), _flat(t_out)))
    rhs = float(np.dot(_flat(cts), _flat(tangents)))
    size = (
        np.linalg.norm(_flat(u)) * np.linalg.norm(_flat(t_out))
        + np.linalg.norm(_flat(cts)) * np.linalg.norm(_flat(tangents))
        + 1.0
    )
    assert abs(lhs - rhs) <= tol * size, f"<u, J t> = {lhs} but <J^T u, t> = {rhs}"
    assert_same_value(out, value)


def _unflatten_like(value, leaves):
    from gradtape.core.pytree import tree_unflatten

    return tree_unflatten(tree_flatten(value)[1], leaves)


def check_rule(
    f, *args, argnums=None, exact=False, complex_step=False, rtol=None, compiled=True, forward=True
):
    """The value is NumPy's; reverse mode matches central differences; forward mode matches
    reverse mode; gt.compile (numpy backend) gives the same value and gradient."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = f(*args)
        got = traced_value(f, *args)
    assert_same_value(got, expected, exact=exact)
    nums = _float_args(args) if argnums is None else tuple(argnums)
    loss = _weighted(f, expected)
    grads = assert_grad_matches(loss, *args, argnums=nums, complex_step=complex_step, rtol=rtol)
    if forward:
        check_forward_reverse(f, *args, argnums=nums)
    if compiled:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cf = gt.compile(f, backend="numpy")
            assert_same_value(cf(*args), expected, exact=exact)
            cg = gt.compile(gt.grad(loss, argnums=nums), backend="numpy")
            for a, b in zip(cg(*args), grads):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)
    return grads
