"""Shared test machinery: the test tiers, the hypothesis profile, numerical references and
the domain table.

Every gradient test compares gradtape against references that do not use gradtape:
central finite differences (always) and the complex step (where the function accepts
complex input and is analytic there), both computed in float64.

Tiers: tests that compile Numba kernels are marked `native`, tests that start a Dask cluster
`cluster`, tests that compare against JAX (their names say `jax`) `oracle`. Plain `pytest` is
the fast tier: it deselects the three and turns Numba off for the whole
process (GRADTAPE_NUMBA=0, so backend="auto" and eager loops never start a background
compile). `pytest --all` runs both tiers; an explicit `-m` expression selects by itself (Numba
stays on unless it excludes `native`). gradtape is imported only after this is decided
(pytest_configure), so this module must not import it at the top.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# --- tiers and the kernel cache ---------------------------------------------------------------
_OWN_CACHE_DIR: list[str] = []  # the temporary cache directory this process made, if any


def pytest_addoption(parser):
    parser.addoption(
        "--all",
        action="store_true",
        dest="all_tiers",
        help="run both test tiers: the fast one and the `native` tests, which "
        "compile Numba kernels (plain `pytest` deselects those)",
    )


def _native_selected(config) -> bool:
    """Whether this run may select `native` tests (else it is the fast tier: Numba off)."""
    if config.getoption("all_tiers"):
        return True
    markexpr = config.getoption("markexpr")
    if not markexpr:
        return False
    try:
        from _pytest.mark.expression import Expression

        return bool(Expression.compile(markexpr).evaluate(lambda name, **kwargs: name == "native"))
    except Exception:  # another pytest's private API: assume native tests may run
        return True


def pytest_configure(config):
    # No test writes the user's cache: a session-wide temporary kernel cache, unless the
    # environment names one (CI keeping its cache between runs). xdist workers inherit it.
    if not os.environ.get("GRADTAPE_CACHE_DIR"):
        path = tempfile.mkdtemp(prefix="gradtape-test-cache-")
        _OWN_CACHE_DIR.append(path)
        os.environ["GRADTAPE_CACHE_DIR"] = path
    if not _native_selected(config):
        os.environ["GRADTAPE_NUMBA"] = "0"  # read when gradtape is imported: no Numba at all
    # tests compiled with backend="numba" expect native code: on a loaded machine, another
    # test's background compile in the same process may hold Numba past the default 60 s
    os.environ.setdefault("GRADTAPE_NATIVE_WAIT", "900")


#: markers of the tests plain `pytest` deselects: Numba compiles, real Dask clusters, and
#: comparisons against JAX (its import and jit compiles cost more than the rest of a test)
SLOW_TIER = ("native", "cluster", "oracle")


def pytest_collection_modifyitems(config, items):
    for item in items:  # a test that names JAX compares against it: the oracle tier
        if "jax" in item.nodeid.lower() and item.get_closest_marker("oracle") is None:
            item.add_marker(pytest.mark.oracle)
    if "fuzz" not in (config.getoption("markexpr") or ""):  # long fuzzing: only when named
        fuzz = [item for item in items if item.get_closest_marker("fuzz") is not None]
        if fuzz:
            config.hook.pytest_deselected(items=fuzz)
            items[:] = [item for item in items if item.get_closest_marker("fuzz") is None]
    if config.getoption("all_tiers") or config.getoption("markexpr"):
        return
    slow = [item for item in items if any(item.get_closest_marker(m) for m in SLOW_TIER)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]


def pytest_report_header(config):
    if _native_selected(config):
        return "gradtape tests: native tier included (Numba on)"
    return (
        "gradtape tests: fast tier, `native`, `cluster` and `oracle` (JAX) tests deselected, "
        "Numba off; --all runs every tier"
    )


def pytest_unconfigure(config):
    if _OWN_CACHE_DIR:
        # background compiles may still be writing into it (found by attribute, not by module
        # name: the numba backend's module may move)
        for name, module in list(sys.modules.items()):
            if name.startswith("gradtape.") and callable(getattr(module, "wait_for_kernels", 0)):
                module.wait_for_kernels(60)
        shutil.rmtree(_OWN_CACHE_DIR.pop(), ignore_errors=True)
        # anything compiled later in this process (at exit) stays in memory: with the variable
        # merely unset it would fall back to the user's cache
        os.environ["GRADTAPE_CACHE"] = "0"


# Reproducible in CI: derandomized (examples derived from the test itself), no deadline
# (the first call of a rule may import SciPy), a modest number of examples per test.
settings.register_profile(
    "gradtape",
    max_examples=25,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
settings.register_profile(
    "gradtape-thorough",
    parent=settings.get_profile("gradtape"),
    max_examples=300,
    derandomize=False,
)
settings.load_profile(os.environ.get("GRADTAPE_HYPOTHESIS_PROFILE", "gradtape"))

PYFLOAT = "pyfloat"  # a shape marker: the argument is a Python float, not an array

# --- numerical references ------------------------------------------------------------------


def _as_float64(x):
    """The argument as float64 (a Python float stays a Python float)."""
    return x if isinstance(x, float) else np.asarray(x, dtype=np.float64)


def _perturbed(args: Sequence, argnum: int, flat_index: int, delta):
    """args in float64, with element `flat_index` of argument `argnum` moved by `delta`."""
    new = [
        _as_float64(a) if i == argnum or isinstance(a, np.ndarray) else a
        for i, a in enumerate(args)
    ]
    x = new[argnum]
    if isinstance(x, float):
        new[argnum] = x + delta
        return new
    moved = np.array(x, dtype=np.result_type(x, delta), order="C")  # reshape(-1) is a view
    moved.reshape(-1)[flat_index] += delta
    new[argnum] = moved
    return new


def central_difference_grad(f: Callable, args: Sequence, argnum: int) -> np.ndarray:
    """d f / d args[argnum] by central differences in float64 (step ~ eps^(1/3) * scale)."""
    x = np.asarray(_as_float64(args[argnum]))
    out = np.empty(x.shape, np.float64)
    for k, xk in enumerate(x.reshape(-1)):
        h = 6e-6 * max(1.0, abs(float(xk)))
        hi = float(np.real(f(*_perturbed(args, argnum, k, h))))
        lo = float(np.real(f(*_perturbed(args, argnum, k, -h))))
        out.reshape(-1)[k] = (hi - lo) / (2 * h)
    return out


def complex_step_grad(f: Callable, args: Sequence, argnum: int) -> np.ndarray | None:
    """d f / d args[argnum] by the complex step (exact to rounding), or None if f rejects it."""
    x = np.asarray(_as_float64(args[argnum]))
    out = np.empty(x.shape, np.float64)
    h = 1e-30
    try:
        with np.errstate(all="ignore"):
            for k in range(x.size):
                value = f(*_perturbed(args, argnum, k, 1j * h))
                if not np.iscomplexobj(value):
                    return None
                out.reshape(-1)[k] = np.imag(value) / h
    except TypeError:
        return None
    return out


def disagreements_across_threads(
    compiled: Callable, reference: Callable, agree: Callable, threads: int = 4, calls: int = 200
) -> list:
    """Call `compiled` and `reference` from several threads at once, on inputs that take both
    paths of a branch at 0.01-scale values; the (seed, detail) of every call they disagree on.
    `agree(got, expected)` returns a failure detail, or None when they agree."""
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(calls):
            x = rng.random(30) * (0.01 if rng.random() < 0.5 else 1.0)
            detail = agree(compiled(x), reference(x))
            if detail is not None:
                errors.append((seed, detail))

    pool = [threading.Thread(target=work, args=(s,)) for s in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors


def _expected_grad_dtype(arg):
    if isinstance(arg, float):
        return np.float64
    return np.asarray(arg).dtype


def assert_grad_matches(
    f: Callable,
    *args,
    argnums: int | Sequence[int] = 0,
    complex_step: bool = True,
    require_complex_step: bool = False,
    rtol: float | None = None,
):
    """gradtape's gradient of scalar `f` agrees with central differences and the complex step.

    Checks the gradient's shape and dtype (float32 arguments give float32 gradients), then
    its values. Returns the gradient (a tuple when `argnums` is a tuple).
    """
    import gradtape as gt

    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    grads = gt.grad(f, argnums=argnums)(*args)
    grads = (grads,) if isinstance(argnums, int) else grads
    low_precision = any(
        np.asarray(a).dtype == np.float32 for a in args if not isinstance(a, (float, int))
    )
    tol = rtol if rtol is not None else (2e-3 if low_precision else 1e-6)
    for num, g in zip(nums, grads):
        arg = args[num]
        assert np.shape(g) == np.shape(arg), f"gradient of argument {num} has the wrong shape"
        assert np.asarray(g).dtype == _expected_grad_dtype(arg), (
            f"gradient of argument {num} has dtype {np.asarray(g).dtype}, "
            f"argument has {_expected_grad_dtype(arg)}"
        )
        g64 = np.asarray(g, np.float64)
        assert np.all(np.isfinite(g64)), f"non-finite gradient for argument {num}: {g64}"
        fd = central_difference_grad(f, args, num)
        scale = max(1.0, float(np.max(np.abs(fd), initial=0.0)))
        np.testing.assert_allclose(
            g64,
            fd,
            rtol=max(tol, 1e-5),
            atol=max(tol, 1e-6) * scale,
            err_msg=f"argument {num} vs central differences",
        )
        if complex_step:
            cs = complex_step_grad(f, args, num)
            if require_complex_step:
                assert cs is not None, "the function should accept complex input"
            if cs is not None:
                np.testing.assert_allclose(
                    g64, cs, rtol=tol, atol=tol * scale, err_msg=f"argument {num} vs complex step"
                )
    return grads[0] if isinstance(argnums, int) else tuple(grads)


# --- generated inputs -------------------------------------------------------------------------
Interval = tuple[float, float]

UNARY_SHAPES = [PYFLOAT, (), (1,), (5,), (2, 3), (2, 1, 3)]
BINARY_SHAPES = [
    (PYFLOAT, (3,)),
    ((2, 2), PYFLOAT),
    ((), ()),
    ((4,), (4,)),
    ((3, 1), (4,)),
    ((2, 3), (3,)),
    ((), (2, 3)),
    ((4,), ()),
    ((2, 1, 3), (4, 1)),
]


def element_strategy(intervals: Sequence[Interval], dtype) -> st.SearchStrategy:
    """Floats inside one of the (closed) intervals, representable in `dtype`."""
    if np.dtype(dtype) != np.float32:
        return st.one_of(*(st.floats(lo, hi) for lo, hi in intervals))
    inside = [(_float32_at_least(lo), -_float32_at_least(-hi)) for lo, hi in intervals]
    return st.one_of(*(st.floats(lo, hi, width=32) for lo, hi in inside))


def _float32_at_least(v: float) -> float:
    """The smallest float32 >= v."""
    f = np.float32(v)
    return float(f if f >= v else np.nextafter(f, np.float32(np.inf)))


def argument_strategy(shape, intervals: Sequence[Interval], dtype) -> st.SearchStrategy:
    """An argument of `shape` (or a Python float for PYFLOAT) with values in the intervals."""
    if shape == PYFLOAT:
        return element_strategy(intervals, np.float64).map(float)
    return hnp.arrays(dtype, shape, elements=element_strategy(intervals, dtype))


def weights_like(shape: tuple, dtype) -> np.ndarray:
    """Fixed, distinct, non-unit weights: the cotangent of a test's output is not all ones."""
    n = int(np.prod(shape))
    return np.linspace(0.5, 1.5, max(n, 1))[:n].reshape(shape).astype(dtype)


# --- the domain table: where each elementwise function is smooth ---------------------------
@dataclass(frozen=True)
class Domain:
    """Intervals per argument where the function is smooth, and which arguments to differentiate.

    analytic=False: the complex extension of the function does not give the real derivative
    (absolute value, maximum, ...), so the complex step is not used.
    """

    args: tuple[tuple[Interval, ...], ...]
    diff: tuple[int, ...] | None = None  # None: every argument
    analytic: bool = True
    second: tuple[int, ...] | None = None  # differentiated twice (None: those of `diff`)

    @property
    def arity(self) -> int:
        return len(self.args)

    @property
    def diff_args(self) -> tuple[int, ...]:
        return tuple(range(self.arity)) if self.diff is None else self.diff

    @property
    def second_args(self) -> tuple[int, ...]:
        return self.diff_args if self.second is None else self.second


def _d(*args, diff=None, analytic=True, second=None) -> Domain:
    """Shorthand: each argument is an interval (lo, hi) or a tuple of intervals."""
    norm = tuple((a,) if isinstance(a[0], (int, float)) else tuple(a) for a in args)
    return Domain(norm, diff, analytic, second)


_R = (-3.0, 3.0)
_POS = (0.1, 5.0)
_NONZERO = ((-3.0, -0.3), (0.3, 3.0))
_OPEN_UNIT = (-0.9, 0.9)
_APART = (((-3.0, -1.0), (0.0, 1.0)), ((-0.8, -0.2), (1.2, 3.0)))
_ORDERS = ((-2.5, -0.01), (0.0, 0.0), (0.01, 2.5))

DOMAINS: dict[str, Domain] = {
    # arithmetic
    "add": _d(_R, _R),
    "subtract": _d(_R, _R),
    "multiply": _d(_R, _R),
    "divide": _d(_R, _NONZERO),
    "negative": _d(_R),
    "positive": _d(_R),
    "power": _d((0.2, 3.0), (-2.0, 2.5)),
    "float_power": _d((0.2, 3.0), (-2.0, 2.5)),
    "square": _d(_R),
    "reciprocal": _d(_NONZERO),
    "absolute": _d(_NONZERO, analytic=False),
    "fabs": _d(_NONZERO, analytic=False),
    # x/y stays inside (2, 3): floor and trunc of it are constant
    "remainder": _d((5.1, 5.9), (2.0, 2.5), analytic=False),
    "fmod": _d((5.1, 5.9), (2.0, 2.5), analytic=False),
    # x and y never within 0.2 of each other (a kink); either can be the larger. Exact ties
    # are tested in test_elementwise.py.
    "maximum": _d(*_APART, analytic=False),
    "minimum": _d(*_APART, analytic=False),
    "fmax": _d(*_APART, analytic=False),
    "fmin": _d(*_APART, analytic=False),
    "copysign": _d(_NONZERO, _NONZERO, analytic=False),
    "hypot": _d(_R, (0.3, 3.0)),
    "arctan2": _d(_R, (0.3, 3.0)),
    "logaddexp": _d(_R, _R),
    "logaddexp2": _d(_R, _R),
    # exponentials and logarithms
    "exp": _d(_R),
    "expm1": _d(_R),
    "exp2": _d(_R),
    "exp10": _d((-2.0, 2.0)),
    "log": _d(_POS),
    "log2": _d(_POS),
    "log10": _d(_POS),
    "log1p": _d((-0.8, 4.0)),
    "sqrt": _d(_POS),
    "cbrt": _d(((-5.0, -0.1), (0.1, 5.0))),
    # trigonometric and hyperbolic
    "sin": _d((-4.0, 4.0)),
    "cos": _d((-4.0, 4.0)),
    "tan": _d((-1.3, 1.3)),
    "arcsin": _d(_OPEN_UNIT),
    "arccos": _d(_OPEN_UNIT),
    "arctan": _d((-4.0, 4.0)),
    "sinh": _d(_R),
    "cosh": _d(_R),
    "tanh": _d(_R),
    "arcsinh": _d((-4.0, 4.0)),
    "arccosh": _d((1.1, 5.0)),
    "arctanh": _d(_OPEN_UNIT),
    "deg2rad": _d((-200.0, 200.0)),
    "radians": _d((-200.0, 200.0)),
    "rad2deg": _d(_R),
    "degrees": _d(_R),
    # scipy.special
    "gammaln": _d((0.2, 6.0)),
    "gamma": _d((0.2, 4.0)),
    "psi": _d((0.3, 6.0)),
    "_zeta": _d((1.5, 4.0), (0.5, 4.0), diff=(1,)),
    "erf": _d((-2.5, 2.5)),
    "erfc": _d((-2.5, 2.5)),
    "erfinv": _d(_OPEN_UNIT),
    "expit": _d((-5.0, 5.0)),
    "logit": _d((0.05, 0.95)),
    "log_expit": _d((-5.0, 5.0)),
    "xlogy": _d(_R, (0.2, 4.0)),
    "xlog1py": _d(_R, (-0.8, 4.0)),
    "ndtr": _d((-4.0, 4.0)),
    "log_ndtr": _d((-6.0, 4.0)),
    "ndtri": _d((0.02, 0.98)),
    "entr": _d((0.05, 4.0)),
    "betaln": _d((0.3, 5.0), (0.3, 5.0)),
    # scipy.special, the long tail: Bessel functions in their argument (orders fixed, never
    # subnormal: SciPy's yv and ive give 0 or NaN there). Their complex versions (AMOS) do not
    # resolve an imaginary step of 1e-30: no complex step.
    "jv": _d(_ORDERS, (0.5, 5.0), diff=(1,), analytic=False),
    "yv": _d(_ORDERS, (0.5, 5.0), diff=(1,), analytic=False),
    "iv": _d(_ORDERS, (0.2, 4.0), diff=(1,), analytic=False),
    "kv": _d(_ORDERS, (0.2, 4.0), diff=(1,), analytic=False),
    "ive": _d(_ORDERS, (0.2, 4.0), diff=(1,), analytic=False),
    "kve": _d(_ORDERS, (0.2, 4.0), diff=(1,), analytic=False),
    "yn": _d((2.0, 2.0), (0.5, 5.0), diff=(1,)),
    "kn": _d((1.0, 1.0), (0.2, 4.0), diff=(1,)),
    "j0": _d((-5.0, 5.0)),
    "j1": _d((-5.0, 5.0)),
    "y0": _d((0.3, 5.0)),
    "y1": _d((0.3, 5.0)),
    "i0": _d(_R),
    "i1": _d(_R),
    "i0e": _d(_NONZERO, analytic=False),
    "i1e": _d(_NONZERO, analytic=False),
    "k0": _d((0.2, 4.0)),
    "k1": _d((0.2, 4.0)),
    "k0e": _d((0.2, 4.0)),
    "k1e": _d((0.2, 4.0)),
    "gammainc": _d((0.5, 4.0), (0.2, 4.0), second=(1,)),
    "gammaincc": _d((0.5, 4.0), (0.2, 4.0), second=(1,)),
    "betainc": _d((0.5, 4.0), (0.5, 4.0), (0.05, 0.95), second=(2,)),
    "betaincc": _d((0.5, 4.0), (0.5, 4.0), (0.05, 0.95), second=(2,)),
    "beta": _d((0.3, 4.0), (0.3, 4.0)),
    "rgamma": _d((-3.5, 4.0), analytic=False),
    "erfcinv": _d((0.05, 1.95)),
    "rel_entr": _d((0.2, 4.0), (0.2, 4.0)),
    "kl_div": _d((0.2, 4.0), (0.2, 4.0)),
    # |r| never within 0.1 of delta (a kink)
    "huber": _d((0.5, 2.0), ((-3.0, -2.2), (-0.4, 0.4), (2.2, 3.0)), analytic=False),
    "pseudo_huber": _d((0.2, 3.0), _R),
    "spence": _d((0.1, 4.0)),
    # behind scipy.stats: inverses in their probability, cdfs in their continuous argument
    "gammaincinv": _d((0.5, 4.0), (0.05, 0.95), second=(1,)),
    "gammainccinv": _d((0.5, 4.0), (0.05, 0.95), second=(1,)),
    "betaincinv": _d((0.5, 4.0), (0.5, 4.0), (0.05, 0.95), second=(2,)),
    "betainccinv": _d((0.5, 4.0), (0.5, 4.0), (0.05, 0.95), second=(2,)),
    "stdtr": _d((0.5, 30.0), _R, second=(1,)),
    "stdtrit": _d((0.5, 30.0), (0.05, 0.95), second=(1,)),
    "pdtr": _d((3.0, 3.0), (0.2, 6.0), diff=(1,)),
    "pdtrc": _d((3.0, 3.0), (0.2, 6.0), diff=(1,)),
    "bdtr": _d((3.0, 3.0), (7.0, 7.0), (0.05, 0.95), diff=(2,)),
    "bdtrc": _d((3.0, 3.0), (7.0, 7.0), (0.05, 0.95), diff=(2,)),
    # error-function relatives, exponential integrals, trigonometry in degrees
    "erfcx": _d(_R, analytic=False),
    "erfi": _d(_R, analytic=False),
    "dawsn": _d(_R, analytic=False),
    "exprel": _d(((-3.0, -0.3), (-1e-4, 1e-4), (0.3, 3.0)), analytic=False),
    "cosm1": _d(_R, analytic=False),
    "powm1": _d((0.2, 3.0), (-2.0, 2.5), analytic=False),
    "expi": _d(_NONZERO, analytic=False),
    "exp1": _d(_POS, analytic=False),
    "expn": _d(((0.0, 0.0), (1.0, 1.0), (3.0, 3.0)), _POS, diff=(1,), analytic=False),
    "sindg": _d((-200.0, 200.0), analytic=False),
    "cosdg": _d((-200.0, 200.0), analytic=False),
    "tandg": _d((-60.0, 60.0), analytic=False),
    "cotdg": _d((20.0, 160.0), analytic=False),
    "radian": _d(_R, _R, _R, analytic=False),
    "owens_t": _d(_R, _R, analytic=False),
    # hypergeometric functions and orthogonal polynomials in their argument
    "hyp0f1": _d((1.5, 1.5), _R, diff=(1,), analytic=False),
    "hyp1f1": _d((1.5, 1.5), (2.5, 2.5), _R, diff=(2,), analytic=False),
    "eval_legendre": _d(((0.0, 0.0), (3.0, 3.0)), (-0.95, 0.95), diff=(1,), analytic=False),
    "eval_chebyt": _d(((0.0, 0.0), (3.0, 3.0)), (-0.95, 0.95), diff=(1,), analytic=False),
    "eval_chebyu": _d(((0.0, 0.0), (4.0, 4.0)), (-0.95, 0.95), diff=(1,), analytic=False),
    "eval_gegenbauer": _d((3.0, 3.0), (0.7, 0.7), (-0.95, 0.95), diff=(2,), analytic=False),
    "eval_laguerre": _d(((0.0, 0.0), (3.0, 3.0)), _POS, diff=(1,), analytic=False),
    "eval_genlaguerre": _d((3.0, 3.0), (0.5, 0.5), _POS, diff=(2,), analytic=False),
    # gamma-function relatives, elliptic integrals, Box-Cox, distribution functions
    "binom": _d((3.5, 6.0), (0.5, 2.5), analytic=False),
    "poch": _d((0.5, 3.0), (0.5, 2.0), analytic=False),
    "loggamma": _d(_POS, analytic=False),
    "ellipk": _d(((-2.0, -0.3), (-1e-5, 1e-5), (0.1, 0.9)), analytic=False),
    "ellipe": _d(((-2.0, -0.3), (-1e-5, 1e-5), (0.1, 0.9)), analytic=False),
    "ellipkm1": _d((0.05, 0.9), analytic=False),
    "boxcox": _d(_POS, ((-2.0, -0.1), (-1e-5, 1e-5), (0.1, 2.0)), analytic=False),
    "boxcox1p": _d(_POS, ((-2.0, -0.1), (-1e-5, 1e-5), (0.1, 2.0)), analytic=False),
    "inv_boxcox": _d((0.1, 1.0), (0.2, 1.5), diff=(0,), analytic=False),
    "inv_boxcox1p": _d((0.1, 1.0), (0.2, 1.5), diff=(0,), analytic=False),
    "ndtri_exp": _d((-5.0, -0.05), analytic=False),
    "chdtr": _d((3.0, 3.0), (0.2, 6.0), diff=(1,), analytic=False),
    "chdtrc": _d((3.0, 3.0), (0.2, 6.0), diff=(1,), analytic=False),
    "gdtr": _d((0.5, 2.0), (2.5, 2.5), (0.2, 4.0), diff=(0, 2), analytic=False),
    "gdtrc": _d((0.5, 2.0), (2.5, 2.5), (0.2, 4.0), diff=(0, 2), analytic=False),
}

TERNARY_SHAPES = [((), (), ()), ((3,), (3,), (3,)), ((2, 1), (3,), ()), (PYFLOAT, (2,), (2,))]


def differentiable_ufuncs() -> list:
    """Every ufunc with a differentiable elementwise rule (NumPy's and scipy.special's)."""
    import scipy.special

    from gradtape.core.routes import UFUNCS, lookup_ufunc

    lookup_ufunc(scipy.special.erf)  # registers the scipy.special ufuncs
    return [uf for uf, prim in UFUNCS.items() if prim.partials is not None and not prim.nondiff]


def ufunc_id(uf) -> str:
    module = "np" if getattr(np, uf.__name__, None) is uf else "sp"
    return f"{module}.{uf.__name__}"


@pytest.fixture(autouse=True)
def _no_level_left_behind():
    """Every test must leave the thread-local stack of trace levels empty."""
    from gradtape.core.tracing import current_levels

    yield
    assert current_levels() == [], "a test left a trace level on the stack"


@pytest.fixture(autouse=True)
def _fresh_compiled_functions():
    """Each test compiles afresh: `compile` remembers compiled functions by (function,
    transform, options), and a test counting recordings must not see another test's."""
    from gradtape.compile import memo

    memo.forget_all()
    yield


def compile_backends() -> tuple:
    """The compile backends this tier runs: numba only where the native tier is on."""
    from gradtape.compile import BACKENDS

    return tuple(b for b in ("numpy", "numba") if b in BACKENDS)
