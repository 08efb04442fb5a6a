"""The Primitive type: one declaration per operation, and the registry of all of them.

A primitive is declared once with its NumPy implementation and its derivative
rules. Rules are written with NumPy operations, so applied to Tracers they are
recorded too: that is what makes higher-order derivatives and `compile(grad(f))`
work with no extra machinery.
"""

from __future__ import annotations

import dis
import types
from collections.abc import Callable

from . import tracing as trace

# name -> primitive: every primitive declared (what backends and the registry test walk)
REGISTRY: dict = {}

# names declared complex-correct before their primitive is (control flow declares its loops
# above the rules): the primitive takes the declaration when it is created
_COMPLEX_CORRECT_NAMES: set = set()


def declare_complex_correct(*names: str) -> None:
    """Declare that these primitives' rules are right (and tested) for complex values
    (Primitive.complex_correct), for primitives declared elsewhere or later."""
    for name in names:
        _COMPLEX_CORRECT_NAMES.add(name)
        prim = REGISTRY.get(name)
        if prim is not None:
            prim.complex_correct = True


class Primitive:
    """A named operation with its rules.

    impl:      the NumPy implementation, `impl(*args, **params)`.
    vjps:      one rule per positional argument, `vjp(g, ans, *args, **params)` -> cotangent of
               that argument (shape of the argument), or None where the derivative is zero.
    jvp:       `jvp(tangents, ans, *args, **params)` -> tangent of the output; tangents[i] is
               None for an argument with no tangent.
    nondiff:   the output has zero derivative (comparisons, floor, stop_gradient): it is not
               recorded by differentiating levels, only by staging levels (compile, trace).
    partials:  for elementwise primitives: `partials(ans, *args)` -> the local derivative of
               each argument; vjps and jvp are derived from it (and the native backend inlines it).
    transparent: recorded as one instruction by staging levels, but differentiated by tracing
               through `impl` (for loops whose backward pass is itself a loop primitive).
    python_impl: for loops, `impl` without the native driver eager calls may use (what the
               numpy backend calls: its code runs NumPy only).
    jvp_batched: the jvp rule also accepts tangents with extra leading (batch) axes, the same
               on every tangent, and returns the output tangent with them: the forward
               interpreter then pushes a whole batch of directions at once (jacfwd, hessian).
               Without it, a batch is pushed through this primitive one direction at a time.

    Facts the compiler and the backends need, declared here rather than kept as name lists:

    native:    for elementwise primitives, the scalar expression the native backend fuses into
               its loops (see compile/numba/scalar.py for the forms it accepts); None: not fused.
    shape_from_data: the output's shape depends on the input's values (nonzero): a replay
               checks it. For a primitive whose later results only (hidden from the user) have
               such shapes: a function `params -> slice` selecting them (a while loop's stored
               carries); a replay checks those some instruction reads (see reads_trip_count).
    constant_valued: the output's value depends only on the input's shape and dtype
               (full_like): a replay folds it to a constant.
    identity:  the output is the (only) input, unchanged (stop_gradient): a replay forwards it.
    reads_trip_count: the primitive reads a loop's trip count from its inputs' shapes (the
               backward loop of scan): the compiler keeps a shape check on what else reads them.
    user_rule: the derivative rule is user code (custom_vjp/custom_jvp).
    aliases_input: the output is a view of the first argument in NumPy (x.T, reshape): a write
               into that argument is seen by the output, and a write into the output raises.
    batch:     the batching rule (for vmap): `batch(prim, args, batched, **params)` -> the
               output, where batched[i] says whether args[i] carries the batch as its first
               axis, and the output carries it first (rules/batching.py declares them per
               category); None: run once per member of the batch (tracing.loop_batch).
    complex_correct: the rules are right (and tested) for complex values (JAX's convention,
               rules/_complex.py). The interpreters refuse to differentiate an instruction with
               complex values whose primitive does not declare it, and `bind` refuses a
               nondifferentiable one with a complex result at a differentiating level (np.sign
               of complex z has a derivative; dropping it would be a silent zero). Declared
               here or with `declare_complex_correct(name, ...)`; custom rules are the user's.
    """

    __slots__ = (
        "name",
        "impl",
        "vjps",
        "jvp",
        "nondiff",
        "multiple_results",
        "partials",
        "linear",
        "safe",
        "variadic",
        "vjp_all",
        "transparent",
        "jvp_batched",
        "python_impl",
        "native",
        "shape_from_data",
        "constant_valued",
        "identity",
        "reads_trip_count",
        "user_rule",
        "batch",
        "aliases_input",
        "complex_correct",
        "plain_differentiable",
        "_vjp_reads",
    )

    def __init__(
        self,
        name: str,
        impl: Callable,
        vjps=None,
        jvp=None,
        nondiff: bool = False,
        multiple_results: bool = False,
        partials=None,
        linear: bool = False,
        safe: bool = False,
        variadic: bool = False,
        transparent: bool = False,
        jvp_batched: bool = False,
        native=None,
        shape_from_data: bool = False,
        constant_valued: bool = False,
        identity: bool = False,
        reads_trip_count: bool = False,
        user_rule: bool = False,
        batch=None,
        aliases_input: bool = False,
        complex_correct: bool = False,
    ):
        self.name = name
        self.impl = impl
        self.vjps = vjps
        self.jvp = jvp
        self.nondiff = nondiff
        self.multiple_results = multiple_results
        self.partials = partials
        self.linear = linear
        self.safe = safe
        self.variadic = variadic
        self.vjp_all = None  # optional: one call for all arguments (custom rules)
        # differentiating levels trace through `impl` instead of recording one instruction
        self.transparent = transparent
        self.jvp_batched = jvp_batched
        self.python_impl = None
        self.native = native
        self.shape_from_data = shape_from_data
        self.constant_valued = constant_valued
        self.identity = identity
        self.reads_trip_count = reads_trip_count
        self.user_rule = user_rule
        self.batch = batch
        self.aliases_input = aliases_input
        self.complex_correct = complex_correct or user_rule or name in _COMPLEX_CORRECT_NAMES
        self._vjp_reads: dict = {}  # number of arguments -> what the VJP rules read
        # one result with a derivative, recorded as one instruction: `bind`'s short path at
        # a differentiating level (nondiff, transparent and multiple_results are set here only)
        self.plain_differentiable = not (nondiff or transparent or multiple_results)
        if user_rule:  # one per custom_vjp/custom_jvp function: not part of the library
            return
        if name in REGISTRY:
            raise ValueError(f"a primitive named {name!r} is declared twice")
        REGISTRY[name] = self

    def __call__(self, *args, **params):
        return trace.bind(self, args, params)

    def vjp_rule(self, i: int):
        """The VJP rule of argument i (variadic primitives share one rule, called with i)."""
        if self.variadic:
            rule = self.vjps
            return None if rule is None else (lambda g, ans, *a, **p: rule(i, g, ans, *a, **p))
        return self.vjps[i] if self.vjps is not None and i < len(self.vjps) else None

    def vjp_reads(self, nargs: int) -> tuple | None:
        """What each VJP rule reads of a recorded application with `nargs` arguments, beyond
        shapes and dtypes: one `(reads_ans, reads_arg_0, ...)` per argument, or None when that
        cannot be told (the reverse interpreter then keeps every value).

        Found from the rules' code: a rule reads a value when its code names the parameter
        other than for its `.shape`, `.dtype`, `.ndim` or `.size` (a name used by a nested
        function counts as read); an elementwise rule derived from `partials` reads what its
        partial names, and a constant partial reads nothing. A rule taking `*args` that it
        uses, or one that is not a plain function, reads everything.
        """
        found = self._vjp_reads.get(nargs, False)
        if found is False:
            found = self._vjp_reads[nargs] = _rules_read(self, nargs)
        return found

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"


_READS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "DELETE_FAST", "STORE_FAST"})
_METADATA = frozenset({"shape", "dtype", "ndim", "size"})  # what a released value keeps
_names_read: dict = {}


def _code_names_read(code: types.CodeType) -> frozenset:
    """The local names a code object reads other than for their shape or dtype (parameters
    read, or captured by inner code)."""
    names = _names_read.get(code)
    if names is None:
        found = set(code.co_cellvars)
        listing = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
        for k, ins in enumerate(listing):
            if ins.opname not in _READS:
                continue
            after = listing[k + 1] if k + 1 < len(listing) else None
            if (
                ins.opname == "LOAD_FAST"
                and after is not None
                and after.opname == "LOAD_ATTR"
                and after.argval in _METADATA
            ):
                continue  # x.shape: kept by a released value
            found.add(ins.argval)
        names = _names_read[code] = frozenset(found)
    return names


def _function_reads(fn, nargs: int, skip: int) -> tuple | None:
    """Which of the positional values after the first `skip` parameters `fn` reads: a tuple of
    nargs + (1 if ans) booleans, or None (unknown)."""
    if type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    names = _code_names_read(code)
    positional = code.co_varnames[: code.co_argcount]
    reads = [name in names for name in positional[skip:]]
    if len(reads) < nargs + 1:
        if not code.co_flags & _CO_VARARGS:
            return None  # (a rule for fewer arguments: not this call's)
        star = code.co_varnames[code.co_argcount + code.co_kwonlyargcount]
        reads += [star in names] * (nargs + 1 - len(reads))
    return tuple(reads[: nargs + 1])


_CO_VARARGS = 0x04


def _rule_reads(rule, nargs: int) -> tuple | None:
    """(ans, arg 0, ...) read by one VJP rule `rule(g, ans, *args, **params)`."""
    if rule is None:
        return (False,) * (nargs + 1)
    if type(rule) is not types.FunctionType:
        return None
    partial = getattr(rule, "elementwise_partial", _NOT_DERIVED)
    if partial is not _NOT_DERIVED:
        # a rule derived from an elementwise partial (rules/elementwise.py): `g * partial(ans,
        # *args)`, summed back to the argument's shape (a shape the released value keeps)
        if partial is None or isinstance(partial, (int, float)):
            return (False,) * (nargs + 1)
        return _function_reads(partial, nargs, 0)
    return _function_reads(rule, nargs, 1)


_NOT_DERIVED = object()


def _rules_read(prim: Primitive, nargs: int) -> tuple | None:
    if prim.vjp_all is not None or prim.multiple_results or prim.user_rule:
        return None
    if type(prim.vjps) is not tuple or len(prim.vjps) < nargs:
        return None
    rules = []
    for i in range(nargs):
        got = _rule_reads(prim.vjps[i], nargs)
        if got is None:
            return None
        rules.append(got)
    return tuple(rules)
