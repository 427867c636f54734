"""The command line fails cleanly: a model that does not exist is exit 2 and one line, before any startup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from server.ports import free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("model", "needle"),
    [("no-such-model", "has no config.json"), ("missing.gguf", "does not exist")],
)
@pytest.mark.parametrize("workers", [1, 2])
def test_serve_unknown_model_exits_2_with_one_line(tmp_path, model, needle, workers):
    argv = [sys.executable, "-m", "server.cli", "serve", "--model", str(tmp_path / model)]
    argv += ["--port", str(free_port()), "--workers", str(workers)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("agentserve: ") and needle in lines[0], r.stderr


def test_a_missing_model_exits_before_the_app_or_torch_is_imported(tmp_path):
    """The check comes first: a wrong --model is told in half a second, not after ~5 s of imports."""
    code = (
        "import sys; from server.cli import main; "
        f"rc = main(['serve', '--model', {str(tmp_path / 'nope')!r}]); "
        "print(rc, 'server.app' in sys.modules, 'torch' in sys.modules)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", code]
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False", "False"], r.stderr
