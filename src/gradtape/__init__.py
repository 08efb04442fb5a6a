"""gradtape: exact derivatives of plain NumPy code, recorded on a tape.

Transforms (`grad`, `value_and_grad`, `vjp`, `jvp`, `jacobian`, `jacfwd`, `jacrev`, `hessian`,
`hvp`) apply to unmodified `import numpy as np` code; `compile` records a function once per
signature and replays generated NumPy code or fused native loops (the numba backend, with
`pip install "gradtape[numba]"`), guarded so that a compiled result is never silently wrong.

Examples
--------
>>> import numpy as np
>>> import gradtape as gt
>>> print(gt.grad(lambda x: np.sum(x**2))(np.array([1.0, 2.0])))
[2. 4.]
"""

from . import process, rules, tree_util  # noqa: F401  (rules: declares every primitive)
from .check import GradCheck, check_grad
from .compile import CompiledFunction, CompileWarning, NativeFallbackWarning, compile
from .compile.numba.backend import get_num_threads, set_num_threads, wait_for_native
from .compile.numba.cache import clear as clear_cache
from .control.custom import custom_jvp, custom_vjp
from .control.loops import fori_loop, scan, while_loop
from .core.errors import GradtapeError, GuardFailure, NotExportableError, TracedAttributeError
from .core.ir import Tape
from .rules.stop import stop_gradient
from .transforms.forward import jacfwd, jvp
from .transforms.higher import hessian, hvp, jacobian, jacrev
from .transforms.reverse import grad, value_and_grad, vjp
from .transforms.staging import trace_fn as trace
from .transforms.toolbox import checkpoint, elementwise_grad, linearize, remat
from .transforms.vmap import vmap

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = [
    # transforms
    "grad",
    "value_and_grad",
    "vjp",
    "jvp",
    "jacobian",
    "jacfwd",
    "jacrev",
    "hessian",
    "hvp",
    # compiling
    "compile",
    "CompiledFunction",
    "get_num_threads",
    "set_num_threads",
    "wait_for_native",
    "clear_cache",
    # loops and custom rules
    "scan",
    "fori_loop",
    "while_loop",
    "custom_vjp",
    "custom_jvp",
    "stop_gradient",
    # looking and checking
    "trace",
    "Tape",
    "check_grad",
    "GradCheck",
    # errors and warnings
    "GradtapeError",
    "NotExportableError",
    "TracedAttributeError",
    "GuardFailure",
    "CompileWarning",
    "NativeFallbackWarning",
    # batching and the transform toolbox
    "vmap",
    "linearize",
    "checkpoint",
    "remat",
    "elementwise_grad",
]

process.install()
