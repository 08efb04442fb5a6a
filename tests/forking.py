"""What the fork tests share: the start of their child scripts (a function, its derivative and
a bounded wait for a forked grandchild) and running such a script in a fresh process.

A script's verdict is its exit status (0 when its numbers are right); a grandchild still
running after its timeout is killed and reported as "hung", so a hang fails the test instead
of hanging the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")

CHILD_START = """
import os, sys, threading, time
import numpy as np
import gradtape as gt

def f(x):
    return np.sum(np.exp(x) * 2.0 + x * x)

def df(x):
    return np.exp(x) * 2.0 + 2.0 * x

def wait_child(pid, seconds=WAIT_SECONDS):
    start = time.time()
    while time.time() - start < seconds:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"
"""


def child_start(wait_seconds: float, more: str = "") -> str:
    """The common start of a child script, waiting ``wait_seconds`` for a grandchild by
    default, followed by ``more`` (the test file's own helpers)."""
    return f"WAIT_SECONDS = {wait_seconds!r}\n" + CHILD_START + textwrap.dedent(more)


def run_child_script(
    start: str,
    script: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    timeout: float = 240.0,
) -> str:
    """Run ``start + script`` in a fresh Python with gradtape from the source tree and a cache
    under ``tmp_path``; ``env`` entries are set (an empty value removes the variable). Returns
    its standard output; fails the test when the script fails."""
    environment = dict(os.environ, PYTHONPATH=SRC, GRADTAPE_CACHE_DIR=str(tmp_path / "cache"))
    environment.pop("GRADTAPE_NUMBA", None)
    for name, value in (env or {}).items():
        if value:
            environment[name] = value
        else:
            environment.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", start + textwrap.dedent(script)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout
