"""User-defined rules: custom_vjp and custom_jvp."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..core import tracing as trace
from ..core.errors import GradtapeError
from ..core.ir import Instruction
from ..core.primitive import Primitive
from ..core.pytree import tree_flatten
from ..core.tracing import LevelKind, bind
from ..rules._util import dtype_of, shape_of
from ..transforms.linearize import linearize


def _top_level(args):
    """The highest level among the Tracer arguments (None: plain values), as `bind` finds it."""
    top = None
    for a in args:
        if type(a) is trace.Tracer and (top is None or a._level.id > top.id):
            top = a._level
    return top


def _differentiated_below(level) -> bool:
    """Whether a differentiating level lies below this (vmap) level."""
    return any(
        lv.kind is LevelKind.DIFFERENTIATE and lv.id < level.id for lv in trace.current_levels()
    )


def _per_member(fn, level, args):
    """A function with a custom rule called on members of a vmap batch that is differentiated
    outside the vmap: called once per member one level down, where the differentiating level
    records its rule (batching its body instead would differentiate the body, not the rule)."""
    vals = [a._value if type(a) is trace.Tracer and a._level is level else None for a in args]
    outs = []
    for i in range(level.batch_size):
        member = [a if v is None else v[i] for a, v in zip(args, vals)]
        outs.append(fn(*member))
    out = np.stack(outs)
    return trace.Tracer(out, level.new_batched_var(out), level)


class custom_vjp:
    """A function with a user-supplied reverse-mode rule (a decorator, JAX's convention).

        @custom_vjp
        def f(x, y): ...
        def f_fwd(x, y): return f(x, y), residuals
        def f_bwd(residuals, g): return (g_x, g_y)
        f.defvjp(f_fwd, f_bwd)

    Under `grad`/`vjp` gradtape calls `fwd` and records one instruction whose VJP is
    `bwd`; elsewhere (plain calls, `trace`, `compile` without differentiation) it calls `f`.
    Forward mode (jvp, jacfwd, hessian, hvp) uses the rule given with `f.defjvp(rule)`,
    `rule(primals, tangents) -> (out, tangent_out)`, and is an error without one.

    Parameters
    ----------
    fun : callable
        The function; it returns a single array.

    Returns
    -------
    custom_vjp
        A callable with `defvjp(fwd, bwd)` and `defjvp(rule)`.

    Raises
    ------
    GradtapeError
        Differentiating before `defvjp` was called, forward mode without `defjvp`, or a `bwd`
        that returns the wrong number or shapes of cotangents.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> @gt.custom_vjp
    ... def f(x):
    ...     return np.sin(x)
    >>> def f_fwd(x):
    ...     return np.sin(x), np.cos(x)
    >>> def f_bwd(cos_x, g):
    ...     return (g * cos_x,)
    >>> _ = f.defvjp(f_fwd, f_bwd)
    >>> print(gt.grad(lambda x: np.sum(f(x)))(np.array([0.0])))
    [1.]
    """

    def __init__(self, fun: Callable):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.fwd = None
        self.bwd = None
        self.jvp_rule = None
        name = getattr(fun, "__name__", "custom")
        self._prim = Primitive(f"custom_vjp[{name}]", self._impl, jvp=self._jvp, user_rule=True)
        self._prim.vjp_all = self._vjp_all

    def defvjp(self, fwd: Callable, bwd: Callable) -> custom_vjp:
        self.fwd, self.bwd = fwd, bwd
        return self

    def defjvp(self, jvp: Callable) -> custom_vjp:
        """Also give a forward-mode rule `jvp(primals, tangents) -> (out, tangent_out)`."""
        self.jvp_rule = jvp
        return self

    def _impl(self, *args, res=None):
        return self.fun(*args)

    def _jvp(self, tangents, ans, *args, res=None):
        if self.jvp_rule is None:
            raise GradtapeError(
                f"custom_vjp function {self.fun.__name__} has no forward-mode rule, so forward "
                "mode (jvp, jacfwd, hessian, hvp) cannot differentiate it. Give one with "
                f"{self.fun.__name__}.defjvp(rule), rule(primals, tangents) -> "
                "(out, tangent_out), or use reverse mode (grad, vjp, jacrev)."
            )
        return _rule_tangent(self.jvp_rule, args, tangents, self.fun.__name__)

    def _vjp_all(self, g, ans, args, params, invars):
        cts = self.bwd(params["res"], g)
        if not isinstance(cts, tuple) or len(cts) != len(args):
            raise GradtapeError(
                f"the bwd rule of {self.fun.__name__} must return a tuple with one cotangent per "
                f"argument ({len(args)}), got {type(cts).__name__}"
                + (f" of length {len(cts)}" if isinstance(cts, tuple) else "")
            )
        return cts

    def __call__(self, *args):
        if self.fwd is None:
            raise GradtapeError(
                f"custom_vjp function {self.fun.__name__} has no rule: call "
                ".defvjp(fwd, bwd) first."
            )
        top = _top_level(args)
        if top is not None and top.batch_size is not None and _differentiated_below(top):
            return _per_member(self, top, args)
        if top is None or top.kind is not LevelKind.DIFFERENTIATE:
            return self.fun(*args)
        vals = tuple(a._value if type(a) is trace.Tracer and a._level is top else a for a in args)
        out, res = self.fwd(*vals)
        out_leaves, out_td = tree_flatten(out)
        if len(out_leaves) != 1:
            raise GradtapeError("custom_vjp functions must return a single array.")
        out = out_leaves[0]
        invars = tuple(
            a._var if type(a) is trace.Tracer and a._level is top else None for a in args
        )
        var = top.new_var(out)
        top.tape.instructions.append(
            Instruction(self._prim, invars, vals, {"res": res}, (var,), out)
        )
        return trace.Tracer(out, var, top)


def _zero_tangent(a):
    dt = dtype_of(a)
    return np.zeros(shape_of(a), dt if dt.kind in "fc" else np.float64)


def _rule_tangent(rule: Callable, args: tuple, tangents, name: str):
    """The tangent part of a user's `rule(primals, tangents) -> (out, tangent_out)`."""
    tangents = tuple(_zero_tangent(a) if t is None else t for t, a in zip(tangents, args))
    result = rule(tuple(args), tangents)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise GradtapeError(
            f"the jvp rule of {name} must return a pair (out, tangent_out), "
            f"got {type(result).__name__}."
        )
    return result[1]


class custom_jvp:
    """A function with a user-supplied forward-mode rule (a decorator, JAX's convention).

        @custom_jvp
        def f(x, y): ...

        @f.defjvp
        def f_jvp(primals, tangents):
            x, y = primals
            tx, ty = tangents
            return f(x, y), tangent_out

    Under differentiation gradtape records one instruction for f. Forward mode (jvp,
    jacfwd, hessian, hvp) calls the rule. Reverse mode (grad, vjp, jacrev) transposes it:
    the tangent the rule returns is linear in the tangents, so gradtape records the rule
    once with traced tangents and runs the reverse interpreter over that recording. So the
    rule, not f's body, gives the gradient too; it must be NumPy code linear in the
    tangents. An argument that is not differentiated gets a zero tangent. Elsewhere (plain
    calls, trace, compile) f is called. f returns a single array.

    Parameters
    ----------
    fun : callable
        The function; it returns a single array.

    Returns
    -------
    custom_jvp
        A callable with `defjvp(rule)` (usable as a decorator).

    Raises
    ------
    GradtapeError
        Differentiating before `defjvp` was called, or a rule whose tangent is not linear in
        the tangents.

    Examples
    --------
    >>> import numpy as np
    >>> import gradtape as gt
    >>> @gt.custom_jvp
    ... def f(x):
    ...     return np.exp(x)
    >>> @f.defjvp
    ... def f_jvp(primals, tangents):
    ...     y = np.exp(primals[0])
    ...     return y, y * tangents[0]
    >>> print(gt.grad(lambda x: np.sum(f(x)))(np.array([0.0])))
    [1.]
    """

    def __init__(self, fun: Callable):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.jvp_rule = None
        name = getattr(fun, "__name__", "custom")
        self._prim = Primitive(f"custom_jvp[{name}]", self._impl, jvp=self._jvp, user_rule=True)
        self._prim.vjp_all = self._vjp_all

    def defjvp(self, rule: Callable) -> Callable:
        """Give the rule `rule(primals, tangents) -> (out, tangent_out)`; returns the rule,
        so that `@f.defjvp` works as a decorator."""
        self.jvp_rule = rule
        return rule

    def __call__(self, *args):
        if self.jvp_rule is None:
            raise GradtapeError(
                f"custom_jvp function {self.fun.__name__} has no rule: call "
                f"{self.fun.__name__}.defjvp(rule) first."
            )
        top = _top_level(args)
        if top is not None and top.batch_size is not None and _differentiated_below(top):
            return _per_member(self, top, args)
        if top is None or top.kind is not LevelKind.DIFFERENTIATE:
            return self.fun(*args)
        return bind(self._prim, args, {})

    def _impl(self, *args):
        out = self(*args)  # one level down: recorded there too when that level differentiates
        if not (type(out) is trace.Tracer or isinstance(out, (np.ndarray, np.generic, float))):
            raise GradtapeError(
                f"custom_jvp function {self.fun.__name__} must return a single "
                f"array, got {type(out).__name__}."
            )
        return out

    def _jvp(self, tangents, ans, *args):
        return _rule_tangent(self.jvp_rule, args, tangents, self.fun.__name__)

    def _vjp_all(self, g, ans, args, params, invars):
        # the reverse interpreter transposes the (linear) tangent map of the rule
        def tangent_out(*ts):
            return [_rule_tangent(self.jvp_rule, args, ts, self.fun.__name__)]

        rule = linearize(
            tangent_out,
            [None if v is None else _zero_tangent(a) for a, v in zip(args, invars)],
            [v is not None for v in invars],
        )
        return tuple(rule.vjp([g]))
