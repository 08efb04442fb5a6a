"""scan and its backward loop as native Numba loops (compile/native_loops.py).

Every case is compiled with backend="numba" and compared with eager gradtape (whose loops run
in Python over NumPy) and, through test_scan's functions, with plain Python loops; the cases
also say whether each loop ran natively, so a silent fallback to Python fails the test.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_scan import _rnn_params, guarded_scan, newton_sqrt, rnn_python, rnn_scan

import gradtape as gt
from gradtape.compile.numba import backend as numba_backend
from gradtape.compile.numba import notices
from gradtape.compile.numba.backend import NativeFallbackWarning, lowered
from gradtape.core.pytree import tree_flatten

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not numba_backend.available(), reason="Numba is not installed"),
]
RNG = np.random.default_rng(7)


def close(a, b, rtol=1e-11):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)


def leaves(tree) -> list:
    return tree_flatten(tree)[0]


def native_states(compiled, *args) -> dict[str, bool]:
    """{primitive name: whether its loop ran natively} for the variant these args replay."""
    loops = lowered(compiled, *args).generated.loops.values()
    return {loop.prim.name: loop.native for loop in loops}


def compiled_agrees(f, *args, argnums=0, rtol=1e-11):
    """Compile value_and_grad(f) natively, check it against eager twice, return it."""
    vg = gt.value_and_grad(f, argnums=argnums)
    compiled = gt.compile(vg, backend="numba")
    expected = vg(*args)
    for _ in range(2):  # the first call builds the loops, the second runs them
        got = compiled(*args)
        close(got[0], expected[0], rtol)
        for g, e in zip(leaves(got[1]), leaves(expected[1])):
            close(g, e, rtol)
    return compiled


# --- cases -------------------------------------------------------------------------------------
def scalar_reverse(xs):
    c, ys = gt.scan(lambda c, x: (np.sin(c) * 0.5 + x, c * x), 1.0, xs, reverse=True)
    return c + np.sum(ys * np.arange(len(xs)))


def pytree_oscillator(a, xs):
    def body(c, x):
        new = {"pos": c["pos"] + c["vel"] * 0.1, "vel": c["vel"] - a * c["pos"] * 0.1 + x}
        return new, (new["pos"], [new["vel"] * 2])

    c, (ps, [vs]) = gt.scan(body, {"pos": np.array([1.0, 0.0]), "vel": np.zeros(2)}, xs)
    return np.sum(c["pos"] ** 2) + np.sum(ps) + np.sum(vs**2)


def no_xs(a):
    c, ys = gt.scan(lambda c, _: (c * a + 1.0, c), np.ones(3), None, length=6)
    return np.sum(c) + np.sum(ys**2)


def test_rnn_runs_both_loops_natively():
    params, xs = _rnn_params(), RNG.normal(size=(12, 3))
    compiled = compiled_agrees(rnn_scan, params, xs, argnums=(0, 1))
    assert native_states(compiled, params, xs) == {"scan": True, "scan_bwd": True}
    expected = gt.grad(rnn_python, argnums=(0, 1))(params, xs)
    got = compiled(params, xs)[1]
    for g, e in zip(leaves(got), leaves(expected)):
        close(g, e, 1e-10)


@pytest.mark.parametrize(
    "f, args, argnums",
    [
        (scalar_reverse, (RNG.random(9),), 0),
        (pytree_oscillator, (0.8, RNG.normal(size=(7, 2)) * 0.1), (0, 1)),
        (no_xs, (0.9,), 0),
    ],
    ids=["scalar-carry-reverse", "pytree-carry-captured-scalar", "xs-none"],
)
def test_loops_run_natively(f, args, argnums):
    compiled = compiled_agrees(f, *args, argnums=argnums)
    assert native_states(compiled, *args) == {"scan": True, "scan_bwd": True}


def test_float32_rnn():
    params = {k: v.astype(np.float32) for k, v in _rnn_params().items()}
    xs = RNG.normal(size=(10, 3)).astype(np.float32)
    compiled = compiled_agrees(rnn_scan, params, xs, rtol=2e-5)
    assert native_states(compiled, params, xs) == {"scan": True, "scan_bwd": True}


def test_a_new_length_reuses_the_compiled_drivers():
    params = _rnn_params()
    vg = gt.compile(gt.value_and_grad(rnn_scan), backend="numba")
    xs = RNG.normal(size=(8, 3))
    vg(params, xs), vg(params, xs)
    assert native_states(vg, params, xs) == {"scan": True, "scan_bwd": True}
    modules = len(numba_backend._REGISTRY)
    longer = RNG.normal(size=(21, 3))
    vg(params, longer), vg(params, longer)
    assert native_states(vg, params, longer) == {"scan": True, "scan_bwd": True}
    assert len(numba_backend._REGISTRY) == modules  # same texts: nothing compiled again
    close(vg(params, longer)[1]["W"], gt.grad(rnn_python)(params, longer)["W"], 1e-10)


def test_while_loop_runs_natively_both_ways():
    compiled = compiled_agrees(newton_sqrt, 2.0)
    assert native_states(compiled, 2.0) == {"while_loop": True, "scan_bwd": True}
    for a in (2.0, 0.5, 1e4):  # other trip counts, same compiled drivers
        close(compiled(a)[1], np.float64(0.5 / np.sqrt(a)), 1e-8)


def decaying_oscillator(k):
    """Array carries, a trip count found at run time (>16: the stored carries grow)."""

    def cond(c):
        return np.sum(c[1] ** 2) > 1e-6

    def body(c):
        t, y = c
        damping = np.eye(2) * (1.0 - 0.05 * k) + np.array([[0.0, 0.1], [-0.1, 0.0]])
        return t + 1.0, damping @ y

    t, y = gt.while_loop(cond, body, (0.0, np.array([1.0, 0.5])))
    return t + np.sum(y)


def test_while_loop_with_array_carries_and_many_trips():
    compiled = compiled_agrees(decaying_oscillator, 1.3)
    assert native_states(compiled, 1.3) == {"while_loop": True, "scan_bwd": True}
    assert compiled(1.3)[0] > 16  # the trip count
    compiled_agrees(decaying_oscillator, 0.7)


def test_a_step_leaving_the_recorded_path_runs_in_python_exactly():
    xs = np.array([0.1, 0.9, 0.2, 0.7, 0.6, 0.3])
    compiled_agrees(guarded_scan, xs)
    compiled_agrees(guarded_scan, xs[::-1].copy())


@pytest.mark.parametrize("checkpoint", [1, 3, 4, 10, 25])
@pytest.mark.parametrize("reverse", [False, True])
def test_checkpointed_scans_run_natively(checkpoint, reverse):
    def f(xs, W):
        def body(c, x):
            h, s = c
            h = np.tanh(W @ h + x)
            return (h, s * 0.9 + np.sum(h)), np.sum(h * h)

        (h, s), ys = gt.scan(
            body, (np.ones(3) * 0.1, 0.5), xs, checkpoint=checkpoint, reverse=reverse
        )
        return np.sum(h) + s + np.sum(ys * np.arange(len(xs)))

    xs, W = RNG.normal(size=(10, 3)), RNG.normal(size=(3, 3)) * 0.5
    compiled = compiled_agrees(f, xs, W, argnums=(0, 1))
    assert native_states(compiled, xs, W) == {"scan": True, "scan_bwd": True}
    expected = gt.value_and_grad(f, argnums=(0, 1))(xs, W)  # another length, same drivers
    close(expected[1][1], gt.grad(lambda W: f(xs, W))(W))


def test_hessian_through_a_native_scan():
    xs = np.linspace(0, 1, 4)

    def f(a):
        c, ys = gt.scan(lambda c, x: (np.sin(c * a[0]) + a[1] * x, c * c), 0.5, xs)
        return c + np.sum(ys)

    a = np.array([0.8, 1.3])
    compiled = gt.compile(gt.hessian(f), backend="numba")
    close(compiled(a), gt.hessian(f)(a), 1e-10)
    close(compiled(a), gt.hessian(f)(a), 1e-10)


def test_a_body_without_native_translation_warns_once_and_stays_exact():
    def f(xs):
        c, ys = gt.scan(lambda c, x: (np.sort(c * x)[::-1], np.max(c)), np.arange(3.0), xs)
        return np.sum(c) + np.sum(ys)

    xs = RNG.random(6) + 0.5
    notices._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compiled_agrees(f, xs)
    messages = [str(w.message) for w in caught if issubclass(w.category, NativeFallbackWarning)]
    assert any("sort" in m and "scan loop" in m for m in messages), messages
    assert native_states(compiled, xs) == {"scan": False, "scan_bwd": False}


# --- loop counters as indices (dyn_getitem, dyn_scatter_add) -------------------------------------
def counter_indexed(x, M):
    def body(i, c):
        return c + x[i] * i * c + np.sum(M[i, :] * M[:, -i - 1]) * x[-i - 1]

    return gt.fori_loop(0, len(x), body, 1.0)


def test_loop_counter_indices_run_natively():
    x, M = RNG.random(6), RNG.random((6, 6)) * 0.1
    compiled = compiled_agrees(counter_indexed, x, M, argnums=(0, 1))
    assert native_states(compiled, x, M) == {"scan": True, "scan_bwd": True}


def test_an_index_out_of_range_raises_like_numpy():
    def f(x):
        shift = (x[0] > 0.5).astype(np.int64) * 10  # a traced integer: 0 or 10

        return gt.fori_loop(0, len(x), lambda i, c: c + x[i + shift] * c, 1.0)

    inside, outside = np.full(5, 0.25), np.full(5, 0.75)
    compiled = gt.compile(gt.value_and_grad(f), backend="numba")
    for _ in range(2):
        close(compiled(inside)[1], gt.grad(f)(inside))
    assert native_states(compiled, inside) == {"scan": True, "scan_bwd": True}
    with pytest.raises(IndexError):
        gt.grad(f)(outside)
    with pytest.raises(IndexError):
        compiled(outside)
    close(compiled(inside)[1], gt.grad(f)(inside))


# --- eager loops -------------------------------------------------------------------------------
def test_eager_scans_go_native_after_a_few_calls():
    from gradtape.control import loops

    params, xs = _rnn_params(hidden=5), RNG.normal(size=(9, 3))
    g = gt.grad(rnn_scan)
    expected = gt.grad(rnn_python)(params, xs)
    for _ in range(loops.EAGER_NATIVE_AFTER + 1):
        got = g(params, xs)
    numba_backend.wait_for_kernels(120)
    for steps in (9, 14):  # a new length: the same drivers
        xs = RNG.normal(size=(steps, 3))
        got, expected = g(params, xs), gt.grad(rnn_python)(params, xs)
        for k in params:
            close(got[k], expected[k], 1e-10)
    programs = [entry[0] for entry in loops._PROGRAMS.values() if entry[0].native]
    states = {
        key[0]: loop.native
        for p in programs
        for key, loop in p.native.items()
        if p.variants[0][0].inputs[0].shape == (5,)
    }
    assert states == {"scan": True, "scan_bwd": True}, states


def test_hessian_vector_products_run_natively():
    params, xs = _rnn_params(hidden=4), RNG.normal(size=(11, 3))
    v = {k: RNG.normal(size=p.shape) for k, p in params.items()}

    def hvp(params, v):
        return gt.jvp(gt.grad(lambda p: rnn_scan(p, xs)), (params,), (v,))[1]

    compiled = gt.compile(hvp, backend="numba")
    expected = gt.jvp(gt.grad(lambda p: rnn_python(p, xs)), (params,), (v,))[1]
    for _ in range(2):
        got = compiled(params, v)
        for k in params:
            close(got[k], expected[k], 1e-9)
    states = [
        (loop.prim.name, loop.native)
        for loop in lowered(compiled, params, v).generated.loops.values()
    ]
    # the primal scan, the tangent scan, and one backward loop computing the gradient and its
    # tangent together (the plain backward loop's result is unused by an hvp: dropped)
    assert sorted(states) == [("scan", True), ("scan", True), ("scan_bwd", True)], states


def test_a_driver_that_cannot_be_built_leaves_the_loop_in_python(monkeypatch):
    from gradtape.compile.numba import drivers
    from gradtape.compile.numba import loops as native_loops

    def broken(*args, **kwargs):
        raise NotImplementedError("a check kind the generator does not know")

    from gradtape.control.loops import scan_p

    monkeypatch.setitem(drivers._DRIVERS, scan_p, (broken, native_loops.NativeLoop))
    xs = RNG.random(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NativeFallbackWarning)
        compiled = compiled_agrees(scalar_reverse, xs)
    states = native_states(compiled, xs)
    assert states["scan"] is False and states["scan_bwd"] is True
