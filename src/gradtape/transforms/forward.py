"""Forward mode: the forward interpreter of a tape, and jvp and jacfwd.

A function is recorded once on a tape, at a differentiating level exactly as for
`grad`; `forward` then pushes tangents through the tape with each primitive's JVP
rule. The rules are written with NumPy calls, so where the recorded values are
Tracers of an outer level the rules are recorded there: that is how jvp nests in
grad and grad in jvp, with no perturbation confusion (each call owns its level).

A Jacobian is one recorded pass: the tangents carry a leading batch axis, one
direction per row. Rules declared `jvp_batched` take the whole batch at once;
any other rule is applied one direction at a time, on the same single tape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import GradtapeError
from ..core.ir import Instruction, Tape, Var
from ..core.pytree import TreeDef, tree_flatten, tree_map, tree_unflatten
from ..core.tracing import Level, LevelKind, Tracer, new_level
from ..rules._complex import check_complex
from ..rules._util import dtype_of, shape_of
from . import arguments
from .reverse import (
    _check_differentiable,
    _lower,
    _normalize_argnums,
    _trace_call,
    cast_to,
    name_forward_line,
)

# the largest batch of tangents pushed at once, in elements of the largest tape variable
_MAX_BATCH_ELEMENTS = 1 << 22


# --- the forward interpreter ------------------------------------------------------------------
def forward(tape: Tape, tangents: dict, keep: set | None = None, batch: int | None = None) -> dict:
    """Push tangents of input vars (var id -> tangent) through `tape`; returns var id -> tangent.

    A var with no tangent has a zero one, and an instruction with no input tangent is
    skipped. With `batch`, every tangent has a leading axis of that length (one direction
    per row). Tangents of vars not in `keep` are freed after their last use (keep=None:
    every tangent is kept).
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _forward(tape, tangents, keep, batch)


def _forward(tape: Tape, tangents: dict, keep: set | None, batch: int | None) -> dict:
    dead = _dead_after(tape) if keep is not None else {}
    for k, ins in enumerate(tape.instructions):
        ts = [None if v is None else tangents.get(v.id) for v in ins.invars]
        if any(t is not None for t in ts):
            try:
                out = _apply_jvp(ins, ts, batch)
            except Exception as error:
                name_forward_line(error, ins)
                raise
            if ins.prim.multiple_results:
                for v, t in zip(ins.outvars, out if out is not None else ()):
                    _store(tangents, v, t, batch, ins)
            else:
                _store(tangents, ins.outvars[0], out, batch, ins)
        for vid in dead.get(k, ()):
            if vid not in keep:
                tangents.pop(vid, None)
    return tangents


def _dead_after(tape: Tape) -> dict:
    """instruction index -> ids of the vars it reads for the last time."""
    last: dict = {}
    for k, ins in enumerate(tape.instructions):
        for v in ins.invars:
            if v is not None:
                last[v.id] = k
    dead: dict = {}
    for vid, k in last.items():
        dead.setdefault(k, []).append(vid)
    return dead


def _apply_jvp(ins: Instruction, ts: list, batch: int | None):
    prim = ins.prim
    if not prim.complex_correct:
        check_complex(ins)
    rule = prim.jvp
    if rule is None:
        if not prim.linear:
            raise GradtapeError(
                f"gradtape has no forward-mode (JVP) rule for {prim.name}. Use reverse mode "
                "(grad, vjp, jacrev) for this function, or give it a rule with "
                "gradtape.custom_jvp."
            )
        rule = _linear_jvp(prim)
    if batch is None or prim.jvp_batched:
        return rule(ts, ins.out, *ins.args, **ins.params)
    # a rule that takes one direction: the batch goes through it row by row (same tape)
    cols = [
        rule([None if t is None else t[b] for t in ts], ins.out, *ins.args, **ins.params)
        for b in range(batch)
    ]
    if prim.multiple_results:
        return tuple(
            _stack_rows([None if c is None else c[i] for c in cols], v)
            for i, v in enumerate(ins.outvars)
        )
    return _stack_rows(cols, ins.outvars[0])


def _stack_rows(rows: list, var: Var):
    if all(r is None for r in rows):
        return None
    return np.stack(
        [
            np.zeros(var.shape, var.dtype) if r is None else np.broadcast_to(r, var.shape)
            for r in rows
        ]
    )


def _linear_jvp(prim):
    """A linear primitive's JVP: the primitive itself applied to the tangents."""

    def jvp(ts, ans, *args, **params):
        return prim(
            *(np.zeros(shape_of(a), dtype_of(ans)) if t is None else t for t, a in zip(ts, args)),
            **params,
        )

    return jvp


def _store(tangents: dict, var: Var, t, batch: int | None, ins: Instruction) -> None:
    """Record the tangent of `var`, with the var's shape (and batch axis) and dtype."""
    if t is None:
        return
    expected = var.shape if batch is None else (batch,) + var.shape
    if shape_of(t) != expected:
        try:
            t = np.broadcast_to(t, expected)
        except ValueError:
            raise GradtapeError(
                f"the JVP rule of {ins.prim.name} returned a tangent of shape {shape_of(t)}, "
                f"but its output has shape {var.shape}"
                + (f" (with the batch axis: {expected})" if batch is not None else "")
                + "."
            ) from None
    if dtype_of(t) != var.dtype and var.dtype.kind in "fc":
        t = cast_to(t, var.dtype)
    tangents[var.id] = t


# --- checking what the caller passed -----------------------------------------------------------
def _check_tangent(t, primal, where: str):
    """The tangent leaf as an array of the primal's shape and dtype, or a clear error."""
    pshape, pdtype = shape_of(primal), dtype_of(primal)
    if type(t) in (int, float) or (type(t) is complex and pdtype.kind == "c"):
        t = np.asarray(t, dtype=pdtype)  # a Python number takes the primal's dtype
    elif not (type(t) is Tracer or isinstance(t, (np.ndarray, np.generic))):
        raise GradtapeError(
            f"{where} is a {type(t).__name__}; a tangent must be an array shaped like its primal."
        )
    if shape_of(t) != pshape:
        raise GradtapeError(f"{where} has shape {shape_of(t)}, but its primal has shape {pshape}.")
    if dtype_of(t) != pdtype:
        raise GradtapeError(
            f"{where} has dtype {dtype_of(t)}, but its primal has dtype "
            f"{pdtype}: pass a tangent of the primal's dtype."
        )
    return t


def _tangent_leaves(primals: Sequence, tangents: Sequence, who: str) -> list:
    """One list of checked tangent leaves per primal argument."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise GradtapeError(
            f"{who} takes primals and tangents as tuples (or lists) of "
            f"arguments: {who}(f, (x,), (t,)), not "
            f"{type(primals).__name__} and {type(tangents).__name__}."
        )
    if len(primals) != len(tangents):
        raise GradtapeError(
            f"{who}: {len(primals)} primals but {len(tangents)} tangents; pass "
            "one tangent per primal."
        )
    out = []
    for a, (p, t) in enumerate(zip(primals, tangents)):
        p_leaves, p_td = tree_flatten(p)
        t_leaves, t_td = tree_flatten(t)
        if p_td != t_td:
            raise GradtapeError(
                f"{who}: tangent {a} has structure {t_td}, but primal {a} has structure {p_td}."
            )
        p_leaves = [_check_differentiable(x, f"primal {a}") for x in p_leaves]
        out.append(
            [
                _check_tangent(
                    tl, pl, f"{who}: tangent {a}" + (f" (leaf {i})" if len(p_leaves) > 1 else "")
                )
                for i, (pl, tl) in enumerate(zip(p_leaves, t_leaves))
            ]
        )
    return out


def _output_vars(leaves: list, level: Level, who: str, need_float: bool) -> list:
    """The var of each output leaf at `level` (None for a constant); rejects non-arrays."""
    out = []
    for i, x in enumerate(leaves):
        if type(x) is Tracer:
            if need_float and x.dtype.kind not in "fc":
                raise GradtapeError(
                    f"{who}: output leaf {i} has dtype {x.dtype}, which has no "
                    "derivative; return float arrays."
                )
            out.append(x._var if x._level is level else None)
            continue
        if isinstance(x, bool) or not isinstance(x, (np.ndarray, np.generic, int, float, complex)):
            raise GradtapeError(
                f"{who}: the function returned a {type(x).__name__}"
                + (f" (output leaf {i})" if len(leaves) > 1 else "")
                + ", which is not an array: return an array or a float, or a "
                "tuple, list or dict of them."
            )
        if need_float and np.result_type(x).kind not in "fc":
            raise GradtapeError(
                f"{who}: output leaf {i} has dtype {np.result_type(x)}, which "
                "has no derivative; return float arrays."
            )
        out.append(None)
    return out


def _zeros_like_output(x, lead: tuple = ()):
    dt = dtype_of(x)
    return np.zeros(lead + shape_of(x), dt if dt.kind in "fc" else np.float64)


def _owned(t):
    """A tangent the caller owns (broadcast views are read-only)."""
    if isinstance(t, np.ndarray) and not t.flags.writeable:
        return np.array(t)
    return t


def _split_aux(out, who: str):
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise GradtapeError(
            f"{who} with has_aux=True needs the function to return a pair (output, aux)."
        )
    return out


# --- jvp ---------------------------------------------------------------------------------------
def jvp(fun: Callable, primals: Sequence, tangents: Sequence, has_aux: bool = False):
    """Forward mode: `(fun(*primals), J @ tangents)`, from one recorded pass of fun.

    Parameters
    ----------
    fun : callable
        Plain NumPy/SciPy code.
    primals : sequence
        The point, one value per positional argument of `fun`.
    tangents : sequence
        One tangent per primal, with its primal's structure, shapes and dtype (a Python number
        takes its primal's dtype).
    has_aux : bool, default False
        `fun` returns `(output, aux)`; `jvp` then returns `(output, tangent_out, aux)`.

    Returns
    -------
    tuple
        `(output, tangent_out)`: the output of `fun` and its directional derivative.

    Raises
    ------
    GradtapeError
        When `fun` does something that cannot be differentiated, or a tangent does not match its
        primal.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> out, tangent = gt.jvp(lambda x: x**2, (np.array([1.0, 2.0]),), (np.array([1.0, 0.0]),))
    >>> print(out, tangent)
    [1. 4.] [2. 0.]
    """
    arguments.check_function(fun, "jvp")
    tangent_leaves = _tangent_leaves(primals, tangents, "jvp")
    nums = tuple(range(len(primals)))
    with new_level(LevelKind.DIFFERENTIATE) as level:
        out, in_trees = _trace_call(fun, tuple(primals), {}, nums, level)
        aux = None
        if has_aux:
            out, aux = _split_aux(out, "jvp")
    seeds = {}
    for (_, invars, _), leaves in zip(in_trees, tangent_leaves):
        for var, t in zip(invars, leaves):
            seeds[var.id] = t
    out_leaves, out_td = tree_flatten(out)
    outvars = _output_vars(out_leaves, level, "jvp", need_float=False)
    res = forward(level.tape, seeds, keep={v.id for v in outvars if v is not None})
    t_out = [
        _zeros_like_output(x) if v is None or v.id not in res else _owned(res[v.id])
        for x, v in zip(out_leaves, outvars)
    ]
    value = tree_unflatten(out_td, [_lower(x, level) for x in out_leaves])
    if has_aux:
        return value, tree_unflatten(out_td, t_out), tree_map(lambda x: _lower(x, level), aux)
    return value, tree_unflatten(out_td, t_out)


# --- Jacobians: one recording, a batch of directions ------------------------------------------
@dataclass
class Recording:
    """A function recorded once for a Jacobian: its tape, inputs and outputs."""

    level: Level
    in_trees: list  # per argnum: (treedef, input Vars, leaves)
    single: bool  # argnums was an int
    out_leaves: list
    out_td: TreeDef
    outvars: list  # per output leaf: its Var at `level`, or None for a constant
    has_aux: bool
    aux: Any
    who: str = "jacobian"
    holomorphic: bool = False

    @property
    def invars(self) -> list:
        return [v for _, invars, _ in self.in_trees for v in invars]

    @property
    def out_shapes(self) -> list:
        return [shape_of(x) for x in self.out_leaves]


def record(
    f: Callable,
    args: tuple,
    kwargs: dict,
    argnums,
    has_aux: bool,
    who: str,
    holomorphic: bool = False,
) -> Recording:
    """Record f once with the arguments in argnums traced (the tape every Jacobian reads)."""
    nums, single = _normalize_argnums(argnums, len(args))
    with new_level(LevelKind.DIFFERENTIATE) as level:
        out, in_trees = _trace_call(f, args, kwargs, nums, level)
        aux = None
        if has_aux:
            out, aux = _split_aux(out, who)
    out_leaves, out_td = tree_flatten(out)
    outvars = _output_vars(out_leaves, level, who, need_float=True)
    aux = tree_map(lambda x: _lower(x, level), aux) if has_aux else None
    return Recording(
        level, in_trees, single, out_leaves, out_td, outvars, has_aux, aux, who, holomorphic
    )


def complex_inputs(rec: Recording) -> bool:
    """Whether any differentiated input of the recording is complex."""
    return any(v.dtype.kind == "c" for v in rec.invars)


def complex_outputs(rec: Recording) -> bool:
    """Whether any output of the recording is complex."""
    return any(dtype_of(x).kind == "c" for x in rec.out_leaves)


def check_holomorphic(rec: Recording) -> None:
    """holomorphic=True: complex inputs and outputs (JAX's rule), the derivative is f'(z)."""
    for v in rec.invars:
        if v.dtype.kind != "c":
            raise GradtapeError(
                f"{rec.who} with holomorphic=True needs inputs with a complex "
                f"dtype, but got {v.dtype}: pass x.astype(complex)."
            )
    for x in rec.out_leaves:
        if dtype_of(x).kind != "c":
            raise GradtapeError(
                f"{rec.who} with holomorphic=True needs outputs with a complex "
                f"dtype, but got {dtype_of(x)}."
            )


def _check_forward_dtypes(rec: Recording) -> None:
    """Forward mode pushes real basis directions: complex inputs need holomorphic=True (else
    the imaginary directions would be missing from the Jacobian)."""
    if rec.holomorphic:
        check_holomorphic(rec)
        return
    for v in rec.invars:
        if v.dtype.kind == "c" and rec.who == "hessian":
            raise GradtapeError(
                f"hessian needs real inputs (a float dtype), but got {v.dtype}. For a "
                "holomorphic function, pass holomorphic=True. For a real function of complex "
                "z, differentiate with respect to its real and imaginary parts: pass x and y "
                "and form z = x + 1j * y inside."
            )
        if v.dtype.kind == "c":
            raise GradtapeError(
                f"{rec.who} by forward mode needs real inputs (a float dtype), but got "
                f"{v.dtype}. For a holomorphic function, pass holomorphic=True. Otherwise use "
                "reverse mode (jacrev, or grad for a scalar) when the outputs are real, or "
                "gradtape.jvp directly."
            )


def num_elements(shape: tuple) -> int:
    """The number of elements of an array of `shape`."""
    n = 1
    for d in shape:
        n *= d
    return n


def _offsets(shapes: list) -> list:
    offs, total = [], 0
    for s in shapes:
        offs.append(total)
        total += num_elements(s)
    return offs + [total]


def basis_rows(vars_: list, lo: int, hi: int) -> list:
    """Rows lo..hi of the identity over the concatenated (flattened) `vars_`, split per var:
    arrays of shape (hi - lo,) + var.shape, or None for a var the rows do not touch."""
    offs = _offsets([v.shape for v in vars_])
    rows = []
    for v, off, end in zip(vars_, offs, offs[1:]):
        a, b = max(lo, off), min(hi, end)
        if a >= b:
            rows.append(None)
            continue
        e = np.zeros((hi - lo, end - off), v.dtype)
        e[np.arange(a - lo, b - lo), np.arange(a - off, b - off)] = 1
        rows.append(e.reshape((hi - lo,) + v.shape))
    return rows


def chunk_size(tape: Tape, n: int) -> int:
    """How many directions to push at once so that no batched tangent gets too large."""
    largest = max(
        (num_elements(v.shape) for ins in tape.instructions for v in ins.outvars), default=1
    )
    return max(1, min(n, _MAX_BATCH_ELEMENTS // max(largest, 1)))


def batched_sweep(tape: Tape, seed_vars: list, read: list, zero_like: list) -> list:
    """Push every basis direction over `seed_vars` through `tape` (in chunks of directions).

    Returns, for each var in `read` (None: a constant), the stacked tangents: shape
    (total size of seed_vars,) + that var's shape (zeros shaped like `zero_like` if none).
    """
    n = _offsets([v.shape for v in seed_vars])[-1]
    keep = {v.id for v in read if v is not None}
    parts: list = [[] for _ in read]
    step = chunk_size(tape, n)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        seeds = {v.id: r for v, r in zip(seed_vars, basis_rows(seed_vars, lo, hi)) if r is not None}
        res = forward(tape, seeds, keep=keep, batch=hi - lo)
        for part, v, like in zip(parts, read, zero_like):
            t = None if v is None else res.get(v.id)
            part.append(_zeros_like_output(like, (hi - lo,)) if t is None else t)
    return [
        p[0]
        if len(p) == 1
        else (np.concatenate(p, axis=0) if p else _zeros_like_output(like, (0,)))
        for p, like in zip(parts, zero_like)
    ]


def jacobian_by_columns(rec: Recording) -> list:
    """blocks[i][j] = d out_i / d in_j, shape out_i.shape + in_j.shape, by forward mode."""
    _check_forward_dtypes(rec)
    invars = rec.invars
    cols = batched_sweep(rec.level.tape, invars, rec.outvars, rec.out_leaves)
    offs = _offsets([v.shape for v in invars])
    blocks = []
    for col, oshape in zip(cols, rec.out_shapes):
        row = []
        for v, off, end in zip(invars, offs, offs[1:]):
            b = np.reshape(col[off:end], (end - off, num_elements(oshape)))
            row.append(np.reshape(np.transpose(b), oshape + v.shape))
        blocks.append(row)
    return blocks


def assemble(rec: Recording, blocks: list):
    """The Jacobian in JAX's layout: the output's structure, each leaf holding the input's
    structure (a tuple of them for a tuple argnums) of out.shape + in.shape blocks."""
    leaves = []
    for row in blocks:
        per_arg, j = [], 0
        for td, invars, _ in rec.in_trees:
            per_arg.append(tree_unflatten(td, [_owned(b) for b in row[j : j + len(invars)]]))
            j += len(invars)
        leaves.append(per_arg[0] if rec.single else tuple(per_arg))
    jac = tree_unflatten(rec.out_td, leaves)
    return (jac, rec.aux) if rec.has_aux else jac


def jacfwd(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
) -> Callable:
    """The Jacobian by forward mode: fun recorded once, all input directions pushed as a batch.

    Shapes and structure follow JAX: out.shape + in.shape per (output leaf, input leaf).
    Best when the input is smaller than the output. Inputs are real (outputs may be complex),
    or, with holomorphic=True, fun is holomorphic in complex inputs and the blocks are f'(z).

    Parameters
    ----------
    fun : callable
        Plain NumPy/SciPy code.
    argnums : int or sequence of int, default 0
        Which positional argument(s) to differentiate.
    has_aux : bool, default False
        `fun` returns `(output, aux)`; the result is then `(jacobian, aux)`.
    holomorphic : bool, default False
        `fun` is holomorphic in complex inputs.

    Returns
    -------
    callable
        `jac(*args)` returning the Jacobian blocks.

    Raises
    ------
    GradtapeError
        When `fun` does something that cannot be differentiated, or a complex input without
        `holomorphic=True`.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> print(gt.jacfwd(lambda x: x**2)(np.array([1.0, 2.0])))
    [[2. 0.]
     [0. 4.]]
    """
    return jacobian_transform(fun, argnums, has_aux, jacobian_by_columns, "jacfwd", holomorphic)


def jacobian_transform(
    f: Callable, argnums, has_aux: bool, method: Callable, who: str, holomorphic: bool = False
) -> Callable:
    """A Jacobian transform: record f once, compute the blocks with `method(recording)`."""
    arguments.check_function(f, who)
    arguments.check_argnums(argnums, who)

    @functools.wraps(f)
    def jac_f(*args, **kwargs):
        rec = record(f, args, kwargs, argnums, has_aux, who, holomorphic)
        return assemble(rec, method(rec))

    return jac_f
