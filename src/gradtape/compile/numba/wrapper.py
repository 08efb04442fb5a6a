"""The generated Python wrapper around a variant's kernels, and the kernels' status codes.

A kernel returns a status first: STATUS_OK (done), STATUS_LAYOUT (an array argument is not
C-contiguous: the wrapper copies and calls again) or STATUS_CHECK (a check failed: the numpy
backend's code answers the call, and raises the same GuardFailure).
"""

from __future__ import annotations

STATUS_OK, STATUS_LAYOUT, STATUS_CHECK = 0, 1, 2
