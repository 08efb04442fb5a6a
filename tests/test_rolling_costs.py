"""What recording a Python loop and searching its tape for loops cost, counted (never timed).

* The search's signature codes: each instruction's signature is computed once for all passes
  over a tape, from memoized parts; the codes must group instructions exactly as the
  straightforward signature below does (the oracle, checked by hypothesis on generated
  instructions).
* The search's work per instruction (signatures computed, positions tried, instructions
  compared) and the recording's live objects per instruction stay constant from 100 to
  10,000 iterations.
* No full collection of Python's cyclic collector runs while a staged recording grows.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.compile import rolling
from gradtape.core.ir import Instruction, Var
from gradtape.rules import elementwise, indexing, shape


# --- the oracle: the signature as first written, one tuple built per instruction -------------
def reference_signature(ins: Instruction):
    prim = ins.prim
    if prim.shape_from_data or prim.reads_trip_count or prim.user_rule:
        return None
    parts = [id(prim)]
    for v, a in zip(ins.invars, ins.args):
        if v is not None:
            parts.append(("v", v.shape, v.dtype.str))
        else:
            parts.append(("c", type(a).__name__, np.shape(a), np.result_type(a).str))
    for k in sorted(ins.params):
        parts.append((k, rolling._param_signature(ins.params[k])))
    parts.append(tuple((v.shape, v.dtype.str) for v in ins.outvars))
    try:
        hash(tuple(parts))
    except TypeError:
        return None
    return tuple(parts)


_PRIMS = [indexing.getitem_p, shape.reshape_p, shape.concatenate_p, elementwise.add]
_DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int64), np.dtype(bool)]
_SHAPES = [(), (3,), (2, 3), (1, 3)]
_SCALARS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([True, False, None, 2**70, -0.0, 0.0, 1.0, float("nan"), "a", Ellipsis]),
    st.sampled_from([np.int64(1), np.int32(1), np.float64(1.0), np.bool_(True)]),
)
_SLICES = st.builds(
    slice,
    st.one_of(st.none(), st.integers(-2, 2), st.just(True), st.just(np.int64(1))),
    st.one_of(st.none(), st.integers(-2, 2)),
    st.one_of(st.none(), st.integers(1, 2), st.just(False)),
)
_PARAMS = st.recursive(
    st.one_of(_SCALARS, _SLICES),
    lambda inner: st.tuples(inner) | st.tuples(inner, inner),
    max_leaves=3,
)
_CONSTANTS = st.one_of(
    st.sampled_from([1.5, -0.0, 2, True, 2**70, 1j, np.float64(2.0), np.float32(2.0)]),
    st.sampled_from([np.ones(3), np.ones((2, 3), np.float32), np.arange(3), np.array(True)]),
    st.sampled_from([np.ones(3).astype(object), np.float16(1.0), np.array([1.0]).reshape(1, 1)]),
)


@st.composite
def instructions(draw):
    counter = iter(range(1 << 30))

    def var():
        return Var(next(counter), draw(st.sampled_from(_SHAPES)), draw(st.sampled_from(_DTYPES)))

    prim = draw(st.sampled_from(_PRIMS))
    invars, args = [], []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            invars.append(var())
            args.append(None)
        else:
            invars.append(None)
            args.append(draw(_CONSTANTS))
    names = draw(st.lists(st.sampled_from(["idx", "axis", "shape", "keepdims"]), unique=True))
    params = {name: draw(_PARAMS) for name in names}
    outvars = tuple(var() for _ in range(draw(st.integers(1, 2))))
    return Instruction(prim, tuple(invars), tuple(args), params, outvars, None)


@settings(max_examples=150, deadline=None)
@given(st.lists(instructions(), min_size=2, max_size=8))
def test_signature_codes_group_instructions_as_the_reference_signature_does(generated):
    signatures = rolling._Signatures()
    # (the same instructions twice: the second pass reads the cached codes)
    codes = [signatures.code(x) for x in generated] + [signatures.code(x) for x in generated]
    assert codes[: len(generated)] == codes[len(generated) :]
    assert signatures.computed == len(generated)
    reference = [reference_signature(x) for x in generated]
    for a in range(len(generated)):
        assert (codes[a] is None) == (reference[a] is None)
        for b in range(len(generated)):
            if reference[a] is not None and reference[b] is not None:
                assert (codes[a] == codes[b]) == (reference[a] == reference[b]), (
                    generated[a],
                    generated[b],
                )


def reference_progression(values: list, limit: int):
    """The progression of a param's integers over the iterations as first written: each
    value's template built and printed (returns the failing iteration or None on failure)."""
    flat0 = rolling._flat_ints(values[0])
    if flat0 is None:
        return ("differs", None)
    flat1 = rolling._flat_ints(values[1])
    if flat1 is None or repr(flat1[0]) != repr(flat0[0]):
        return ("differs", None)
    step = [b - a for a, b in zip(flat0[1], flat1[1])]
    for t in range(2, limit):
        ft = rolling._flat_ints(values[t])
        if (
            ft is None
            or repr(ft[0]) != repr(flat0[0])
            or any(x != a + t * d for x, a, d in zip(ft[1], flat0[1], step))
        ):
            return ("differs", t if t >= rolling.MIN_TRIPS else None)
    if not rolling._progression_valid(flat0[0], flat0[1], step, limit):
        return ("differs", None)
    return (repr(flat0[0]), tuple(flat0[1]), tuple(step))


_INDEX_PARTS = st.one_of(
    st.integers(-3, 3), st.none(), st.just(np.int64(2)), st.booleans(), _SLICES
)


@st.composite
def param_runs(draw):
    """The values of one param over the iterations: mostly a progression of one structure,
    sometimes with an item of another type or value."""
    base = draw(st.one_of(st.integers(-3, 3), st.tuples(_INDEX_PARTS, _INDEX_PARTS), _SLICES))
    step = draw(st.integers(-2, 2))
    limit = draw(st.integers(2, 7))

    def at(value, t):
        if type(value) is int:
            return value + t * step
        if type(value) is tuple:
            return tuple(at(x, t) for x in value)
        if type(value) is slice:
            return slice(*(at(x, t) for x in (value.start, value.stop, value.step)))
        return value

    values = [at(base, t) for t in range(limit)]
    if draw(st.booleans()):
        values[draw(st.integers(0, limit - 1))] = draw(_PARAMS)
    return values, limit


@settings(max_examples=300, deadline=None)
@given(param_runs())
def test_progressions_are_found_as_the_reference_finds_them(run):
    values, limit = run
    want = reference_progression(values, limit)
    try:
        template, starts, steps = rolling._progression(values, limit)
        got = (repr(template), starts, steps)
    except rolling._Differs as differs:
        got = ("differs", differs.first)
    assert got == want


def test_a_python_float_and_an_array_constant_keep_their_own_signatures():
    x = Var(0, (3,), np.dtype(np.float64))
    out = (Var(1, (3,), np.dtype(np.float64)),)
    add = elementwise.add
    with_float = Instruction(add, (x, None), (None, 1.0), {}, out, None)
    with_float64 = Instruction(add, (x, None), (None, np.float64(1.0)), {}, out, None)
    with_array = Instruction(add, (x, None), (None, np.array(1.0)), {}, out, None)
    signatures = rolling._Signatures()
    codes = [signatures.code(i) for i in (with_float, with_float64, with_array)]
    assert len(set(codes)) == 3


# --- work per instruction ---------------------------------------------------------------------
def _loop(n: int):
    def f(x):
        h = 0.0
        for i in range(n):
            h = h * 0.9 + np.sin(x[i])
        return h

    return f


def _search_counts(n: int, monkeypatch) -> dict:
    """Per recorded instruction of value_and_grad of an n-iteration loop: signatures
    computed, positions the search tried, instructions it compared; and the rolled tape."""
    x = np.linspace(0.0, 1.0, n)
    tape = gt.trace(gt.value_and_grad(_loop(n)), x)
    tried = [0]
    work = [0]
    signatures = []
    try_roll = rolling._Roller.try_roll
    run = rolling._Roller.run

    def counted_try_roll(self, s, nxt):
        tried[0] += 1
        return try_roll(self, s, nxt)

    def counted_run(self):
        result = run(self)
        work[0] += self.work
        if not signatures or signatures[-1] is not self.signatures:
            signatures.append(self.signatures)
        return result

    monkeypatch.setattr(rolling._Roller, "try_roll", counted_try_roll)
    monkeypatch.setattr(rolling._Roller, "run", counted_run)
    rolled = rolling.roll_tape(tape, min_length=0)
    length = len(tape.instructions)
    return {
        "signatures": sum(s.computed for s in signatures) / length,
        "tried": tried[0] / length,
        "compared": work[0] / length,
        "rolled length": len(rolled.instructions),
    }


def test_the_search_does_the_same_work_per_instruction_from_100_to_10000_iterations(
    monkeypatch,
):
    counts = {n: _search_counts(n, monkeypatch) for n in (100, 1000, 10_000)}
    # the loop rolled at every size: the program does not grow with the trip count
    assert len({c["rolled length"] for c in counts.values()}) == 1
    for n in (1000, 10_000):
        for what in ("signatures", "tried", "compared"):
            assert counts[n][what] <= 1.1 * counts[100][what] + 0.01, (what, counts)
    # each instruction's signature once (plus those of the getitems a pass adds)
    assert counts[10_000]["signatures"] < 2, counts


def _live_objects_per_instruction(n: int) -> float:
    x = np.linspace(0.0, 1.0, n)
    f = gt.value_and_grad(_loop(n))
    gt.trace(gt.value_and_grad(_loop(4)), x[:4])  # (imports and caches filled first)
    gc.collect()
    before = len(gc.get_objects())
    tape = gt.trace(f, x)
    gc.collect()
    live = len(gc.get_objects()) - before
    return live / len(tape.instructions)


def test_a_recording_keeps_the_same_number_of_objects_per_instruction_at_every_length():
    # (from 1,000 on: Python keeps one object for each small int, so loop indices below 257
    # cost nothing and a 100-step loop would look cheaper per instruction than it is)
    small, large = _live_objects_per_instruction(1000), _live_objects_per_instruction(3000)
    assert large <= small * 1.05 + 0.1, (small, large)


def test_no_full_collection_runs_while_a_staged_recording_grows():
    collections: list[int] = []

    def note(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    n = 3000
    x = np.linspace(0.0, 1.0, n)
    gc.collect()
    gc.callbacks.append(note)
    try:
        tape = gt.trace(gt.value_and_grad(_loop(n)), x)
    finally:
        gc.callbacks.remove(note)
    assert len(tape.instructions) > 5 * n
    assert 2 not in collections
    assert 0 in collections  # (the young generations are collected as usual)


@pytest.mark.parametrize("n", [3, 50])
def test_rolled_and_unrolled_tapes_agree_after_the_search(n):
    x = np.linspace(0.0, 1.0, n)
    f = gt.value_and_grad(_loop(n))
    want = f(x)
    got = gt.compile(f, backend="numpy")(x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
