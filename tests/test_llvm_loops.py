"""The llvmlite generator serving rolled loops' drivers and step kernels, matrix-vector loops
and kernels that hand arrays to later ones: the same numbers as Numba's kernels of the same
text, bit for bit, with Numba never imported; what it does not translate still goes to
Numba; the machine code of loaded driver modules is freed."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile import llvm

pytestmark = pytest.mark.skipif(not llvm.available(), reason="llvmlite is not installed")

# Programs run in a fresh process twice: with the llvmlite generator and with Numba alone
# (GRADTAPE_LLVM=0). Each prints the bytes of its value and gradient.
_PROGRAMS = """
import json, sys, warnings
import numpy as np
import gradtape as gt
from gradtape.bench.workloads import LOOP_WORKLOADS
from gradtape.compile.numba import backend

warnings.simplefilter("ignore")
rng = np.random.default_rng(11)


def time_stepping(x):  # carries, per-step slices, calls between kernels of one module
    w = LOOP_WORKLOADS["time_stepping_loops"]
    return w.body(x, 60, 1e-3)


X = rng.normal(size=(150, 5))


def stacked_rows(w):  # a per-iteration row of a stacked input, an array carry
    acc = np.zeros(5)
    for i in range(150):
        acc = acc * 0.9 + np.tanh(X[i] * w)
    return np.sum(acc * acc)


def windows(w):  # per-iteration windows x[i:i + 3] of an input
    x = w[0] * np.linspace(0.0, 1.0, 160)
    s = 0.0
    for i in range(150):
        s = s + np.sum(np.exp(x[i : i + 3]) * w[1:])
    return s


D = rng.normal(size=(1003, 8)) / 3.0
Y = (rng.random(1003) < 0.5).astype(np.float64)


def logistic(w):  # matrix-vector loops, a fused reduction
    z = D @ w
    return np.sum(np.logaddexp(0.0, z) - Y * z)


cases = {
    "time_stepping": (time_stepping, np.concatenate([rng.uniform(-0.5, 0.5, 8), [0.1, 0.5]])),
    "stacked_rows": (stacked_rows, rng.normal(size=5)),
    "windows": (windows, np.array([0.7, 0.2, -0.4, 0.9])),
    "logistic": (logistic, rng.normal(size=8)),
}
out = {}
for name, (f, x) in cases.items():
    value, grad = gt.compile(gt.value_and_grad(f), backend="numba")(x)
    eager = gt.value_and_grad(f)(x)
    assert np.allclose(value, eager[0], rtol=1e-12) and np.allclose(grad, eager[1], rtol=1e-9)
    out[name] = np.concatenate([[value], grad]).tobytes().hex()
out["generators"] = sorted({nk.generator for nk in backend._REGISTRY.values()})
out["modules"] = len(backend._REGISTRY)
out["numba imported"] = "numba" in sys.modules
# a scan (an RNN; np.zeros in its step kernel): some of its modules go to each generator
from gradtape.bench.workloads import WORKLOADS

rnn = WORKLOADS["rnn_scan"]
problem = rnn.make_problem(10, np.random.default_rng(0))
value, grad = gt.compile(
    gt.value_and_grad(lambda x: rnn.body(np, x, *problem.consts)), backend="numba"
)(problem.x)
out["rnn"] = np.concatenate([[value], np.ravel(grad)]).tobytes().hex()
print(json.dumps(out))
"""


def _run(code: str, cache_dir, **env_extra) -> dict:
    env = dict(os.environ, GRADTAPE_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("GRADTAPE_LLVM", None)
    env.update(env_extra)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.native
def test_loops_matvec_and_array_handing_kernels_equal_numbas_bit_for_bit(tmp_path):
    """Rolled loops (drivers, step kernels), matrix-vector loops and kernels returning
    arrays: every module goes to the llvmlite generator, Numba is never imported (until the
    RNN's scan, one of whose modules it still compiles), and the values and gradients equal
    those of Numba's kernels of the same text bit for bit."""
    got = _run(_PROGRAMS, tmp_path / "llvm")
    want = _run(_PROGRAMS, tmp_path / "numba", GRADTAPE_LLVM="0")
    assert got["generators"] == ["llvm"]
    assert got["numba imported"] is False
    assert want["generators"] == ["numba"]
    assert got["modules"] == want["modules"] >= 6  # (3 rolled loops: a driver each way)
    for name in ("time_stepping", "stacked_rows", "windows", "logistic", "rnn"):
        assert got[name] == want[name], name


def newton_sqrt(a):
    def cond(c):
        x, n = c
        return np.abs(x * x - a) > 1e-12 * a

    def body(c):
        x, n = c
        return 0.5 * (x + a / x), n + 1.0

    x, _ = gt.while_loop(cond, body, (a, 0.0))
    return x


@pytest.mark.native
def test_a_driver_outside_the_subset_is_compiled_by_numba():
    """A while loop's driver (`while True:`, growing buffers) is not translated: that
    module goes to Numba, the others to LLVM, and the numbers are right."""
    from gradtape.compile.numba import backend

    compiled = gt.compile(gt.value_and_grad(newton_sqrt), backend="numba")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a in (2.0, 9.0):
            value, grad = compiled(a)
            np.testing.assert_allclose(value, np.sqrt(a), rtol=1e-12)
            np.testing.assert_allclose(grad, 0.5 / np.sqrt(a), rtol=1e-8)
    loops = compiled.lowered(2.0).generated.loops.values()
    assert {loop.prim.name: loop.native for loop in loops} == {
        "while_loop": True,
        "scan_bwd": True,
    }
    assert any("While" in r for r in llvm.refusals)
    generators = {nk.generator for nk in backend._REGISTRY.values()}
    assert "numba" in generators


def _array_module():
    """A kernel returning an array it allocates, a view of an argument and a scalar (what
    a segment hands to the next), and a placeholder when its check fails."""
    from gradtape.compile.numba.generator import Kernel, KernelArg
    from gradtape.core.ir import Var

    f64 = np.dtype(np.float64)
    kernel = Kernel(
        "kernel0",
        [KernelArg("x0", f64, 2), KernelArg("c0", f64, None)],
        [("carry", Var(1, (4,), f64)), ("carry", Var(2, (3,), f64)), ("carry", Var(3, (), f64))],
    )
    text = textwrap.dedent("""
        def kernel0(x0, c0):
            d0 = x0.shape[0]
            if not (is_c(x0)):
                return (1, np.empty((0,), np.float64), np.empty((0,), np.float64), 0.0,)
            b0 = np.empty((d0, ), np.float64)
            a1 = np.ascontiguousarray(x0[1])
            total = 0.0
            for i in range(d0):
                b0[i] = x0[i, 0] * c0
                total = reduce_add(total, x0[i, 2])
            return (0, b0, a1, total,)
        """)
    return text, [kernel]


@pytest.mark.native
def test_a_kernel_returns_arrays_as_fresh_ndarrays_and_keeps_no_reference():
    from gradtape.compile.llvm import engine

    text, kernels = _array_module()
    ir_text, names = engine.translate(text, kernels)
    (kernel,) = engine.load(engine.compile_object(ir_text), names)
    x = np.arange(12.0).reshape(4, 3)
    before = sys.getrefcount(x)
    for _ in range(1000):
        status, scaled, row, total = kernel(x, 2.5)
    assert status == 0
    np.testing.assert_array_equal(scaled, x[:, 0] * 2.5)
    np.testing.assert_array_equal(row, x[1])
    assert total == np.sum(x[:, 2])
    assert scaled.flags.owndata and scaled.flags.c_contiguous and scaled.flags.writeable
    assert not np.shares_memory(row, x)  # (a copy: the argument is not held)
    assert sys.getrefcount(x) == before
    assert sys.getrefcount(scaled) == 2  # (only this name holds it)
    status, *placeholders = kernel(np.asfortranarray(x), 2.5)  # the layout check fails
    assert status == 1 and placeholders[0].shape == (0,)


def _resident_mb() -> float:
    import resource

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _driver_object():
    """The object code of a rolled loop's driver module (its step kernel inside) and the
    driver's entry point name."""
    from gradtape.compile.llvm import engine

    def f(w):
        acc = np.zeros(3)
        for i in range(200):
            acc = acc * 0.5 + np.sin(w * i)
        return np.sum(acc)

    w = np.array([0.1, 0.2, 0.3])
    compiled = gt.compile(gt.value_and_grad(f), backend="numba")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(w)
    loops = list(compiled.lowered(w).generated.loops.values())
    assert loops and all(loop.native for loop in loops)
    spec = loops[0].spec
    ir_text, names = engine.translate(spec.module, [spec.driver])
    return engine.compile_object(ir_text), names


@pytest.mark.native
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_resident_memory_stays_bounded_over_2000_loaded_loop_drivers():
    """A driver module loaded 2000 times (a second process's path), each into an engine of
    its own and dropped: the engines and their machine code are freed."""
    from gradtape.compile.llvm import engine

    obj, names = _driver_object()

    def load_and_drop() -> None:
        (driver,) = engine.load(obj, names)
        assert callable(driver)

    for _ in range(300):
        load_and_drop()
    gc.collect()
    base = _resident_mb()
    for _ in range(2000):
        load_and_drop()
    gc.collect()
    grown = _resident_mb() - base
    assert grown < 16, f"resident memory grew {grown:.1f} MB over 2000 loaded drivers"


_INDEX_REBOUND = """
def kernel0(x0, o0, o1):
    d0 = x0.shape[0]
    if not (is_c(x0) and is_c(o0) and is_c(o1)):
        return (1,)
    u0 = np.uint64(0)
    u1 = np.uint64(d0)
    for i in range(u0, u1):
        o0[i] = x0[i] * 2.0
    for i0 in range(d0):
        for i1 in range(d0):
            i = (i0) * d0 + i1
            o1[i] = x0[i0] * x0[i1] + 0.5
    return (0,)
"""


def _index_kernel():
    from gradtape.compile.numba.generator import Kernel, KernelArg

    f64 = np.dtype(np.float64)
    args = [KernelArg("x0", f64, 1), KernelArg("o0", f64, 1), KernelArg("o1", f64, 1)]
    return Kernel("kernel0", args, [])


@pytest.mark.native
def test_a_name_rebound_to_another_integer_type_is_a_new_variable_as_in_numba():
    """A loop's uint64 index `i` and a later int64 `i = i0 * d + i1` (a blocked product
    before a nested loop): each read sees one assignment, so each is its own variable, as
    Numba's SSA versions are; the kernel equals Numba's of the same text bit for bit."""
    numba = pytest.importorskip("numba")
    from gradtape.compile.llvm import engine
    from gradtape.compile.numba import runtime

    text = "import numpy as np\nfrom gradtape.compile.numba.runtime import is_c\n" + _INDEX_REBOUND
    ir_text, names = engine.translate(text, [_index_kernel()])
    (kernel,) = engine.load(engine.compile_object(ir_text), names)
    namespace = {"np": np, "is_c": runtime.is_c}
    exec(compile(textwrap.dedent(_INDEX_REBOUND), "<kernels>", "exec"), namespace)
    reference = numba.njit(error_model="numpy", nogil=True)(namespace["kernel0"])
    x = np.random.default_rng(2).normal(size=7)
    got = (np.full(7, np.nan), np.full(49, np.nan))
    want = (np.full(7, np.nan), np.full(49, np.nan))
    assert kernel(x, *got) == (0,)
    assert reference(x, *want) == (0,)
    for a, b in zip(got, want):
        assert a.tobytes() == b.tobytes()


def test_a_read_that_may_see_two_types_is_refused():
    """`i` read after a loop that may not run sees the loop's uint64 or the int64 before it:
    not a new variable; the module goes to Numba."""
    import ast

    from gradtape.compile.llvm import engine, translate

    body = """
def kernel0(x0, o0, o1):
    d0 = x0.shape[0]
    i = 0
    for i in range(np.uint64(0), np.uint64(d0)):
        o0[i] = x0[i]
    o1[0] = x0[i]
    return (0,)
"""
    fn = ast.parse(body).body[0]
    assert not translate.single_definition(fn.body, "i", {})
    assert translate.single_definition(ast.parse(_INDEX_REBOUND).body[0].body, "i", {})
    text = "import numpy as np\n" + body
    with pytest.raises(translate.NotServed):
        engine.translate(text, [_index_kernel()])
