"""Where and with what the benchmark ran: thread pinning, versions, machine, date.

``pin_threads`` must run before jax, torch or numba are imported (the methods import them
lazily): most of these read their thread counts from the environment once, at import.  NumPy is
already loaded when the CLI runs (``import gradtape`` loads it), so its BLAS pool is limited
through threadpoolctl when that is installed.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import sys
from typing import Any

THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}
XLA_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
HEAVY_MODULES = ("jax", "torch", "numba")

REPORTED_DISTRIBUTIONS = (
    "gradtape",
    "numpy",
    "scipy",
    "numba",
    "llvmlite",
    "jax",
    "jaxlib",
    "torch",
    "autograd",
    "threadpoolctl",
    "rich",
    "matplotlib",
)

_blas_limiter: Any = None  # keeps threadpoolctl's limit alive for the whole run


def pin_threads() -> dict[str, Any]:
    """Pin every numerical system to one thread; return what was done, for the report."""
    global _blas_limiter
    already_imported = [m for m in HEAVY_MODULES if sys.modules.get(m) is not None]
    os.environ.update(THREAD_ENV)
    if XLA_THREAD_FLAGS not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_THREAD_FLAGS}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    report: dict[str, Any] = {
        "env": {k: os.environ[k] for k in (*THREAD_ENV, "XLA_FLAGS", "JAX_PLATFORMS")},
        "imported_before_pinning": already_imported,
    }
    try:
        import threadpoolctl
    except ImportError:
        report["blas"] = "threadpoolctl not installed: NumPy's BLAS pool keeps its size"
    else:
        _blas_limiter = threadpoolctl.threadpool_limits(limits=1)
        report["blas"] = [
            {"api": pool.get("internal_api"), "num_threads": pool.get("num_threads")}
            for pool in threadpoolctl.threadpool_info()
        ]
    numba = sys.modules.get("numba")
    if numba is not None:
        numba.set_num_threads(1)
    return report


def runtime_thread_counts() -> dict[str, int]:
    """Thread counts the loaded systems report now (after the run), as a check of the pinning."""
    counts: dict[str, int] = {}
    torch, numba = sys.modules.get("torch"), sys.modules.get("numba")
    if torch is not None:
        counts["torch_intra_op"] = torch.get_num_threads()
        counts["torch_inter_op"] = torch.get_num_interop_threads()
    if numba is not None:
        counts["numba"] = numba.get_num_threads()
    return counts


def versions(distributions: tuple[str, ...] = REPORTED_DISTRIBUTIONS) -> dict[str, str]:
    """Installed versions (from package metadata, without importing), 'not installed' if absent."""
    found = {"python": platform.python_version()}
    for name in distributions:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """CPU model, core counts and OS of this machine."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "platform": platform.platform(),
    }


def now_utc() -> str:
    """The current date and time, ISO 8601 in UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
