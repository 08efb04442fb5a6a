"""Warnings of the numba backend, said once per cause (a leaf module)."""

from __future__ import annotations

import threading
import warnings

__all__ = ["NativeFallbackWarning", "warn_once"]


class NativeFallbackWarning(UserWarning):
    """Part of a compiled function runs through NumPy (a primitive without native code, or a
    kernel Numba could not compile): results are exact, only slower.

    Emitted once per cause by the numba backend and by the native drivers of loops.

    Examples
    --------
    >>> import warnings
    >>> import gradtape as gt
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", gt.NativeFallbackWarning)
    """


_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(message: str) -> None:
    with _warn_lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, NativeFallbackWarning, stacklevel=4)


def reset_after_fork() -> None:
    """A fresh lock in a forked child (another thread may have held it at the fork)."""
    global _warn_lock
    _warn_lock = threading.Lock()
