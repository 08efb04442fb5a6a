"""The seeds' functions (shared/seeds/), as a user writes them: plain NumPy."""

import numpy as np


def normal_logpdf(x, mu=0.3, sigma=1.7):
    """Sum of the normal log-density (seed 003)."""
    return np.sum(-0.5 * ((x - mu) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi))


def eam(x):
    """The embedded-atom model of seed 004."""
    rho = np.sum(np.exp(-3 * (x + 1)))
    return rho**2 + rho**3 + 0.25 * rho**4


def sum_exp(x):
    """Seed 000."""
    return np.sum(np.exp(x))


def branching(x):
    """Seed 001: a Python branch on a traced value."""
    if np.sum(x) > 1:
        return np.sum(x) ** 3
    return np.sum(x) ** 2
