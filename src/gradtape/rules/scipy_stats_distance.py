"""scipy.stats.wasserstein_distance and energy_distance of one-dimensional samples on traced
values (SciPy's `_cdf_distance`, which both call).

SciPy's version calls a plain array's `.searchsorted` method with the pooled values, which
would copy traced values out. This is the same computation with NumPy's functions: both
samples' empirical CDFs at the pooled sorted values, and the p-norm of their difference
weighted by the gaps between those values. Gradients flow to the values and the weights;
where two values coincide the distance has a kink (the derivative of one side is taken, as
for np.sort).
"""

from __future__ import annotations

import numpy as np

from ..core.routes import implements_module_function


def _cdf_at(values, weights, points):
    """The empirical CDF of `values` (with `weights`, or equal ones) at `points`."""
    sorter = np.argsort(values)
    indices = np.searchsorted(values[sorter], points, "right")
    if weights is None:
        return indices / values.size
    cumulative = np.concatenate((np.zeros(1), np.cumsum(weights[sorter])))
    return cumulative[indices] / cumulative[-1]


@implements_module_function("scipy.stats._stats_py", "_cdf_distance")
def cdf_distance(p, u_values, v_values, u_weights=None, v_weights=None):
    """The p-distance between the empirical CDFs of two samples (SciPy's _cdf_distance)."""
    from scipy.stats._stats_py import _validate_distribution

    u_values, u_weights = _validate_distribution(u_values, u_weights)
    v_values, v_weights = _validate_distribution(v_values, v_weights)
    pooled = np.sort(np.concatenate((u_values, v_values)), kind="mergesort")
    deltas = np.diff(pooled)
    difference = _cdf_at(u_values, u_weights, pooled[:-1]) - _cdf_at(
        v_values, v_weights, pooled[:-1]
    )
    if p == 1:
        return np.sum(np.abs(difference) * deltas)
    if p == 2:
        return np.sqrt(np.sum(np.square(difference) * deltas))
    return np.power(np.sum(np.power(np.abs(difference), p) * deltas), 1 / p)
