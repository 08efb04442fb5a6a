"""The status codes a native handle's entry points return (a leaf: export writes the handles,
export_runtime their entry points; see docs/numba-callable.md for what each means)."""

STATUS_OK = 0
STATUS_NONFINITE = 3
STATUS_WRONG_SIZE = -1
STATUS_OTHER_PATH = -2
STATUS_BAD_DATA = -3
STATUS_LAYOUT = -4
STATUS_RAISED = -5
