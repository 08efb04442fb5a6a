"""scipy.stats.gaussian_kde's `evaluate` (`__call__`, `pdf`) and `logpdf` on traced values.

SciPy sums the kernels in compiled code on plain arrays, which would cut the gradient. Here
the estimate is written with NumPy: the data and the points are whitened by the kernel's
Cholesky factor (`cho_cov`), and the log-density is a weighted logsumexp of the Gaussian
kernels' exponents, so gradtape records it. Gradients flow to the points and, when the KDE
was built from traced data (or traced weights), to the data too. The values are SciPy's to
rounding (the sums run in another order). The n x m x d array of differences is formed by
broadcasting, so memory grows with n m d, as in a NumPy version a user would write.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import GradtapeError
from ..core.routes import implements_module_function
from ._util import dtype_of, shape_of


def _points(kde, x):
    """The points as a (d, m) array, as SciPy reads them (a row vector of d values is one)."""
    points = np.atleast_2d(np.asarray(x))
    d, m = shape_of(points)
    if d != kde.d:
        if d == 1 and m == kde.d:
            return np.reshape(points, (kde.d, 1))
        raise ValueError(f"points have dimension {d}, dataset has dimension {kde.d}")
    return points


def _log_density(kde, x):
    import scipy.linalg
    import scipy.special

    points = _points(kde, x)
    for name, value in (("points", points), ("dataset", kde.dataset)):
        if dtype_of(value).kind == "c":
            raise GradtapeError(
                f"scipy.stats.gaussian_kde: complex {name} are not supported (SciPy's kernel "
                "sums are real); pass real values"
            )
    chol = kde.cho_cov
    data = scipy.linalg.solve_triangular(chol, kde.dataset, lower=True)  # (d, n)
    pts = scipy.linalg.solve_triangular(chol, points, lower=True)  # (d, m)
    diff = data[:, :, None] - pts[:, None, :]  # (d, n, m)
    exponent = -0.5 * np.sum(diff * diff, axis=0)  # (n, m)
    log_norm = -0.5 * kde.d * math.log(2 * math.pi) - np.sum(np.log(np.diagonal(chol)))
    log_weights = np.log(kde.weights)
    return scipy.special.logsumexp(exponent + log_weights[:, None], axis=0) + log_norm


@implements_module_function("scipy.stats._kde", "gaussian_kde.logpdf")
def gaussian_kde_logpdf(self, x):
    """gaussian_kde.logpdf on traced points or a KDE of traced data."""
    return _log_density(self, x)


@implements_module_function(
    "scipy.stats._kde", "gaussian_kde.evaluate", "gaussian_kde.__call__", "gaussian_kde.pdf"
)
def gaussian_kde_evaluate(self, points):
    """gaussian_kde.evaluate (its `__call__` and `pdf`) on traced points or data."""
    return np.exp(_log_density(self, points))
