"""The rest of the transform toolbox: linearize, checkpoint (remat), elementwise_grad.

`linearize` records a function once and returns its JVP as a function that pushes tangents
along the recorded tape (the primal is not run again). `checkpoint` makes a function one
instruction of the tape that differentiates it: only its inputs and outputs are kept, and its
intermediates are recomputed in the backward pass.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from ..core import tracing as trace
from ..core.errors import GradtapeError
from ..core.primitive import Primitive
from ..core.pytree import tree_flatten, tree_map, tree_unflatten
from ..core.tracing import LevelKind, bind, new_level
from ..rules._util import dtype_of, shape_of
from ..rules.batching import elementwise_batch
from ..rules.elementwise import elementwise
from .forward import (
    _lower,
    _output_vars,
    _owned,
    _split_aux,
    _tangent_leaves,
    _trace_call,
    _zeros_like_output,
    forward,
)
from .forward import jvp as _jvp
from .reverse import grad as _grad
from .reverse import vjp as _vjp
from .vmap import vmap

Tracer = trace.Tracer


# --- linearize ---------------------------------------------------------------------------------
def linearize(fun: Callable, *primals, has_aux: bool = False):
    """The value of `fun` at `primals` and its linear approximation there (JAX's linearize).

    `fun` runs once; each call of the returned `f_jvp` pushes tangents along the recorded tape
    (the cost of a few evaluations, without running `fun` again).

    Parameters
    ----------
    fun : callable
        A function of arrays or pytrees of arrays.
    *primals : array or pytree
        The point.
    has_aux : bool
        `fun` returns `(output, aux)`; aux is returned after the JVP function.

    Returns
    -------
    tuple
        `(fun(*primals), f_jvp)`, or with has_aux `(fun(*primals), f_jvp, aux)`, where
        `f_jvp(*tangents)` is `J @ tangents`: one tangent per primal, with its structure,
        shapes and dtype.

    Raises
    ------
    GradtapeError
        When `f_jvp` is given tangents of another structure, shape or dtype than the primals,
        or `fun` does something that cannot be differentiated.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> y, f_jvp = gt.linearize(np.sin, np.array([0.0, 1.0]))
    >>> print(f_jvp(np.array([1.0, 1.0])))
    [1.         0.54030231]
    """
    nums = tuple(range(len(primals)))
    with new_level(LevelKind.DIFFERENTIATE) as level:
        out, in_trees = _trace_call(fun, tuple(primals), {}, nums, level)
        aux = None
        if has_aux:
            out, aux = _split_aux(out, "linearize")
    out_leaves, out_td = tree_flatten(out)
    outvars = _output_vars(out_leaves, level, "linearize", need_float=False)
    keep = {v.id for v in outvars if v is not None}
    value = tree_unflatten(out_td, [_lower(x, level) for x in out_leaves])
    primal_values = [
        tree_unflatten(td, [_lower(x, level) for x in leaves]) for td, _, leaves in in_trees
    ]

    def f_jvp(*tangents):
        tangent_leaves = _tangent_leaves(primal_values, tangents, "linearize")
        seeds = {}
        for (_, invars, _), leaves in zip(in_trees, tangent_leaves):
            for var, t in zip(invars, leaves):
                seeds[var.id] = t
        res = forward(level.tape, seeds, keep=keep)
        return tree_unflatten(
            out_td,
            [
                _zeros_like_output(x) if v is None or v.id not in res else _owned(res[v.id])
                for x, v in zip(out_leaves, outvars)
            ],
        )

    if has_aux:
        return value, f_jvp, tree_map(lambda x: _lower(x, level), aux)
    return value, f_jvp


# --- checkpoint ----------------------------------------------------------------------------------
class _Block:
    """The checkpointed function on flat leaves (a param of checkpoint_p)."""

    __slots__ = ("fn", "name", "prevent_cse")

    def __init__(self, fn: Callable, name: str, prevent_cse: bool = True):
        self.fn = fn
        self.name = name
        self.prevent_cse = prevent_cse

    def __repr__(self) -> str:
        return f"checkpoint({self.name})"


def _checkpoint_impl(*args, block):
    return tuple(_as_array(o) for o in block.fn(*args))


def _as_array(x):
    return x if hasattr(x, "dtype") else np.asarray(x)


def _floating(x) -> bool:
    return dtype_of(x).kind in "fc"


# The recomputation's inputs pass through a copy that program simplification does not see
# through: the recomputed instructions then read other variables than the forward pass's, so
# merging common subexpressions under `compile` cannot fold the recomputation into the forward
# pass (which would keep every intermediate alive until the backward pass, as without
# checkpoint). JAX's `prevent_cse`.
optimization_barrier_p = elementwise(
    "optimization_barrier", np.positive, (1,), native=("signed:(+{0})", "np.positive")
)
optimization_barrier_p.batch = elementwise_batch


def _behind_barrier(x):
    """`x` as the recomputation reads it: a recorded copy where it is recorded."""
    if type(x) is Tracer and _floating(x):
        return optimization_barrier_p(x)
    return x


def _checkpoint_vjp_all(g, ans, args, params, invars):
    """Run the block again from its inputs (recording it), then its backward pass."""
    block = params["block"]
    if block.prevent_cse:
        args = [_behind_barrier(a) for a in args]
    diff = [i for i, v in enumerate(invars) if v is not None and _floating(args[i])]
    outs_float = [i for i, a in enumerate(ans) if _floating(a)]

    def of_differentiated(*xs):
        full = list(args)
        for i, x in zip(diff, xs):
            full[i] = x
        outs = block.fn(*full)
        return tuple(_as_array(outs[i]) for i in outs_float)

    _, pull = _vjp(of_differentiated, *(args[i] for i in diff))
    cts = pull(
        tuple(
            np.zeros(shape_of(ans[i]), dtype_of(ans[i])) if g[i] is None else g[i]
            for i in outs_float
        )
    )
    result = [None] * len(args)
    for i, ct in zip(diff, cts):
        result[i] = ct
    return result


def _checkpoint_jvp(ts, ans, *args, block):
    diff = [i for i, t in enumerate(ts) if t is not None and _floating(args[i])]

    def of_differentiated(*xs):
        full = list(args)
        for i, x in zip(diff, xs):
            full[i] = x
        return tuple(_as_array(o) for o in block.fn(*full))

    _, tangents = _jvp(of_differentiated, tuple(args[i] for i in diff), tuple(ts[i] for i in diff))
    return tuple(t if _floating(a) else None for t, a in zip(tangents, ans))


def _checkpoint_batch(prim, args, batched, block):
    """vmap of a checkpointed block: the block mapped over the batch, still checkpointed."""
    mapped = vmap(block.fn, in_axes=tuple(0 if b else None for b in batched))
    return _checkpointed_call(
        _Block(lambda *a: tuple(mapped(*a)), block.name, block.prevent_cse), list(args)
    )


checkpoint_p = Primitive(
    "checkpoint",
    _checkpoint_impl,
    jvp=_checkpoint_jvp,
    multiple_results=True,
    batch=_checkpoint_batch,
)
checkpoint_p.vjp_all = _checkpoint_vjp_all


def _checkpointed_call(block: _Block, leaves: list) -> tuple:
    """The block's outputs; recorded as one checkpoint instruction where it is differentiated
    (or batched), run directly otherwise."""
    top = None
    for x in leaves:
        if type(x) is Tracer and (top is None or x._level.id > top.id):
            top = x._level
    if top is None or (top.kind is not LevelKind.DIFFERENTIATE and top.batch_size is None):
        return tuple(block.fn(*leaves))
    return tuple(bind(checkpoint_p, tuple(leaves), {"block": block}))


def checkpoint(
    fun: Callable, *, prevent_cse: bool = True, static_argnums: int | Sequence[int] = ()
) -> Callable:
    """`fun` with its intermediates recomputed in the backward pass instead of stored (JAX's
    checkpoint, also called remat).

    Differentiating the result keeps only the inputs and outputs of each call of `fun`; its
    backward pass runs `fun` again to get the intermediates. Values and gradients are the same
    as without it; memory is lower for long chains of checkpointed blocks, at the price of one
    more forward pass per block. Under `compile` too: the recomputation reads its inputs
    through a barrier that program simplification does not merge across, so it stays in the
    backward pass.

    Parameters
    ----------
    fun : callable
        Any function of arrays or pytrees of arrays.
    prevent_cse : bool
        Keep the recomputation apart from the forward pass under `compile` (default, as JAX).
        False lets program simplification merge them: no memory saving there, and no extra
        forward pass either.
    static_argnums : int or tuple of int
        Positions of arguments that are not arrays (passed through as they are).

    Returns
    -------
    callable
        A function with the same signature and results.

    Raises
    ------
    GradtapeError
        When `fun` returns a result of another structure when it is run again.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> block = gt.checkpoint(lambda x: np.tanh(np.sin(x) * 2.0))
    >>> gt.grad(lambda x: np.sum(block(block(x))))(np.array([0.1, 0.2])).shape
    (2,)
    """
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    name = getattr(fun, "__name__", "block")

    @functools.wraps(fun)
    def checkpointed(*args):
        fixed = {i: args[i] for i in static}
        dynamic = tuple(a for i, a in enumerate(args) if i not in fixed)
        leaves, in_td = tree_flatten(dynamic)
        out_td = []

        def flat(*xs):
            rest = iter(tree_unflatten(in_td, list(xs)))
            full = [fixed[i] if i in fixed else next(rest) for i in range(len(args))]
            out_leaves, td = tree_flatten(fun(*full))
            if out_td and out_td[0] != td:
                raise GradtapeError(
                    f"checkpoint: {name} returned structure {td} when run again, but "
                    f"{out_td[0]} the first time"
                )
            out_td[:1] = [td]
            return tuple(out_leaves)

        outs = _checkpointed_call(_Block(flat, name, prevent_cse), leaves)
        return tree_unflatten(out_td[0], list(outs))

    return checkpointed


remat = checkpoint


# --- elementwise_grad ------------------------------------------------------------------
def elementwise_grad(fun: Callable, argnum: int = 0) -> Callable:
    """The derivative of an elementwise function, element by element (autograd's name).

    For `fun` mapping each element of its input to the element at the same position of its
    output, `elementwise_grad(fun)(x)[i] == d fun(x)[i] / d x[i]`. It is the gradient of
    `sum(fun(x))`, so it costs one backward pass (for other functions it is still that
    gradient: the sum of each column of the Jacobian).

    Parameters
    ----------
    fun : callable
        A function whose output has the shape of argument `argnum` (or broadcasts to it).
    argnum : int
        The argument to differentiate.

    Returns
    -------
    callable
        A function with fun's signature returning an array shaped like argument `argnum`.

    Raises
    ------
    GradtapeError
        When `fun` does something that cannot be differentiated.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> print(gt.elementwise_grad(np.tanh)(np.array([0.0, 1.0])))
    [1.         0.41997434]
    """

    def summed(*args, **kwargs):
        return np.sum(fun(*args, **kwargs))

    wrapped = _grad(summed, argnums=argnum)
    return functools.wraps(fun)(lambda *args, **kwargs: wrapped(*args, **kwargs))
