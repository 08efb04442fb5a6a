"""The derivative rules: every primitive, declared once, and the NumPy names that reach it.

Importing this package declares them all (each module registers its primitives in
core.primitive.REGISTRY and its NumPy routes in core.routes).
"""

from . import (  # noqa: F401  (imported for their declarations)
    control,
    elementwise,
    fft,
    indexing,
    linalg,
    reductions,
    scipy_special,
    shape,
)
