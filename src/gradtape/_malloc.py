"""Keep freed memory in the process (glibc), so eager gradients do not page-fault every call.

Eager reverse mode keeps a function's intermediates alive until the backward
pass; when they are freed, glibc returns that memory to the OS (trim, or munmap
of large blocks), and the next call page-faults its whole working set again —
measured here as 3.6x the gradient's time at N=10^5. Raising glibc's mmap and
trim thresholds keeps freed blocks for reuse, which is what the caching
allocators of JAX and PyTorch do. Applied once, on the first trace; set
GRADTAPE_MALLOC_TUNE=0 to leave the allocator alone.
"""

from __future__ import annotations

import os
import sys

_done = False
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> None:
    global _done
    if _done:
        return
    _done = True
    if not sys.platform.startswith("linux") or os.environ.get("GRADTAPE_MALLOC_TUNE") == "0":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024 * 1024)
        libc.mallopt(_M_TRIM_THRESHOLD, 256 * 1024 * 1024)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune
