"""Settings of ``steersman engine-sim`` (one simulated replica served over HTTP)."""

from __future__ import annotations

from dataclasses import dataclass

from steersman.config._base import check_bounds, setting

__all__ = ["SimServerSettings"]


@dataclass(frozen=True, slots=True)
class SimServerSettings:
    host: str = setting("127.0.0.1", "loopback by default")
    port: int = setting(8000, "vLLM's OpenAI server default port", le=65535)
    speedup: float = setting(1.0, "real time unless asked; --speedup divides every delay", gt=0)
    mean_output_tokens: float = setting(
        211.0, "mean GeneratedTokens of the Azure LLM 2023 conversation trace (19,366 requests; Splitwise ISCA'24)", gt=0
    )
    gpu: str = setting("H100-SXM", "issue #2 example: --gpu H100")
    model: str = setting("llama-3.1-8b", "issue #2 example: --model llama-3.1-8b")
    kv_events_hwm: int = setting(100_000, "vLLM KVEventsConfig.hwm: the KV events PUB socket's high-water mark", ge=1)
    kv_events_buffer_steps: int = setting(
        10_000, "vLLM KVEventsConfig.buffer_steps: KV event batches kept for replay (--kv-events-replay-endpoint)", ge=1)

    completion_max_tokens: int = setting(
        16, "vLLM CompletionRequest.max_tokens default: what /v1/completions without max_tokens generates at most", ge=1)
    fleet_max_replicas: int = setting(
        256, "design: `steersman up` / `serve` start each replica of a fleet file's simulated: section as its own "
        "engine-sim process (~200 MB resident): at most 256 in all (~50 GB); 100,000 were accepted and OOM-killed a "
        "24 GB machine.  The digital twin (`steersman simulate`, `plan`) models its replicas in-process: no cap", ge=1)

    def __post_init__(self) -> None:
        check_bounds(self)
        if not self.host.strip():  # asyncio would listen on every interface
            raise ValueError("host must be an address or a host name (an empty one listens on every interface)")
