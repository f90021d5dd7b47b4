"""Which Prometheus samples mean what, per engine kind.

vLLM names are from ``vllm/v1/metrics/loggers.py`` (counters gain ``_total`` in
the exposition).  engine-sim exposes exactly vLLM's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from collections.abc import Mapping

__all__ = ["MetricNames", "METRIC_NAMES"]


@dataclass(frozen=True, slots=True)
class MetricNames:
    samples: Mapping[str, str]  # sample name -> EngineMetrics field
    weights_family: str | None = None  # one-hot gauge labelled state=cold|loading|warm
    cache_info_family: str | None = None  # info gauge with a num_gpu_blocks label
    kv_usage_is_percent: bool = False


_VLLM = MetricNames(
    MappingProxyType(
        {
            "vllm:num_requests_running": "num_running",
            "vllm:num_requests_waiting": "num_waiting",
            "vllm:kv_cache_usage_perc": "kv_usage",
            "vllm:prefix_cache_queries_total": "prefix_queries",
            "vllm:prefix_cache_hits_total": "prefix_hits",
        }
    ),
    weights_family="steersman_sim:weights_state",
    cache_info_family="vllm:cache_config_info",
)

METRIC_NAMES: Mapping[str, MetricNames] = MappingProxyType(
    {
        "vllm": _VLLM,
        "engine-sim": _VLLM,
        "openai": _VLLM,  # unknown OpenAI-compatible servers: try vLLM's names, absent ones read as 0
    }
)
