"""The llvmlite generator of native kernels (compile/llvm): the same numbers as Numba's
kernels of the same source, the fallback to Numba for what it does not translate, the disk
cache (a second process loads without Numba; a damaged file is detected and rebuilt), and
engines freed with their kernels."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.compile import llvm
from gradtape.compile.numba import cache, codegen
from gradtape.compile.numba.status import STATUS_CHECK

pytestmark = pytest.mark.skipif(not llvm.available(), reason="llvmlite is not installed")


def _program(f, *args):
    compiled = gt.compile(f, backend="numpy")
    _, variant = compiled._variant_for(args, {})
    return variant.program


def _llvm_kernels(generated):
    from gradtape.compile.llvm import engine

    ir_text, names = engine.translate(generated.module, generated.kernels)
    return engine.load(engine.compile_object(ir_text), names)


def _numba_kernels(generated):
    numba = pytest.importorskip("numba")
    from gradtape.compile.numba import fastmath  # noqa: F401  (registers the fast functions)

    namespace: dict = {}
    exec(compile(generated.module, "<kernels>", "exec"), namespace)
    return [
        numba.njit(error_model="numpy", nogil=True)(namespace[k.name]) for k in generated.kernels
    ]


def _call_kernels(kernels, generated, args):
    """Call the (single) kernel of a one-segment module the way the wrapper does; the
    status, the scalars it returns and the result arrays it wrote."""
    (kernel,) = generated.kernels
    outputs = {}
    call = []
    for a in kernel.args:
        kind, k = a.name[0], int(a.name[1:])
        if kind == "x":
            value = args[k]
            call.append(value[()] if a.ndim is None else value)
        elif kind == "c":
            call.append(generated.consts[k])
        elif kind == "o":
            var = generated.generator.program.outputs[k]
            outputs[k] = np.full(var.shape, np.nan, var.dtype)
            call.append(outputs[k])
        else:
            raise AssertionError(a.name)
    result = kernels[0](*call)
    return result, outputs


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


ELEMENTWISE = {
    "arithmetic": lambda x, y: x * y - x / (y + 2.0) + (-x),
    "exp_log": lambda x, y: np.exp(x) + np.log(y + 1.5) + np.log1p(x * x) + np.expm1(y),
    "trig_sqrt": lambda x, y: np.sin(x) * np.cos(y) + np.sqrt(y * y + 1.0) + np.tanh(x),
    "powers_abs": lambda x, y: x**2 + y**3 + np.abs(x - y) ** 4,
    "extrema": lambda x, y: np.maximum(x, y) * 2.0 + np.minimum(x, 0.5 * y),
    "where": lambda x, y: np.where(x > y, x * y, np.where(x <= 0.1, y, -x)),
}


@pytest.mark.native
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_elementwise_kernels_equal_numbas_bit_for_bit(name, dtype):
    """The elementwise results, value and gradient of one fused kernel: LLVM's kernel equals
    Numba's kernel of the same text bit for bit (NaN, infinities and zeros included)."""
    f = ELEMENTWISE[name]
    rng = np.random.default_rng(7)
    x = rng.normal(size=203).astype(dtype)
    y = rng.normal(size=203).astype(dtype)
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-310 if dtype == np.float64 else 1e-40]
    y[3:9] = [np.nan, 0.0, -np.inf, 2.0, np.inf, -0.0]

    def value_and_grad_parts(x, y):
        out = f(x, y)
        return out, gt.grad(lambda x, y: np.sum(f(x, y)), argnums=(0, 1))(x, y)

    program = _program(value_and_grad_parts, x, y)
    generated = codegen.generate(program)
    if len(generated.kernels) != 1:
        pytest.skip("more than one kernel")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, got_out = _call_kernels(_llvm_kernels(generated), generated, (x, y))
        want, want_out = _call_kernels(_numba_kernels(generated), generated, (x, y))
    assert got[0] == want[0] == 0
    for a, b in zip(got[1:], want[1:]):
        assert _same_bits(np.float64(a), np.float64(b)) or (np.isnan(a) and np.isnan(b))
    assert got_out.keys() == want_out.keys()
    for k in got_out:
        assert _same_bits(got_out[k], want_out[k]), (name, k)


@pytest.mark.native
@pytest.mark.parametrize("size", [1, 1000])
def test_a_reduction_of_a_size_one_value_equals_numbas_bit_for_bit(size):
    """A product by a closed-over array's first element, summed (the closure_const
    workload): its kernel sums a size-1 value into a 0-d array, `p[()] += np.full((1,),
    s)[j]`; LLVM's kernel equals Numba's bit for bit."""
    c = np.random.default_rng(3).normal(size=size)
    x = np.array([0.7])

    def value_and_grad(p):
        return gt.value_and_grad(lambda p: np.sum(c[0] * p))(p)

    program = _program(value_and_grad, x)
    generated = codegen.generate(program)
    assert "np.full((), " in generated.module
    got, got_out = _call_kernels(_llvm_kernels(generated), generated, (x,))
    want, want_out = _call_kernels(_numba_kernels(generated), generated, (x,))
    assert got[0] == want[0] == 0
    assert [np.float64(v).tobytes() for v in got[1:]] == [np.float64(v).tobytes() for v in want[1:]]
    assert got_out.keys() == want_out.keys()
    for k in got_out:
        assert _same_bits(got_out[k], want_out[k])
    assert got[1] == c[0] * 0.7


@pytest.mark.native
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    broadcast_axis=st.integers(0, 2),
    dtype=st.sampled_from([np.float64, np.float32]),
    seed=st.integers(0, 2**16),
)
def test_broadcast_kernels_equal_numbas_over_shapes(shape, broadcast_axis, dtype, seed):
    """A fused loop over an array and a broadcast operand (one axis of length 1), any shape:
    LLVM's kernel and Numba's of the same text agree bit for bit."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(dtype)
    w_shape = list(shape)
    w_shape[broadcast_axis % len(shape)] = 1
    w = rng.normal(size=w_shape).astype(dtype)

    def f(x, w):
        return np.tanh(x * w) + np.maximum(x, w) * np.exp(-x * x)

    generated = codegen.generate(_program(f, x, w))
    if len(generated.kernels) != 1:
        return
    from gradtape.compile.llvm.engine import NotServed

    try:
        kernels = _llvm_kernels(generated)
    except NotServed:  # (a layout the translator leaves to Numba: tested elsewhere)
        return
    got, got_out = _call_kernels(kernels, generated, (x, w))
    want, want_out = _call_kernels(_numba_kernels(generated), generated, (x, w))
    assert got == want
    for k in got_out:
        assert _same_bits(got_out[k], want_out[k])
        np.testing.assert_allclose(got_out[k], f(x, w), rtol=4e-7 if dtype == np.float32 else 2e-15)


@pytest.mark.native
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_value_and_grad_on_the_llvm_kernels(dtype):
    """backend="numba" builds these kernels with LLVM directly: the value equals the numpy
    backend's, the gradient its and finite differences', broadcast inputs included."""

    def f(x, w, b):
        z = np.tanh(x * w + b)  # (50, 4) * (4,) + (): broadcast
        return np.sum(np.exp(-0.5 * z * z) + np.maximum(z, 0.1) ** 2)

    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 4)).astype(dtype)
    w = rng.normal(size=4).astype(dtype)
    b = dtype(0.3)
    native = gt.compile(gt.value_and_grad(f, argnums=(0, 1)), backend="numba")
    reference = gt.compile(gt.value_and_grad(f, argnums=(0, 1)), backend="numpy")
    value, grads = native(x, w, b)
    assert native.lowered(x, w, b).native.generator == "llvm"
    ref_value, ref_grads = reference(x, w, b)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(value, ref_value, rtol=tol)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=tol * 10, atol=tol)
    if dtype == np.float64:
        eps = 1e-6
        e = np.zeros_like(w)
        e[2] = eps
        fd = (f(x, w + e, b) - f(x, w - e, b)) / (2 * eps)
        np.testing.assert_allclose(grads[1][2], fd, rtol=1e-6)


@pytest.mark.native
def test_what_it_does_not_translate_is_compiled_by_numba():
    """np.arctan is not in the translated subset: the module goes to Numba, and the numbers
    are right."""

    def f(x):
        return np.sum(np.arctan(x) * x)

    x = np.linspace(-1.0, 2.0, 31)
    cf = gt.compile(gt.value_and_grad(f), backend="numba")
    value, grad = cf(x)
    assert cf.lowered(x).native.generator == "numba"
    assert any("arctan" in r for r in llvm.refusals)
    np.testing.assert_allclose(value, f(x), rtol=1e-13)
    np.testing.assert_allclose(grad, np.arctan(x) + x / (1 + x * x), rtol=1e-13)


@pytest.mark.native
def test_llvm_turned_off_uses_numba(monkeypatch):
    monkeypatch.setenv("GRADTAPE_LLVM", "0")

    def f(x):
        return np.sum(np.sin(x) * 1.25)

    x = np.linspace(0.0, 1.0, 9)
    cf = gt.compile(gt.grad(f), backend="numba")
    np.testing.assert_allclose(cf(x), 1.25 * np.cos(x), rtol=1e-15)
    assert cf.lowered(x).native.generator == "numba"


@pytest.mark.native
def test_arguments_the_kernel_does_not_expect_are_answered_by_numpy():
    """An entry point called with another dtype, a non-array, the wrong number of arguments or
    a read-only result array returns STATUS_CHECK (the wrapper hands the call to NumPy)."""

    def f(x):
        return np.sin(x) * 2.0

    x = np.linspace(0.0, 1.0, 5)
    generated = codegen.generate(_program(f, x))
    (kernel,) = _llvm_kernels(generated)
    out = np.empty(5)
    names = [a.name for a in generated.kernels[0].args]
    assert names == ["x0", "o0"]
    assert kernel(x, out)[0] == 0
    np.testing.assert_array_equal(out, np.sin(x) * 2.0)
    readonly = np.empty(5)
    readonly.flags.writeable = False
    for bad in [
        (x.astype(np.float32), out),
        (list(x), out),
        (x, out, out),
        (x,),
        (x, readonly),
        (x.reshape(5, 1), out),
        (x.astype(">f8"), out),
    ]:
        assert kernel(*bad)[0] == STATUS_CHECK
    # (a strided array is the kernel's own check: STATUS_LAYOUT, copied by the wrapper)
    assert kernel(np.linspace(0.0, 1.0, 10)[::2], out)[0] == 1
    # and the whole compiled function stays right on such arguments
    cf = gt.compile(f, backend="numba")
    strided = np.linspace(0.0, 1.0, 10)[::2]
    np.testing.assert_array_equal(cf(strided), np.sin(strided) * 2.0)


def _unaligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` whose data starts one byte past an aligned address (as arrays Dask
    deserializes from its frames may)."""
    buffer = bytearray(a.nbytes + 1)
    out = np.frombuffer(buffer, dtype=a.dtype, offset=1, count=a.size).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


@pytest.mark.native
def test_unaligned_arrays_run_in_the_kernel_with_the_same_bits():
    """Loads and stores assume no alignment: an unaligned input or output is served by the
    kernel itself (not handed to NumPy), with the aligned call's bits."""

    def f(x, y):
        return np.exp(np.sin(x)) * y + x * x

    x, y = np.linspace(0.0, 1.0, 1003), np.linspace(2.0, 3.0, 1003)
    generated = codegen.generate(_program(f, x, y))
    (kernel,) = _llvm_kernels(generated)
    aligned_out, unaligned_out = np.empty(1003), _unaligned(np.empty(1003))
    assert kernel(x, y, aligned_out)[0] == 0
    assert kernel(_unaligned(x), _unaligned(y), unaligned_out)[0] == 0
    np.testing.assert_array_equal(unaligned_out, aligned_out)
    np.testing.assert_allclose(aligned_out, f(x, y), rtol=1e-14)  # (the fast exp: within an ulp)

    def loss(w, X):
        z = X @ w
        return np.sum(np.logaddexp(0.0, z) - 0.5 * z)

    rng = np.random.default_rng(0)
    X, w = rng.normal(size=(500, 6)), rng.normal(size=6)
    compiled = gt.compile(gt.value_and_grad(loss), backend="numba")
    value, grad = compiled(w, X)
    value_u, grad_u = compiled(_unaligned(w), _unaligned(X))
    assert value_u == value
    np.testing.assert_array_equal(grad_u, grad)


def _run(code: str, cache_dir) -> str:
    env = dict(os.environ, GRADTAPE_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("GRADTAPE_LLVM", None)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


_SECOND_PROCESS = """
import sys, warnings
import numpy as np
import gradtape as gt

def f(x):
    return np.sum(np.exp(np.sin(x)) * 0.75 + x * x)

x = np.linspace(0.0, 1.0, 40)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    value, grad = gt.compile(gt.value_and_grad(f), backend="numba")(x)
lowered = gt.compile(gt.value_and_grad(f), backend="numba").lowered(x)
ok = abs(value - f(x)) < 1e-12 * abs(value) and np.allclose(
    grad, np.exp(np.sin(x)) * np.cos(x) * 0.75 + 2 * x, rtol=1e-12)
print(lowered.native.generator, lowered.native.from_cache, "numba" in sys.modules, ok,
      any("checksum" in str(w.message) for w in caught))
"""


@pytest.mark.native
def test_a_second_process_loads_the_object_code_without_numba(tmp_path):
    assert _run(_SECOND_PROCESS, tmp_path) == "llvm False False True False"
    objects = list((tmp_path / "kernels" / "__pycache__").glob("k_*.llvm-*.o"))
    assert len(objects) == 1
    assert objects[0].stat().st_mode & 0o077 == 0
    assert _run(_SECOND_PROCESS, tmp_path) == "llvm True False True False"
    # the entry is one of the cache's: listed, and removed by clear()
    assert any(objects[0] in e.files for e in cache.entries(tmp_path / "kernels"))


@pytest.mark.native
@pytest.mark.parametrize("damage", ["flip", "truncate", "zero"])
def test_a_damaged_object_file_is_detected_and_rebuilt_never_run(tmp_path, damage):
    assert _run(_SECOND_PROCESS, tmp_path) == "llvm False False True False"
    (path,) = (tmp_path / "kernels" / "__pycache__").glob("k_*.llvm-*.o")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 3]
    else:
        data[40:] = bytes(len(data) - 40)
    path.write_bytes(bytes(data))
    # detected (a warning), compiled again (not from the cache), the right numbers
    assert _run(_SECOND_PROCESS, tmp_path) == "llvm False False True True"
    assert _run(_SECOND_PROCESS, tmp_path) == "llvm True False True False"


@pytest.mark.native
def test_an_engine_is_freed_with_its_kernels():
    """The entry points keep their engine alive; when the last goes, the engine is closed."""
    import weakref

    from gradtape.compile.llvm import engine

    def f(x):
        return np.cos(x) * 3.0 - x

    x = np.linspace(0.0, 1.0, 7)
    generated = codegen.generate(_program(f, x))
    kernels = _llvm_kernels(generated)
    holder = kernels[0].__self__
    assert isinstance(holder, engine._Holder)
    engine_ref = holder.engine
    ref = weakref.ref(holder)
    del holder, kernels
    gc.collect()
    assert ref() is None
    assert engine_ref.closed


def _resident_mb() -> float:
    import resource

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _synthetic_module(i: int):
    """A module of one kernel whose text is distinct per `i` (what codegen would write)."""
    from gradtape.compile.numba.generator import Kernel, KernelArg

    kernel = Kernel(
        "kernel0",
        [KernelArg("x0", np.dtype(np.float64), 1), KernelArg("o0", np.dtype(np.float64), 1)],
        [],
    )
    scale = 1.0 + i * 1e-6
    text = textwrap.dedent(f"""
        def kernel0(x0, o0):
            d0 = x0.shape[0]
            if not (is_c(x0) and is_c(o0)):
                return (1,)
            for i in range(d0):
                o0[i] = fast_exp(x0[i]) * {scale!r} + np.sin(x0[i])
            return (0,)
        """)
    return text, [kernel], scale


def _check_kernel(function, scale: float) -> None:
    x = np.linspace(0.0, 1.0, 64)
    out = np.empty_like(x)
    assert function(x, out) == (0,)
    np.testing.assert_allclose(out, np.exp(x) * scale + np.sin(x), rtol=1e-15)


@pytest.mark.native
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_resident_memory_stays_bounded_over_2000_loaded_programs():
    """2000 kernels loaded (a second process's path: object code from the cache), each into
    an engine of its own, called and dropped: the engines and their machine code are freed."""
    from gradtape.compile.llvm import engine

    objects = []
    for i in range(4):
        text, kernels, scale = _synthetic_module(i)
        ir_text, names = engine.translate(text, kernels)
        objects.append((engine.compile_object(ir_text), names, scale))

    def load_and_call(i: int) -> None:
        obj, names, scale = objects[i % len(objects)]
        (function,) = engine.load(obj, names)
        _check_kernel(function, scale)

    for i in range(400):
        load_and_call(i)
    gc.collect()
    base = _resident_mb()
    for i in range(400, 2000):
        load_and_call(i)
    gc.collect()
    grown = _resident_mb() - base
    assert grown < 16, f"resident memory grew {grown:.1f} MB over 1600 loaded programs"


@pytest.mark.native
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_compiling_a_distinct_program_keeps_far_less_than_numba():
    """Compiling a distinct program keeps nothing once its kernels are dropped: neither the
    machine code nor llvmlite's module pass manager (freed explicitly; llvmlite itself kept
    about 120 KB per program), against about 1.1 MB per program with Numba."""
    from gradtape.compile.llvm import engine

    def build_and_call(i: int) -> None:
        text, kernels, scale = _synthetic_module(i)
        ir_text, names = engine.translate(text, kernels)
        (function,) = engine.load(engine.compile_object(ir_text), names)
        _check_kernel(function, scale)

    for i in range(60):
        build_and_call(i)
    gc.collect()
    base = _resident_mb()
    for i in range(60, 260):
        build_and_call(i)
    gc.collect()
    per_program_kb = (_resident_mb() - base) * 1024 / 200
    assert per_program_kb < 48, f"{per_program_kb:.0f} KB per distinct program"
