"""Pytrees: nested containers of arrays that every transform accepts and returns.

Tuples, lists, dicts, named tuples and None are pytree nodes; a dataclass is a node whose
children are its fields (automatically); any other type becomes a node with
`register_pytree_node`. Everything else is a leaf. `gt.grad`, `gt.vmap`, `gt.jacobian`,
`gt.compile` and the others take pytrees as arguments, return them, and accept them as
`has_aux` payloads. None is an empty node (no leaves), as in JAX.

Examples
--------
>>> import numpy as np, gradtape as gt
>>> params = {"w": np.ones(3), "b": 0.5}
>>> leaves, treedef = gt.tree_util.tree_flatten(params)
>>> gt.tree_util.tree_unflatten(treedef, [2 * x for x in leaves])
{'b': 1.0, 'w': array([2., 2., 2.])}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .core.pytree import TreeDef
from .core.pytree import register_pytree_node as _register
from .core.pytree import tree_flatten as _flatten
from .core.pytree import tree_unflatten as _unflatten

__all__ = [
    "TreeDef",
    "register_pytree_node",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_structure",
    "tree_unflatten",
]


def tree_flatten(tree: Any) -> tuple[list, TreeDef]:
    """The leaves of `tree` (depth first; dict entries in sorted key order) and its structure.

    Parameters
    ----------
    tree : pytree
        Nested tuples, lists, dicts, named tuples, None, dataclasses and registered types.

    Returns
    -------
    tuple
        (leaves, treedef); `tree_unflatten(treedef, leaves)` rebuilds the tree.

    Raises
    ------
    TypeError
        A registered type's flatten function returned auxiliary data that is not hashable.

    Examples
    --------
    >>> tree_flatten((1, [2, None], {"a": 3}))[0]
    [1, 2, 3]
    """
    return _flatten(tree)


def tree_unflatten(treedef: TreeDef, leaves: Any) -> Any:
    """The pytree of structure `treedef` with these leaves.

    Parameters
    ----------
    treedef : TreeDef
        A structure, from `tree_flatten` or `tree_structure`.
    leaves : iterable
        The leaves, in flattening order.

    Returns
    -------
    pytree
        The tree.

    Raises
    ------
    ValueError
        The number of leaves differs from the structure's.

    Examples
    --------
    >>> _, td = tree_flatten((0, {"a": 0}))
    >>> tree_unflatten(td, [1, 2])
    (1, {'a': 2})
    """
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise ValueError(
            f"tree_unflatten: the structure {treedef} has {treedef.num_leaves} leaves, "
            f"{len(leaves)} were given"
        )
    return _unflatten(treedef, leaves)


def tree_leaves(tree: Any) -> list:
    """The leaves of `tree` in flattening order.

    Parameters
    ----------
    tree : pytree
        The tree.

    Returns
    -------
    list
        Its leaves (None is an empty node, not a leaf).

    Examples
    --------
    >>> tree_leaves({"b": 2, "a": (1, None)})
    [1, 2]
    """
    return _flatten(tree)[0]


def tree_structure(tree: Any) -> TreeDef:
    """The structure of `tree` without its leaves.

    Parameters
    ----------
    tree : pytree
        The tree.

    Returns
    -------
    TreeDef
        Hashable; equal for trees of equal structure.

    Examples
    --------
    >>> tree_structure((1, [2, 3])) == tree_structure((4, [5, 6]))
    True
    """
    return _flatten(tree)[1]


def tree_map(f: Callable, tree: Any, *rest: Any) -> Any:
    """`f` applied to each leaf of `tree` and the corresponding leaves of `rest`.

    Parameters
    ----------
    f : callable
        A function of as many leaves as there are trees.
    tree : pytree
        The first tree; its structure is the result's.
    *rest : pytree
        Further trees of the same structure.

    Returns
    -------
    pytree
        A tree of the structure of `tree` holding the results of `f`.

    Raises
    ------
    ValueError
        A tree in `rest` has another structure.

    Examples
    --------
    >>> tree_map(lambda x, y: x + y, {"a": 1, "b": (2,)}, {"a": 10, "b": (20,)})
    {'a': 11, 'b': (22,)}
    """
    leaves, td = _flatten(tree)
    others = []
    for i, other in enumerate(rest):
        other_leaves, other_td = _flatten(other)
        if other_td != td:
            raise ValueError(
                f"tree_map: tree {i + 1} has structure {other_td}, the first has structure {td}"
            )
        others.append(other_leaves)
    return _unflatten(td, [f(*xs) for xs in zip(leaves, *others)])


def register_pytree_node(
    node_type: type,
    flatten_func: Callable[[Any], tuple[Any, Any]],
    unflatten_func: Callable[[Any, Any], Any],
) -> None:
    """Make instances of `node_type` pytree nodes (JAX's signature).

    Parameters
    ----------
    node_type : type
        The class.
    flatten_func : callable
        `node -> (children, aux_data)`: children a sequence of pytrees, aux_data the static
        part (hashable: it is part of the structure, so compiled code records again when it
        changes).
    unflatten_func : callable
        `(aux_data, children) -> node`.

    Returns
    -------
    None

    Raises
    ------
    TypeError
        `node_type` is not a type.
    ValueError
        `node_type` is a built-in node (tuple, list, dict, None).

    Examples
    --------
    >>> class Box:
    ...     def __init__(self, value, label):
    ...         self.value, self.label = value, label
    >>> register_pytree_node(
    ...     Box, lambda b: ((b.value,), b.label), lambda label, ch: Box(ch[0], label)
    ... )
    >>> tree_leaves(Box(3.0, "x"))
    [3.0]
    """
    _register(node_type, flatten_func, unflatten_func)
