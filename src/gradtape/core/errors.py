"""The two exceptions every layer shares."""

from __future__ import annotations

from typing import Any


class GradtapeError(TypeError):
    """A traced function did something gradtape cannot differentiate; the message says why."""


class GuardFailure(Exception):
    """A recorded path does not hold for these inputs: another path must be recorded.

    `check` is what failed: a `Guard` of a tape being evaluated (core.interpret), or the index of
    a check in a compiled program (compile.program). `actual` is the value seen instead of the
    recorded answer.
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
