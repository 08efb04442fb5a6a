"""Every GRADTAPE_* environment setting, read in one place.

* `GRADTAPE_NUMBA` (default on): `0`, `false`, `no` or `off` turns the numba backend off;
  eager loops then never get native drivers (everything runs in NumPy).
* `GRADTAPE_CACHE` (default on): `0`, `false`, `no`, `off` or empty keeps compiled kernels in
  memory only (no disk cache).
* `GRADTAPE_CACHE_DIR` (default unset): the kernel cache's directory; unset, it is
  `$XDG_CACHE_HOME/gradtape`, else `~/.cache/gradtape`.
* `GRADTAPE_CACHE_MAX_MB` (default 256): the size the kernel cache is pruned to (least
  recently used entries first).
* `GRADTAPE_CACHE_MAX_AGE_DAYS` (default 30): cache entries unused for this long are pruned.
* `GRADTAPE_MALLOC_TUNE` (default on): `0` leaves glibc's allocator thresholds alone.
* `GRADTAPE_MAX_SIGNATURES` (default 64): call signatures one compiled function keeps (least
  recently used dropped first, with their variants, generated code and buffers).
* `GRADTAPE_MAX_KERNELS` (default 256): native kernel modules kept in memory for sharing
  between variants (least recently used dropped first; variants still using one keep it).
* `GRADTAPE_MAX_NUMBA_MODULES` (default 256): kernel modules Numba may build in one process
  (Numba never frees their machine code, about 1 MB each); later ones run on the numpy
  backend, with a warning. Modules the llvmlite generator builds are freed and not counted.
* `GRADTAPE_MAX_COMPILED` (default 256): compiled functions `compile` remembers, so that
  `compile(value_and_grad(f))` written again returns the one already built.
* `GRADTAPE_BUFFER_SETS` (default 4): sets of preallocated buffers a numpy-backend variant
  keeps between calls (one per thread calling it at once; more are allocated and freed).
* `GRADTAPE_NATIVE_WAIT` (default 60): the longest a `backend="numba"` call waits, in
  seconds, for Numba while it compiles something else (`inf`: as long as it takes); after
  that the call runs on the numpy backend, with a warning, until its kernels are compiled
  in the background.
* `GRADTAPE_ROLL` (default on): `0` keeps Python loops unrolled in compiled programs (loop
  rolling finds runs of instructions that repeat one body and runs them as one loop).
* `GRADTAPE_NAN_SAFE` (default on): `0` makes derivative rules multiply plainly: a zero
  cotangent times an infinite or NaN local derivative is then NaN (JAX's and autograd's
  numbers) instead of zero (the NaN-safe product: finite gradients through `np.where`).
* `GRADTAPE_LLVM` (default on): `0` compiles every native kernel with Numba; on, the kernels
  LLVM's own generator serves (fused elementwise loops and sums) are compiled through llvmlite
  directly (compile/llvm/), without Numba's compiler or its import.
* `GRADTAPE_PATCH_NUMPY` (default on): `0` leaves NumPy's array constructors alone (read at
  import; `np.asarray` on a traced value then raises instead of passing it through).

Each setting is read through one function below, when it is needed (a test or a program may
change the environment between two reads); `SETTINGS` lists them with their defaults. This
module imports nothing of gradtape, so any module may read its settings from here.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

NUMBA = "GRADTAPE_NUMBA"
CACHE = "GRADTAPE_CACHE"
CACHE_DIR = "GRADTAPE_CACHE_DIR"
CACHE_MAX_MB = "GRADTAPE_CACHE_MAX_MB"
CACHE_MAX_AGE_DAYS = "GRADTAPE_CACHE_MAX_AGE_DAYS"
MALLOC_TUNE = "GRADTAPE_MALLOC_TUNE"
PATCH_NUMPY = "GRADTAPE_PATCH_NUMPY"
MAX_SIGNATURES = "GRADTAPE_MAX_SIGNATURES"
MAX_KERNELS = "GRADTAPE_MAX_KERNELS"
MAX_COMPILED = "GRADTAPE_MAX_COMPILED"
MAX_NUMBA_MODULES = "GRADTAPE_MAX_NUMBA_MODULES"
BUFFER_SETS = "GRADTAPE_BUFFER_SETS"
ROLL = "GRADTAPE_ROLL"
NAN_SAFE = "GRADTAPE_NAN_SAFE"
NATIVE_WAIT = "GRADTAPE_NATIVE_WAIT"
LLVM = "GRADTAPE_LLVM"

DEFAULT_CACHE_MAX_MB = 256
DEFAULT_CACHE_MAX_AGE_DAYS = 30
DEFAULT_MAX_SIGNATURES = 64
DEFAULT_MAX_KERNELS = 256
DEFAULT_MAX_COMPILED = 256
DEFAULT_MAX_NUMBA_MODULES = 256
DEFAULT_BUFFER_SETS = 4
DEFAULT_NATIVE_WAIT = 60.0

# name -> (default, meaning), in the order of the list above
SETTINGS: dict[str, tuple[str, str]] = {
    NUMBA: ("1", "0/false/no/off: no numba backend, no native drivers for eager loops"),
    CACHE: ("1", "0/false/no/off/empty: compiled kernels stay in memory (no disk cache)"),
    CACHE_DIR: (
        "",
        "the kernel cache's directory (unset: $XDG_CACHE_HOME/gradtape, else ~/.cache/gradtape)",
    ),
    CACHE_MAX_MB: (str(DEFAULT_CACHE_MAX_MB), "size the kernel cache is pruned to"),
    CACHE_MAX_AGE_DAYS: (
        str(DEFAULT_CACHE_MAX_AGE_DAYS),
        "cache entries unused for this many days are pruned",
    ),
    MALLOC_TUNE: ("1", "0: leave glibc's allocator thresholds alone"),
    MAX_SIGNATURES: (
        str(DEFAULT_MAX_SIGNATURES),
        "call signatures one compiled function keeps (least recently used dropped)",
    ),
    MAX_KERNELS: (
        str(DEFAULT_MAX_KERNELS),
        "native kernel modules kept in memory for sharing (least recently used dropped)",
    ),
    MAX_NUMBA_MODULES: (
        str(DEFAULT_MAX_NUMBA_MODULES),
        "kernel modules Numba may build per process (their machine code is never freed)",
    ),
    MAX_COMPILED: (
        str(DEFAULT_MAX_COMPILED),
        "compiled functions compile() remembers by (function, transform, options)",
    ),
    BUFFER_SETS: (
        str(DEFAULT_BUFFER_SETS),
        "sets of preallocated buffers a numpy-backend variant keeps between calls",
    ),
    NATIVE_WAIT: (
        str(int(DEFAULT_NATIVE_WAIT)),
        "seconds a backend='numba' call waits for Numba busy elsewhere (then: numpy backend)",
    ),
    ROLL: ("1", "0: keep Python loops unrolled in compiled programs (no loop rolling)"),
    NAN_SAFE: ("1", "0: plain products in derivative rules (0 * inf is NaN, as in JAX)"),
    LLVM: ("1", "0: compile every native kernel with Numba (no llvmlite generator)"),
    PATCH_NUMPY: (
        "1",
        "0: leave NumPy's array constructors alone (np.asarray on a traced value raises)",
    ),
}

_OFF = frozenset({"0", "false", "no", "off"})
_POSIX = os.name == "posix"  # (os.environ keeps its values in a dict of bytes there)
_warned: set[str] = set()


def _text(name: str) -> str:
    return os.environ.get(name, SETTINGS[name][0]).strip()


def numba_enabled() -> bool:
    """GRADTAPE_NUMBA: whether the numba backend may be used (default: yes). Turning it off
    (`0`, `false`, `no`, `off`, any case) leaves backend="numba" unregistered and keeps eager
    loops in Python."""
    return _text(NUMBA).lower() not in _OFF


def llvm_enabled() -> bool:
    """GRADTAPE_LLVM: whether native kernels the llvmlite generator serves are compiled by it
    (default: yes); `0`, `false`, `no`, `off` send every kernel to Numba."""
    return _text(LLVM).lower() not in _OFF


def roll_enabled() -> bool:
    """GRADTAPE_ROLL: whether compile rolls the runs of a program that repeat one loop body
    into loops (default: yes); `0`, `false`, `no`, `off` keep every iteration unrolled."""
    return _text(ROLL).lower() not in _OFF


_NAN_SAFE_KEY = os.fsencode(NAN_SAFE)
_ENVIRON_DATA = getattr(os.environ, "_data", None)  # (the dict os.environ writes through)
_ENVIRON_IS_BYTES_DICT = _POSIX and type(_ENVIRON_DATA) is dict
_nan_safe_values: dict = {None: True}


def nan_safe() -> bool:
    """GRADTAPE_NAN_SAFE: whether derivative rules use the NaN-safe product (default: yes): a
    zero cotangent times an infinite or NaN local derivative contributes zero, so gradients
    through `np.where(p > 0, p * np.log(p), 0.0)` are finite. `0`, `false`, `no`, `off` give
    plain products (JAX's and autograd's numbers). Read on every product a rule records, so
    it is read from os.environ's own dict."""
    if not _ENVIRON_IS_BYTES_DICT:
        return _text(NAN_SAFE).lower() not in _OFF
    raw = _ENVIRON_DATA.get(_NAN_SAFE_KEY)  # type: ignore[union-attr]
    answer = _nan_safe_values.get(raw)
    if answer is None:
        answer = os.fsdecode(raw).strip().lower() not in _OFF
        if len(_nan_safe_values) < 64:
            _nan_safe_values[raw] = answer
    return answer


def cache_enabled() -> bool:
    """GRADTAPE_CACHE: whether compiled kernels are kept on disk (default: yes); `0`, `false`,
    `no`, `off` or an empty value keep them in memory only."""
    return _text(CACHE).lower() not in _OFF | {""}


def cache_dir() -> Path:
    """GRADTAPE_CACHE_DIR: the kernel cache's directory if set (and not empty), else
    `$XDG_CACHE_HOME/gradtape`, else `~/.cache/gradtape` (not created here)."""
    explicit = os.environ.get(CACHE_DIR)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradtape"


def cache_max_mb() -> float:
    """GRADTAPE_CACHE_MAX_MB: the size in megabytes the kernel cache is pruned to (default
    256). A value that is not a number warns (RuntimeWarning, once) and the default is used."""
    return _number(CACHE_MAX_MB, DEFAULT_CACHE_MAX_MB)


def cache_max_age_days() -> float:
    """GRADTAPE_CACHE_MAX_AGE_DAYS: cache entries unused for this many days are pruned
    (default 30). A value that is not a number warns (RuntimeWarning, once); the default is
    used."""
    return _number(CACHE_MAX_AGE_DAYS, DEFAULT_CACHE_MAX_AGE_DAYS)


def malloc_tune() -> bool:
    """GRADTAPE_MALLOC_TUNE: whether glibc's allocator is tuned to keep freed memory (default:
    yes); `0` leaves it alone."""
    return os.environ.get(MALLOC_TUNE) != "0"


def patch_numpy() -> bool:
    """GRADTAPE_PATCH_NUMPY: whether NumPy's array constructors (np.asarray & co.) are replaced
    by dispatchers that pass traced values through (default: yes); `0` leaves NumPy alone."""
    return os.environ.get(PATCH_NUMPY) != "0"


def max_signatures() -> int:
    """GRADTAPE_MAX_SIGNATURES: how many call signatures one compiled function keeps (default
    64); a new one beyond that drops the least recently used (it is recorded again if it
    comes back). Read when the compiled function is created."""
    return _count(MAX_SIGNATURES, DEFAULT_MAX_SIGNATURES)


def max_kernels() -> int:
    """GRADTAPE_MAX_KERNELS: how many native kernel modules stay in memory for variants to
    share (default 256, least recently used dropped first)."""
    return _count(MAX_KERNELS, DEFAULT_MAX_KERNELS)


def max_numba_modules() -> int:
    """GRADTAPE_MAX_NUMBA_MODULES: how many kernel modules Numba may build in one process
    (default 256; Numba keeps each one's machine code until the process ends). Later modules
    run on the numpy backend, with a NativeFallbackWarning."""
    return _count(MAX_NUMBA_MODULES, DEFAULT_MAX_NUMBA_MODULES)


def max_compiled() -> int:
    """GRADTAPE_MAX_COMPILED: how many compiled functions `compile` remembers by (function,
    transform, options) (default 256, least recently used dropped first)."""
    return _count(MAX_COMPILED, DEFAULT_MAX_COMPILED)


def native_wait() -> float:
    """GRADTAPE_NATIVE_WAIT: the longest a backend="numba" call waits for Numba while it
    compiles something else, in seconds (default 60; `inf`: no bound; a negative value
    warns once and the default is used)."""
    value = _number(NATIVE_WAIT, DEFAULT_NATIVE_WAIT)
    if not value >= 0:
        message = f"gradtape: {NATIVE_WAIT}={value!r} is negative; using {DEFAULT_NATIVE_WAIT}"
        if message not in _warned:
            _warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return DEFAULT_NATIVE_WAIT
    return value


def buffer_sets() -> int:
    """GRADTAPE_BUFFER_SETS: sets of preallocated buffers a numpy-backend variant keeps
    between calls (default 4: threads calling it at once beyond that allocate their own)."""
    return _count(BUFFER_SETS, DEFAULT_BUFFER_SETS)


#: the settings a compiled function reads while it builds its code: `compile` remembers a
#: compiled function only for the values they had when it was built
BUILD_SETTINGS = (NUMBA, ROLL, BUFFER_SETS, MAX_SIGNATURES, NAN_SAFE, LLVM)
_BUILD_KEYS = tuple(os.fsencode(name) for name in BUILD_SETTINGS)


def build_settings() -> tuple:
    """The raw values (None when unset) of BUILD_SETTINGS, read at once (part of the key of
    `compile`'s memo, so it is read on every `compile` call: a few hundred nanoseconds)."""
    data = getattr(os.environ, "_data", None)
    if _POSIX and type(data) is dict:  # (os.environ.get costs a microsecond each)
        get = data.get
        return (
            get(_BUILD_KEYS[0]),
            get(_BUILD_KEYS[1]),
            get(_BUILD_KEYS[2]),
            get(_BUILD_KEYS[3]),
            get(_BUILD_KEYS[4]),
            get(_BUILD_KEYS[5]),
        )
    return tuple([os.environ.get(name) for name in BUILD_SETTINGS])


def _count(name: str, default: int) -> int:
    """A positive whole number (at least 1): a value that is not warns once; default used."""
    value = _number(name, default)
    if value != int(value) or value < 1:
        message = f"gradtape: {name}={value!r} is not a whole number of at least 1; using {default}"
        if message not in _warned:
            _warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        return default
    return int(value)


def _number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        message = f"gradtape: {name}={text!r} is not a number; using {default}"
        if message not in _warned:
            _warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        return default
