"""gradtape: exact derivatives of plain NumPy code, recorded on a tape."""

from . import process, rules  # noqa: F401  (rules: declares every primitive)
from .check import GradCheck, check_grad
from .compile import CompileWarning, compile
from .compile.numba.backend import get_num_threads, set_num_threads, wait_for_native
from .compile.numba.cache import clear as clear_cache
from .control.custom import custom_jvp, custom_vjp
from .control.loops import fori_loop, scan, while_loop
from .core.errors import GradtapeError
from .core.ir import Tape
from .rules.stop import stop_gradient
from .transforms.forward import jacfwd, jvp
from .transforms.higher import hessian, hvp, jacobian, jacrev
from .transforms.reverse import grad, value_and_grad, vjp
from .transforms.staging import trace_fn as trace

__all__ = [
    "CompileWarning",
    "GradCheck",
    "GradtapeError",
    "Tape",
    "check_grad",
    "compile",
    "custom_vjp",
    "fori_loop",
    "grad",
    "scan",
    "stop_gradient",
    "trace",
    "value_and_grad",
    "vjp",
    "while_loop",
    "custom_jvp",
    "hessian",
    "hvp",
    "jacfwd",
    "jacobian",
    "jacrev",
    "jvp",
    "get_num_threads",
    "set_num_threads",
    "wait_for_native",
    "clear_cache",
]
__version__ = "0.1.0"

process.install()
