"""Which primitives have derivative rules that are right for complex values.

gradtape follows JAX's convention for complex numbers (docs/guide.md, "Complex numbers"): the
VJP of a primitive is the transpose of its derivative under the pairing Re(sum u * v), without
conjugation. A rule written for real numbers can be silently wrong on complex ones (a partial
derivative that is not the complex one, a result that should be conjugated, a function with no
derivative on the reals, such as sign, that has one on the complex plane). So the reverse and
forward interpreters differentiate an instruction that has complex inputs or outputs only when
its primitive declares its complex behaviour right (Primitive.complex_correct, tested); any
other raises a GradtapeError that names it, and so does `bind` for a nondifferentiable primitive
with a complex result (np.sign). Real tapes pay one attribute read per instruction.

Rule files declare their own primitives with `complex_rules(...)` (or `complex_correct=True`
in the declaration). The primitives of files that say nothing about complex numbers are listed
below, with the reason their rules hold.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.primitive import declare_complex_correct
from ..core.tracing import complex_refusal


def complex_rules(*names: str) -> None:
    """Declare that these primitives' rules are right (and tested) for complex values."""
    declare_complex_correct(*names)


complex_rules(
    # rearrangements, selections and their writes: each output element is one input element
    # (or a sum of them), so the transpose has no conjugate to miss
    "reshape",
    "transpose",
    "broadcast_to",
    "concatenate",
    "pad",
    "full_like",
    "getitem",
    "dyn_getitem",
    "setitem",
    "dyn_setitem",
    "scatter_add",
    "dyn_scatter_add",
    "where",
    # a cast: to complex the VJP takes the real part of the cotangent, from complex it puts the
    # real cotangent in the real part (JAX's convert_element_type)
    "astype",
    # contractions and holomorphic matrix functions: transposes without conjugation, as JAX's
    "matmul",
    "einsum",
    "inv",
    "det",
    "solve",
    # loops: their bodies are differentiated instruction by instruction, and checked there
    "scan",
    "scan_bwd",
    "while_loop",
    # nondifferentiable with complex results whose derivative is zero: a rounding (both parts
    # are rounded), stop_gradient, and the factorizations the solve rules read (their
    # derivatives are taken by those rules)
    "rint",
    "stop_gradient",
    "cho_factors",
    "lu_factors",
)


def check_complex(ins) -> None:
    """Raise when instruction `ins` has complex values and its primitive's rules are not
    declared right for them (call it only for primitives not declared complex_correct)."""
    for v in ins.outvars:
        if v.dtype.kind == "c":
            break
    else:
        for v, a in zip(ins.invars, ins.args):
            if v is not None:
                if v.dtype.kind == "c":
                    break
            elif type(a) is complex or getattr(getattr(a, "dtype", None), "kind", "") == "c":
                break
        else:
            return
    name = ins.prim.name
    if name.startswith(("custom_vjp[", "custom_jvp[")):
        return  # the user's own rule
    raise GradtapeError(complex_refusal(name))


def real_part(x):
    """The real part of a complex cotangent or tangent of a real value (a plain array is
    copied, so the result does not keep the complex array alive)."""
    if isinstance(x, np.ndarray):
        return x.real.copy()
    return np.real(x)
