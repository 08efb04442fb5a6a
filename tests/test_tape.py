"""The tape (the IR): variable names and types, the printed listing, and the guards it records.

Listings are compared line by line: they are what `gt.trace` shows a user, and the numbering
of variables is part of it.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradtape as gt
from gradtape.core import ir

F64 = np.dtype(np.float64)


@pytest.mark.parametrize(
    "var_id, name",
    [(0, "a"), (1, "b"), (25, "z"), (26, "aa"), (27, "ab"), (51, "az"), (52, "ba"),
     (701, "zz"), (702, "aaa"), (703, "aab")],
)  # fmt: skip
def test_var_names_count_like_spreadsheet_columns(var_id, name):
    assert ir.Var(var_id, (), F64).name == name


def test_var_names_are_distinct_for_the_first_thousands():
    names = [ir.Var(i, (), F64).name for i in range(20_000)]
    assert len(set(names)) == len(names)
    assert all(n.isalpha() and n.islower() for n in names)


@pytest.mark.parametrize(
    "shape, dtype, text",
    [((2, 3), np.float64, "f64[2,3]"), ((), np.float64, "f64[]"), ((5,), np.float32, "f32[5]"),
     ((4,), np.bool_, "bool[4]"), ((1, 1), np.int64, "i64[1,1]"), ((2,), np.complex128, "c128[2]"),
     ((3,), np.uint16, "uint16[3]")],
)  # fmt: skip
def test_var_type_strings(shape, dtype, text):
    v = ir.Var(7, shape, np.dtype(dtype))
    assert v.type_str == text
    assert repr(v) == f"h:{text}"


def test_listing_of_indexing_params_and_constants():
    x = np.arange(12.0).reshape(3, 4)
    big = np.arange(10.0)

    def f(x):
        first = x[1:3, ::2], x[..., 0], x[None, 1], np.exp(x)[0] * big[:4]
        return *first, x[0] * big[:4] * 0 + big[0], 2.5

    tape = gt.trace(f, x)
    assert str(tape).splitlines() == [
        "{ lambda a:f64[3,4] .",
        "    b:f64[2,2] = getitem[idx=(1:3,::2)] a",
        "    c:f64[3] = getitem[idx=(...,0)] a",
        "    d:f64[1,4] = getitem[idx=(None,1)] a",
        "    e:f64[3,4] = exp a",
        "    f:f64[4] = getitem[idx=(0,)] e",
        "    g:f64[4] = multiply f [0.,1.,2.,3.]",
        "    h:f64[4] = getitem[idx=(0,)] a",
        "    i:f64[4] = multiply h [0.,1.,2.,3.]",
        "    j:f64[4] = multiply i 0",
        "    k:f64[4] = add j 0",
        "  in (b, c, d, g, k, 2.5) }",
    ]
    assert len(tape) == 10
    assert repr(tape) == str(tape)


def test_large_constants_print_as_their_type_and_floats_with_six_digits():
    big = np.linspace(0.0, 1.0, 5)
    tape = gt.trace(lambda x: x * big + 1.0 / 3.0, np.ones(5, np.float32))
    lines = str(tape).splitlines()
    assert lines[1] == "    b:f64[5] = multiply a const:f64[5]"  # f32 * f64 array: f64
    assert lines[2].endswith("= add b 0.333333")


def test_inputs_are_the_leaves_of_every_argument_in_order():
    params = {"w": np.ones(3), "b": np.float32(2.0)}
    tape = gt.trace(lambda p, x: np.sum(p["w"] * x) + p["b"], params, np.ones((2, 3)))
    # dict leaves in sorted key order ("b" before "w"), then the second argument
    assert [repr(v) for v in tape.inputs] == ["a:f32[]", "b:f64[3]", "c:f64[2,3]"]
    assert [v.id for v in tape.inputs] == [0, 1, 2]
    ids = [v.id for ins in tape.instructions for v in ins.outvars]
    assert ids == list(range(3, 3 + len(ids)))  # every new value gets the next id


def test_multiple_results_share_one_line():
    a = np.array([[2.0, 0.5], [0.5, 3.0]])
    tape = gt.trace(lambda a: np.linalg.slogdet(a)[1] + np.sum(np.linalg.eigh(a)[0]), a)
    lines = str(tape).splitlines()
    assert lines[1] == "    b:f64[] c:f64[] = slogdet a"
    assert lines[2] == "    d:f64[2] e:f64[2,2] = eigh[UPLO='L'] a"
    assert [len(ins.outvars) for ins in tape.instructions] == [2, 2, 1, 1]


def guarded(x, n):
    total = x * int(n)  # int guard on the input n
    if np.sum(x) > 1.0:  # bool guard
        total = total + x[1].item()  # item guard
    for _ in range(np.argmax(x)):  # index guard
        total = total * 2.0
    return total + len(x.tolist())  # value guard


def test_each_way_of_asking_a_value_records_its_guard_on_that_value():
    x, n = np.array([0.5, 1.5, 0.25]), np.array(3.0)
    tape = gt.trace(guarded, x, n)
    np.testing.assert_allclose(tape.instructions[-1].out, guarded(x, n))
    kinds = [(g.kind, g.answer) for g in tape.guards]
    assert kinds[:4] == [("int", 3), ("bool", True), ("item", 1.5), ("index", 1)]
    assert kinds[4][0] == "value"
    np.testing.assert_array_equal(kinds[4][1], x)
    by_name = {ins.prim.name: ins.outvars[0] for ins in tape.instructions}
    assert tape.guards[0].var is tape.inputs[1]  # int(n): the input itself
    assert tape.guards[1].var is by_name["greater"]
    assert tape.guards[2].var is by_name["getitem"]
    assert tape.guards[3].var is by_name["argmax"]
    assert tape.guards[4].var is tape.inputs[0]
    assert all(g.where.startswith("test_tape.py:") for g in tape.guards)
    assert tape.guards[1].where.endswith("if np.sum(x) > 1.0:  # bool guard")


def test_guards_print_after_the_instructions():
    tape = gt.trace(guarded, np.array([0.5, 1.5, 0.25]), np.array(3.0))
    lines = str(tape).splitlines()
    guard_lines = [line.strip() for line in lines if line.lstrip().startswith("guard ")]
    assert len(guard_lines) == 5
    assert lines[-6:-1] == ["    " + g for g in guard_lines]
    assert guard_lines[0].startswith("guard int(b) == 3    # test_tape.py:")
    assert guard_lines[1].startswith("guard bool(") and " == True    # " in guard_lines[1]
    assert guard_lines[4].startswith("guard value(a) == [0.5 ,1.5 ,0.25]    # ")


def test_guard_repr_of_a_large_array_answer():
    g = ir.Guard(ir.Var(3, (6,), F64), "value", np.arange(6.0), "f.py:1: y = x.tolist()")
    assert repr(g) == "guard value(d) == const:f64[6]    # f.py:1: y = x.tolist()"


def test_a_hand_built_tape_prints_captured_values_and_constant_outputs():
    sin = gt.trace(np.sin, np.ones(2)).instructions[0].prim
    t = ir.Tape()
    a, c, b = ir.Var(0, (2,), F64), ir.Var(1, (), F64), ir.Var(2, (2,), F64)
    t.inputs = [a]
    t.captured = [(c, None, 1.0)]  # (var, outer Tracer, value): what a loop body closed over
    t.instructions = [ir.Instruction(sin, (a,), (None,), {}, (b,), None)]
    t.outputs = [b, np.zeros(7), 0.5]
    assert str(t).splitlines() == [
        "{ lambda a:f64[2] ; captured b:f64[] .",
        "    c:f64[2] = sin a",
        "  in (c, const:f64[7], 0.5) }",
    ]
