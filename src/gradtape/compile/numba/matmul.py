"""Matrix products in kernels: row products and column accumulations inside loops, by blocks
of rows, and a matmul between loops as explicit loops (or BLAS, for large ones).

A loop with matrix products (fusion.py) runs by blocks of ROW_BLOCK rows: the block's row
products `M @ v` into buffers, then the elementwise loop (it reads the products and writes
the weights of the column accumulations `g @ M` into buffers), then the column accumulations.
`X @ w`, the elementwise work and `X.T @ r` thus read X from memory once. The functions here
take the kernel writer `w` (kernel.py) for names, arguments and the thread setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...core.ir import Instruction
from ...rules.linalg import matmul_p
from .parallel import PARALLEL_MIN_CHUNK, chunk_names, combined
from .scalar import literal, numpy_type

ROW_BLOCK = 256  # rows per block of a loop with matrix products (its row buffers stay in L1)
ROW_GROUP = 4  # rows per pass of a product's inner loop (four independent sums)
BLAS_MIN_WORK = 32**3  # multiply-adds from which a matrix-matrix product calls BLAS (np.dot)


@dataclass
class LoopProducts:
    """The row products and column accumulations of one loop (written by blocked_loop)."""

    rows: list[tuple[int, np.dtype]] = field(default_factory=list)  # (var id, dtype)
    # (var id, dtype, length expression, matrix transposed: read M[j, r] instead of M[r, j])
    columns: list[tuple[int, np.dtype, str, bool]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)


def blas_matmul(ins: Instruction) -> bool:
    """A matrix-matrix product large enough for BLAS to pay (np.dot): the loops written
    instead do not block for the caches, and a kernel calling BLAS costs Numba about 1.5 s
    more to compile (its BLAS bindings) and keeps its loops serial (see codegen.generate)."""
    shapes = [v.shape if v is not None else np.shape(a) for v, a in zip(ins.invars, ins.args)]
    return (
        ins.prim is matmul_p
        and all(len(s) == 2 for s in shapes)
        and shapes[0][0] * shapes[0][1] * shapes[1][1] >= BLAS_MIN_WORK
    )


def matrix_member(ins: Instruction) -> bool:
    """A row product or column accumulation of a loop (fusion.py): a matmul with a 1-d result."""
    return ins.prim is matmul_p and len(ins.outvars[0].shape) == 1


def pairwise_sum(terms: list[str]) -> str:
    """The sum of `terms` as a balanced tree of additions (source text)."""
    while len(terms) > 1:
        terms = [
            f"({terms[k]} + {terms[k + 1]})" if k + 1 < len(terms) else terms[k]
            for k in range(0, len(terms), 2)
        ]
    return terms[0]


# --- products in loops --------------------------------------------------------------------------
def matrix_step(w, ins: Instruction, access, pre: list[str], products: LoopProducts) -> str:
    """The loop-body line of a row product or a column accumulation (fusion.py), which
    blocked_loop computes around the elementwise loop; operands are bound before it (`pre`)."""
    out = ins.outvars[0]
    vid, dtype = out.id, numpy_type(out.dtype)
    operand = [lambda k=k: w.op_operand(ins.invars[k], ins.args[k]) for k in (0, 1)]
    if vid not in w.plan.reductions:  # row product M @ v: computed per block
        pre.extend([f"mx{vid} = {operand[0]()}", f"vx{vid} = {operand[1]()}"])
        products.rows.append((vid, out.dtype))
        return f"v{vid} = zb{vid}[i - u0]"
    vector_first = (
        len(ins.invars[0].shape if ins.invars[0] is not None else np.shape(ins.args[0])) == 1
    )  # g @ M, else M @ g
    g = ins.invars[0 if vector_first else 1]
    length = f"mx{vid}.shape[{1 if vector_first else 0}]"
    # explicit zeros: under parallel=True, np.zeros would become a parallel region
    pre.extend(
        [
            f"mx{vid} = {operand[1 if vector_first else 0]()}",
            f"qa{vid} = np.empty({length}, {dtype})",
            f"for j in range({length}):",
            f"    qa{vid}[j] = {literal(0.0, out.dtype)}",
        ]
    )
    products.columns.append((vid, out.dtype, length, not vector_first))
    products.finish.append(f"a{vid} = qa{vid}")
    return f"gb{vid}[i - u0] = {access(g)}"


def blocked_loop(
    w, size: str, inner: list[str], accumulators: list, products: LoopProducts
) -> list[str]:
    """A flat loop with matrix products, by blocks of ROW_BLOCK rows (see the module
    docstring). With threads, chunks of blocks run in parallel as in parallel.py; each chunk
    has its own accumulated vectors, added in chunk order afterwards (deterministic)."""
    buffers = [(f"zb{vid}", dt) for vid, dt in products.rows] + [
        (f"gb{vid}", dt) for vid, dt, *_ in products.columns
    ]
    n = f"n{w.tmp}"
    serial = [
        f"{name} = np.empty({ROW_BLOCK}, {numpy_type(dt)})" for name, dt in buffers
    ] + block_pass("0", n, inner, products, "")
    lines = [f"{n} = {size}"]
    if w.gen.threads <= 1:
        return lines + serial
    nch = f"nch{w.tmp}"
    work = " + ".join(
        [f"mx{vid}.shape[1]" for vid, _ in products.rows]
        + [length for _, _, length, _ in products.columns]
    )
    lines += [
        f"{nch} = min({w.gen.threads}, ({n} * ({work})) // {PARALLEL_MIN_CHUNK})",
        f"if {nch} <= 1:",
    ]
    lines += ["    " + line for line in serial]
    lines.append("else:")
    for acc, _, _, _, dt in accumulators:
        lines.append(f"    {acc}_p = np.empty({nch}, {numpy_type(dt)})")
    for vid, dt, length, _ in products.columns:
        lines.append(f"    qa{vid}_p = np.empty(({nch}, {length}), {numpy_type(dt)})")
    lines.append(f"    for c in prange({nch}):")
    lines += ["        " + line for line in _chunk(n, nch, inner, accumulators, products, buffers)]
    lines += combined(accumulators, nch, "    ")
    for vid, _, length, _ in products.columns:
        lines += [
            f"    for c in range({nch}):",
            f"        for j in range({length}):",
            f"            qa{vid}[j] += qa{vid}_p[c, j]",
        ]
    return lines


def _chunk(
    n: str, nch: str, inner: list[str], accumulators: list, products: LoopProducts, buffers: list
) -> list[str]:
    """The body of chunk c of a blocked loop in parallel: its own accumulators and buffers
    (names ending in _c), its rows, then its partial results into the per-chunk arrays."""
    renamed = chunk_names(inner, [acc for acc, *_ in accumulators] + [name for name, _ in buffers])
    chunk = ["prefer_wide_vectors()", f"lo = ({n} * c) // {nch}", f"hi = ({n} * (c + 1)) // {nch}"]
    chunk += [f"{acc}_c = {init}" for acc, init, *_ in accumulators]
    chunk += [f"{name}_c = np.empty({ROW_BLOCK}, {numpy_type(dt)})" for name, dt in buffers]
    for vid, dt, length, _ in products.columns:
        chunk += [
            f"qa{vid}_c = np.empty({length}, {numpy_type(dt)})",
            f"for j in range({length}):",
            f"    qa{vid}_c[j] = {literal(0.0, dt)}",
        ]
    chunk += block_pass("lo", "hi", renamed, products, "_c")
    chunk += [f"{acc}_p[c] = {acc}_c" for acc, *_ in accumulators]
    for vid, _, length, _ in products.columns:
        chunk += [f"for j in range({length}):", f"    qa{vid}_p[c, j] = qa{vid}_c[j]"]
    return chunk


def block_pass(
    lo: str, hi: str, inner: list[str], products: LoopProducts, suffix: str
) -> list[str]:
    """Rows lo .. hi by blocks (see blocked_loop); `suffix` names a chunk's buffers."""
    # unsigned row indices, as in parallel_loop: Numba then skips the negative-index
    # wraparound (measured: 10-15% of the time of X @ w and X.T @ r)
    body = [
        f"i1 = min(i0 + {ROW_BLOCK}, {hi})",
        "u0 = np.uint64(i0)",
        "u1 = np.uint64(i1)",
        f"u4 = np.uint64(i1 - (i1 - i0) % {ROW_GROUP})",
    ]
    for vid, dt in products.rows:
        body += row_groups(lambda rows, vid=vid, dt=dt: row_product_group(vid, dt, rows, suffix))
    body.append("for i in range(u0, u1):")
    body += ["    " + line for line in inner]
    for vid, _, length, transposed in products.columns:
        body += row_groups(
            lambda rows, vid=vid, length=length, transposed=transposed: column_group(
                vid, length, transposed, rows, suffix
            )
        )
    return [f"for i0 in range({lo}, {hi}, {ROW_BLOCK}):"] + ["    " + line for line in body]


def row_groups(group) -> list[str]:
    """The rows u0 .. u1 of a block, ROW_GROUP at a time, then one at a time; `group(rows)`
    writes the statements for the rows `rows` (index expressions)."""
    lines = []
    for start, stop, size in (("u0", "u4", ROW_GROUP), ("u4", "u1", 1)):
        step = f", np.uint64({size})" if size > 1 else ""
        lines.append(f"for r in range({start}, {stop}{step}):")
        rows = ["r"] + [f"r + np.uint64({k})" for k in range(1, size)]
        lines += ["    " + line for line in group(rows)]
    return lines


def row_product_group(vid: int, dtype: np.dtype, rows: list[str], suffix: str) -> list[str]:
    """Dot products of some rows of M with v: independent sums, which overlap in the CPU,
    reassociable so that long rows vectorize (measured: k = 64 rows 1.6x faster)."""
    lines = [f"y{k} = {literal(0.0, dtype)}" for k in range(len(rows))]
    lines += [f"for j in range(mx{vid}.shape[1]):", f"    xj = vx{vid}[j]"]
    lines += [f"    y{k} = reduce_add(y{k}, mx{vid}[{row}, j] * xj)" for k, row in enumerate(rows)]
    lines += [f"zb{vid}{suffix}[{row} - u0] = y{k}" for k, row in enumerate(rows)]
    return lines


def column_group(
    vid: int, length: str, transposed: bool, rows: list[str], suffix: str
) -> list[str]:
    """Some rows of M, scaled by their weights, added to the accumulated vector."""
    lines = [f"h{k} = gb{vid}{suffix}[{row} - u0]" for k, row in enumerate(rows)]
    terms = [
        f"h{k} * mx{vid}[{f'j, {row}' if transposed else f'{row}, j'}]"
        for k, row in enumerate(rows)
    ]
    lines += [f"for j in range({length}):", f"    qa{vid}{suffix}[j] += {pairwise_sum(terms)}"]
    return lines


# --- a matmul between loops ---------------------------------------------------------------------
def emit_matmul(w, ins: Instruction, target: str, args: list[str]) -> list[str]:
    """A matmul op: explicit loops, or np.dot (BLAS) for a large matrix-matrix product."""
    if not blas_matmul(ins):
        return matmul_loops(ins, args[0], args[1], target)
    a = w.contiguous(ins.invars[0], args[0])
    b = w.contiguous(ins.invars[1], args[1])
    return w.assign(ins, target, f"np.dot({a}, {b})")


def matmul_loops(ins: Instruction, a: str, b: str, target: str) -> list[str]:
    """A matmul as explicit loops (see blas_matmul): rows of b, scaled by elements of a,
    added into the result's rows (the inner loop is contiguous and vectorizes)."""
    out = ins.outvars[0]
    a_2d, b_2d = (
        len(v.shape if v is not None else np.shape(x)) == 2 for v, x in zip(ins.invars, ins.args)
    )
    rows = f"{a}.shape[0]" if a_2d else "1"
    cols = f"{b}.shape[1]" if b_2d else "1"
    acc = f"p{out.id}"
    lines = [
        f"{acc} = np.zeros(({rows}, {cols}), {numpy_type(out.dtype)})",
        f"for im in range({rows}):",
        f"    for jm in range({a}.shape[{1 if a_2d else 0}]):",
        f"        am = {a}[{'im, jm' if a_2d else 'jm'}]",
        f"        for lm in range({cols}):",
        f"            {acc}[im, lm] += am * {b}[{'jm, lm' if b_2d else 'jm'}]",
    ]
    if out.shape == ():
        return lines + [f"{target} = {acc}[0, 0]"]
    if a_2d and b_2d:
        return lines + [f"{target} = {acc}"]
    return lines + [f"{target} = {acc}.reshape(({rows if a_2d else cols},))"]


def accepts_matmul(ins: Instruction) -> bool:
    """Operands of one floating dtype (the output's), 1-d or 2-d, traced or constant arrays."""
    out = ins.outvars[0]
    shapes = [v.shape if v is not None else np.shape(a) for v, a in zip(ins.invars, ins.args)]
    dtypes = {
        v.dtype if v is not None else np.asarray(a).dtype for v, a in zip(ins.invars, ins.args)
    }
    return (
        dtypes == {out.dtype}
        and out.dtype.kind == "f"
        and all(1 <= len(s) <= 2 for s in shapes)
        and all(v is not None or isinstance(a, np.ndarray) for v, a in zip(ins.invars, ins.args))
    )
