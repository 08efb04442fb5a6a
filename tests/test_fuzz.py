"""Differential fuzzing: random NumPy programs, differentiated by gradtape eagerly, compiled on
the numpy backend and on the numba backend, against finite differences (float64) and JAX
(where installed).

A program is a list of steps over a stack of values shaped like its inputs (elementwise
functions of one or two values, broadcasting a 0-d input), ended by a reduction to a scalar
(a sum, a weighted sum, a mean, a matrix product, a cumulative sum, a strided slice). It is
interpreted with a NumPy-like module, so the same program runs on NumPy arrays (the eager
reference), on gradtape's traced values and on jax.numpy.

Inputs cover float64 and float32, 0-d arrays and Python floats, empty arrays, Fortran-order and
non-contiguous (strided) arrays, and NaN and inf entries (those are compared between gradtape's
modes, NaN in the same places, not against finite differences).

The suite runs a fixed seed: `test_fuzz_numpy_backend` in the fast tier,
`test_fuzz_numba_backend` in the native tier. `pytest -m fuzz --all` runs the `fuzz` tests for
longer on a random seed (GRADTAPE_FUZZ_SEED and GRADTAPE_FUZZ_PROGRAMS override both); a
failure prints the seed and the program, which `program_source` shows as Python.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import pytest

import gradtape as gt
from gradtape.compile.dispatch import BACKENDS
from gradtape.compile.numba import backend as numba_backend

# --- programs -------------------------------------------------------------------------------------
# smooth everywhere on the reals (finite differences agree with the derivative at random points)
UNARY = {
    "sin": lambda xp, a: xp.sin(a),
    "cos": lambda xp, a: xp.cos(a),
    "tanh": lambda xp, a: xp.tanh(a),
    "exp_tamed": lambda xp, a: xp.exp(xp.sin(a)),
    "log1p_sq": lambda xp, a: xp.log1p(a * a),
    "sqrt_1p_sq": lambda xp, a: xp.sqrt(1.0 + a * a),
    "square": lambda xp, a: a**2,
    "cube": lambda xp, a: a * a * a,
    "neg_half": lambda xp, a: -0.5 * a,
    "arctan": lambda xp, a: xp.arctan(a),
    "logistic": lambda xp, a: 1.0 / (1.0 + xp.exp(-a)),
    "softplus": lambda xp, a: xp.logaddexp(a, 0.0),
    "hypot_1": lambda xp, a: xp.hypot(a, 1.0),
}
BINARY = {
    "add": lambda xp, a, b: a + b,
    "sub": lambda xp, a, b: a - b,
    "mul": lambda xp, a, b: a * b,
    "div_tamed": lambda xp, a, b: a / (1.0 + b * b),
    "pow_tamed": lambda xp, a, b: (1.0 + a * a) ** xp.sin(b),
    "arctan2_shift": lambda xp, a, b: xp.arctan2(a, 2.0 + b * b),
    "hypot": lambda xp, a, b: xp.hypot(a, 1.0 + b * b),
}
# (value, xp) -> scalar; every one is defined on empty arrays and 0-d values
REDUCTIONS = {
    "sum": lambda xp, v: xp.sum(v),
    "weighted_sum": lambda xp, v: xp.sum(v * xp.cos(xp.arange(v.size).reshape(v.shape) * 0.7)),
    "sum_of_squares": lambda xp, v: xp.sum(v * v) * 0.5,
    "strided_slice": lambda xp, v: xp.sum(v.reshape(-1)[::2]) - xp.sum(v.reshape(-1)[1::3]),
    "cumsum": lambda xp, v: xp.sum(xp.cumsum(v.reshape(-1)) * 0.1),
}
MATRIX_REDUCTIONS = {  # for 2-D values
    "gram": lambda xp, v: xp.sum(v @ v.T) * 0.01,
    "axis0_dot": lambda xp, v: xp.sum(xp.sum(v, axis=0) * xp.sum(v, axis=0)),
    "transpose_mean": lambda xp, v: xp.sum(xp.mean(v.T, axis=1)) if v.shape[1] else xp.sum(v),
}


@dataclass
class Program:
    steps: list  # ("unary", name, i) or ("binary", name, i, j): pushes a new value
    reduction: str
    n_inputs: int

    def run(self, xp, *inputs):
        values = list(inputs)
        for step in self.steps:
            if step[0] == "unary":
                values.append(UNARY[step[1]](xp, values[step[2]]))
            else:
                values.append(BINARY[step[1]](xp, values[step[2]], values[step[3]]))
        # the input's shape when the last value is 0-d; an array when all are Python floats
        last = xp.asarray(values[-1] + 0.0 * values[0])
        reductions = {**REDUCTIONS, **MATRIX_REDUCTIONS}
        return reductions[self.reduction](xp, last)


def program_source(p: Program) -> str:
    lines = [f"def f({', '.join(f'x{i}' for i in range(p.n_inputs))}):"]
    names = [f"x{i}" for i in range(p.n_inputs)]
    for step in p.steps:
        new = f"v{len(names)}"
        args = ", ".join(names[i] for i in step[2:])
        lines.append(f"    {new} = {step[1]}({args})")
        names.append(new)
    lines.append(f"    return {p.reduction}({names[-1]})")
    return "\n".join(lines)


@dataclass
class Case:
    program: Program
    inputs: list
    layout: str
    finite: bool
    dtype: np.dtype
    notes: list = field(default_factory=list)

    def describe(self, seed: int) -> str:
        shapes = [np.shape(x) for x in self.inputs]
        return (
            f"seed {seed}, layout {self.layout}, dtype {self.dtype}, shapes {shapes}\n"
            f"{program_source(self.program)}\ninputs: {self.inputs!r}"
        )


LAYOUTS = ("C", "fortran", "strided", "0-d", "pyfloat", "empty", "broadcast 0-d")


def random_case(rng: np.random.Generator) -> Case:
    layout = LAYOUTS[rng.integers(len(LAYOUTS))]
    dtype = np.dtype(np.float32 if rng.random() < 0.25 else np.float64)
    n_inputs = 1 + int(rng.integers(2))
    two_d = layout in ("fortran",) or (layout in ("C", "strided", "empty") and rng.random() < 0.5)
    if layout == "empty":
        shape = (0, 3) if two_d else (0,)
    elif layout in ("0-d", "pyfloat"):
        shape = ()
    else:
        shape = (
            (int(rng.integers(2, 5)), int(rng.integers(1, 5)))
            if two_d
            else (int(rng.integers(1, 8)),)
        )
    finite = rng.random() >= 0.15

    def make(k: int):
        if layout == "broadcast 0-d" and k == 1:
            return np.asarray(rng.normal(), dtype=dtype)
        if layout == "strided":  # every other element of a larger array: a strided view
            big = rng.normal(size=tuple(2 * s for s in shape)).astype(dtype)
            x = big[tuple(slice(None, None, 2) for _ in shape)]
        else:
            x = rng.normal(size=shape).astype(dtype)
            if layout == "fortran":
                x = np.asfortranarray(x)
        if not finite and x.size:
            index = tuple(int(rng.integers(s)) for s in x.shape)
            x[index] = [np.nan, np.inf, -np.inf][int(rng.integers(3))]
        return float(x) if layout == "pyfloat" else x

    inputs = [make(k) for k in range(n_inputs)]
    steps = []
    for _ in range(int(rng.integers(1, 7))):
        count = n_inputs + len(steps)
        if rng.random() < 0.55:
            name = list(UNARY)[rng.integers(len(UNARY))]
            steps.append(("unary", name, int(rng.integers(count))))
        else:
            name = list(BINARY)[rng.integers(len(BINARY))]
            steps.append(("binary", name, int(rng.integers(count)), int(rng.integers(count))))
    reductions = list(REDUCTIONS) + (list(MATRIX_REDUCTIONS) if len(shape) == 2 else [])
    reduction = reductions[rng.integers(len(reductions))]
    return Case(Program(steps, reduction, n_inputs), inputs, layout, finite, dtype)


# --- references -----------------------------------------------------------------------------------
def finite_difference_grads(p: Program, inputs: list) -> list:
    """Central differences in float64, per input."""
    base = [np.array(x, dtype=np.float64) for x in inputs]
    grads = []
    for k, x in enumerate(base):
        g = np.zeros(x.shape)
        for i in range(x.size):
            h = 1e-6 * max(1.0, abs(x.reshape(-1)[i]))
            hi = [b.copy() for b in base]
            lo = [b.copy() for b in base]
            hi[k].reshape(-1)[i] += h
            lo[k].reshape(-1)[i] -= h
            g.reshape(-1)[i] = (p.run(np, *hi) - p.run(np, *lo)) / (2 * h)
        grads.append(g)
    return grads


def tolerance(dtype: np.dtype) -> dict:
    return {"rtol": 2e-3, "atol": 2e-3} if dtype == np.float32 else {"rtol": 1e-9, "atol": 1e-10}


def assert_same(got, expected, what: str, case: Case, seed: int, **tol) -> None:
    got_a = np.asarray(got, dtype=np.float64)
    exp_a = np.asarray(expected, dtype=np.float64)
    try:
        assert got_a.shape == exp_a.shape, f"shape {got_a.shape} != {exp_a.shape}"
        np.testing.assert_allclose(got_a, exp_a, equal_nan=True, **tol)
    except AssertionError as exc:
        raise AssertionError(f"{what} disagrees\n{case.describe(seed)}\n{exc}") from None


def check_case(case: Case, seed: int, backends: tuple, jax_module=None) -> None:
    p = case.program
    argnums = tuple(range(p.n_inputs))
    tol = tolerance(case.dtype)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        expected_value = p.run(np, *case.inputs)
        f = _named(p)
        value, grads = gt.value_and_grad(f, argnums=argnums)(*case.inputs)
        assert_same(value, expected_value, "eager value vs NumPy", case, seed, **tol)
        if case.finite and case.dtype == np.float64 and all(np.size(x) for x in case.inputs):
            fd = finite_difference_grads(p, case.inputs)
            for k, (g, r) in enumerate(zip(grads, fd)):
                assert_same(
                    g,
                    r,
                    f"gradient {k} vs finite differences",
                    case,
                    seed,
                    rtol=1e-5,
                    atol=1e-6 * (1 + np.abs(r).max(initial=0)),
                )
        for backend in backends:
            compiled = gt.compile(gt.value_and_grad(f, argnums=argnums), backend=backend)
            for call in range(2):  # the recording call and a replay
                cvalue, cgrads = compiled(*case.inputs)
                assert_same(cvalue, value, f"{backend} value (call {call})", case, seed, **tol)
                for k, (cg, g) in enumerate(zip(cgrads, grads)):
                    assert_same(cg, g, f"{backend} gradient {k} (call {call})", case, seed, **tol)
                    assert np.shape(cg) == np.shape(case.inputs[k])
        if jax_module is not None and case.dtype == np.float64 and case.finite:
            jax, jnp = jax_module
            jax_value_and_grad = jax.value_and_grad(lambda *a: p.run(jnp, *a), argnums=argnums)
            jax_inputs = [jnp.asarray(x) for x in case.inputs]
            jvalue, jgrads = jax.jit(jax_value_and_grad)(*jax_inputs)
            try:
                assert_same(value, jvalue, "value vs JAX", case, seed, rtol=1e-9, atol=1e-10)
                for k, (g, jg) in enumerate(zip(grads, jgrads)):
                    assert_same(g, jg, f"gradient {k} vs JAX", case, seed, rtol=1e-9, atol=1e-10)
            except AssertionError:
                # XLA's compiled code is not always JAX's own answer (found by this fuzzer:
                # a jitted gradient differing from the same gradient op by op): the op by
                # op one decides
                jvalue, jgrads = jax_value_and_grad(*jax_inputs)
                assert_same(value, jvalue, "value vs JAX", case, seed, rtol=1e-9, atol=1e-10)
                for k, (g, jg) in enumerate(zip(grads, jgrads)):
                    assert_same(g, jg, f"gradient {k} vs JAX", case, seed, rtol=1e-9, atol=1e-10)


def _named(p: Program):
    def fuzzed_program(*inputs):
        return p.run(np, *inputs)

    return fuzzed_program


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    return jax, jnp


def run_fuzz(seed: int, programs: int, backends: tuple, jax_every: int = 0) -> int:
    """Check `programs` random programs of `seed` on `backends`; every `jax_every`-th one
    against JAX too (0: never; a JAX compile costs more than the rest of a case)."""
    jax_module = _jax() if jax_every else None
    x64 = None
    if jax_module is not None:
        x64 = jax_module[0].config.jax_enable_x64
        jax_module[0].config.update("jax_enable_x64", True)
    try:
        rng = np.random.default_rng(seed)
        for k in range(programs):
            use_jax = jax_module if jax_every and k % jax_every == 0 else None
            check_case(random_case(rng), seed, backends, use_jax)
    finally:
        if jax_module is not None:
            jax_module[0].config.update("jax_enable_x64", x64)
    return programs


def _setting(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    return int(text) if text.strip() else default


# --- the tests ------------------------------------------------------------------------------------
def test_fuzz_numpy_backend():
    seed = _setting("GRADTAPE_FUZZ_SEED", 20260)
    run_fuzz(seed, _setting("GRADTAPE_FUZZ_PROGRAMS", 60), ("numpy",), jax_every=4)


@pytest.mark.native
def test_fuzz_numba_backend():
    if not numba_backend.available():
        pytest.skip("Numba is not installed")
    seed = _setting("GRADTAPE_FUZZ_SEED", 31337)
    run_fuzz(seed, _setting("GRADTAPE_FUZZ_PROGRAMS", 20), ("numba",))


@pytest.mark.fuzz
@pytest.mark.parametrize("round_", range(4))
def test_fuzz_longer_on_a_random_seed(round_):
    seed = _setting("GRADTAPE_FUZZ_SEED", int(time.time() * 1000) % 2**31 + round_)
    backends = ("numpy", "numba") if "numba" in BACKENDS else ("numpy",)
    print(f"fuzz seed {seed}")
    run_fuzz(seed, _setting("GRADTAPE_FUZZ_PROGRAMS", 150), backends, jax_every=1)


def test_the_generator_covers_every_kind_of_input():
    rng = np.random.default_rng(0)
    cases = [random_case(rng) for _ in range(400)]
    assert {c.layout for c in cases} == set(LAYOUTS)
    assert {c.dtype for c in cases} == {np.dtype(np.float32), np.dtype(np.float64)}
    assert any(not c.finite and c.layout not in ("empty",) for c in cases)
    strided = [x for c in cases if c.layout == "strided" for x in c.inputs if np.ndim(x)]
    assert strided and not any(x.flags.c_contiguous for x in strided if x.size > 1)
    fortran = [x for c in cases if c.layout == "fortran" for x in c.inputs if np.ndim(x) == 2]
    assert fortran and all(x.flags.f_contiguous for x in fortran)
    assert any(isinstance(x, float) for c in cases for x in c.inputs)
    assert any(np.size(x) == 0 for c in cases for x in c.inputs)
