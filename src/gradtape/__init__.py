"""gradtape: exact derivatives of plain NumPy code, recorded on a tape."""

from . import tracer as _tracer  # noqa: F401  (installs the Tracer and the NumPy rules)
from .check import GradCheck, check_grad
from .compile import CompileWarning, compile
from .compile.numba.backend import get_num_threads, set_num_threads
from .compile.numba.cache import clear as clear_cache
from .core.errors import GradtapeError
from .core.ir import Tape
from .rules.control import custom_jvp, custom_vjp, stop_gradient
from .rules.loops import fori_loop, scan, while_loop
from .transforms.forward import jacfwd, jvp
from .transforms.higher import hessian, hvp, jacobian, jacrev
from .transforms.reverse import grad, value_and_grad, vjp
from .transforms.staging import trace_fn as trace

__all__ = [
    "CompileWarning", "GradCheck", "GradtapeError", "Tape", "check_grad", "compile", "custom_vjp",
    "fori_loop", "grad", "scan", "stop_gradient", "trace", "value_and_grad", "vjp", "while_loop",
    "custom_jvp", "hessian", "hvp", "jacfwd", "jacobian", "jacrev", "jvp", "get_num_threads",
    "set_num_threads", "clear_cache",
]
__version__ = "0.1.0"
