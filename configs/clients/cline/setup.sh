#!/usr/bin/env bash
# Cline CLI 3.0.65: one-time provider setup (an OpenAI-compatible provider), then `cline "task"`.
exec cline auth -p openai-compatible -b "${AGENTSERVE_URL:-http://127.0.0.1:8000}/v1" \
  -k "${AGENTSERVE_API_KEY:-unused}" -m "${AGENTSERVE_MODEL:-smollm2-135m-instruct}"
