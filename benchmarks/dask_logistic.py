"""Logistic-regression gradients over a chunked Dask array on a LocalCluster.

Times one gradient (median of repeated calls after warm-up) three ways on the same data:

* gradtape.dask.value_and_grad of the one-block NumPy loss, compiled on the workers;
* dask-glm's hand-written gradient (``dask_glm.families.Logistic``) on the same persisted
  Dask arrays and cluster (a gradient only: gradtape's figure includes the value too);
* the in-process compiled gradient (``gradtape.compile(gradtape.value_and_grad(loss))``)
  on the same data held in memory as NumPy arrays: the overhead of going through Dask.

Run:  python benchmarks/dask_logistic.py [--rows 1000000] [--features 20] [--blocks 8]
Needs: pip install "gradtape[dask,numba]" dask-glm
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def loss(w, X, y):
    z = X @ w
    return np.sum(np.logaddexp(0.0, z) - y * z)


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    import gradtape as gt
    import gradtape.dask as gtd

    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.rows, args.features))
    w_true = rng.normal(size=args.features) / np.sqrt(args.features)
    y = (rng.uniform(size=args.rows) < 1 / (1 + np.exp(-X @ w_true))).astype(float)
    w = np.full(args.features, 0.1)
    rows = -(-args.rows // args.blocks)

    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=None) as cl,
        Client(cl) as client,
    ):
        Xd = da.from_array(X, chunks=(rows, args.features)).persist()
        yd = da.from_array(y, chunks=rows).persist()
        client.wait_for_workers(args.workers)

        vg = gtd.value_and_grad(loss, data_argnums=(1, 2))
        start = time.perf_counter()
        vg(w, Xd, yd)
        first = time.perf_counter() - start
        for _ in range(10):  # the workers' native code arrives in the background
            vg(w, Xd, yd)
        client.run(gt.wait_for_native)  # every worker's background compiles are done
        vg(w, Xd, yd)
        t_gradtape = median_time(lambda: vg(w, Xd, yd), args.repeat)

        results = {"gradtape.dask (value and gradient)": t_gradtape}
        try:
            from dask_glm.families import Logistic

            def dask_glm_gradient():
                return Logistic.gradient(Xd.dot(w), Xd, yd).compute()

            np.testing.assert_allclose(dask_glm_gradient(), vg(w, Xd, yd)[1], rtol=1e-8)
            dask_glm_gradient()
            results["dask-glm hand-written (gradient only)"] = median_time(
                dask_glm_gradient, args.repeat
            )
        except ImportError:
            print("dask-glm is not installed: pip install dask-glm to compare with it")

    compiled = gt.compile(gt.value_and_grad(loss))
    for _ in range(10):
        compiled(w, X, y)
    gt_wait = getattr(gt, "wait_for_native", None)
    if gt_wait is not None:
        gt_wait()
    results["in-process compiled, in memory"] = median_time(lambda: compiled(w, X, y), args.repeat)

    print(
        f"logistic regression, {args.rows} rows x {args.features} features, {args.blocks} "
        f"blocks, {args.workers} workers x 1 thread; dask {dask.__version__}"
    )
    print(f"first gradtape.dask call (workers record and compile): {first * 1e3:.0f} ms")
    base = results["gradtape.dask (value and gradient)"]
    for name, seconds in results.items():
        print(f"  {name:40s} {seconds * 1e3:9.2f} ms   ratio to gradtape.dask {seconds / base:.2f}")


if __name__ == "__main__":
    main()
