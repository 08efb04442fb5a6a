"""scipy.spatial.distance `cdist`, `pdist` and `squareform` on traced values.

SciPy computes distances in compiled code on plain arrays, which would cut the gradient. Here
each metric is written with NumPy on the pairwise differences, so gradtape records it: the
values are SciPy's (to rounding: the sums run in another order) and the derivatives follow.
The pairs are formed by broadcasting (cdist: an m x n x d array of differences), so memory
grows with m n d as in a NumPy version a user would write. A metric outside the list below
(or SciPy's out=) raises an error naming it. At coincident points the Euclidean distance has
a kink: its derivative there is NaN, as for np.linalg.norm of a zero vector in JAX.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import GradtapeError
from ..core.routes import implements_module_function
from ._util import dtype_of, ndim_of, shape_of


def _weighted(terms, w):
    return terms if w is None else terms * w


def _minkowski(u, v, p=2.0, w=None):
    diff = np.abs(u - v)
    if p == 1:
        return np.sum(_weighted(diff, w), axis=-1)
    if p == 2:
        return np.sqrt(np.sum(_weighted(diff * diff, w), axis=-1))
    if np.isinf(p):
        return np.max(diff, axis=-1)
    return np.sum(_weighted(diff**p, w), axis=-1) ** (1.0 / p)


def _sqeuclidean(u, v, w=None):
    diff = u - v
    return np.sum(_weighted(diff * diff, w), axis=-1)


def _euclidean(u, v, w=None):
    return np.sqrt(_sqeuclidean(u, v, w))


def _cityblock(u, v, w=None):
    return np.sum(_weighted(np.abs(u - v), w), axis=-1)


def _chebyshev(u, v, w=None):
    if w is not None:
        return np.max(np.where(np.asarray(w) > 0, np.abs(u - v), 0.0), axis=-1)
    return np.max(np.abs(u - v), axis=-1)


def _seuclidean(u, v, V=None):
    diff = u - v
    return np.sqrt(np.sum(diff * diff / V, axis=-1))


def _mahalanobis(u, v, VI=None):
    diff = u - v
    return np.sqrt(np.sum((diff @ np.swapaxes(VI, -1, -2)) * diff, axis=-1))


def _cosine(u, v, w=None):
    uv = np.sum(_weighted(u * v, w), axis=-1)
    uu = np.sum(_weighted(u * u, w), axis=-1)
    vv = np.sum(_weighted(v * v, w), axis=-1)
    return 1.0 - uv / np.sqrt(uu * vv)


def _correlation(u, v, w=None, centered=True):
    if centered:
        if w is None:
            u = u - np.mean(u, axis=-1, keepdims=True)
            v = v - np.mean(v, axis=-1, keepdims=True)
        else:
            u = u - np.sum(u * w, axis=-1, keepdims=True) / np.sum(w)
            v = v - np.sum(v * w, axis=-1, keepdims=True) / np.sum(w)
    return _cosine(u, v, w)


def _braycurtis(u, v, w=None):
    return np.sum(_weighted(np.abs(u - v), w), axis=-1) / np.sum(
        _weighted(np.abs(u + v), w), axis=-1
    )


def _canberra(u, v, w=None):
    denominator = np.abs(u) + np.abs(v)
    terms = np.where(denominator > 0, np.abs(u - v) / np.where(denominator > 0, denominator, 1), 0)
    return np.sum(_weighted(terms, w), axis=-1)


METRICS = {
    "euclidean": _euclidean,
    "sqeuclidean": _sqeuclidean,
    "cityblock": _cityblock,
    "chebyshev": _chebyshev,
    "minkowski": _minkowski,
    "seuclidean": _seuclidean,
    "mahalanobis": _mahalanobis,
    "cosine": _cosine,
    "correlation": _correlation,
    "braycurtis": _braycurtis,
    "canberra": _canberra,
}
# SciPy's other spellings of the metrics' names
_ALIASES = {
    alias: name
    for name, aliases in {
        "cityblock": "cblock cb c",
        "euclidean": "euclid eu e",
        "sqeuclidean": "sqe sqeuclid",
        "chebyshev": "cheby cheb ch chebychev",
        "minkowski": "mi m pnorm",
        "seuclidean": "se s",
        "mahalanobis": "mahal mah",
        "cosine": "cos",
        "correlation": "co",
    }.items()
    for alias in aliases.split()
}


def _metric(name, where: str):
    if callable(name):
        return name
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key not in METRICS:
        raise GradtapeError(
            f"scipy.spatial.distance.{where} with metric={name!r} has no gradtape rule (rules: "
            f"{', '.join(sorted(METRICS))}, or a Python function of two vectors). Pass such a "
            "function as the metric, or write the distance with NumPy."
        )
    return METRICS[key]


def _matrix(x, where: str, name: str):
    if ndim_of(x) != 2:
        raise ValueError(f"{where}: {name} must be a 2-dimensional array.")
    if dtype_of(x).kind == "c":  # (SciPy refuses complex too)
        raise GradtapeError(f"scipy.spatial.distance.{where} of complex values cannot be traced.")
    return x


def _data_defaults(fn, data, kwargs):
    """SciPy's defaults that come from the data: seuclidean's V (the variances of the rows
    together) and mahalanobis' VI (the inverse of their covariance)."""
    if fn is _seuclidean and kwargs.get("V") is None:
        kwargs = {**kwargs, "V": np.var(data, axis=0, ddof=1)}
    if fn is _mahalanobis and kwargs.get("VI") is None:
        kwargs = {**kwargs, "VI": np.linalg.inv(np.cov(data.T))}
    return kwargs


def _pairs(fn, u, v, kwargs):
    """The metric over broadcast pairs; a Python metric is called on each pair of rows."""
    if fn in METRICS.values():
        return fn(u, v, **kwargs)
    rows = [[fn(a, b, **kwargs) for b in v[0]] for a in u[:, 0]]
    return np.stack([np.stack(row) for row in rows])


def cdist(XA, XB, metric="euclidean", *, out=None, **kwargs):
    """scipy.spatial.distance.cdist on traced values: the m x n distances between the rows of
    XA and XB (see the module docstring for the metrics)."""
    if out is not None:
        raise GradtapeError(
            "scipy.spatial.distance.cdist(..., out=) cannot be traced: use the result."
        )
    XA, XB = _matrix(XA, "cdist", "XA"), _matrix(XB, "cdist", "XB")
    if shape_of(XA)[1] != shape_of(XB)[1]:
        raise ValueError("XA and XB must have the same number of columns (i.e. feature dimension.)")
    fn = _metric(metric, "cdist")
    kwargs = _data_defaults(fn, np.concatenate([XA, XB]), kwargs)
    return _pairs(fn, XA[:, None, :], XB[None, :, :], kwargs)


def pdist(X, metric="euclidean", *, out=None, **kwargs):
    """scipy.spatial.distance.pdist on traced values: the condensed distances between the rows
    of X, pairs (i, j) with i < j in row order."""
    if out is not None:
        raise GradtapeError(
            "scipy.spatial.distance.pdist(..., out=) cannot be traced: use the result."
        )
    X = _matrix(X, "pdist", "X")
    fn = _metric(metric, "pdist")
    kwargs = _data_defaults(fn, X, kwargs)
    i, j = np.triu_indices(shape_of(X)[0], 1)
    if fn in METRICS.values():
        return fn(X[i], X[j], **kwargs)
    return np.stack([fn(X[a], X[b], **kwargs) for a, b in zip(i, j)]) if len(i) else X[:0, 0]


def squareform(X, force="no", checks=True):
    """scipy.spatial.distance.squareform on traced values: condensed distances to the square
    matrix (by indexing, so the derivative follows) or the square matrix to its condensed
    upper triangle. `checks` are SciPy's on the shape; the values are not inspected."""
    shape = shape_of(X)
    to_square = force.lower() == "tomatrix" or (force.lower() != "tovector" and len(shape) == 1)
    if to_square:
        if len(shape) != 1:
            raise ValueError("Forcing 'tomatrix' but input X is not a distance vector.")
        n = int(np.ceil(np.sqrt(shape[0] * 2)))
        if n * (n - 1) != shape[0] * 2:
            raise ValueError(
                "Incompatible vector size. It must be a binomial coefficient n choose 2 for some "
                "integer n >= 2."
            )
        # each entry of the matrix gathers its pair's distance; the diagonal gathers a zero
        position = np.full((n, n), shape[0])
        i, j = np.triu_indices(n, 1)
        position[i, j] = position[j, i] = np.arange(shape[0])
        return np.concatenate([X, np.zeros(1, dtype=X.dtype)])[position]
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError("The matrix argument must be square.")
    return X[np.triu_indices(shape[0], 1)]


for _name, _traced in (("cdist", cdist), ("pdist", pdist), ("squareform", squareform)):
    implements_module_function("scipy.spatial.distance", _name)(_traced)
