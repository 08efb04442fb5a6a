"""Numba's cache of a kernel function, in gradtape's cache directory and checksummed.

This module imports Numba (cache.py, which the `gradtape cache` command uses, does not):
`KernelCache` replaces a kernel dispatcher's own cache (see `cache._jit_namespace`), so Numba's
index and data files live where gradtape chose, whatever `NUMBA_CACHE_DIR` says, and each is
verified against its checksum before it is unpickled.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import os
import pickle
import sys
from pathlib import Path

from numba.core import caching

from .cache import _check_private, _read_verified, _warn_once, frame


class KernelLocator(caching._CacheLocator):
    """The cache directory given, whatever Numba's settings say; the source stamp is a
    hash of the module's text (as Numba's own locators)."""

    def __init__(self, py_func, py_file: str, cache_path: Path):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(cache_path)

    def ensure_cache_path(self) -> None:
        path = Path(self._cache_path)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(path)

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self):
        with open(self._py_file, "rb") as f:
            return hashlib.sha256(f.read()).digest()

    def get_disambiguator(self) -> str:
        return str(self._lineno)


class KernelCacheImpl(caching.CompileResultCacheImpl):
    def __init__(self, py_func, cache_path: Path):  # (no search through Numba's locators)
        self._lineno = py_func.__code__.co_firstlineno
        source = inspect.getfile(py_func)
        self._locator = KernelLocator(py_func, source, cache_path)
        module = os.path.splitext(os.path.basename(source))[0]
        abiflags = getattr(sys, "abiflags", "")
        self._filename_base = self.get_filename_base(f"{module}.{py_func.__qualname__}", abiflags)


class ChecksummedCacheFile(caching.IndexDataCacheFile):
    """Numba's index and data files, each behind a checksum verified before unpickling."""

    def _load_index(self):
        try:
            payload = _read_verified(self._index_path)
        except FileNotFoundError:
            return {}
        stream = io.BytesIO(payload)
        if pickle.load(stream) != self._version:
            return {}
        stamp, overloads = pickle.loads(stream.read())
        return overloads if stamp == self._source_stamp else {}

    def _save_index(self, overloads) -> None:
        payload = pickle.dumps(self._version, protocol=-1)
        payload += self._dump((self._source_stamp, overloads))
        with self._open_for_write(self._index_path) as f:
            f.write(frame(payload))

    def _load_data(self, name):
        return pickle.loads(_read_verified(self._data_path(name)))

    def _save_data(self, name, data) -> None:
        with self._open_for_write(self._data_path(name)) as f:
            f.write(frame(self._dump(data)))


class KernelCache(caching.FunctionCache):
    """Numba's cache of one kernel function, in gradtape's directory, checksummed; a cache
    write that fails (full disk) leaves the compiled kernel in memory, with a warning."""

    def __init__(self, py_func, cache_path: Path):
        self._name = repr(py_func)
        self._py_func = py_func
        self._impl = KernelCacheImpl(py_func, cache_path)
        self._cache_path = str(cache_path)
        self._cache_file = ChecksummedCacheFile(
            cache_path=self._cache_path,
            filename_base=self._impl.filename_base,
            source_stamp=self._impl.locator.get_source_stamp(),
        )
        self.enable()

    def save_overload(self, sig, data) -> None:
        try:
            super().save_overload(sig, data)
        except OSError as exc:
            _warn_once(
                "write",
                f"gradtape: writing to the kernel cache failed ({exc}); native kernels "
                "are compiled in memory instead",
            )
