"""The wheel as a user installs it: built with ``python -m build``, checked with ``twine check``,
installed (not editable) into a fresh venv in a temporary folder outside the checkout, and serving
a tool call from there on the hf engine and the embedded model.

The venv borrows this venv's site-packages for agentserve's dependencies (a ``.pth`` line: torch
and the rest are not downloaded again), the wheel goes in with ``--no-deps`` and a check that
every dependency it declares is met by them. The ``.pth`` files of the borrowed folder
(this checkout's editable install among them) are not processed, so ``server`` can only come from
the wheel: the test checks where it was imported from. Before server/package_data.py the server
looked for ``grammars/`` beside site-packages and stopped at start ("unknown tool-call envelope").
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from server import __version__
from server.ports import free_port, wait_for_health

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[1]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell_exec",
            "parameters": {  # a short call: the test is of the install, not of the model's writing
                "type": "object",
                "properties": {"cmd": {"type": "string", "enum": ["ls", "pwd"]}},
                "required": ["cmd"],
            },
        },
    }
]

CHECK_REQUIREMENTS = """
from importlib import metadata
from packaging.requirements import Requirement
for line in metadata.requires("agentserve") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        print(f"{req} (not installed)")
        continue
    if not req.specifier.contains(have, prereleases=True):
        print(f"{req} (installed: {have})")
"""


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=out)
    return out


def test_wheel_and_sdist_pass_twine_check_and_carry_the_data_files(dist: Path) -> None:
    pytest.importorskip("twine")
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    assert wheels[0].name == f"agentserve-{__version__}-py3-none-any.whl"
    _run(sys.executable, "-m", "twine", "check", "--strict", wheels[0], sdists[0], cwd=dist)
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    # every data file the server reads at run time, as a file (not a link) in the wheel
    wanted = {"server/engines/hf/linears/panel.c"}
    for top in ("grammars", "configs"):
        wanted |= {f"server/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / top).rglob("*") if p.is_file()}
    assert wanted - names == set()


def test_installed_wheel_serves_a_tool_call_outside_the_checkout(dist: Path, tmp_path: Path) -> None:
    from server.model_store import resolve_model

    resolve_model("embedded", progress=True)  # converted once into the cache both share
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    py = venv / "bin" / "python"
    purelib = _run(
        py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
    ).strip()
    borrowed = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "borrowed-deps.pth").write_text("\n".join(borrowed) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    wheel = next(dist.glob("*.whl"))
    _run(
        py,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-warn-script-location",
        wheel,
        cwd=tmp_path,
        env=env,
    )
    # every dependency the wheel declares is met there (pip's own check would also fail on triton,
    # which xgrammar declares and scripts/setup.sh removes: CUDA only)
    unmet = _run(py, "-c", CHECK_REQUIREMENTS, cwd=tmp_path, env=env).strip()
    assert unmet == "", unmet
    where = _run(py, "-c", "import server; print(server.__file__)", cwd=tmp_path, env=env).strip()
    assert Path(where).is_relative_to(purelib), where  # the wheel's copy, not this checkout's
    assert (
        _run(venv / "bin" / "agentserve", "--version", cwd=tmp_path, env=env).strip()
        == f"agentserve {__version__}"
    )

    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [
            str(venv / "bin" / "agentserve"),
            "serve",
            "--config",
            "embedded",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for_health(url, 240)
        except TimeoutError:
            pytest.fail(
                f"the installed server did not start:\n{(tmp_path / 'serve.log').read_text()[-4000:]}"
            )
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["version"] == __version__
        body = {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "List the files"}],
            "tools": TOOLS,
            "tool_choice": "required",
            "max_tokens": 64,
            "parallel_tool_calls": False,
        }
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)  # 2.5 min seen at load 10
        assert r.status_code == 200, r.text
        calls = r.json()["choices"][0]["message"].get("tool_calls")
        assert calls, r.json()
        assert calls and calls[0]["function"]["name"] == "shell_exec"
        assert json.loads(calls[0]["function"]["arguments"])["cmd"] in ("ls", "pwd")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
