"""jax.vmap as a second oracle of the batching rules (skipped without JAX): the same batch of
members through gradtape's vmap of plain NumPy code and through JAX's vmap of jax.numpy code,
for the functions JAX has."""

from __future__ import annotations

import numpy as np
import pytest
from test_batching import CASES, _assert_same, _batch

import gradtape as gt

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
jsl = pytest.importorskip("jax.scipy.linalg")
jsignal = pytest.importorskip("jax.scipy.signal")


def _jax_functions() -> dict:
    """The JAX spelling of each case that JAX has (same arguments, same results)."""
    return {
        "argmax axis None": lambda x: jnp.argmax(x),
        "argmin axis 0 keepdims": lambda x: jnp.argmin(x, axis=0, keepdims=True),
        "nanargmax": lambda x: jnp.nanargmax(x, axis=-1),
        "nanargmin": lambda x: jnp.nanargmin(x),
        "any": lambda x: jnp.any(x > 1.0, axis=1),
        "all keepdims": lambda x: jnp.all(x > -1.5, axis=(0, 1), keepdims=True),
        "count_nonzero": lambda x: jnp.count_nonzero(x > 0) + jnp.count_nonzero(x > 0, axis=0),
        "isclose": lambda x, y: jnp.isclose(x, y),
        "allclose": lambda x, y: jnp.allclose(x, y, atol=1e-6),
        "array_equal": lambda x, y: jnp.array_equal(x, y, equal_nan=True),
        "argsort": lambda x: jnp.argsort(x, stable=True),
        "argsort axis None": lambda x: jnp.argsort(x, axis=None, stable=True),
        "lexsort": lambda x, y: jnp.lexsort((x, y)),
        "searchsorted": lambda a, v: jnp.searchsorted(a, v, side="right"),
        "digitize": lambda a, v: jnp.digitize(v, a),
        "histogram": lambda x: jnp.histogram(x, bins=jnp.linspace(-2, 2, 6))[0],
        "traced index": lambda x: x[jnp.argmax(x)] + x[jnp.argmin(x)] ** 2,
        "cho_solve": lambda a, b: jsl.cho_solve(jsl.cho_factor(a), b),
        "solve pos": lambda a, b: jsl.solve(a, b, assume_a="pos"),
        "eigh": lambda a: (lambda w, v: w[:, None] * jnp.abs(v))(*jsl.eigh(a)),
        "expm": lambda a: jsl.expm(a),
        "fft": lambda x: (
            jnp.abs(jnp.fft.fft(x, axis=0)) + jnp.real(jnp.fft.ifft(x, n=6, axis=0)[:4])
        ),
        "rfft irfft": lambda a, x: jnp.fft.irfft(jnp.fft.rfft(a * x), n=4),
        "convolve": lambda a, v: jnp.convolve(a, v) + jnp.convolve(a, v, "same")[:1].sum(),
        "correlate valid": lambda a, v: (
            jnp.correlate(a, v, "valid") + jnp.correlate(v, a, "same").sum()
        ),
        "signal convolve": lambda a, b: jsignal.convolve(a, b, mode="same", method="direct"),
        "pad": lambda x: jnp.pad(x, ((1, 0), (2, 1)), constant_values=0.5) ** 2,
        "running maximum": lambda x: jax.lax.cummax(x, axis=1) * jax.lax.cummin(x, axis=0),
        "matvec": lambda a, v: jnp.matvec(a, v) + jnp.vecmat(v, a) + jnp.vecdot(v, v),
    }


JAX_CASES = sorted(_jax_functions())


@pytest.mark.parametrize("name", JAX_CASES)
@pytest.mark.parametrize("layout", ["all batched, axis 1", "first batched, axis -1"])
def test_matches_jax_vmap(name, layout):
    case = CASES[name]
    nargs = len(case.draw(np.random.default_rng(0), 4))
    if layout.startswith("all"):
        batched, axes = (True,) * nargs, [1] * nargs
    else:
        batched, axes = (True,) + (False,) * (nargs - 1), [-1] * nargs
    _, args, in_axes = _batch(case, 3, batched, axes, seed=11, n=4)
    ours = gt.vmap(case.f, in_axes=in_axes)(*args)
    theirs = np.asarray(jax.vmap(_jax_functions()[name], in_axes=in_axes)(*args))
    if theirs.dtype.kind in "iub":
        theirs = theirs.astype(np.asarray(ours).dtype)
    _assert_same(ours, theirs, max(case.tol, 1e-9))


@pytest.mark.parametrize(
    "name", ["expm", "convolve", "correlate valid", "pad", "rfft irfft", "matvec", "fft"]
)
def test_per_example_gradients_match_jax(name):
    """vmap of grad in the first argument, against JAX's (for functions whose derivative
    has one convention: SciPy's solvers and eigh read one triangle of a matrix, and JAX
    symmetrizes, so their gradients in the matrix differ by convention)."""
    case = CASES[name]
    nargs = len(case.draw(np.random.default_rng(0), 4))
    _, args, in_axes = _batch(case, 3, (True,) * nargs, [0] * nargs, seed=12, n=4)
    ours = gt.vmap(gt.grad(lambda *a: np.sum(case.f(*a))), in_axes=in_axes)(*args)
    jf = _jax_functions()[name]
    theirs = jax.vmap(jax.grad(lambda *a: jnp.sum(jf(*a))), in_axes=in_axes)(*args)
    _assert_same(ours, np.asarray(theirs), 1e-8)
