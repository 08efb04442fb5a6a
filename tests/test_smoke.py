"""The seeds' functions, end to end (the full rule checks live in the other test files)."""

import numpy as np
from seed_functions import eam, normal_logpdf

import gradtape as gt


def test_normal_logpdf_matches_closed_form():
    x = np.linspace(-2, 2, 7)
    np.testing.assert_allclose(gt.grad(normal_logpdf)(x), -(x - 0.3) / 1.7**2, rtol=1e-12)


def test_eam_matches_hand_written():
    x = np.random.default_rng(0).random(100)
    rho = np.sum(np.exp(-3 * (x + 1)))
    dF = 2 * rho + 3 * rho**2 + rho**3
    np.testing.assert_allclose(gt.grad(eam)(x), -3 * np.exp(-3 * (x + 1)) * dF, rtol=1e-12)
