"""The derivative rules: every primitive, declared once, and the NumPy names that reach it.

Importing this package declares them all (each module registers its primitives in
core.primitive.REGISTRY and its NumPy routes in core.routes).
"""

from . import (  # noqa: F401  (imported for their declarations)
    array_api,
    batching,
    batching_linalg,
    batching_search,
    conversion,
    elementwise,
    fft,
    indexing,
    linalg,
    polynomial,
    reductions,
    scalar_functions,
    scipy_kde,
    scipy_linalg,
    scipy_misc,
    scipy_ndimage,
    scipy_spatial,
    scipy_special,
    scipy_stats,
    scipy_wishart,
    sequences,
    shape,
    statistics,
    stop,
    ufunc_methods,
)

ufunc_methods.register_all()  # the methods of every ufunc declared above
batching.declare()  # the batching rules (vmap) of each category of primitive declared above
batching_search.declare()  # ... of predicates, sorts, searches, counts, traced-integer indexing
batching_linalg.declare()  # ... of SciPy's linear algebra, FFT, convolutions, padding
