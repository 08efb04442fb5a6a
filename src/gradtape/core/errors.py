"""The exceptions every layer shares."""

from __future__ import annotations

from typing import Any


class GradtapeError(TypeError):
    """A traced function did something gradtape cannot differentiate or record; the message says
    what, where (the user's source line) and what to write instead.

    A subclass of `TypeError`, as NumPy raises for operations a type does not support.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> try:
    ...     gt.grad(lambda x: float(x[0]))(np.array([1.0]))
    ... except gt.GradtapeError:
    ...     print("refused")
    refused
    """


class TracedAttributeError(GradtapeError, AttributeError):
    """Code asked a traced value for an attribute only a plain ndarray has (`.flags`,
    `.strides`, ...): a GradtapeError, and an AttributeError too, so `hasattr(x, "flags")` and
    `getattr(x, "strides", None)` still answer as for any object without the attribute.

    Functions without a gradtape rule that hand arrays to compiled code do this (SciPy's
    LAPACK wrappers look at `.flags`); the message names the user's line and the library's.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> try:
    ...     gt.grad(lambda x: x.strides)(np.ones(3))
    ... except gt.TracedAttributeError:
    ...     print("refused")
    refused
    """


class NotExportableError(GradtapeError):
    """A compiled function cannot become a native handle (`as_native`): an operation without
    native code, a loop, arguments or results a handle cannot carry. The message says which
    and where; the compiled function itself still computes it, from Python. `reason` is the
    message without its advice.

    Examples
    --------
    >>> import gradtape as gt
    >>> str(gt.NotExportableError("as_native: f cannot be exported", "f cannot be exported"))
    'as_native: f cannot be exported'
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class GuardFailure(Exception):
    """A recorded path does not hold for these inputs: another path must be recorded.

    gradtape catches it itself (a compiled function records the new path as another variant); it
    reaches user code only through an evaluated tape or a compiled program called directly.

    `check` is what failed: a `Guard` of a tape being evaluated (core.interpret), or the index of
    a check in a compiled program (compile.program). `actual` is the value seen instead of the
    recorded answer.

    Examples
    --------
    >>> import gradtape as gt
    >>> str(gt.GuardFailure(0, True))
    '0: got True'
    """

    def __init__(self, check: Any, actual: Any):
        super().__init__(check, actual)
        self.check = check
        self.actual = actual

    @property
    def index(self) -> int:
        """The index of the failed check in a compiled program."""
        return self.check

    def __str__(self) -> str:
        return f"{self.check!r}: got {self.actual!r}"
