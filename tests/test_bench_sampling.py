"""The sampling section of the benchmark: the three models agree across samplers' densities,
the means check counts what it should, the command line reaches it."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from gradtape.bench import sampling
from gradtape.bench.cli import build_parser


def _unconstrained_numpy(model, u: dict) -> float:
    """gradtape's density on the unconstrained scale (log transform and its Jacobian)."""
    params = {k: np.exp(v) if k in model.positive else v for k, v in u.items()}
    jacobian = sum(float(np.sum(u[k])) for k in model.positive)
    return float(sampling.numpy_logp(model)(params)) + jacobian


def _points(model, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{k: rng.normal(0.0, 0.5, size=s) for k, s in model.shapes.items()} for _ in range(3)]


@pytest.mark.parametrize("name", sampling.MODELS)
def test_model_data_and_shapes(name):
    model = sampling.make_model(name)
    sizes = {"M1": 21, "M2": 10, "M3": 57}
    assert sum(math.prod(s) for s in model.shapes.values()) == sizes[name]
    again = sampling.make_model(name)
    for key, value in model.data.items():
        np.testing.assert_array_equal(value, again.data[key])


@pytest.mark.parametrize("name", sampling.MODELS)
def test_jax_density_is_the_numpy_density(name):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    model = sampling.make_model(name)
    density = sampling._jax_logdensity(model)
    for u in _points(model, 1):
        ours = _unconstrained_numpy(model, u)
        theirs = float(density({k: jax.numpy.asarray(v) for k, v in u.items()}))
        assert math.isclose(ours, theirs, rel_tol=1e-12, abs_tol=1e-9)


@pytest.mark.native  # PyMC compiles its graph: slow
@pytest.mark.parametrize("name", sampling.MODELS)
def test_pymc_density_differs_from_ours_by_a_constant(name):
    pytest.importorskip("pymc")
    model = sampling.make_model(name)
    m = sampling._pymc_model(model)
    logp = m.compile_logp(jacobian=True)
    differences = []
    for u in _points(model, 2):
        point = {}
        for var in m.free_RVs:
            value_var = m.rvs_to_values[var]
            point[value_var.name] = u[var.name]
        differences.append(float(logp(point)) - _unconstrained_numpy(model, u))
    np.testing.assert_allclose(differences, differences[0], rtol=0, atol=1e-8)


def test_means_outside_monte_carlo_error_are_counted():
    ours = sampling.Result("M2", "gradtape+nutpie", means={"a": 0.0, "b": 1.0})
    ours.mcse = {"a": 0.01, "b": 0.01}
    close = sampling.Result("M2", "nutpie+pymc", means={"a": 0.03, "b": 1.0})
    close.mcse = {"a": 0.01, "b": 0.01}
    far = sampling.Result("M2", "blackjax", means={"a": 0.2, "b": 1.0})
    far.mcse = {"a": 0.01, "b": 0.01}
    sampling.compare_means([ours, close, far])
    assert (ours.means_outside_mc_error, close.means_outside_mc_error) == (0, 0)
    assert far.means_outside_mc_error == 1
    ours.compile_s, ours.sample_s, ours.min_ess_bulk, ours.ess_per_s = 1.0, 1.0, 900.0, 900.0
    close.compile_s, close.sample_s, close.min_ess_bulk, close.ess_per_s = 4.0, 1.0, 300.0, 300.0
    text = sampling.report([ours, close, far])
    assert "M2: ESS/s 3.00x nutpie+PyMC's, cold compile 0.25x" in text


def test_a_missing_sampler_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sampling._REQUIRES, "blackjax", ("a_module_that_is_not_installed",))
    args = argparse.Namespace(chains=1, draws=1, tune=1)
    result = sampling.run_one(sampling.make_model("M2"), "blackjax", args)
    assert result.error == "not installed: a_module_that_is_not_installed"


def test_the_command_line_reaches_the_sampling_section():
    args = build_parser().parse_args(
        ["bench", "--sampling", "--sampling-models", "M2", "--chains", "2"]
    )
    assert args.sampling and args.sampling_models == ["M2"] and args.chains == 2
    assert not build_parser().parse_args(["bench"]).sampling
