"""The router image installs its dependencies from pyproject.toml, and `agentserve route` imports
with only those (issue 37 item 6: the hand-kept list lacked websockets and filelock: a crash loop)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from router_requirements import distribution, router_requirements  # noqa: E402


def _router_stage() -> str:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (stage,) = [s for s in dockerfile.split("\nFROM ")[1:] if s.splitlines()[0].endswith(" AS router")]
    return stage


def test_the_router_stage_installs_what_pyproject_lists_not_a_list_of_its_own():
    stage = _router_stage()
    assert "COPY scripts/router_requirements.py" in stage
    assert "scripts/router_requirements.py pyproject.toml > /tmp/router-requirements.txt" in stage
    installs = [line for line in stage.splitlines() if "pip install" in line]
    assert installs and all(
        re.search(r"pip install --no-cache-dir (-r /tmp/router-requirements.txt|--no-deps \.)", line)
        for line in installs
    ), installs
    pinned = router_requirements(ROOT / "pyproject.toml")
    assert "websockets>=15.0.1,<18" in pinned  # pinned where the worker's pin is


def _allowed_distributions() -> set[str]:
    """The router's distributions and everything they require (markers evaluated here)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    todo = [distribution(r) for r in router_requirements(ROOT / "pyproject.toml")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(distribution(req.name))
    return seen


def test_agentserve_route_imports_with_only_the_router_dependencies():
    allowed = sorted(_allowed_distributions() | {"agentserve"})
    probe = textwrap.dedent(
        f"""
        import importlib.abc, re, sys
        from importlib import metadata
        ALLOWED = set({allowed!r})
        OWNERS = metadata.packages_distributions()
        def norm(name): return re.sub(r"[-_.]+", "-", name).lower()
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("server", "_distutils_hack"):
                    return None
                owners = {{norm(d) for d in OWNERS.get(top, [])}}
                if owners and not owners & ALLOWED:
                    raise ModuleNotFoundError(f"{{name}}: from {{sorted(owners)}}, not in the router image")
                return None
        sys.meta_path.insert(0, Block())
        import server.cli, server.auth, server.routing.router_app, server.routing.websocket
        import uvicorn.protocols.http.httptools_impl, uvicorn.protocols.websockets.websockets_impl
        import uvicorn.loops.uvloop, uvicorn.lifespan.on
        from server.cli import main
        try:
            main(["route", "--help"])
        except SystemExit as exit:
            assert exit.code == 0, exit.code
        print("router imports")
        """
    )
    env_path = str(ROOT)
    r = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    assert r.returncode == 0 and "router imports" in r.stdout, r.stderr[-3000:]
