"""Nested containers of arrays ("pytrees"): flatten to leaves and rebuild.

Tuples, lists, dicts, named tuples and None are built in; dataclasses are pytrees of their
fields automatically; any other type becomes one with `register_pytree_node`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

# type -> (flatten(node) -> (children, aux), unflatten(aux, children) -> node)
_NODES: dict = {}


def register_pytree_node(
    node_type: type, flatten: Callable[[Any], tuple], unflatten: Callable[[Any, Any], Any]
) -> None:
    """Make `node_type` a pytree node: `flatten(node) -> (children, aux)` with `aux` hashable
    (the static part), and `unflatten(aux, children) -> node`."""
    if not isinstance(node_type, type):
        raise TypeError(f"register_pytree_node expects a type, got {node_type!r}")
    if node_type in (tuple, list, dict, type(None)):
        raise ValueError(f"{node_type.__name__} is already a pytree node")
    _NODES[node_type] = (flatten, unflatten)


def _dataclass_flatten(node) -> tuple:
    return [getattr(node, f.name) for f in dataclasses.fields(node)], None


def _dataclass_unflatten(cls, children):
    node = object.__new__(cls)
    for f, value in zip(dataclasses.fields(cls), children):
        object.__setattr__(node, f.name, value)  # also for frozen dataclasses
    return node


def _node_rules(t: type):
    """(flatten, unflatten) of a registered type or a dataclass; None for a leaf."""
    hit = _NODES.get(t)
    if hit is not None:
        return hit
    if dataclasses.is_dataclass(t):
        return _dataclass_flatten, functools.partial(_dataclass_unflatten_aux, t)
    return None


def _dataclass_unflatten_aux(cls, aux, children):
    return _dataclass_unflatten(cls, children)


class TreeDef:
    """The structure of a pytree with its leaves removed; hashable, so it can key a cache."""

    __slots__ = ("kind", "meta", "children", "_hash")

    def __init__(self, kind: str, meta: Any, children: tuple):
        self.kind = kind
        self.meta = meta
        self.children = children
        self._hash = hash((kind, meta, children))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, TreeDef)
            and self._hash == other._hash
            and self.kind == other.kind
            and self.meta == other.meta
            and self.children == other.children
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        if self.kind == "dict":
            return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(self.meta, self.children)) + "}"
        inner = ", ".join(map(repr, self.children))
        if self.kind == "custom":
            return f"{self.meta[0].__name__}({inner})"
        if self.kind == "namedtuple":
            return f"{self.meta.__name__}({inner})"
        return f"({inner})" if self.kind == "tuple" else f"[{inner}]"

    def rebuild(self, children: list):
        """A custom node (registered type or dataclass) from its rebuilt children."""
        cls, aux = self.meta
        return _node_rules(cls)[1](aux, list(children))

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)


LEAF = TreeDef("leaf", None, ())
NONE = TreeDef("none", None, ())


def tree_flatten(tree) -> tuple[list, TreeDef]:
    leaves: list = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree, leaves: list) -> TreeDef:
    t = type(tree)
    if t is tuple or t is list:
        return TreeDef(t.__name__, None, tuple(_flatten(c, leaves) for c in tree))
    if isinstance(tree, tuple) and hasattr(t, "_fields"):  # a named tuple (np.linalg.eigh's)
        return TreeDef("namedtuple", t, tuple(_flatten(c, leaves) for c in tree))
    if t is dict:
        keys = tuple(sorted(tree, key=repr))
        return TreeDef("dict", keys, tuple(_flatten(tree[k], leaves) for k in keys))
    if tree is None:
        return NONE
    if t in _NODES or hasattr(t, "__dataclass_fields__"):
        rules = _node_rules(t)
        if rules is not None:
            children, aux = rules[0](tree)
            try:
                hash(aux)
            except TypeError:
                raise TypeError(
                    f"the flatten function of pytree node {t.__name__} returned auxiliary data "
                    f"that is not hashable ({type(aux).__name__}); return a hashable value "
                    "(a tuple instead of a list, for instance)"
                ) from None
            return TreeDef("custom", (t, aux), tuple(_flatten(c, leaves) for c in children))
    leaves.append(tree)
    return LEAF


def node_children(tree) -> tuple[Any, list] | None:
    """(what identifies the node's kind, its children) for a pytree node; None for a leaf or
    None. Two nodes with equal kinds have children that correspond one to one."""
    t = type(tree)
    if t is tuple or t is list or (isinstance(tree, tuple) and hasattr(t, "_fields")):
        return (t, len(tree)), list(tree)
    if t is dict:
        keys = tuple(sorted(tree, key=repr))
        return ("dict", keys), [tree[k] for k in keys]
    if tree is not None and (t in _NODES or hasattr(t, "__dataclass_fields__")):
        rules = _node_rules(t)
        if rules is not None:
            children, aux = rules[0](tree)
            return (t, aux), list(children)
    return None


def tree_unflatten(treedef: TreeDef, leaves) -> Any:
    it = iter(leaves)
    return _unflatten(treedef, it)


def _unflatten(td: TreeDef, it):
    if td.kind == "leaf":
        return next(it)
    if td.kind == "none":
        return None
    children = [_unflatten(c, it) for c in td.children]
    if td.kind == "custom":
        return td.rebuild(children)
    if td.kind == "tuple":
        return tuple(children)
    if td.kind == "namedtuple":
        return td.meta(*children)
    if td.kind == "list":
        return children
    return dict(zip(td.meta, children))


def tree_map(fn, tree):
    leaves, td = tree_flatten(tree)
    return tree_unflatten(td, [fn(x) for x in leaves])
