"""Print the router image's pip requirements, taken from pyproject.toml (never a hand-kept list).

``[tool.agentserve] router-dependencies`` names the distributions the router process needs
(``agentserve route``: no torch, no grammar libraries); their version specifiers are the ones in
``[project] dependencies``, so a pin changes in one place. A name that is not a dependency is an
error. Used by the Dockerfile's router stage; ``tests/routing/test_router_image.py`` imports the
router with only these distributions (and what they require) importable.

    python3 scripts/router_requirements.py [pyproject.toml] > router-requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def distribution(requirement: str) -> str:
    """The normalized distribution name of a requirement line (PEP 503)."""
    name = re.split(r"[<>=!~\[ ;@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def router_requirements(pyproject: Path) -> list[str]:
    data = tomllib.loads(pyproject.read_text())
    by_name = {distribution(d): d for d in data["project"]["dependencies"]}
    names = data["tool"]["agentserve"]["router-dependencies"]
    missing = [n for n in names if distribution(n) not in by_name]
    if missing:
        raise SystemExit(f"router-dependencies not in [project] dependencies: {missing}")
    return [by_name[distribution(n)] for n in names]


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "pyproject.toml"
    print("\n".join(router_requirements(path)))
