"""Which loop primitives run a native driver, and how to build one (a leaf module).

Control flow, declared above compile, registers its loop primitives through
`loops.register_driver`; the code generator asks `has_driver` and `native_loop` here, so it
does not import the drivers' module (which compiles through the backend).
"""

from __future__ import annotations

from collections.abc import Callable

from ...core.primitive import Primitive

__all__ = ["build_spec", "has_driver", "native_loop", "register"]

# loop primitive -> (build(params, args) -> LoopSpec, the class that runs its instructions)
_DRIVERS: dict[Primitive, tuple[Callable, Callable]] = {}


def register(prim: Primitive, build: Callable, runner: Callable) -> None:
    """Give `prim` a native driver: `build(params, args)` writes it and `runner(prim)` is
    the callable a compiled wrapper calls in place of the primitive."""
    _DRIVERS[prim] = (build, runner)


def has_driver(prim: Primitive) -> bool:
    """Whether a loop primitive's instructions run a native driver (scan, its backward loop,
    while_loop)."""
    return prim in _DRIVERS


def build_spec(prim: Primitive, params: dict, args: tuple):
    """The driver of this loop instruction (raises Unsupported for what stays in Python)."""
    return _DRIVERS[prim][0](params, args)


def native_loop(prim: Primitive):
    """A new runner for one instruction of the loop primitive `prim`."""
    return _DRIVERS[prim][1](prim)
