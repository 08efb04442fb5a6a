"""Scalar expressions: what an elementwise instruction computes per element, as Numba source.

An elementwise primitive fuses into native loops when its declaration names its scalar
expression: `Primitive.native` (the `native=` keyword of `rules.elementwise.elementwise`).
Nothing here lists primitives: a new ufunc declared with a `native` form fuses with no other
edit. The forms:

* a string, or a tuple of strings: alternatives, tried in order; the first that applies
  to the instruction's loop is used. If none applies, the instruction is not fused (it runs
  through NumPy between kernels).
* `"np.sqrt"`, `"fast_exp"`, `"math.lgamma"`: a function (of NumPy as Numba implements it,
  of the vectorizable libm `fastmath`, of `math` or of the kernels' `runtime`) called on the
  operands.
* `"({0} + {1})"`: a template of the operands `{0}`, `{1}`, ... ; `{one}` and `{zero}` are
  literals of the loop's dtype.
* a guard before either, `"guard:..."`: the alternative applies only to loops whose input
  dtypes are all one dtype, of a kind the guard names. `float:` floating point; `signed:`
  floating point or signed integer; `float64:` floating point, and the expression's value is
  a float64 (cast to the output's dtype when that differs: the functions of `math`).
  Unguarded alternatives apply to every loop.
* `"@name"`: a rule of `RULES` below, for what a template cannot say. `@select` (where),
  `@convert` (astype), `@broadcast` (broadcast_to) and `@nan_safe_product` (a derivative
  rule's NaN-safe product) are whole forms: they also choose the loop's dtypes.
  `@small_power` (x ** c for a constant small integer c, as multiplications)
  and `@invariant_divisor` (x / d in a loop, d the same for every element, as x * (1 / d))
  refine the alternatives after them, which must cover every loop.

Operands reach an expression converted to the loop's input dtypes, which NumPy's own type
resolution of the ufunc chooses (`loop_dtypes`); the expression's value is then converted to
the output's dtype where Numba would give another type. Everything computes what NumPy
computes, except where a rule says otherwise (the fast functions are within an ulp of NumPy;
see fastmath.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...core.ir import Instruction, Var
from ...core.primitive import Primitive
from ..numpy_backend import ufunc_of

SUPPORTED_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float32,
        np.float64,
    )
)
# the dtypes Numba's arithmetic yields as NumPy's does (others are converted explicitly)
NATIVE_RESULT = frozenset(np.dtype(t) for t in (np.bool_, np.int64, np.float32, np.float64))
F32, F64, BOOL = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.bool_)


def numpy_type(dtype: np.dtype) -> str:
    """The Numba (NumPy) scalar type of `dtype`, as source: `np.float64`."""
    return f"np.{dtype.name}" if dtype != BOOL else "np.bool_"


def cast(expr: str, dtype: np.dtype) -> str:
    """`expr` converted to `dtype` in Numba."""
    if dtype == BOOL:
        return f"({expr} != 0)"
    return f"{numpy_type(dtype)}({expr})"


def literal(value, dtype: np.dtype) -> str:
    """A Numba expression for the constant `value` of `dtype` (typed: no silent promotion)."""
    if dtype == BOOL:
        return "True" if bool(value) else "False"
    if dtype.kind == "f":
        x = float(value)
        text = (
            repr(x)
            if math.isfinite(x)
            else ("np.nan" if x != x else ("np.inf" if x > 0 else "-np.inf"))
        )
        return text if dtype == F64 else f"np.float32({text})"
    text = repr(int(value))
    return text if dtype == np.dtype(np.int64) else f"{numpy_type(dtype)}({text})"


def operand_dtype(v: Var | None, a):
    """What resolve_dtypes needs: the dtype, or the Python type of a weak scalar."""
    if v is not None:
        return v.dtype
    if type(a) in (int, float, bool):
        return type(a)
    return np.asarray(a).dtype


# --- rules ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """A named native form (`"@name"`).

    dtypes(ins) -> (input dtypes, output dtype): the loop's dtypes, for whole forms (None:
    NumPy's resolution of the primitive's ufunc). admits(ins): whether it makes the
    instruction fusable by itself (refinements never do). expression(ins, args, in_dts,
    out_dt, in_loop) -> the expression, or None where the rule does not apply.
    """

    expression: Callable[..., str | None]
    dtypes: Callable[[Instruction], tuple] | None = None
    admits: Callable[[Instruction], bool] = lambda ins: False


_SMALL_POWERS = {
    0: "{one}",
    1: "{0}",
    2: "({0} * {0})",
    3: "({0} * {0} * {0})",
    4: "(({0} * {0}) * ({0} * {0}))",
    -1: "({one} / {0})",
    -2: "({one} / ({0} * {0}))",
}


def _small_power(ins, args, in_dts, out_dt, in_loop) -> str | None:
    """x ** y for a constant y: multiplications for small integer powers (vectorizable)."""
    dt = in_dts[0]
    if ins.invars[1] is not None or dt.kind != "f":
        return None
    exponent = np.asarray(ins.args[1])
    if exponent.size != 1 or exponent.dtype.kind not in "iuf":
        return None  # an array of exponents (or complex ones): np.power per element
    y = float(exponent.reshape(()))
    if y.is_integer() and int(y) in _SMALL_POWERS:
        return _SMALL_POWERS[int(y)].format(args[0], one=literal(1.0, dt))
    return None


def _invariant_divisor(ins, args, in_dts, out_dt, in_loop) -> str | None:
    """In a loop, x / d by a loop-invariant d is x * (1 / d) (LLVM computes 1 / d once): a
    division costs 16 times a multiplication in AVX-512 throughput, and the product is within
    an ulp of the quotient."""
    dt = in_dts[0]
    if not (in_loop and dt.kind == "f" and in_dts[1] == dt):
        return None
    v, a = ins.invars[1], ins.args[1]
    invariant = (
        (np.size(a) == 1 and np.isfinite(a) and a != 0) if v is None else (math.prod(v.shape) == 1)
    )
    return f"({args[0]} * ({literal(1.0, dt)} / {args[1]}))" if invariant else None


def _converted(ins, args, in_dts, out_dt, in_loop) -> str:
    return args[0] if in_dts[0] == out_dt else cast(args[0], out_dt)


def _own_dtype(ins: Instruction) -> tuple:
    return (operand_dtype(ins.invars[0], ins.args[0]),), ins.outvars[0].dtype


RULES: dict[str, Rule] = {
    "select": Rule(
        lambda ins, args, *_: f"({args[1]} if {args[0]} else {args[2]})",
        dtypes=lambda ins: (
            (BOOL, ins.outvars[0].dtype, ins.outvars[0].dtype),
            ins.outvars[0].dtype,
        ),
        admits=lambda ins: True,
    ),
    "convert": Rule(_converted, dtypes=_own_dtype, admits=lambda ins: True),
    # a constant of several elements is not broadcast in a loop
    "broadcast": Rule(
        _converted,
        dtypes=_own_dtype,
        admits=lambda ins: ins.invars[0] is not None or np.size(ins.args[0]) == 1,
    ),
    # g * p with 0 where g == 0 and p is infinite or NaN (rules/elementwise.py, the NaN-safe
    # products of derivative rules), in the loop of NumPy's multiply for floating dtypes
    "nan_safe_product": Rule(
        lambda ins, args, in_dts, out_dt, in_loop: f"nan_safe_product({args[0]}, {args[1]})",
        dtypes=lambda ins: ((ins.outvars[0].dtype,) * 2, ins.outvars[0].dtype),
        admits=lambda ins: ins.outvars[0].dtype.kind == "f",
    ),
    "small_power": Rule(_small_power),
    "invariant_divisor": Rule(_invariant_divisor),
}


# --- native forms -----------------------------------------------------------------------------
_GUARDS = {"float": "f", "signed": "fi", "float64": "f"}
_GUARD = re.compile(r"^(float|signed|float64):(.*)$", re.S)


@dataclass(frozen=True)
class Alternative:
    """One alternative of a native form (see the module docstring)."""

    rule: Rule | None = None
    kinds: str | None = None  # None: every loop
    template: str = ""
    float64: bool = False

    def applies(self, in_dts: tuple) -> bool:
        """Whether this template alternative applies to a loop of these input dtypes."""
        if self.kinds is None:
            return True
        dt = in_dts[0]
        return dt.kind in self.kinds and all(d == dt for d in in_dts)

    def write(self, args: list[str], dt: np.dtype) -> str:
        """The template (or the function call) on these operands."""
        if "{" not in self.template:
            return f"{self.template}({', '.join(args)})"
        extra = {}
        if "{one}" in self.template:
            extra["one"] = literal(1.0, dt)
        if "{zero}" in self.template:
            extra["zero"] = literal(0.0, dt)
        return self.template.format(*args, **extra)


def parse(form) -> tuple[Alternative, ...]:
    """The alternatives of a native form; raises ValueError for one this module cannot read."""
    if form is None:
        return ()
    alternatives = []
    for text in (form,) if isinstance(form, str) else tuple(form):
        if not isinstance(text, str) or not text:
            raise ValueError(f"a native form is a string or a tuple of strings, not {form!r}")
        if text.startswith("@"):
            rule = RULES.get(text[1:])
            if rule is None:
                raise ValueError(
                    f"unknown native rule {text!r} (known: {', '.join('@' + r for r in RULES)})"
                )
            alternatives.append(Alternative(rule=rule))
            continue
        match = _GUARD.match(text)
        if match is None:
            alternatives.append(Alternative(template=text))
        else:
            guard, template = match.groups()
            alternatives.append(
                Alternative(kinds=_GUARDS[guard], template=template, float64=guard == "float64")
            )
    return tuple(alternatives)


_parsed: dict[Primitive, tuple[Alternative, ...]] = {}


def alternatives(prim: Primitive) -> tuple[Alternative, ...]:
    """The parsed native form of a primitive (cached)."""
    found = _parsed.get(prim)
    if found is None:
        found = _parsed[prim] = parse(prim.native)
    return found


def loop_dtypes(ins: Instruction):
    """(input dtypes, output dtype) of the NumPy loop an elementwise instruction runs, or
    None when NumPy has no loop for these operands."""
    for alt in alternatives(ins.prim):
        if alt.rule is not None and alt.rule.dtypes is not None:
            return alt.rule.dtypes(ins)
    uf = ufunc_of(ins.prim)
    if uf is None:
        return None
    try:
        dts = uf.resolve_dtypes(
            tuple(operand_dtype(v, a) for v, a in zip(ins.invars, ins.args)) + (None,) * uf.nout
        )
    except (TypeError, ValueError, OverflowError):
        return None
    return tuple(np.dtype(d) for d in dts[: uf.nin]), np.dtype(dts[-1])


def _supported_operands(ins: Instruction) -> bool:
    for v, a in zip(ins.invars, ins.args):
        if v is None and not isinstance(a, (int, float, bool, np.generic, np.ndarray)):
            return False
        if (v.dtype if v is not None else np.asarray(a).dtype) not in SUPPORTED_DTYPES:
            return False
    return ins.outvars[0].dtype in SUPPORTED_DTYPES


def fusable(ins: Instruction) -> bool:
    """Whether an elementwise instruction has a scalar expression here (a declared native form
    with an alternative for its loop's dtypes)."""
    if len(ins.outvars) != 1 or ins.prim.multiple_results:
        return False
    alts = alternatives(ins.prim)
    if not alts or not _supported_operands(ins):
        return False
    if any(
        alt.rule is not None and alt.rule.dtypes is not None and not alt.rule.admits(ins)
        for alt in alts
    ):
        return False
    dts = loop_dtypes(ins)
    if (
        dts is None
        or dts[1] not in SUPPORTED_DTYPES
        or any(d not in SUPPORTED_DTYPES for d in dts[0])
    ):
        return False
    return any(
        alt.rule.admits(ins) if alt.rule is not None else alt.applies(dts[0]) for alt in alts
    )


def scalar_expression(ins: Instruction, args: list[str], in_loop: bool = False) -> str:
    """The Numba expression of an elementwise instruction on operand expressions `args`
    (variables or literals already converted to the loop's input dtypes); `in_loop`: it is
    computed per element of a loop (not once, on size-1 values)."""
    in_dts, out_dt = loop_dtypes(ins)
    dt = in_dts[0] if in_dts else out_dt
    for alt in alternatives(ins.prim):
        if alt.rule is not None:
            expr = alt.rule.expression(ins, args, in_dts, out_dt, in_loop)
            if expr is None:
                continue
        elif alt.applies(in_dts):
            expr = alt.write(args, dt)
        else:
            continue
        if alt.float64:
            return expr if out_dt == F64 else cast(expr, out_dt)
        return expr if out_dt in NATIVE_RESULT else cast(expr, out_dt)
    raise NotImplementedError(
        f"no native form of {ins.prim.name} for a loop of {', '.join(d.name for d in in_dts)}"
    )
