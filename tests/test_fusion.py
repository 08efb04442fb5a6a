"""compile/numba/fusion.py: the schedule the native backend generates code from, uncompiled.

The planner runs on the Program `compile` records (captured by a backend registered for these
tests, which lowers it with the numpy backend) with the numba backend's own predicates of what
it can fuse and lower; nothing here imports or calls Numba. Each test asserts the stages (kind,
shape, members) and where values live, and compiled results are compared with eager ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from seed_functions import eam, normal_logpdf

import gradtape as gt
from gradtape.compile import BACKENDS, register_backend
from gradtape.compile.numba import fusion, lowering, scalar

_PROGRAMS: list = []
RNG = np.random.default_rng(5)


def _recording_lower(prog):
    _PROGRAMS.append(prog)
    return BACKENDS["numpy"](prog)


@pytest.fixture(scope="module", autouse=True)
def recording_backend():
    register_backend("record-plan", _recording_lower)
    yield
    del BACKENDS["record-plan"]


def planned(f, *args, lowerable=lowering.lowerable):
    """(the plan of the Program compile(f) records for these arguments, that Program)."""
    cf = gt.compile(f, backend="record-plan")
    before = len(_PROGRAMS)
    result = cf(*args)
    (prog,) = _PROGRAMS[before:]
    expected = f(*args)
    if not isinstance(expected, tuple):
        result, expected = (result,), (expected,)
    for r, e in zip(result, expected):
        np.testing.assert_allclose(r, e, rtol=1e-14)
    return fusion.plan(prog, scalar.fusable, lowerable), prog


def kinds(plan) -> list[str]:
    return [s.kind for s in plan.stages]


def members(stage) -> list[str]:
    return [ins.prim.name for ins in stage.members]


def var(prog, name: str, k: int = 0):
    """The output of the k-th instruction of primitive `name`."""
    return [ins for ins in prog.instructions if ins.prim.name == name][k].outvars[0]


# --- loops and reductions -------------------------------------------------------------------------
def test_forward_and_backward_of_normal_logpdf_share_one_loop():
    plan, prog = planned(gt.value_and_grad(normal_logpdf), np.linspace(-1.0, 2.0, 50))
    assert kinds(plan) == [fusion.LOOP]
    (loop,) = plan.stages
    assert loop.shape == (50,) and not loop.nested
    assert len(loop.members) == len(prog.instructions)
    value, grad = (leaf.var for leaf in prog.outputs)
    assert plan.reductions == {value.id: loop}  # the sum: a scalar accumulator of the loop
    assert plan.held[value.id] == fusion.HELD_SCALAR
    assert plan.stored == {grad.id} and plan.storage == {grad.id: ("out", 1)}
    assert plan.buffers == [] and plan.segments == 1


def test_eam_needs_a_second_loop_after_its_sum():
    plan, prog = planned(gt.value_and_grad(eam), np.linspace(0.1, 1.0, 50))
    loops = [s for s in plan.stages if s.kind == fusion.LOOP]
    assert kinds(plan)[0] == kinds(plan)[-1] == fusion.LOOP and len(loops) == 2
    assert set(kinds(plan)[1:-1]) == {fusion.SCALAR}  # the polynomial in rho: plain statements
    assert members(loops[0]) == ["add", "multiply", "exp", "reduce_sum"]
    # exp's derivative times a traced cotangent: the NaN-safe product, fused like a multiply
    assert members(loops[1]) == ["nan_safe_multiply", "multiply"]
    exp, rho = var(prog, "exp"), var(prog, "reduce_sum")
    assert plan.reductions[rho.id] is loops[0]
    grad = prog.outputs[1].var
    # the exponentials are stored once, into the gradient array, which the second loop
    # reads and then overwrites with the gradient
    assert plan.stored == {exp.id, grad.id}
    assert plan.storage[exp.id] == plan.storage[grad.id] == ("out", 1)
    assert plan.buffers == []
    assert plan.last_use[exp.id] == loops[1].index


def test_a_value_of_a_reduction_is_not_read_in_its_own_loop():
    plan, prog = planned(lambda x: np.sum(x * (np.sum(np.exp(x)) - x)), np.linspace(0, 1, 8))
    assert kinds(plan) == [fusion.LOOP, fusion.LOOP]
    assert members(plan.stages[0]) == ["exp", "reduce_sum"]
    assert members(plan.stages[1]) == ["subtract", "multiply", "reduce_sum"]


def test_elementwise_work_joins_the_latest_loop_it_can_read():
    def f(x):
        a = np.exp(x)
        s = np.sum(a)
        b = np.sin(x) * 2.0  # independent of s: joins the first loop
        c = b * s  # needs s: a new loop
        return np.sum(c)

    plan, _ = planned(f, np.linspace(0, 1, 8))
    assert [members(s) for s in plan.stages] == [
        ["exp", "reduce_sum", "sin", "multiply"],
        ["multiply", "reduce_sum"],
    ]


def test_size_one_values_are_scalar_statements():
    plan, prog = planned(lambda x: np.sum(np.exp(x)) * 2.0 + 1.0, np.linspace(0, 1, 8))
    assert kinds(plan) == [fusion.LOOP, fusion.SCALAR, fusion.SCALAR]
    assert all(plan.held[v.id] == fusion.HELD_SCALAR for s in plan.stages[1:]
               for ins in s.members for v in ins.outvars)  # fmt: skip


def test_a_reduction_over_some_axes_is_an_op_and_its_operand_is_stored():
    plan, prog = planned(lambda x: np.sum(np.exp(x), axis=0) * 2.0, np.ones((3, 4)))
    assert kinds(plan) == [fusion.LOOP, fusion.OP, fusion.LOOP]
    assert [s.shape for s in plan.stages] == [(3, 4), (), (4,)]
    exp = var(prog, "exp")
    assert plan.held[exp.id] == fusion.HELD_LOOP and plan.storage[exp.id] == ("buf", 0)
    assert plan.buffers == [((3, 4), np.dtype(np.float64), 0)]
    # an op may return a view of what it reads: that buffer is never handed to another value
    assert plan.held[var(prog, "reduce_sum").id] == fusion.HELD_ARRAY


def test_partial_broadcasts_make_a_loop_nested():
    plan, _ = planned(lambda x, y: np.exp(x) * y + 1.0, np.ones((3, 4)), np.arange(4.0))
    assert kinds(plan) == [fusion.LOOP] and plan.stages[0].nested
    plan, _ = planned(lambda x, y: np.exp(x) * np.sum(y) + 1.0, np.ones((3, 4)), np.arange(4.0))
    loops = [s for s in plan.stages if s.kind == fusion.LOOP]
    assert loops and not any(s.nested for s in loops)  # a size-1 value is no broadcast


# --- matrix products ------------------------------------------------------------------------------
X40 = RNG.normal(size=(40, 3))
LABELS = (RNG.random(40) < 0.5).astype(np.float64)


def logistic(w):
    z = X40 @ w
    return np.sum(np.logaddexp(0.0, z) - LABELS * z)


def test_a_regression_gradient_reads_its_matrix_in_one_loop():
    plan, prog = planned(gt.value_and_grad(logistic), RNG.normal(size=3))
    assert kinds(plan) == [fusion.LOOP]
    (loop,) = plan.stages
    names = members(loop)
    assert names[0] == "matmul" and names[-1] == "matmul" and loop.shape == (40,)
    row, column = var(prog, "matmul", 0), var(prog, "matmul", 1)
    assert plan.held[row.id] == fusion.HELD_LOOP  # X @ w: one dot product per element
    assert plan.reductions[column.id] is loop  # r @ X: accumulated like a sum
    assert plan.held[column.id] == fusion.HELD_ARRAY and column.shape == (3,)


def test_a_product_by_few_rows_accumulates_columns_in_the_loop_of_its_vector():
    m = RNG.normal(size=(5, 40))
    plan, prog = planned(lambda x: np.sum(m @ np.exp(x)), np.linspace(0, 1, 40))
    assert [(s.kind, s.shape, members(s)) for s in plan.stages] == [
        (fusion.LOOP, (40,), ["exp", "matmul"]),
        (fusion.LOOP, (5,), ["reduce_sum"]),
    ]
    assert plan.stored == set()  # exp(x) never leaves the loop


def test_a_product_by_many_rows_is_a_row_product_after_the_loop():
    m = RNG.normal(size=(fusion.MAX_COLUMN_STREAMS + 4, 40))
    plan, prog = planned(lambda x: np.sum(m @ np.exp(x)), np.linspace(0, 1, 40))
    assert [(s.kind, s.shape, members(s)) for s in plan.stages] == [
        (fusion.LOOP, (40,), ["exp"]),
        (fusion.LOOP, (20,), ["matmul", "reduce_sum"]),
    ]
    assert plan.storage[var(prog, "exp").id] == ("buf", 0)


def test_a_transposed_matrix_is_read_by_columns_whatever_its_size():
    plan, _ = planned(lambda m, x: np.sum(m.T @ np.exp(x)), np.ones((40, 20)), np.ones(40))
    assert [(s.kind, members(s)) for s in plan.stages] == [
        (fusion.OP, ["transpose"]),
        (fusion.LOOP, ["exp", "matmul"]),
        (fusion.LOOP, ["reduce_sum"]),
    ]


def test_vector_dot_is_a_reduction_and_matrix_products_are_ops():
    plan, prog = planned(lambda x: x @ x + np.sum(np.sin(x)), np.linspace(0, 1, 5))
    assert [members(s) for s in plan.stages] == [["matmul", "sin", "reduce_sum"], ["add"]]
    assert plan.reductions[var(prog, "matmul").id] is plan.stages[0]
    plan, _ = planned(lambda a: np.sum(np.exp(a) @ a), np.ones((3, 3)))
    assert [(s.kind, members(s)) for s in plan.stages] == [
        (fusion.LOOP, ["exp"]),
        (fusion.OP, ["matmul"]),
        (fusion.LOOP, ["reduce_sum"]),
    ]


# --- checks, python stages and storage ------------------------------------------------------------
def test_a_check_follows_the_stage_of_its_operand():
    def f(x):
        if np.sum(np.exp(x)) > 3.0:
            return np.sum(x**2)
        return np.sum(x)

    plan, prog = planned(f, np.linspace(0, 1, 5))
    assert kinds(plan) == [fusion.LOOP, fusion.SCALAR, fusion.CHECK]
    check = plan.stages[2]
    assert check.check == 0 and check.members == []
    assert members(plan.stages[1]) == ["greater"]
    assert plan.last_use[prog.checks[0].operand.id] == check.index


def test_a_guard_on_an_input_is_checked_first():
    plan, _ = planned(lambda x, n: np.exp(x) * int(n), np.ones(4), np.array(2.0))
    assert kinds(plan) == [fusion.CHECK, fusion.LOOP]


def test_instructions_without_native_code_split_the_kernels():
    plan, prog = planned(
        lambda x: np.sum(np.sort(np.exp(x)) * 2.0), np.linspace(1, 0, 5), lowerable=lambda i: False
    )
    assert [(s.kind, s.segment) for s in plan.stages] == [
        (fusion.LOOP, 0),
        (fusion.PYTHON, 1),
        (fusion.PYTHON, 3),
        (fusion.LOOP, 4),
    ]
    assert plan.segments == 5
    assert [s.index for s in plan.stages_of(4)] == [3] and plan.stages_of(1) == []
    exp = var(prog, "exp")
    assert plan.storage[exp.id] == ("buf", 0) and plan.buffers == [((5,), np.dtype(float), 0)]


def test_a_buffer_is_reused_once_its_value_is_dead():
    def chain(x, also_first):
        a = np.exp(x)
        b = a * np.sum(a)
        c = b * np.sum(b) + (a if also_first else 0.0)
        return np.sum(c)

    x = np.linspace(0, 1, 6)
    plan, prog = planned(lambda x: chain(x, False), x)
    a, b = var(prog, "exp"), var(prog, "multiply")
    assert kinds(plan) == [fusion.LOOP] * 3
    assert plan.stored == {a.id, b.id}
    # a is last read by the loop that writes b: they share one buffer
    assert plan.storage[a.id] == plan.storage[b.id] == ("buf", 0) and len(plan.buffers) == 1
    plan, prog = planned(lambda x: chain(x, True), x)  # a is read after b is written
    a, b = var(prog, "exp"), var(prog, "multiply")
    assert {plan.storage[a.id], plan.storage[b.id]} == {("buf", 0), ("buf", 1)}
    assert len(plan.buffers) == 2


def test_an_output_array_holds_a_dead_value_of_its_type():
    plan, prog = planned(lambda x, y: np.exp(x) * y[0] + 1.0, np.ones((3, 4)), np.arange(4.0))
    exp, result = var(prog, "exp"), prog.outputs[0].var
    assert kinds(plan) == [fusion.LOOP, fusion.OP, fusion.LOOP]
    assert plan.storage == {exp.id: ("out", 0), result.id: ("out", 0)}
    assert plan.output_of == {result.id: 0}
