"""compile/program.py: what `build_program` makes of a recorded tape.

Each optimisation is checked on the Program that `compile` hands its backend (captured by a
backend registered for these tests, which then lowers it with the numpy backend), against the
recorded tape: which instructions are left, what they read, where the checks sit. Every case
also compares the compiled result with the eager one, so an optimisation that changes the
numbers fails too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile import BACKENDS, program, register_backend

_PROGRAMS: list = []


def _recording_lower(prog):
    _PROGRAMS.append(prog)
    return BACKENDS["numpy"](prog)


@pytest.fixture(scope="module", autouse=True)
def recording_backend():
    register_backend("record-program", _recording_lower)
    yield
    del BACKENDS["record-program"]


def compiled(f, *args):
    """(the Program compile(f) lowers for these arguments, the recorded tape); the compiled
    result equals the eager one."""
    cf = gt.compile(f, backend="record-program")
    before = len(_PROGRAMS)
    result = cf(*args)
    (prog,) = _PROGRAMS[before:]
    assert_same(result, f(*args))
    return prog, cf.tape(*args)


def assert_same(result, expected):
    """Same structure, dtypes and values (the numpy backend calls the same NumPy functions)."""
    if isinstance(expected, (tuple, list, dict)):
        assert type(result) is type(expected) and len(result) == len(expected)
        keys = expected.keys() if isinstance(expected, dict) else range(len(expected))
        for k in keys:
            assert_same(result[k], expected[k])
        return
    assert np.asarray(result).dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(result, expected)


def names(seq) -> list[str]:
    return [ins.prim.name for ins in seq.instructions]


X = np.linspace(0.1, 0.9, 3)


# --- peephole folds ---------------------------------------------------------------------------
def test_multiplication_by_one_forwards_its_operand():
    prog, tape = compiled(lambda x: np.sin(x) * 1.0 + np.ones(3) * np.cos(x), X)
    assert names(tape) == ["sin", "multiply", "cos", "multiply", "add"]
    assert names(prog) == ["sin", "cos", "add"]
    sin, cos, add = prog.instructions
    assert add.invars == (sin.outvars[0], cos.outvars[0])


def test_multiplication_by_one_keeps_a_cast_or_a_broadcast():
    prog, _ = compiled(lambda x: np.sin(x) * np.float64(1.0), X.astype(np.float32))
    assert names(prog) == ["sin", "multiply"]  # f32 * f64 scalar is f64: not the same value
    prog, _ = compiled(lambda x: np.sin(x) * np.ones((2, 3)), X)
    assert names(prog) == ["sin", "multiply"]  # the product has another shape


def test_stop_gradient_is_an_identity_and_full_like_a_constant():
    prog, tape = compiled(lambda x: gt.stop_gradient(x) + np.full_like(x, 2.0) * x, X)
    assert names(tape) == ["stop_gradient", "full_like", "multiply", "add"]
    assert names(prog) == ["multiply", "add"]
    mul, add = prog.instructions
    assert mul.invars[0] is None and mul.invars[1] is prog.inputs[0]
    assert np.ndim(mul.args[0]) == 0 and mul.args[0] == 2.0  # one repeated value: a 0-d constant
    assert add.invars == (prog.inputs[0], mul.outvars[0])


@pytest.mark.parametrize("truth", [True, False])
def test_where_on_a_constant_condition_picks_a_branch_and_drops_the_other(truth):
    cond = np.full(3, truth)
    prog, tape = compiled(lambda x: np.where(cond, np.sin(x), np.cos(x)), X)
    assert names(tape) == ["sin", "cos", "where"]
    assert names(prog) == ["sin" if truth else "cos"]
    assert prog.outputs[0].var is prog.instructions[0].outvars[0]


def test_where_on_a_mixed_constant_condition_stays():
    cond = np.array([True, False, True])
    prog, _ = compiled(lambda x: np.where(cond, np.sin(x), np.cos(x)), X)
    assert names(prog) == ["sin", "cos", "where"]


def test_where_picking_a_constant_folds_to_it():
    prog, _ = compiled(lambda x: np.where(np.zeros(3, bool), np.sin(x), np.arange(3.0)), X)
    assert names(prog) == []
    (leaf,) = prog.outputs
    assert leaf.var is None
    np.testing.assert_array_equal(leaf.const, [0.0, 1.0, 2.0])


@pytest.mark.parametrize(
    "op, const, expected",
    [
        (np.logical_and, False, "const"),
        (np.logical_and, True, "forward"),
        (np.logical_or, True, "const"),
        (np.logical_or, False, "forward"),
        (np.bitwise_and, False, "const"),
        (np.bitwise_or, False, "forward"),
    ],
)
def test_boolean_ops_with_a_constant_operand(op, const, expected):
    flags = np.full(3, const)
    prog, tape = compiled(lambda x: op(x > 0.5, flags), X)
    assert names(tape) == ["greater", op.__name__]
    (leaf,) = prog.outputs
    if expected == "const":
        assert names(prog) == [] and leaf.var is None
        np.testing.assert_array_equal(leaf.const, np.full(3, const))
    else:
        assert names(prog) == ["greater"] and leaf.var is prog.instructions[0].outvars[0]


def test_boolean_fold_needs_a_boolean_result():
    prog, _ = compiled(lambda x: np.bitwise_or((x > 0.5).astype(np.int64), np.zeros(3, int)), X)
    assert names(prog)[-1] == "bitwise_or"


# --- common subexpressions ---------------------------------------------------------------------
def test_equal_instructions_on_equal_operands_are_computed_once():
    prog, tape = compiled(lambda x: np.sin(x) + np.sin(x) + x * 2.0 + x * 2.0, X)
    assert names(tape) == ["sin", "sin", "add", "multiply", "add", "multiply", "add"]
    assert names(prog) == ["sin", "add", "multiply", "add", "add"]
    sin, add1, mul, add2, add3 = prog.instructions
    assert add1.invars == (sin.outvars[0], sin.outvars[0])
    assert add3.invars == (add2.outvars[0], mul.outvars[0])


def test_array_constants_are_the_same_only_when_they_are_the_same_object():
    c = np.arange(3.0)
    prog, _ = compiled(lambda x: x * c + x * c, X)
    assert names(prog) == ["multiply", "add"]
    prog, _ = compiled(lambda x: x * np.arange(3.0) + x * np.arange(3.0), X)
    assert names(prog) == ["multiply", "multiply", "add"]


def test_constants_of_another_type_or_params_of_another_value_are_not_merged():
    prog, _ = compiled(lambda x: x * 2.0 + x * np.float32(2.0) + x * 2, X)
    assert names(prog) == ["multiply", "multiply", "add", "multiply", "add"]
    prog, _ = compiled(
        lambda x: np.sum(x.reshape(1, 3), axis=0) + np.sum(x.reshape(1, 3), axis=1), X
    )
    assert names(prog).count("reduce_sum") == 2 and names(prog).count("reshape") == 1


def test_signed_zero_constants_are_not_merged():
    def f(x):
        return np.copysign(1.0, x * 0.0), np.copysign(1.0, x * -0.0)

    prog, _ = compiled(f, np.array([1.0, -2.0]))
    assert names(prog).count("multiply") == 2


# --- dead code ---------------------------------------------------------------------------------
def test_unused_values_are_dropped():
    def f(x):
        np.exp(x)  # unused
        y = np.cos(x)
        unused_too = y * 3.0  # noqa: F841
        return np.sin(x) + 1.0

    prog, tape = compiled(f, X)
    assert names(tape) == ["exp", "cos", "multiply", "sin", "add"]
    assert names(prog) == ["sin", "add"]


def test_values_only_a_guard_reads_are_kept():
    def f(x):
        if np.max(x) > 0.5:  # max and greater serve only the check
            return np.sin(x)
        return x

    prog, _ = compiled(f, X)
    assert names(prog) == ["reduce_max", "greater", "sin"]
    (check,) = prog.checks
    assert check.operand is prog.instructions[1].outvars[0]


def test_an_output_that_is_an_input_or_a_constant_needs_no_instruction():
    prog, _ = compiled(lambda x: (x, 2.0, np.sin(x) * 0.0 + np.cos(x) * 0.0), X)
    assert [leaf.var is prog.inputs[0] for leaf in prog.outputs] == [True, False, False]
    assert prog.outputs[1].const == 2.0 and prog.outputs[1].var is None
    assert names(prog) == ["sin", "multiply", "cos", "multiply", "add"]


# --- broadcasts read at their source -------------------------------------------------------------
Y34, Y4 = np.linspace(0.5, 1.5, 12).reshape(3, 4), np.linspace(-1.0, 1.0, 4)


def test_an_elementwise_op_reads_the_source_of_a_broadcast():
    prog, tape = compiled(lambda x, y: x * np.broadcast_to(y, (3, 4)), Y34, Y4)
    assert names(tape) == ["broadcast_to", "multiply"]
    assert names(prog) == ["multiply"]
    assert prog.instructions[0].invars == tuple(prog.inputs)


def test_a_reshape_adding_leading_ones_is_forwarded_too():
    prog, _ = compiled(lambda x, y: x * np.reshape(np.sin(y), (1, 4)), Y34, Y4)
    assert names(prog) == ["sin", "multiply"]
    sin, mul = prog.instructions
    assert mul.invars == (prog.inputs[0], sin.outvars[0])


def test_a_broadcast_that_makes_the_output_shape_stays():
    prog, _ = compiled(lambda x, y: np.broadcast_to(y, (3, 4)) + x[0] * 0.5, Y34, Y4)
    assert names(prog) == ["broadcast_to", "getitem", "multiply", "add"]
    prog, _ = compiled(lambda x, y: np.broadcast_to(y, (3, 4)).sum(axis=0), Y34, Y4)
    assert names(prog) == ["broadcast_to", "reduce_sum"]  # not elementwise


def test_a_constant_array_of_one_repeated_value_becomes_a_scalar():
    prog, _ = compiled(lambda x: x * np.full((3, 4), 2.5) + np.full((3, 4), 2.5), Y34)
    mul, add = prog.instructions
    assert np.shape(mul.args[1]) == () and mul.args[1] == 2.5
    assert np.shape(add.args[1]) == ()
    prog, _ = compiled(lambda x: x[0] + np.full((3, 4), 2.5), Y34)  # it makes the shape
    assert np.shape(prog.instructions[-1].args[1]) == (3, 4)


def test_recorded_constants_are_snapshots():
    c = np.arange(3.0)
    cf = gt.compile(lambda x: x * c, backend="record-program")
    np.testing.assert_array_equal(cf(X), X * np.arange(3.0))
    c[:] = 100.0  # the caller changes the array afterwards: the program keeps what it recorded
    np.testing.assert_array_equal(cf(X), X * np.arange(3.0))
    const = _PROGRAMS[-1].instructions[0].args[1]
    assert not const.flags.writeable


def test_a_constant_changed_later_in_the_call_keeps_the_value_it_had_when_used():
    def f(x):
        scratch = np.zeros(3)
        total = 0.0
        for i in range(3):
            scratch[:] = i
            total = total + np.sum(x * scratch)
        return total

    x = np.array([1.0, 2.0, 3.0])
    cf = gt.compile(f, backend="record-program")
    assert cf(x) == f(x) == 18.0
    np.testing.assert_array_equal(gt.grad(f)(x), [3.0, 3.0, 3.0])  # eager reverse mode too


# --- checks ------------------------------------------------------------------------------------
def test_checks_sit_right_after_the_value_they_test():
    def f(x):
        s, q = np.sum(x), np.sum(x * x)
        if q > 0.5:
            x = x * 2.0
        if s > 0:
            return np.sin(x)
        return x

    prog, _ = compiled(f, X)
    assert names(prog) == [
        "reduce_sum", "multiply", "reduce_sum", "greater", "multiply", "greater", "sin"
    ]  # fmt: skip
    assert [(c.kind, c.answer, c.position) for c in prog.checks] == [
        ("bool", True, 3),
        ("bool", True, 5),
    ]
    assert [c.operand for c in prog.checks] == [prog.instructions[3].outvars[0],
                                                prog.instructions[5].outvars[0]]  # fmt: skip


def test_a_check_never_moves_before_an_earlier_one():
    def f(x):
        early = np.sum(x) > 0  # computed first, asked second
        late = np.max(x) > 0.5
        y = np.sin(x)
        if late:
            y = y * 3.0
        if early:
            y = y + 1.0
        return y

    prog, _ = compiled(f, X)
    early_at = names(prog).index("greater")
    late_at = len(prog.instructions) - 1 - names(prog)[::-1].index("greater")
    assert early_at < late_at
    assert [c.position for c in prog.checks] == [late_at, late_at]
    assert [c.operand for c in prog.checks] == [prog.instructions[late_at].outvars[0],
                                                prog.instructions[early_at].outvars[0]]  # fmt: skip


def test_a_guard_on_an_input_runs_before_the_first_instruction():
    prog, _ = compiled(lambda x, n: x * int(n), X, np.array(2.0))
    (check,) = prog.checks
    assert (check.kind, check.answer, check.position) == ("int", 2, -1)
    assert check.operand is prog.inputs[1]


def test_data_dependent_shapes_are_checked_first_at_their_position():
    def f(x):
        idx = np.flatnonzero(x > 0.5)
        n = idx[0] > 0  # a guard on the value right after the shape check
        return np.sum(x[idx]) if n else np.sum(x)

    prog, _ = compiled(f, np.array([0.2, 0.7, 0.9]))
    pos = names(prog).index("flatnonzero")
    shape, guard = prog.checks
    assert (shape.kind, shape.answer, shape.position) == ("shape", (2,), pos)
    assert shape.operand is prog.instructions[pos].outvars[0]
    assert shape.where == "data-dependent shape of flatnonzero"
    assert guard.kind == "bool" and guard.position > pos


def test_index_guards_recorded_as_0d_arrays_are_python_answers():
    prog, _ = compiled(lambda x: x[: np.argmax(x)], np.array([0.1, 0.2, 0.9, 0.3]))
    (check,) = prog.checks
    assert check.kind == "index" and type(check.answer) is int and check.answer == 2


def test_indexing_with_nonzero_under_compile():
    x = np.array([[0.1, 0.9], [0.7, 0.2]])
    cf = gt.compile(lambda x: x[np.nonzero(x > 0.5)] * 2.0, backend="numpy")
    np.testing.assert_array_equal(cf(x), [1.8, 1.4])
    np.testing.assert_array_equal(cf(x), [1.8, 1.4])  # replayed
    more = np.array([[0.6, 0.9], [0.7, 0.2]])
    np.testing.assert_array_equal(cf(more), [1.2, 1.8, 1.4])  # another shape: a new variant
    tape = gt.trace(lambda x: x[np.nonzero(x > 0.5)], x)
    assert "c:i64[2] d:i64[2] = nonzero b" in str(tape)
    # one axis: a tuple of one index array, unpacked as such on replay
    one = gt.compile(lambda v: v[v.nonzero()] * 2.0, backend="numpy")
    for v in (np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0, 2.0])):
        np.testing.assert_array_equal(one(v), [2.0, 4.0])
    grad = gt.compile(gt.grad(lambda x: np.sum(x[np.nonzero(x > 0.5)] ** 2)), backend="numpy")
    np.testing.assert_array_equal(grad(more), np.where(more > 0.5, 2 * more, 0.0))


# --- what a replay cannot check --------------------------------------------------------------
def test_replayable_programs_have_no_reason():
    prog, _ = compiled(lambda x: x * x[1].item(), X)
    assert prog.checks[0].kind == "item"
    assert program.unreplayable_reason(prog) is None


def test_item_of_a_whole_array_cannot_be_replayed():
    prog, _ = compiled(lambda x: x * 2.0, X)
    bad = dataclasses.replace(
        prog, checks=[program.Check(prog.inputs[0], "item", 0.5, "f.py:3: x.item(1)")]
    )
    reason = program.unreplayable_reason(bad)
    assert reason == (
        "x.item(i) on an array of shape (3,) (f.py:3: x.item(1)) cannot be checked on "
        "replay; write x[i].item() instead"
    )


def test_an_unknown_check_kind_cannot_be_replayed():
    prog, _ = compiled(lambda x: x * 2.0, X)
    bad = dataclasses.replace(prog, checks=[program.Check(prog.inputs[0], "float", 0.5, "g.py:1")])
    assert program.unreplayable_reason(bad) == (
        "a guard of kind 'float' (g.py:1) that compile cannot check"
    )


# --- answers as keys ----------------------------------------------------------------------------
def test_answer_keys_are_hashable_and_nan_safe():
    nan = float("nan")
    assert program.answer_key("item", nan) == program.answer_key("item", float("nan"))
    assert program.answer_key("item", 0.0) != program.answer_key("item", -0.0)
    assert program.answer_key("int", 1) != program.answer_key("bool", True)
    a = np.array([1.0, nan])
    assert program.answer_key("value", a) == program.answer_key("value", a.copy())
    assert program.answer_key("value", a) != program.answer_key("value", a.astype(np.float32))
    assert program.answer_key("value", a) != program.answer_key("value", a.reshape(1, 2))
    assert program.answer_key("item", [1, 2]) == ("list", "[1, 2]")
    hash(program.answer_key("value", a))


def test_outputs_describe_their_leaves():
    prog, _ = compiled(lambda x: {"v": np.sum(x), "g": x * 2.0, "c": 1.5}, X)
    c, g, v = prog.outputs  # the leaves of a dict in sorted key order
    assert (c.var, c.const, c.shape) == (None, 1.5, ())
    assert g.var is prog.instructions[1].outvars[0] and not g.scalar and g.shape == (3,)
    assert v.var is prog.instructions[0].outvars[0] and v.scalar and v.shape == ()
    assert prog.out_spec == [((), np.dtype(float)), ((3,), np.dtype(float)), ((), np.dtype(float))]
    assert not prog.out_is_flat_tuple
    prog, _ = compiled(lambda x: (np.sum(x), x * 2.0), X)
    assert prog.out_is_flat_tuple
    assert [leaf.scalar for leaf in prog.outputs] == [True, False]


def test_a_complex_product_with_one_is_not_folded():
    """NumPy computes (inf + 1j) * 1 as a full complex product: inf + nanj; the fold of a
    multiplication by one keeps real values only."""
    z = np.array([complex(np.inf, 1.0), complex(1.0, np.inf), 1 + 2j])
    for f in (lambda z: z * 1.0, lambda z: (1 + 0j) * z, lambda z: z * np.ones(3)):
        with np.errstate(invalid="ignore"):
            expected = f(z)
            np.testing.assert_array_equal(gt.compile(f, backend="numpy")(z), expected)
    prog, _ = compiled(lambda x: x * 1.0, X)
    assert not prog.instructions  # real values: still folded
