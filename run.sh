#!/usr/bin/env bash
# agentserve developer entry point. Sets up .venv (once) and then:
#   ./run.sh serve [flags]      serve the embedded model on http://127.0.0.1:8000 (OpenAI API)
#   ./run.sh test [pytest args] run the test suite without the tests marked slow (-m slow: only those)
#   ./run.sh bench NAME [args]  a benchmark comparison (agentserve bench; see benchmarks/README.md)
#   ./run.sh bench FILE.py      a benchmark script, e.g. benchmarks/speed/profile_hf.py
#   ./run.sh <cmd> [args]       any agentserve command (route, convert-model, ...)
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cmd=${1:-serve}
[ $# -gt 0 ] && shift
case "$cmd" in
  test) exec .venv/bin/python -m pytest -m "not slow" "$@" ;;  # a later -m replaces this one
  bench)
    case "${1:-}" in
      *.py) exec .venv/bin/python "$@" ;;
      *) exec .venv/bin/agentserve bench "$@" ;;
    esac ;;
  *) exec .venv/bin/agentserve "$cmd" "$@" ;;
esac
