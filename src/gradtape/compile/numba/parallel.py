"""Loops in parallel chunks: with more than one thread (set_num_threads), a flat loop of at
least 2 * PARALLEL_MIN_CHUNK elements runs as fixed chunks under `prange`.

Chunk c covers [size * c // nch, size * (c + 1) // nch); each has its own partial reductions,
added in chunk order afterwards: the result depends on the size and the thread setting only,
never on which thread ran what. Loops with matrix products chunk the same way (matmul.py).
"""

from __future__ import annotations

import re

from .scalar import numpy_type

PARALLEL_MIN_CHUNK = 16384  # elements per parallel chunk at least (a launch costs ~10 us)


def chunk_names(lines: list[str], names: list[str]) -> list[str]:
    """`lines` with each of `names` renamed to the chunk's own copy (`name_c`)."""
    for name in names:
        lines = [re.sub(rf"\b{name}\b", f"{name}_c", line) for line in lines]
    return lines


def combined(accumulators: list, nch: str, indent: str) -> list[str]:
    """The accumulators' per-chunk partial results (`acc_p[c]`), added in chunk order."""
    lines = []
    for acc, _, _, step, _ in accumulators:
        lines.append(f"{indent}for c in range({nch}):")
        lines.append(f"{indent}    {acc} = {step.format(a=acc, b=f'{acc}_p[c]')}")
    return lines


def parallel_loop(
    tmp: int, threads: int, size: str, inner: list[str], accumulators: list
) -> list[str]:
    """The flat loop over `size` elements with body `inner`, split into `nch` fixed chunks
    run by `prange` when large enough (see the module docstring). `accumulators` are the
    loop's reductions: (accumulator, initial value, finish, step template, dtype); `tmp`
    numbers the loop's names."""
    n = f"n{tmp}"
    nch = f"nch{tmp}"
    lines = [
        f"{n} = {size}",
        f"{nch} = min({threads}, {n} // {PARALLEL_MIN_CHUNK})",
        f"if {nch} <= 1:",
        f"    for i in range({n}):",
    ]
    lines.extend("        " + s for s in inner)
    lines.append("else:")
    renamed = chunk_names(inner, [acc for acc, *_ in accumulators])
    for acc, _, _, _, dt in accumulators:
        lines.append(f"    {acc}_p = np.empty({nch}, {numpy_type(dt)})")
    lines.append(f"    for c in prange({nch}):")
    lines.append("        prefer_wide_vectors()")
    # unsigned bounds: Numba then skips the negative-index wraparound (which would keep
    # LLVM from vectorizing the chunk's loop)
    lines.append(f"        lo = np.uint64(({n} * c) // {nch})")
    lines.append(f"        hi = np.uint64(({n} * (c + 1)) // {nch})")
    for acc, init, *_ in accumulators:
        lines.append(f"        {acc}_c = {init}")
    lines.append("        for i in range(lo, hi):")
    lines.extend("            " + s for s in renamed)
    for acc, *_ in accumulators:
        lines.append(f"        {acc}_p[c] = {acc}_c")
    return lines + combined(accumulators, nch, "    ")
