"""Engine adapters: the gateway's edge towards inference engines."""

from steersman.engines.base import EngineAdapter, EngineMetrics, Exchange, ReplicaAddress, UpstreamError
from steersman.engines.llamacpp import LlamaCppAdapter
from steersman.engines.openai_http import OpenAIHttpAdapter
from steersman.plugins import Registry

__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "EngineMetrics",
    "LlamaCppAdapter",
    "OpenAIHttpAdapter",
    "ReplicaAddress",
    "UpstreamError",
    "Exchange",
    "adapter_for",
]

#: Engine kinds by name; each factory takes the kind name (and the keywords settings=GatewaySettings, now=the
#: gateway clock's now) and returns an adapter.
ADAPTERS: Registry = Registry("engine adapter", EngineAdapter)
for _kind in ("openai", "vllm", "sglang", "engine-sim"):
    ADAPTERS.register(_kind, OpenAIHttpAdapter)  # metric names per kind: steersman.engines.metric_names
ADAPTERS.register("llamacpp", LlamaCppAdapter)  # llama-server: llamacpp:* metrics + /slots


def adapter_for(kind: str, **kwargs) -> EngineAdapter:
    return ADAPTERS.build(kind, kind, **kwargs)
