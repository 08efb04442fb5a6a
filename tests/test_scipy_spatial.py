"""scipy.spatial.distance cdist, pdist and squareform on traced values: SciPy's values, central
differences, forward against reverse mode and the compiled gradient (tests/breadth.py's
check_rule) for every metric gradtape writes, over generated shapes; the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from breadth import check_rule
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt

distance = pytest.importorskip("scipy.spatial.distance")

RNG = np.random.default_rng(0)
W = np.array([1.0, 0.5, 2.0])
METRICS = {
    "euclidean": {},
    "sqeuclidean": {},
    "cityblock": {},
    "chebyshev": {},
    "minkowski p=3": {"p": 3},
    "minkowski p=1.5, w": {"p": 1.5, "w": W},
    "seuclidean V": {"V": np.array([0.5, 2.0, 1.5])},
    "seuclidean": {},
    "mahalanobis VI": {"VI": np.linalg.inv(np.cov(RNG.normal(size=(3, 20))))},
    "mahalanobis": {},
    "cosine": {},
    "correlation": {},
    "braycurtis": {},
    "canberra": {},
    "euclidean w": {"w": W},
    "cb": {},  # SciPy's alias of cityblock
}


def _metric(name):
    return name.split()[0]


@pytest.mark.parametrize("name", sorted(METRICS))
def test_cdist(name):
    kwargs = METRICS[name]
    XA, XB = RNG.normal(size=(4, 3)), RNG.normal(size=(6, 3))
    check_rule(lambda a, b: distance.cdist(a, b, _metric(name), **kwargs), XA, XB, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(METRICS))
def test_pdist(name):
    kwargs = METRICS[name]
    X = RNG.normal(size=(7, 3))
    check_rule(lambda x: distance.pdist(x, _metric(name), **kwargs), X, rtol=1e-5)


def test_a_python_metric_is_called_on_each_pair():
    def metric(u, v):
        return np.sum((u - v) ** 4) ** 0.25

    XA, XB = RNG.normal(size=(3, 2)), RNG.normal(size=(2, 2))
    check_rule(lambda a, b: distance.cdist(a, b, metric), XA, XB)
    check_rule(lambda a: distance.pdist(a, metric), XA)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 5), n=st.integers(1, 4), d=st.integers(1, 4), seed=st.integers(0, 99))
def test_shapes(m, n, d, seed):
    rng = np.random.default_rng(seed)
    XA, XB = rng.normal(size=(m, d)), rng.normal(size=(n, d))
    check_rule(lambda a, b: distance.cdist(a, b, "sqeuclidean"), XA, XB, compiled=False)
    check_rule(lambda a: distance.squareform(distance.pdist(a)), XA, compiled=False)


def test_squareform_both_ways():
    X = RNG.normal(size=(5, 2))
    condensed = distance.pdist(X)
    check_rule(lambda v: distance.squareform(v), condensed)
    # (checks=False: the central differences perturb the diagonal, which SciPy's checks refuse)
    check_rule(lambda m: distance.squareform(m, checks=False), distance.squareform(condensed))
    check_rule(lambda v: distance.squareform(v, force="tomatrix"), condensed)
    with pytest.raises(ValueError, match="binomial"):
        gt.grad(lambda v: np.sum(distance.squareform(v)))(np.ones(4))


def test_refusals_name_the_metric_and_out():
    X = RNG.normal(size=(3, 2))
    with pytest.raises(gt.GradtapeError, match="metric='jensenshannon'"):
        gt.grad(lambda x: np.sum(distance.pdist(x, "jensenshannon")))(X)
    with pytest.raises(gt.GradtapeError, match="out="):
        gt.grad(lambda x: np.sum(distance.cdist(x, x, out=np.empty((3, 3)))))(X)
    with pytest.raises(gt.GradtapeError, match="complex"):
        gt.grad(lambda x: np.sum(distance.cdist(x + 0j, x).real))(X)
    with pytest.raises(ValueError, match="same number of columns"):
        gt.grad(lambda x: np.sum(distance.cdist(x, x[:, :1])))(X)


def test_a_gaussian_process_kernel_written_with_cdist():
    X = RNG.normal(size=(6, 2))
    y = np.sin(X[:, 0])

    def neg_log_marginal(log_scale):
        K = np.exp(-0.5 * distance.cdist(X, X, "sqeuclidean") / np.exp(2 * log_scale))
        K = K + 1e-2 * np.eye(6)
        L = np.linalg.cholesky(K)
        alpha = np.linalg.solve(K, y)
        return 0.5 * y @ alpha + np.sum(np.log(np.diag(L)))

    check_rule(neg_log_marginal, np.array(0.3))
