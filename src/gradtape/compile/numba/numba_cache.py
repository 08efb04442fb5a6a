"""Numba's cache of a kernel function, in gradtape's cache directory and checksummed, and
the building of a module's kernels through it (`build_kernels`).

This module imports Numba (cache.py, which the `gradtape cache` command uses, does not):
`KernelCache` replaces a kernel dispatcher's own cache (see `_jit_namespace` below), so Numba's
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
from types import SimpleNamespace

import numba
from numba.core import caching

from .cache import (
    _check_private,
    _read_verified,
    _warn_once,
    discard,
    frame,
    import_file,
    import_source,
    kernel_dir,
    module_file,
    module_name,
    prune_once,
)


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


# --- building a module's kernels through the cache ---------------------------------------------
def build_kernels(key: str, module_text: str, jit_all) -> tuple[tuple, bool]:
    """Compile (or load from the cache) the kernels of one generated module.

    `jit_all(jit, module, use_cache)` compiles the module's functions with `jit.njit(...)`
    (Numba's signature) and returns (entry points, whether they came from the cache). With a
    usable cache directory, `jit.njit(cache=True)` caches in it (`KernelCache`); without one
    (disabled, refused, read-only, full) the module is compiled in memory.
    """
    directory = kernel_dir()
    name = module_name(key)
    if directory is not None:
        try:
            path = module_file(directory, key, module_text)
        except OSError as exc:  # a full disk, a directory made read-only since
            _warn_once(
                "write",
                f"gradtape: writing to the kernel cache failed ({exc}); native kernels are "
                "compiled in memory instead",
            )
            directory = None
    if directory is None:
        module = import_source(module_text, name)
        return jit_all(_jit_namespace(numba, None), module, False)
    jit = _jit_namespace(numba, directory / "__pycache__")
    module = import_file(path, name)
    try:
        built = jit_all(jit, module, True)
    except Exception:
        # Numba's cache files of this module failed to load: delete them, compile again
        discard(directory, key)
        module = import_file(path, name)
        built = jit_all(jit, module, True)
    prune_once(directory)  # if this process wrote a new entry; here, off the call path
    return built


def _jit_namespace(numba, cache_path: Path | None) -> SimpleNamespace:
    """An object with Numba's `njit` whose `cache=True` caches in `cache_path` (KernelCache),
    never where Numba's own settings point."""

    def njit(cache: bool = False, **options):
        def decorate(function):
            dispatcher = numba.njit(cache=False, **options)(function)
            if cache and cache_path is not None:
                dispatcher._cache = KernelCache(function, cache_path)
            return dispatcher

        return decorate

    return SimpleNamespace(njit=njit)
