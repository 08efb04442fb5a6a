"""What exported entry points (export.py) import: pointers as integers and back.

A native handle's data is an int64 array of addresses (its constant arrays); the generated
entry points turn each address into an array with `numba.carray`, which takes a void pointer.
Importing this module imports Numba: only generated modules import it.
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def address_to_voidptr(typingctx, address):
    """The void pointer at integer `address` (for numba.carray)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@intrinsic
def voidptr_to_address(typingctx, pointer):
    """The integer address of a void pointer (0 for NULL)."""
    if pointer != types.voidptr:
        return None

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], cgutils.intp_t)

    return types.intp(pointer), codegen


@intrinsic
def double_pointer_to_address(typingctx, pointer):
    """The integer address of a double pointer (0 for NULL)."""
    if not isinstance(pointer, types.CPointer):
        return None

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], cgutils.intp_t)

    return types.intp(pointer), codegen
