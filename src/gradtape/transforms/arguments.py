"""What a user hands to a transform, checked before anything is traced.

Every transform (grad, value_and_grad, vjp, jvp, the Jacobians, hessian) calls these on its
function, its `argnums` and the arguments it differentiates, so a mistake is answered with one
`GradtapeError` that says what happened, where (the user's source line) and what to do, rather
than an error from deep inside the user's function or NumPy.

Labelled inputs of the data stack: a pandas Series or DataFrame and an xarray DataArray are
differentiated as their values (`.to_numpy()`); the gradient, which has the input's shape, gets
the input's labels back (index and name, index and columns, dims and coords). Their own
arithmetic (alignment by label, broadcasting by dimension name) is not traced: inside the
function the argument is an array. pandas and xarray are never imported by gradtape: an object
is recognised by the module of its type.

`TransformedFunction` is what grad and value_and_grad return: it calls the transform and
pickles by reference to the user's function, so `multiprocessing`, joblib and Dask can ship it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.errors import GradtapeError

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_line() -> str:
    """The user's source line, as "(at file:line: source)": the innermost frame outside
    gradtape (the user's call)."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    if f is None:
        return "(at an unknown line)"
    import linecache

    text = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return f"(at {os.path.basename(f.f_code.co_filename)}:{f.f_lineno}: {text})"


def check_function(f: Any, who: str) -> None:
    """A transform's function must be callable (gt.grad(f), not gt.grad(f(x)))."""
    if callable(f):
        return
    raise GradtapeError(
        f"{who} expects the function to differentiate, but got {_a(type(f).__name__)} "
        f"({_short(f)}) {user_line()}. Pass the function itself, gradtape.{who}(f), and "
        f"call the result with the arguments: gradtape.{who}(f)(x)."
    )


def check_argnums(argnums: Any, who: str) -> None:
    """argnums is an int or a tuple/list of distinct ints (empty: nothing differentiated)."""
    if type(argnums) is int:  # the common case, checked first: transforms are made in loops
        return
    nums = (argnums,) if isinstance(argnums, int) and not isinstance(argnums, bool) else argnums
    ok = (
        isinstance(nums, (tuple, list))
        and all(isinstance(a, int) and not isinstance(a, bool) for a in nums)
        and len(set(nums)) == len(nums)
    )
    if ok:
        return
    raise GradtapeError(
        f"{who}: argnums={argnums!r} {user_line()}; argnums is the position of the argument "
        "to differentiate (an int), or a tuple of distinct positions: argnums=0 or "
        "argnums=(0, 2). To differentiate a keyword argument, pass it positionally."
    )


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


# --- labelled arrays of the data stack --------------------------------------------------------
def labelled_kind(x: Any) -> str | None:
    """ "pandas" or "xarray" for their labelled containers, else None (imports neither)."""
    t = type(x)
    package = (t.__module__ or "").split(".", 1)[0]
    if package == "pandas" and t.__name__ in ("Series", "DataFrame"):
        return "pandas"
    if package == "xarray" and t.__name__ in ("DataArray", "Dataset"):
        return "xarray"
    return None


def unlabelled(x: Any, where: str) -> np.ndarray:
    """The values of a pandas Series/DataFrame or xarray DataArray, as a NumPy array; a
    clear error for what has no single array of numbers (a Dataset, mixed columns)."""
    name = type(x).__name__
    if name == "Dataset":
        raise GradtapeError(
            f"{where} is an xarray Dataset (several variables) {user_line()}: pass one "
            "DataArray, its values (ds['var'].to_numpy()), or a dict of arrays."
        )
    values = np.asarray(x.to_numpy())
    if values.dtype.kind not in "fc":
        raise GradtapeError(
            f"{where} is a {name} whose values have dtype {values.dtype} {user_line()}: "
            "gradtape differentiates float arrays. Pass x.to_numpy(dtype=float) (for a "
            "DataFrame, select its numeric columns first)."
        )
    return values


def relabel(g: Any, like: Any) -> Any:
    """The gradient `g` with the labels of the input `like` it belongs to (same shape)."""
    kind = labelled_kind(like)
    if kind is None or np.shape(g) != np.shape(like):
        return g
    if kind == "xarray":
        return like.copy(data=np.asarray(g))
    if type(like).__name__ == "Series":
        return type(like)(np.asarray(g), index=like.index, name=like.name)
    return type(like)(np.asarray(g), index=like.index, columns=like.columns)


def compile_leaf_message(x: Any, where: str) -> str | None:
    """What a compiled function says about a labelled leaf (pass its values), else None."""
    if labelled_kind(x) is None:
        return None
    t = type(x)
    return (
        f"compile: {where} is a {t.__module__.split('.')[0]} {t.__name__}; a compiled function "
        "takes NumPy arrays. Pass x.to_numpy() (the labels are not traced; put them back on "
        "the result yourself)."
    )


# --- a differentiated argument ------------------------------------------------------------------
def check_argument(x: Any, where: str) -> None:
    """Refuse what cannot be a differentiated argument as a whole (before it is flattened)."""
    if x is None:
        raise GradtapeError(
            f"{where} is None {user_line()}: there is nothing to differentiate. Pass a float "
            "array or a Python float, or leave this argument out of argnums."
        )
    if isinstance(x, np.matrix):
        raise GradtapeError(
            f"{where} is a numpy.matrix {user_line()}: gradtape traces ndarrays, and "
            "np.matrix gives * and ** other meanings (matrix products). Pass np.asarray(x) "
            "and write matrix products with @."
        )


def list_argument_error(
    exc: BaseException, args: tuple, argnums: tuple, fname: str
) -> GradtapeError | None:
    """A clear error when the function failed (TypeError) on a differentiated list or tuple
    of numbers, which gradtape passes as a container of scalars, as JAX does."""
    if not isinstance(exc, TypeError):  # (a GradtapeError too: NumPy met a list of Tracers)
        return None
    for a in argnums:
        x = args[a]
        if isinstance(x, (list, tuple)) and x and all(_is_number(v) for v in x):
            return GradtapeError(
                f"{fname} failed ({type(exc).__name__}: {exc}) on argument {a}, a Python "
                f"{type(x).__name__} of numbers {_failing_line(exc)}. A {type(x).__name__} is a "
                "container: each element is differentiated as its own scalar, and the function "
                f"receives a {type(x).__name__} of traced scalars, not an array. Pass "
                "np.array(x) to differentiate an array."
            )
    return None


def _failing_line(exc: BaseException) -> str:
    """ "(at file:line: source)" of the innermost frame of `exc` outside gradtape and NumPy."""
    import linecache
    import traceback

    numpy_dir = os.path.dirname(os.path.abspath(np.__file__))
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        name = frame.filename
        if not name.startswith(_PKG_DIR) and not name.startswith(numpy_dir):
            text = linecache.getline(name, frame.lineno or 0).strip()
            return f"(at {os.path.basename(name)}:{frame.lineno}: {text})"
    return user_line()


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float, complex)) and not isinstance(v, bool)) or (
        isinstance(v, np.generic) and v.dtype.kind in "fc"
    )


_WRAPPED_NAMES = ("__module__", "__name__", "__qualname__", "__doc__")


# --- what grad and value_and_grad return ----------------------------------------------------------
class TransformedFunction(functools.partial):
    """The function a transform returns: it calls `call`, looks like the user's function
    (name, docstring, `__wrapped__`), and pickles as `transform(fun, *options)`, so the user's
    function is pickled by reference (it must be importable: defined at module level).

    A `functools.partial` of `call` with no bound arguments: calling it goes straight to `call`
    from C, with no Python layer in between.
    """

    def __new__(cls, call: Callable, transform: Callable, fun: Callable, options: tuple):
        self = super().__new__(cls, call)
        wrapped = self.__dict__
        for name in _WRAPPED_NAMES:
            try:
                wrapped[name] = getattr(fun, name)
            except AttributeError:
                pass
        extra = getattr(fun, "__dict__", None)
        if extra:
            for name, value in extra.items():
                wrapped.setdefault(name, value)
        wrapped["__wrapped__"] = fun
        wrapped["_transform"] = transform
        wrapped["_fun"] = fun
        wrapped["_options"] = options
        return self

    @property
    def _call(self) -> Callable:
        return self.func

    @property
    def transformed(self) -> tuple:
        """(transform, user function, options): what this function is, for caches that key
        on the code a function runs."""
        return self._transform, self._fun, self._options

    def __reduce__(self):
        module = sys.modules.get(self.__dict__.get("__module__") or "")
        obj = module
        qualname = self.__dict__.get("__qualname__") or ""
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if obj is self:  # used as a decorator: the module attribute is this object
            return qualname
        return (self._transform, (self._fun, *self._options))

    def __repr__(self) -> str:
        name = getattr(self._fun, "__qualname__", None) or repr(self._fun)
        return f"<{self._transform.__name__} of {name}>"
