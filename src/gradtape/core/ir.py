"""The IR: variables, instructions, guards and the tape that holds them.

A tape is a linear SSA program. Every var knows its shape and dtype; an
instruction names its primitive, its inputs (a Var, or a constant value), its
outputs and its static params. Printing a tape gives a readable listing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DTYPE_SHORT = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "int64": "i64",
    "int32": "i32",
    "bool": "bool",
    "complex128": "c128",
    "complex64": "c64",
    "uint8": "u8",
    "int8": "i8",
}


class Released:
    """An array a differentiated tape no longer holds: no derivative rule reads its values, only
    its shape and dtype (eager `grad` frees intermediates as the function goes on). Using it
    as a value raises, so a rule that reads more than declared fails loudly."""

    __slots__ = ("shape", "dtype")
    __array_ufunc__ = None  # NumPy's operators and ufuncs refuse it

    def __init__(self, shape: tuple, dtype: np.dtype):
        self.shape = shape
        self.dtype = dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __array__(self, *args, **kwargs):
        raise RuntimeError(
            "gradtape: a derivative rule read a value the tape had released as unread; "
            "this is a bug in gradtape's declaration of that rule (please report it)"
        )

    def __repr__(self) -> str:
        return f"<released {self.dtype}{list(self.shape)}>"


class Var:
    """A value on the tape: an id, a shape and a dtype."""

    __slots__ = ("id", "shape", "dtype")

    def __init__(self, id: int, shape: tuple, dtype: np.dtype):
        self.id = id
        self.shape = shape
        self.dtype = dtype

    @property
    def name(self) -> str:
        n, s = self.id, ""
        while True:
            s = chr(ord("a") + n % 26) + s
            n = n // 26 - 1
            if n < 0:
                return s

    @property
    def type_str(self) -> str:
        dt = DTYPE_SHORT.get(str(self.dtype), str(self.dtype))
        return f"{dt}[{','.join(str(d) for d in self.shape)}]"

    def __repr__(self) -> str:
        return f"{self.name}:{self.type_str}"


class Instruction:
    """One primitive application: `outvars = prim(args..., **params)`.

    `invars[i]` is the Var of argument i when it is traced at this tape's level,
    else None (a constant, whose value is `args[i]`). `args` and `out` hold the
    values seen while recording; the reverse interpreter reads them. `source` is where the
    user's code asked for the operation, `(code object, instruction offset)`, on the tapes that are
    differentiated (None elsewhere): an error raised by a derivative rule names that line.
    `signature_code` is the loop search's memo of the instruction's signature code
    (compile/rolling.py: `(search serial, code)`, None until a search computes it).
    """

    __slots__ = ("prim", "invars", "args", "params", "outvars", "out", "source", "signature_code")

    def __init__(self, prim, invars, args, params, outvars, out, source=None):
        self.prim = prim
        self.invars = invars
        self.args = args
        self.params = params
        self.outvars = outvars
        self.out = out
        self.source = source
        self.signature_code = None

    def __repr__(self) -> str:
        outs = " ".join(repr(v) for v in self.outvars)
        ins = " ".join(
            v.name if v is not None else _const_str(a) for v, a in zip(self.invars, self.args)
        )
        ps = ""
        if self.params:
            ps = "[" + ", ".join(f"{k}={_param_str(p)}" for k, p in self.params.items()) + "]"
        return f"{outs} = {self.prim.name}{ps} {ins}"


def source_line_number(code, offset: int) -> int:
    """The line of the instruction at byte `offset` of `code` (a frame's `f_lasti`)."""
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return line
    return code.co_firstlineno


def source_text(source) -> str | None:
    """`file.py:12: the source line` for an Instruction's `source`, `(code, instruction
    offset)` as `tracing.user_frame` found it, or None."""
    if source is None:
        return None
    import linecache
    import os

    code, offset = source
    lineno = source_line_number(code, offset)
    line = linecache.getline(code.co_filename, lineno).strip()
    return f"{os.path.basename(code.co_filename)}:{lineno}: {line}"


@dataclass
class Guard:
    """A Python value a Tracer gave to the traced function: the tape is valid while it holds."""

    var: Var
    kind: str  # "bool", "int", "index", "item", "value"
    answer: Any
    where: str  # "file.py:12: source line"

    def __repr__(self) -> str:
        ans = _const_str(self.answer) if isinstance(self.answer, np.ndarray) else repr(self.answer)
        return f"guard {self.kind}({self.var.name}) == {ans}    # {self.where}"


class Tape:
    """A recorded program: input vars, instructions, output vars and guards.

    `trace(f, *args)` returns one; printing it lists every instruction with its shapes and
    dtypes, then the guards with the source lines that made them.

    Attributes
    ----------
    inputs : list of Var
        One var per leaf of the arguments.
    instructions : list of Instruction
        The recorded operations, in order.
    outputs : list
        The output vars (or constants).
    guards : list of Guard
        The Python values the function asked of traced values, with their source lines.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> tape = gt.trace(lambda x: np.sum(x * 2.0), np.array([1.0, 2.0]))
    >>> len(tape), len(tape.inputs), tape.guards
    (2, 1, [])
    """

    def __init__(self):
        self.inputs: list[Var] = []
        self.instructions: list[Instruction] = []
        self.outputs: list[Var | Any] = []
        self.guards: list[Guard] = []
        # (var, outer Tracer, value): outer traced values a loop body closed over
        self.captured: list = []

    def __len__(self) -> int:
        return len(self.instructions)

    def __str__(self) -> str:
        head = " ".join(repr(v) for v in self.inputs)
        if self.captured:
            head += " ; captured " + " ".join(repr(c[0]) for c in self.captured)
        lines = ["{ lambda " + head + " ."]
        for ins in self.instructions:
            lines.append("    " + repr(ins))
        for g in self.guards:
            lines.append("    " + repr(g))
        outs = ", ".join(v.name if isinstance(v, Var) else _const_str(v) for v in self.outputs)
        lines.append(f"  in ({outs}) }}")
        return "\n".join(lines)

    __repr__ = __str__


def _const_str(a) -> str:
    if isinstance(a, np.ndarray) and a.size > 4:
        dt = DTYPE_SHORT.get(str(a.dtype), str(a.dtype))
        return f"const:{dt}[{','.join(map(str, a.shape))}]"
    if isinstance(a, np.ndarray):
        return np.array2string(a, precision=4, separator=",").replace("\n", "")
    if isinstance(a, (float, np.floating)):
        return f"{float(a):.6g}"
    return repr(a)


def _param_str(p) -> str:
    if isinstance(p, np.ndarray):
        return _const_str(p)
    if isinstance(p, tuple):
        return "(" + ",".join(_param_str(x) for x in p) + ("," if len(p) == 1 else "") + ")"
    if isinstance(p, slice):
        parts = ["" if v is None else str(v) for v in (p.start, p.stop, p.step)]
        return ":".join(parts[:2]) + (f":{parts[2]}" if p.step is not None else "")
    if p is Ellipsis:
        return "..."
    return repr(p)
