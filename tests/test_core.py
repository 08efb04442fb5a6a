"""The public API, the seeds' functions, activity, guards, errors, and thread safety."""

from __future__ import annotations

import math
import sys
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import assert_grad_matches
from seed_functions import branching, eam, normal_logpdf, sum_exp

import gradtape as gt
from gradtape.core.primitive import REGISTRY, Primitive
from gradtape.core.tracing import GradtapeError, current_levels


def recording_levels(f):
    """Wrap f so that each call remembers the (innermost) level it was traced at."""
    levels = []

    def wrapped(*args, **kwargs):
        levels.append(current_levels()[-1])
        return f(*args, **kwargs)

    wrapped.levels = levels
    return wrapped


def prim_names(level) -> list[str]:
    return [ins.prim.name for ins in level.tape.instructions]


# --- the seeds' functions -------------------------------------------------------------------
def scalar_loop(xs):
    s = 0.0
    for i in range(len(xs)):
        s = s + (i + 1) * xs[i]
    return s


def test_normal_logpdf():
    x = np.linspace(-2.0, 3.0, 11)
    g = assert_grad_matches(normal_logpdf, x)
    np.testing.assert_allclose(g, -(x - 0.3) / 1.7**2, rtol=1e-13)
    # the mean and scale can be differentiated too
    gmu, gsigma = gt.grad(normal_logpdf, argnums=(1, 2))(x, 0.3, 1.7)
    z = (x - 0.3) / 1.7
    assert gmu == pytest.approx(np.sum(z / 1.7))
    assert gsigma == pytest.approx(np.sum(z**2 / 1.7 - 1 / 1.7))


def test_eam_matches_hand_written_gradient():
    x = np.random.default_rng(1).random(50)
    rho = np.sum(np.exp(-3 * (x + 1)))
    hand = -3 * np.exp(-3 * (x + 1)) * (2 * rho + 3 * rho**2 + rho**3)
    np.testing.assert_allclose(assert_grad_matches(eam, x), hand, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sum_exp(dtype):
    x = np.linspace(-1, 1, 9).astype(dtype)
    g = assert_grad_matches(sum_exp, x)
    assert g.dtype == dtype
    np.testing.assert_allclose(g, np.exp(x), rtol=1e-6)


@pytest.mark.parametrize(
    "x, expected",
    [
        ([0.1, 0.2, 0.3], 2 * 0.6),  # low branch: d/dx sum^2
        ([1.1, 1.2, 1.3], 3 * 3.6**2),  # high branch: d/dx sum^3
    ],
)
def test_branching_takes_the_branch_of_the_input(x, expected):
    x = np.array(x)
    np.testing.assert_allclose(assert_grad_matches(branching, x), expected)


def test_scalar_loop():
    x = np.ones(5)
    np.testing.assert_allclose(assert_grad_matches(scalar_loop, x), [1, 2, 3, 4, 5.0])


def test_check_grad_on_the_seeds():
    for f, x in [
        (normal_logpdf, np.linspace(-1, 1, 5)),
        (eam, np.linspace(0, 1, 5)),
        (sum_exp, np.linspace(-1, 1, 5)),
        (branching, np.array([0.5, 0.9])),
        (scalar_loop, np.ones(4)),
    ]:
        result = gt.check_grad(f, x)
        assert result.ok, f"{f.__name__}: {result}"
        assert result.max_error_cs is not None and result.max_error_cs < 1e-12


# --- API ---------------------------------------------------------------------------------------
def test_value_and_grad_and_vjp():
    x = np.array([0.5, -1.0, 2.0])
    value, g = gt.value_and_grad(lambda x: np.sum(np.sin(x) * x))(x)
    assert value == pytest.approx(np.sum(np.sin(x) * x))
    np.testing.assert_allclose(g, np.cos(x) * x + np.sin(x))

    out, vjp_fn = gt.vjp(lambda x, y: (x * y, np.sum(x) * y), x, 3.0)
    np.testing.assert_allclose(out[0], 3 * x)
    assert out[1] == pytest.approx(4.5)
    gx, gy = vjp_fn((np.array([1.0, 2.0, 3.0]), 2.0))
    np.testing.assert_allclose(gx, 3 * np.array([1.0, 2.0, 3.0]) + 2 * 3.0)
    assert gy == pytest.approx(np.dot([1.0, 2.0, 3.0], x) + 2 * np.sum(x))
    # vjp_fn can be called again with another cotangent
    gx2, _ = vjp_fn((np.zeros(3), 1.0))
    np.testing.assert_allclose(gx2, 3.0)


def test_vjp_rejects_a_cotangent_of_the_wrong_structure():
    _, vjp_fn = gt.vjp(lambda x: (x, x * 2), np.ones(2))
    with pytest.raises(GradtapeError, match="structure"):
        vjp_fn(np.ones(2))
    with pytest.raises(GradtapeError, match="shape"):
        vjp_fn((np.ones(2), np.ones(3)))


def test_argnums():
    x, y, z = np.array([1.0, 2.0]), np.array([3.0, 4.0]), 2.0

    def f(x, y, z):
        return np.sum(x * y * z + y**2)

    np.testing.assert_allclose(gt.grad(f)(x, y, z), y * z)
    np.testing.assert_allclose(gt.grad(f, argnums=1)(x, y, z), x * z + 2 * y)
    np.testing.assert_allclose(gt.grad(f, argnums=-2)(x, y, z), x * z + 2 * y)
    gx, gz = gt.grad(f, argnums=(0, 2))(x, y, z)
    np.testing.assert_allclose(gx, y * z)
    assert gz == pytest.approx(np.sum(x * y))
    (gy,) = gt.grad(f, argnums=(1,))(x, y, z)
    np.testing.assert_allclose(gy, x * z + 2 * y)
    with pytest.raises(GradtapeError, match="argnums"):
        gt.grad(f, argnums=3)(x, y, z)


def test_keyword_arguments_are_passed_and_not_differentiated():
    def f(x, scale=1.0):
        return np.sum(scale * x**2)

    np.testing.assert_allclose(gt.grad(f)(np.array([1.0, 2.0]), scale=3.0), [6.0, 12.0])


def test_has_aux():
    x = np.array([1.0, 2.0, 3.0])

    def f(x):
        loss = np.sum(x**2)
        return loss, {"mean": np.mean(x), "x": x, "label": "ok"}

    g, aux = gt.grad(f, has_aux=True)(x)
    np.testing.assert_allclose(g, 2 * x)
    assert aux["mean"] == pytest.approx(2.0) and aux["label"] == "ok"
    assert isinstance(aux["x"], np.ndarray)  # plain values, not Tracers
    (value, aux2), g2 = gt.value_and_grad(f, has_aux=True)(x)
    assert value == pytest.approx(14.0) and aux2["mean"] == pytest.approx(2.0)
    np.testing.assert_allclose(g2, 2 * x)
    with pytest.raises(GradtapeError, match="pair"):
        gt.grad(lambda x: np.sum(x), has_aux=True)(x)


def test_pytree_arguments_give_gradients_of_the_same_structure():
    params = {
        "w": np.array([[1.0, 2.0], [3.0, 4.0]]),
        "b": [np.array([0.5, -0.5]), 2.0],
        "nested": ({"s": np.float32(1.5)},),
    }

    def f(p):
        h = np.sum(p["w"] * np.array([1.0, -1.0]), axis=1)
        return np.sum(h * p["b"][0]) * p["b"][1] + p["nested"][0]["s"] ** 2

    g = gt.grad(f)(params)
    assert set(g) == {"w", "b", "nested"} and isinstance(g["b"], list)
    assert isinstance(g["nested"], tuple) and set(g["nested"][0]) == {"s"}
    np.testing.assert_allclose(g["w"], 2.0 * np.outer([0.5, -0.5], [1.0, -1.0]))
    np.testing.assert_allclose(g["b"][0], 2.0 * np.array([-1.0, -1.0]))
    assert g["b"][1] == pytest.approx(np.sum(np.array([-1.0, -1.0]) * [0.5, -0.5]))
    assert np.asarray(g["nested"][0]["s"]).dtype == np.float32
    assert g["nested"][0]["s"] == pytest.approx(3.0)


def test_scalars_0d_arrays_and_python_floats():
    for x in (2.0, np.array(2.0), np.float64(2.0), np.array([2.0])):
        g = gt.grad(lambda x: np.sum(x**3 + 1.0))(x)
        assert np.shape(g) == np.shape(x)
        assert g == pytest.approx(12.0)
    assert isinstance(gt.grad(lambda x: x * x)(3.0), (float, np.floating))


def test_second_derivative_and_nested_levels():
    assert gt.grad(gt.grad(lambda x: x**3))(2.0) == pytest.approx(12.0)
    assert gt.grad(gt.grad(lambda x: np.sum(np.sin(x))))(np.array(0.5)) == pytest.approx(
        -np.sin(0.5)
    )
    # an outer value used inside an inner grad: no perturbation confusion
    assert gt.grad(lambda x: gt.grad(lambda y: x * y)(2.0))(3.0) == pytest.approx(1.0)
    assert gt.grad(lambda x: x * gt.grad(lambda y: x * y)(2.0))(3.0) == pytest.approx(6.0)


def test_output_not_depending_on_the_input():
    g = gt.grad(lambda x: 3.0)(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(g, [0.0, 0.0])
    g = gt.grad(lambda x: np.sum(np.ones(3)))(2.0)
    assert g == 0.0


def test_gradients_are_fresh_writable_arrays():
    x = np.array([1.0, 2.0])
    g1 = gt.grad(lambda x: np.sum(x))(x)
    g1[0] = 100.0  # the caller owns it
    np.testing.assert_array_equal(gt.grad(lambda x: np.sum(x))(x), [1.0, 1.0])
    np.testing.assert_array_equal(x, [1.0, 2.0])


# --- custom_vjp and stop_gradient ---------------------------------------------------------------
def test_stop_gradient():
    x = np.array([1.0, 2.0])
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(x * gt.stop_gradient(x)))(x), x)
    tree = gt.grad(lambda x: np.sum(gt.stop_gradient({"a": x, "b": [x * 2]})["b"][0] * x))(x)
    np.testing.assert_allclose(tree, 2 * x)
    assert gt.stop_gradient(3.0) == 3.0  # outside tracing: the value itself


def test_control_primitives_declare_what_the_compiler_reads():
    assert REGISTRY["stop_gradient"].identity  # a replay forwards its input
    assert REGISTRY["scan_bwd"].reads_trip_count  # its length comes from its inputs' shapes
    assert not REGISTRY["scan"].reads_trip_count

    @gt.custom_vjp
    def f(x):
        return x

    @gt.custom_jvp
    def h(x):
        return x

    assert f._prim.user_rule and h._prim.user_rule
    # one primitive per decorated function, kept out of the library's registry
    assert "custom_vjp[f]" not in REGISTRY and "custom_jvp[h]" not in REGISTRY


def test_custom_vjp_rule_is_used():
    calls = []

    @gt.custom_vjp
    def clipped_identity(x, limit):
        return np.clip(x, -limit, limit)

    def fwd(x, limit):
        return clipped_identity(x, limit), (x, limit)

    def bwd(res, g):
        calls.append(1)
        x, limit = res
        return g * 0.5, None  # a deliberately different (straight-through, halved) rule

    clipped_identity.defvjp(fwd, bwd)
    x = np.array([-3.0, 0.5, 4.0])
    np.testing.assert_allclose(clipped_identity(x, 1.0), [-1.0, 0.5, 1.0])  # plain call
    g = gt.grad(lambda x: np.sum(clipped_identity(x, 1.0) ** 2))(x)
    np.testing.assert_allclose(g, 0.5 * 2 * np.array([-1.0, 0.5, 1.0]))
    assert calls == [1]


def test_custom_vjp_with_a_correct_rule_passes_check_grad():
    @gt.custom_vjp
    def log1pexp(x):
        return np.logaddexp(0.0, x)

    log1pexp.defvjp(lambda x: (log1pexp(x), x), lambda x, g: (g / (1 + np.exp(-x)),))
    x = np.array([-30.0, -1.0, 0.0, 2.0, 40.0])
    assert gt.check_grad(lambda x: np.sum(log1pexp(x) * np.arange(5.0)), x).ok


def test_custom_vjp_without_rule_or_with_a_bad_bwd_says_so():
    @gt.custom_vjp
    def f(x):
        return x * 2

    with pytest.raises(GradtapeError, match="defvjp"):
        gt.grad(lambda x: np.sum(f(x)))(np.ones(2))
    f.defvjp(lambda x: (f(x), None), lambda res, g: g * 2)  # not a tuple
    with pytest.raises(GradtapeError, match="tuple"):
        gt.grad(lambda x: np.sum(f(x)))(np.ones(2))


# --- check_grad must be able to fail ---------------------------------------------------------
def test_check_grad_fails_on_a_wrong_custom_rule():
    @gt.custom_vjp
    def square(x):
        return x * x

    square.defvjp(lambda x: (square(x), x), lambda x, g: (g * 3 * x,))  # wrong: 3x, not 2x
    result = gt.check_grad(lambda x: np.sum(square(x)), np.array([0.5, 1.0, 2.0]))
    assert not result.ok
    assert result.max_error_fd > 0.1
    assert "FAILED" in str(result)


def test_check_grad_fails_on_a_wrong_primitive():
    wrong_sin = Primitive(
        "test_wrong_sin", np.sin, vjps=(lambda g, ans, x: g * np.sin(x),)
    )  # wrong: sin, not cos
    right_sin = Primitive("test_right_sin", np.sin, vjps=(lambda g, ans, x: g * np.cos(x),))
    x = np.array([0.3, 1.1, 2.0])
    assert not gt.check_grad(lambda x: np.sum(wrong_sin(x)), x).ok
    assert gt.check_grad(lambda x: np.sum(right_sin(x)), x).ok


# --- activity: constants cost nothing ------------------------------------------------------------
def test_operations_on_constants_alone_are_not_recorded():
    c = np.linspace(0.0, 1.0, 100)

    @recording_levels
    def f(p):
        k = np.exp(c) * 2.0 + np.sum(c**2)  # constants only
        return np.sum(k) * p

    gt.grad(f)(3.0)
    assert prim_names(f.levels[0]) == ["multiply"]


def test_backward_never_computes_a_cotangent_for_a_constant(monkeypatch):
    """Spy on every VJP rule: none is ever asked for the cotangent of the closed-over array."""
    from gradtape.core.primitive import REGISTRY

    c = np.linspace(1.0, 2.0, 50)
    asked = []

    def spy(prim_name, i, rule):
        def spying_rule(g, ans, *args, **params):
            asked.append((prim_name, args[i] is c))
            return rule(g, ans, *args, **params)

        return spying_rule

    for prim in list(REGISTRY.values()):
        if type(prim.vjps) is tuple:
            monkeypatch.setattr(
                prim,
                "vjps",
                tuple(None if r is None else spy(prim.name, i, r) for i, r in enumerate(prim.vjps)),
            )
    g = gt.grad(lambda p: np.sum(c * p + np.sin(c) * p**2 + c[3] / p))(2.0)
    monkeypatch.undo()
    assert g == pytest.approx(np.sum(c) + 4 * np.sum(np.sin(c)) - c.size * c[3] / 4)
    assert {name for name, _ in asked} >= {"multiply", "divide", "square"}
    assert not any(is_constant for _, is_constant in asked), asked


@pytest.mark.parametrize("n", [10**3, 10**7])
def test_closure_constant_costs_the_same_for_any_size(n):
    """The Zygote seed: the gradient of p -> c[0] * p must not depend on len(c)."""
    c = np.full(n, 3.0)
    f = recording_levels(lambda p: c[0] * p)
    tracemalloc.start()
    try:
        g = gt.grad(f)(2.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert g == 3.0
    tape = f.levels[0].tape
    assert prim_names(f.levels[0]) == ["multiply"]
    assert str(tape) == "{ lambda a:f64[] .\n    b:f64[] = multiply 3 a\n  in () }"
    assert peak < 100_000, f"grad allocated {peak} bytes for a constant of {n} elements"


def test_indexing_a_large_traced_array_has_an_o1_adjoint(monkeypatch):
    """k reads of x[i] scatter into one gradient buffer: not k dense one-hot arrays."""
    import gradtape.transforms.reverse as reverse

    n, k = 10**6, 40
    x = np.linspace(0.0, 1.0, n)
    materialized = []
    original = reverse.materialize

    def counting_materialize(ct):
        materialized.append(len(ct) if isinstance(ct, list) else 1)
        return original(ct)

    monkeypatch.setattr(reverse, "materialize", counting_materialize)
    f = recording_levels(lambda x: sum(x[i * 1000] * i for i in range(k)))
    tracemalloc.start()
    try:
        g = gt.grad(f)(x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expected = np.zeros(n)
    expected[np.arange(k) * 1000] = np.arange(k)
    np.testing.assert_array_equal(g, expected)
    assert materialized == [k], "one dense buffer for all k reads"
    assert peak < 3 * x.nbytes, f"peak {peak} bytes: a dense cotangent per index?"
    assert prim_names(f.levels[0]).count("getitem") == k


# --- guards -----------------------------------------------------------------------------------
def guarded(x, n):
    if x.sum() > 1:
        x = x * 2.0
    total = 0.0
    for i in range(int(n)):
        total = total + x[i]
    scale = x[0].item()
    return total * scale + x[int(x[1])]


def test_guards_are_recorded_with_answer_and_source_line():
    x, n = np.array([1.5, 0.2, 3.0]), np.array(2.0)
    tape = gt.trace(guarded, x, n)
    kinds = [(g.kind, g.answer) for g in tape.guards]
    assert kinds == [("bool", True), ("int", 2), ("item", 3.0), ("int", 0)]
    assert all(g.where.startswith("test_core.py:") for g in tape.guards)
    assert "if x.sum() > 1:" in tape.guards[0].where
    assert "for i in range(int(n)):" in tape.guards[1].where
    assert "scale = x[0].item()" in tape.guards[2].where
    text = str(tape)
    assert "guard bool(" in text and "== True" in text and "# test_core.py:" in text
    assert "guard item(" in text and "guard int(" in text


def guarded_constant_scale(x, n):
    """`guarded` with its constant made explicit: under grad, .item() would cut the gradient."""
    if x.sum() > 1:
        x = x * 2.0
    total = 0.0
    for i in range(int(n)):
        total = total + x[i]
    scale = gt.stop_gradient(x[0])
    return total * scale + x[int(x[1])]


def test_guards_are_recorded_under_grad_too():
    """Under grad a comparison is a plain value (no guard); int() of a Tracer is guarded."""
    f = recording_levels(guarded_constant_scale)
    g = gt.grad(f)(np.array([0.3, 0.2, 0.1]), np.array(1.0))
    np.testing.assert_allclose(g, [0.3 + 1.0, 0.0, 0.0])  # x[0] * sg(x[0]) + x[int(0.2)]
    assert [(gd.kind, gd.answer) for gd in f.levels[0].tape.guards] == [("int", 0)]
    # staged around grad (what compile does), the comparison and int(n) are guarded too
    tape = gt.trace(gt.grad(guarded_constant_scale), np.array([0.3, 0.2, 0.1]), np.array(1.0))
    assert [gd.kind for gd in tape.guards] == ["bool", "int", "int"]


def test_item_of_a_differentiated_float_is_refused_naming_the_line():
    with pytest.raises(GradtapeError, match=r"\.item\(\) was called.*scale = x\[0\]\.item\(\)"):
        gt.grad(guarded)(np.array([0.3, 0.2, 0.1]), np.array(1.0))
    # integers have no gradient to cut: their .item() is a guard as before
    g = gt.grad(lambda x: x[0] * np.argmax(x).item())(np.array([1.0, 3.0]))
    assert g.tolist() == [1.0, 0.0]


def test_tolist_of_a_differentiated_float_keeps_the_gradient():
    def f(x):
        rows = x.tolist()  # nested lists of traced scalars under grad
        return sum(v * v for row in rows for v in row)

    x = np.array([[1.0, 2.0], [3.0, -1.0]])
    np.testing.assert_allclose(gt.grad(f)(x), 2 * x)
    np.testing.assert_allclose(gt.jacfwd(f)(x), 2 * x)
    assert f(x) == 15.0


def test_trace_prints_one_instruction_a_line_with_shapes_and_dtypes():
    tape = gt.trace(
        lambda x, y: np.sum(np.exp(x) * y, axis=0), np.ones((2, 3)), np.ones(3, np.float32)
    )
    lines = str(tape).splitlines()
    assert lines[0] == "{ lambda a:f64[2,3] b:f32[3] ."
    assert lines[1:] == [
        "    c:f64[2,3] = exp a",
        "    d:f64[2,3] = multiply c b",
        "    e:f64[3] = reduce_sum[axes=(0,), keepdims=False] d",
        "  in (e) }",
    ]


# --- bad input: a clear error that says what to write instead, and nothing left behind ------------
def _write_scalar_into_plain_array(x):
    y = np.zeros(3)
    y[0] = x[0]
    return np.sum(y)


def _write_slice_into_plain_array(x):
    y = np.zeros(3)
    y[1:] = x[:2]
    return np.sum(y)


ERROR_CASES = {
    "float": (lambda x: float(x[0]), np.ones(3), ["float()", "np.exp", "stop_gradient"]),
    "math_exp": (lambda x: math.exp(x[0]), np.ones(3), ["math.exp", "np.exp"]),
    "plain_array_method": (
        lambda x: np.sum(np.ones((2, 3)).dot(x)),
        np.ones(3),
        ["X @ w", "np.dot(X, w)", ".dot(x)"],
    ),
    "write_scalar": (_write_scalar_into_plain_array, np.ones(3), ["np.zeros_like(x)"]),
    "write_slice": (_write_slice_into_plain_array, np.ones(3), ["np.zeros_like(x)"]),
    "non_scalar_output": (lambda x: x * 2, np.ones(3), ["scalar", "shape (3,)", "np.sum"]),
    "int_argument": (lambda x: x * 2.0, 3, ["int", "3.0"]),
    "int_array_argument": (lambda x: np.sum(x * 2.0), np.arange(3), ["int64", "astype(float)"]),
    "bool_argument": (lambda x: x * 2.0, True, ["bool", "float"]),
    "str_argument": (lambda x: x, "abc", ["str", "float"]),
    "no_rule": (
        lambda x: np.sum(np.abs(np.roots(x))),
        np.arange(4.0),
        ["np.roots", "custom_vjp", "stop_gradient"],
    ),
    "no_rule_ufunc_method": (
        lambda x: np.sum(__import__("scipy.special").special.xlogy.outer(x, x)),
        np.ones(2),
        ["xlogy.outer", "custom_vjp"],
    ),
    "ufunc_out": (lambda x: np.sum(np.exp(x, out=np.empty(3))), np.ones(3), ["out="]),
}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_bad_input_gives_a_clear_error_and_leaves_nothing_behind(case):
    f, x, phrases = ERROR_CASES[case]
    with pytest.raises(GradtapeError) as info:
        gt.grad(f)(x)
    message = str(info.value)
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} not in: {message}"
    assert current_levels() == []
    # the next call works
    np.testing.assert_allclose(gt.grad(lambda x: np.sum(x**2))(np.ones(3)), 2.0)


def test_exception_inside_traced_function_propagates_and_cleans_up():
    def broken(x):
        np.sum(x**2)
        raise ValueError("user bug")

    for transform in (
        gt.grad,
        gt.value_and_grad,
        lambda f: lambda x: gt.vjp(f, x),
        lambda f: gt.grad(gt.grad(f)),
        lambda f: lambda x: gt.trace(f, x),
    ):
        with pytest.raises(ValueError, match="user bug"):
            transform(broken)(np.ones(2) if transform is not gt.grad else 1.0)
        assert current_levels() == []
    assert gt.grad(lambda x: x * x)(3.0) == 6.0


def test_a_leaked_tracer_is_reported():
    leaked = []

    def f(x):
        leaked.append(x * 2)
        return np.sum(x)

    gt.grad(f)(np.ones(2))
    with pytest.raises(GradtapeError, match="stop_gradient"):
        gt.grad(lambda y: np.sum(leaked[0] * y))(np.ones(2))


# --- threads --------------------------------------------------------------------------------------
def test_two_threads_tracing_at_once_each_get_their_own_answer():
    def model(x, a):
        s = 0.0
        for i in range(20):  # many small operations, so that the threads interleave
            s = s + np.sum(np.sin(a * x + i)) / 20
        if s > 0:  # a guard on the thread's own value
            s = s * 1.0
        return s

    def expected(x, a):
        return a * sum(np.cos(a * x + i) for i in range(20)) / 20

    barrier = threading.Barrier(2)

    def job(k):
        x = np.linspace(0.0, 1.0, 5) + k
        a = 1.0 + 0.1 * (k % 7)
        if k < 2:
            barrier.wait(timeout=10)
        g = gt.grad(model)(x, a)
        assert current_levels() == []
        return np.max(np.abs(g - expected(x, a)))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            errors = list(pool.map(job, range(60)))
    finally:
        sys.setswitchinterval(old)
    assert max(errors) < 1e-12


def test_an_error_inside_scipy_names_the_users_line_first():
    linalg = pytest.importorskip("scipy.linalg")
    band = np.array([[0.0, -1.0, -1.0], [4.0, 4.0, 4.0]])

    def f(y):
        x = linalg.solveh_banded(band, y)  # no rule: SciPy hands y to LAPACK
        return np.sum(x)

    with pytest.raises(GradtapeError) as caught:
        gt.grad(f)(np.array([0.0, 1.0, 0.5]))
    message = str(caught.value)
    user = message.index("test_core.py:")
    assert "x = linalg.solveh_banded(band, y)" in message
    assert user < message.index("; inside SciPy at ")
