"""scan, fori_loop and while_loop: gradients against the same loops in plain Python."""

from __future__ import annotations

import numpy as np
import pytest

import gradtape as gt
from gradtape import GradtapeError
from gradtape.compile.step import BackwardLoopArgs

RNG = np.random.default_rng(42)


def _same(a, b, rtol=1e-10):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-12)


# --- the seed's loop: sum(i * x_i) ------------------------------------------------------------
def weighted_sum_scan(xs):
    def body(s, ix):
        i, x = ix
        return s + i * x, s * x

    s, ys = gt.scan(body, 0.0, (np.arange(len(xs), dtype=float), xs))
    return s + 0.5 * np.sum(ys)


def weighted_sum_python(xs):
    s, tot = 0.0, 0.0
    for i, x in enumerate(xs):
        tot = tot + s * x
        s = s + i * x
    return s + 0.5 * tot


@pytest.mark.parametrize("n", [1, 5, 50, 500])
def test_seed_loop_matches_python_loop(n):
    xs = RNG.random(n)
    _same(weighted_sum_scan(xs), weighted_sum_python(xs))
    _same(gt.grad(weighted_sum_scan)(xs), gt.grad(weighted_sum_python)(xs))


def test_body_python_runs_a_constant_number_of_times():
    calls = []

    def body(s, x):
        calls.append(1)
        return s + x * x, None

    def f(xs):
        return gt.scan(body, 0.0, xs)[0]

    counts = []
    for n in (5, 50, 500):
        calls.clear()
        g = gt.grad(f)(np.linspace(0, 1, n))
        _same(g, 2 * np.linspace(0, 1, n))
        counts.append(len(calls))
    assert max(counts) <= 1, counts  # recorded once, then reused for every length
    assert counts[1:] == [0, 0], counts


# --- an RNN ---------------------------------------------------------------------------------
def rnn_scan(params, xs):
    W, U, b, h0 = params["W"], params["U"], params["b"], params["h0"]

    def step(h, x):
        h = np.tanh(W @ h + U @ x + b)
        return h, np.sum(h * h)

    h, ys = gt.scan(step, h0, xs)
    return np.sum(h) + np.sum(ys)


def rnn_python(params, xs):
    W, U, b, h = params["W"], params["U"], params["b"], params["h0"]
    total = 0.0
    for x in xs:
        h = np.tanh(W @ h + U @ x + b)
        total = total + np.sum(h * h)
    return np.sum(h) + total


def _rnn_params(hidden=6, inputs=3):
    return {
        "W": RNG.normal(size=(hidden, hidden)) * 0.4,
        "U": RNG.normal(size=(hidden, inputs)),
        "b": RNG.normal(size=hidden) * 0.1,
        "h0": RNG.normal(size=hidden) * 0.1,
    }


def test_rnn_gradients_reach_weights_init_and_inputs():
    params, xs = _rnn_params(), RNG.normal(size=(12, 3))
    g_scan = gt.grad(rnn_scan, argnums=(0, 1))(params, xs)
    g_py = gt.grad(rnn_python, argnums=(0, 1))(params, xs)
    for k in params:
        _same(g_scan[0][k], g_py[0][k])
    _same(g_scan[1], g_py[1])
    assert gt.check_grad(lambda W: rnn_scan({**params, "W": W}, xs), params["W"]).ok


def test_reverse_scan_matches_reversed_python_loop():
    def f(xs):
        c, ys = gt.scan(lambda c, x: (np.sin(c) * 0.5 + x, c * x), 1.0, xs, reverse=True)
        return c + np.sum(ys * np.arange(len(xs)))

    def f_py(xs):
        c, ys = 1.0, [None] * len(xs)
        for t in reversed(range(len(xs))):
            ys[t] = c * xs[t]
            c = np.sin(c) * 0.5 + xs[t]
        return c + np.sum(np.stack(ys) * np.arange(len(xs)))

    xs = RNG.random(9)
    _same(f(xs), f_py(xs))
    _same(gt.grad(f)(xs), gt.grad(f_py)(xs))


def test_pytree_carry_and_outputs():
    def f(a, xs):
        def body(c, x):
            new = {"pos": c["pos"] + c["vel"] * 0.1, "vel": c["vel"] - a * c["pos"] * 0.1 + x}
            return new, (new["pos"], [new["vel"] * 2])

        c, (ps, [vs]) = gt.scan(body, {"pos": np.array([1.0, 0.0]), "vel": np.zeros(2)}, xs)
        return np.sum(c["pos"] ** 2) + np.sum(ps) + np.sum(vs**2)

    xs = RNG.normal(size=(7, 2)) * 0.1
    assert gt.check_grad(f, 0.8, xs).ok
    assert gt.check_grad(lambda xs: f(0.8, xs), xs).ok


def test_checkpointed_scan_gives_the_same_gradient():
    def f(xs, checkpoint):
        c, ys = gt.scan(lambda c, x: (np.sin(c) + x, c * x), 0.3, xs, checkpoint=checkpoint)
        return c + np.sum(ys)

    xs = RNG.random(13)
    ref = gt.grad(lambda xs: f(xs, None))(xs)
    for k in (1, 2, 5, 13, 20):
        _same(gt.grad(lambda xs: f(xs, k))(xs), ref)


def guarded_body(c, x):
    """A body with a Python `if` on its input: two recorded paths."""
    if x > 0.5:
        return c + x**2, x
    return c * x, -x


def guarded_scan(xs):
    c, ys = gt.scan(guarded_body, 1.0, xs)
    return c + np.sum(ys)


def test_guarded_branch_inside_the_body():
    f = guarded_scan

    def f_py(xs):
        c, total = 1.0, 0.0
        for x in xs:
            c, y = guarded_body(c, x)
            total = total + y
        return c + total

    xs = np.array([0.1, 0.9, 0.2, 0.7, 0.6, 0.3])
    _same(f(xs), f_py(xs))
    _same(gt.grad(f)(xs), gt.grad(f_py)(xs))


def test_nested_scans():
    def f(M):
        def outer(c, row):
            inner, _ = gt.scan(lambda a, v: (a * 0.9 + np.sin(v), None), c, row)
            return inner, inner

        c, ys = gt.scan(outer, 0.0, M)
        return c + np.sum(ys**2)

    assert gt.check_grad(f, RNG.random((4, 5))).ok


def test_second_derivative_through_scan():
    xs = np.linspace(0, 1, 5)

    def f(a):
        return gt.scan(lambda c, x: (c * a + x, None), 1.0, xs)[0]

    a = 0.7
    # f(a) = a^5 + .25 a^3 + .5 a^2 + .75 a + 1
    _same(gt.grad(f)(a), 5 * a**4 + 0.75 * a**2 + a + 0.75)
    _same(gt.grad(gt.grad(f))(a), 20 * a**3 + 1.5 * a + 1)


def test_fori_loop_with_traced_index():
    def f(x):
        return gt.fori_loop(0, len(x), lambda i, c: c + x[i] * i * c, 1.0)

    def f_py(x):
        c = 1.0
        for i in range(len(x)):
            c = c + x[i] * i * c
        return c

    x = RNG.random(6)
    _same(f(x), f_py(x))
    _same(gt.grad(f)(x), gt.grad(f_py)(x))


# --- while_loop ---------------------------------------------------------------------------------
def newton_sqrt(a):
    def cond(c):
        x, _ = c
        return np.abs(x * x - a) > 1e-13 * a

    def body(c):
        x, it = c
        return x - (x * x - a) / (2 * x), it + 1

    return gt.while_loop(cond, body, (a, 0))[0]


@pytest.mark.parametrize("a", [0.5, 2.0, 100.0, 1e4])
def test_newton_while_loop_is_differentiable_in_reverse_mode(a):
    _same(newton_sqrt(a), np.sqrt(a))
    # d/da of the iterates converges to the derivative of sqrt
    _same(gt.grad(newton_sqrt)(a), 0.5 / np.sqrt(a), rtol=1e-8)


def test_adaptive_ode_integrator_with_data_dependent_steps():
    """dy/dt = -k y with step size halved while the local error estimate is too large."""

    def integrate(k, y0=1.0, t_end=1.0):
        def cond(c):
            return c[0] < t_end

        def body(c):
            t, y, h = c
            h = np.minimum(h, t_end - t)
            full = y + h * (-k * y)
            half = y + 0.5 * h * (-k * y)
            half = half + 0.5 * h * (-k * half)
            err = np.abs(full - half)
            h_next = np.where(err > 1e-4, h * 0.5, h * 1.5)
            return t + h, half, h_next

        return gt.while_loop(cond, body, (0.0, y0, 0.1))[1]

    def integrate_py(k, y0=1.0, t_end=1.0):
        t, y, h = 0.0, y0, 0.1
        while t < t_end:
            h = np.minimum(h, t_end - t)
            full = y + h * (-k * y)
            half = y + 0.5 * h * (-k * y)
            half = half + 0.5 * h * (-k * half)
            h_next = np.where(np.abs(full - half) > 1e-4, h * 0.5, h * 1.5)
            t, y, h = t + h, half, h_next
        return y

    for k in (0.5, 2.0, 5.0):
        _same(integrate(k), integrate_py(k))
        _same(gt.grad(integrate)(k), gt.grad(integrate_py)(k))
        assert abs(integrate(k) - np.exp(-k)) < 1e-2


# --- bad input -----------------------------------------------------------------------------------
def test_carry_changing_shape_is_a_clear_error():
    with pytest.raises(GradtapeError, match="carry leaf 0 changes from shape"):
        gt.scan(lambda c, x: (np.concatenate([c, c]), None), np.zeros(2), np.zeros(3))


def test_carry_changing_dtype_is_a_clear_error():
    with pytest.raises(GradtapeError, match="float32"):
        gt.scan(lambda c, x: (c + x, None), np.zeros(2, np.float32), np.zeros((3, 2)))


def test_mismatched_xs_lengths_name_the_leaf():
    with pytest.raises(GradtapeError, match="leaf 1: 4"):
        gt.scan(lambda c, x: (c, None), 0.0, (np.zeros(3), np.zeros(4)))


def test_carry_structure_change_is_a_clear_error():
    with pytest.raises(GradtapeError, match="structure"):
        gt.scan(lambda c, x: ((c, c), None), 0.0, np.zeros(3))


def test_error_inside_a_body_leaves_no_state_behind():
    def bad(c, x):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        gt.grad(lambda xs: gt.scan(bad, 0.0, xs)[0])(np.zeros(3))
    _same(gt.grad(weighted_sum_scan)(np.ones(4)), gt.grad(weighted_sum_python)(np.ones(4)))


# --- forward mode -----------------------------------------------------------------------------
def test_jvp_through_scan_matches_the_python_loop():
    params, xs = _rnn_params(), RNG.normal(size=(5, 3))
    v = RNG.normal(size=params["W"].shape)

    def f_scan(W):
        return rnn_scan({**params, "W": W}, xs)

    def f_py(W):
        return rnn_python({**params, "W": W}, xs)

    out, t = gt.jvp(f_scan, (params["W"],), (v,))
    out_py, t_py = gt.jvp(f_py, (params["W"],), (v,))
    _same(out, out_py)
    _same(t, t_py)


def sin_scan(a, xs):
    """A scan with two parameters in its body: c <- sin(c a0) + a1 x, summing c^2."""
    c, ys = gt.scan(lambda c, x: (np.sin(c * a[0]) + a[1] * x, c * c), 0.5, xs)
    return c + np.sum(ys)


def sin_python(a, xs):
    c, tot = 0.5, 0.0
    for x in xs:
        tot = tot + c * c
        c = np.sin(c * a[0]) + a[1] * x
    return c + tot


def test_hessian_through_scan():
    xs = np.linspace(0, 1, 4)
    a = np.array([0.8, 1.3])
    _same(
        gt.hessian(lambda a: sin_scan(a, xs))(a),
        gt.hessian(lambda a: sin_python(a, xs))(a),
        rtol=1e-9,
    )


def test_jvp_through_while_loop():
    t_out = gt.jvp(newton_sqrt, (2.0,), (1.0,))[1]
    _same(t_out, 0.5 / np.sqrt(2.0), rtol=1e-8)


def test_jvp_of_a_scan_is_a_loop_under_compile():
    params, xs = _rnn_params(), RNG.normal(size=(30, 3))
    v = RNG.normal(size=params["W"].shape)

    def f_scan(W):
        return rnn_scan({**params, "W": W}, xs)

    def f_py(W):
        return rnn_python({**params, "W": W}, xs)

    def tangent(W):
        return gt.jvp(f_scan, (W,), (v,))

    compiled = gt.compile(tangent, backend="numpy")
    out, t = compiled(params["W"])
    out_py, t_py = gt.jvp(f_py, (params["W"],), (v,))
    _same(out, out_py)
    _same(t, t_py)
    names = [ins.prim.name for ins in compiled.tape(params["W"]).instructions]
    assert names.count("scan") == 2 and len(names) < 40, names  # the primal and tangent loops
    # forward mode inside reverse mode: the tangent loop is differentiated as a loop
    g = gt.grad(lambda W: gt.jvp(f_scan, (W,), (v,))[1])(params["W"])
    g_py = gt.grad(lambda W: gt.jvp(f_py, (W,), (v,))[1])(params["W"])
    _same(g, g_py)


def test_second_derivatives_of_a_scan_are_loops_under_compile():
    xs = np.linspace(0, 1, 40)

    def f(a):
        return sin_scan(a, xs)

    def f_py(a):
        return sin_python(a, xs)

    a, v = np.array([0.8, 1.3]), np.array([0.3, -1.0])
    for transform, expected in (
        (gt.hessian(f), gt.hessian(f_py)(a)),
        (lambda a: gt.hvp(f, a, v), gt.hvp(f_py, a, v)),
    ):
        compiled = gt.compile(transform, backend="numpy")
        _same(compiled(a), expected, rtol=1e-9)
        # not one group per step (40 steps unrolled would be hundreds of instructions)
        assert len(compiled.tape(a).instructions) < 80


def test_compiled_derivatives_of_a_while_loop_follow_the_trip_count():
    """A compiled grad, jvp or hvp of a while_loop replays with other trip counts (the
    backward loop read its length from the recorded parameters, and the JVP unrolled the
    recorded iterations: silently wrong for other inputs)."""
    compiled = {
        "grad": (gt.compile(gt.grad(newton_sqrt), backend="numpy"), lambda a: 0.5 / np.sqrt(a)),
        "jvp": (
            gt.compile(lambda a: gt.jvp(newton_sqrt, (a,), (1.0,))[1], backend="numpy"),
            lambda a: 0.5 / np.sqrt(a),
        ),
        "hvp": (
            gt.compile(lambda a: gt.hvp(newton_sqrt, a, 1.0), backend="numpy"),
            lambda a: -0.25 * a**-1.5,
        ),
    }
    # reverse over reverse differentiates the backward loop through its recorded steps: the
    # replay checks the trip count (a shape check) and records another variant when it differs
    twice = gt.compile(gt.grad(gt.grad(newton_sqrt)), backend="numpy")
    for a in (2.0, 1e4, 1e-3, 2.0):
        for fn, expected in compiled.values():
            _same(fn(a), expected(a), rtol=1e-8)
        _same(twice(a), -0.25 * a**-1.5, rtol=1e-6)
    assert all(fn.stats["recordings"] == 1 for fn, _ in compiled.values())
    assert twice.stats["recordings"] == 3


# --- a reused body never sees stale Python state -------------------------------------------------
def test_a_closure_array_changed_in_place_is_seen_by_the_next_call():
    weights = np.array([1.0, 2.0, 3.0])

    def f(xs):
        c, _ = gt.scan(lambda c, x: (c + np.sum(weights * x), None), 0.0, xs)
        return c

    xs = np.ones((4, 3))
    _same(gt.grad(f)(xs), np.tile(weights, (4, 1)))
    weights *= 10.0  # in place: the same object, new contents
    _same(gt.grad(f)(xs), np.tile(weights, (4, 1)))
    _same(f(xs), 4 * np.sum(weights))


def test_a_dict_changed_in_place_is_seen_by_the_next_call():
    params = {"a": 0.5}

    def loss(xs):
        c, _ = gt.scan(lambda c, x: (c * params["a"] + x, None), 0.0, xs)
        return c

    xs = np.ones(3)
    for a in (0.5, 2.0, 3.0):
        params["a"] = a  # the same dict, another value
        _same(loss(xs), a * a + a + 1.0)
        _same(gt.grad(loss)(xs), np.array([a * a, a, 1.0]))


SCALE = np.array(2.0)


def test_a_global_array_rebound_is_seen_by_the_next_call():
    global SCALE

    def f(xs):
        return gt.scan(lambda c, x: (c + SCALE * x, None), 0.0, xs)[0]

    xs = np.ones(3)
    _same(f(xs), 6.0)
    SCALE = np.array(5.0)
    try:
        _same(f(xs), 15.0)
    finally:
        SCALE = np.array(2.0)


def test_a_captured_traced_value_of_another_shape_records_the_body_again():
    def f(x):
        return gt.fori_loop(0, 2, lambda i, c: np.cos(c) * x[i], np.ones(2))

    for n in (3, 2, 4):  # the body's code and closure are the same; x's shape is not
        x = RNG.random((n, 2))
        _same(
            gt.grad(lambda x: np.sum(f(x)))(x),
            gt.grad(lambda x: np.sum(np.cos(np.cos(np.ones(2)) * x[0]) * x[1]))(x),
        )


@pytest.mark.parametrize("stored_cotangents", [False, True])
def test_the_backward_loop_arguments_split_as_they_are_bound(stored_cotangents):
    parts = BackwardLoopArgs(
        ["gc0", "gc1"],
        ["gy0"],
        ["st0", "st1"],
        ["x0", "x1", "x2"],
        ["cp0"],
        ["gs0", "gs1"] if stored_cotangents else [],
    )
    params = parts.params("program", 7, True, None)
    assert params == dict(
        program="program",
        n_carry=2,
        n_x=3,
        n_y=1,
        length=7,
        reverse=True,
        checkpoint=None,
        stored_cotangents=stored_cotangents,
    )
    again = BackwardLoopArgs.split(
        parts.flat(), params["n_carry"], params["n_x"], params["n_y"], params["stored_cotangents"]
    )
    assert again == parts
    assert parts.outputs(["c0", "c1", "x0", "x1", "x2", "p0"]) == (
        ["c0", "c1"],
        ["x0", "x1", "x2"],
        ["p0"],
    )
