"""vmap: a function of one example applied to a whole batch, with JAX's semantics.

The batched arguments become Tracers of a BATCH level: each stands for one member and holds
the whole batch (batch axis first) one level down. Every primitive the function applies is
rewritten by its batching rule into one call on the whole batch (rules/batching.py), so the
batched function is recorded, differentiated and compiled like any other: under `compile` the
numba backend fuses the batched loops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core import tracing as trace
from ..core.pytree import node_children, tree_flatten, tree_unflatten
from ..core.tracing import LevelKind, new_level

Tracer = trace.Tracer


def _axes_for_leaves(spec, tree, where: str) -> list:
    """The axis (int or None) of every leaf of `tree`, from the prefix tree `spec`."""
    if spec is None or isinstance(spec, (int, np.integer)):
        leaves, _ = tree_flatten(tree)
        return [None if spec is None else int(spec)] * len(leaves)
    if tree is None:
        return []
    spec_node, tree_node = node_children(spec), node_children(tree)
    if spec_node is not None and tree_node is not None:
        (spec_kind, spec_children), (tree_kind, tree_children) = spec_node, tree_node
        if spec_kind == tree_kind or (
            _sequence(spec_kind) and _sequence(tree_kind) and spec_kind[1] == tree_kind[1]
        ):
            return [
                a
                for s, t in zip(spec_children, tree_children)
                for a in _axes_for_leaves(s, t, where)
            ]
    raise ValueError(
        f"vmap {where}: the axes {spec!r} are not a prefix of the value's structure "
        f"({type(tree).__name__}); give an int, None, or a container shaped like the value"
    )


def _sequence(kind) -> bool:
    return isinstance(kind, tuple) and kind[0] in (tuple, list)


def _moved_to_front(x, axis: int, where: str):
    nd = np.ndim(x) if not hasattr(x, "ndim") else x.ndim
    if not -nd <= axis < nd:
        raise ValueError(
            f"vmap {where}: in_axes {axis} is out of range for an argument of {nd} dimensions "
            f"(shape {np.shape(x) if type(x) is not Tracer else x.shape})"
        )
    axis %= nd
    return x if axis == 0 else np.moveaxis(x, axis, 0)


def _size_error(sizes: list) -> ValueError:
    lines = "\n".join(
        f"  {where}: axis {axis} of shape {shape} has size {shape[axis]}"
        for where, axis, shape in sizes
    )
    return ValueError(
        "vmap got batched arguments of different sizes along their mapped axes:\n"
        f"{lines}\nGive every batched argument the same batch size, or map an argument with "
        "in_axes=None to pass it whole to every member."
    )


def vmap(fun: Callable, in_axes: Any = 0, out_axes: Any = 0) -> Callable:
    """Map `fun`, written for one example, over a batch: JAX's `vmap` on plain NumPy code.

    Each NumPy operation of `fun` runs once on the whole batch (batching rules per category of
    primitive), so the batched function is recorded, differentiated and compiled like any
    other; under `compile` the numba backend fuses the batched loops. vmap composes with every
    transform (vmap of grad gives per-example gradients; grad of vmap, vmap of jacobian,
    hessian and hvp, vmap of vmap).

    Parameters
    ----------
    fun : callable
        A function of arrays or pytrees of arrays (tuples, lists, dicts, named tuples,
        dataclasses, registered types).
    in_axes : int, None or tuple
        The batch axis of each argument: an int (negative counts from the end), None (the
        argument is passed whole to every member), or a tuple with one entry per positional
        argument whose entries may be containers shaped like that argument (a prefix of its
        structure). Keyword arguments are batched along axis 0.
    out_axes : int, None or pytree
        Where the batch axis goes in each output (a prefix of the output's structure); None
        for an output that does not depend on the batch.

    Returns
    -------
    callable
        The batched function: `vmap(f)(xs)[i]` equals `f(xs[i])` for every i.

    Raises
    ------
    ValueError
        The batched arguments disagree in size along their axes (each is listed), an axis is
        out of range, no argument is batched, or the axes do not match the arguments.
    GradtapeError
        The function asks for a Python value (`if x > 0:`) that differs across the batch, or
        an operation gives results of different shapes for different members.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> def loss(w, x, y):
    ...     return np.log1p(np.exp(-y * (x @ w)))
    >>> per_example = gt.vmap(gt.grad(loss), in_axes=(None, 0, 0))
    >>> per_example(np.zeros(3), np.ones((5, 3)), np.ones(5)).shape
    (5, 3)
    """
    if not callable(fun):
        raise TypeError(f"vmap expects a function, got {type(fun).__name__}")

    @functools.wraps(fun)
    def batched(*args, **kwargs):
        if isinstance(in_axes, (tuple, list)):
            if len(in_axes) != len(args):
                raise ValueError(
                    f"vmap in_axes has {len(in_axes)} entries but the function was called with "
                    f"{len(args)} positional arguments"
                )
            specs = list(in_axes)
        elif in_axes is None or isinstance(in_axes, (int, np.integer)):
            specs = [in_axes] * len(args)
        else:
            raise ValueError(
                f"vmap in_axes must be an int, None or a tuple with an entry per argument, "
                f"got {type(in_axes).__name__}"
            )
        tree = (tuple(args), kwargs)
        leaves, treedef = tree_flatten(tree)
        axes = [
            a
            for i, (s, x) in enumerate(zip(specs, args))
            for a in _axes_for_leaves(s, x, f"argument {i}")
        ]
        axes += _axes_for_leaves(0, kwargs, "keyword arguments")
        names = _leaf_names(args, kwargs)
        sizes = []
        moved = []  # each leaf, batched ones with the batch axis moved first
        for x, axis, where in zip(leaves, axes, names):
            if axis is None:
                moved.append(x)
                continue
            if not hasattr(x, "shape"):
                x = np.asarray(x)
            if x.ndim == 0:
                raise ValueError(
                    f"vmap {where}: a scalar cannot be mapped over (in_axes {axis}); pass it "
                    "with in_axes=None"
                )
            moved.append(_moved_to_front(x, axis, where))
            sizes.append((where, axis % x.ndim, tuple(x.shape)))
        if not sizes:
            raise ValueError(
                "vmap needs at least one batched argument: every in_axes entry is None"
            )
        if len({shape[axis] for _, axis, shape in sizes}) > 1:
            raise _size_error(sizes)
        size = sizes[0][2][sizes[0][1]]
        with new_level(LevelKind.BATCH, size) as level:
            inner = [
                m if axis is None else Tracer(m, level.new_batched_var(m), level)
                for m, axis in zip(moved, axes)
            ]
            args_in, kwargs_in = tree_unflatten(treedef, inner)
            out = fun(*args_in, **kwargs_in)
            return _unbatch_outputs(out, out_axes, level, size)

    return batched


def _leaf_names(args, kwargs) -> list:
    names = []
    for i, a in enumerate(args):
        n = len(tree_flatten(a)[0])
        names += [f"argument {i}" if n == 1 else f"argument {i} (leaf {j})" for j in range(n)]
    for k in sorted(kwargs, key=repr):
        n = len(tree_flatten(kwargs[k])[0])
        names += [f"keyword {k}" if n == 1 else f"keyword {k} (leaf {j})" for j in range(n)]
    return names


def _unbatch_outputs(out, out_axes, level, size: int):
    leaves, treedef = tree_flatten(out)
    axes = _axes_for_leaves(out_axes, out, "out_axes")
    result = []
    for x, axis in zip(leaves, axes):
        mine = type(x) is Tracer and x._level is level
        if axis is None:
            if mine:
                raise ValueError(
                    "vmap out_axes is None for an output that depends on the batch; give it "
                    "an axis (out_axes=0)"
                )
            result.append(x)
            continue
        if mine:
            value = x._value
        else:
            if not hasattr(x, "shape"):
                x = np.asarray(x)
            value = np.broadcast_to(x, (size,) + tuple(x.shape))
        nd = value.ndim
        if not -nd <= axis < nd:
            raise ValueError(
                f"vmap out_axes {axis} is out of range for an output of {nd} dimensions"
            )
        result.append(value if axis % nd == 0 else np.moveaxis(value, 0, axis % nd))
    return tree_unflatten(treedef, result)
