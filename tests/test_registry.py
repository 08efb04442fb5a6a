"""What each backend computes with its own code, over every declared primitive.

The lists below are reviewed: a primitive added without a native form or a lowering (or an
entry lost in a refactoring) changes them, and this test says which. Update them on purpose;
`python -m gradtape.compile.coverage` prints the current lists.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import numpy as np
import pytest

from gradtape.compile import coverage
from gradtape.core.primitive import REGISTRY

pytest.importorskip("scipy")  # the scipy.special primitives' ufuncs count

# run through NumPy between the numba backend's kernels (no native form, no lowering entry,
# no fused reduction, no loop driver)
NATIVE_GAPS = {
    # a checkpointed block: recorded only by differentiating levels, never staged
    "checkpoint",
    # index and search functions, predicates on whole arrays
    "allclose",
    "argmax",
    "argmin",
    "argsort",
    "argwhere",
    "array_equal",
    "count_nonzero",
    "flatnonzero",
    "isclose",
    "nonzero",
    "searchsorted",
    # linear algebra beyond matmul (LAPACK through NumPy)
    "cholesky",
    "det",
    "eigh",
    "einsum",
    "inv",
    "qr",
    "slogdet",
    "solve",
    # elementwise functions without a scalar expression Numba implements
    "betaln",
    "erfinv",
    "exp10",
    "heaviside",
    "ndtri",
    "zeta",
    # shapes
    "pad",
    # Fourier transforms (pocketfft through NumPy) and complex parts
    "fft",
    "imag",
    "real",
    # decompositions and matrix functions (LAPACK through NumPy and SciPy)
    "cho_factors",
    "cho_solve",
    "cholesky_backward",
    "eig",
    "expm",
    "linalg_all_real",
    "linalg_conj",
    "linalg_imag",
    "linalg_real",
    "logm",
    "lu",
    "lu_factors",
    "lu_permutation",
    "lu_solve",
    "lu_solve_factors",
    "pinv",
    "pos_solve",
    "eigh_subset_signs",
    "scipy_eigh",
    "scipy_eigh_general",
    "solve_banded",
    "solve_continuous_lyapunov",
    "solve_discrete_lyapunov",
    "solve_sylvester",
    "signal_convolve",
    "signal_lfilter",
    "sqrtm",
    "svd",
    "triangular_solve",
    # scipy.special, scipy.stats and NumPy functions declared without a native form yet
    "_riemann_zeta",
    "argpartition",
    "bdtr",
    "bdtrc",
    "beta",
    "betainc",
    "betainc_da",
    "betainc_db",
    "betaincc",
    "betainccinv",
    "betaincinv",
    "bincount",
    "bincount_shifted",
    "bitwise_count",
    "conjugate",
    "convolution",
    "digitize",
    "discrete_ppf",
    "divmod",
    "erfcinv",
    "frexp",
    "gammainc",
    "gammainc_da",
    "gammaincc",
    "gammainccinv",
    "gammaincinv",
    "gammasgn",
    "histogram_bin_count",
    "histogram_bin_index",
    "i0",
    "i0e",
    "i1",
    "i1e",
    "isnat",
    "iv",
    "ive",
    "j0",
    "j1",
    "jv",
    "k0",
    "k0e",
    "k1",
    "k1e",
    "kn",
    "kv",
    "kve",
    "lambertw",
    "ldexp",
    "lexsort",
    "logaddexp_reduce",
    "matvec",
    "modf",
    "nanargmax",
    "nanargmin",
    "nextafter",
    "numpy_i0",
    "partition_index",
    "pdtr",
    "pdtrc",
    "rgamma",
    "running_extreme",
    "sinc",
    "spence",
    "stdtr",
    "stdtrit",
    "unique_inverse",
    "unique_rank",
    "vecdot",
    "vecmat",
    "y0",
    "y1",
    "yn",
    "yv",
    # more of scipy.special (SciPy's own loops between kernels)
    "binom",
    "boxcox",
    "boxcox1p",
    "chdtr",
    "chdtrc",
    "cosdg",
    "cosm1",
    "cotdg",
    "dawsn",
    "ellipe",
    "ellipk",
    "ellipkm1",
    "erfcx",
    "erfi",
    "eval_chebyt",
    "eval_chebyu",
    "eval_gegenbauer",
    "eval_genlaguerre",
    "eval_laguerre",
    "eval_legendre",
    "exp1",
    "expi",
    "expn",
    "exprel",
    "gdtr",
    "gdtrc",
    "hyp0f1",
    "hyp1f1",
    "inv_boxcox",
    "inv_boxcox1p",
    "loggamma",
    "ndtri_exp",
    "owens_t",
    "poch",
    "powm1",
    "radian",
    "round",
    "sindg",
    "tandg",
}

# computed by the numpy backend through its generic fallback (a call of the primitive's
# implementation) rather than code writing into a reused buffer
NUMPY_FALLBACKS = {
    "checkpoint",  # recorded only by differentiating levels, never staged
    "all",
    "allclose",
    "any",
    "argmax",
    "argmin",
    "argsort",
    "argwhere",
    "array_equal",
    "cholesky",
    "count_nonzero",
    "det",
    "dyn_getitem",
    "dyn_scatter_add",
    "dyn_setitem",
    "eigh",
    "einsum",
    "flatnonzero",
    "inv",
    "isclose",
    "nonzero",
    "qr",
    "rolled_loop",
    "scan",
    "scan_bwd",
    "searchsorted",
    "slogdet",
    "solve",
    "while_loop",
    "zeta",  # scipy.special.zeta is a Python function around the _zeta ufunc
    # Fourier transforms and complex parts
    "fft",
    "imag",
    "real",
    # decompositions and matrix functions: LAPACK through NumPy and SciPy
    "cho_factors",
    "cho_solve",
    "cholesky_backward",
    "eig",
    "expm",
    "linalg_all_real",
    "linalg_conj",
    "linalg_imag",
    "linalg_real",
    "logm",
    "lu",
    "lu_factors",
    "lu_permutation",
    "lu_solve",
    "lu_solve_factors",
    "pinv",
    "pos_solve",
    "scipy_eigh",
    "scipy_eigh_general",
    "solve_banded",
    "solve_continuous_lyapunov",
    "solve_discrete_lyapunov",
    "solve_sylvester",
    "sqrtm",
    "svd",
    "triangular_solve",
    # computed by a call of their implementation (data-dependent or multi-output results)
    "_riemann_zeta",
    "argpartition",
    "bincount",
    "bincount_shifted",
    "convolution",
    "digitize",
    "discrete_ppf",
    "divmod",
    "betainc_da",  # a continued fraction in NumPy (rules/incomplete_beta.py)
    "betainc_db",
    "eigh_subset_signs",  # SciPy's subset driver, for its eigenvectors' signs
    "frexp",
    "gammainc_da",  # a series in NumPy (rules/incomplete_gamma.py)
    "gammasgn",
    "histogram_bin_count",
    "histogram_bin_index",
    "lambertw",
    "round",  # scipy.special.round: a step function
    "lexsort",
    "logaddexp_reduce",
    "matvec",
    "modf",
    "nanargmax",
    "nanargmin",
    "numpy_i0",
    "partition_index",
    "running_extreme",
    "signal_convolve",
    "signal_lfilter",
    "sinc",
    "unique_inverse",
    "unique_rank",
    "vecdot",
    "vecmat",
}


@functools.cache
def _fresh_process() -> dict:
    """Both lists from a new process: its registry holds gradtape's primitives only (tests
    declare primitives of their own)."""
    script = (
        "import json; from gradtape.compile import coverage; print(json.dumps("
        "{'gaps': coverage.native_gaps(), 'fallbacks': coverage.numpy_fallbacks(), "
        "'report': coverage.report()}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# primitives declared only where NumPy has the function (matvec and vecmat: NumPy 2.2)
NOT_IN_THIS_NUMPY = {name for name in ("matvec", "vecmat") if not hasattr(np, name)}
NATIVE_GAPS -= NOT_IN_THIS_NUMPY
NUMPY_FALLBACKS -= NOT_IN_THIS_NUMPY


def test_primitives_the_numba_backend_runs_through_numpy():
    gaps = set(_fresh_process()["gaps"])
    assert gaps - NATIVE_GAPS == set(), "new primitives without a native form or lowering"
    assert NATIVE_GAPS - gaps == set(), "these are native now: drop them from NATIVE_GAPS"


def test_primitives_the_numpy_backend_computes_through_its_fallback():
    fallbacks = set(_fresh_process()["fallbacks"])
    assert fallbacks - NUMPY_FALLBACKS == set(), "new primitives on the generic fallback"
    assert NUMPY_FALLBACKS - fallbacks == set(), "these have emitters now: update the list"


def test_the_walk_covers_every_declared_primitive_and_no_user_rule():
    import gradtape as gt

    @gt.custom_jvp
    def twice(x):
        return 2 * x

    names = {p.name for p in coverage.primitives()}
    assert {"add", "matmul", "scan", "getitem", "stop_gradient"} <= names
    assert all(not REGISTRY[n].user_rule for n in names)
    assert not any(n.startswith(("custom_vjp[", "custom_jvp[")) for n in names)


def test_the_report_lists_both():
    text = _fresh_process()["report"]
    assert f"{len(NATIVE_GAPS)} primitives run through NumPy" in text
    assert "heaviside" in text and "while_loop" in text


@pytest.mark.native
def test_a_new_ufunc_declared_with_a_native_form_fuses_with_no_other_edit():
    """np.ldexp, declared afresh here with a native form (gradtape's own declaration has none,
    and is set aside for the test), is computed in the fused loop with no edit to compile/."""
    pytest.importorskip("numba")
    import numpy as np

    import gradtape as gt
    from gradtape.compile.numba.backend import lowered
    from gradtape.core.routes import UFUNCS
    from gradtape.rules.elementwise import elementwise

    own = UFUNCS.pop(np.ldexp, None)
    ldexp = elementwise(
        "test_ldexp", np.ldexp, (lambda ans, x, n: 2.0**n, None), ufunc=np.ldexp, native="np.ldexp"
    )
    try:

        def f(x):
            return np.sum(np.ldexp(x, 3) * np.sin(x))

        compiled = gt.compile(gt.value_and_grad(f), backend="numba")
        x = np.linspace(-1.0, 2.0, 9)
        value, grad = compiled(x)
        np.testing.assert_allclose(value, np.sum(8.0 * x * np.sin(x)), rtol=1e-14)
        np.testing.assert_allclose(grad, 8.0 * (np.sin(x) + x * np.cos(x)), rtol=1e-13)
        low = lowered(compiled, x)
        assert low.tier == "native"
        assert all(s.kind != "python" for s in low.generated.plan.stages)
        assert any(
            ins.prim is ldexp
            for s in low.generated.plan.stages
            if s.kind == "loop"
            for ins in s.members
        )
    finally:
        UFUNCS.pop(np.ldexp, None)
        if own is not None:
            UFUNCS[np.ldexp] = own
        REGISTRY.pop("test_ldexp", None)


def test_native_forms_that_cannot_be_read_are_refused():
    from gradtape.compile.numba.scalar import parse

    assert [a.kinds for a in parse(("signed:({0} + {1})", "np.add"))] == ["fi", None]
    with pytest.raises(ValueError, match="unknown native rule"):
        parse("@no_such_rule")
    with pytest.raises(ValueError, match="string or a tuple"):
        parse(("np.add", 3))


@pytest.mark.native
def test_a_ufunc_whose_name_is_not_an_identifier_compiles_on_the_numpy_backend():
    """The numpy backend names the ufuncs it calls after them: `<lambda>` is made one."""
    numba = pytest.importorskip("numba")
    import numpy as np

    import gradtape as gt
    from gradtape.core.routes import UFUNCS
    from gradtape.rules.elementwise import elementwise

    cube_ufunc = numba.vectorize(["float64(float64)"])(lambda x: x * x * x).ufunc
    assert cube_ufunc.__name__ == "<lambda>"
    elementwise("test_lambda_cube", cube_ufunc, (lambda ans, x: 3 * x * x,), ufunc=cube_ufunc)
    try:
        compiled = gt.compile(gt.value_and_grad(lambda x: np.sum(cube_ufunc(x))), backend="numpy")
        value, grad = compiled(np.arange(4.0))
        assert value == 36.0 and np.array_equal(grad, 3 * np.arange(4.0) ** 2)
    finally:
        UFUNCS.pop(cube_ufunc, None)
        REGISTRY.pop("test_lambda_cube", None)


# vmap runs these once per member of the batch (no batching rule: tracing.loop_batch); each
# other primitive gets its rule in rules/batching.py, batching_search.py or batching_linalg.py
LOOP_BATCHED = {
    # the output's shape depends on each member's values: members of one batch may disagree,
    # so these run once per member (and a batch whose members disagree raises)
    "argwhere",
    "eigh_subset_signs",  # SciPy's subset driver on each matrix
    "flatnonzero",
    "nonzero",
    "unique_inverse",  # np.unique sorts each member's values: no batched form in NumPy
    "unique_rank",
    # the number of bins NumPy's estimators give (bins="auto", ...) is a Python int per member
    "histogram_bin_count",
    # LAPACK's banded solver takes one banded matrix, and SciPy has no stacked form of it
    "solve_banded",
    "rolled_loop",  # made by compile after every transform: never batched
}


def _loop_batched_in_a_fresh_process() -> set:
    script = (
        "import json, gradtape; from gradtape.core.primitive import REGISTRY; print(json.dumps("
        "sorted(n for n, p in REGISTRY.items() if p.batch is None)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


LOOP_BATCHED -= NOT_IN_THIS_NUMPY


def test_primitives_vmap_runs_once_per_member():
    looped = _loop_batched_in_a_fresh_process()
    assert looped - LOOP_BATCHED == set(), "new primitives without a batching rule"
    assert LOOP_BATCHED - looped == set(), "these have batching rules now: drop them"
