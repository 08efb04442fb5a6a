"""compile/dispatch.py: signatures, guarded variants, re-recording, pytree results, out=.

Every compiled call is compared with the plain function, and the counters in `stats` say
exactly which calls recorded, replayed, failed a guard or ran eagerly. Programs are lowered
by a backend registered for these tests, which counts lowerings and uses the numpy backend.
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile import BACKENDS, CompileWarning, register_backend

_LOWERED: list = []
Pair = collections.namedtuple("Pair", "first second")


def _counting_lower(prog):
    _LOWERED.append(prog)
    return BACKENDS["numpy"](prog)


@pytest.fixture(scope="module", autouse=True)
def counting_backend():
    register_backend("count-lowerings", _counting_lower)
    yield
    del BACKENDS["count-lowerings"]


def compiled(f, **options):
    return gt.compile(f, backend="count-lowerings", **options)


def counters(cf, label=None) -> dict:
    stats = cf.stats if label is None else cf.stats["per_signature"][label]
    return {k: v for k, v in stats.items() if k != "per_signature"}


def assert_same(result, expected):
    """Same structure and leaf types, dtypes and values."""
    assert type(result) is type(expected)
    if isinstance(expected, (tuple, list)):
        assert len(result) == len(expected)
        for r, e in zip(result, expected):
            assert_same(r, e)
    elif isinstance(expected, dict):
        assert result.keys() == expected.keys()
        for k in expected:
            assert_same(result[k], expected[k])
    elif expected is not None:
        assert np.asarray(result).dtype == np.asarray(expected).dtype
        np.testing.assert_array_equal(result, expected)


# --- signatures -----------------------------------------------------------------------------------
def test_labels_show_structure_leaf_types_keywords_and_static_values():
    def f(params, x, scale=1.0, mode="sum"):
        return np.sum(params["w"] * x) * scale

    cf = compiled(f, static_argnums=(3,), static_argnames=("mode",))
    w = {"w": np.ones(3, np.float32)}
    x = np.arange(3.0)
    for scale in (2.0, np.float32(2.0), 2, True, np.array(2.0)):
        assert cf(w, x, scale, "sum") == f(w, x, scale)
    assert cf(w, x, scale=0.5, mode="mean") == f(w, x, 0.5)
    assert list(cf.stats["per_signature"]) == [
        "({'w': f32[3]}, f64[3], float) static 3='sum'",
        "({'w': f32[3]}, f64[3], f32 scalar) static 3='sum'",
        "({'w': f32[3]}, f64[3], int) static 3='sum'",
        "({'w': f32[3]}, f64[3], bool) static 3='sum'",
        "({'w': f32[3]}, f64[3], f64[]) static 3='sum'",
        "({'w': f32[3]}, f64[3], scale=float) static mode='mean'",
    ]
    g = compiled(lambda a, b=None: a * 2.0)
    g(np.ones(2), [1.0, (2, None)])
    g(np.ones(2), b=np.ones(1))
    assert list(g.stats["per_signature"]) == [
        "(f64[2], [float, (int, None)])",
        "(f64[2], b=f64[1])",
    ]


def test_a_python_number_is_traced_and_keyed_by_its_type_only():
    cf = compiled(lambda x, s: x * s + s**2)
    x = np.arange(3.0)
    for s in (2.0, 3.0, -0.5):
        assert_same(cf(x, s), x * s + s**2)
    assert counters(cf) == {
        "calls": 3, "replays": 2, "recordings": 1, "guard_failures": 0, "eager_calls": 0,
        "variants": 1,
    }  # fmt: skip
    assert_same(cf(x, 4), x * 4 + 4**2)  # an int is another signature
    assert cf.stats["recordings"] == 2 and len(_LOWERED[-1].inputs) == 2


def test_shapes_and_dtypes_key_signatures():
    cf = compiled(lambda x: np.sum(np.sin(x)))
    args = [np.ones(3), np.ones(4), np.ones(3, np.float32), np.ones((3, 1)), np.ones(3)]
    before = len(_LOWERED)
    for x in args + args:
        assert_same(cf(x), np.sum(np.sin(x)))
    assert len(_LOWERED) - before == 4
    per = cf.stats["per_signature"]
    assert list(per) == ["(f64[3])", "(f64[4])", "(f32[3])", "(f64[3,1])"]
    assert per["(f64[3])"] == {
        "replays": 3, "recordings": 1, "guard_failures": 0, "eager_calls": 0, "variants": 1,
        "calls": 4,
    }  # fmt: skip
    assert all(per[k]["calls"] == 2 for k in list(per)[1:])


def test_keyword_arguments_are_traced_and_static_names_record_per_value():
    def f(x, scale=1.0, power=2):
        return np.sum(x**power) * scale

    cf = compiled(f, static_argnames="power")
    x = np.linspace(0.5, 1.5, 4)
    for scale, power in ((2.0, 2), (3.0, 2), (2.0, 3), (5.0, 3)):
        assert_same(cf(x, scale=scale, power=power), f(x, scale, power))
    assert counters(cf)["recordings"] == 2 and counters(cf)["replays"] == 2


# --- guarded variants -----------------------------------------------------------------------------
def branching(x):
    if np.sum(x) > 1.0:
        return np.sum(x) ** 3
    return np.sum(x) ** 2


def test_a_failed_guard_records_the_new_path_once_then_selects_it():
    cf = compiled(branching)
    low, high = np.array([0.1, 0.2]), np.array([0.7, 0.8])
    before = len(_LOWERED)
    for x in (low, high, low, high, high):
        assert_same(cf(x), branching(x))
    assert len(_LOWERED) - before == 2  # one lowering per path
    # low: recorded; high: low's variant fails its guard, recorded; low: high's fails, low's
    # replays; high: low's fails, high's replays; high: replays directly
    assert counters(cf) == {
        "calls": 5, "replays": 3, "recordings": 2, "guard_failures": 3, "eager_calls": 0,
        "variants": 2,
    }  # fmt: skip
    answers = [[g.answer for g in t.guards] for t in cf.tapes(low)]
    assert answers == [[False], [True]]


def test_variants_form_a_tree_keyed_by_the_answers_of_their_checks():
    def f(x):
        y = x * 2.0 if x[0] > 0 else x * 3.0
        return np.sum(y) if x[1] > 0 else np.sum(y * y)

    cf = compiled(f, max_variants=4)
    signs = [(1, 1), (1, -1), (-1, 1), (-1, -1)]
    before = len(_LOWERED)
    for _ in range(3):
        for a, b in signs:
            x = np.array([a * 0.5, b * 0.25])
            assert_same(cf(x), f(x))
    assert len(_LOWERED) - before == 4
    paths = sorted(tuple(g.answer for g in t.guards) for t in cf.tapes(np.ones(2)))
    assert paths == [(False, False), (False, True), (True, False), (True, True)]
    assert counters(cf)["recordings"] == 4 and counters(cf)["eager_calls"] == 0


def test_past_max_variants_new_paths_run_eagerly_and_recorded_ones_still_replay():
    cf = compiled(branching, max_variants=1)
    low, high = np.array([0.1, 0.2]), np.array([0.7, 0.8])
    assert_same(cf(low), branching(low))
    with pytest.warns(CompileWarning, match="max_variants=1"):
        assert_same(cf(high), branching(high))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        assert_same(cf(high), branching(high))
        assert_same(cf(low), branching(low))
    assert counters(cf) == {
        "calls": 4, "replays": 1, "recordings": 1, "guard_failures": 2, "eager_calls": 2,
        "variants": 1,
    }  # fmt: skip


def test_an_unreplayable_guard_runs_eagerly_without_recording_again():
    def f(x):
        return x * x.item(1)

    cf = compiled(f)
    x = np.array([1.0, 2.0, 3.0])
    before = len(_LOWERED)
    with pytest.warns(CompileWarning, match=r"write x\[i\]\.item\(\) instead"):
        assert_same(cf(x), f(x))
    for k in range(3):
        assert_same(cf(x + k), f(x + k))
    assert len(_LOWERED) == before  # never lowered
    stats = counters(cf)
    assert (stats["recordings"], stats["replays"], stats["variants"]) == (1, 0, 0)
    assert stats["eager_calls"] >= 3
    with pytest.raises(gt.GradtapeError, match="run eagerly"):
        cf.tape(x)
    assert cf.tapes(x) == []
    out = np.empty(3)
    assert cf(x, out=out) is out  # out= on the eager path: copied in
    np.testing.assert_array_equal(out, f(x))


def test_every_call_is_counted_once():
    cf = compiled(lambda x: x * x.item(1))
    with pytest.warns(CompileWarning):
        for _ in range(4):
            cf(np.ones(3))
    assert cf.stats["calls"] == 4
    assert cf.stats["recordings"] == 1 and cf.stats["eager_calls"] == 3


def test_a_traced_value_of_a_finished_transformation_is_rejected():
    leaked = []
    gt.grad(lambda x: leaked.append(x) or np.sum(x))(np.ones(2))
    with pytest.raises(gt.GradtapeError, match="finished transformation"):
        compiled(lambda x: x * 2.0)(leaked[0])


# --- results --------------------------------------------------------------------------------------
def structured(x):
    return {
        "sum": np.sum(x),
        "parts": [x * 2.0, None, 3.0, x.astype(np.float32)],
        "pair": Pair(x[0], np.float32(1.5)),
        "nested": ((np.sin(x),),),
    }


def test_results_keep_their_structure_and_leaf_types_on_every_call():
    cf = compiled(structured)
    x = np.linspace(0.0, 1.0, 3)
    first = cf(x)
    assert_same(first, structured(x))
    assert type(first["sum"]) is np.float64 and type(first["pair"]) is Pair
    assert type(first["parts"][2]) is float  # a constant leaf stays what the function returned
    for k in range(2):
        again = cf(x + k)
        assert_same(again, structured(x + k))
        assert again["parts"][0] is not first["parts"][0]
    assert cf.stats["replays"] == 2


def test_out_takes_any_structure_of_the_result():
    cf = compiled(lambda x: {"v": np.sum(x**2), "g": [2.0 * x, np.sin(x)]})
    x = np.linspace(0.0, 1.0, 4)
    out = {"v": np.empty(()), "g": [np.empty(4), np.empty(4)]}
    for k in range(2):  # the recording call and a replay
        assert cf(x + k, out=out) is out
        np.testing.assert_array_equal(out["v"], np.sum((x + k) ** 2))
        np.testing.assert_array_equal(out["g"][0], 2.0 * (x + k))
        np.testing.assert_array_equal(out["g"][1], np.sin(x + k))
    read_only = np.empty(4)
    read_only.flags.writeable = False
    with pytest.raises(gt.GradtapeError, match="read-only"):
        cf(x, out={"v": np.empty(()), "g": [read_only, np.empty(4)]})
    with pytest.raises(gt.GradtapeError, match="dtype float64 expected"):
        cf(x, out={"v": np.empty(()), "g": [np.empty(4, np.float32), np.empty(4)]})
    with pytest.raises(gt.GradtapeError, match="structure"):
        cf(x, out={"v": np.empty(()), "g": (np.empty(4), np.empty(4))})


# --- the compiled function itself -----------------------------------------------------------------
def test_construction_errors_and_identity():
    def loss(x):
        """The docstring."""
        return np.sum(x)

    cf = compiled(loss)
    assert cf.__name__ == "loss" and cf.__doc__ == "The docstring."
    assert repr(cf) == "<compiled test_construction_errors_and_identity.<locals>.loss " \
        "backend=count-lowerings>"  # fmt: skip
    with pytest.raises(TypeError, match="expected a function, got int"):
        gt.compile(3)
    with pytest.raises(ValueError, match="max_variants must be at least 1"):
        gt.compile(loss, max_variants=0)
    with pytest.raises(ValueError, match="unknown backend 'nope'; available: auto, numpy"):
        gt.compile(loss, backend="nope")
    with pytest.raises(gt.GradtapeError, match="dtype <U1"):
        cf(np.array(["a"]))
    with pytest.raises(gt.GradtapeError, match="builtins.object"):
        cf(object())
