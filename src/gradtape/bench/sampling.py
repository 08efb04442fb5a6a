"""``gradtape bench --sampling``: NUTS on three models, effective samples per second.

Models (data drawn from a fixed seed):

* M1 logistic regression, 2000 rows x 20 features, normal priors;
* M2 eight schools, non-centred (a half-Cauchy scale);
* M3 hierarchical Poisson regression, 50 groups x 40 rows, 5 slopes, non-centred intercepts.

Samplers (each where installed): gradtape + nutpie (`gradtape.nutpie.from_logp`: native
handles, no Python per gradient), nutpie + PyMC (`nutpie.compile_pymc_model`, PyMC's numba
backend) and BlackJAX (window adaptation and NUTS, `jax.jit`). Every sampler runs the same
chains, tuning steps and draws on one core. Reported: cold compile time (building the
sampler's model, imports excluded, no disk cache: gradtape's kernel cache is an empty
directory, PyTensor's Numba cache is switched off), sampling time (tuning and draws, after a
five-step warm-up run; for the nutpie samplers the median of the same seeded run repeated
until the runs took two seconds in all, at most nine), the minimum bulk ESS over every
scalar parameter (ArviZ) and ESS per second of sampling. Posterior means of every scalar parameter
are checked against gradtape's within Monte Carlo error (four combined standard errors);
the count outside is reported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

MODELS = ("M1", "M2", "M3")
MIN_SAMPLING_SECONDS = 2.0  # nutpie runs are repeated until they took this long in all
MAX_SAMPLING_RUNS = 9
SAMPLERS = ("gradtape+nutpie", "nutpie+pymc", "blackjax")
_REQUIRES = {
    "gradtape+nutpie": ("nutpie", "numba", "arviz"),
    "nutpie+pymc": ("nutpie", "pymc", "arviz"),
    "blackjax": ("blackjax", "jax", "arviz"),
}
SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """The options of the sampling section on `gradtape bench`."""
    group = bench.add_argument_group("sampling (NUTS: effective samples per second)")
    group.add_argument(
        "--sampling", action="store_true", help="run the sampling section instead of gradients"
    )
    group.add_argument("--sampling-models", nargs="+", choices=MODELS, metavar="M")
    group.add_argument("--samplers", nargs="+", choices=SAMPLERS, metavar="NAME")
    group.add_argument("--chains", type=int, default=4)
    group.add_argument("--draws", type=int, default=1000)
    group.add_argument("--tune", type=int, default=1000)


# --- the models' data --------------------------------------------------------------------------
@dataclass
class Model:
    """One model: its data, its parameters (name -> shape) and which are positive."""

    name: str
    data: dict
    shapes: dict
    positive: tuple = ()


def make_model(name: str) -> Model:
    """The data of model `name` (fixed seed)."""
    rng = np.random.default_rng({"M1": 1, "M2": 2, "M3": 3}[name])
    if name == "M1":
        x = rng.normal(size=(2000, 20))
        beta = rng.normal(0.0, 0.5, size=20)
        p = 1.0 / (1.0 + np.exp(-(0.3 + x @ beta)))
        y = (rng.random(2000) < p).astype(np.float64)
        return Model(name, {"x": x, "y": y}, {"alpha": (), "beta": (20,)})
    if name == "M2":
        data = {"y": SCHOOLS_Y, "sigma": SCHOOLS_SIGMA}
        return Model(name, data, {"mu": (), "tau": (), "theta_raw": (8,)}, positive=("tau",))
    x = rng.normal(0.0, 0.4, size=(2000, 5))
    beta = rng.normal(0.0, 0.3, size=5)
    alpha = 1.0 + 0.5 * rng.normal(size=50)
    eta = (x @ beta).reshape(50, 40) + alpha[:, None]
    y = rng.poisson(np.exp(eta)).astype(np.float64)
    shapes = {"mu_a": (), "sigma_a": (), "z": (50,), "beta": (5,)}
    return Model(name, {"x": x, "y": y}, shapes, positive=("sigma_a",))


def numpy_logp(model: Model):
    """The model's log-density of constrained parameters, in NumPy (constants dropped)."""
    d = model.data
    if model.name == "M1":
        x, y = d["x"], d["y"]

        def logp(p):
            eta = p["alpha"] + x @ p["beta"]
            return (
                np.sum(y * eta - np.logaddexp(0.0, eta))
                - 0.125 * p["alpha"] ** 2
                - 0.5 * np.sum(p["beta"] ** 2)
            )

    elif model.name == "M2":
        y, sigma = d["y"], d["sigma"]

        def logp(p):
            theta = p["mu"] + p["tau"] * p["theta_raw"]
            return (
                -0.5 * np.sum(((y - theta) / sigma) ** 2)
                - 0.02 * p["mu"] ** 2
                - np.log1p((p["tau"] / 5.0) ** 2)
                - 0.5 * np.sum(p["theta_raw"] ** 2)
            )

    else:
        x, y = d["x"], d["y"]

        def logp(p):
            intercept = p["mu_a"] + p["sigma_a"] * p["z"]
            eta = (x @ p["beta"]).reshape(50, 40) + intercept[:, None]
            return (
                np.sum(y * eta - np.exp(eta))
                - 0.5 * p["mu_a"] ** 2
                - 0.5 * p["sigma_a"] ** 2
                - 0.5 * np.sum(p["z"] ** 2)
                - 2.0 * np.sum(p["beta"] ** 2)
            )

    return logp


# --- samplers ----------------------------------------------------------------------------------
@dataclass
class Result:
    """One sampler on one model."""

    model: str
    sampler: str
    compile_s: float | None = None
    sample_s: float | None = None
    min_ess_bulk: float | None = None
    ess_per_s: float | None = None
    means_outside_mc_error: int | None = None
    parameters: int | None = None
    error: str | None = None
    means: dict = field(default_factory=dict, repr=False)
    mcse: dict = field(default_factory=dict, repr=False)


def _gradtape_nutpie(model: Model, args) -> tuple[float, float, object]:
    from gradtape.compile.numba.export import kernel_cache_at, numba_startup
    from gradtape.nutpie import from_logp, positive

    numba_startup()  # Numba's import and initialization: imports, not compiling
    shapes = {k: positive(s) if k in model.positive else s for k, s in model.shapes.items()}
    # cold: an empty kernel cache, nothing compiled before
    with tempfile.TemporaryDirectory() as empty_cache, kernel_cache_at(empty_cache):
        start = time.perf_counter()
        compiled = from_logp(numpy_logp(model), shapes=shapes)
        compile_s = time.perf_counter() - start
    _warm_up(compiled)
    return (compile_s, *_timed_sampling(compiled, args))


def _timed_sampling(compiled, args) -> tuple[float, object]:
    """(median seconds, trace) of the same seeded run repeated until the runs took
    MIN_SAMPLING_SECONDS in all (at most MAX_SAMPLING_RUNS runs): a run of a fraction of a
    second (M2) is timed more than once. The runs are identical (one seed): one trace."""
    import nutpie

    times, trace = [], None
    while len(times) < MAX_SAMPLING_RUNS and (not times or sum(times) < MIN_SAMPLING_SECONDS):
        start = time.perf_counter()
        trace = nutpie.sample(
            compiled,
            chains=args.chains,
            draws=args.draws,
            tune=args.tune,
            seed=1,
            cores=1,
            progress_bar=False,
        )
        times.append(time.perf_counter() - start)
    return float(np.median(times)), trace


def _warm_up(compiled) -> None:
    """A few steps first: nutpie's first run in a process pays one-time costs (imports of its
    trace conversion) that are not the sampler's."""
    import nutpie

    nutpie.sample(compiled, chains=1, draws=5, tune=5, seed=0, cores=1, progress_bar=False)


def _pymc_model(model: Model):
    import pymc as pm

    d = model.data
    with pm.Model() as m:
        if model.name == "M1":
            alpha = pm.Normal("alpha", 0.0, 2.0)
            beta = pm.Normal("beta", 0.0, 1.0, shape=20)
            pm.Bernoulli("obs", logit_p=alpha + pm.math.dot(d["x"], beta), observed=d["y"])
        elif model.name == "M2":
            mu = pm.Normal("mu", 0.0, 5.0)
            tau = pm.HalfCauchy("tau", 5.0)
            theta_raw = pm.Normal("theta_raw", 0.0, 1.0, shape=8)
            pm.Normal("obs", mu + tau * theta_raw, d["sigma"], observed=d["y"])
        else:
            mu_a = pm.Normal("mu_a", 0.0, 1.0)
            sigma_a = pm.HalfNormal("sigma_a", 1.0)
            z = pm.Normal("z", 0.0, 1.0, shape=50)
            beta = pm.Normal("beta", 0.0, 0.5, shape=5)
            eta = pm.math.dot(d["x"], beta).reshape((50, 40)) + (mu_a + sigma_a * z)[:, None]
            pm.Poisson("obs", pm.math.exp(eta), observed=d["y"])
    return m


def _without_pytensor_cache():
    """PyTensor's Numba functions compiled, not loaded from its disk cache (cold, as
    gradtape's are timed with an empty cache)."""
    import pytensor

    if not hasattr(pytensor.config, "numba__cache"):  # (an older PyTensor: no such cache)
        import contextlib

        return contextlib.nullcontext()
    return pytensor.config.change_flags(numba__cache=False)


def _nutpie_pymc(model: Model, args) -> tuple[float, float, object]:
    import nutpie

    m = _pymc_model(model)
    start = time.perf_counter()
    with _without_pytensor_cache():
        compiled = nutpie.compile_pymc_model(m)
    compile_s = time.perf_counter() - start
    _warm_up(compiled)
    return (compile_s, *_timed_sampling(compiled, args))


def _jax_logdensity(model: Model):
    import jax.numpy as jnp

    d = {k: jnp.asarray(v) for k, v in model.data.items()}

    def logdensity(u):
        if model.name == "M1":
            eta = u["alpha"] + d["x"] @ u["beta"]
            return (
                jnp.sum(d["y"] * eta - jnp.logaddexp(0.0, eta))
                - 0.125 * u["alpha"] ** 2
                - 0.5 * jnp.sum(u["beta"] ** 2)
            )
        if model.name == "M2":
            tau = jnp.exp(u["tau"])
            theta = u["mu"] + tau * u["theta_raw"]
            return (
                -0.5 * jnp.sum(((d["y"] - theta) / d["sigma"]) ** 2)
                - 0.02 * u["mu"] ** 2
                - jnp.log1p((tau / 5.0) ** 2)
                - 0.5 * jnp.sum(u["theta_raw"] ** 2)
                + u["tau"]
            )
        sigma_a = jnp.exp(u["sigma_a"])
        intercept = u["mu_a"] + sigma_a * u["z"]
        eta = (d["x"] @ u["beta"]).reshape(50, 40) + intercept[:, None]
        return (
            jnp.sum(d["y"] * eta - jnp.exp(eta))
            - 0.5 * u["mu_a"] ** 2
            - 0.5 * sigma_a**2
            - 0.5 * jnp.sum(u["z"] ** 2)
            - 2.0 * jnp.sum(u["beta"] ** 2)
            + u["sigma_a"]
        )

    return logdensity


def _blackjax(model: Model, args) -> tuple[float, float, object]:
    import arviz as az
    import blackjax
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    logdensity = _jax_logdensity(model)

    @jax.jit
    def one_chain(key, position):
        warmup = blackjax.window_adaptation(blackjax.nuts, logdensity)
        key_warm, key_draw = jax.random.split(key)
        (state, parameters), _ = warmup.run(key_warm, position, num_steps=args.tune)
        kernel = blackjax.nuts(logdensity, **parameters).step

        def step(state, key):
            state, _ = kernel(key, state)
            return state, state.position

        _, positions = jax.lax.scan(step, state, jax.random.split(key_draw, args.draws))
        return positions

    def initial(seed):
        rng = np.random.default_rng(seed)
        return {k: jnp.asarray(rng.uniform(-2, 2, size=s)) for k, s in model.shapes.items()}

    start = time.perf_counter()
    jax.block_until_ready(one_chain.lower(jax.random.PRNGKey(0), initial(0)).compile())
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    chains = [
        jax.block_until_ready(one_chain(jax.random.PRNGKey(c + 1), initial(c + 1)))
        for c in range(args.chains)
    ]
    sample_s = time.perf_counter() - start
    posterior = {}
    for k in model.shapes:
        values = np.stack([np.asarray(c[k]) for c in chains])
        posterior[k] = np.exp(values) if k in model.positive else values
    return compile_s, sample_s, az.from_dict(posterior=posterior)


_RUNNERS = {"gradtape+nutpie": _gradtape_nutpie, "nutpie+pymc": _nutpie_pymc, "blackjax": _blackjax}


def _summaries(trace, model: Model) -> tuple[float, dict, dict]:
    """(minimum bulk ESS, posterior means, their Monte Carlo standard errors) per scalar."""
    import arviz as az

    names = list(model.shapes)
    ess = az.ess(trace, var_names=names, method="bulk")
    mcse = az.mcse(trace, var_names=names, method="mean")
    post = trace.posterior
    means, errors, smallest = {}, {}, math.inf
    for k in names:
        e = np.asarray(ess[k]).reshape(-1)
        smallest = min(smallest, float(e.min()))
        m = np.asarray(post[k].mean(("chain", "draw"))).reshape(-1)
        s = np.asarray(mcse[k]).reshape(-1)
        for i in range(m.size):
            means[f"{k}[{i}]"] = float(m[i])
            errors[f"{k}[{i}]"] = float(s[i])
    return smallest, means, errors


def run_one(model: Model, sampler: str, args) -> Result:
    """Compile and sample one model with one sampler; errors are recorded, not raised."""
    result = Result(model.name, sampler)
    missing = [m for m in _REQUIRES[sampler] if importlib.util.find_spec(m) is None]
    if missing:
        result.error = f"not installed: {', '.join(missing)}"
        return result
    try:
        compile_s, sample_s, trace = _RUNNERS[sampler](model, args)
        ess, means, errors = _summaries(trace, model)
    except Exception as exc:  # a sampler that fails is reported, the others still run
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return result
    result.compile_s, result.sample_s = compile_s, sample_s
    result.min_ess_bulk, result.ess_per_s = ess, ess / sample_s
    result.means, result.mcse, result.parameters = means, errors, len(means)
    return result


def compare_means(results: list[Result]) -> None:
    """Count, per result, the means farther than four combined standard errors from
    gradtape+nutpie's on the same model."""
    reference = {r.model: r for r in results if r.sampler == "gradtape+nutpie" and r.means}
    for r in results:
        ref = reference.get(r.model)
        if ref is None or not r.means:
            continue
        r.means_outside_mc_error = sum(
            abs(r.means[k] - ref.means[k]) > 4.0 * math.hypot(r.mcse[k], ref.mcse[k])
            for k in ref.means
        )


def _fmt(x, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def report(results: list[Result]) -> str:
    """The results as a Markdown table, with the goal ratios per model."""
    lines = [
        "| model | sampler | cold compile s | sampling s | min bulk ESS | ESS/s | "
        "means outside MC error |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| {r.model} | {r.sampler} | {r.error} | | | | |")
            continue
        outside = (
            "-"
            if r.means_outside_mc_error is None
            else f"{r.means_outside_mc_error} of {r.parameters}"
        )
        lines.append(
            f"| {r.model} | {r.sampler} | {_fmt(r.compile_s, 2)} | {_fmt(r.sample_s, 2)} | "
            f"{_fmt(r.min_ess_bulk)} | {_fmt(r.ess_per_s)} | {outside} |"
        )
    ratios = []
    for name in MODELS:
        ours = next((r for r in results if r.model == name and r.sampler == SAMPLERS[0]), None)
        pymc = next((r for r in results if r.model == name and r.sampler == SAMPLERS[1]), None)
        if ours and pymc and ours.ess_per_s and pymc.ess_per_s:
            ratios.append(
                f"{name}: ESS/s {ours.ess_per_s / pymc.ess_per_s:.2f}x nutpie+PyMC's, cold "
                f"compile {ours.compile_s / pymc.compile_s:.2f}x compile_pymc_model's"
            )
    return "\n".join(lines + [""] + ratios)


def run(args: argparse.Namespace) -> int:
    """`gradtape bench --sampling`: every selected model with every selected sampler."""
    from gradtape.bench.environment import machine, pin_threads, versions

    pin_threads()
    results = []
    for name in args.sampling_models or MODELS:
        model = make_model(name)
        for sampler in args.samplers or SAMPLERS:
            print(f"{name} {sampler} ...", flush=True)
            results.append(run_one(model, sampler, args))
    compare_means(results)
    text = report(results)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {"chains": args.chains, "draws": args.draws, "tune": args.tune, "cores": 1}
    record = {
        "settings": settings,
        "machine": machine(),
        "versions": versions(),
        "results": [
            {k: v for k, v in asdict(r).items() if k not in ("means", "mcse")} for r in results
        ],
    }
    (args.out / "sampling.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "sampling.md").write_text(text + "\n")
    print(f"\nWrote {args.out / 'sampling.json'}, {args.out / 'sampling.md'}")
    return 0
