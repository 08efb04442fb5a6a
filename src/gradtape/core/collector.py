"""Python's cyclic garbage collector around long recordings and searches of tapes.

A recorded tape holds several container objects per instruction (the instruction, its Vars,
tuples of operands and values), all alive until the recording is lowered. Each full
collection of Python's cyclic collector traverses every one of them, and full collections
recur as the tape grows: measured on the staged tape of `value_and_grad` of an explicit
time-stepping loop (490,000 instructions), they took half of the recording's time (12.7 µs
an instruction with them, 7.5 without).

Two pauses, both counted across threads (the last one to end restores the collector, and a
setting the user made in between stands):

* `full_collections_paused`: while a staged recording (compile, trace, a loop body) runs.
  The user's code runs then, so the young generations are still collected (their garbage
  cycles are freed as usual); only the full collections, which traverse the old objects
  and so the tape, wait until the recording ends.
* `collector_paused`: the whole collector, while a tape is searched for loops (no user code
  runs: nothing allocated then forms a garbage cycle that must be freed before it ends).
"""

from __future__ import annotations

import contextlib
import gc
import threading

# the oldest generation's threshold while full collections wait: never reached
_NO_FULL_COLLECTIONS = 1 << 30

_lock = threading.Lock()
_recordings = 0  # staged recordings running now
_user_threshold: tuple | None = None  # the thresholds the first of them found
_searches = 0  # searches running now
_resume_collector = False  # whether the first of them found the collector running


def pause_full_collections() -> None:
    """Start a staged recording: full collections wait until the last one ends
    (`resume_full_collections`)."""
    global _recordings, _user_threshold
    with _lock:
        if _recordings == 0:
            _user_threshold = gc.get_threshold()
            young, middle = _user_threshold[:2]
            gc.set_threshold(young, middle, _NO_FULL_COLLECTIONS)
        _recordings += 1


def resume_full_collections() -> None:
    """End a staged recording (see `pause_full_collections`)."""
    global _recordings
    with _lock:
        if _recordings == 0:  # (a forked child that renewed the count under this recording)
            return
        _recordings -= 1
        if _recordings == 0:
            _restore_threshold()


def _restore_threshold() -> None:
    current = gc.get_threshold()
    if _user_threshold is not None and current[2:] == (_NO_FULL_COLLECTIONS,):
        # (a threshold the user set meanwhile stands)
        gc.set_threshold(current[0], current[1], _user_threshold[2])


@contextlib.contextmanager
def full_collections_paused():
    """Full collections wait while the block runs (see the module docstring)."""
    pause_full_collections()
    try:
        yield
    finally:
        resume_full_collections()


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused while the block runs, and resumed (if it was
    running) when the last such block running ends. For searches of long tapes: they
    allocate a few small objects per instruction while the tape's instructions are alive,
    and each full collection traverses them all (measured on a time-stepping tape of 98,000
    instructions: 40% of the search). Nothing the search allocates forms a cycle that must be
    freed before it ends. Blocks in several threads share one pause (counted), so none
    resumes the collector under another, and the user's gc.disable() stands."""
    global _searches, _resume_collector
    with _lock:
        if _searches == 0:
            _resume_collector = gc.isenabled()
            gc.disable()
        _searches += 1
    try:
        yield
    finally:
        with _lock:
            if _searches:  # (0 in a forked child that renewed the count under this search)
                _searches -= 1
                if _searches == 0 and _resume_collector:
                    gc.enable()


def renew_locks_after_fork() -> None:
    """In a child created by os.fork: the recordings and searches that paused the collector
    ran in threads the child does not have; restore it as the last of them would have."""
    global _recordings, _searches
    if _recordings:
        _recordings = 0
        _restore_threshold()
    if _searches:
        _searches = 0
        if _resume_collector:
            gc.enable()
