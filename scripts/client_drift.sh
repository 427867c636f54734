#!/usr/bin/env bash
# Client drift check (issue 36 item 8; not in CI, needs npm and ~1 GB): installs the newest Claude Code and
# Codex CLI from npm into a temporary prefix, runs the real-client tests against them through a recording
# proxy (tests/dialects/request_recorder.py), and prints the versions and every request path, header or body
# field that scripts/client_drift_seen.json does not list yet. The pinned versions stay what CI runs
# (scripts/install_agent_clients.sh).
#   bash scripts/client_drift.sh              # newest versions
#   CLAUDE_CODE_VERSION=2.1.332 CODEX_VERSION=0.171.0 bash scripts/client_drift.sh --update
#                                               # record the pinned versions' requests as the baseline
# The baseline in the repository was first built from the 32-turn captures of Claude Code 2.1.332 and
# Codex 0.171.0 over HTTP (benchmarks/agents/agents_long.py capture: 132 requests, compaction included); the
# capture proxy drops key headers and sees no WebSocket, so a first drift run lists those once.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
PREFIX="$(mktemp -d "${TMPDIR:-/tmp}/agentserve-drift.XXXXXX")"
LOG="$PREFIX/requests.jsonl"
CC="@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION:-latest}"
CX="@openai/codex@${CODEX_VERSION:-latest}"
echo "installing $CC and $CX into $PREFIX"
if ! npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "$CC" "$CX"; then
  echo "npm install failed (offline?): nothing checked" >&2
  exit 2
fi
echo "Claude Code: $("$PREFIX/node_modules/.bin/claude" --version 2>/dev/null | head -1)"
echo "Codex CLI:   $("$PREFIX/node_modules/.bin/codex" --version 2>/dev/null | head -1)"
AGENTSERVE_NPM_PREFIX="$PREFIX" AGENTSERVE_DRIFT_LOG="$LOG" PYTHONPATH="$ROOT" \
  "$PY" -m pytest -q -p no:cacheprovider -m slow tests/dialects/test_claude_code.py tests/dialects/test_codex.py
status=$?
echo "tests: exit $status"
if [ -s "$LOG" ]; then
  PYTHONPATH="$ROOT" "$PY" -m tests.dialects.request_recorder "$LOG" scripts/client_drift_seen.json "$@"
else
  echo "no request was recorded" >&2
fi
echo "the clients stay in $PREFIX (remove it when done)"
exit "$status"
