"""A loop body's step as a compile Program, and the arguments of the backward loop.

A recorded loop body (scan, while_loop) is a tape whose inputs are the step's inputs and
whose captured values are the outer traced values it closed over. The Python loops run it
through the numpy backend one step at a time; the native drivers (native_loops) generate a
kernel of it. Both turn it into a Program here. The backward loop primitive (`scan_bwd`)
takes its arguments in the order `BackwardLoopArgs` defines: the loop rules that bind it,
its implementations and its JVP rule all read and write them through that one definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.ir import Tape, Var
from ..core.pytree import tree_flatten
from .program import Program, build_program, output_leaf


def body_inputs(tape: Tape) -> list:
    """A body tape's inputs, then the vars of the outer values it captured (the order in
    which a step takes its arguments)."""
    return tape.inputs + [c[0] for c in tape.captured]


def step_program(tape: Tape, inputs: list, roll: bool | None = None) -> Program:
    """The compile Program of one step: `tape` read with these input vars (usually
    `body_inputs(tape)`), its outputs a flat tuple, its guards kept as checks; `roll`:
    Python loops in it may be rolled (None: as GRADTAPE_ROLL says; False for a native
    driver's step kernel)."""
    flat = Tape()
    flat.inputs = list(inputs)
    flat.instructions = tape.instructions
    flat.guards = tape.guards
    flat.outputs = tape.outputs
    leaves = [
        output_leaf(np.empty(o.shape, o.dtype), o) if isinstance(o, Var) else output_leaf(o, None)
        for o in tape.outputs
    ]
    td = tree_flatten(tuple(range(len(leaves))))[1]
    return build_program(flat, leaves, td, roll)


@dataclass
class BackwardLoopArgs:
    """The arguments of the backward loop (`scan_bwd`), in this order.

    g_carry:  cotangents of the final carry (n_carry of them).
    g_ys:     cotangents of the stacked per-step outputs ys (n_y).
    stored:   the carries the forward loop stored, stacked (n_carry; every `checkpoint`-th
              step's with checkpoint=; a while loop's trip count is their length).
    xs:       the stacked per-step inputs (n_x).
    caps:     the outer values the body captured.
    g_stored: cotangents of the stored carries (n_carry), which only a second
              differentiation sends back; empty otherwise (`stored_cotangents` False).

    The loop returns the cotangents of the final carry's initial value (n_carry), of xs
    (n_x) and of caps, in that order (`outputs`).
    """

    g_carry: list
    g_ys: list
    stored: list
    xs: list
    caps: list
    g_stored: list

    @classmethod
    def split(
        cls, args: Sequence, n_carry: int, n_x: int, n_y: int, stored_cotangents: bool
    ) -> BackwardLoopArgs:
        """The parts of the flat argument list `args` of a backward loop with these params."""
        nc = n_carry
        rest = list(args[2 * nc + n_y + n_x :])
        n_caps = len(rest) - (nc if stored_cotangents else 0)
        return cls(
            list(args[:nc]),
            list(args[nc : nc + n_y]),
            list(args[nc + n_y : 2 * nc + n_y]),
            list(args[2 * nc + n_y : 2 * nc + n_y + n_x]),
            rest[:n_caps],
            rest[n_caps:],
        )

    def flat(self) -> tuple:
        """The argument list the primitive is bound with."""
        return (*self.g_carry, *self.g_ys, *self.stored, *self.xs, *self.caps, *self.g_stored)

    def params(self, program, length: int, reverse: bool, checkpoint: int | None) -> dict:
        """The primitive's params for these arguments and the loop's own options."""
        return dict(
            program=program,
            n_carry=len(self.g_carry),
            n_x=len(self.xs),
            n_y=len(self.g_ys),
            length=length,
            reverse=reverse,
            checkpoint=checkpoint,
            stored_cotangents=bool(self.g_stored),
        )

    def outputs(self, outs: Sequence) -> tuple[list, list, list]:
        """The loop's results split as (initial carry, xs, caps) cotangents."""
        nc, nx = len(self.g_carry), len(self.xs)
        return list(outs[:nc]), list(outs[nc : nc + nx]), list(outs[nc + nx :])
