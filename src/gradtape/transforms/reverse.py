"""Reverse mode: the reverse interpreter of a tape, and grad, value_and_grad, vjp."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core import tracing as trace
from ..core.errors import GradtapeError
from ..core.ir import Tape, source_text
from ..core.pytree import tree_flatten, tree_map, tree_unflatten
from ..core.tracing import LevelKind, new_level, plain_write_error
from ..rules._complex import check_complex, real_part
from ..rules._util import dtype_of
from ..rules.indexing import SparseCotangent, materialize
from . import arguments

Tracer = trace.Tracer
_LEAF = tree_flatten(0.0)[1]  # the structure of one array argument


def _resolve(entry):
    """A dense cotangent from an accumulator entry (a value, or a list with sparse pieces)."""
    if type(entry) is not list:
        return entry
    sparse = [p for p in entry if type(p) is SparseCotangent]
    out = materialize(sparse) if sparse else None
    for p in entry:
        if type(p) is not SparseCotangent:
            out = p if out is None else out + p
    return out


def _accumulate(acc: dict, var, ct) -> None:
    if type(ct) is not SparseCotangent:
        dt = getattr(ct, "dtype", None)
        if dt is not None and dt != var.dtype and var.dtype.kind in "fc":
            ct = cast_to(ct, var.dtype)
    prev = acc.get(var.id)
    if prev is None:
        acc[var.id] = [ct] if type(ct) is SparseCotangent else ct
    elif type(prev) is list:
        prev.append(ct)
    elif type(ct) is SparseCotangent:
        acc[var.id] = [prev, ct]
    else:
        acc[var.id] = prev + ct


def cast_to(ct, dtype: np.dtype):
    """A cotangent (or tangent) as one of a value of `dtype`. For a real value used as a
    complex one, the real part: the transpose of x -> x + 0j under the pairing Re(u * v)
    (JAX's convert_element_type)."""
    if ct.dtype.kind == "c" and dtype.kind != "c":
        ct = real_part(ct)
        if ct.dtype == dtype:
            return ct
    elif dtype.kind == "c" and ct.dtype.kind != "c" and type(ct) is Tracer:
        ct = ct + 0j  # not a traced cast: its own derivative would discard imaginary parts
        if ct.dtype == dtype:
            return ct
    return ct.astype(dtype)


FORWARD_LINE = "\n  (in the derivative of {op}, recorded at {where})"


def name_forward_line(error: BaseException, ins) -> None:
    """Add the user's source line of `ins` (the forward operation whose derivative rule raised)
    to `error`: to a GradtapeError's message, as a note to any other exception. Once: an error
    passing through several nested backward passes keeps the innermost line."""
    where = source_text(getattr(ins, "source", None))
    if where is None or getattr(error, "_gradtape_forward_line", False):
        return
    text = FORWARD_LINE.format(op=ins.prim.name, where=where)
    add_note = getattr(error, "add_note", None)  # Python 3.11 and later
    if isinstance(error, GradtapeError) and len(error.args) == 1 and isinstance(error.args[0], str):
        error.args = (error.args[0] + text,)
    elif add_note is not None:
        add_note(text.strip())
    setattr(error, "_gradtape_forward_line", True)  # noqa: B010  (an attribute of any exception)


def backward(tape: Tape, outvars: Sequence, cotangents: Sequence, consume: bool = False) -> dict:
    """Run the tape backwards from `cotangents` of `outvars`; returns var id -> cotangent.

    Only instructions whose outputs received a cotangent are visited, and only the
    arguments traced at this level get one: constants cost nothing. `consume`: the caller
    reads the tape once (grad): each instruction drops its traced values once its rules have
    run, so the values only it held are freed during the pass.
    """
    # a masked branch (np.where(x > 0, np.sqrt(x), 0)) has infinite local derivatives where
    # its cotangent is zero: no warnings for them, once for the whole pass
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _backward(tape, outvars, cotangents, consume)


def _drop_values(ins) -> None:
    """Drop an instruction's traced values once its rules have run (`consume`: the tape still
    lists it, with its constants), so the values only it held are freed during the pass."""
    ins.out = None
    invars = ins.invars
    if len(invars) == 1:
        if invars[0] is not None:
            ins.args = (None,)
    elif len(invars) == 2:
        v0, v1 = invars
        if v0 is not None or v1 is not None:
            a0, a1 = ins.args
            ins.args = (a0 if v0 is None else None, a1 if v1 is None else None)
    else:
        ins.args = tuple([a if v is None else None for v, a in zip(invars, ins.args)])


def _backward(tape: Tape, outvars: Sequence, cotangents: Sequence, consume: bool) -> dict:
    acc: dict = {}
    for v, ct in zip(outvars, cotangents):
        if v is not None and ct is not None:
            _accumulate(acc, v, ct)
    ins = None
    previous = None  # (consume) the instruction whose rules ran last: its values are dropped
    try:
        for ins in reversed(tape.instructions):
            if previous is not None:
                if len(previous.invars) == 1:  # (_drop_values' common case inline)
                    previous.out = None
                    if previous.invars[0] is not None:
                        previous.args = (None,)
                else:
                    _drop_values(previous)
                previous = None
            if consume:
                previous = ins
            prim = ins.prim
            if prim.multiple_results:
                g = _multiple_cotangents(acc, ins)
                if g is None:
                    continue
            else:
                g = acc.pop(ins.outvars[0].id, None)
                if g is None:
                    continue
                if type(g) is list:
                    g = _resolve(g)
            if not prim.complex_correct:
                check_complex(ins)
            if prim.vjp_all is not None:
                cts = prim.vjp_all(g, ins.out, ins.args, ins.params, ins.invars)
                for v, ct in zip(ins.invars, cts):
                    if v is not None and ct is not None:
                        _accumulate(acc, v, ct)
                continue
            vjps = prim.vjps
            args = ins.args
            for i, v in enumerate(ins.invars):
                if v is None:
                    continue
                rule = vjps[i] if type(vjps) is tuple else prim.vjp_rule(i)
                if rule is None:
                    continue
                ct = rule(g, ins.out, *args, **ins.params)
                if ct is None:
                    continue
                # (_accumulate's common case inline: a first dense cotangent of v's dtype)
                dt = getattr(ct, "dtype", None)
                if v.id not in acc and (dt is v.dtype or dt is None or dt == v.dtype):
                    acc[v.id] = [ct] if type(ct) is SparseCotangent else ct
                else:
                    _accumulate(acc, v, ct)
    except Exception as error:
        name_forward_line(error, ins)
        raise
    if previous is not None:
        _drop_values(previous)
    return {k: _resolve(e) for k, e in acc.items()}


def _multiple_cotangents(acc: dict, ins):
    """The cotangents of a primitive with several results (None: it received none)."""
    gs = [acc.pop(v.id, None) for v in ins.outvars]
    if all(g is None for g in gs):
        return None
    if ins.prim.vjp_all is not None:  # takes None for outputs with no cotangent
        return tuple(None if gi is None else _resolve(gi) for gi in gs)
    return tuple(
        np.zeros(v.shape, v.dtype) if gi is None else _resolve(gi) for v, gi in zip(ins.outvars, gs)
    )


# --- argument handling ----------------------------------------------------------------------
def _check_differentiable(x, where: str):
    if arguments.labelled_kind(x) is not None:  # pandas, xarray: their values
        return arguments.unlabelled(x, where)
    if isinstance(x, np.matrix):
        arguments.check_argument(x, where)
    dt = getattr(x, "dtype", None)
    if dt is None:
        if isinstance(x, bool) or not isinstance(x, (int, float, complex)):
            raise GradtapeError(
                f"{where} is a {type(x).__name__}, which cannot be differentiated: pass a float "
                "array or a Python float (or remove it from argnums)."
            )
        if isinstance(x, int):
            raise GradtapeError(
                f"{where} is the Python int {x!r}: integers have no gradient. Pass a float "
                f"({float(x)!r}) or remove it from argnums."
            )
        return np.asarray(x)
    if dt.kind not in "fc":
        raise GradtapeError(
            f"{where} has dtype {dt}, which cannot be differentiated: pass x.astype(float) "
            "(or remove it from argnums)."
        )
    return x


def _normalize_argnums(argnums, nargs: int) -> tuple[tuple, bool]:
    arguments.check_argnums(argnums, "argnums")
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for a in nums:
        if not -nargs <= a < nargs:
            raise GradtapeError(
                f"argnums={argnums!r} but the function was called with {nargs} "
                f"positional arguments {arguments.user_line()}."
            )
    return tuple(a % nargs for a in nums), single


def _trace_call(f, args, kwargs, argnums, level):
    """Call f with the arguments in argnums replaced by input Tracers of `level`."""
    new_args = list(args)
    in_trees = []
    for a in argnums:
        x = args[a]
        if type(x) is np.ndarray and x.dtype.kind in "fc":  # (the common case, at once)
            tracer = level.new_input(x)
            in_trees.append((_LEAF, [tracer._var], [x]))
            new_args[a] = tracer
            continue
        arguments.check_argument(x, f"argument {a}")
        leaves, td = tree_flatten(x)
        tracers = [level.new_input(_check_differentiable(x, f"argument {a}")) for x in leaves]
        # the input Vars, not the Tracers: f may write into its argument (x[0] = ...), which
        # rebinds the Tracer to the written value; derivatives are with respect to the input
        in_trees.append((td, [t._var for t in tracers], leaves))
        new_args[a] = tree_unflatten(td, tracers)
    try:
        return f(*new_args, **kwargs), in_trees
    except TypeError as e:
        clear = arguments.list_argument_error(
            e, args, argnums, getattr(f, "__name__", "the function")
        )
        if clear is not None:
            raise clear from e
        raise
    except ValueError as e:
        clear = plain_write_error(e)
        if clear is not None:
            raise clear from e
        raise


def _lower(x, level):
    """The value one level below `level` (what the caller of a transform sees)."""
    if type(x) is Tracer and x._level is level:
        return x._value
    return x


def _fresh(g, like):
    """A gradient the caller owns: writable, with the argument's type for Python floats (and
    its labels for a pandas or xarray argument)."""
    if type(like) is np.ndarray:  # (the common case)
        return np.array(g) if type(g) is np.ndarray and not g.flags.writeable else g
    if arguments.labelled_kind(like) is not None:
        return arguments.relabel(g, like)
    if isinstance(g, np.ndarray) and not g.flags.writeable:
        g = np.array(g)
    if (
        isinstance(like, (float, complex))
        and not isinstance(like, np.ndarray)
        and isinstance(g, (np.ndarray, np.generic))
    ):
        return np.float64(g) if g.dtype == np.float64 else g[()]
    return g


def _grads_for(in_trees, cts: dict):
    out = []
    for td, invars, leaves in in_trees:
        if td is _LEAF:
            g = cts.get(invars[0].id)
            if g is None:
                g = np.zeros(invars[0].shape, invars[0].dtype)
            out.append(_fresh(g, leaves[0]))
            continue
        gl = []
        for var, leaf in zip(invars, leaves):
            g = cts.get(var.id)
            if g is None:
                g = np.zeros(var.shape, var.dtype)
            gl.append(_fresh(g, leaf))
        out.append(tree_unflatten(td, gl))
    return out


def _scalar_output(out, level, fname: str, holomorphic: bool = False):
    shape = getattr(out, "shape", None)
    if shape is None:
        if isinstance(out, (int, float, complex)) and not isinstance(out, bool):
            check_output_dtype(np.result_type(out), "grad", holomorphic)
            return None
        raise GradtapeError(
            f"grad of {fname} needs a scalar output, but it returned a {type(out).__name__}. "
            "Return a scalar, use has_aux=True to return (scalar, aux), or use vjp/jacobian."
        )
    if shape != () and int(np.prod(shape)) != 1:  # shape (1,), (1, 1): as HIPS autograd
        raise GradtapeError(
            f"grad of {fname} needs a scalar output, but it returned shape {shape}. Use "
            "gradtape.jacobian or gradtape.vjp for non-scalar outputs, or reduce it (np.sum)."
        )
    check_output_dtype(out.dtype, "grad", holomorphic)
    return out._var if type(out) is Tracer and out._level is level else None


def check_output_dtype(dt: np.dtype, who: str, holomorphic: bool) -> None:
    """A derivative by reverse mode (grad, jacrev) needs real float outputs, or complex ones
    with holomorphic=True (JAX's rule: a complex output of a function that is not holomorphic
    has no gradient, only a vjp)."""
    if holomorphic:
        if dt.kind != "c":
            raise GradtapeError(
                f"{who} with holomorphic=True needs outputs with a complex dtype, but got {dt}."
            )
    elif dt.kind == "c":
        raise GradtapeError(
            f"{who} needs real-valued outputs (a float dtype), but got {dt}. For a holomorphic "
            f"function, pass holomorphic=True. Otherwise differentiate a real function of the "
            "output (np.real(y), np.abs(y) ** 2), or use gradtape.vjp directly."
        )
    elif dt.kind != "f":
        raise GradtapeError(f"{who} needs real-valued outputs (a float dtype), got dtype {dt}.")


def check_input_dtypes(in_trees, who: str, holomorphic: bool) -> None:
    """holomorphic=True needs complex inputs (as in JAX: the derivative of a holomorphic
    function is the complex one, a complex number per input element)."""
    if not holomorphic:
        return
    for _, invars, _ in in_trees:
        for v in invars:
            if v.dtype.kind != "c":
                raise GradtapeError(
                    f"{who} with holomorphic=True needs inputs with a complex "
                    f"dtype, but got {v.dtype}: pass x.astype(complex)."
                )


def value_and_grad(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
) -> Callable:
    """The value of a scalar function and its gradient from one pass: `(value, gradient)`.

    `fun` returns a real scalar; the gradient with respect to a complex argument z follows JAX:
    df/dx - i df/dy (for |z|^2 that is 2 conj(z)). With holomorphic=True, fun is a holomorphic
    function of complex arguments with a complex scalar output, and the gradient is f'(z). This
    is what `scipy.optimize.minimize(fun, x0, jac=True)` expects.

    Parameters
    ----------
    fun : callable
        Plain NumPy/SciPy code returning a real scalar, or `(scalar, aux)` with `has_aux=True`.
    argnums : int or sequence of int, default 0
        Which positional argument(s) to differentiate.
    has_aux : bool, default False
        `fun` returns `(value, aux)`; the result is then `((value, aux), gradient)`, as in JAX.
    holomorphic : bool, default False
        `fun` is holomorphic in complex arguments with a complex scalar output.

    Returns
    -------
    callable
        `vg(*args, **kwargs)` returning `(value, gradient)`; the gradient has the structure of the
        differentiated argument(s).

    Raises
    ------
    GradtapeError
        As `grad`: an operation that cannot be differentiated, named with its source line.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> value, g = gt.value_and_grad(lambda x: np.sum(x**2))(np.array([1.0, 2.0]))
    >>> print(float(value), g)
    5.0 [2. 4.]
    """
    arguments.check_function(fun, "value_and_grad")
    arguments.check_argnums(argnums, "value_and_grad")
    fname = getattr(fun, "__name__", "the function")

    def value_and_grad_f(*args, **kwargs):
        nums, single = _normalize_argnums(argnums, len(args))
        with new_level(LevelKind.DIFFERENTIATE) as level:
            level.releases = True  # only the backward pass reads this tape
            out, in_trees = _trace_call(fun, args, kwargs, nums, level)
            check_input_dtypes(in_trees, "grad", holomorphic)
            aux = None
            if has_aux:
                if not (isinstance(out, (tuple, list)) and len(out) == 2):
                    raise GradtapeError(
                        "has_aux=True needs the function to return a pair (scalar, aux)."
                    )
                out, aux = out
            outvar = _scalar_output(out, level, fname, holomorphic)
        if type(out) is Tracer:  # (np.shape of a Tracer goes through NumPy's dispatch)
            seed = np.ones(out._var.shape, out._var.dtype)
        else:
            seed = np.ones(
                np.shape(out), dtype=out.dtype if hasattr(out, "dtype") else np.result_type(out)
            )
        # (consume: the tape is this call's own, read once)
        cts = backward(level.tape, [outvar], [seed], consume=True) if outvar is not None else {}
        grads = _grads_for(in_trees, cts)
        value = _lower(out, level)
        g = grads[0] if single else tuple(grads)
        if has_aux:
            return (value, tree_map(lambda x: _lower(x, level), aux)), g
        return value, g

    return arguments.TransformedFunction(
        value_and_grad_f, value_and_grad, fun, (argnums, has_aux, holomorphic)
    )


def grad(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
) -> Callable:
    """The gradient of a scalar function with respect to argument(s) `argnums`.

    For complex arguments of a real function the gradient is JAX's, df/dx - i df/dy;
    holomorphic=True differentiates a holomorphic function with a complex output (f'(z)).

    Parameters
    ----------
    fun : callable
        Plain NumPy/SciPy code returning a real scalar (a Python float, a 0-d array, or a size-1
        array), or `(scalar, aux)` with `has_aux=True`.
    argnums : int or sequence of int, default 0
        Which positional argument(s) to differentiate. Arguments may be arrays, floats, or nested
        tuples, lists and dicts of them.
    has_aux : bool, default False
        `fun` returns `(value, aux)`; the returned function then gives `(gradient, aux)`.
    holomorphic : bool, default False
        `fun` is holomorphic in complex arguments with a complex scalar output.

    Returns
    -------
    callable
        `g(*args, **kwargs)` returning the gradient, with the structure, shape and dtype of the
        differentiated argument (a tuple of them when `argnums` is a tuple).

    Raises
    ------
    GradtapeError
        When `fun` does something that cannot be differentiated (`float(x)` of a traced value, a
        function with no rule, a non-scalar output); the message names the operation, the line
        and what to write instead.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> def f(x):
    ...     return np.sum(x**2)
    >>> print(gt.grad(f)(np.array([1.0, 2.0])))
    [2. 4.]
    """
    arguments.check_function(fun, "grad")
    arguments.check_argnums(argnums, "grad")
    vg = value_and_grad(fun, argnums, has_aux, holomorphic)

    def grad_f(*args, **kwargs):
        (value, g) = vg(*args, **kwargs)
        if has_aux:
            return g, value[1]
        return g

    return arguments.TransformedFunction(grad_f, grad, fun, (argnums, has_aux, holomorphic))


def vjp(fun: Callable, *primals: Any, has_aux: bool = False) -> tuple[Any, ...]:
    """Reverse mode for any output: `(fun(*primals), vjp_fn)`.

    Parameters
    ----------
    fun : callable
        Plain NumPy/SciPy code; its output may be any structure of arrays.
    *primals
        The point at which to differentiate, one value per positional argument of `fun`.
    has_aux : bool, default False
        `fun` returns `(output, aux)`; `vjp` then returns `(output, vjp_fn, aux)`.

    Returns
    -------
    tuple
        `(output, vjp_fn)`: `vjp_fn(cotangent)` takes a cotangent with the output's structure,
        shapes and dtypes and returns a tuple with one cotangent per primal.

    Raises
    ------
    GradtapeError
        When `fun` does something that cannot be differentiated (named with its source line).

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> out, vjp_fn = gt.vjp(lambda x: x**2, np.array([1.0, 2.0]))
    >>> print(out, vjp_fn(np.array([1.0, 1.0])))
    [1. 4.] (array([2., 4.]),)
    """
    arguments.check_function(fun, "vjp")
    nums = tuple(range(len(primals)))
    with new_level(LevelKind.DIFFERENTIATE) as level:
        level.releases = True  # only the backward pass reads this tape
        out, in_trees = _trace_call(fun, primals, {}, nums, level)
        aux = None
        if has_aux:
            out, aux = out
    out_leaves, out_td = tree_flatten(out)
    outvars = [x._var if type(x) is Tracer and x._level is level else None for x in out_leaves]

    def vjp_fn(cotangent):
        ct_leaves, ct_td = tree_flatten(cotangent)
        if ct_td != out_td:
            raise GradtapeError(
                f"vjp: the cotangent has structure {ct_td}, but the output has structure {out_td}."
            )
        for i, (c, o) in enumerate(zip(ct_leaves, out_leaves)):
            if np.shape(c) != np.shape(o):
                raise GradtapeError(
                    f"vjp: cotangent leaf {i} has shape {np.shape(c)}, but the "
                    f"output has shape {np.shape(o)}."
                )
            if dtype_of(c).kind == "c" and dtype_of(o).kind != "c":
                raise GradtapeError(
                    f"vjp: cotangent leaf {i} is complex, but the output is "
                    f"real ({dtype_of(o)}): pass a real cotangent."
                )
        cts = backward(level.tape, outvars, ct_leaves)
        return tuple(_grads_for(in_trees, cts))

    value = tree_unflatten(out_td, [_lower(x, level) for x in out_leaves])
    if has_aux:
        return value, vjp_fn, tree_map(lambda x: _lower(x, level), aux)
    return value, vjp_fn
