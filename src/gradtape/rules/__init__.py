"""The derivative rules: every primitive, declared once, and the NumPy names that reach it.

Importing this package declares them all (each module registers its primitives in
core.primitive.REGISTRY and its NumPy routes in core.routes).
"""

from . import (  # noqa: F401  (imported for their declarations)
    array_api,
    batching,
    conversion,
    elementwise,
    fft,
    indexing,
    linalg,
    polynomial,
    reductions,
    scalar_functions,
    scipy_linalg,
    scipy_misc,
    scipy_spatial,
    scipy_special,
    scipy_stats,
    sequences,
    shape,
    statistics,
    stop,
    ufunc_methods,
)

ufunc_methods.register_all()  # the methods of every ufunc declared above
batching.declare()  # the batching rules (vmap) of each category of primitive declared above
