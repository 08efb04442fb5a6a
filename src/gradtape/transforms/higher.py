"""Jacobians by reverse mode, the choice of mode, and second order: hessian and hvp.

jacrev records f once, then records its backward pass once more as a function of the
output cotangent. That pass is linear in the cotangent, so pushing every cotangent
direction through its tape as one batch (the forward interpreter) gives all rows of
the Jacobian in one pass. hessian and hvp are forward-over-reverse: grad(f) is
recorded once and the forward interpreter runs over that tape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from ..core.errors import GradtapeError
from ..core.ir import Tape, Var
from ..core.tracing import LevelKind, Tracer, new_level
from . import arguments
from .forward import (
    Recording,
    basis_rows,
    batched_sweep,
    check_holomorphic,
    chunk_size,
    complex_inputs,
    complex_outputs,
    jacobian_by_columns,
    jacobian_transform,
    jvp,
    num_elements,
)
from .reverse import backward, check_output_dtype, grad
from .vmap import vmap

_MODES = ("auto", "forward", "reverse")


def _uses_user_vjp(tape: Tape) -> bool:
    """True when the tape calls a custom_vjp `bwd`: user code that may not be traceable.

    (custom_jvp's reverse rule is gradtape's transpose of the user's rule, which only ever
    sees traced tangents: it takes a batch of cotangents like any rule.)
    """
    return any(
        ins.prim.user_rule and ins.prim.name.startswith("custom_vjp[") for ins in tape.instructions
    )


def _generic_seed(var: Var) -> np.ndarray:
    """A cotangent with distinct non-zero entries: the backward pass is recorded at it.

    The recording is linear in the cotangent and does not depend on its value, except
    that a rule may drop a term whose cotangent is exactly zero where its local derivative
    is infinite (np.where(x > 0, np.sqrt(x), 0)): distinct non-zero seeds keep the zeros
    that are there for every cotangent and no others.
    """
    n = num_elements(var.shape)
    seed = 1.0 + (np.arange(n) * 0.6180339887498949) % 1.0
    return seed.reshape(var.shape).astype(var.dtype)


def _check_reverse_dtypes(rec: Recording) -> None:
    """Reverse mode pushes real cotangent directions: complex outputs need holomorphic=True."""
    if rec.holomorphic:
        check_holomorphic(rec)
        return
    for x in rec.out_leaves:
        dt = _output_dtype(x)
        if dt.kind == "c":
            raise GradtapeError(
                f"{rec.who} by reverse mode needs real-valued outputs (a float dtype), but got "
                f"{dt}. For a holomorphic function, pass holomorphic=True. Otherwise use "
                "forward mode (jacfwd) when the inputs are real, or gradtape.vjp directly."
            )
        check_output_dtype(dt, rec.who, False)


def jacobian_by_rows(rec: Recording) -> list:
    """blocks[i][j] = d out_i / d in_j, shape out_i.shape + in_j.shape, by reverse mode."""
    _check_reverse_dtypes(rec)
    invars = rec.invars
    out_like = [Var(-1, tuple(s), _output_dtype(x)) for s, x in zip(rec.out_shapes, rec.out_leaves)]
    if sum(num_elements(v.shape) for v in out_like) == 1 or _uses_user_vjp(rec.level.tape):
        rows = _rows_one_by_one(rec, out_like)  # one backward pass per row
    elif not rec.holomorphic and _batchable(rec.level.tape):
        rows = _rows_by_vmap(rec, out_like)
    else:
        with new_level(LevelKind.DIFFERENTIATE) as level:
            seeds = [level.new_input(_generic_seed(v)) for v in out_like]
            cts = backward(rec.level.tape, rec.outvars, seeds)
            in_cts = [cts.get(v.id) for v in invars]
        read = [c._var if type(c) is Tracer and c._level is level else None for c in in_cts]
        rows = batched_sweep(level.tape, [s._var for s in seeds], read, invars)
    offs = np.cumsum([0] + [num_elements(s) for s in rec.out_shapes])
    return [
        [np.reshape(r[lo:hi], oshape + v.shape) for r, v in zip(rows, invars)]
        for lo, hi, oshape in zip(offs[:-1], offs[1:], rec.out_shapes)
    ]


def _rows_by_vmap(rec: Recording, out_like: list) -> list:
    """All rows at once: the backward pass of the recorded tape mapped (vmap) over the basis
    of output cotangents, in chunks that bound the batched values' size.

    Each VJP rule then runs once on the whole batch of cotangents. This is faster than
    recording the backward pass and pushing the basis through it by forward mode (the
    benchmark's Jacobian and Hessian cases: about three times for a dense 100 x 100
    Jacobian), as the recorded backward pass holds the rules' own bookkeeping too.
    """
    invars = rec.invars
    m = int(sum(num_elements(v.shape) for v in out_like))
    step = chunk_size(rec.level.tape, m)
    parts: list = [[] for _ in invars]

    def pull(*seeds):
        cts = backward(rec.level.tape, rec.outvars, list(seeds))
        return tuple(
            np.zeros(v.shape, v.dtype) if cts.get(v.id) is None else cts[v.id] for v in invars
        )

    for lo in range(0, m, step):
        hi = min(m, lo + step)
        basis = basis_rows(out_like, lo, hi)
        in_axes = tuple(None if b is None else 0 for b in basis)
        rows = vmap(pull, in_axes=in_axes)(*basis)
        for part, r in zip(parts, rows):
            part.append(r)
    return [p[0] if len(p) == 1 else np.concatenate(p, axis=0) for p in parts]


def _output_dtype(x) -> np.dtype:
    return x.dtype if hasattr(x, "dtype") else np.result_type(x)


def _rows_one_by_one(rec: Recording, out_like: list) -> list:
    """One backward pass per output element, over the single recorded tape: for a scalar
    output (a gradient), and for tapes with custom_vjp rules, whose user code expects
    plain arrays."""
    m = int(sum(num_elements(v.shape) for v in out_like))
    rows: list = [[] for _ in rec.invars]
    for r in range(m):
        basis = basis_rows(out_like, r, r + 1)
        cts = backward(rec.level.tape, rec.outvars, [None if b is None else b[0] for b in basis])
        for row, v in zip(rows, rec.invars):
            ct = cts.get(v.id)
            row.append(np.zeros(v.shape, v.dtype) if ct is None else ct)
    return [
        np.stack(row) if row else np.zeros((0,) + v.shape, v.dtype)
        for row, v in zip(rows, rec.invars)
    ]


def _auto(rec: Recording) -> list:
    """Forward mode when there are fewer inputs than outputs, else reverse mode; for a
    function that is not holomorphic, the mode its complex inputs or outputs allow."""
    if not rec.holomorphic:
        if complex_inputs(rec) and not complex_outputs(rec):
            return jacobian_by_rows(rec)
        if complex_outputs(rec):
            return jacobian_by_columns(rec)  # complex inputs too: it explains the error
    n = sum(num_elements(v.shape) for v in rec.invars)
    m = sum(num_elements(s) for s in rec.out_shapes)
    # a square Jacobian by rows: the vmapped backward pass is the faster of the two there
    return jacobian_by_columns(rec) if n < m else jacobian_by_rows(rec)


def jacrev(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
) -> Callable:
    """The Jacobian by reverse mode: fun and its backward pass recorded once, all output
    directions pushed as a batch. Best when the output is smaller than the input.

    Outputs are real (a complex input z gets JAX's df/dx - i df/dy per output element), or,
    with holomorphic=True, fun is holomorphic in complex inputs and the blocks are f'(z).

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
        `jac(*args)` returning blocks of shape out.shape + in.shape, laid out as JAX's jacrev.

    Raises
    ------
    GradtapeError
        When `fun` does something that cannot be differentiated.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> print(gt.jacrev(lambda x: np.cumsum(x))(np.array([1.0, 2.0])))
    [[1. 0.]
     [1. 1.]]
    """
    return jacobian_transform(fun, argnums, has_aux, jacobian_by_rows, "jacrev", holomorphic)


def jacobian(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    *,
    mode: str = "auto",
) -> Callable:
    """The Jacobian of fun; mode "forward", "reverse" or "auto" (by input and output sizes).

    Each block has shape out.shape + in.shape, laid out as JAX's jacfwd/jacrev do. Complex
    values as in jacfwd (real inputs) and jacrev (real outputs); "auto" picks the mode they
    allow. holomorphic=True: fun is holomorphic in complex inputs and the blocks are f'(z).

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
    mode : {"auto", "forward", "reverse"}, default "auto"
        Keyword only. Forward mode for inputs smaller than outputs, reverse mode otherwise
        ("auto").

    Returns
    -------
    callable
        `jac(*args)` returning the Jacobian blocks.

    Raises
    ------
    ValueError
        For an unknown `mode`.
    GradtapeError
        When `fun` does something that cannot be differentiated.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> print(gt.jacobian(lambda x: x**2)(np.array([1.0, 2.0])))
    [[2. 0.]
     [0. 4.]]
    """
    if mode not in _MODES:
        raise GradtapeError(f"jacobian: mode={mode!r}; use one of {', '.join(_MODES)}.")
    method = {"auto": _auto, "forward": jacobian_by_columns, "reverse": jacobian_by_rows}[mode]
    return jacobian_transform(fun, argnums, has_aux, method, "jacobian", holomorphic)


def _scalar_checked(f: Callable, who: str, has_aux: bool = False) -> Callable:
    """f, raising a clear error when its (main) output is not a scalar."""
    fname = getattr(f, "__name__", "the function")

    @functools.wraps(f)
    def checked(*args, **kwargs):
        out = f(*args, **kwargs)
        value = out[0] if has_aux and isinstance(out, (tuple, list)) and len(out) == 2 else out
        shape = getattr(value, "shape", None)
        if shape is None and isinstance(value, (int, float)) and not isinstance(value, bool):
            return out
        if shape != ():
            what = f"shape {shape}" if shape is not None else f"a {type(value).__name__}"
            raise GradtapeError(
                f"{who} of {fname} needs a scalar output, but it returned {what}. Reduce it "
                "to a scalar (np.sum), or use jacobian for the derivatives of every output."
            )
        return out

    return checked


def hessian(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
) -> Callable:
    """The Hessian of a scalar function: grad recorded once, then its backward pass mapped
    over all output directions at once (reverse over reverse, with vmap; forward over
    reverse for holomorphic functions and custom rules). Layout as JAX's hessian.

    Inputs are real (intermediates may be complex), or, with holomorphic=True, fun is a
    holomorphic function of complex inputs with a complex output, and the result is f''(z).

    Parameters
    ----------
    fun : callable
        Plain NumPy/SciPy code returning a real scalar.
    argnums : int or sequence of int, default 0
        Which positional argument(s) to differentiate.
    has_aux : bool, default False
        `fun` returns `(value, aux)`; the result is then `(hessian, aux)`.
    holomorphic : bool, default False
        `fun` is holomorphic in complex inputs.

    Returns
    -------
    callable
        `h(*args)` returning the Hessian, shape x.shape + x.shape for an array argument x.

    Raises
    ------
    GradtapeError
        When `fun` does something that cannot be differentiated twice.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> print(gt.hessian(lambda x: np.sum(x**3))(np.array([1.0, 2.0])))
    [[ 6.  0.]
     [ 0. 12.]]
    """
    arguments.check_function(fun, "hessian")
    arguments.check_argnums(argnums, "hessian")
    g = grad(
        _scalar_checked(fun, "hessian", has_aux), argnums, has_aux=has_aux, holomorphic=holomorphic
    )
    method = jacobian_by_columns if holomorphic else _hessian_rows
    return jacobian_transform(g, argnums, has_aux, method, "hessian", holomorphic)


def _hessian_rows(rec: Recording) -> list:
    """Reverse over reverse: the recorded gradient's backward pass mapped (vmap) over the
    basis, which compiles to faster code than the basis pushed through it by forward mode
    (the benchmark's Hessian case), eager and compiled alike so that a compiled Hessian has
    the eager one's bits. Forward over reverse for complex inputs (whose error it explains),
    and where the gradient's tape calls user rules or loops."""
    tape = rec.level.tape
    if (
        complex_inputs(rec)
        or not _batchable(tape)
        or any(ins.prim.user_rule for ins in tape.instructions)
    ):
        return jacobian_by_columns(rec)
    return jacobian_by_rows(rec)


def _batchable(tape: Tape) -> bool:
    """Every primitive of the tape has a batching rule and none is a loop (vmap of its
    backward pass is then one call per rule; a loop's reverse rule of second order walks
    its steps one by one, while forward mode keeps it one loop)."""
    return all(
        ins.prim.batch is not None and ins.prim.python_impl is None for ins in tape.instructions
    )


_CURRIED = object()


def hvp(fun: Callable, x=_CURRIED, v=None, *args):
    """The Hessian of scalar fun (in its first argument) at x times v, without forming it.

    Forward over reverse: one jvp of grad(fun), so it costs a few gradients. Two spellings:
    `hvp(fun, x, v, *args)` and `hvp(fun)(x, v, *args)` (a function, to compose with vmap and
    compile); fun is called as `fun(x, *args)`.

    Parameters
    ----------
    fun : callable
        Plain NumPy/SciPy code returning a real scalar, differentiated in its first argument.
    x : array or pytree
        The point (omitted: hvp returns the function of (x, v, *args)).
    v : array or pytree
        The direction, with the structure, shapes and dtypes of `x`.
    *args
        Further arguments of `fun`, passed through (not differentiated).

    Returns
    -------
    array or pytree
        H(x) @ v, with the structure of `x` (or, with only `fun`, the function computing it).

    Raises
    ------
    GradtapeError
        When `fun` does something that cannot be differentiated twice.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> print(gt.hvp(lambda x: np.sum(x**3), np.array([1.0, 2.0]), np.array([1.0, 0.0])))
    [6. 0.]
    >>> print(gt.hvp(lambda x, a: a * np.sum(x**3))(np.ones(2), np.array([1.0, 0.0]), 2.0))
    [12.  0.]
    """
    arguments.check_function(fun, "hvp")
    if x is _CURRIED:
        return lambda x, v, *args: hvp(fun, x, v, *args)
    if args:
        g = grad(_scalar_checked(lambda y: fun(y, *args), "hvp"))
    else:
        g = grad(_scalar_checked(fun, "hvp"))
    return jvp(g, (x,), (v,))[1]
