"""Array construction and rearrangement against NumPy: np.pad in every mode, append, insert,
delete, rot90, rollaxis, the splits, resize, kron, block, diagflat, vander,
sliding_window_view, partition, and the in-place writers (fill_diagonal, put, put_along_axis,
place, putmask, copyto) on traced arrays."""

from __future__ import annotations

import numpy as np
import pytest
from breadth import assert_same_value, check_rule, traced_value
from conftest import argument_strategy
from hypothesis import given
from hypothesis import strategies as st

import gradtape as gt

DTYPES = st.sampled_from([np.float64, np.float32])
VALUES = ((-3.0, 3.0),)
PAD_MODES = {
    "constant": {},
    "constant_values": {"constant_values": ((1.5, -2.0), (0.5, 3.0))},
    "edge": {},
    "wrap": {},
    "reflect": {},
    "reflect_odd": {"reflect_type": "odd"},
    "symmetric": {},
    "symmetric_odd": {"reflect_type": "odd"},
    "linear_ramp": {},
    "linear_ramp_ends": {"end_values": (2.0, -1.0)},
    "maximum": {},
    "minimum": {},
    "mean": {},
    "median": {},
    "mean_length": {"stat_length": 2},
    "maximum_length": {"stat_length": ((1, 2), (2, 1))},
}


@pytest.mark.parametrize("name", PAD_MODES)
@given(data=st.data(), dtype=DTYPES)
def test_pad(name, data, dtype):
    mode = name.split("_")[0] if name not in ("linear_ramp", "linear_ramp_ends") else "linear_ramp"
    kwargs = PAD_MODES[name]
    shape = data.draw(st.sampled_from([(1, 3), (3, 2), (4, 3)]), label="shape")
    order = data.draw(st.permutations(range(int(np.prod(shape)))), label="order")
    jitter = data.draw(
        st.lists(st.floats(0.0, 0.3), min_size=len(order), max_size=len(order)), label="jitter"
    )
    # distinct, and no coincidences (a median of medians tied with another)
    x = ((np.array(order) - 3) * 0.7 + np.array(jitter)).reshape(shape).astype(dtype)
    width = data.draw(
        st.sampled_from([1, 2, (0, 3), ((2, 1), (0, 5)), ((7, 0), (1, 2))]), label="pad_width"
    )
    check_rule(
        lambda x: np.pad(x, width, mode=mode, **kwargs), x, exact=True, compiled=dtype == np.float64
    )


def test_pad_forms_and_refusals():
    x = np.arange(6.0).reshape(2, 3) / 3
    if np.lib.NumpyVersion(np.__version__) >= "2.3.0":  # (pad widths by axis: NumPy 2.3)
        check_rule(lambda x: np.pad(x, {1: (2, 1)}, mode="edge"), x)
    check_rule(lambda x: np.pad(x, 2, mode="empty") * 0 + np.pad(x, 2), x)
    check_rule(lambda x, c: np.pad(x, 1, constant_values=c), x, 0.75)  # a traced fill value
    check_rule(
        lambda x, e: np.pad(x, 2, mode="linear_ramp", end_values=e), x, np.array([1.0, -2.0])
    )
    with pytest.raises(gt.GradtapeError, match="function as mode"):
        traced_value(lambda x: np.pad(x, 1, mode=lambda *a: None), x)
    with pytest.raises(ValueError, match="not supported"):
        traced_value(lambda x: np.pad(x, 1, mode="bogus"), x)
    with pytest.raises(ValueError, match="can't extend empty"):
        traced_value(lambda x: np.pad(x[:0], 1, mode="edge"), x)


ARRAYS = {
    "append": lambda x: np.append(x, x[:1] * 2),
    "append_axis": lambda x: np.append(x, x[:, :1] ** 2, axis=1),
    "insert_int": lambda x: np.insert(x, 1, 5.0),
    "insert_values": lambda x: np.insert(x, [0, 2, 2], x[0, :3] * 3),
    "insert_axis": lambda x: np.insert(x, 1, x[:, 0], axis=1),
    "insert_axis_scalar_obj": lambda x: np.insert(x, 0, x[:, 2] + 1, axis=1),
    "insert_slice": lambda x: np.insert(x, slice(0, 2), 9.0, axis=0),
    "delete": lambda x: np.delete(x, 1),
    "delete_axis": lambda x: np.delete(x, [0, 2], axis=1),
    "delete_mask": lambda x: np.delete(x, np.array([True, False]), axis=0),
    "rot90": lambda x: np.rot90(x),
    "rot90_k": lambda x: np.rot90(x, 3),
    "rot90_2": lambda x: np.rot90(x, 2, axes=(1, 0)),
    "rollaxis": lambda x: np.rollaxis(x, 1),
    "hsplit": lambda x: np.hsplit(x, 4)[1],
    "vsplit": lambda x: np.vsplit(x, 2)[1],
    "dsplit": lambda x: np.dsplit(x.reshape(2, 2, 2), 2)[0],
    "split_indices": lambda x: np.split(x, [1, 3], axis=1)[1],
    "resize": lambda x: np.resize(x, (3, 5)),
    "kron": lambda x: np.kron(x, np.array([[1.0, -1.0], [0.5, 2.0]])),
    "kron_1d": lambda x: np.kron(x[0], x[1, :2]),
    "block": lambda x: np.block([[x, x[:, :1]], [x[:1] * 2, np.ones((1, 1))]]),
    "block_1d": lambda x: np.block([x[0], x[1]]),
    "diagflat": lambda x: np.diagflat(x[0, :3], 1),
    "vander": lambda x: np.vander(x[0]),
    "vander_increasing": lambda x: np.vander(x[1], 3, increasing=True),
    "sliding_window_view": lambda x: np.lib.stride_tricks.sliding_window_view(x, (2, 3)),
    "sliding_window_axis": lambda x: np.lib.stride_tricks.sliding_window_view(x, 2, axis=1),
    "partition": lambda x: np.partition(x, 1, axis=1),
    "partition_none": lambda x: np.partition(x, (0, 5), axis=None),
    "extract": lambda x: np.extract(np.array([[True, False, True, True]] * 2), x),
    "compress": lambda x: np.compress([False, True, True], x, axis=1),
}


@pytest.mark.parametrize("name", ARRAYS)
@given(data=st.data(), dtype=DTYPES)
def test_arrays(name, data, dtype):
    order = data.draw(st.permutations(range(8)), label="order")
    x = ((np.array(order, np.float64) - 3) * 0.6 + 0.05).reshape(2, 4).astype(dtype)
    check_rule(ARRAYS[name], x, exact=True, compiled=dtype == np.float64)


def test_split_needs_equal_sections_as_in_numpy():
    x = np.arange(6.0)
    with pytest.raises(ValueError, match="equal division"):
        traced_value(lambda x: np.split(x, 4), x)
    assert_same_value(traced_value(lambda x: np.array_split(x, 4), x), np.array_split(x, 4))


def test_partition_compiled_rearranges_for_new_values():
    f = gt.compile(lambda x: np.partition(x, 2), backend="numpy")
    for seed in range(4):
        x = np.random.default_rng(seed).normal(size=7)
        assert_same_value(f(x), np.partition(x, 2))


# --- in-place writers on traced arrays ----------------------------------------------------------
def _writer(write):
    def f(x, v):
        y = x * 1.0
        write(y, v)
        return y

    return f


WRITERS = {
    "fill_diagonal": (lambda y, v: np.fill_diagonal(y, v[:2]), (3, 3)),
    "fill_diagonal_wrap": (lambda y, v: np.fill_diagonal(y, v[0], wrap=True), (5, 2)),
    "put": (lambda y, v: np.put(y, [0, 4, -1, 4], v[:3]), (2, 3)),
    "put_wrap": (lambda y, v: np.put(y, [7, -8], v[:2], mode="wrap"), (2, 3)),
    "put_along_axis": (
        lambda y, v: np.put_along_axis(y, np.array([[0], [2]]), v[:2, None], axis=1),
        (2, 3),
    ),
    "place": (lambda y, v: np.place(y, y > 0, v[:2]), (2, 3)),
    "putmask": (lambda y, v: np.putmask(y, y < 0, v[:4]), (2, 3)),
    "copyto": (lambda y, v: np.copyto(y, v[:3], where=np.array([True, False, True])), (2, 3)),
}


@pytest.mark.parametrize("name", WRITERS)
def test_in_place_writers(name):
    write, shape = WRITERS[name]
    x = (np.arange(np.prod(shape), dtype=float).reshape(shape) - 2.5) * 0.9
    v = np.array([1.5, -2.5, 0.75, 3.25, -0.5])
    check_rule(_writer(write), x, v, exact=True)


def test_writing_traced_values_into_a_plain_array_is_refused():
    v = np.array([1.5, -2.5, 0.75])
    with pytest.raises(gt.GradtapeError, match="plain ndarray"):
        gt.grad(lambda v: np.put(np.ones(4), [0, 1, 2], v))(v)
    with pytest.raises(gt.GradtapeError):
        gt.grad(lambda v: np.fill_diagonal(np.ones((3, 3)), v))(v)


@given(x=argument_strategy((3, 4), VALUES, np.float64))
def test_pad_reflect_wider_than_the_array(x):
    check_rule(lambda x: np.pad(x, ((5, 7), (9, 2)), mode="reflect"), x, exact=True)
    check_rule(
        lambda x: np.pad(x, ((5, 7), (9, 2)), mode="symmetric", reflect_type="odd"), x, exact=True
    )
    check_rule(lambda x: np.pad(x, ((5, 7), (9, 2)), mode="wrap"), x, exact=True)
