"""What `compile` remembers: one compiled function per (function, transform, options).

`compile(value_and_grad(f))` written inside a loop creates a new `value_and_grad` closure each
time; compiling it again would record and lower again (milliseconds). A closure's behaviour is
fixed by its code, the values of its cells, its defaults and its globals, so those are its key:
two closures with the same code over the same `f` and the same options are the same function.
The values of the globals the code names are part of the key too (rebinding a global the
function reads compiles again). Values enter the key by type and exact value (0.0 and -0.0, 1
and 1.0 differ), functions by that key again (so `grad(value_and_grad(f))` is found too),
modules, classes, builtins and ufuncs by identity. A function that reads anything else (an
array, a list, an object whose attributes may change) is not remembered: it is compiled each
time, as before, so a re-created compiled function never replays state that changed.

At most `config.max_compiled()` entries are kept (GRADTAPE_MAX_COMPILED), least recently used
dropped first.
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
from collections.abc import Callable

import numpy as np

from .. import config
from ..transforms.arguments import TransformedFunction

_MAX_DEPTH = 8  # closures inside closures followed this deep (transforms of transforms)


class _Unkeyable(Exception):
    pass


_PLAIN = frozenset({type(None), bool, int, str, bytes})
_BY_IDENTITY = frozenset({types.BuiltinFunctionType, np.ufunc, types.ModuleType})
_LIBRARIES = frozenset({"gradtape", "numpy", "scipy"})


def _value_key(v, depth: int, keep: list):
    """The key of one value; objects keyed by identity are appended to `keep` (the entry
    keeps them alive, so their ids are not reused while it is remembered)."""
    t = type(v)
    if t in _PLAIN:
        return (t, v)
    if t is float:
        return (t, v.hex())
    if t is TransformedFunction:  # (the common case, grad(f): its fields read directly)
        fields = v.__dict__
        transform = fields["_transform"]
        keep.append(transform)
        return (
            "transformed",
            id(transform),
            function_key(fields["_fun"], depth + 1, keep),
            _value_key(fields["_options"], depth, keep),
        )
    if t is tuple:
        kinds = tuple(map(type, v))
        if _PLAIN.issuperset(kinds):  # (0, False, False): compared with their types
            return (t, v, kinds)
        return (t, tuple([_value_key(x, depth, keep) for x in v]))
    if t is types.FunctionType:
        if _library(v) and not v.__closure__:  # a library's function, not a closure
            keep.append(v)
            return id(v)
        return function_key(v, depth + 1, keep)
    if t in _BY_IDENTITY:
        keep.append(v)
        return id(v)
    transformed = getattr(v, "transformed", None)
    if transformed is not None and type(transformed) is tuple:
        # what a transform returns (grad(f), vmap(f), ...): the transform, the user's function
        # and the options decide what it computes
        transform, fun, options = transformed
        keep.append(transform)
        return (
            "transformed",
            id(transform),
            function_key(fun, depth + 1, keep),
            _value_key(options, depth, keep),
        )
    if isinstance(v, (type, types.ModuleType)):
        keep.append(v)
        return id(v)
    if t is complex:
        return (t, v.real.hex(), v.imag.hex())
    if t is tuple or t is frozenset:
        kinds = tuple(map(type, v))
        if _PLAIN.issuperset(kinds):  # (0, False, False): compared with their types
            return (t, v, kinds)
        return (t, tuple([_value_key(x, depth, keep) for x in v]))
    if t is functools.partial:
        return (
            t,
            _value_key(v.func, depth + 1, keep),
            _value_key(v.args, depth, keep),
            _value_key(tuple(sorted(v.keywords.items())), depth, keep),
        )
    if isinstance(v, np.dtype):
        return (t, v)
    # anything else may change while the key stays the same (an object's attributes, an
    # array's elements): not remembered
    raise _Unkeyable


def function_key(fun, depth: int, keep: list):
    """The key of a Python function: its code, cell values, defaults and globals it reads."""
    if depth > _MAX_DEPTH:
        raise _Unkeyable
    if type(fun) is not types.FunctionType:
        return _value_key(fun, depth, keep)
    cells = fun.__closure__
    if cells:
        try:
            contents = tuple([_value_key(c.cell_contents, depth, keep) for c in cells])
        except ValueError:  # an empty cell (a name assigned later in the enclosing function)
            raise _Unkeyable from None
    else:
        contents = ()
    defaults = fun.__defaults__
    kwdefaults = fun.__kwdefaults__
    namespace = fun.__globals__
    keep.append(namespace)
    if _library(fun):  # (a transform's closure: its module's globals are not the user's)
        read = ()
    else:
        read = tuple(
            [
                _value_key(namespace[name], depth, keep)
                for name in _global_names(fun.__code__)
                if name in namespace
            ]
        )
    return (
        fun.__code__,
        contents,
        _value_key(defaults, depth, keep) if defaults else None,
        _value_key(tuple(sorted(kwdefaults.items())), depth, keep) if kwdefaults else None,
        id(namespace),
        read,
    )


_library_code: dict = {}


def _library(fun: types.FunctionType) -> bool:
    """Whether `fun` is defined in gradtape, NumPy or SciPy (by its module's globals: a
    transform's closure carries the user function's __module__)."""
    found = _library_code.get(fun.__code__)
    if found is None:
        found = str(fun.__globals__.get("__name__", "")).partition(".")[0] in _LIBRARIES
        if len(_library_code) < 4096:
            _library_code[fun.__code__] = found
    return found


_names_of: dict = {}


def _global_names(code: types.CodeType) -> tuple:
    """The names a code object (and the functions defined in it) may read as globals."""
    names = _names_of.get(code)
    if names is None:
        found = set(code.co_names)
        for c in code.co_consts:
            if type(c) is types.CodeType:
                found.update(_global_names(c))
        names = tuple(sorted(found))
        if len(_names_of) < 4096:
            _names_of[code] = names
    return names


_memo: dict = {}  # key -> [compiled function, objects its key holds by identity, last use]
_memo_lock = threading.Lock()
_clock = itertools.count()  # (next() on it is atomic: a hit needs no lock)


def remembered(fun: Callable, options: tuple, build: Callable[[], object]):
    """The compiled function for (fun, options): the one built before if remembered, else
    `build()` (remembered when `fun` can be keyed)."""
    keep: list = []
    try:
        # (a plain tuple: the dict keeps the hashes of stored keys, so a lookup hashes only
        # the new key, once)
        key = (function_key(fun, 0, keep), options)
        entry = _memo.get(key)  # (a dict read needs no lock)
    except (_Unkeyable, TypeError):  # (TypeError: an unhashable part)
        return build()
    if entry is not None:
        entry[2] = next(_clock)
        return entry[0]
    compiled = build()
    with _memo_lock:
        # (another thread may have built it too: the first one stays)
        entry = _memo.setdefault(key, [compiled, keep, 0])
        entry[2] = next(_clock)
        limit = config.max_compiled()
        while len(_memo) > limit:  # drop the least recently used
            del _memo[min(_memo, key=lambda k: _memo[k][2])]
    return entry[0]


def forget_all() -> None:
    """Forget every remembered compiled function (tests; `gradtape.reset` style cleanups)."""
    with _memo_lock:
        _memo.clear()
