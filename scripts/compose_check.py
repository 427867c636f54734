"""Check docker-compose.yml against the Dockerfile: what a typo there would break at `docker compose up`.

Needs only PyYAML (scripts/ci_images.sh runs it inside the router image; tests/test_images.py in
the main suite). Checked: every service has an image and a build whose target is a stage of the
Dockerfile; every vLLM worker shares the host's IPC namespace (or sets shm_size), mounts the model
folder read-only, points AGENTSERVE_MODEL inside that mount and has a GPU of its own; the router is
built from the router stage, lists every worker (and only them) as ``--worker http://NAME:8000``,
waits for them to be healthy and publishes port 8000; every named volume is declared.

    python3 scripts/compose_check.py [docker-compose.yml] [Dockerfile]     exit 1 with the problems
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def stages(dockerfile: str) -> list[str]:
    """The named stages of a Dockerfile, in order (``FROM x AS name``)."""
    return re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", dockerfile, re.MULTILINE | re.IGNORECASE)


def default_stage(dockerfile: str) -> str:
    """The stage a build without a target gets: the last ``FROM``, followed through ``FROM stage``."""
    last = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$", dockerfile, re.MULTILINE | re.IGNORECASE)[-1]
    return last[1] or last[0]


def _target(service: dict[str, Any], dockerfile: str) -> str | None:
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        return default_stage(dockerfile)
    return str(build.get("target") or default_stage(dockerfile))


def problems(compose: dict[str, Any], dockerfile: str) -> list[str]:
    out: list[str] = []
    services = compose.get("services")
    if not isinstance(services, dict) or not services:
        return ["no services"]
    names = stages(dockerfile)
    targets: dict[str, str | None] = {}
    for name, svc in services.items():
        if not isinstance(svc, dict) or not svc.get("image") or svc.get("build") is None:
            out.append(f"{name}: needs an image and a build")
            continue
        targets[name] = _target(svc, dockerfile)
        if targets[name] not in names:
            out.append(f"{name}: build target {targets[name]!r} is not a stage of the Dockerfile ({names})")
    workers = [n for n, t in targets.items() if t == "worker"]
    routers = [n for n, t in targets.items() if t == "router"]
    if not workers or len(routers) != 1:
        out.append(f"want vLLM workers and one router, found workers {workers}, routers {routers}")
    gpus: list[str] = []
    for name in workers:
        svc = services[name]
        if svc.get("ipc") != "host" and not svc.get("shm_size"):
            out.append(f"{name}: vLLM needs ipc: host or shm_size (its processes share /dev/shm)")
        mounts = [str(v) for v in svc.get("volumes", [])]
        models = [m.split(":") for m in mounts if len(m.split(":")) == 3 and m.split(":")[2] == "ro"]
        model = str((svc.get("environment") or {}).get("AGENTSERVE_MODEL", ""))
        if not any(model.startswith(inner.rstrip("/") + "/") for _host, inner, _mode in models):
            out.append(f"{name}: AGENTSERVE_MODEL {model!r} is not inside a read-only volume ({mounts})")
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        ids = [str(i) for d in devices if "gpu" in d.get("capabilities", []) for i in d.get("device_ids", [])]
        if not ids:
            out.append(f"{name}: reserves no GPU")
        gpus += ids
    if len(gpus) != len(set(gpus)):
        out.append(f"two workers share a GPU: {gpus}")
    for name in routers:
        svc = services[name]
        command = [str(c) for c in svc.get("command", [])]
        listed = [command[i + 1] for i, c in enumerate(command[:-1]) if c == "--worker"]
        want = [f"http://{w}:8000" for w in workers]
        if sorted(listed) != sorted(want):
            out.append(f"{name}: --worker {listed}, want every worker once: {want}")
        depends = svc.get("depends_on", {})
        for w in workers:
            if (depends.get(w) or {}).get("condition") != "service_healthy":
                out.append(f"{name}: does not wait for {w} to be healthy")
        if "8000:8000" not in [str(p) for p in svc.get("ports", [])]:
            out.append(f"{name}: does not publish port 8000")
    declared = set((compose.get("volumes") or {}).keys())
    for name, svc in services.items():
        for v in svc.get("volumes", []) if isinstance(svc, dict) else []:
            source = str(v).split(":")[0]
            if not source.startswith(("/", ".", "~")) and source not in declared:
                out.append(f"{name}: volume {source!r} is not declared under volumes:")
    return out


def main(argv: list[str]) -> int:
    compose_path = Path(argv[0]) if argv else ROOT / "docker-compose.yml"
    dockerfile_path = Path(argv[1]) if len(argv) > 1 else ROOT / "Dockerfile"
    compose = yaml.safe_load(compose_path.read_text())
    found = problems(compose, dockerfile_path.read_text())
    for p in found:
        print(f"{compose_path}: {p}", file=sys.stderr)
    if not found:
        print(f"{compose_path}: services {sorted(compose['services'])} parse and match the Dockerfile")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
