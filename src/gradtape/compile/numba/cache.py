"""The per-user disk cache of generated kernel modules (and, beside them, Numba's cache).

Numba caches a compiled function only if it comes from a real file: a generated kernel
module is written to `<cache dir>/kernels/k_<key>.py` (key: a hash of its text) and imported
from there, and its Numba cache files are kept in the `__pycache__` folder next to it, keyed
by that file's contents. So a module is written once and never touched again: a second
process finds the same file and loads the machine code instead of compiling.

Where: `$GRADTAPE_CACHE_DIR` if set, else `$XDG_CACHE_HOME/gradtape`, else
`~/.cache/gradtape`. Set `GRADTAPE_CACHE=0` (or call `set_cache_dir(None)`) to keep
everything in memory.

Trust: Numba's cache files are pickles, and loading a pickle runs code. So gradtape's
kernels are cached only here, whatever `NUMBA_CACHE_DIR` or `NUMBA_CACHE_LOCATOR_CLASSES`
say (`KernelCache` is a Numba cache with a fixed location). The directories are created
readable by their owner only; one that belongs to another user or that the group or others
may write to is refused: a warning (once) and kernels are compiled in memory. So is a
directory this process cannot write (read-only, full). Every file Numba writes for a kernel
carries a SHA-256 checksum of its contents, verified before it is unpickled: a file that was
truncated, zeroed or changed is deleted and the kernel compiled again (a warning says so,
once). Files are written atomically (a temporary file, then a rename). A module whose text is
not the expected one (truncated, or another version's) is rewritten.

Pruning: an entry is a module and Numba's files of its key. Loading an entry sets its module's
access time, so that time says when it was last used. A process that writes a new entry
prunes once, after compiling it (in the compiler, never in a call): entries unused for
`GRADTAPE_CACHE_MAX_AGE_DAYS` (default 30) are removed, then the least recently used ones
until the rest fit in `GRADTAPE_CACHE_MAX_MB` (default 256). `clear()` removes every entry.
The settings are read through gradtape.config.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from ... import config

_override: list = []  # [path or None] after set_cache_dir
_lock = threading.Lock()
_warn_lock = threading.Lock()
_warned: set[str] = set()  # kinds of problems already reported (see _warn_once)


def reset_after_fork() -> None:
    """In a forked child: new locks (a thread of the parent may have held them)."""
    global _lock, _warn_lock
    _lock = threading.Lock()
    _warn_lock = threading.Lock()


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Use `path` for the kernel cache from now on; None disables the disk cache."""
    _override[:] = [None if path is None else Path(path)]


def cache_root() -> Path | None:
    """The configured cache directory (not created), or None when the cache is disabled."""
    if _override:
        return _override[0]
    if not config.cache_enabled():
        return None
    return config.cache_dir()


def kernel_dir() -> Path | None:
    """The directory of kernel modules, created with owner-only permissions; None if the cache
    is disabled or the directory is not safe or not possible to use (a warning says why,
    once: kernels are then compiled in memory)."""
    root = cache_root()
    if root is None:
        return None
    path = root / "kernels"
    try:
        for p in (root, path, path / "__pycache__"):
            p.mkdir(mode=0o700, parents=True, exist_ok=True)
            _check_private(p)
        for p in (path, path / "__pycache__"):
            tempfile.TemporaryFile(dir=p).close()  # writable (not read-only, not full)
    except OSError as exc:
        _warn_once(
            "unusable",
            f"gradtape: the kernel cache {root} cannot be used ({exc}); native kernels are "
            "compiled in memory instead (set GRADTAPE_CACHE_DIR to a private directory, or "
            "GRADTAPE_CACHE=0 to silence this)",
        )
        return None
    return path


def _check_private(path: Path) -> None:
    """Refuse a directory of another user, or one that others may write to (their files
    would be unpickled, which runs code); narrow an owner's own directory to owner-only."""
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user (uid {st.st_uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is writable by other users")
    if st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


def _warn_once(kind: str, message: str) -> None:
    """One RuntimeWarning per kind of problem and process."""
    with _warn_lock:
        if kind in _warned:
            return
        _warned.add(kind)
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
            _new_entries.append(key)
        else:
            _touch(path)
        _used_keys.add(key)
    return path


def _touch(path: Path) -> None:
    """Mark a module used now: its access time (its modification time keys Numba's cache)."""
    try:
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    except OSError:
        pass


def module_name(key: str) -> str:
    """The name the module of kernels `key` is imported under (in sys.modules)."""
    return f"gradtape_kernel_{key}"


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


# A checksummed cache file: MAGIC, the SHA-256 of the payload, then the payload (what Numba
# itself writes). Anything else (an older format, a truncated or damaged file) is discarded.
CHECKSUM_MAGIC = b"gradtape-checksummed-1\n"
_DIGEST_SIZE = 32
corrupt_files: list[str] = []  # cache files this process found damaged and deleted


def frame(payload: bytes) -> bytes:
    """`payload` with its checksum header (what is written to disk)."""
    return CHECKSUM_MAGIC + hashlib.sha256(payload).digest() + payload


def unframe(data: bytes) -> bytes | None:
    """The payload of a checksummed file, or None if the file is damaged or not checksummed."""
    head = len(CHECKSUM_MAGIC)
    if len(data) < head + _DIGEST_SIZE or not data.startswith(CHECKSUM_MAGIC):
        return None
    digest, payload = data[head : head + _DIGEST_SIZE], data[head + _DIGEST_SIZE :]
    if hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def _read_verified(path: str) -> bytes:
    """The payload of the checksummed file at `path`; a damaged file is deleted (and reported
    once) and FileNotFoundError raised, so the caller compiles as if it were missing."""
    with open(path, "rb") as f:
        data = f.read()
    payload = unframe(data)
    if payload is not None:
        return payload
    try:
        os.unlink(path)
    except OSError:
        pass
    corrupt_files.append(path)
    _warn_once(
        "corrupt",
        f"gradtape: a cached kernel file failed its checksum ({path}: truncated, damaged or "
        "from another version); it was deleted and the kernel is compiled again",
    )
    raise FileNotFoundError(path)


# --- pruning and clearing --------------------------------------------------------------------
_RECENT_SECONDS = 60.0  # an entry used this recently is never pruned (another process loads it)
_new_entries: list[str] = []  # keys whose module this process wrote
_used_keys: set[str] = set()  # keys this process loaded or wrote: never pruned by it
_pruned: list[bool] = []


@dataclass
class Entry:
    """One cached kernel module and Numba's files of it."""

    key: str
    files: list[Path] = field(default_factory=list)
    size: int = 0
    last_used: float = 0.0  # seconds since the epoch; 0 for Numba files without a module


def entries(directory: Path) -> list[Entry]:
    """The entries of a kernel directory, least recently used first."""
    found: dict[str, Entry] = {}

    def add(path: Path, key: str, is_module: bool) -> None:
        try:
            st = path.stat()
        except OSError:
            return
        entry = found.setdefault(key, Entry(key))
        entry.files.append(path)
        entry.size += st.st_size
        if is_module:
            entry.last_used = max(st.st_atime, st.st_mtime)

    for path in directory.glob("k_*.py"):
        add(path, path.stem[2:], True)
    pycache = directory / "__pycache__"
    if pycache.is_dir():
        for path in pycache.glob("k_*.*"):
            add(path, path.name.split(".", 1)[0][2:], False)
    return sorted(found.values(), key=lambda e: e.last_used)


def prune(
    directory: Path,
    max_bytes: float | None = None,
    max_age_seconds: float | None = None,
    keep: set[str] | frozenset = frozenset(),
) -> list[str]:
    """Remove entries unused for `max_age_seconds`, then the least recently used ones until the
    rest take at most `max_bytes` (defaults: the environment, see gradtape.config); never
    the keys in `keep` nor entries used in the last minute. Returns the removed keys."""
    if max_bytes is None:
        max_bytes = config.cache_max_mb() * 2**20
    if max_age_seconds is None:
        max_age_seconds = config.cache_max_age_days() * 86400
    now = time.time()
    found = entries(directory)
    total = sum(e.size for e in found)
    removed = []
    for entry in found:  # least recently used first
        if entry.key in keep or now - entry.last_used < _RECENT_SECONDS:
            continue
        if total <= max_bytes and now - entry.last_used <= max_age_seconds:
            break
        for path in entry.files:
            try:
                path.unlink()
            except OSError:
                pass
        total -= entry.size
        removed.append(entry.key)
    _remove_stale_temporaries(directory, now)
    return removed


def _remove_stale_temporaries(directory: Path, now: float) -> None:
    """Temporary files left by a process killed while writing (older than an hour)."""
    for path in directory.glob(".tmp-*"):
        try:
            if now - path.stat().st_mtime > 3600:
                path.unlink()
        except OSError:
            pass


def prune_once(directory: Path) -> None:
    """Prune (see `prune`) once per process, and only if this process wrote a new entry: called
    by the compiler after building kernels, never on a call's path."""
    with _lock:
        if _pruned or not _new_entries:
            return
        _pruned.append(True)
        keep = set(_used_keys)
    try:
        prune(directory, keep=keep)
    except OSError as exc:
        _warn_once("prune", f"gradtape: pruning the kernel cache failed: {exc}")


def clear() -> int:
    """Remove every cached kernel (module sources and Numba's files) from the disk cache.

    Kernels already loaded in this process keep running. The cache's directory is
    `GRADTAPE_CACHE_DIR` (default: the user's cache directory); `gradtape cache --clear` does
    the same from the command line.

    Returns
    -------
    int
        How many entries were removed.

    Examples
    --------
    >>> import gradtape as gt
    >>> removed = gt.clear_cache()
    """
    root = cache_root()
    directory = None if root is None else root / "kernels"
    if directory is None or not directory.is_dir():
        return 0
    removed = 0
    with _lock:
        for entry in entries(directory):
            for path in entry.files:
                try:
                    path.unlink()
                except OSError:
                    pass
            removed += 1
        _remove_stale_temporaries(directory, time.time())
    return removed


def usage() -> tuple[Path | None, int, int]:
    """(kernel directory or None when the cache is disabled, entries, bytes)."""
    root = cache_root()
    if root is None:
        return None, 0, 0
    directory = root / "kernels"
    found = entries(directory) if directory.is_dir() else []
    return directory, len(found), sum(e.size for e in found)
