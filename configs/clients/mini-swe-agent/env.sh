# mini-swe-agent 2.4.6 (LiteLLM underneath): `source configs/clients/mini-swe-agent/env.sh`, then
#   mini -m openai/smollm2-135m-instruct
# MSWEA_COST_TRACKING=ignore_errors: LiteLLM has no price for a served model (else it stops at step 1).
export OPENAI_API_BASE="${AGENTSERVE_URL:-http://127.0.0.1:8000}/v1"
export OPENAI_API_KEY="${AGENTSERVE_API_KEY:-unused}"
export MSWEA_COST_TRACKING=ignore_errors
