"""Run the HIPS autograd project's own test suite on plain NumPy with gradtape's transforms.

autograd's tests are written as `import autograd.numpy as np` and `from autograd import grad`.
This script points those names at plain `numpy`, `scipy` and gradtape, runs pytest on the
unmodified test files and prints the pass/fail/error counts grouped by cause (the exception
type and the first line of its message, with numbers and reprs blanked).

    python benchmarks/autograd_suite.py                        # clones HIPS/autograd (git)
    python benchmarks/autograd_suite.py --source ~/src/autograd  # an existing checkout
    python benchmarks/autograd_suite.py --source autograd-1.7.0.tar.gz  # an sdist with tests/

The mapping (`autograd.*` -> NumPy, SciPy, gradtape):

* `autograd.numpy`, `autograd.numpy.random`, `autograd.scipy.*` -> `numpy`, `numpy.random`,
  `scipy.*` (the point of the exercise: the functions under test are plain NumPy and SciPy);
* `grad`, `value_and_grad`, `jacobian`, `hessian`, `elementwise_grad`, `deriv`,
  `holomorphic_grad`, `make_vjp`, `make_jvp`, `make_hvp`, `hessian_tensor_product`,
  `vector_jacobian_product`, `tensor_jacobian_product`, `grad_and_aux`, `checkpoint`
  -> gradtape's `grad`, `vjp`, `jvp`, `jacobian`, `hessian`;
* `autograd.extend.primitive` + `defvjp`/`defjvp` -> `gradtape.custom_vjp`/`custom_jvp`;
* `autograd.test_util.check_grads` keeps autograd's own checking code (finite differences
  against the VJP and the JVP, to second order) with gradtape's `vjp` and `jvp` inside.

Tests of autograd's internals that have no gradtape counterpart (its box and node classes,
`autograd.tracer.isbox`, `const_graph`) fail on import or use and are counted under their
own cause, so the count says exactly what ran.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap

REPOSITORY = "https://github.com/HIPS/autograd"

# the pytest plugin that installs the mapping before any test module is imported, and writes
# one JSON line per test outcome
SHIM = textwrap.dedent(
    '''
    """autograd's names mapped to NumPy, SciPy and gradtape (loaded with -p)."""

    import builtins
    import json
    import os
    import sys
    import types

    import numpy
    import numpy.random
    import scipy
    import scipy.integrate
    import scipy.linalg
    import scipy.signal
    import scipy.special
    import scipy.stats

    # autograd's pure-Python helpers the test utilities use (vector spaces of NumPy values,
    # the n-ary wrapper); nothing of autograd's tracing runs
    import autograd.core as _ag_core
    import autograd.numpy.numpy_vspaces  # noqa: F401  (registers ndarray vector spaces)
    import autograd.test_util as _ag_test_util
    import autograd.wrap_util as _ag_wrap_util

    import gradtape as gt

    unary_to_nary = _ag_wrap_util.unary_to_nary
    vspace = _ag_core.vspace


    def _module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod


    def core_make_vjp(fun, x):
        """autograd.core.make_vjp: (vjp, value) of a function of one argument."""
        ans, vjp_fn = gt.vjp(fun, x)
        return (lambda g: vjp_fn(g)[0]), ans


    def core_make_jvp(fun, x):
        """autograd.core.make_jvp: v -> (value, tangent)."""
        def jvp(v):
            return gt.jvp(fun, (x,), (v,))
        return jvp


    make_vjp = unary_to_nary(core_make_vjp)
    make_jvp = unary_to_nary(core_make_jvp)


    @unary_to_nary
    def grad(fun, x):
        return gt.grad(fun)(x)


    @unary_to_nary
    def value_and_grad(fun, x):
        return gt.value_and_grad(fun)(x)


    @unary_to_nary
    def grad_and_aux(fun, x):
        g, aux = gt.grad(fun, has_aux=True)(x)
        return g, aux


    @unary_to_nary
    def elementwise_grad(fun, x):
        ans, vjp_fn = gt.vjp(fun, x)
        return vjp_fn(numpy.ones_like(ans))[0]


    deriv = elementwise_grad


    @unary_to_nary
    def holomorphic_grad(fun, x):
        return gt.grad(fun, holomorphic=True)(x)


    @unary_to_nary
    def jacobian(fun, x):
        return gt.jacobian(fun)(x)


    @unary_to_nary
    def hessian(fun, x):
        return gt.hessian(fun)(x)


    @unary_to_nary
    def make_hvp(fun, x):
        """(v -> H v, gradient) at x, as autograd's make_hvp."""
        return (lambda v: gt.hvp(fun, x, v)), gt.grad(fun)(x)


    def _with_argument(fun, args, argnum):
        def f(x):
            a = list(args)
            a[argnum] = x
            return fun(*a)
        return f


    def hessian_tensor_product(fun, argnum=0):
        """(*args, v) -> the Hessian in argument argnum times v."""
        def product(*args):
            args, vector = args[:-1], args[-1]
            return gt.hvp(_with_argument(fun, args, argnum), args[argnum], vector)
        return product


    hessian_vector_product = hessian_tensor_product


    def tensor_jacobian_product(fun, argnum=0):
        """(*args, v) -> v contracted with the leading axes of the Jacobian in argument argnum."""
        def product(*args):
            args, vector = args[:-1], args[-1]
            jac = gt.jacobian(_with_argument(fun, args, argnum))(args[argnum])
            return numpy.tensordot(vector, jac, axes=numpy.ndim(vector))
        return product


    vector_jacobian_product = tensor_jacobian_product


    def make_ggnvp(f, g=lambda x: 0.5 * numpy.sum(x**2, axis=-1), f_argnum=0):
        """Generalized Gauss-Newton products J^T H_g J v at a point, as autograd's."""
        @unary_to_nary
        def _make_ggnvp(f, x):
            f_x, f_vjp = gt.vjp(f, x)

            def ggnvp(v):
                jv = gt.jvp(f, (x,), (v,))[1]
                return f_vjp(gt.hvp(g, f_x, jv))[0]
            return ggnvp
        return _make_ggnvp(f, f_argnum)


    def checkpoint(fun):
        return fun


    def primitive(fun):
        return _Primitive(fun)


    class _Primitive:
        """autograd.extend.primitive: a function whose rules defvjp/defjvp supply."""

        def __init__(self, fun):
            self.fun = fun
            self.__name__ = getattr(fun, "__name__", "primitive")
            self.vjpmakers = None

        def __call__(self, *args, **kwargs):
            if self.vjpmakers is None:
                return self.fun(*args, **kwargs)
            makers = self.vjpmakers
            fun = self.fun

            wrapped = gt.custom_vjp(lambda *a: fun(*a, **kwargs))

            def fwd(*a):
                ans = fun(*a, **kwargs)
                return ans, (ans, a)

            def bwd(res, g):
                ans, a = res
                cts = []
                for i in range(len(a)):
                    maker = makers.get(i)
                    cts.append(None if maker is None else maker(ans, *a, **kwargs)(g))
                return tuple(cts)

            wrapped.defvjp(fwd, bwd)
            return wrapped(*args)


    def defvjp(fun, *vjpmakers, argnums=None):
        argnums = range(len(vjpmakers)) if argnums is None else argnums
        fun.vjpmakers = {i: m for i, m in zip(argnums, vjpmakers) if m is not None}


    def defvjp_argnum(fun, vjpmaker):
        raise NotImplementedError("autograd.extend.defvjp_argnum has no gradtape mapping")


    def defjvp(fun, *jvpmakers, argnums=None):
        raise NotImplementedError("autograd.extend.defjvp has no gradtape mapping")


    def isbox(x):
        return type(x).__name__ == "Tracer"


    _module(
        "autograd",
        grad=grad, value_and_grad=value_and_grad, grad_and_aux=grad_and_aux,
        elementwise_grad=elementwise_grad, deriv=deriv, holomorphic_grad=holomorphic_grad,
        jacobian=jacobian, hessian=hessian, make_vjp=make_vjp, make_jvp=make_jvp,
        make_hvp=make_hvp, make_ggnvp=make_ggnvp,
        hessian_tensor_product=hessian_tensor_product,
        hessian_vector_product=hessian_vector_product,
        tensor_jacobian_product=tensor_jacobian_product,
        vector_jacobian_product=vector_jacobian_product, checkpoint=checkpoint,
        primitive=primitive, tuple=builtins.tuple, list=builtins.list, dict=builtins.dict,
        isinstance=builtins.isinstance, type=builtins.type, __path__=[],
    )
    sys.modules["autograd.numpy"] = numpy
    sys.modules["autograd.numpy.random"] = numpy.random
    sys.modules["autograd"].scipy = _module(
        "autograd.scipy", __path__=[], special=scipy.special, stats=scipy.stats,
        linalg=scipy.linalg, signal=scipy.signal, integrate=scipy.integrate)
    for _name in ("special", "linalg", "signal", "integrate"):
        sys.modules["autograd.scipy." + _name] = getattr(scipy, _name)
    sys.modules["autograd.scipy.stats"] = scipy.stats
    for _name in ("norm", "t", "beta", "gamma", "chi2", "poisson", "dirichlet",
                  "multivariate_normal"):
        sys.modules["autograd.scipy.stats." + _name] = getattr(scipy.stats, _name)
    sys.modules["autograd.scipy.misc"] = _module(
        "autograd.scipy.misc", logsumexp=scipy.special.logsumexp)
    _module("autograd.core", make_vjp=core_make_vjp, make_jvp=core_make_jvp, vspace=vspace)
    _module("autograd.wrap_util", unary_to_nary=unary_to_nary)
    _module("autograd.extend", primitive=primitive, defvjp=defvjp,
            defvjp_argnum=defvjp_argnum, defjvp=defjvp, vspace=vspace)
    _module("autograd.tracer", primitive=primitive, isbox=isbox)
    _module("autograd.builtins", tuple=builtins.tuple, list=builtins.list,
            dict=builtins.dict, isinstance=builtins.isinstance)

    # autograd's own checking code, with the make_vjp/make_jvp above in its namespace
    _test_util = _module("autograd.test_util")
    _test_util.__dict__.update(
        {k: v for k, v in _ag_test_util.__dict__.items() if not k.startswith("__")})
    # its functions read make_vjp/make_jvp from their module's globals: point them at ours
    _ag_test_util.make_vjp = core_make_vjp
    _ag_test_util.make_jvp = core_make_jvp

    _OUT = os.environ["AUTOGRAD_SUITE_RESULTS"]


    def pytest_runtest_logreport(report):
        if report.when == "call" or report.outcome != "passed":
            cause = ""
            if report.outcome != "passed" and report.longrepr is not None:
                crash = getattr(report.longrepr, "reprcrash", None)
                cause = crash.message if crash is not None else str(report.longrepr)
            with open(_OUT, "a") as fh:
                fh.write(json.dumps({"id": report.nodeid, "when": report.when,
                                     "outcome": report.outcome, "cause": cause}) + "\\n")


    def pytest_collectreport(report):
        if report.outcome != "passed":
            crash = getattr(report.longrepr, "reprcrash", None)
            cause = crash.message if crash is not None else str(report.longrepr)
            with open(_OUT, "a") as fh:
                fh.write(json.dumps({"id": report.nodeid, "when": "collect",
                                     "outcome": "error", "cause": cause}) + "\\n")
    '''
)


def obtain_tests(source: str | None, workdir: str) -> str:
    """A directory holding autograd's tests/, from a checkout, an sdist or a git clone."""
    target = os.path.join(workdir, "tests")
    if source is None:
        clone = os.path.join(workdir, "autograd")
        subprocess.run(["git", "clone", "--depth", "1", REPOSITORY, clone], check=True)
        source = clone
    if os.path.isdir(source):
        shutil.copytree(os.path.join(source, "tests"), target)
    else:
        with tarfile.open(source) as tar:
            members = [m for m in tar.getmembers() if "/tests/" in m.name]
            if not members:
                sys.exit(f"{source} holds no tests/ directory")
            for m in members:
                m.name = "tests/" + m.name.split("/tests/", 1)[1]
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(workdir, members=members, **safe)
    # autograd's conftest only seeds NumPy's generator; ours loads the mapping first
    with open(os.path.join(target, "_gradtape_autograd.py"), "w") as fh:
        fh.write(SHIM)
    return target


def normalise(cause: str) -> str:
    """The first line of a failure message with numbers, arrays and addresses blanked."""
    line = cause.strip().splitlines()[0] if cause.strip() else "(no message)"
    line = re.sub(r"0x[0-9a-f]+", "#", line)
    line = re.sub(r"\[[^\]]*\]", "[..]", line)
    line = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?j?", "#", line)
    return line[:160]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", help="autograd checkout or sdist (default: git clone)")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers")
    parser.add_argument("--show", type=int, default=0, help="list up to N test ids per cause")
    parser.add_argument("--json", help="write every outcome to this file")
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as workdir:
        tests = obtain_tests(args.source, workdir)
        results = os.path.join(workdir, "results.jsonl")
        env = dict(os.environ, AUTOGRAD_SUITE_RESULTS=results)
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
        env["PYTHONPATH"] = os.pathsep.join(
            [tests, os.path.abspath(src)] + [p for p in [env.get("PYTHONPATH")] if p]
        )
        env["PYTHONWARNINGS"] = "ignore"
        cmd = [sys.executable, "-m", "pytest", "-p", "_gradtape_autograd", "-p", "no:cacheprovider"]
        cmd += ["-q", "--tb=line", "-W", "ignore", "--rootdir", tests]
        cmd += ["--continue-on-collection-errors"]  # internals-only modules fail to import
        if args.workers > 1:
            cmd += ["-n", str(args.workers)]
        cmd += args.pytest_args
        subprocess.run(cmd, cwd=tests, env=env, stdout=subprocess.DEVNULL)
        outcomes = []
        if os.path.exists(results):
            with open(results) as fh:
                outcomes = [json.loads(line) for line in fh]

    # one verdict per test: an error in setup or teardown counts as an error
    verdict: dict[str, tuple[str, str]] = {}
    for o in outcomes:
        kind = o["outcome"]
        if o["when"] in ("setup", "teardown", "collect") and kind == "failed":
            kind = "error"
        if kind == "passed" and o["id"] in verdict:
            continue
        verdict[o["id"]] = (kind, o["cause"])
    counts = collections.Counter(kind for kind, _ in verdict.values())
    total = sum(counts.values())
    print(f"autograd's test suite on NumPy + gradtape: {total} tests")
    for kind in ("passed", "failed", "error", "skipped"):
        print(f"  {kind:8s} {counts.get(kind, 0)}")
    causes: dict[str, list[str]] = collections.defaultdict(list)
    for test_id, (kind, cause) in verdict.items():
        if kind in ("failed", "error"):
            causes[normalise(cause)].append(test_id)
    print("\nfailures and errors by cause:")
    for cause, ids in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(ids):4d}  {cause}")
        for test_id in ids[: args.show]:
            print(f"          {test_id}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {k: {"outcome": v[0], "cause": v[1]} for k, v in verdict.items()}, fh, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
