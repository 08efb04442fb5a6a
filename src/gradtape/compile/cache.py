"""The per-user disk cache of generated kernel modules (and, beside them, Numba's cache).

Numba caches a compiled function only if it comes from a real file: a generated kernel
module is written to `<cache dir>/kernels/k_<key>.py` (key: a hash of its text) and imported
from there, and Numba keeps its own cache files in the `__pycache__` folder next to it, keyed
by that file's path and modification time. So a module is written once and never touched
again: a second process finds the same file, the same stamp, and loads the machine code
instead of compiling.

Where: `$GRADTAPE_CACHE_DIR` if set, else `$XDG_CACHE_HOME/gradtape`, else
`~/.cache/gradtape`. Set `GRADTAPE_CACHE=0` (or call `set_cache_dir(None)`) to keep
everything in memory. The directory is created readable by its owner only (Numba's cache
files are pickles: a directory others can write to is refused, with a warning). Files are
written atomically (a temporary file, then a rename). A module whose text is not the
expected one (truncated, or another version's) is rewritten; Numba's cache files that fail to
load are deleted and rebuilt (`discard`).
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType

_DISABLED_VALUES = {"0", "false", "no", "off", ""}
_override: list = []  # [path or None] after set_cache_dir
_lock = threading.Lock()
_warned: set[str] = set()


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Use `path` for the kernel cache from now on; None disables the disk cache."""
    _override[:] = [None if path is None else Path(path)]


def cache_root() -> Path | None:
    """The configured cache directory (not created), or None when the cache is disabled."""
    if _override:
        return _override[0]
    if os.environ.get("GRADTAPE_CACHE", "1").strip().lower() in _DISABLED_VALUES:
        return None
    explicit = os.environ.get("GRADTAPE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradtape"


def kernel_dir() -> Path | None:
    """The directory of kernel modules, created with owner-only permissions; None if the cache
    is disabled or the directory is not safe to use (a warning says why, once)."""
    root = cache_root()
    if root is None:
        return None
    path = root / "kernels"
    try:
        for p in (root, path):
            p.mkdir(mode=0o700, parents=True, exist_ok=True)
            _check_private(p)
    except (OSError, PermissionError) as exc:
        _warn_once(f"gradtape: kernel cache disabled: {exc}")
        return None
    return path


def _check_private(path: Path) -> None:
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is writable by other users")
    if st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def module_file(directory: Path, key: str, source: str) -> Path:
    """The module file of `key` holding exactly `source` (written if missing or different)."""
    path = directory / f"k_{key}.py"
    with _lock:
        try:
            current = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            current = None
        if current != source:
            write_atomically(path, source)
    return path


def import_file(path: Path, name: str) -> ModuleType:
    """Import the module at `path` under `name` (Numba finds its source file for caching)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_source(source: str, name: str) -> ModuleType:
    """The module of `source`, in memory (no disk cache)."""
    module = ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def discard(directory: Path, key: str) -> None:
    """Delete Numba's cache files of module `key` (they failed to load: rebuilt next time)."""
    pycache = directory / "__pycache__"
    if not pycache.is_dir():
        return
    for f in pycache.glob(f"k_{key}.*"):
        try:
            f.unlink()
        except OSError:
            pass
