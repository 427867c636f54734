#!/usr/bin/env bash
# Build the real-client venvs for tests/clients (one per client: they pin different openai majors).
# Pinned locks: tests/clients/requirements/NAME.txt (from NAME.in). Idempotent (a stamp per venv).
#   scripts/client_venvs.sh [NAME...]     NAME: agents (openai-agents 0.24.0, openai 3.54.0),
#       langchain (langchain-openai 1.7.3, langchain-core 1.7.2, openai 2.54.0), openai1 (openai 1.109.1)
#   env: PYTHON (python3.11), AGENTSERVE_CACHE_DIR (~/.cache/agentserve): venvs in $CACHE/clients/NAME
# Exits 0 with a "skipped" line when pip cannot reach the registry (the tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
ROOT=${AGENTSERVE_CACHE_DIR:-$HOME/.cache/agentserve}/clients
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(agents langchain openai1)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for name in "${names[@]}"; do
  lock=tests/clients/requirements/$name.txt
  venv=$ROOT/$name
  want=$(sha256sum "$lock" | cut -c1-16)
  [ "$(cat "$venv/.agentserve-client" 2>/dev/null)" = "$want" ] && continue
  echo "agentserve: building the $name client venv in $venv" >&2
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  if ! "$venv/bin/python" -m pip install -q -r "$lock" >"$log" 2>&1; then
    rm -rf "$venv"
    if grep -q -i -E "connection|resolve|timed out|network|Max retries|No matching distribution" "$log"; then
      echo "agentserve: $name client venv skipped: pip could not reach the registry (tests/clients skip)"
      continue
    fi
    grep -v "is ignored: it is neither" "$log" >&2
    exit 1
  fi
  echo "$want" >"$venv/.agentserve-client"
done
