"""Matrix products in kernels: row products and column accumulations inside loops, by blocks
of rows, and a matmul between loops as explicit loops (or BLAS, for large ones).

A loop with matrix products (fusion.py) runs by blocks of ROW_BLOCK rows: the block's row
products `M @ v` into buffers, then the elementwise loop (it reads the products and writes
the weights of the column accumulations `g @ M` into buffers), then the column accumulations.
`X @ w`, the elementwise work and `X.T @ r` thus read X from memory once. The functions here
take the kernel writer `w` (kernel.py) for names, arguments and the thread setting.

**Small products.** A product of a constant matrix with at most SMALL_PRODUCT_COLUMNS
columns (a regression's design matrix of a few predictors, X of shape (N, k)) is not blocked:
the kernel receives the matrix once as k contiguous columns (a (k, N) copy made when the
kernel is generated; a matrix of more than SMALL_PRODUCT_MAX_ELEMENTS elements is not
copied, its products stay blocked), and the product is a plain member of the loop over the
N rows. The row product `X @ v` is an expression per row (`X[:, 0][i] * v0 + ... +
X[:, k-1][i] * v(k-1)`, the vector's k elements read before the loop), the column
accumulation `g @ X` is k accumulators of the loop (`r_j += g[i] * X[:, j][i]`). Every
stream is contiguous along the loop, so the loop vectorizes (a row of 5 elements read across
rows does not: stride-5 gathers), and both products and all the elementwise work between
them read each column once per pass (the guide's sampling section has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...core.ir import Instruction
from ...rules.linalg import matmul_p
from .parallel import PARALLEL_MIN_CHUNK, chunk_names, combined
from .scalar import literal, numpy_type

SMALL_PRODUCT_COLUMNS = 8  # a constant matrix of at most this many columns: a small product
# ... and at most this many elements (its columns are a copy: 32 MB at most in float64; a
# larger matrix is read in place by blocked products, its memory not doubled)
SMALL_PRODUCT_MAX_ELEMENTS = 1 << 22
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


@dataclass(frozen=True)
class SmallProduct:
    """A product of a constant matrix with few columns (see the module docstring).

    `kind` is "row" (the result has one element per row of the long axis: `X @ v`, `v @
    X.T`) or "column" (the result has one element per column: `g @ X`, `X.T @ g`); `vector`
    is the position of the traced operand; `matrix` the constant as given, `columns_first`
    whether it is already (k, N) (k columns, each a contiguous row of it)."""

    kind: str
    vector: int
    matrix: np.ndarray
    columns_first: bool

    @property
    def k(self) -> int:
        """The number of columns (the short axis)."""
        return self.matrix.shape[0 if self.columns_first else 1]

    @property
    def length(self) -> int:
        """The number of rows (the long axis, the loop's)."""
        return self.matrix.shape[1 if self.columns_first else 0]


def small_product(ins: Instruction) -> SmallProduct | None:
    """The small product of a matmul of a traced vector with a constant matrix of one
    floating dtype whose short axis has at most SMALL_PRODUCT_COLUMNS elements and whose
    long axis more, else None."""
    if ins.prim is not matmul_p or len(ins.outvars) != 1 or len(ins.invars) != 2:
        return None
    out = ins.outvars[0]
    if out.dtype.kind != "f" or len(out.shape) != 1:
        return None
    for vector in (0, 1):
        v, matrix = ins.invars[vector], ins.args[1 - vector]
        if v is None or ins.invars[1 - vector] is not None:
            continue
        if not isinstance(matrix, np.ndarray) or matrix.ndim != 2 or len(v.shape) != 1:
            continue
        if matrix.dtype != out.dtype or v.dtype != out.dtype:
            continue
        if matrix.size > SMALL_PRODUCT_MAX_ELEMENTS:
            continue
        contracted = 1 if vector == 1 else 0  # M @ v contracts M's axis 1, v @ M its axis 0
        free = 1 - contracted
        short, long_ = (
            (free, contracted)
            if matrix.shape[free] <= SMALL_PRODUCT_COLUMNS
            else (contracted, free)
        )
        if not (
            matrix.shape[short] <= SMALL_PRODUCT_COLUMNS < matrix.shape[long_]
            and matrix.shape[short] >= 1
        ):
            continue
        # the result runs along the long axis: a row product, else a column accumulation
        kind = "row" if long_ == free else "column"
        return SmallProduct(kind, vector, matrix, columns_first=short == 0)
    return None


def columns_of(gen, product: SmallProduct) -> np.ndarray:
    """The constant matrix of `product` as k contiguous columns ((k, N), C order): one copy
    per matrix contents in a generated module (the product and its transpose in the
    backward pass read the same columns)."""
    import hashlib

    m = product.matrix
    key = (m.shape, m.dtype.str, product.columns_first, hashlib.sha256(m.tobytes()).digest())
    found = gen.small_columns.get(key)
    if found is None:
        found = gen.small_columns[key] = np.ascontiguousarray(m if product.columns_first else m.T)
    return found


def small_row_step(w, ins: Instruction, product: SmallProduct, reads) -> str:
    """The loop-body line of a small row product: the vector's elements read before the
    loop, one column element per term."""
    out = ins.outvars[0]
    vid = out.id
    vector = w.op_operand(ins.invars[product.vector], None)
    columns = w.const_array(columns_of(w.gen, product))
    index = reads.flat_index()
    terms = []
    for j in range(product.k):
        reads.pre.append(f"vs{vid}_{j} = {vector}[{j}]")
        terms.append(f"{reads.load(f'{columns}[{j}, {index}]')} * vs{vid}_{j}")
    return f"v{vid} = {pairwise_sum(terms)}"


def small_column_step(
    w, ins: Instruction, product: SmallProduct, reads, accumulators: list
) -> list[str]:
    """The loop-body lines of a small column accumulation: k accumulators of the loop
    (combined like a reduction's across parallel chunks), written into the result after it."""
    out = ins.outvars[0]
    vid, dtype = out.id, out.dtype
    columns = w.const_array(columns_of(w.gen, product))
    g = reads.access(ins.invars[product.vector])
    index = reads.flat_index()
    reads.pre.append(f"a{vid} = np.empty(({product.k}, ), {numpy_type(dtype)})")
    lines = []
    for j in range(product.k):
        acc = f"r{vid}_{j}"
        reads.pre.append(f"{acc} = {literal(0.0, dtype)}")
        step = "reduce_add({a}, {b})"
        accumulators.append((acc, literal(0.0, dtype), f"a{vid}[{j}] = {acc}", step, dtype))
        term = f"({g} * {reads.load(f'{columns}[{j}, {index}]')})"
        lines.append(f"{acc} = {step.format(a=acc, b=term)}")
    return lines


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
    """A blocked row product or column accumulation of a loop (fusion.py): a matmul with a
    1-d result that is not a small product."""
    return ins.prim is matmul_p and len(ins.outvars[0].shape) == 1 and small_product(ins) is None


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
