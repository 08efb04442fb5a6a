"""Hamiltonian Monte Carlo over data held by a Dask cluster, with gradtape.dask's gradients.

Run: python examples/dask_hmc.py [n_rows]
Needs: pip install "gradtape[dask,numba]"

The Bayesian logistic regression and the sampler of ``hmc_logistic.py``, with the data in a
Dask array split into row blocks on a ``LocalCluster`` (two worker processes, one thread
each). The log-likelihood is written for one block of rows in plain NumPy; every gradient
is one round trip to the cluster, in which each worker runs the compiled per-block function
on the blocks it holds and the partial sums are added on the workers. The prior is added
once, on the client. The same chain (same seed) is then run with the data in memory: the
draws agree, and the draws per second show what the round trips cost at this size.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hmc_logistic import PRIOR_SCALE, hmc, make_data  # noqa: E402  (the sampler, the data)

import gradtape as gt  # noqa: E402
import gradtape.dask as gtd  # noqa: E402


def block_log_likelihood(w, X, y):
    """Log-likelihood of one block of rows: plain NumPy, summed over the blocks by Dask."""
    logits = X @ w
    return np.sum(y * logits - np.logaddexp(0.0, logits))


def with_prior(likelihood, X, y):
    """w -> (log posterior, gradient): the block sum from `likelihood`, the prior added once."""

    def log_posterior_and_gradient(w):
        value, gradient = likelihood(w, X, y)
        return value - 0.5 * w @ w / PRIOR_SCALE**2, gradient - w / PRIOR_SCALE**2

    return log_posterior_and_gradient


def main(
    n_rows: int = 100_000,
    n_features: int = 5,
    n_blocks: int = 4,
    n_draws: int = 100,
    n_warmup: int = 100,
    client: Any = None,
) -> dict[str, Any]:
    """Sample on the cluster (a new LocalCluster unless `client` is given), then in memory."""
    import dask.array as da
    from distributed import Client, LocalCluster

    X, y, true_w = make_data(n_rows, n_features)
    w0 = np.zeros(X.shape[1])
    rows = -(-n_rows // n_blocks)
    on_cluster = gtd.value_and_grad(block_log_likelihood, data_argnums=(1, 2))

    def sample_on(active_client) -> Any:
        Xd = da.from_array(X, chunks=(rows, X.shape[1])).persist()
        yd = da.from_array(y, chunks=rows).persist()
        on_cluster(w0, Xd, yd)  # every worker records and compiles the block function
        active_client.run(gt.wait_for_native)  # and has its native code before timing
        return hmc(with_prior(on_cluster, Xd, yd), w0, n_draws, n_warmup)

    started = time.perf_counter()
    if client is None:
        with (
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
            Client(cluster) as own_client,
        ):
            dask_chain = sample_on(own_client)
    else:
        dask_chain = sample_on(client)
    cluster_seconds = time.perf_counter() - started
    in_memory = gt.compile(gt.value_and_grad(block_log_likelihood))
    memory_chain = hmc(with_prior(in_memory, X, y), w0, n_draws, n_warmup)

    print(
        f"Bayesian logistic regression, {n_rows} rows x {n_features} features + intercept, "
        f"{n_blocks} row blocks; HMC, {n_warmup} warm-up + {n_draws} draws, "
        f"{dask_chain.n_leapfrog} leapfrog steps each"
    )
    for name, chain in (("gradtape.dask", dask_chain), ("in memory", memory_chain)):
        print(
            f"  {name:<14} {chain.draws_per_second:8.1f} draws/s "
            f"({chain.draws_per_second * chain.n_leapfrog:7.0f} gradients/s), "
            f"acceptance {chain.acceptance_rate:.2f}"
        )
    print(f"  cluster start, data, compile and sampling: {cluster_seconds:.1f} s")
    print("  posterior mean: " + " ".join(f"{v:7.3f}" for v in dask_chain.draws.mean(0)))
    print("  true weights:   " + " ".join(f"{v:7.3f}" for v in true_w))
    difference = np.max(np.abs(dask_chain.draws - memory_chain.draws))
    print(f"  largest difference between the two chains' draws: {difference:.1e}")
    return {"dask_chain": dask_chain, "memory_chain": memory_chain, "true_w": true_w}


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:2]))
