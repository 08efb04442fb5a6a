"""scipy.stats.wishart and invwishart `logpdf`/`pdf` (frozen too) on traced values.

SciPy's densities write each matrix's log-determinant and trace into plain arrays, which
would cut the gradient. Here the private `_logpdf` both the distributions' methods and their
frozen versions call is written with NumPy on the stack of matrices (one batched Cholesky
factorization, one batched solve), so gradtape records it: gradients flow to the matrices,
the scale and the degrees of freedom. SciPy's own argument handling runs unchanged (shapes,
scalars and diagonal scales as SciPy reads them); a traced degrees of freedom is accepted as
the scalar it is. A matrix that is not positive definite raises NumPy's LinAlgError.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.routes import implements_module_function
from ._util import ndim_of

_LOG_2 = math.log(2.0)
_MODULE = "scipy.stats._multivariate"


def _multigammaln(a, dim: int):
    """log of the multivariate gamma function of dimension `dim` (scipy.special.multigammaln)."""
    import scipy.special

    terms = [scipy.special.gammaln(a - 0.5 * j) for j in range(dim)]
    return 0.25 * dim * (dim - 1) * math.log(math.pi) + sum(terms[1:], terms[0])


def _factors(x):
    """The Cholesky factors of the stacked matrices x (dim, dim, N) as (N, dim, dim), and
    their log-determinants (N,)."""
    factors = np.linalg.cholesky(np.moveaxis(x, -1, 0))
    log_det = 2.0 * np.sum(np.log(np.diagonal(factors, axis1=-2, axis2=-1)), axis=-1)
    return factors, log_det


@implements_module_function(_MODULE, "wishart_gen._logpdf")
def wishart_logpdf(self, x, dim, df, scale, log_det_scale, C):
    """wishart's log-density of the stacked matrices x (dim, dim, N)."""
    _, log_det_x = _factors(x)
    # tr(scale^-1 x) of every entry of x, as SciPy's cho_solve reads them (the log-determinant
    # reads the lower triangle, as SciPy's Cholesky factorization does)
    c_inv = np.linalg.solve(C, np.eye(dim))
    scale_inv = c_inv.T @ c_inv
    trace = np.sum(scale_inv[:, :, None] * np.swapaxes(x, 0, 1), axis=(0, 1))
    return (0.5 * (df - dim - 1) * log_det_x - 0.5 * trace) - (
        0.5 * df * dim * _LOG_2 + 0.5 * df * log_det_scale + _multigammaln(0.5 * df, dim)
    )


@implements_module_function(_MODULE, "invwishart_gen._logpdf")
def invwishart_logpdf(self, x, dim, df, log_det_scale, C):
    """invwishart's log-density of the stacked matrices x (dim, dim, N)."""
    factors, log_det_x = _factors(x)
    whitened = np.linalg.solve(factors, C)  # tr(scale x^-1) = |L_x^-1 C|_F^2
    trace = np.sum(whitened * whitened, axis=(-2, -1))
    return (0.5 * df * log_det_scale - 0.5 * trace) - (
        0.5 * df * dim * _LOG_2 + 0.5 * (df + dim + 1) * log_det_x + _multigammaln(0.5 * df, dim)
    )


@implements_module_function(_MODULE, "wishart_gen._process_parameters")
def wishart_parameters(self, df, scale):
    """SciPy's checks of (df, scale), taking a traced 0-d df as the scalar it is."""
    original = type(self)._process_parameters.__gradtape_original__
    if df is None or ndim_of(df) != 0:
        return original(self, df, scale)
    dim, _, scale = original(self, None, scale)
    if df <= dim - 1:
        raise ValueError(
            "Degrees of freedom must be greater than the dimension of scale matrix minus 1."
        )
    return dim, df, scale
