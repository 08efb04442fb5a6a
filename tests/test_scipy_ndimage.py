"""scipy.ndimage's separable filters (correlate1d, convolve1d, uniform_filter1d, uniform_filter,
gaussian_filter, and SciPy's own gaussian_filter1d and scipy.signal.savgol_filter through them)
on traced values: SciPy's values in every boundary mode and origin, central differences in the
input and the weights, forward against reverse mode, compiled; the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from breadth import check_rule
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtape as gt

ndimage = pytest.importorskip("scipy.ndimage")
signal = pytest.importorskip("scipy.signal")

RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, 9))
MODES = ["reflect", "mirror", "nearest", "wrap", "constant", "grid-wrap", "grid-mirror"]


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    size=st.integers(1, 5),
    data=st.data(),
    convolve=st.booleans(),
    axis=st.sampled_from([0, 1, -1]),
)
def test_every_mode_origin_and_size(mode, size, data, convolve, axis):
    origin = data.draw(st.integers(-(size // 2), (size - 1) // 2))
    if convolve and not size & 1:  # (convolve1d shifts the origin of an even kernel)
        origin = data.draw(st.integers(-((size - 1) // 2), size // 2 - 1)) if size > 1 else 0
    weights = np.cos(np.arange(size) + 1.0)
    fn = ndimage.convolve1d if convolve else ndimage.correlate1d

    def f(x, w):
        return fn(x, w, axis=axis, mode=mode, cval=0.7, origin=origin)

    check_rule(f, X, weights, compiled=False)


@pytest.mark.parametrize(
    "name, f",
    [
        ("gaussian_filter1d", lambda x: ndimage.gaussian_filter1d(x, 1.5, axis=1)),
        ("gaussian_filter1d order 2", lambda x: ndimage.gaussian_filter1d(x, 1.2, order=2)),
        ("gaussian_filter", lambda x: ndimage.gaussian_filter(x, 1.2)),
        (
            "gaussian_filter per axis",
            lambda x: ndimage.gaussian_filter(x, [0.8, 1.5], mode=["nearest", "wrap"]),
        ),
        ("gaussian_filter axes", lambda x: ndimage.gaussian_filter(x, 1.1, axes=(1,), order=1)),
        ("uniform_filter1d", lambda x: ndimage.uniform_filter1d(x, 3, axis=0, mode="nearest")),
        ("uniform_filter", lambda x: ndimage.uniform_filter(x, (2, 3), origin=(0, 1))),
        ("savgol_filter", lambda x: signal.savgol_filter(x, 5, 2, axis=1)),
        ("savgol_filter deriv", lambda x: signal.savgol_filter(x, 5, 3, deriv=1, mode="nearest")),
    ],
)
def test_filters_built_on_them(name, f):
    check_rule(f, X)


def test_refusals():
    with pytest.raises(gt.GradtapeError, match="output=array"):
        gt.grad(lambda x: np.sum(ndimage.correlate1d(x, [1.0, 2.0], output=np.empty(3))))(
            np.ones(3)
        )
    with pytest.raises(gt.GradtapeError, match="complex"):
        gt.grad(lambda x: np.sum(ndimage.correlate1d(x + 0j, [1.0, 2.0]).real))(np.ones(3))
    with pytest.raises(ValueError, match="origin"):
        gt.grad(lambda x: np.sum(ndimage.correlate1d(x, [1.0, 2.0], origin=3)))(np.ones(3))
