"""Staging: record a whole program (every operation that depends on the inputs) as a Tape."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core import tracing as trace
from ..core.ir import Tape
from ..core.pytree import tree_flatten, tree_unflatten
from ..core.tracing import LevelKind, new_level


def trace_fn(f: Callable, *args, **kwargs) -> Tape:
    """Record `f(*args)` and return its tape: print it to see what gradtape records.

    Every leaf of every argument becomes a tape input. Guards (Python values the
    function asked of traced values) are listed after the instructions.

    Parameters
    ----------
    f : callable
        Plain NumPy/SciPy code.
    *args, **kwargs
        The arguments to call `f` with.

    Returns
    -------
    Tape
        The recorded program: inputs, instructions, outputs and guards.

    Raises
    ------
    GradtapeError
        When `f` does something that cannot be recorded (the message says what to write instead).

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> print(gt.trace(lambda x: np.sum(np.exp(x)), np.array([1.0, 2.0])))
    { lambda a:f64[2] .
        b:f64[2] = exp a
        c:f64[] = reduce_sum[axes=(0,), keepdims=False] b
      in (c) }
    """
    with new_level(LevelKind.STAGE) as level:
        inputs = []
        for a in args:
            leaves, td = tree_flatten(a)
            inputs.append(
                (
                    td,
                    [
                        level.new_input(
                            np.asarray(x) if isinstance(x, (int, float, complex)) else x
                        )
                        if hasattr(x, "dtype") or isinstance(x, (int, float, complex))
                        else x
                        for x in leaves
                    ],
                )
            )

        traced = [tree_unflatten(td, leaves) for td, leaves in inputs]
        out = f(*traced, **kwargs)
    leaves, _ = tree_flatten(out)
    level.tape.outputs = [
        x._var if type(x) is trace.Tracer and x._level is level else x for x in leaves
    ]
    return level.tape
