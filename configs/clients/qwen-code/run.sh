#!/usr/bin/env bash
# Qwen Code 0.24.4 against agentserve: its OpenAI auth type, the base URL and a served model name.
# Its own prompt is ~14.3k tokens: serve a model with a 32k+ window (the embedded 8k one cannot hold it).
exec qwen --auth-type openai --openai-base-url "${AGENTSERVE_URL:-http://127.0.0.1:8000}/v1" \
  --openai-api-key "${AGENTSERVE_API_KEY:-unused}" -m "${AGENTSERVE_MODEL:-smollm2-135m-instruct}" "$@"
