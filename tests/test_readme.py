"""The README is the package's long description on PyPI and its first page: its code blocks run
as written, in order, the quick start on a bare install (NumPy only), its links are absolute
(or absent), and its set-up commands are what CI runs."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
pytestmark = pytest.mark.skipif(not README.exists(), reason="needs the source tree's README")

# where Numba or SciPy is missing, `import` of it fails as it does where it is not installed
BLOCK_PRELUDE = "import sys\nfor _name in {blocked!r}:\n    sys.modules[_name] = None\n"


def python_blocks() -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)


def needs_numba(block: str) -> bool:
    return 'backend="numba"' in block or "import nutpie" in block


def runnable_here(block: str) -> bool:
    """A block that imports nutpie runs where nutpie is installed (the nutpie extra)."""
    return "import nutpie" not in block or importlib.util.find_spec("nutpie") is not None


def run_blocks(blocks: list[str], blocked: tuple[str, ...], numba_on: bool):
    """Run the blocks one after another in one fresh interpreter (as a reader pastes them)."""
    script = BLOCK_PRELUDE.format(blocked=blocked) + "\n".join(blocks)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    if numba_on:
        env.pop("GRADTAPE_NUMBA", None)
    else:
        env["GRADTAPE_NUMBA"] = "0"
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )


def test_readme_has_the_blocks_this_test_runs():
    blocks = python_blocks()
    assert len(blocks) >= 4
    assert "def log_posterior" in blocks[0]
    assert any(needs_numba(b) for b in blocks)


def test_quick_start_runs_on_a_bare_install():
    """The quick start imports nothing but NumPy and gradtape, and runs with SciPy and Numba
    unimportable: the install command above it (`pip install gradtape`) is enough."""
    quick_start = python_blocks()[0]
    imported = set()
    for node in ast.walk(ast.parse(quick_start)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"numpy", "gradtape"}, imported
    result = run_blocks([quick_start], ("scipy", "numba", "llvmlite"), numba_on=False)
    assert result.returncode == 0, result.stderr
    assert "check_grad: OK" in result.stdout
    assert "in (" in result.stdout  # the printed tape


def test_readme_blocks_run_in_order():
    """Every block, in order, in one interpreter (Numba off: the blocks that ask for the numba
    backend are run by the native tier's test below)."""
    blocks = [b for b in python_blocks() if not needs_numba(b)]
    result = run_blocks(blocks, (), numba_on=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.native
def test_readme_blocks_run_in_order_with_numba():
    pytest.importorskip("numba")
    result = run_blocks([b for b in python_blocks() if runnable_here(b)], (), numba_on=True)
    assert result.returncode == 0, result.stderr
    assert "# --- wrapper ---" in result.stdout  # the kernels' module and the wrapper


def test_readme_links_and_images_are_absolute():
    """PyPI shows the README without the repository around it: a relative link breaks there."""
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)", text)
    targets += re.findall(r"<(?:img|a)\s[^>]*(?:src|href)=\"([^\"]+)\"", text)
    relative = [t for t in targets if not re.match(r"https?://", t)]
    assert relative == [], relative


def test_readme_commands_are_what_ci_runs():
    """The README's two set-up commands: the benchmark's, and the tests' (CI's script, which
    installs the test extra and runs both tiers, then the checks)."""
    text = README.read_text(encoding="utf-8")
    assert 'pip install ".[bench]" && gradtape bench --quick' in text
    assert "\nbash .ci/run\n" in text
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install ".[test]"' in ci
    assert "pytest --all -n 2" in ci
    assert "pip install gradtape " in text and 'pip install "gradtape[numba]"' in text
