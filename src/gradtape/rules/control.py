"""stop_gradient and user-defined rules (custom_vjp)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from .. import trace
from .._pytree import tree_flatten, tree_unflatten
from ..primitives import Primitive
from ..tape import Instruction
from ..trace import GradtapeError, bind


def _stop_impl(x):
    # bind again one level down, until the value is concrete: the gradient stops at every level
    return bind(stop_gradient_p, (x,), {}) if type(x) is trace.Tracer else x


stop_gradient_p = Primitive("stop_gradient", _stop_impl, nondiff=True)


def stop_gradient(x):
    """`x` as a constant: no derivative flows through it (a pytree of arrays is accepted)."""
    leaves, td = tree_flatten(x)
    return tree_unflatten(td, [bind(stop_gradient_p, (v,), {}) for v in leaves])


class custom_vjp:
    """A function with a user-supplied reverse-mode rule.

        @custom_vjp
        def f(x, y): ...
        def f_fwd(x, y): return f(x, y), residuals
        def f_bwd(residuals, g): return (g_x, g_y)
        f.defvjp(f_fwd, f_bwd)

    Under `grad`/`vjp` gradtape calls `fwd` and records one instruction whose VJP is
    `bwd`; elsewhere (plain calls, `trace`, `compile` without differentiation) it calls `f`.
    """

    def __init__(self, fun: Callable):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.fwd = None
        self.bwd = None
        self.jvp_rule = None
        name = getattr(fun, "__name__", "custom")
        self._prim = Primitive(f"custom_vjp[{name}]", self._impl)
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
            raise GradtapeError(f"custom_vjp function {self.fun.__name__} has no rule: call "
                                ".defvjp(fwd, bwd) first.")
        top = None
        for a in args:
            if type(a) is trace.Tracer and (top is None or a._level.id > top.id):
                top = a._level
        if top is None or top.kind != "reverse":
            return self.fun(*args)
        vals = tuple(a._value if type(a) is trace.Tracer and a._level is top else a for a in args)
        out, res = self.fwd(*vals)
        out_leaves, out_td = tree_flatten(out)
        if len(out_leaves) != 1:
            raise GradtapeError("custom_vjp functions must return a single array.")
        out = out_leaves[0]
        invars = tuple(a._var if type(a) is trace.Tracer and a._level is top else None
                       for a in args)
        var = top.new_var(out)
        top.tape.instructions.append(
            Instruction(self._prim, invars, vals, {"res": res}, (var,), out))
        return trace.Tracer(out, var, top)
