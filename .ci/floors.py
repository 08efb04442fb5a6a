"""Print the oldest supported versions as exact pins, one requirement a line: the required
dependencies and the runtime extras (numba, scipy, dask) of pyproject.toml, each `>=X` turned into
`==X`, with the markers evaluated for the Python version given (default: this one).

    python .ci/floors.py 3.10  >  floors.txt     (run with Python 3.11 or newer: tomllib)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement

RUNTIME_EXTRAS = ("numba", "scipy", "dask")


def floors(python_version: str) -> list[str]:
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in RUNTIME_EXTRAS:
        requirements += project["optional-dependencies"][extra]
    pins = {}
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker and not Marker(str(requirement.marker)).evaluate(
            {"python_version": python_version, "python_full_version": python_version + ".0"}
        ):
            continue
        lows = [s.version for s in requirement.specifier if s.operator == ">="]
        if len(lows) != 1:
            raise SystemExit(f"{text}: a floor is declared as one `>=` bound")
        pins[requirement.name] = f"{requirement.name}=={lows[0]}"
    return list(pins.values())


if __name__ == "__main__":
    version = sys.argv[1] if len(sys.argv) > 1 else f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not re.fullmatch(r"3\.\d+", version):
        raise SystemExit(f"expected a Python version like 3.10, got {version!r}")
    print("\n".join(floors(version)))
