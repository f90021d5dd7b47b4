#!/usr/bin/env bash
# Create bench/.venv-peers with the Rust peer routers used by bench/overhead (idempotent).
# Separate from the project venv: they pull fastapi/uvicorn/requests/... that the product does not use.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${PEERS_VENV:-$here/.venv-peers}"
py="${PYTHON:-python3}"
want_vllm="vllm-router==0.1.17"
want_sglang="sglang-router==0.3.2"
if [ -x "$venv/bin/vllm-router" ] && [ -x "$venv/bin/sglang-router" ]; then
  have="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-router"), m.version("sglang-router"))' 2>/dev/null || true)"
  if [ "$have" = "0.1.17 0.3.2" ]; then echo "peers venv ok: $venv"; exit 0; fi
fi
"$py" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$want_vllm" "$want_sglang"
echo "peers venv ready: $venv"
