"""Accuracy, special values, types and vectorization of gradtape.compile.numba.fastmath.

Errors are in ulps of the exact result: references are computed by NumPy (and scipy.special)
in np.longdouble, x87 extended precision with 11 more significand bits than float64, on the
same inputs, so their own error is negligible at float64 and float32 resolution. The ulp of a
value is the spacing of floats in its binade (2**(e - p) for |v| in [2**e, 2**(e+1)), at least
the smallest subnormal). A result whose correctly rounded value is infinite, nan or a signed
zero must match it exactly. Run this file as a script to print the measured table (and
NumPy's own error on the same inputs) that fastmath's docstring quotes.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.native  # every kernel here is compiled by Numba
pytest.importorskip("numba")
special = pytest.importorskip("scipy.special")

from gradtape.compile.numba import fastmath as fm  # noqa: E402

if np.finfo(np.longdouble).nmant < 63:
    pytest.skip(
        "needs an extended-precision np.longdouble for the references", allow_module_level=True
    )

# The measured maximum (see fastmath's docstring) rounded up to the next 0.25 ulp (with room).
MAX_ULPS = {
    "exp": (1.0, 1.0),
    "expm1": (1.0, 1.0),
    "log": (1.0, 1.0),
    "log1p": (1.0, 1.0),
    "tanh": (0.75, 0.75),
    "expit": (1.0, 1.0),
    "softplus": (1.25, 1.25),
    "log_expit": (1.25, 1.25),
    "logaddexp": (1.25, 1.5),
}  # name: (float64, float32)

REFERENCES = {
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "tanh": np.tanh,
    "expit": special.expit,
    "log_expit": special.log_expit,
    "softplus": lambda x: np.logaddexp(np.zeros_like(x), x),
    "logaddexp": np.logaddexp,
}
DTYPES = (np.float64, np.float32)
SAMPLES = 40_000  # per region


# --- inputs -----------------------------------------------------------------------------------
def log_uniform(rng, lo: float, hi: float, n: int = SAMPLES, signed: bool = False):
    """Magnitudes log-uniform in [lo, hi] (positive; random signs when `signed`)."""
    v = np.exp2(rng.uniform(np.log2(lo), np.log2(hi), n))
    return v * rng.choice([-1.0, 1.0], n) if signed else v


def around(rng, point: float, width: float, n: int = SAMPLES // 4):
    """Uniform samples in [point - width, point + width]."""
    return point + rng.uniform(-width, width, n)


def special_values(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    one = dtype(1.0)
    v = [
        np.nan,
        np.inf,
        0.0,
        info.smallest_subnormal,
        info.smallest_normal,
        info.smallest_normal - info.smallest_subnormal,
        info.max,
        1.0,
        2.0,
        0.5,
        np.nextafter(one, dtype(2)),
        np.nextafter(one, dtype(0)),
        info.eps,
        info.epsneg,
    ]
    return np.array(v + [-x for x in v], dtype)


def unary_inputs(name: str, dtype) -> np.ndarray:
    """Whole finite range, the function's interesting regions, and special values."""
    rng = np.random.default_rng(sum(map(ord, name)) + np.dtype(dtype).itemsize)
    info = np.finfo(dtype)
    tiny, big = float(info.smallest_subnormal), float(info.max)
    log_max, log_min = np.log(big), np.log(tiny)  # exp's overflow and underflow thresholds
    log_normal = np.log(float(info.smallest_normal))  # exp's subnormal threshold
    parts = [log_uniform(rng, tiny, big, signed=True), special_values(dtype)]
    if name in ("exp", "expm1", "expit", "softplus", "log_expit"):
        parts += [
            rng.uniform(log_min - 5, log_max + 5, SAMPLES),
            log_uniform(rng, tiny, 2.0, signed=True),
            around(rng, log_max, 1e-3),
            around(rng, log_min, 1e-3),
            around(rng, log_normal, 1.0),
            around(rng, -log_max, 1e-3),
            rng.uniform(-1.2, 1.2, SAMPLES),
        ]
    if name in ("log", "log1p"):
        parts += [
            log_uniform(rng, tiny, big),
            1 + log_uniform(rng, info.epsneg, 0.5, signed=True),
            rng.uniform(0.0, 4.0, SAMPLES),
            log_uniform(rng, 2.0, 1e6),
            -log_uniform(rng, tiny, big, n=1000),
        ]
    if name == "log1p":
        parts += [
            log_uniform(rng, tiny, 1.0, signed=True),
            -1 + log_uniform(rng, info.epsneg, 1.0),
            rng.uniform(-1.0, 1.0, SAMPLES),
            np.array([-1.0, -1.5]),
        ]
    if name == "expm1":
        parts += [rng.uniform(-0.4, 0.4, SAMPLES), rng.uniform(-45.0, -30.0, 1000)]
    if name == "tanh":
        switch = fm.TANH_POLYNOMIAL_BELOW  # polynomial below, 1 - 2/(e**2x + 1) above
        parts += [
            log_uniform(rng, tiny, 1.0, signed=True),
            rng.uniform(-1.0, 1.0, SAMPLES),
            rng.uniform(-25.0, 25.0, SAMPLES),
            around(rng, switch, 1e-3),
            around(rng, -switch, 1e-3),
        ]
    with np.errstate(over="ignore"):
        return np.concatenate(parts).astype(dtype)


def binary_inputs(dtype) -> tuple[np.ndarray, np.ndarray]:
    """Pairs: both anywhere, close to each other at every scale, and all special pairs."""
    rng = np.random.default_rng(7 + np.dtype(dtype).itemsize)
    info = np.finfo(dtype)
    anywhere = log_uniform(rng, float(info.smallest_subnormal), float(info.max), signed=True)
    moderate = rng.uniform(-50.0, 50.0, SAMPLES)
    x = np.concatenate([anywhere, moderate, moderate, anywhere])
    y = np.concatenate(
        [
            log_uniform(rng, float(info.smallest_subnormal), float(info.max), signed=True),
            rng.uniform(-50.0, 50.0, SAMPLES),
            moderate + log_uniform(rng, 1e-8, 40.0, signed=True),
            anywhere * (1 + log_uniform(rng, 1e-8, 1.0, signed=True)),
        ]
    )
    sx, sy = np.meshgrid(special_values(dtype), special_values(dtype))
    with np.errstate(over="ignore"):
        x = np.concatenate([x, sx.ravel()]).astype(dtype)
        y = np.concatenate([y, sy.ravel()]).astype(dtype)
    return x, y


def inputs(name: str, dtype) -> tuple[np.ndarray, ...]:
    return binary_inputs(dtype) if name == "logaddexp" else (unary_inputs(name, dtype),)


# --- evaluation -------------------------------------------------------------------------------
@functools.cache
def loop(name: str):
    """out[i] = fast_name(x[i]); one compiled loop per function (specialized per dtype)."""
    return fm.elementwise_loop(fm.FAST_FUNCTIONS[name])


def fast(name: str, *args: np.ndarray) -> np.ndarray:
    out = np.empty_like(args[0])
    loop(name)(out, *args)
    return out


def reference(name: str, *args: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return REFERENCES[name](*(a.astype(np.longdouble) for a in args))


def ulp_errors(got: np.ndarray, exact: np.ndarray, magnitude=None) -> np.ndarray:
    """|got - exact| in ulps of exact at got's precision; inf where a special value differs.

    With `magnitude`, in ulps of max(|exact|, magnitude) instead.
    """
    info = np.finfo(got.dtype)
    with np.errstate(all="ignore"):
        rounded = exact.astype(got.dtype)
        scale = exact if magnitude is None else np.maximum(np.abs(exact), magnitude)
        _, exponent = np.frexp(scale)
        lowest = int(np.log2(float(info.smallest_subnormal)))
        ulp = np.ldexp(np.longdouble(1), np.maximum(exponent - 1 - info.nmant, lowest))
        err = np.abs(got.astype(np.longdouble) - exact) / ulp
    same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
    exact_zero = exact == 0
    same &= ~exact_zero | (np.signbit(got) == np.signbit(exact))  # signed zeros must match
    special_value = ~(np.isfinite(rounded) & np.isfinite(got)) | exact_zero
    err = np.where(special_value, np.where(same, 0.0, np.inf), err)
    return err.astype(np.float64)


def worst(name: str, dtype, function=fast) -> tuple[float, tuple]:
    """Largest ulp error over the inputs, and the arguments where it occurs.

    logaddexp(x, y) = max(x, y) + log1p(exp(-|x - y|)) cancels when max(x, y) < 0: its error
    is measured in ulps of max(|result|, |x|, |y|), the scale of its sensitivity to its inputs.
    """
    args = inputs(name, dtype)
    magnitude = None
    if name == "logaddexp":
        magnitude = np.maximum(np.abs(args[0]), np.abs(args[1])).astype(np.longdouble)
    err = ulp_errors(function(name, *args), reference(name, *args), magnitude)
    i = int(np.argmax(err))
    return float(err[i]), tuple(a[i] for a in args)


# --- tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(fm.FAST_FUNCTIONS))
def test_accuracy_in_ulps(name, dtype):
    error, at = worst(name, dtype)
    bound = MAX_ULPS[name][DTYPES.index(dtype)]
    assert error <= bound, f"{name}({', '.join(map(repr, at))}) is off by {error:.3g} ulp"


def test_special_values_exactly():
    """The documented special cases, in both formats, including signed zeros."""
    nan, inf = np.nan, np.inf
    cases = {  # name: [(argument, expected)]
        "exp": [
            (nan, nan),
            (inf, inf),
            (-inf, 0.0),
            (800.0, inf),
            (-800.0, 0.0),
            (0.0, 1.0),
            (-0.0, 1.0),
        ],
        "expm1": [
            (nan, nan),
            (inf, inf),
            (-inf, -1.0),
            (-0.0, -0.0),
            (0.0, 0.0),
            (800.0, inf),
            (-800.0, -1.0),
        ],
        "log": [
            (nan, nan),
            (inf, inf),
            (-inf, nan),
            (0.0, -inf),
            (-0.0, -inf),
            (-1.0, nan),
            (1.0, 0.0),
        ],
        "log1p": [
            (nan, nan),
            (inf, inf),
            (-inf, nan),
            (-1.0, -inf),
            (-2.0, nan),
            (-0.0, -0.0),
            (0.0, 0.0),
        ],
        "tanh": [
            (nan, nan),
            (inf, 1.0),
            (-inf, -1.0),
            (-0.0, -0.0),
            (0.0, 0.0),
            (1e30, 1.0),
            (-1e30, -1.0),
        ],
        "expit": [
            (nan, nan),
            (inf, 1.0),
            (-inf, 0.0),
            (0.0, 0.5),
            (-0.0, 0.5),
            (800.0, 1.0),
            (-800.0, 0.0),
        ],
        "softplus": [(nan, nan), (inf, inf), (-inf, 0.0), (1e30, 1e30), (-800.0, 0.0)],
        "log_expit": [(nan, nan), (inf, -0.0), (-inf, -inf), (-1e30, -1e30), (800.0, -0.0)],
    }
    for dtype in DTYPES:
        for name, pairs in cases.items():
            x, expected = (np.array(v, dtype) for v in zip(*pairs))
            got = fast(name, x)
            message = f"{name} {dtype.__name__}: {got} for {x}"
            np.testing.assert_array_equal(got, expected, err_msg=message)
            numbers = ~np.isnan(expected)
            assert np.array_equal(np.signbit(got[numbers]), np.signbit(expected[numbers])), message
        x = np.array([inf, -inf, inf, nan, 1.0, -inf, 0.0, 1e30], dtype)
        y = np.array([inf, -inf, -inf, 1.0, nan, 3.0, 0.0, -1e30], dtype)
        expected = np.array([inf, -inf, inf, nan, nan, 3.0, np.log(2.0), 1e30], dtype)
        np.testing.assert_array_equal(fast("logaddexp", x, y), expected)


def test_result_types_follow_numpy():
    """Integers and a float32 next to a float64 give float64, as in NumPy.

    (float32 arguments give float32: test_float32_kernels_do_no_float64_arithmetic.)
    """
    from numba import njit, types

    @njit
    def unary(x):
        return (
            fm.fast_exp(x),
            fm.fast_expm1(x),
            fm.fast_log(x),
            fm.fast_log1p(x),
            fm.fast_tanh(x),
            fm.fast_expit(x),
            fm.fast_softplus(x),
            fm.fast_log_expit(x),
            fm.fast_logaddexp(x, np.float32(1.0)),
        )

    values = unary(3)
    assert unary.nopython_signatures[0].args == (types.int64,)
    assert set(unary.nopython_signatures[0].return_type) == {types.float64}
    expected = [
        np.exp(3.0),
        np.expm1(3.0),
        np.log(3.0),
        np.log1p(3.0),
        np.tanh(3.0),
        special.expit(3.0),
        np.logaddexp(0.0, 3.0),
        special.log_expit(3.0),
        np.logaddexp(3.0, 1.0),
    ]
    np.testing.assert_allclose(values, expected, rtol=4e-16)
    assert fm.fast_exp(1.0) == pytest.approx(np.e, rel=1e-15)  # callable from Python too
    assert fm.fast_logaddexp(0.0, 0.0) == pytest.approx(np.log(2.0), rel=1e-15)


def test_float32_kernels_do_no_float64_arithmetic():
    """float64 operations in a float32 kernel would halve its vector width."""
    for name in sorted(fm.FAST_FUNCTIONS):
        ir_text = loop_ir(name, np.float32)
        assert "double" not in ir_text, f"{name}: float64 values in the float32 loop"
        if _has_avx2():
            assert VECTOR_ARITHMETIC["float"].search(ir_text), f"{name}: not vectorized"


def _has_avx2() -> bool:
    from llvmlite import binding

    return bool(binding.get_host_cpu_features().get("avx2", False))


VECTOR_ARITHMETIC = {
    t: re.compile(rf"= f(add|sub|mul|div)[a-z ]* <\d+ x {t}>") for t in ("double", "float")
}


def loop_ir(name: str, dtype) -> str:
    """The optimized LLVM IR of the elementwise loop of fast_name over `dtype` arrays."""
    from numba import from_dtype

    fast(name, *[np.linspace(-3.0, 3.0, 64, dtype=dtype)] * (2 if name == "logaddexp" else 1))
    compiled = loop(name)
    signature = next(s for s in compiled.signatures if s[0].dtype == from_dtype(dtype))
    return compiled.inspect_llvm(signature)


@pytest.mark.skipif(not _has_avx2(), reason="vector width checks assume AVX2 or better")
def test_reduction_over_fast_exp_vectorizes_and_keeps_its_rounding():
    """sum(fast_exp(x)) in a loop allowed to reassociate: vector code, no calls, accurate.

    The kernel keeps its own flags ("contract" only): were it inlined into the loop at the
    Numba-IR level, reassociation would fold away its range reduction.
    """
    from numba import njit

    @njit(fastmath={"reassoc", "contract", "nsz", "arcp"})
    def sum_exp(x):
        s = 0.0
        for i in range(x.size):
            s += fm.fast_exp(x[i])
        return s

    x = np.random.default_rng(0).uniform(-700.0, 700.0, 10_001)
    exact = float(np.sum(np.exp(x.astype(np.longdouble))))
    assert sum_exp(x) == pytest.approx(exact, rel=1e-13)
    ir_text = sum_exp.inspect_llvm(sum_exp.signatures[0])
    assert VECTOR_ARITHMETIC["double"].search(ir_text), "the reduction was not vectorized"
    assert "fadd reassoc" in ir_text and not re.search(r"call [^\n]*@(llvm\.)?exp", ir_text)
    assembly = sum_exp.inspect_asm(sum_exp.signatures[0])
    assert re.search(r"\b[yz]mm\d+", assembly), "no ymm/zmm registers in the assembly"


@pytest.mark.skipif(not _has_avx2(), reason="vector width checks assume AVX2 or better")
@pytest.mark.parametrize("name", sorted(fm.FAST_FUNCTIONS))
def test_every_function_vectorizes(name):
    """The kernel is inlined into the loop (no call left) and the loop runs on vectors."""
    ir_text = loop_ir(name, np.float64)
    assert VECTOR_ARITHMETIC["double"].search(ir_text), f"{name}: loop not vectorized"
    calls = re.findall(r"call [^\n]*@([\w.$]+)\(", ir_text)
    kernels = [c for c in calls if "fastmath" in c and "elementwise_loop" not in c]
    assert not kernels, f"{name}: the kernel was not inlined: {kernels}"


def test_registry_names_are_primitive_names():
    """The code generator looks functions up by primitive name (softplus is a pattern)."""
    from gradtape.core.routes import UFUNCS, lookup_ufunc

    lookup_ufunc(special.expit)  # registers scipy.special's ufuncs
    names = {prim.name for prim in UFUNCS.values()}
    assert set(fm.FAST_FUNCTIONS) - names == {"softplus"}


def test_import_gradtape_does_not_import_numba():
    code = "import sys, gradtape; sys.exit('numba' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


if __name__ == "__main__":

    def numpy_result(name: str, *args: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(REFERENCES[name](*args))

    print(f"{'function':12}{'float64':>10}{'float32':>10}{'numpy64':>10}{'numpy32':>10}")
    for name in sorted(fm.FAST_FUNCTIONS):
        ours = [worst(name, d)[0] for d in DTYPES]
        theirs = [worst(name, d, numpy_result)[0] for d in DTYPES]
        print(f"{name:12}" + "".join(f"{e:10.3g}" for e in ours + theirs))
