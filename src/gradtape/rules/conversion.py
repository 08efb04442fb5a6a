"""`np.asarray`, `np.array` & co. on traced values: the Tracer passes through.

Library code converts its inputs first (`x = np.asarray(x, dtype=float)`). NumPy does not
dispatch these constructors through `__array_function__`; gradtape/process.py replaces them
in the `numpy` module by dispatchers that call the versions below when the first argument is
a Tracer, or a (nested) list or tuple holding one:

* a Tracer comes back as itself (`np.array` and `copy=True`: a new Tracer object for the same
  value, so that a later `y[i] = ...` on the copy leaves the original alone);
* `dtype=` differing from the Tracer's is a cast (the `astype` primitive): float to int cuts
  the gradient as NumPy's cast cuts the value; a cast of a real value to complex, and
  `dtype=object`, are refused;
* a list or tuple is stacked (`np.array([a, b, 3.0])`, nested lists too), with NumPy's dtype
  promotion (Python numbers are weak: a float32 Tracer and 3.0 give float32);
* `ndmin=` adds leading axes; `order=`, `subok=`, `like=` and `device="cpu"` change nothing
  about the value.
"""

from __future__ import annotations

import sys
import types

import numpy as np

from ..core import routes
from ..core.errors import GradtapeError
from ..core.routes import implements, implements_module_function
from ..core.tracing import Tracer, user_source_line
from .shape import astype, concatenate, reshape, stack

# NumPy's own functions, whatever the numpy module holds later (process.py replaces them)
_asarray = np.asarray


def _unwrapped(f):
    return getattr(f, "__gradtape_original__", f)


def _nested_to_traced(seq, name: str):
    """A list or tuple holding Tracers, as one Tracer (NumPy's stacking and promotion rules)."""
    items = [
        _nested_to_traced(e, name) if isinstance(e, (list, tuple)) and _holds(e) else e for e in seq
    ]
    dtypes = []
    for i, e in enumerate(items):
        if type(e) is Tracer:
            dtypes.append(e.dtype)
        elif isinstance(e, (bool, int, float, complex)):
            dtypes.append(e)  # a weak Python scalar
        else:
            items[i] = e = _unwrapped(_asarray)(e)
            if e.dtype.kind not in "biufc":
                raise GradtapeError(
                    f"{name}: a traced value cannot be stacked with values of dtype {e.dtype}."
                )
            dtypes.append(e.dtype)
    dtype = np.result_type(*dtypes)
    shapes = {np.shape(e) for e in items}
    if len(shapes) != 1:
        raise ValueError(
            f"{name}: the elements have different shapes {sorted(shapes)}; "
            "NumPy builds no array from them (an inhomogeneous shape)."
        )
    items = [
        astype(e, dtype) if type(e) is Tracer else _unwrapped(_asarray)(e, dtype) for e in items
    ]
    return stack(items)


def _holds(seq) -> bool:
    for e in seq:
        if type(e) is Tracer or (isinstance(e, (list, tuple)) and _holds(e)):
            return True
    return False


def to_array(obj, dtype=None, *, copy=None, ndmin: int = 0, name: str = "np.asarray"):
    """`obj` (a Tracer, or a nested list holding Tracers) as a Tracer, NumPy's way."""
    if isinstance(copy, np._CopyMode):  # (what array-API wrappers pass)
        copy = {np._CopyMode.ALWAYS: True, np._CopyMode.NEVER: False}.get(copy)
    if type(obj) is Tracer:
        x = obj
    elif isinstance(obj, (list, tuple)):
        x = _nested_to_traced(obj, name)
        copy = None  # already a new value
    else:
        return _unwrapped(_asarray)(obj, dtype)
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt.kind not in "biufc":
            raise GradtapeError(
                f"{name}(..., dtype={dt}) on a traced value: only numeric "
                "dtypes can carry a derivative."
            )
        if dt.kind == "c" and x.dtype.kind != "c":
            raise GradtapeError(
                f"{name}(..., dtype={dt}) turns a traced real value complex: gradtape does not "
                "differentiate complex intermediates. Keep the computation real."
            )
        if dt != x.dtype:
            if copy is False:
                raise ValueError("Unable to avoid copy while creating an array as requested.")
            x = astype(x, dt)
            copy = None
    if copy and x is obj:
        x = x.copy()
    if ndmin > x.ndim:
        x = reshape(x, (1,) * (ndmin - x.ndim) + x.shape)
    return x


def _stack_array_like(seq, name: str):
    """A list or tuple holding Tracers where NumPy takes an array: stacked, as np.array does."""
    return to_array(seq, name=name)


routes.ARRAY_LIKE[0] = _stack_array_like


def _check_device(device, name: str) -> None:
    if device not in (None, "cpu"):
        raise ValueError(f"{name}: device must be None or 'cpu', not {device!r}")


@implements_module_function("numpy", "asarray")
def asarray(a, dtype=None, order=None, *, device=None, copy=None, like=None):
    """np.asarray on a Tracer: the Tracer (cast if `dtype` differs)."""
    _check_device(device, "np.asarray")
    return to_array(a, dtype, copy=copy, name="np.asarray")


@implements_module_function("numpy", "asanyarray")
def asanyarray(a, dtype=None, order=None, *, device=None, copy=None, like=None):
    """np.asanyarray on a Tracer: the Tracer (cast if `dtype` differs)."""
    _check_device(device, "np.asanyarray")
    return to_array(a, dtype, copy=copy, name="np.asanyarray")


@implements_module_function("numpy", "array")
def array(object, dtype=None, *, copy=True, order="K", subok=False, ndmin=0, like=None):
    """np.array on a Tracer or a nested list of them: a copy (a new Tracer), stacked lists."""
    return to_array(object, dtype, copy=copy, ndmin=ndmin, name="np.array")


@implements_module_function("numpy", "ascontiguousarray")
def ascontiguousarray(a, dtype=None, *, like=None):
    """np.ascontiguousarray on a Tracer: the Tracer, at least 1-d (as NumPy's)."""
    return to_array(a, dtype, ndmin=1, name="np.ascontiguousarray")


@implements_module_function("numpy", "asfortranarray")
def asfortranarray(a, dtype=None, *, like=None):
    """np.asfortranarray on a Tracer: the Tracer, at least 1-d (as NumPy's)."""
    return to_array(a, dtype, ndmin=1, name="np.asfortranarray")


@implements_module_function("numpy", "asarray_chkfinite")
def asarray_chkfinite(a, dtype=None, order=None):
    """np.asarray_chkfinite on a Tracer: NumPy's check on the value (a guard when staging)."""
    x = to_array(a, dtype, name="np.asarray_chkfinite")
    if x.dtype.kind in "fc" and not np.all(np.isfinite(x)):
        raise ValueError("array must not contain infs or NaNs")
    return x


# np.r_ and np.c_: NumPy's AxisConcatenator.__getitem__ run with `array` bound to the numpy
# module's np.array (gradtape's dispatcher, which passes a Tracer through) instead of the
# C function its module imported; its np.concatenate then dispatches to gradtape's
_index_tricks = sys.modules.get("numpy.lib._index_tricks_impl")
_axis_concatenator_items = None


def _traced_axis_concatenator():
    global _axis_concatenator_items
    if _axis_concatenator_items is None:
        original = _unwrapped(_index_tricks.AxisConcatenator.__getitem__)
        namespace = dict(original.__globals__)
        namespace["array"] = _traced_array
        _axis_concatenator_items = types.FunctionType(
            original.__code__, namespace, original.__name__, original.__defaults__
        )
    return _axis_concatenator_items


def _traced_array(obj, dtype=None, *, copy=True, order="K", subok=False, ndmin=0, like=None):
    if type(obj) is Tracer or (isinstance(obj, (list, tuple)) and _holds(obj)):
        return to_array(obj, dtype, copy=copy, ndmin=ndmin, name="np.r_")
    return _unwrapped(np.array)(obj, dtype, copy=copy, order=order, subok=subok, ndmin=ndmin)


@implements_module_function("numpy.lib._index_tricks_impl", "AxisConcatenator.__getitem__")
def axis_concatenator_getitem(self, key):
    """np.r_[...] and np.c_[...] with traced items: NumPy's algorithm (slices, scalars,
    the '0,2,1' directives) with the traced items concatenated by gradtape. The matrix
    directives ('r', 'c') and np.r_ on a string of matrix syntax are refused."""
    items = key if isinstance(key, tuple) else (key,)
    if self.matrix or (items and isinstance(items[0], str) and items[0] in ("r", "c")):
        trick = "np.c_" if self is getattr(np, "c_", None) else "np.r_"
        directive = items[0] if items and items[0] in ("r", "c") else "r"
        raise GradtapeError(
            f"{trick}[{directive!r}, ...] builds an np.matrix ({user_source_line()}), which "
            "gradtape does not trace: write np.concatenate (or np.column_stack) of the traced "
            "arrays, as a plain 2-d array, instead."
        )
    return _traced_axis_concatenator()(self, key)


@implements(np.append)
def append(arr, values, axis=None):
    """np.append: a concatenation (of the flattened arrays when axis is None)."""
    if axis is None:
        return concatenate([np.ravel(arr), np.ravel(values)])
    return concatenate([arr, values], axis=axis)


@implements(np.nan_to_num)
def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """np.nan_to_num: NaN and infinities replaced (their entries get no derivative)."""
    if x.dtype.kind not in "fc":
        return x
    big = np.finfo(x.dtype).max
    x = np.where(np.isnan(x), nan, x)
    x = np.where(x == np.inf, big if posinf is None else posinf, x)
    return np.where(x == -np.inf, -big if neginf is None else neginf, x)


@implements_module_function("numpy.lib._function_base_impl", "vectorize.__call__")
def vectorize_call(self, *args, **kwargs):
    """np.vectorize(f)(x) with traced arguments: f called on each element, as NumPy calls it
    (so branches inside f see one number each), the results stacked to the broadcast shape.
    `excluded` arguments are passed whole; `otypes` casts the results; `signature=` (gufunc
    semantics) is refused."""
    if self.signature is not None:
        raise GradtapeError(
            f"np.vectorize(..., signature=...) called on a traced value ({user_source_line()}) "
            "has no rule; write the function with array operations, or loop over the core "
            "dimensions yourself."
        )
    names = [k for k in kwargs if k not in self.excluded]
    positions = [i for i in range(len(args)) if i not in self.excluded]
    if not positions and not names:
        return self.pyfunc(*args, **kwargs)
    mapped = [to_array(args[i], name="np.vectorize") for i in positions]
    mapped += [to_array(kwargs[k], name="np.vectorize") for k in names]
    shape = np.broadcast_shapes(*(np.shape(a) for a in mapped))
    mapped = [np.broadcast_to(a, shape) for a in mapped]
    results = []
    for index in np.ndindex(shape):
        call_args, call_kwargs = list(args), dict(kwargs)
        for slot, a in zip(positions + names, mapped):
            if isinstance(slot, int):
                call_args[slot] = a[index]
            else:
                call_kwargs[slot] = a[index]
        results.append(self.pyfunc(*call_args, **call_kwargs))
    if not results:
        raise GradtapeError(
            f"np.vectorize of empty traced arrays ({user_source_line()}) has no rule: NumPy "
            "needs otypes= there, and nothing would be differentiated."
        )
    several = isinstance(results[0], tuple)
    columns = list(zip(*results)) if several else [results]
    outputs = []
    for k, column in enumerate(columns):
        out = np.reshape(np.stack([to_array(v, name="np.vectorize") for v in column]), shape)
        if self.otypes:
            out = out.astype(np.dtype(self.otypes[k]))
        outputs.append(out)
    return tuple(outputs) if several else outputs[0]


def array_api_clip(x, /, min=None, max=None, *, out=None, **kwargs):
    """array_api_compat's clip for NumPy (SciPy's array-API namespace): np.clip. Its own writes
    the traced value into an np.empty array, which would cut the gradient."""
    if out is not None:
        return np.clip(x, min, max, out=out)
    if min is None and max is None:
        return np.asarray(x).copy()
    return np.clip(x, min, max)


for _module in ("scipy._lib.array_api_compat.numpy", "array_api_compat.numpy"):
    implements_module_function(_module, "clip")(array_api_clip)
