"""Shape functions, indexing, functional writes, ndarray methods and operators."""

from __future__ import annotations

import operator

import numpy as np
import pytest
from conftest import argument_strategy, assert_grad_matches, weights_like
from hypothesis import given
from hypothesis import strategies as st

import gradtape as gt
from gradtape import GradtapeError

DTYPES = st.sampled_from([np.float64, np.float32])
VALUES = ((-3.0, 3.0),)


def check_weighted(func, *args, argnums=0, complex_step=True):
    """Check the gradient of sum(w * func(*args)) with non-uniform weights w."""
    out_shape = np.shape(func(*args))
    dtype = np.result_type(*(a for a in args if isinstance(a, np.ndarray)))
    weights = weights_like(out_shape, dtype)
    return assert_grad_matches(
        lambda *a: np.sum(weights * func(*a)), *args, argnums=argnums, complex_step=complex_step
    )


# name -> (function of x, the input shapes it is tested on)
SHAPE_FUNCTIONS = {
    "reshape": (lambda x: np.reshape(x, (-1,)), [(6,), (2, 3), (2, 3, 1)]),
    "reshape_method": (lambda x: x.reshape(x.shape[0], -1), [(2, 3), (4, 1, 2)]),
    "reshape_method_varargs": (lambda x: x.reshape(1, x.size), [(2, 3), (5,)]),
    "transpose": (np.transpose, [(2, 3), (2, 3, 4), (3,)]),
    "transpose_axes": (lambda x: np.transpose(x, (1, 2, 0)), [(2, 3, 4)]),
    "T": (lambda x: x.T, [(2, 3), (2, 1, 3)]),
    "transpose_method": (lambda x: x.transpose(2, 0, 1), [(2, 3, 4)]),
    "moveaxis": (lambda x: np.moveaxis(x, 0, -1), [(2, 3), (2, 3, 4)]),
    "moveaxis_multi": (lambda x: np.moveaxis(x, (0, 1), (-1, 0)), [(2, 3, 4)]),
    "swapaxes": (lambda x: np.swapaxes(x, 0, -1), [(2, 3), (2, 3, 4)]),
    "swapaxes_method": (lambda x: x.swapaxes(1, 0), [(2, 3)]),
    "expand_dims": (lambda x: np.expand_dims(x, 0), [(), (3,), (2, 3)]),
    "expand_dims_tuple": (lambda x: np.expand_dims(x, (0, -1)), [(3,), (2, 3)]),
    "squeeze": (np.squeeze, [(1, 3), (2, 1, 3, 1), (1,)]),
    "squeeze_axis": (lambda x: np.squeeze(x, axis=-1), [(3, 1), (2, 1, 1)]),
    "squeeze_method": (lambda x: x.squeeze(), [(1, 3, 1)]),
    "broadcast_to": (lambda x: np.broadcast_to(x, (4,) + np.shape(x)), [(), (3,), (2, 1)]),
    "broadcast_to_inner": (lambda x: np.broadcast_to(x, (2, 3)), [(2, 1), (1, 3), (3,)]),
    "concatenate": (lambda x: np.concatenate([x, 2 * x, np.ones_like(x)]), [(3,), (2, 3)]),
    "concatenate_axis": (lambda x: np.concatenate([x, x[:, :1] ** 2], axis=-1), [(2, 3)]),
    "concatenate_none": (lambda x: np.concatenate([x, x * x], axis=None), [(2, 3)]),
    "stack": (lambda x: np.stack([x, x**2, np.zeros_like(x)]), [(), (3,), (2, 3)]),
    "stack_axis": (lambda x: np.stack([x, x**2], axis=-1), [(3,), (2, 3)]),
    "hstack": (lambda x: np.hstack([x, 3 * x]), [(), (3,), (2, 3)]),
    "vstack": (lambda x: np.vstack([x, 3 * x]), [(), (3,), (2, 3)]),
    "split": (lambda x: np.split(x, 2)[1] * np.split(x, 2)[0], [(4,), (2, 3)]),
    "split_indices": (lambda x: np.split(x, [1, 3], axis=-1)[1], [(5,), (2, 4)]),
    "array_split": (lambda x: np.array_split(x, 3)[0], [(5,), (4, 2)]),
    "tile": (lambda x: np.tile(x, 2), [(), (3,), (2, 3)]),
    "tile_tuple": (lambda x: np.tile(x, (2, 1, 2)), [(3,), (2, 3)]),
    "repeat": (lambda x: np.repeat(x, 2), [(), (3,), (2, 3)]),
    "repeat_axis": (lambda x: np.repeat(x, [1, 0, 2], axis=-1), [(3,), (2, 3)]),
    "repeat_method": (lambda x: x.repeat(3, axis=0), [(2, 3)]),
    "flip": (np.flip, [(3,), (2, 3)]),
    "flip_axis": (lambda x: np.flip(x, axis=-1), [(2, 3)]),
    "fliplr": (np.fliplr, [(2, 3)]),
    "flipud": (np.flipud, [(2, 3)]),
    "roll": (lambda x: np.roll(x, 2), [(3,), (2, 3)]),
    "roll_axis": (lambda x: np.roll(x, -1, axis=0), [(3,), (2, 3)]),
    "roll_axes": (lambda x: np.roll(x, (1, -2), axis=(0, 1)), [(2, 3)]),
    "pad": (lambda x: np.pad(x, 1), [(3,), (2, 3)]),
    "pad_widths": (lambda x: np.pad(x, ((1, 2), (0, 1)), constant_values=4.0), [(2, 3)]),
    "atleast_1d": (np.atleast_1d, [(), (3,), (2, 3)]),
    "atleast_2d": (np.atleast_2d, [(), (3,), (2, 3)]),
    "ravel": (np.ravel, [(2, 3)]),
    "ravel_method": (lambda x: x.ravel(), [(2, 3)]),
    "flatten": (lambda x: x.flatten(), [(2, 3), ()]),
    "copy": (lambda x: x.copy(), [(), (3,)]),
    "np_copy": (np.copy, [(2, 3)]),
}


@pytest.mark.parametrize("name", SHAPE_FUNCTIONS)
@given(data=st.data(), dtype=DTYPES)
def test_shape_function(name, data, dtype):
    func, shapes = SHAPE_FUNCTIONS[name]
    shape = data.draw(st.sampled_from(shapes), label="shape")
    x = data.draw(argument_strategy(shape, VALUES, dtype), label="x")
    np.testing.assert_array_equal(gt.grad(lambda x: np.sum(func(x) * 0))(x), 0)
    check_weighted(func, x)


# --- indexing ------------------------------------------------------------------------------
MASK = np.array([True, False, True, True, False])
INDEXERS = {
    "int": lambda x: x[1],
    "negative_int": lambda x: x[-1],
    "slice": lambda x: x[1:],
    "slice_step": lambda x: x[::2],
    "slice_negative_step": lambda x: x[::-1],
    "slice_mixed": lambda x: x[-1:0:-2],
    "ellipsis": lambda x: x[..., 0],
    "newaxis": lambda x: x[None, 1:],
    "int_array_repeats": lambda x: x[[0, 0, 2, 0]],
    "int_array_negative": lambda x: x[np.array([-1, 0, -1])],
    "int_array_2d": lambda x: x[np.array([[0, 1], [1, 0]])],
    "bool_mask": lambda x: x[MASK[: x.shape[0]]],
    "value_mask": lambda x: x[x > 0],
    "take": lambda x: np.take(x, [4, 0, 4]),
    "take_axis": lambda x: np.take(x, [1, 1, 0], axis=0),
    "take_method": lambda x: x.take([-1, 2]),
    "take_along_axis": lambda x: np.take_along_axis(x, np.argsort(x, axis=0), axis=0),
    "sort": lambda x: np.sort(x, axis=0),
    "sort_none": lambda x: np.sort(x, axis=None),
    "iterate": lambda x: np.stack([row * i for i, row in enumerate(x)]),
}


@pytest.mark.parametrize("name", INDEXERS)
@given(data=st.data(), dtype=DTYPES, ndim=st.sampled_from([1, 2]))
def test_indexing(name, data, dtype, ndim):
    shape = (5,) if ndim == 1 else (5, 3)
    # away from 0, so that x > 0 does not change under a finite-difference step
    x = data.draw(argument_strategy(shape, ((-3.0, -0.1), (0.1, 3.0)), dtype), label="x")
    sort_like = "sort" in name or name == "take_along_axis"
    if sort_like:  # sort's derivative is a permutation: keep values apart from each other
        ranks = np.argsort(np.argsort(x, axis=None)).reshape(shape)
        x = (ranks + 0.01 * x).astype(dtype)
    check_weighted(INDEXERS[name], x)


@st.composite
def basic_and_advanced_indices(draw, n: int):
    """A slice with any start/stop/step, an int (maybe negative) or an int list with repeats."""
    kind = draw(st.sampled_from(["slice", "int", "list"]))
    if kind == "int":
        return draw(st.integers(-n, n - 1))
    if kind == "list":
        return draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=2 * n))
    bound = st.one_of(st.none(), st.integers(-n - 1, n + 1))
    step = draw(st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0)))
    return slice(draw(bound), draw(bound), step)


@given(data=st.data())
def test_generated_indices(data):
    x = np.linspace(-1.0, 2.0, 12).reshape(4, 3) ** 2
    rows = data.draw(basic_and_advanced_indices(4), label="rows")
    cols = data.draw(st.one_of(st.just(slice(None)), basic_and_advanced_indices(3)), label="cols")
    if isinstance(rows, list) and isinstance(cols, list):
        cols = cols[:1] * len(rows)  # two index lists must broadcast
    index = (rows, cols)
    if np.size(x[index]) == 0:
        return
    g = check_weighted(lambda x: x[index], x)
    # reference by counting: each read position receives its weight
    expected = np.zeros_like(x)
    np.add.at(expected, index, weights_like(np.shape(x[index]), np.float64))
    np.testing.assert_allclose(g, expected)


def test_where_and_select():
    x = np.array([-1.5, -0.2, 0.3, 2.0, 3.5])
    check_weighted(lambda x: np.where(x > 0, x**2, -x), x)
    check_weighted(lambda x: np.where(x > 0, x, 0.0), x)
    check_weighted(lambda x: np.where(x[:, None] > 0, x, 2 * x[:, None]), x)  # broadcasting
    check_weighted(lambda x: np.select([x < -1, x > 1], [x**3, np.sin(x)], default=x), x)
    # NumPy hands np.select to gradtape only when a condition or choice is traced
    check_weighted(lambda x: np.select([x < 0], [np.zeros_like(x)], default=np.exp(x)), x)
    # one argument form: the indices of the True entries (no gradient of their own)
    check_weighted(lambda x: x[np.where(x > 0)], x)


def test_where_gradients_to_both_branches():
    c = np.array([True, False, True])
    x, y = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])
    gx, gy = gt.grad(
        lambda x, y: np.sum(np.where(c, x, y) * np.array([1.0, 2.0, 3.0])), argnums=(0, 1)
    )(x, y)
    np.testing.assert_array_equal(gx, [1.0, 0.0, 3.0])
    np.testing.assert_array_equal(gy, [0.0, 2.0, 0.0])


# --- functional writes -----------------------------------------------------------------------
def shift_square(x):
    y = np.zeros_like(x)
    y[1:] = x[:-1] ** 2
    return y


def overwrite_twice(x):
    y = np.ones_like(x)
    y[0] = x[2] * 3.0
    y[1:3] = x[:2]
    y[0] = y[0] * x[0]  # reads the written value
    y[-1] += x[0]
    return y


def write_constant_into_traced(x):
    y = x * 2.0
    y[1] = 7.0  # the gradient of the overwritten element is cut
    y[np.array([0, 0])] = 1.5
    return y


def write_through_mask(x):
    y = x.copy()
    y[x > 1] = np.sqrt(x[x > 1])
    return y


def copy_is_independent(x):
    y = x.copy()
    y[0] = 0.0
    return y * x  # x itself must be untouched by the write into y


def accumulate_with_add_at(x):
    acc = np.zeros_like(x)
    np.add.at(acc, [0, 0, 2, 0], x[1:] * x[:-1])
    return acc


def accumulate_scalar_with_add_at(x):
    acc = np.zeros(4) + x[0]  # a traced array built from a constant
    np.add.at(acc, np.array([1, 1]), x[1])
    return acc


def accumulate_in_loop(x):
    y = np.zeros_like(x)
    for i in range(1, len(x)):
        y[i] = y[i - 1] * 0.5 + x[i] ** 2
    return y


@pytest.mark.parametrize(
    "func",
    [
        shift_square,
        overwrite_twice,
        write_constant_into_traced,
        write_through_mask,
        copy_is_independent,
        accumulate_with_add_at,
        accumulate_scalar_with_add_at,
        accumulate_in_loop,
    ],
    ids=lambda f: f.__name__,
)
@given(x=argument_strategy((5,), ((0.2, 0.9), (1.1, 3.0)), np.float64))  # x > 1 is stable
def test_functional_writes(func, x):
    check_weighted(func, x)


def test_shift_square_closed_form():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(shift_square(x)))(x), [2, 4, 6, 0.0])


def test_write_into_2d_row_and_column():
    def f(x):
        y = np.zeros_like(x)
        y[0] = x[1] * 2
        y[:, 2] = x[:, 0] ** 2
        y[1, ::2] = x[0, :2]
        return y

    check_weighted(f, np.arange(1.0, 7.0).reshape(2, 3))


# --- ndarray methods ---------------------------------------------------------------------------
METHODS = {
    "sum": lambda x: x.sum(axis=0),
    "mean": lambda x: x.mean(axis=-1, keepdims=True),
    "prod": lambda x: x.prod(axis=1),
    "max": lambda x: x.max(axis=0),
    "min": lambda x: x.min(),
    "var": lambda x: x.var(ddof=1),
    "std": lambda x: x.std(axis=0),
    "cumsum": lambda x: x.cumsum(axis=1),
    "cumprod": lambda x: x.cumprod(),
    "dot": lambda x: x.dot(np.array([1.0, -2.0, 0.5])),
    "reshape": lambda x: x.reshape(3, 2),
    "transpose": lambda x: x.transpose(),
    "ravel": lambda x: x.ravel(),
    "flatten": lambda x: x.flatten(),
    "squeeze": lambda x: x[:, None].squeeze(1),
    "clip": lambda x: x.clip(-1.0, 1.5),
    "clip_one_side": lambda x: x.clip(max=1.0),
    "copy": lambda x: x.copy(),
    "round": lambda x: x.round(1) + x,
}


@pytest.mark.parametrize("name", METHODS)
def test_ndarray_method(name):
    # values kept away from clip bounds, ties and rounding boundaries
    x = np.array([[0.31, -1.23, 2.07], [1.52, 0.17, -0.74]])
    check_weighted(
        METHODS[name], x, complex_step=name not in ("max", "min", "clip", "clip_one_side", "round")
    )


def test_astype_casts_the_gradient_back():
    x = np.array([0.5, 1.5, -2.0])
    g = gt.grad(lambda x: np.sum(x.astype(np.float32) * np.float32(3.0)))(x)
    assert g.dtype == np.float64
    np.testing.assert_array_equal(g, 3.0)
    g32 = gt.grad(lambda x: np.sum(x.astype(np.float64) ** 2))(x.astype(np.float32))
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, 2 * x, rtol=1e-6)


def test_attributes_of_a_tracer():
    x = np.ones((2, 3))

    def f(x):
        assert x.shape == (2, 3) and x.ndim == 2 and x.size == 6 and x.dtype == np.float64
        assert len(x) == 2 and np.shape(x) == (2, 3) and np.ndim(x) == 2 and np.size(x) == 6
        assert x.T.shape == (3, 2)
        return np.sum(x)

    gt.grad(f)(x)


def test_item_gives_a_constant_and_records_a_guard():
    x = np.array([2.0, 3.0])

    def f(x):
        scale = x[0].item()  # a Python float
        assert type(scale) is float
        return np.sum(scale * x)

    tape = gt.trace(f, x)  # recorded, not differentiated: a guard on the value
    assert [g.kind for g in tape.guards] == ["item"] and tape.guards[0].answer == 2.0
    # differentiated, the Python float would cut the gradient: refused, naming the line
    with pytest.raises(GradtapeError, match=r"scale = x\[0\]\.item\(\)"):
        gt.grad(f)(x)


# --- operators ----------------------------------------------------------------------------------
BINARY_OPERATORS = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "pow": operator.pow,
    "mod": operator.mod,
}
OPERANDS = {  # (traced values, other operand) where the operator is smooth
    "add": ((-3.0, 3.0), 1.7),
    "sub": ((-3.0, 3.0), 1.7),
    "mul": ((-3.0, 3.0), -1.7),
    "truediv": ((0.5, 3.0), 1.7),
    "pow": ((0.5, 3.0), 1.7),
    "mod": ((3.5, 3.9), 1.7),
}


@pytest.mark.parametrize("name", BINARY_OPERATORS)
@pytest.mark.parametrize("other_kind", ["pyfloat", "array", "traced"])
@pytest.mark.parametrize("reflected", [False, True], ids=["op", "rop"])
@given(data=st.data(), dtype=DTYPES)
def test_binary_operator(name, other_kind, reflected, data, dtype):
    op = BINARY_OPERATORS[name]
    interval, other = OPERANDS[name]
    x = data.draw(argument_strategy((3,), (interval,), dtype), label="x")
    if name == "mod" and reflected:  # other % x with x in (3.5, 3.9): smooth for other=1.7+3
        other = other + 3.0
    if name == "pow" and reflected:
        x = (x / 2).astype(dtype)
    if other_kind == "pyfloat":
        check_weighted(
            lambda x: op(other, x) if reflected else op(x, other), x, complex_step=name != "mod"
        )
        return
    y = np.array(other, dtype=dtype) * np.ones((2, 1), dtype)  # broadcasts against x
    argnums = (0, 1) if other_kind == "traced" else 0
    check_weighted(
        lambda x, y: op(y, x) if reflected else op(x, y),
        x,
        y,
        argnums=argnums,
        complex_step=name != "mod",
    )


def test_floordiv_has_zero_derivative_and_rfloordiv():
    x = np.array([1.3, 4.2, 7.9])
    np.testing.assert_array_equal(gt.grad(lambda x: np.sum(x // 2.0 + 10.0 // x))(x), 0.0)


def test_matmul_operator():
    a = np.array([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0]])
    b = np.array([0.3, -1.2, 2.0])
    check_weighted(lambda a, b: a @ b, a, b, argnums=(0, 1))
    check_weighted(lambda b: a @ b, b)
    check_weighted(lambda a: b @ a.T, a)  # __rmatmul__ with a plain ndarray on the left
    check_weighted(lambda a: a.T @ a, a)


def test_unary_operators_and_abs():
    x = np.array([-1.5, -0.2, 0.3, 2.0])
    check_weighted(lambda x: -x, x)
    check_weighted(lambda x: +x * 2.0, x)
    check_weighted(lambda x: abs(x), x, complex_step=False)
    check_weighted(lambda x: abs(x - 0.1) ** 3, x, complex_step=False)
    check_weighted(lambda x: (x - 0.25) ** 3, x)  # an integer power of negative numbers
    check_weighted(lambda x: x**2 + x**-1, x)


def test_inplace_operators_rebind_the_name():
    def f(x):
        y = x * 1.0
        y += 2.0
        y -= x / 4
        y *= x
        y /= 3.0
        y **= 2
        return np.sum(y)

    check_weighted(f, np.array([0.5, 1.5, -2.0]))


def test_comparisons_give_plain_values_and_no_gradient():
    x = np.array([1.0, 2.0, 3.0])

    def f(x):
        masks = [
            x < 2,
            x <= 2,
            x > 2,
            x >= 2,
            x == 2,
            x != 2,
            2 < x,
            (x > 1) & (x < 3),
            (x < 1.5) | (x > 2.5),
            ~(x > 2),
        ]
        expected = [
            [1, 0, 0],
            [1, 1, 0],
            [0, 0, 1],
            [0, 1, 1],
            [0, 1, 0],
            [1, 0, 1],
            [0, 0, 1],
            [0, 1, 0],
            [1, 0, 1],
            [1, 1, 0],
        ]
        for m, e in zip(masks, expected):
            assert isinstance(m, np.ndarray) and m.dtype == bool  # not recorded: plain values
            np.testing.assert_array_equal(m, np.array(e, dtype=bool))
        return np.sum(x * masks[0])

    np.testing.assert_array_equal(gt.grad(f)(x), [1.0, 0.0, 0.0])


def test_write_with_repeated_indices_keeps_the_last_value_and_its_gradient():
    """y[[0, 2, 2]] = v keeps v[2] at position 2 (NumPy's last write): v[1] gets no gradient."""

    def f(x, v):
        y = np.zeros_like(x)
        y[[0, 2, 2]] = v * v
        return np.sum(y * np.arange(1.0, 5.0)) + np.sum(x)

    x, v = np.ones(4), np.array([1.0, 2.0, 3.0])
    g_v = gt.grad(f, argnums=(0, 1))(x, v)[1]  # y = zeros_like(x) is traced only with x
    np.testing.assert_allclose(g_v, [2 * 1.0 * 1, 0.0, 2 * 3.0 * 3])
    jf = gt.jacfwd(f, argnums=(0, 1))(x, v)[1]
    np.testing.assert_allclose(jf, g_v)


def test_common_type_answers_from_the_dtypes():
    seen = []

    def f(x):
        seen.append(np.common_type(x, np.ones(2, np.float32)))
        seen.append(np.common_type(x.astype(np.float32)))
        return np.sum(x)

    gt.grad(f)(np.ones(3))
    assert seen == [np.float64, np.float32]
