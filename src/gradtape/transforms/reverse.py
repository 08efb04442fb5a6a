"""Reverse mode: the reverse interpreter of a tape, and grad, value_and_grad, vjp."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core import tracing as trace
from ..core.errors import GradtapeError
from ..core.ir import Tape
from ..core.pytree import tree_flatten, tree_map, tree_unflatten
from ..core.tracing import LevelKind, new_level
from ..rules.indexing import SparseCotangent, materialize

Tracer = trace.Tracer


def _resolve(entry):
    """A dense cotangent from an accumulator entry (a value, or a list with sparse pieces)."""
    if type(entry) is not list:
        return entry
    sparse = [p for p in entry if type(p) is SparseCotangent]
    out = materialize(sparse) if sparse else None
    for p in entry:
        if type(p) is not SparseCotangent:
            out = p if out is None else out + p
    return out


def _accumulate(acc: dict, var, ct) -> None:
    if type(ct) is not SparseCotangent:
        dt = getattr(ct, "dtype", None)
        if dt is not None and dt != var.dtype and var.dtype.kind in "fc":
            ct = ct.astype(var.dtype)
    prev = acc.get(var.id)
    if prev is None:
        acc[var.id] = [ct] if type(ct) is SparseCotangent else ct
    elif type(prev) is list:
        prev.append(ct)
    elif type(ct) is SparseCotangent:
        acc[var.id] = [prev, ct]
    else:
        acc[var.id] = prev + ct


def backward(tape: Tape, outvars: Sequence, cotangents: Sequence) -> dict:
    """Run the tape backwards from `cotangents` of `outvars`; returns var id -> cotangent.

    Only instructions whose outputs received a cotangent are visited, and only the
    arguments traced at this level get one: constants cost nothing.
    """
    # a masked branch (np.where(x > 0, np.sqrt(x), 0)) has infinite local derivatives where
    # its cotangent is zero: no warnings for them, once for the whole pass
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _backward(tape, outvars, cotangents)


def _backward(tape: Tape, outvars: Sequence, cotangents: Sequence) -> dict:
    acc: dict = {}
    for v, ct in zip(outvars, cotangents):
        if v is not None and ct is not None:
            _accumulate(acc, v, ct)
    for ins in reversed(tape.instructions):
        prim = ins.prim
        if prim.multiple_results:
            gs = [acc.pop(v.id, None) for v in ins.outvars]
            if all(g is None for g in gs):
                continue
            if prim.vjp_all is not None:  # takes None for outputs with no cotangent
                g = tuple(None if gi is None else _resolve(gi) for gi in gs)
            else:
                g = tuple(
                    np.zeros(v.shape, v.dtype) if gi is None else _resolve(gi)
                    for v, gi in zip(ins.outvars, gs)
                )
        else:
            g = acc.pop(ins.outvars[0].id, None)
            if g is None:
                continue
            g = _resolve(g)
        vjp_all = prim.vjp_all
        if vjp_all is not None:
            cts = vjp_all(g, ins.out, ins.args, ins.params, ins.invars)
            for v, ct in zip(ins.invars, cts):
                if v is not None and ct is not None:
                    _accumulate(acc, v, ct)
            continue
        vjps = prim.vjps
        for i, v in enumerate(ins.invars):
            if v is None:
                continue
            rule = vjps[i] if type(vjps) is tuple else prim.vjp_rule(i)
            if rule is None:
                continue
            ct = rule(g, ins.out, *ins.args, **ins.params)
            if ct is not None:
                _accumulate(acc, v, ct)
    return {k: _resolve(e) for k, e in acc.items()}


# --- argument handling ----------------------------------------------------------------------
def _check_differentiable(x, where: str):
    dt = getattr(x, "dtype", None)
    if dt is None:
        if isinstance(x, bool) or not isinstance(x, (int, float, complex)):
            raise GradtapeError(
                f"{where} is a {type(x).__name__}, which cannot be differentiated: pass a float "
                "array or a Python float (or remove it from argnums)."
            )
        if isinstance(x, int):
            raise GradtapeError(
                f"{where} is the Python int {x!r}: integers have no gradient. Pass a float "
                f"({float(x)!r}) or remove it from argnums."
            )
        return np.asarray(x)
    if dt.kind not in "fc":
        raise GradtapeError(
            f"{where} has dtype {dt}, which cannot be differentiated: pass x.astype(float) "
            "(or remove it from argnums)."
        )
    return x


def _normalize_argnums(argnums, nargs: int) -> tuple[tuple, bool]:
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for a in nums:
        if not -nargs <= a < nargs:
            raise GradtapeError(f"argnums={argnums!r} but the function was called with {nargs} "
                                "positional arguments.")
    return tuple(a % nargs for a in nums), single


def _trace_call(f, args, kwargs, argnums, level):
    """Call f with the arguments in argnums replaced by input Tracers of `level`."""
    new_args = list(args)
    in_trees = []
    for a in argnums:
        leaves, td = tree_flatten(args[a])
        tracers = [level.new_input(_check_differentiable(x, f"argument {a}")) for x in leaves]
        # the input Vars, not the Tracers: f may write into its argument (x[0] = ...), which
        # rebinds the Tracer to the written value; derivatives are with respect to the input
        in_trees.append((td, [t._var for t in tracers], leaves))
        new_args[a] = tree_unflatten(td, tracers)
    try:
        return f(*new_args, **kwargs), in_trees
    except ValueError as e:
        if "setting an array element with a sequence" in str(e):
            raise GradtapeError(
                "a traced value was written into a plain NumPy array (a[i] = x): that would cut "
                "the gradient. Build the array from traced values instead: y = np.zeros_like(x) "
                "(x traced) then y[i] = ..., or collect values in a list and use np.stack."
            ) from e
        raise


def _lower(x, level):
    """The value one level below `level` (what the caller of a transform sees)."""
    if type(x) is Tracer and x._level is level:
        return x._value
    return x


def _fresh(g, like):
    """A gradient the caller owns: writable, with the argument's type for Python floats."""
    if isinstance(g, np.ndarray) and not g.flags.writeable:
        g = np.array(g)
    if isinstance(like, float) and not isinstance(like, np.ndarray) and isinstance(
            g, (np.ndarray, np.generic)):
        return np.float64(g) if g.dtype == np.float64 else g[()]
    return g


def _grads_for(in_trees, cts: dict):
    out = []
    for td, invars, leaves in in_trees:
        gl = []
        for var, leaf in zip(invars, leaves):
            g = cts.get(var.id)
            if g is None:
                g = np.zeros(var.shape, var.dtype)
            gl.append(_fresh(g, leaf))
        out.append(tree_unflatten(td, gl))
    return out


def _scalar_output(out, level, fname: str):
    shape = getattr(out, "shape", None)
    if shape is None:
        if isinstance(out, (int, float)) and not isinstance(out, bool):
            return None
        raise GradtapeError(
            f"grad of {fname} needs a scalar output, but it returned a {type(out).__name__}. "
            "Return a scalar, use has_aux=True to return (scalar, aux), or use vjp/jacobian."
        )
    if shape != () and int(np.prod(shape)) != 1:  # shape (1,), (1, 1): as HIPS autograd
        raise GradtapeError(
            f"grad of {fname} needs a scalar output, but it returned shape {shape}. Use "
            "gradtape.jacobian or gradtape.vjp for non-scalar outputs, or reduce it (np.sum)."
        )
    dt = out.dtype
    if dt.kind not in "f":
        raise GradtapeError(f"grad of {fname} needs a real float output, got dtype {dt}.")
    return out._var if type(out) is Tracer and out._level is level else None


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0,
                   has_aux: bool = False) -> Callable:
    """`f(*args) -> (f(*args), gradient)`; the gradient has the structure of the argument(s)."""
    fname = getattr(f, "__name__", "the function")

    @functools.wraps(f)
    def value_and_grad_f(*args, **kwargs):
        nums, single = _normalize_argnums(argnums, len(args))
        with new_level(LevelKind.DIFFERENTIATE) as level:
            out, in_trees = _trace_call(f, args, kwargs, nums, level)
            aux = None
            if has_aux:
                if not (isinstance(out, (tuple, list)) and len(out) == 2):
                    raise GradtapeError("has_aux=True needs the function to return a pair "
                                        "(scalar, aux).")
                out, aux = out
            outvar = _scalar_output(out, level, fname)
        seed = np.ones(np.shape(out), dtype=out.dtype if hasattr(out, "dtype") else np.float64)
        cts = backward(level.tape, [outvar], [seed]) if outvar is not None else {}
        grads = _grads_for(in_trees, cts)
        value = _lower(out, level)
        g = grads[0] if single else tuple(grads)
        if has_aux:
            return (value, tree_map(lambda x: _lower(x, level), aux)), g
        return value, g

    return value_and_grad_f


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The gradient of a scalar function, with respect to argument(s) `argnums`."""
    vg = value_and_grad(f, argnums, has_aux)

    @functools.wraps(f)
    def grad_f(*args, **kwargs):
        (value, g) = vg(*args, **kwargs)
        if has_aux:
            return g, value[1]
        return g

    return grad_f


def vjp(f: Callable, *primals, has_aux: bool = False) -> tuple[Any, Callable]:
    """`(f(*primals), vjp_fn)`; `vjp_fn(cotangent)` returns one cotangent per primal."""
    nums = tuple(range(len(primals)))
    with new_level(LevelKind.DIFFERENTIATE) as level:
        out, in_trees = _trace_call(f, primals, {}, nums, level)
        aux = None
        if has_aux:
            out, aux = out
    out_leaves, out_td = tree_flatten(out)
    outvars = [x._var if type(x) is Tracer and x._level is level else None for x in out_leaves]

    def vjp_fn(cotangent):
        ct_leaves, ct_td = tree_flatten(cotangent)
        if ct_td != out_td:
            raise GradtapeError(f"vjp: the cotangent has structure {ct_td}, but the output has "
                                f"structure {out_td}.")
        for i, (c, o) in enumerate(zip(ct_leaves, out_leaves)):
            if np.shape(c) != np.shape(o):
                raise GradtapeError(f"vjp: cotangent leaf {i} has shape {np.shape(c)}, but the "
                                    f"output has shape {np.shape(o)}.")
        cts = backward(level.tape, outvars, ct_leaves)
        return tuple(_grads_for(in_trees, cts))

    value = tree_unflatten(out_td, [_lower(x, level) for x in out_leaves])
    if has_aux:
        return value, vjp_fn, tree_map(lambda x: _lower(x, level), aux)
    return value, vjp_fn
