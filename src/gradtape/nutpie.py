"""Sampling with nutpie: a log-density written in NumPy, sampled by nutpie's NUTS in Rust.

`from_logp(logp, shapes={...})` compiles the log-density and its gradient once (gradtape's
numba backend) and hands nutpie C function pointers (`as_native`): every gradient the
sampler asks for runs native code, with no Python in between. Parameters are named, have
shapes, and may be constrained (`positive`, `interval`, `simplex`, `corr_cholesky`): the
sampler moves on the unconstrained space, the log-Jacobian of each transform is added to the
density, and the trace reports the constrained values, as Stan and PyMC do.

    import numpy as np
    import nutpie
    from gradtape.nutpie import from_logp, positive

    y = np.array([1.2, 0.4, 2.1])

    def logp(p):
        return -0.5 * np.sum((y - p["mu"]) ** 2) / p["sigma"] ** 2 - y.size * np.log(p["sigma"])

    model = from_logp(logp, shapes={"mu": (), "sigma": positive()})
    trace = nutpie.sample(model, chains=2, draws=1000, tune=500, seed=1)

An optional extra: `pip install "gradtape[nutpie]"`. Importing this module without nutpie
raises an ImportError that says so.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

try:
    from nutpie.compile_pymc import CompiledPyMCModel as _CompiledModel
    from nutpie.sample import CompiledModel as _NutpieModel
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        'gradtape.nutpie needs nutpie: pip install "gradtape[nutpie]" (or pip install nutpie)'
    ) from _exc

from .compile import NativeFallbackWarning
from .compile import compile as _compile
from .compile.numba.export import elementwise_expand as _elementwise_expand
from .core.errors import GradtapeError, NotExportableError
from .transforms.reverse import value_and_grad as _value_and_grad

__all__ = [
    "Constraint",
    "corr_cholesky",
    "from_logp",
    "interval",
    "positive",
    "simplex",
]


# --- constraints -----------------------------------------------------------------------------
def _log_expit(u):
    """log(1 / (1 + exp(-u))), stable for large |u|."""
    return -np.logaddexp(0.0, -u)


@dataclasses.dataclass(frozen=True)
class Constraint:
    """A parameter's support and the transform from the unconstrained space onto it.

    `shape` is the constrained value's shape, `size` the number of unconstrained values the
    sampler moves. `transform(u)` returns (value, log|det J|) for a flat vector `u` of `size`
    (written with NumPy calls, so gradtape differentiates and compiles it); `inverse(value)`
    maps a constrained value back (initial values). `elementwise` describes a transform that
    acts element by element (("copy",), ("exp",) or ("interval", lower, width)): nutpie's
    expand function of such parameters is written directly, without compiling a program;
    None (the default) compiles `transform`.
    """

    name: str
    shape: tuple
    size: int
    transform: Callable = dataclasses.field(repr=False)
    inverse: Callable = dataclasses.field(repr=False)
    elementwise: tuple | None = None


def _shape(shape) -> tuple:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(d) for d in shape)


def _reshaped(value, shape: tuple):
    return value if np.shape(value) == shape else np.reshape(value, shape)


def _total(terms):
    """The sum of `terms` (a 0-d value is its own sum)."""
    return terms if np.ndim(terms) == 0 else np.sum(terms)


def positive(shape: int | Sequence[int] = ()) -> Constraint:
    """A positive parameter of `shape`: value = exp(u), log-Jacobian sum(u).

    Example:
        >>> from_logp(logp, shapes={"sigma": positive(), "scales": positive(3)})
    """
    shape = _shape(shape)

    def transform(u):
        return _reshaped(np.exp(u), shape), _total(u)

    def inverse(value):
        return np.log(np.asarray(value, np.float64)).reshape(-1)

    return Constraint("positive", shape, math.prod(shape), transform, inverse, ("exp",))


def interval(lower: float, upper: float, shape: int | Sequence[int] = ()) -> Constraint:
    """A parameter in (lower, upper): value = lower + (upper - lower) * expit(u), log-Jacobian
    sum(log(upper - lower) + log expit(u) + log expit(-u)).

    Raises:
        ValueError: lower is not below upper, or a bound is not finite.

    Example:
        >>> from_logp(logp, shapes={"p": interval(0.0, 1.0, shape=4)})
    """
    lower, upper = float(lower), float(upper)
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise ValueError(f"interval: need finite lower < upper, got ({lower}, {upper})")
    shape = _shape(shape)
    width = upper - lower
    log_width = math.log(width)

    def transform(u):
        value = lower + width * np.exp(_log_expit(u))
        log_jacobian = _total(log_width + _log_expit(u) + _log_expit(-u))
        return _reshaped(value, shape), log_jacobian

    def inverse(value):
        p = (np.asarray(value, np.float64).reshape(-1) - lower) / width
        return np.log(p) - np.log1p(-p)

    return Constraint(
        f"interval({lower}, {upper})",
        shape,
        math.prod(shape),
        transform,
        inverse,
        ("interval", lower, width),
    )


def simplex(k: int) -> Constraint:
    """A vector of `k` positive values summing to 1, from k - 1 unconstrained values (Stan's
    stick-breaking transform: z_i = expit(u_i - log(k - 1 - i)), x_i = z_i times what the
    earlier pieces left; the log-Jacobian sums log z_i + log(1 - z_i) + log(left before i)).

    Raises:
        ValueError: k < 2.

    Example:
        >>> from_logp(logp, shapes={"weights": simplex(3)})
    """
    k = int(k)
    if k < 2:
        raise ValueError(f"simplex: k must be at least 2, got {k}")
    offset = np.log(np.arange(k - 1, 0, -1, dtype=np.float64))

    def transform(u):
        shifted = u - offset
        log_z = _log_expit(shifted)
        log_1mz = _log_expit(-shifted)
        log_left_after = np.cumsum(log_1mz)  # log of what is left after piece i
        log_left_before = np.concatenate([np.zeros(1), log_left_after[:-1]])
        pieces = np.exp(log_left_before + log_z)
        value = np.concatenate([pieces, np.exp(log_left_after[-1:])])
        return value, np.sum(log_z + log_1mz + log_left_before)

    def inverse(value):
        x = np.asarray(value, np.float64).reshape(-1)
        left = 1.0 - np.concatenate([[0.0], np.cumsum(x[:-2])])
        z = x[:-1] / left
        return np.log(z) - np.log1p(-z) + offset

    return Constraint(f"simplex({k})", (k,), k - 1, transform, inverse)


def corr_cholesky(n: int) -> Constraint:
    """The Cholesky factor L (n x n, lower triangular, rows of unit length) of a correlation
    matrix, from n(n-1)/2 unconstrained values (Stan's transform: canonical partial
    correlations z = tanh(u), L[i, j] = z[i, j] * sqrt(1 - sum_{m<j} L[i, m]^2)). The
    log-Jacobian is that of the map onto L's strictly lower entries. Use it with an LKJ
    prior, for instance `(eta - 1) * 2 * sum(log(diag(L)))` plus the row terms of the
    density you write.

    Raises:
        ValueError: n < 2.

    Example:
        >>> from_logp(logp, shapes={"L": corr_cholesky(3)})
    """
    n = int(n)
    if n < 2:
        raise ValueError(f"corr_cholesky: n must be at least 2, got {n}")
    size = n * (n - 1) // 2

    def transform(u):
        z = np.tanh(u)
        log_1mz2 = np.log1p(-(z * z))
        rows = [np.concatenate([np.ones(1), np.zeros(n - 1)])]
        log_jacobian = np.sum(log_1mz2)
        start = 0
        for i in range(1, n):
            zi, li = z[start : start + i], log_1mz2[start : start + i]
            start += i
            log_left_after = np.cumsum(li)  # log(1 - sum_{m<=j} L[i, m]^2)
            log_left_before = np.concatenate([np.zeros(1), log_left_after[:-1]])
            lower = zi * np.exp(0.5 * log_left_before)
            diagonal = np.exp(0.5 * log_left_after[-1:])
            rows.append(np.concatenate([lower, diagonal, np.zeros(n - 1 - i)]))
            log_jacobian = log_jacobian + 0.5 * np.sum(log_left_before)
        return np.stack(rows), log_jacobian

    def inverse(value):
        L = np.asarray(value, np.float64).reshape(n, n)
        out = []
        for i in range(1, n):
            left = 1.0
            for j in range(i):
                z = L[i, j] / math.sqrt(left)
                out.append(np.arctanh(z))
                left -= L[i, j] ** 2
        return np.array(out)

    return Constraint(f"corr_cholesky({n})", (n, n), size, transform, inverse)


def _unconstrained(shape) -> Constraint:
    shape = _shape(shape)

    def transform(u):
        return _reshaped(u, shape), 0.0

    def inverse(value):
        return np.asarray(value, np.float64).reshape(-1)

    return Constraint("real", shape, math.prod(shape), transform, inverse, ("copy",))


# --- the model -------------------------------------------------------------------------------
class _Parameters(dict):
    """The dict `logp` receives: a missing name is an error that lists the known names."""

    def __missing__(self, name):
        raise KeyError(
            f"from_logp: logp asked for parameter {name!r}, which shapes= does not name "
            f"(it names {', '.join(map(repr, self)) or 'nothing'})"
        )


@dataclasses.dataclass
class _Layout:
    names: list[str]
    constraints: list[Constraint]
    starts: list[int]
    size: int

    def split(self, u):
        """(params, log-Jacobian) from the flat unconstrained vector `u`."""
        params = _Parameters()
        log_jacobian = 0.0
        for name, c, start in zip(self.names, self.constraints, self.starts):
            # a scalar parameter reads u[start] (a 0-d value), not a reshaped slice
            piece = u[start] if c.shape == () else u[start : start + c.size]
            value, lj = c.transform(piece)
            params[name] = value
            log_jacobian = log_jacobian + lj
        return params, log_jacobian


def _layout(shapes: Mapping) -> _Layout:
    if not isinstance(shapes, Mapping) or not shapes:
        raise GradtapeError(
            'from_logp: shapes= must be a dict of parameter names to shapes, e.g. {"alpha": (), '
            '"beta": (20,)} (or constraints such as positive())'
        )
    names, constraints, starts, size = [], [], [], 0
    for name, spec in shapes.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise GradtapeError(f"from_logp: parameter names must be identifiers, got {name!r}")
        if isinstance(spec, Constraint):
            c = spec
        else:
            try:
                c = _unconstrained(spec)
            except (TypeError, ValueError):
                raise GradtapeError(
                    f"from_logp: the shape of {name!r} must be a tuple of ints or a "
                    f"constraint, got {spec!r}"
                ) from None
        if c.size == 0:
            raise GradtapeError(f"from_logp: parameter {name!r} has no elements")
        names.append(name)
        constraints.append(c)
        starts.append(size)
        size += c.size
    return _Layout(names, constraints, starts, size)


def from_logp(
    logp: Callable[[dict], object],
    shapes: Mapping[str, Sequence[int] | int | Constraint],
    *,
    init: Mapping[str, object] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Sequence] | None = None,
    jitter: float = 2.0,
    require_native: bool = False,
) -> _NutpieModel:
    """A model `nutpie.sample` samples, from a log-density written with NumPy.

    Args:
        logp: `logp(params) -> scalar`, where `params` maps each name of `shapes` to a float64
            array of that shape (constrained values for constrained parameters). It may read
            data it closes over (bound once, without a copy per gradient).
        shapes: parameter name -> shape (a tuple, an int, `()` for a scalar) or a constraint
            (`positive`, `interval`, `simplex`, `corr_cholesky`), in the order of the
            sampler's vector.
        init: optional constrained starting values by name (the others start at uniform
            draws in (-jitter, jitter) on the unconstrained scale, as in Stan).
        dims, coords: named dimensions for the trace, as in PyMC (`dims={"beta":
            ("feature",)}`, `coords={"feature": [...]}`).
        jitter: half-width of the unconstrained starting draws.
        require_native: what to do with a density a native handle cannot hold (an operation
            the numba backend runs through NumPy, such as `np.linalg.solve`, or a `scan`):
            False (the default) samples it through nutpie's Python interface, calling the
            compiled value-and-gradient from Python (exact, about 10 µs more per gradient),
            with a `NativeFallbackWarning` that names the operation and its line; True
            raises that refusal instead.

    Returns:
        A nutpie compiled model: `nutpie.sample(model, chains=..., draws=..., tune=...,
        seed=...)` returns a trace whose posterior has one variable per name with its
        (constrained) shape.

    Raises:
        GradtapeError: shapes= is not a dict of shapes, logp does not return a scalar,
            logp reads a name shapes= does not list (KeyError), an init name is unknown,
            or (with require_native=True) the density cannot be exported natively: a
            `NotExportableError` that names the operation and the line.

    Example:
        >>> model = from_logp(lambda p: -0.5 * np.sum(p["x"] ** 2), shapes={"x": (3,)})
        >>> trace = nutpie.sample(model, chains=2, draws=500, tune=300, seed=1)
    """
    layout = _layout(shapes)
    init_u = _unconstrained_init(layout, init)

    def unconstrained_logp(u):
        params, log_jacobian = layout.split(u)
        return logp(params) + log_jacobian

    u0 = _initial_point(layout, init_u, jitter, np.random.default_rng(0))
    _check_scalar(logp(layout.split(u0)[0]))

    def initial_point(seed):
        return _initial_point(layout, init_u, jitter, np.random.default_rng(seed))

    value_and_grad = _compile(_value_and_grad(unconstrained_logp))
    try:
        logp_handle = value_and_grad.as_native(u0)
    except NotExportableError as refusal:
        if require_native:
            raise
        warnings.warn(
            f"from_logp: sampling through Python (nutpie's from_pyfunc), about 10 µs more per "
            f"gradient, because {refusal.reason}",
            NativeFallbackWarning,
            stacklevel=2,
        )
        return _python_model(layout, value_and_grad, initial_point, dims, coords)
    expand_handle, expand_entry, expand_data = _expand_function(layout, logp_handle, u0)
    # nutpie passes one data pointer to both functions: [logp's data, expand's data]
    user_data = np.array([logp_handle.data_address, expand_data], np.int64)

    shape_info = _shape_info(layout)
    return _CompiledModel(
        _n_dim=layout.size,
        dims=dict(dims or {}),
        _coords=_trace_coords(layout, coords),
        _shapes={name: tuple(c.shape) for name, c in zip(layout.names, layout.constraints)},
        compiled_logp_func=logp_handle.nutpie_logp(),
        compiled_expand_func=expand_entry,
        initial_point_func=initial_point,
        shared_data={},
        user_data=user_data,
        n_expanded=shape_info[1][-1].stop,
        shape_info=shape_info,
        logp_func=logp_handle,
        expand_func=expand_handle,
    )


def _python_model(layout: _Layout, value_and_grad, initial_point, dims, coords):
    """A nutpie model that calls the compiled value-and-gradient from Python (a density a
    native handle cannot hold); the trace names and shapes the constrained parameters as the
    native model's does."""

    def logp_and_grad(u, **_shared):
        value, grad = value_and_grad(u)
        return float(value), np.asarray(grad, np.float64)

    def expand(u, **_shared):
        params, _ = layout.split(np.asarray(u, np.float64))
        return {name: np.asarray(params[name], np.float64) for name in layout.names}

    from nutpie.compiled_pyfunc import from_pyfunc

    return from_pyfunc(
        layout.size,
        lambda: logp_and_grad,
        lambda *_seeds: expand,
        [np.dtype(np.float64)] * len(layout.names),
        [tuple(c.shape) for c in layout.constraints],
        list(layout.names),
        coords={k: list(v) for k, v in (coords or {}).items()},
        dims={k: tuple(v) for k, v in (dims or {}).items()},
        make_initial_point_fn=initial_point,
    )


def _unconstrained_init(layout: _Layout, init: Mapping | None) -> dict | None:
    """The unconstrained starting values of the parameters `init` names (checked: known
    names, the parameters' shapes), or None."""
    if init is None:
        return None
    unknown = sorted(set(init) - set(layout.names))
    if unknown:
        raise GradtapeError(
            f"from_logp: init names {unknown} are not parameters (shapes= names {layout.names})"
        )
    init_u = {}
    for name, c in zip(layout.names, layout.constraints):
        if name in init:
            value = np.asarray(init[name], np.float64)
            if value.shape != c.shape:
                raise GradtapeError(
                    f"from_logp: init[{name!r}] has shape {value.shape}, the parameter "
                    f"has shape {c.shape}"
                )
            init_u[name] = c.inverse(value)
    return init_u


def _check_scalar(value) -> None:
    """logp's value at the starting point must be a scalar."""
    if np.ndim(value) != 0:
        raise GradtapeError(
            f"from_logp: logp must return a scalar (the log-density); it returned an array "
            f"of shape {np.shape(value)}; sum the terms (np.sum)"
        )


def _expand_function(layout: _Layout, logp_handle, u0: np.ndarray) -> tuple:
    """(handle or None, entry point, data address) of nutpie's expand function: a copy of
    the sampler's vector (no constraint), a function written directly (elementwise
    constraints), or the compiled program of the constrained values."""
    if all(c.name == "real" for c in layout.constraints):
        # the trace holds the sampler's vector itself: a copy, no second program to compile
        return None, logp_handle.nutpie_copy(), 0
    if all(c.elementwise is not None for c in layout.constraints):
        # exp and the logistic function element by element: written directly, no program
        segments = [
            (c.elementwise[0], start, c.size, *(c.elementwise[1:] or (0.0, 0.0)))
            for c, start in zip(layout.constraints, layout.starts)
        ]
        return None, _elementwise_expand(layout.size, segments), 0

    def expand(u):
        params, _ = layout.split(u)
        return np.concatenate([np.reshape(params[name], (-1,)) for name in layout.names])

    expand_handle = _compile(expand).as_native(u0)
    return expand_handle, expand_handle.nutpie_expand(), expand_handle.data_address


def _trace_coords(layout: _Layout, coords: Mapping | None) -> dict:
    """The trace's coordinates: the user's, and the names of the unconstrained values."""
    import pandas as pd  # nutpie depends on pandas

    names_u = []
    for name, c in zip(layout.names, layout.constraints):
        names_u += (
            [name] if c.size == 1 and c.shape == () else [f"{name}_{i}" for i in range(c.size)]
        )
    all_coords = {k: pd.Index(list(v)) for k, v in (coords or {}).items()}
    all_coords["unconstrained_parameter"] = pd.Index(names_u)
    return all_coords


def _shape_info(layout: _Layout) -> tuple:
    """nutpie's shape_info: (names, slices of the expanded vector, constrained shapes)."""
    slices, start = [], 0
    for c in layout.constraints:
        size = math.prod(c.shape)
        slices.append(slice(start, start + size))
        start += size
    return list(layout.names), slices, [tuple(c.shape) for c in layout.constraints]


def _initial_point(layout: _Layout, init_u: dict | None, jitter: float, rng) -> np.ndarray:
    u = rng.uniform(-jitter, jitter, size=layout.size)
    if init_u:
        for name, c, start in zip(layout.names, layout.constraints, layout.starts):
            if name in init_u:
                u[start : start + c.size] = init_u[name]
    return u
