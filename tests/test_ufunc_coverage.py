"""Every ufunc of NumPy, and every method of every differentiable one.

The walk over `np.__dict__` is what makes the README's "every differentiable ufunc" checkable:
each ufunc has a derivative rule, or is recorded as having none (with the reason), or raises a
GradtapeError on a traced value. The ufuncs the domain table of conftest does not cover (two
outputs, integer arguments, gufuncs) are checked numerically here; their methods (outer,
reduce, accumulate, reduceat, at) are checked for every differentiable binary ufunc.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from breadth import assert_same_value, check_rule, traced_value
from conftest import DOMAINS

import gradtape as gt
from gradtape.core.routes import UFUNC_METHODS, UFUNCS
from gradtape.rules.ufunc_methods import NONDIFFERENTIABLE, _reduce_is_a_fold

NUMPY_UFUNCS = sorted(
    {v for v in vars(np).values() if isinstance(v, np.ufunc)}, key=lambda uf: uf.__name__
)
RNG = np.random.default_rng(0)
X = np.array([0.7, -1.3, 2.1, 0.4])
POS = np.array([0.7, 1.3, 2.1, 0.4])

# ufuncs whose rules the domain table does not reach: name -> (function of float args, args)
EXTRA = {
    "modf": (lambda x: np.modf(x), (np.array([1.7, -2.3, 0.4]),)),
    "frexp": (lambda x: np.frexp(x)[0], (np.array([1.7, -2.3, 0.4, 5.0]),)),
    "divmod": (lambda x, y: np.divmod(x, y)[1], (np.array([5.3, 5.8]), np.array([2.1, 2.4]))),
    "ldexp": (lambda x: np.ldexp(x, np.array([1, -2, 3])), (np.array([1.7, -2.3, 0.4]),)),
    "conjugate": (np.conjugate, (X,)),
    "nextafter": (lambda x, y: np.nextafter(x, y), (X, np.array([0.0, 5.0, -1.0, 2.0]))),
    "heaviside": (lambda h: np.heaviside(np.array([-1.0, 0.0, 2.0]), h), (np.array(0.3),)),
    "matmul": (np.matmul, (RNG.normal(size=(2, 3)), RNG.normal(size=(3, 2)))),
    "vecdot": (lambda a, b: np.vecdot(a, b), (RNG.normal(size=(2, 3)), RNG.normal(size=3))),
    "matvec": (lambda a, b: np.matvec(a, b), (RNG.normal(size=(2, 3)), RNG.normal(size=3))),
    "vecmat": (lambda a, b: np.vecmat(a, b), (RNG.normal(size=3), RNG.normal(size=(2, 3, 4)))),
}


# (NumPy's matvec and vecmat are new in 2.2: gradtape declares their rules where they exist)
NEW_IN_NUMPY = {name for name in ("matvec", "vecmat") if not hasattr(np, name)}
NEW_IN_NUMPY_NAMES = NEW_IN_NUMPY | ({"vecdot"} if not hasattr(np, "vecdot") else set())
for _name in NEW_IN_NUMPY:
    del EXTRA[_name]


# gufuncs' core-axis keywords (axes=, axis=, keepdims=): name -> (function, args)
A34, B34, T435 = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4)), RNG.normal(size=(4, 3, 5))
CORE_AXES = {
    "vecdot axis=0": (lambda a, b: np.vecdot(a, b, axis=0), (A34, B34)),
    "vecdot axis=-1": (lambda a, b: np.vecdot(a, b, axis=-1), (A34, B34)),
    "vecdot keepdims": (lambda a, b: np.vecdot(a, b, axis=0, keepdims=True), (A34, B34)),
    "vecdot axes, broadcast": (
        lambda a, b: np.vecdot(a, b[:, :1], axes=[(0,), (0,), ()]),
        (A34, B34),
    ),
    "vecdot axes without the output's": (lambda a, b: np.vecdot(a, b, axes=[0, 0]), (A34, B34)),
    "matmul axes": (lambda a, b: np.matmul(a, b, axes=[(1, 0), (0, 1), (1, 0)]), (A34, B34)),
    "matvec axes": (lambda t, v: np.matvec(t, v, axes=[(0, 1), (0,), (0,)]), (T435, A34[:, 0])),
    "vecmat axes": (lambda v, t: np.vecmat(v, t, axes=[(0,), (1, 0), (0,)]), (A34[:, 1], T435)),
}
for _name in [n for n in CORE_AXES if n.split()[0] in NEW_IN_NUMPY_NAMES]:
    del CORE_AXES[_name]


@pytest.mark.parametrize("name", sorted(CORE_AXES))
def test_gufunc_core_axes(name):
    f, args = CORE_AXES[name]
    check_rule(f, *args)


def test_gufunc_core_axes_are_checked_as_numpy_checks_them():
    with pytest.raises(TypeError):
        gt.grad(lambda m: np.sum(np.matmul(m, m.T, axis=0)))(A34)  # matmul has 2-d cores
    with pytest.raises(ValueError, match="does not match"):
        gt.grad(lambda x: np.sum(np.vecdot(x, x, axes=[(0, 1), (0,)])))(A34)


def _kind(uf) -> str:
    prim = UFUNCS.get(uf)
    if prim is None:
        return "refused"
    return "no derivative" if prim.nondiff else "rule"


@pytest.mark.parametrize("uf", NUMPY_UFUNCS, ids=lambda uf: uf.__name__)
def test_every_numpy_ufunc_has_a_rule_a_reason_or_a_clear_error(uf):
    kind = _kind(uf)
    if kind == "rule":
        assert (
            uf.__name__ in DOMAINS
            or uf.__name__ in EXTRA
            or any(getattr(np, alias, None) is uf and alias in DOMAINS for alias in DOMAINS)
        ), f"np.{uf.__name__} has a rule but no numerical check (DOMAINS or EXTRA)"
    elif kind == "no derivative":
        assert uf.__name__ in NONDIFFERENTIABLE, f"record why np.{uf.__name__} has no derivative"
    else:
        args = [np.array([1.0, 2.0])] * uf.nin
        with pytest.raises(gt.GradtapeError, match=uf.__name__):
            gt.grad(lambda x: np.sum(uf(x, *args[1:])))(args[0])


def test_every_differentiable_ufunc_is_a_rule_today():
    """The ufuncs refused today (there should be none)."""
    assert [uf.__name__ for uf in NUMPY_UFUNCS if _kind(uf) == "refused"] == []


@pytest.mark.parametrize("name", EXTRA)
def test_extra_ufunc_rules(name):
    f, args = EXTRA[name]
    check_rule(f, *args)


def test_two_output_ufuncs_give_both_outputs():
    x = np.array([1.7, -2.3, 0.4, 0.0])
    assert_same_value(traced_value(np.modf, x), np.modf(x))
    assert_same_value(traced_value(np.frexp, x), np.frexp(x))
    assert_same_value(traced_value(lambda x: np.divmod(x, 0.7), x), np.divmod(x, 0.7))
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(np.heaviside(x, 0.5)))(x), 0.0)


# --- methods --------------------------------------------------------------------------------
def _values(name, shape, seed=0):
    """Values where the ufunc is smooth as first and as second argument (a fold uses both)."""
    rng = np.random.default_rng(seed)
    lo, hi = {
        "power": (0.5, 1.6),
        "float_power": (0.5, 1.6),
        "divide": (0.5, 2.0),
        "true_divide": (0.5, 2.0),
        "hypot": (0.3, 3.0),
        "arctan2": (0.3, 3.0),
        "logaddexp": (-2.0, 2.0),
        "logaddexp2": (-2.0, 2.0),
    }.get(name, (-2.0, 2.0))
    return rng.uniform(lo, hi, shape)


SMOOTH_BINARY = [
    "add",
    "subtract",
    "multiply",
    "divide",
    "power",
    "float_power",
    "hypot",
    "arctan2",
    "logaddexp",
    "logaddexp2",
]
EXTREME = ["maximum", "minimum", "fmax", "fmin"]


@pytest.mark.parametrize("name", SMOOTH_BINARY + EXTREME)
def test_outer(name):
    uf = getattr(np, name)
    check_rule(lambda a, b: uf.outer(a, b), _values(name, (3,)), _values(name, (2, 2), 1))


@pytest.mark.parametrize("name", SMOOTH_BINARY + EXTREME)
@pytest.mark.parametrize("axis, keepdims", [(0, False), (1, True), (-1, False), (None, False)])
def test_reduce(name, axis, keepdims):
    uf = getattr(np, name)
    x = _values(name, (3, 4))
    if not _reduce_is_a_fold(uf):  # refused (or NumPy's error for several axes)
        with pytest.raises((gt.GradtapeError, ValueError), match="accumulate|reorderable"):
            traced_value(lambda x: uf.reduce(x, axis=axis, keepdims=keepdims), x)
        return
    try:
        expected = uf.reduce(x, axis=axis, keepdims=keepdims)
    except ValueError:  # not reorderable over several axes: NumPy's error
        with pytest.raises(ValueError):
            traced_value(lambda x: uf.reduce(x, axis=axis, keepdims=keepdims), x)
        return
    assert_same_value(
        traced_value(lambda x: uf.reduce(x, axis=axis, keepdims=keepdims), x), expected
    )
    check_rule(lambda x: uf.reduce(x, axis=axis, keepdims=keepdims), x)


@pytest.mark.parametrize("name", ["subtract", "divide", "logaddexp", "hypot", "maximum"])
def test_reduce_initial_where_and_empty(name):
    uf = getattr(np, name)
    x = _values(name, (3, 4))
    mask = np.array([True, False, True, True])
    check_rule(lambda x: uf.reduce(x, axis=1, initial=0.5), x)
    if uf.identity is not None:
        check_rule(lambda x: uf.reduce(x, axis=1, where=mask), x)
    check_rule(lambda x: uf.reduce(x, axis=1, where=mask, initial=0.75), x)
    try:
        expected = uf.reduce(x[:, :0], axis=1)
    except ValueError as e:
        with pytest.raises(ValueError, match=str(e)[:15]):
            traced_value(lambda x: uf.reduce(x[:, :0], axis=1), x)
    else:
        assert_same_value(traced_value(lambda x: uf.reduce(x[:, :0], axis=1), x), expected)


@pytest.mark.parametrize("name", SMOOTH_BINARY + EXTREME)
@pytest.mark.parametrize("axis", [0, 1])
def test_accumulate(name, axis):
    uf = getattr(np, name)
    check_rule(lambda x: uf.accumulate(x, axis=axis), _values(name, (3, 4)))


def test_running_maximum_with_ties_and_nans():
    x = np.array([1.0, 3.0, 2.0, 3.0, 5.0, 0.0])
    g = gt.grad(lambda x: np.sum(np.maximum.accumulate(x) * np.arange(1.0, 7.0)))(x)
    np.testing.assert_allclose(g, [1.0, 2 + 3 + 4, 0.0, 0.0, 5 + 6, 0.0])  # first holder wins
    y = np.array([1.0, np.nan, 2.0, 0.5])
    for uf in (np.maximum, np.fmax, np.minimum, np.fmin):
        assert_same_value(traced_value(uf.accumulate, y), uf.accumulate(y))
        assert_same_value(traced_value(uf.accumulate, y[::-1].copy()), uf.accumulate(y[::-1]))
    long = np.random.default_rng(1).normal(size=2000)
    f = gt.compile(gt.grad(lambda x: np.sum(np.maximum.accumulate(x) ** 2)), backend="numpy")
    np.testing.assert_allclose(
        f(long), gt.grad(lambda x: np.sum(np.maximum.accumulate(x) ** 2))(long)
    )


def test_logaddexp_reduce_is_one_instruction():
    x = np.random.default_rng(2).normal(size=(5, 1000))
    tape = gt.trace(lambda x: np.logaddexp.reduce(x, axis=1), x)
    assert len(tape.instructions) <= 2
    check_rule(lambda x: np.logaddexp.reduce(x, axis=1), x[:, :6])


@pytest.mark.parametrize("name", SMOOTH_BINARY + EXTREME)
def test_reduceat(name):
    uf = getattr(np, name)
    x = _values(name, (6, 2))
    if not _reduce_is_a_fold(uf):
        with pytest.raises(gt.GradtapeError, match="accumulate"):
            traced_value(lambda x: uf.reduceat(x, [0, 2]), x)
        return
    for idx in ([0, 2, 5], [1, 4, 4, 2], [0]):
        assert_same_value(traced_value(lambda x: uf.reduceat(x, idx), x), uf.reduceat(x, idx))
        check_rule(lambda x: uf.reduceat(x, idx, axis=0), x, compiled=False)


@pytest.mark.parametrize(
    "name",
    [
        "multiply",
        "subtract",
        "divide",
        "maximum",
        "power",
        "exp",
        "negative",
        "square",
        "logaddexp",
    ],
)
def test_at_with_repeated_indices(name):
    uf = getattr(np, name)
    unary = uf.nin == 1
    idx = np.array([0, 2, 2, 3, 0, 2])

    def f(x, b):
        y = x * 1.0
        if unary:
            uf.at(y, idx)
        else:
            uf.at(y, idx, b)
        return y

    x = _values(name, (5,))
    b = _values(name, (6,), 1)
    expected = x.copy()
    if unary:
        uf.at(expected, idx)
    else:
        uf.at(expected, idx, b)
    assert_same_value(traced_value(f, x, b), expected)
    check_rule(f, x, b, argnums=(0,) if unary else (0, 1))
    if not unary:
        with pytest.raises(gt.GradtapeError, match="plain ndarray"):
            gt.grad(lambda b: uf.at(np.ones(5), idx, b))(b)


def test_unary_methods_raise_numpys_error():
    with pytest.raises(ValueError, match="binary"):
        traced_value(lambda x: np.exp.reduce(x), X)
    with pytest.raises(ValueError):
        traced_value(lambda x: np.exp.outer(x, x), X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for uf in NUMPY_UFUNCS:
            if _kind(uf) == "rule" and uf.signature is None and uf.nout == 1:
                assert (uf, "at") in UFUNC_METHODS, uf.__name__
                if uf.nin == 2:
                    for method in ("outer", "reduce", "accumulate", "reduceat"):
                        assert (uf, method) in UFUNC_METHODS, (uf.__name__, method)


# --- every new primitive: second order (forward over reverse against reverse over reverse) ---
SECOND_ORDER = {
    "modf": lambda x: np.modf(x)[0] * x,
    "frexp": lambda x: np.frexp(x)[0] * x,
    "divmod": lambda x: np.divmod(x * 3.0, 1.7)[1] ** 2,
    "ldexp": lambda x: np.ldexp(x * x, 2),
    "conjugate": lambda x: np.conjugate(x) * x,
    "nextafter": lambda x: np.nextafter(x, 0.0) * x,
    "heaviside": lambda x: np.heaviside(np.array([0.0, 1.0, -1.0, 0.0]), x * x),
    "vecdot": lambda x: np.vecdot(x[None, :] * x[:, None], x),
    "matvec": lambda x: np.matvec(x[None, :] * x[:, None], x),
    "vecmat": lambda x: np.vecmat(x, x[None, :] * x[:, None]),
    "logaddexp_reduce": lambda x: np.logaddexp.reduce(x * x),
    "running_extreme": lambda x: np.maximum.accumulate(x) ** 2,
    "convolution": lambda x: np.convolve(x, x * x, "same"),
    "sinc": lambda x: np.sinc(x) * x,
    "numpy_i0": lambda x: np.i0(x) * x,
    "i1": lambda x: gt.grad(lambda y: np.sum(np.i0(y)))(x) * x,
}
for _name in NEW_IN_NUMPY:
    del SECOND_ORDER[_name]


@pytest.mark.parametrize("name", SECOND_ORDER)
def test_second_order_through_new_primitives(name):
    from breadth import check_forward_reverse

    x = np.array([0.7, -1.3, 2.1, 0.4])
    f = SECOND_ORDER[name]
    g = gt.grad(
        lambda x: np.sum(np.linspace(0.5, 1.5, np.size(f(x))).reshape(np.shape(f(x))) * f(x))
    )
    check_rule(g, x, compiled=False, forward=False)
    check_forward_reverse(g, x)


def test_every_new_primitive_has_a_second_order_case():
    from gradtape.core.primitive import Primitive
    from gradtape.rules import (
        array_api,
        elementwise,
        polynomial,
        scalar_functions,
        sequences,
        statistics,
        ufunc_methods,
    )

    names = {
        p.name
        for mod in (array_api, polynomial, scalar_functions, sequences, statistics, ufunc_methods)
        for p in vars(mod).values()
        if isinstance(p, Primitive) and not p.nondiff
    }
    appended = {"modf", "frexp", "divmod", "ldexp", "conjugate", "nextafter", "heaviside"}
    assert appended <= {p.name for p in vars(elementwise).values() if isinstance(p, Primitive)}
    names |= appended
    assert names - set(SECOND_ORDER) == set()
