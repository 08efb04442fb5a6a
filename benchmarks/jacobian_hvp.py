"""Jacobians of f: R^100 -> R^100 and Hessian-vector products at N=1000.

Run: python benchmarks/jacobian_hvp.py
Prints medians (milliseconds) of gradtape's jacfwd/jacrev/jacobian against JAX (jacfwd and
jacrev, with and without jit) and HIPS autograd's jacobian, with the ratio gradtape / peer;
then hvp at N=1000 in units of one gradient of the same function, for each library.
Single-threaded BLAS, float64 everywhere; every result is checked against gradtape's.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import statistics  # noqa: E402
import timeit  # noqa: E402

import numpy as onp  # noqa: E402

import gradtape as gt  # noqa: E402

N_JAC = 100
N_HVP = 1000
RNG = onp.random.default_rng(0)
W = RNG.normal(size=(N_JAC, N_JAC)) / 10
B = RNG.normal(size=N_JAC)


def layer(np):
    """A dense layer with a residual: tanh(W x + b) + x^3 / 10 (a matrix product)."""
    def f(x):
        return np.tanh(W @ x + B) + 0.1 * x**3
    return f


def elementwise(np):
    """Elementwise work, a reversal and a cumulative sum (no matrix product)."""
    def f(x):
        y = np.sin(x) * np.exp(-0.5 * x * x) + x[::-1] * 0.3
        return np.cumsum(y) / (1.0 + x * x)
    return f


def rosenbrock(np):
    def f(x):
        return np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
    return f


def logistic(np):
    """Logistic regression log-likelihood, 2000 observations, N_HVP coefficients."""
    rng = onp.random.default_rng(1)
    X = rng.normal(size=(2000, N_HVP)) / onp.sqrt(N_HVP)
    y = (rng.random(2000) < 0.5).astype(float)

    def f(beta):
        z = X @ beta
        return np.sum(y * z - np.logaddexp(0.0, z))
    return f


def median_ms(fn, repeat: int = 9) -> float:
    fn()  # warm up (jit compilation, caches)
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return statistics.median(t / number for t in timer.repeat(repeat, number)) * 1e3


def peers():
    """Peer implementations that are installed: name -> (numpy module, transforms)."""
    out = {}
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_platform_name", "cpu")
        import jax.numpy as jnp

        out["jax"] = (jnp, jax)
    except ImportError:
        pass
    try:
        import autograd
        import autograd.numpy as anp

        out["autograd"] = (anp, autograd)
    except ImportError:
        pass
    return out


def jacobian_rows(make, x) -> list:
    """(label, ms, value) for every Jacobian implementation."""
    f = make(onp)
    rows = [("gradtape jacfwd", gt.jacfwd(f)), ("gradtape jacrev", gt.jacrev(f)),
            ("gradtape jacobian(auto)", gt.jacobian(f))]
    found = peers()
    if "jax" in found:
        jnp, jax = found["jax"]
        fj = make(jnp)
        xj = jnp.asarray(x)
        for name, tr in (("jacfwd", jax.jacfwd), ("jacrev", jax.jacrev)):
            plain = tr(fj)
            jitted = jax.jit(tr(fj))
            rows.append((f"jax {name}", lambda p=plain: p(xj).block_until_ready()))
            rows.append((f"jax jit({name})", lambda j=jitted: j(xj).block_until_ready()))
    if "autograd" in found:
        anp, autograd = found["autograd"]
        rows.append(("autograd jacobian", autograd.jacobian(make(anp))))
    out = []
    for label, fn in rows:
        call = fn if label.startswith("jax") else (lambda fn=fn: fn(x))
        out.append((label, median_ms(call), onp.asarray(call())))
    return out


def hvp_rows(make, x, v) -> list:
    """(library, ms hvp, ms grad, value) for gradtape and each peer."""
    f = make(onp)
    out = [("gradtape", median_ms(lambda: gt.hvp(f, x, v)),
            median_ms(lambda: gt.grad(f)(x)), gt.hvp(f, x, v))]
    found = peers()
    if "jax" in found:
        jnp, jax = found["jax"]
        fj = make(jnp)
        xj, vj = jnp.asarray(x), jnp.asarray(v)

        def hvp_j(x, v):
            return jax.jvp(jax.grad(fj), (x,), (v,))[1]

        g, gj = jax.grad(fj), jax.jit(jax.grad(fj))
        hj = jax.jit(hvp_j)
        out.append(("jax", median_ms(lambda: hvp_j(xj, vj).block_until_ready()),
                    median_ms(lambda: g(xj).block_until_ready()), onp.asarray(hvp_j(xj, vj))))
        out.append(("jax jit", median_ms(lambda: hj(xj, vj).block_until_ready()),
                    median_ms(lambda: gj(xj).block_until_ready()), onp.asarray(hj(xj, vj))))
    if "autograd" in found:
        anp, autograd = found["autograd"]
        fa = make(anp)
        hvp_a = autograd.hessian_vector_product(fa)
        ga = autograd.grad(fa)
        out.append(("autograd", median_ms(lambda: hvp_a(x, v)), median_ms(lambda: ga(x)),
                    hvp_a(x, v)))
    return out


def main() -> None:
    x = RNG.normal(size=N_JAC) * 0.5
    for make in (layer, elementwise):
        rows = jacobian_rows(make, x)
        ref = rows[0][2]
        print(f"\nJacobian of {make.__name__}: R^{N_JAC} -> R^{N_JAC} "
              f"({make.__doc__.strip()})")
        print(f"  {'method':26s} {'median ms':>10s}   gradtape jacfwd / method")
        for label, ms, value in rows:
            assert onp.allclose(value, ref, rtol=1e-9, atol=1e-12), label
            print(f"  {label:26s} {ms:10.3f}   {rows[0][1] / ms:8.2f}x")
    for make in (rosenbrock, logistic):
        x = RNG.uniform(-1, 1.5, N_HVP)
        v = RNG.normal(size=N_HVP)
        rows = hvp_rows(make, x, v)
        print(f"\nHessian-vector product of {make.__name__} at N={N_HVP}")
        print(f"  {'library':10s} {'hvp ms':>9s} {'grad ms':>9s}   hvp in gradients")
        for label, ms_hvp, ms_grad, value in rows:
            assert onp.allclose(value, rows[0][3], rtol=1e-9, atol=1e-9), label
            print(f"  {label:10s} {ms_hvp:9.3f} {ms_grad:9.3f}   {ms_hvp / ms_grad:8.2f}")


if __name__ == "__main__":
    main()
