"""The public face: every name in `gradtape.__all__` documented (arguments, returns, errors, a
runnable example), every docstring example run as a doctest, the warning and error classes
importable from `gradtape`, the version, the typing marker, and the package without Numba."""

from __future__ import annotations

import doctest
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gradtape as gt

PUBLIC = sorted(gt.__all__)
CLASSES = [name for name in PUBLIC if inspect.isclass(getattr(gt, name))]
FUNCTIONS = [name for name in PUBLIC if name not in CLASSES]
# functions that cannot fail on any argument: no "Raises" section to write
CANNOT_RAISE = {"stop_gradient", "get_num_threads", "clear_cache", "wait_for_native"}
# classes used as decorators: documented as the functions they stand for
DECORATORS = {"custom_vjp", "custom_jvp"}


def _sections(doc: str) -> set[str]:
    """The numpydoc section titles of a docstring (a title line underlined with dashes)."""
    lines = doc.splitlines()
    return {
        lines[i].strip()
        for i in range(len(lines) - 1)
        if lines[i].strip() and set(lines[i + 1].strip()) == {"-"}
    }


def test_all_names_exist_and_are_unique():
    assert len(set(gt.__all__)) == len(gt.__all__)
    for name in gt.__all__:
        assert hasattr(gt, name), name


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_is_documented(name):
    obj = getattr(gt, name)
    doc = inspect.getdoc(obj) or ""
    sections = _sections(doc)
    assert len(doc.splitlines()[0]) > 20, f"{name}: no summary line"
    assert "Examples" in sections and ">>> " in doc, f"{name}: no example"
    if name in FUNCTIONS or name in DECORATORS:
        parameters = [
            p for p in inspect.signature(obj).parameters.values() if p.name not in ("self",)
        ]
        if parameters:
            assert "Parameters" in sections, f"{name}: arguments not documented"
            for p in parameters:
                shown = p.name.lstrip("*")
                assert shown in doc, f"{name}: argument {p.name} not documented"
        assert "Returns" in sections or name == "set_num_threads", f"{name}: no Returns"
        if name not in CANNOT_RAISE:
            assert "Raises" in sections, f"{name}: errors not documented"


@pytest.mark.parametrize("name", ["gradtape", *PUBLIC])
def test_docstring_examples_run(name):
    """The examples in the docstrings are doctests: they run and print what they show."""
    obj = gt if name == "gradtape" else getattr(gt, name)
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, globs={})
    examples = [t for t in tests if t.examples]
    assert examples, f"{name}: no doctest found"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in examples:
        runner.run(test, out=lambda text: print(text, end=""))
    assert runner.failures == 0, f"{name}: {runner.failures} docstring example(s) failed"


def test_every_warning_and_error_class_is_exported():
    """Every exception and warning class defined in the library (outside its private modules and
    internal control flow) is importable from `gradtape`."""
    import ast

    internal = {  # caught
        "Unsupported",
        "NotSteppable",
        "Absent",
        "_Uncacheable",
        "_TooShort",
        "_Unkeyable",
        "NotServed",  # compile/llvm: a module the llvmlite generator leaves to Numba
        "Unusable",
    }
    package = Path(gt.__file__).parent
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name)
                and (b.id.endswith(("Error", "Warning", "Exception")))
                or isinstance(b, ast.Name)
                and b.id in {"GradtapeError", "GuardFailure"}
                for b in node.bases
            ):
                found.add(node.name)
    assert {"GradtapeError", "GuardFailure", "CompileWarning", "NativeFallbackWarning"} <= found
    for name in {n for n in found - internal if not n.startswith("_")}:  # private: internal
        assert name in gt.__all__, f"{name} is raised by the library but not exported"
    assert issubclass(gt.NativeFallbackWarning, UserWarning)
    assert issubclass(gt.CompileWarning, UserWarning)
    assert issubclass(gt.GradtapeError, TypeError)


def test_version_is_written_once_and_matches_the_metadata():
    assert gt.__version__.count(".") >= 2
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.exists():  # a source checkout or an sdist: the version is read from gradtape
        text = pyproject.read_text(encoding="utf-8")
        assert 'dynamic = ["version"]' in text and 'attr = "gradtape.__version__"' in text
    try:
        from importlib.metadata import PackageNotFoundError, version

        installed = version("gradtape")
    except PackageNotFoundError:  # run from the source tree without installing
        return
    assert installed == gt.__version__


def test_typed_marker_is_shipped():
    assert (Path(gt.__file__).parent / "py.typed").is_file()


def _run_without_numba(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter where `import numba` fails, as it does where Numba is
    not installed (the finder sees no numba either)."""
    prelude = "import sys\nsys.modules['numba'] = None\nsys.modules['llvmlite'] = None\n"
    env = {k: v for k, v in os.environ.items() if k != "GRADTAPE_NUMBA"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


def test_without_numba_auto_is_the_numpy_backend_and_numba_names_the_install_command():
    result = _run_without_numba(
        """
        import warnings
        warnings.simplefilter("error")  # backend="auto" falls back quietly
        import numpy as np
        import gradtape as gt
        from gradtape.compile import BACKENDS

        assert "numba" not in BACKENDS, sorted(BACKENDS)
        f = lambda x: np.sum(np.exp(x))
        vg = gt.compile(gt.value_and_grad(f))
        value, g = vg(np.zeros(3))
        assert value == 3.0 and np.array_equal(g, np.ones(3)), (value, g)
        carry, ys = gt.scan(lambda c, x: (c + x, c * x), 0.0, np.arange(3.0))
        for _ in range(4):  # eager loops past the point where native drivers would start
            gt.grad(lambda x: gt.scan(lambda c, v: (c * v, c), 1.0, x)[0])(np.arange(1.0, 4.0))
        gt.set_num_threads(2)
        gt.set_num_threads(1)
        try:
            gt.compile(f, backend="numba")
        except ImportError as error:
            print(error)
        else:
            raise SystemExit("backend='numba' did not raise")
        assert "numba" not in sys.modules or sys.modules["numba"] is None
        """
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'pip install "gradtape[numba]"' in result.stdout
    assert "Warning" not in result.stderr, result.stderr


def test_numba_turned_off_says_so():
    env = dict(os.environ, GRADTAPE_NUMBA="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = (
        "import numpy as np, gradtape as gt\n"
        "try:\n    gt.compile(np.sum, backend='numba')\n"
        "except ImportError as e:\n    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert "GRADTAPE_NUMBA=0" in result.stdout


def test_import_gradtape_does_not_import_optional_dependencies():
    code = (
        "import sys, gradtape\n"
        "heavy = [m for m in ('numba', 'scipy', 'jax', 'torch', 'matplotlib', 'rich') "
        "if m in sys.modules]\n"
        "print(heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("GRADTAPE_NUMBA", None)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
