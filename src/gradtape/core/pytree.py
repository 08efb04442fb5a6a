"""Nested tuples, lists and dicts of arrays ("pytrees"): flatten to leaves and rebuild."""

from __future__ import annotations

from typing import Any


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
        if self.kind == "namedtuple":
            return f"{self.meta.__name__}({inner})"
        return f"({inner})" if self.kind == "tuple" else f"[{inner}]"

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
    leaves.append(tree)
    return LEAF


def tree_unflatten(treedef: TreeDef, leaves) -> Any:
    it = iter(leaves)
    return _unflatten(treedef, it)


def _unflatten(td: TreeDef, it):
    if td.kind == "leaf":
        return next(it)
    if td.kind == "none":
        return None
    children = [_unflatten(c, it) for c in td.children]
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
