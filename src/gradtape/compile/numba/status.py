"""The status a kernel returns first (a leaf: kernels, wrappers and the backend read it).

STATUS_OK: done. STATUS_LAYOUT: an array argument is not C-contiguous (the backend copies it
and calls again). STATUS_CHECK: a check failed (the numpy backend's code answers the call and
raises the same GuardFailure).
"""

STATUS_OK, STATUS_LAYOUT, STATUS_CHECK = 0, 1, 2
