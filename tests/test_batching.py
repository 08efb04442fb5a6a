"""Batching rules of the predicates, sorts, searches, counts, traced-integer indexing, SciPy's
linear algebra, the FFT, convolutions and padding.

The reference of every batched result is the definition of vmap: the function applied to each
member in a Python loop (plain NumPy, no gradtape) and the results stacked. Hypothesis draws
the batch size, which arguments are batched and along which axis; gradients through vmap
(vmap of grad and grad of vmap) are compared with gradtape's gradient of each member alone,
compiled programs with the eager result, and, where JAX is installed and has the function,
jax.vmap is a second oracle.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradtape as gt
from gradtape.core.primitive import REGISTRY

sl = pytest.importorskip("scipy.linalg")
signal = pytest.importorskip("scipy.signal")
stats = pytest.importorskip("scipy.stats")
special = pytest.importorskip("scipy.special")


def _spd(rng, n):
    a = rng.normal(size=(n, n))
    return a @ a.T + n * np.eye(n)


def _with_ties(rng, shape):
    return np.round(rng.normal(size=shape), 1)


def _with_nans(rng, shape):
    x = rng.normal(size=shape)
    x.flat[::3] = np.nan
    x.flat[1] = 0.5  # never a slice of NaNs only
    return x


@dataclass
class Case:
    """f(*member) for members drawn by `draw(rng, n)` (n: a size, 2 to 5); `diff`:
    differentiable in argument 0."""

    f: object
    draw: object
    primitives: tuple
    diff: bool = False
    tol: float = 1e-12
    once: tuple = ()  # the arguments batched in the recording test (all when empty)
    traced_per_member: bool = False  # recorded (traced values) once per member, by design


def _pair(gen):
    return lambda rng, n: (gen(rng, (n + 2,)), gen(rng, (n + 2,)))


def _close_pair(rng, n):
    x = rng.normal(size=(3, n))
    y = x + rng.choice([0.0, 1e-9, 1e-3], size=x.shape)
    return x, y


def _equal_pair(rng, n):
    x = _with_nans(rng, (2, n))
    return x, x.copy() if rng.random() < 0.6 else x + 1


def _sorted_and_values(rng, n):
    return np.sort(_with_ties(rng, (n + 3,))), _with_ties(rng, (2, n))


def _counts(rng, n):
    x = rng.integers(0, 6, size=(n + 5,))
    x[rng.integers(n + 5)] = 6  # every member has the same largest value
    return (x,)


def _traced_index(x):
    return x[np.argmax(x)] + x[np.argmin(x)] ** 2


def _traced_write(x):
    y = np.zeros_like(x)
    y[np.argmax(np.abs(x))] = x[0]
    return y * x


def _traced_rows(x):
    return x[np.argmax(x[:, 0]), :] * np.sum(x[:, np.argmin(x[0])])


def _traced_columns(x):
    y = x * 1.0
    y[1:, np.argmax(x[0])] = x[0, :1]
    return x[:, np.argsort(x[0])] * x + y[::-1, np.argsort(x[1])[:2]].sum()


def _traced_pairs(x):
    return x[np.argmax(x, axis=0), np.arange(shape(x)[1])] + x[np.argsort(x[:, 0])][0]


def _traced_apart(x):
    y = np.stack([x, 2 * x, x * x])  # (3, 3, n)
    return y[np.argmin(x[:, 0]), :, np.argmax(x[0])]


def _traced_add_at(x):
    y = np.zeros_like(x)
    np.add.at(y, np.argsort(x[0]) % 3, x[0] * x[1])
    return y


def _masked_write(x):
    y = x * 1.0
    y[x > 0.3] = x[0] * 2
    z = np.stack([x, x])
    z[x[:2] > 0] = 1.5  # a mask of the leading axis: whole rows
    np.add.at(y, x < 0, 1.0)
    return y * z[0]


def shape(x):
    return np.shape(x) if not hasattr(x, "shape") else x.shape


def _cho(a, b):
    return sl.cho_solve(sl.cho_factor(a), b)


def _lu_solve(a, b):
    factors = sl.lu_factor(a)
    return sl.lu_solve(factors, b) + sl.lu_solve(factors, b, trans=1)


def _lu_parts(a):
    perm, low, up = sl.lu(a, p_indices=True)
    permuted_low, up2 = sl.lu(a, permute_l=True)
    return (low @ up)[perm] + permuted_low @ up2


def _eigh(a):
    w, v = sl.eigh(a)
    return w[:, None] * np.abs(v)


def _eigh_general(a, b):
    w, v = sl.eigh(a, b)
    return w[:, None] * np.abs(v)


def _spectral_product(a, x):
    return np.fft.irfft(np.fft.rfft(a * x), n=4)


CASES = {
    "argmax axis None": Case(
        lambda x: np.argmax(x), lambda r, n: (_with_ties(r, (3, n)),), ("argmax",)
    ),
    "argmin axis 0 keepdims": Case(
        lambda x: np.argmin(x, axis=0, keepdims=True),
        lambda r, n: (_with_ties(r, (3, n)),),
        ("argmin",),
    ),
    "argmax keepdims None": Case(
        lambda x: np.argmax(x, keepdims=True), lambda r, n: (_with_ties(r, (3, n)),), ("argmax",)
    ),
    "nanargmax": Case(
        lambda x: np.nanargmax(x, axis=-1), lambda r, n: (_with_nans(r, (3, n)),), ("nanargmax",)
    ),
    "nanargmin": Case(
        lambda x: np.nanargmin(x), lambda r, n: (_with_nans(r, (3, n)),), ("nanargmin",)
    ),
    "any": Case(lambda x: np.any(x > 1.0, axis=1), lambda r, n: (r.normal(size=(3, n)),), ("any",)),
    "all keepdims": Case(
        lambda x: np.all(x > -1.5, axis=(0, 1), keepdims=True),
        lambda r, n: (r.normal(size=(3, n)),),
        ("all",),
    ),
    "all where": Case(
        lambda x: np.all(x > -0.5, where=np.arange(x.shape[-1]) % 3 != 1),
        lambda r, n: (r.normal(size=(3, n)),),
        ("all",),
    ),
    "count_nonzero": Case(
        lambda x: np.count_nonzero(x > 0) + np.count_nonzero(x > 0, axis=0),
        lambda r, n: (r.normal(size=(3, n)),),
        ("count_nonzero",),
    ),
    "isclose": Case(lambda x, y: np.isclose(x, y), _close_pair, ("isclose",)),
    "allclose": Case(lambda x, y: np.allclose(x, y, atol=1e-6), _close_pair, ("allclose",)),
    "array_equal": Case(
        lambda x, y: np.array_equal(x, y, equal_nan=True), _equal_pair, ("array_equal",)
    ),
    "argsort": Case(
        lambda x: np.argsort(x, kind="stable"), lambda r, n: (_with_ties(r, (3, n)),), ("argsort",)
    ),
    "argsort axis None": Case(
        lambda x: np.argsort(x, axis=None, kind="stable"),
        lambda r, n: (_with_ties(r, (3, n)),),
        ("argsort",),
    ),
    "argpartition": Case(
        lambda x: np.take_along_axis(x, np.argpartition(x, 2, axis=0), axis=0),
        lambda r, n: (r.normal(size=(n + 1, 3)),),
        ("argpartition",),
    ),
    "partition": Case(
        lambda x: np.partition(x, (1, 3), axis=-1) * x,
        lambda r, n: (r.normal(size=(3, n + 2)),),
        ("partition_index",),
        diff=True,
    ),
    "lexsort": Case(lambda x, y: np.lexsort((x, y)), _pair(_with_ties), ("lexsort",)),
    "searchsorted": Case(
        lambda a, v: np.searchsorted(a, v, side="right"),
        _sorted_and_values,
        ("searchsorted",),
        once=(False, True),
    ),
    "digitize": Case(
        lambda a, v: np.digitize(v, a), _sorted_and_values, ("digitize",), once=(False, True)
    ),
    "digitize decreasing": Case(
        lambda a, v: np.digitize(v, a[::-1], right=True),
        _sorted_and_values,
        ("digitize",),
        once=(False, True),
    ),
    "histogram": Case(
        lambda x: np.histogram(x, bins=np.linspace(-2, 2, 6))[0],
        lambda r, n: (r.normal(size=(5 * n,)),),
        ("histogram_bin_index", "bincount_shifted"),
    ),
    "bincount": Case(lambda x: np.bincount(x, minlength=4), _counts, ("bincount",)),
    "traced index": Case(
        _traced_index, lambda r, n: (r.normal(size=(n + 2,)),), ("dyn_getitem",), diff=True
    ),
    "traced write": Case(
        _traced_write, lambda r, n: (r.normal(size=(n + 2,)),), ("dyn_setitem",), diff=True
    ),
    "traced rows": Case(
        _traced_rows, lambda r, n: (r.normal(size=(3, n)),), ("dyn_getitem",), diff=True
    ),
    "traced columns": Case(
        _traced_columns, lambda r, n: (r.normal(size=(3, n)),), ("dyn_getitem",), diff=True
    ),
    "traced pairs": Case(
        _traced_pairs, lambda r, n: (r.normal(size=(3, n)),), ("dyn_getitem",), diff=True
    ),
    "traced apart": Case(
        _traced_apart, lambda r, n: (r.normal(size=(3, n)),), ("dyn_getitem",), diff=True
    ),
    "traced add.at": Case(
        _traced_add_at, lambda r, n: (r.normal(size=(3, n)),), ("dyn_scatter_add",)
    ),
    "masked write": Case(_masked_write, lambda r, n: (r.normal(size=(n,)),), ("where",)),
    "cho_solve": Case(
        _cho, lambda r, n: (_spd(r, n), r.normal(size=(n, 2))), ("cho_solve",), diff=True, tol=1e-10
    ),
    "solve pos": Case(
        lambda a, b: sl.solve(a, b, assume_a="pos"),
        lambda r, n: (_spd(r, n), r.normal(size=(n,))),
        ("pos_solve", "cho_factors"),
        diff=True,
        tol=1e-10,
    ),
    "lu_solve": Case(
        _lu_solve,
        lambda r, n: (r.normal(size=(n, n)) + n * np.eye(n), r.normal(size=(n, 3))),
        ("lu", "lu_solve_factors"),
        diff=True,
        tol=1e-10,
    ),
    "lu": Case(
        _lu_parts, lambda r, n: (r.normal(size=(3, n)),), ("lu", "lu_permutation"), diff=True
    ),
    "eigh": Case(_eigh, lambda r, n: (_spd(r, n),), ("scipy_eigh",), diff=True, tol=1e-9),
    "eigh subset": Case(
        lambda a: (
            np.abs(sl.eigh(a, subset_by_index=(1, 2))[1]) + sl.eigh(a, subset_by_index=(0, 1))[1]
        ),
        lambda r, n: (_spd(r, n + 1),),
        ("eigh_subset_signs",),
        diff=True,
        tol=1e-9,
        traced_per_member=True,
    ),
    "eigh general": Case(
        _eigh_general,
        lambda r, n: (_spd(r, n), _spd(r, n)),
        ("scipy_eigh_general",),
        diff=True,
        tol=1e-9,
    ),
    "expm": Case(
        lambda a: sl.expm(a), lambda r, n: (0.5 * r.normal(size=(n, n)),), ("expm",), diff=True
    ),
    "sqrtm": Case(
        lambda a: sl.sqrtm(a), lambda r, n: (_spd(r, n),), ("sqrtm",), diff=True, tol=1e-9
    ),
    "logm": Case(lambda a: sl.logm(a), lambda r, n: (_spd(r, n),), ("logm",), diff=True, tol=1e-9),
    "solve_sylvester": Case(
        lambda a, b: sl.solve_sylvester(a, b, a @ b),
        lambda r, n: (_spd(r, n), _spd(r, n)),
        ("solve_sylvester",),
        diff=True,
        tol=1e-9,
    ),
    "lyapunov": Case(
        lambda a, q: (
            sl.solve_continuous_lyapunov(a - 6 * np.eye(len(a)), q)
            + sl.solve_discrete_lyapunov(0.2 * a / np.abs(a).sum(), q)
        ),
        lambda r, n: (r.normal(size=(n, n)), _spd(r, n)),
        ("solve_continuous_lyapunov", "solve_discrete_lyapunov"),
        diff=True,
        tol=1e-9,
    ),
    "fft": Case(
        lambda x: np.abs(np.fft.fft(x, axis=0)) + np.real(np.fft.ifft(x, n=6, axis=0)[:4]),
        lambda r, n: (r.normal(size=(4, 3)),),
        ("fft", "real"),
        diff=True,
    ),
    "rfft irfft": Case(
        _spectral_product,
        lambda r, n: (r.normal(size=(n + 2,)), r.normal(size=(n + 2,))),
        ("fft",),
        diff=True,
    ),
    "imag": Case(
        lambda x: np.imag(np.fft.fft(x)) * x,
        lambda r, n: (r.normal(size=(5,)),),
        ("imag",),
        diff=True,
    ),
    "convolve": Case(
        lambda a, v: np.convolve(a, v) + np.convolve(a, v, "same")[:1].sum(),
        lambda r, n: (r.normal(size=(n,)), r.normal(size=(7 - n,))),
        ("convolution",),
        diff=True,
    ),
    "correlate valid": Case(
        lambda a, v: np.correlate(a, v, "valid") + np.correlate(v, a, "same").sum(),
        lambda r, n: (r.normal(size=(n + 2,)), r.normal(size=(n,))),
        ("convolution",),
        diff=True,
    ),
    "signal convolve": Case(
        lambda a, b: signal.convolve(a, b, mode="same", method="direct"),
        lambda r, n: (r.normal(size=(n + 1, 3)), r.normal(size=(2, 2))),
        ("signal_convolve",),
        diff=True,
        once=(True, False),
    ),
    "signal convolve full": Case(
        lambda a, b: signal.convolve(a, b, method="direct"),
        lambda r, n: (r.normal(size=(n,)), r.normal(size=(7 - n,))),
        ("signal_convolve",),
        diff=True,
        once=(True, False),
    ),
    "lfilter": Case(
        lambda x, b: signal.lfilter(b, [1.0, -0.5], x, axis=0),
        lambda r, n: (r.normal(size=(n + 2, 2)), r.normal(size=(3,))),
        ("signal_lfilter",),
        diff=True,
        once=(True, False),
    ),
    "pad": Case(
        lambda x: np.pad(x, ((1, 0), (2, 1)), constant_values=0.5) ** 2,
        lambda r, n: (r.normal(size=(2, n)),),
        ("pad",),
        diff=True,
    ),
    "logaddexp reduce": Case(
        lambda x: np.logaddexp.reduce(x, axis=0) + np.logaddexp2.reduce(x, axis=None),
        lambda r, n: (r.normal(size=(3, n)),),
        ("logaddexp_reduce",),
        diff=True,
    ),
    "running maximum": Case(
        lambda x: np.maximum.accumulate(x, axis=1) * np.minimum.accumulate(x, axis=0),
        lambda r, n: (r.normal(size=(3, n)),),
        ("running_extreme",),
        diff=True,
    ),
    "matvec": Case(
        lambda a, v: np.matvec(a, v) + np.vecmat(v, a) + np.vecdot(v, v),
        lambda r, n: (r.normal(size=(n, n)), r.normal(size=(n,))),
        ("matvec", "vecmat", "vecdot"),
        diff=True,
    ),
    "spence": Case(
        lambda x: special.spence(x) * x,
        lambda r, n: (np.where(r.random(n) < 0.3, 1.0, r.uniform(0.5, 2.0, n)),),
        ("spence",),
        diff=True,
    ),
    "eig of a symmetric matrix": Case(
        lambda a: np.sort(np.linalg.eig(a).eigenvalues),
        lambda r, n: (_spd(r, n),),
        ("eig", "linalg_all_real"),
        tol=1e-9,
    ),
    "discrete ppf": Case(
        lambda q, mu: stats.poisson.ppf(q, mu),
        lambda r, n: (r.uniform(0.05, 0.95, size=(n,)), r.uniform(1, 5, size=(n,))),
        ("discrete_ppf",),
    ),
}
if not hasattr(np, "matvec"):  # (NumPy's matvec and vecmat are new in 2.2)
    del CASES["matvec"]


def _stack(members, axis):
    return np.stack(members, axis=axis)


def _loop(f, members_per_arg, batched):
    """The definition of vmap: f on each member (plain NumPy), the results stacked."""
    size = len(next(m for m, b in zip(members_per_arg, batched) if b))
    outs = [
        f(*(m[i] if b else m[0] for m, b in zip(members_per_arg, batched))) for i in range(size)
    ]
    return np.stack([np.asarray(o) for o in outs])


def _assert_same(got, want, tol):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _batch(case, size, batched, axes, seed, n=4):
    rng = np.random.default_rng(seed)
    members = [case.draw(rng, n) for _ in range(size)]
    per_arg = [[m[k] for m in members] for k in range(len(members[0]))]
    args, in_axes = [], []
    for k, (ms, b) in enumerate(zip(per_arg, batched)):
        if b:
            axis = axes[k] % (np.ndim(ms[0]) + 1)
            args.append(_stack(ms, axis))
            in_axes.append(axis)
        else:
            args.append(ms[0])
            in_axes.append(None)
    return per_arg, args, tuple(in_axes)


@contextlib.contextmanager
def _without_rules(names):
    saved = {n: REGISTRY[n].batch for n in names}
    try:
        for n in names:
            REGISTRY[n].batch = None
        yield
    finally:
        for n, rule in saved.items():
            REGISTRY[n].batch = rule


@st.composite
def _draws(draw):
    name = draw(st.sampled_from(sorted(CASES)))
    nargs = len(CASES[name].draw(np.random.default_rng(0), 4))
    batched = draw(st.lists(st.booleans(), min_size=nargs, max_size=nargs).filter(any))
    axes = draw(st.lists(st.integers(-3, 3), min_size=nargs, max_size=nargs))
    size, n, seed = draw(st.integers(1, 4)), draw(st.integers(2, 5)), draw(st.integers(0, 2**16))
    return name, size, tuple(batched), axes, seed, n


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_draws())
def test_batched_equals_the_per_member_loop(drawn):
    name, size, batched, axes, seed, n = drawn
    case = CASES[name]
    per_arg, args, in_axes = _batch(case, size, batched, axes, seed, n)
    want = _loop(case.f, per_arg, batched)
    got = gt.vmap(case.f, in_axes=in_axes)(*args)
    _assert_same(got, want, case.tol)
    with _without_rules(case.primitives):  # the fallback: each primitive once per member
        _assert_same(got, gt.vmap(case.f, in_axes=in_axes)(*args), case.tol)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_uses_a_batching_rule(name):
    """Each primitive a case exercises has its own batching rule (not the per-member loop)."""
    for prim in CASES[name].primitives:
        assert REGISTRY[prim].batch is not None, prim


DIFF = sorted(n for n, c in CASES.items() if c.diff)


def _member_grad(case, per_arg, batched, i):
    member = [m[i] if b else m[0] for m, b in zip(per_arg, batched)]
    return gt.grad(lambda *a: np.sum(case.f(*a)))(*member)


@pytest.mark.parametrize("name", DIFF)
@pytest.mark.parametrize("batched_rest", [True, False])
def test_vmap_of_grad_and_grad_of_vmap(name, batched_rest):
    case = CASES[name]
    nargs = len(case.draw(np.random.default_rng(0), 4))
    batched = (True,) + (batched_rest,) * (nargs - 1)
    per_arg, args, in_axes = _batch(case, 3, batched, [1] * nargs, seed=7)
    want = np.stack([_member_grad(case, per_arg, batched, i) for i in range(3)])
    loss = lambda *a: np.sum(case.f(*a))  # noqa: E731
    per_example = gt.vmap(gt.grad(loss), in_axes=in_axes)(*args)
    _assert_same(per_example, want, max(case.tol, 1e-10))
    # grad of vmap: the batch's total, differentiated in the batched first argument
    total = gt.grad(lambda *a: np.sum(gt.vmap(case.f, in_axes=in_axes)(*a)))(*args)
    _assert_same(np.moveaxis(total, in_axes[0], 0), want, max(case.tol, 1e-10))


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_batch_equals_the_loop(name):
    case = CASES[name]
    nargs = len(case.draw(np.random.default_rng(0), 4))
    batched = (True,) * nargs
    compiled = gt.compile(gt.vmap(case.f), backend="numpy")
    for seed in (1, 2):
        per_arg, args, _ = _batch(case, 3, batched, [0] * nargs, seed)
        _assert_same(compiled(*args), _loop(case.f, per_arg, batched), case.tol)


# rules that rewrite their primitive as others (so it is not in the recorded program)
REWRITTEN = {"allclose", "array_equal", "convolution", "lu_solve_factors", "linalg_all_real"}


def _recorded(case, size):
    nargs = len(case.draw(np.random.default_rng(0), 4))
    batched = case.once or (True,) * nargs
    _, args, in_axes = _batch(case, size, batched, [0] * nargs, seed=3)
    tape = gt.trace(gt.vmap(case.f, in_axes=in_axes), *args)
    return [ins.prim.name for ins in tape.instructions]


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if not c.traced_per_member))
def test_a_batch_is_recorded_once_whatever_its_size(name):
    """No primitive runs once per member: the recorded program of a batch of 2 and of 5 is
    the same list of primitives, and it holds each primitive the case is about."""
    case = CASES[name]
    small, large = _recorded(case, 2), _recorded(case, 5)
    assert small == large
    for prim in set(case.primitives) - REWRITTEN:
        assert prim in small, (prim, small)


def test_a_mask_that_differs_per_member_is_refused_clearly():
    """x[mask] has as many elements as the member's mask selects: vmap refuses it with the
    user's line and the np.where spelling (it once took the whole batch's mask as one
    member's index)."""
    x = np.array([[1.0, -2.0, 3.0, -4.0], [-1.0, -2.0, 3.0, 4.0], [1.0, 2.0, 3.0, -4.0]])
    with pytest.raises(gt.GradtapeError, match=r"test_batching.py.*x\[mask\].*np.where"):
        gt.vmap(lambda m: np.sum(m[m > 0]))(x)
    # members whose masks select as many elements stack, as they would alone
    two = x[:2]
    _assert_same(gt.vmap(lambda m: m[m > 0] * 2)(two), np.stack([m[m > 0] * 2 for m in two]), 0)


def test_grad_of_vmap_through_masked_writes():
    """y[mask] = value under vmap is np.where of each member's mask: differentiable (the
    gradient of each member's write, as gradtape gives it for the member alone)."""
    x = np.random.default_rng(6).normal(size=(4, 5))
    total = gt.grad(lambda xs: np.sum(gt.vmap(_masked_write)(xs) ** 2))(x)
    member = gt.grad(lambda m: np.sum(_masked_write(m) ** 2))
    _assert_same(total, np.stack([member(m) for m in x]), 1e-12)


@pytest.mark.native
@pytest.mark.parametrize("name", ["traced index", "histogram", "convolve", "pad", "cho_solve"])
def test_native_compiled_batch_equals_the_loop(name):
    """The batched program through the numba backend: the rules' output is ordinary
    primitives, fused or run between kernels like any other."""
    case = CASES[name]
    nargs = len(case.draw(np.random.default_rng(0), 4))
    compiled = gt.compile(gt.vmap(case.f), backend="numba")
    for seed in (1, 2, 3):
        per_arg, args, _ = _batch(case, 3, (True,) * nargs, [0] * nargs, seed)
        _assert_same(compiled(*args), _loop(case.f, per_arg, (True,) * nargs), case.tol)


@pytest.mark.parametrize(
    "name", ["traced pairs", "searchsorted", "cho_solve", "convolve", "argsort", "histogram"]
)
def test_vmap_of_vmap_is_a_grid_of_members(name):
    """Nested maps: each level's rule batches its own axis (the inner level's integers and
    indices are constants of the outer level's rule)."""
    case = CASES[name]
    nargs = len(case.draw(np.random.default_rng(0), 4))
    rng = np.random.default_rng(21)
    grid = [[case.draw(rng, 4) for _ in range(3)] for _ in range(2)]
    args = [
        np.stack([np.stack([row[j][k] for j in range(3)]) for row in grid]) for k in range(nargs)
    ]
    want = np.stack([np.stack([np.asarray(case.f(*member)) for member in row]) for row in grid])
    _assert_same(gt.vmap(gt.vmap(case.f))(*args), want, case.tol)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(0, 8),
    st.integers(0, 5),
    st.sampled_from(["float", "int", "nan"]),
    st.integers(0, 2**16),
)
def test_searches_of_batched_sorted_arrays(size, n, m, kind, seed):
    """np.searchsorted and np.digitize of each member's own sorted array: NumPy's binary
    search (ties, NaN sorted last, integers, empty arrays), both sides, both directions."""
    rng = np.random.default_rng(seed)
    a = np.round(rng.normal(size=(size, n)), 1)
    if kind == "int":
        a = rng.integers(-3, 3, size=(size, n))
    elif kind == "nan" and n:
        a[:, -1] = np.nan
    a = np.sort(a, axis=1)
    v = np.round(rng.normal(size=(size, m)), 1)
    if m > 1 and n:
        v[:, 0], v[:, 1] = a[:, 0], np.nan
    for side in ("left", "right"):
        got = gt.vmap(lambda a, v: np.searchsorted(a, v, side=side))(a, v)
        want = [np.searchsorted(a[i], v[i], side=side) for i in range(size)]
        _assert_same(got, np.stack(want), 0)
    if kind == "nan" or not n:
        return  # np.digitize wants monotonic bins
    for bins in (a, a[:, ::-1]):
        for right in (False, True):
            got = gt.vmap(lambda b: np.digitize(v[0], b, right=right))(bins)
            want = [np.digitize(v[0], bins[i], right=right) for i in range(size)]
            _assert_same(got, np.stack(want), 0)


def test_an_index_argument_of_each_member_is_never_the_whole_batch():
    """A NumPy function that needs a concrete index (np.delete's positions, np.partition's
    kth) given a member of the batch: the members' common value, or a clear error when they
    differ (it once took the whole batch's values as one member's index: wrong numbers)."""
    x = np.array([[3.0, 1.0, 2.0, 0.0], [0.0, 5.0, 1.0, 2.0], [1.0, 0.0, 4.0, 3.0]])
    kth_of_all = lambda r: np.partition(r, np.argmax(r * 0) + 2)  # noqa: E731
    _assert_same(gt.vmap(kth_of_all)(x), _loop(kth_of_all, [list(x)], [True]), 0)
    with pytest.raises(gt.GradtapeError, match="differs across the batch"):
        gt.vmap(lambda r: np.delete(r, np.argmax(r)))(x)
    with pytest.raises(gt.GradtapeError, match="differs across the batch"):
        gt.vmap(lambda r: np.partition(r, np.argmax(r) % 2 + 1))(x)
