#!/usr/bin/env bash
# Install llama-cpp-python (the llamacpp engine's kernels: ggml) into the project venv from a
# wheel built once from the PyPI sdist and cached; optionally build llama-server and
# llama-quantize from the same llama.cpp (benchmarks/speed/llamacpp_bench.py's peer). Idempotent.
#
#   scripts/install_llamacpp.sh [--tools | --print-args]
#   env: AGENTSERVE_CACHE_DIR (~/.cache/agentserve), PYTHON (.venv/bin/python),
#        LLAMACPP_VERSION (0.3.36), LLAMACPP_CMAKE_ARGS (default: this CPU's vector extensions, below),
#        AGENTSERVE_CPUINFO (/proc/cpuinfo: where those extensions are read)
#   --print-args: print the cmake flags and the wheel's cache key, build nothing
#
# The first build compiles ggml + llama.cpp (~6-10 min on a 2-core box; --tools, a build of its own,
# 13 min more, measured 2026-11-27); the wheel lands in $CACHE/wheels/<key>/ and every later run
# (a fresh clone, CI) installs it in seconds. Built for the vector extensions this CPU has
# (AVX/AVX2/FMA/F16C/BMI2 on any x86-64, then AVX-512 and VNNI where /proc/cpuinfo lists them): on
# this box's Xeon a 2k-token prefill of a 1B Q4_K_M ran 1.56x the AVX2-only build's, decode equal;
# SmolLM2's Q4_1 1.10x and 0.89x (benchmarks/speed/llamacpp_builds.py, docs/llamacpp.md). Not AMX: its tile kernels died
# with SIGILL in this box's VM although the CPU lists AMX (LLAMACPP_CMAKE_ARGS="-DGGML_NATIVE=ON"
# turns it on). The flags are the cache key: each kind of CPU that reads the cache gets a wheel of
# its own. Exits non-zero when it cannot build; the llamacpp tests then skip (nothing else depends
# on llama_cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
VER=${LLAMACPP_VERSION:-0.3.36}
CACHE=${AGENTSERVE_CACHE_DIR:-$HOME/.cache/agentserve}
WHEELS=$CACHE/wheels
WORK=$CACHE/llamacpp-$VER
TOOLS=0
[ "${1:-}" = "--tools" ] && TOOLS=1
CPUINFO=${AGENTSERVE_CPUINFO:-/proc/cpuinfo}
if [ "$(uname -m)" = x86_64 ]; then
  default_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  flags=" $(grep -m1 '^flags' "$CPUINFO" 2>/dev/null || true) "
  has() { case "$flags" in *" $1 "*) return 0 ;; esac; return 1; }
  if has avx512f && has avx512bw && has avx512vl && has avx512dq && has avx512cd; then
    default_args="$default_args -DGGML_AVX512=ON"
    has avx512vbmi && default_args="$default_args -DGGML_AVX512_VBMI=ON"
    has avx512_vnni && default_args="$default_args -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && default_args="$default_args -DGGML_AVX512_BF16=ON"
  fi
  if has avx_vnni; then default_args="$default_args -DGGML_AVX_VNNI=ON"; fi
else
  default_args="-DGGML_NATIVE=OFF"
fi
ARGS="${LLAMACPP_CMAKE_ARGS:-$default_args} -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
tag=$(echo "$VER $ARGS" | sha256sum | cut -c1-12)
if [ "${1:-}" = "--print-args" ]; then
  echo "$ARGS"
  echo "$tag"
  exit 0
fi
WHEELS=$WHEELS/$tag  # a wheel per (version, flags): the flags follow the CPU
mkdir -p "$WHEELS" "$WORK"
log=$WORK/build.log

mark=$("$PY" -c 'import sys; print(sys.prefix)')/llama_cpp_python.tag  # which wheel the venv holds
installed() {
  [ "$(cat "$mark" 2>/dev/null)" = "$tag" ] && "$PY" - "$VER" <<'PY' 2>/dev/null
import sys, llama_cpp
sys.exit(0 if llama_cpp.__version__ == sys.argv[1] else 1)
PY
}

wheel=$(ls "$WHEELS"/llama_cpp_python-"$VER"-*.whl 2>/dev/null | head -n1 || true)  # the folder is the key
t0=$(date +%s)
if [ -z "$wheel" ]; then
  echo "agentserve: building llama-cpp-python $VER from source (first time ~10 min; log: $log)" >&2
  (cd "$WORK" && [ -f "llama_cpp_python-$VER.tar.gz" ] ||
    "$PY" -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VER" -d .) >>"$log" 2>&1
  # an extracted source tree and a build-dir per flags key, kept: a wheel rebuilt with the same
  # flags (its cached file deleted) recompiles only what changed. --tools builds apart (below).
  rm -rf "$WORK/src" && mkdir -p "$WORK/src" && tar xzf "$WORK/llama_cpp_python-$VER.tar.gz" -C "$WORK/src"
  if ! CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    "$PY" -m pip wheel --no-deps -w "$WHEELS" \
    --config-settings=build-dir="$WORK/build-$tag" "$WORK/src/llama_cpp_python-$VER" >>"$log" 2>&1; then
    echo "agentserve: llama-cpp-python build failed (tail of $log):" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  wheel=$(ls "$WHEELS"/llama_cpp_python-"$VER"-*.whl | head -n1)
  echo "agentserve: built $(basename "$wheel") in $(( $(date +%s) - t0 )) s" >&2
fi
if ! installed; then
  "$PY" -m pip install -q --no-deps --force-reinstall "$wheel" >>"$log" 2>&1
  "$PY" -m pip install -q "diskcache>=5.6.1" >>"$log" 2>&1
  echo "$tag" >"$mark"
  echo "agentserve: installed $(basename "$wheel")" >&2
fi
if [ "$TOOLS" = 1 ]; then
  # a build of its own from the same sdist and flags: the wheel's build-dir points at pip's
  # temporary copy of the source, gone once the wheel is built. No web UI (it would download a
  # prebuilt one), no HTTPS/curl: the benchmark peer needs neither.
  tools=$WORK/tools-build
  if [ "$(cat "$tools/agentserve.tag" 2>/dev/null)" != "$tag" ]; then
    rm -rf "$tools"  # none yet, or built with other flags
  fi
  if [ ! -x "$tools/bin/llama-server" ] || [ ! -x "$tools/bin/llama-quantize" ]; then
    echo "agentserve: building llama-server and llama-quantize (first time ~13 min on 2 cores; log: $WORK/tools.log)" >&2
    t1=$(date +%s)
    src=$WORK/tools-src/llama_cpp_python-$VER/vendor/llama.cpp
    if [ ! -f "$src/CMakeLists.txt" ]; then
      rm -rf "$WORK/tools-src" && mkdir -p "$WORK/tools-src"
      tar xzf "$WORK/llama_cpp_python-$VER.tar.gz" -C "$WORK/tools-src"
    fi
    gen=""
    command -v ninja >/dev/null && gen="-G Ninja"
    # shellcheck disable=SC2086  # ARGS and gen are lists of flags
    if ! { cmake -S "$src" -B "$tools" $gen -DCMAKE_BUILD_TYPE=Release $ARGS -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_CURL=OFF && cmake --build "$tools" -j "$(nproc)" --target llama-server llama-quantize; } \
      >>"$WORK/tools.log" 2>&1; then
      echo "agentserve: llama-server build failed (tail of $WORK/tools.log):" >&2
      tail -n 20 "$WORK/tools.log" >&2
      exit 1
    fi
    echo "$tag" >"$tools/agentserve.tag"
    echo "agentserve: built llama-server and llama-quantize in $(( $(date +%s) - t1 )) s" >&2
  fi
  echo "$tools/bin"
fi
