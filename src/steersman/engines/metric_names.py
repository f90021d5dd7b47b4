"""Which Prometheus samples mean what, per engine kind.

* vLLM: ``vllm/v1/metrics/loggers.py`` (counters gain ``_total`` in the exposition).
  engine-sim exposes exactly vLLM's names.
* SGLang: ``python/sglang/srt/metrics/collector.py`` (``SchedulerMetricsCollector``:
  ``num_running_reqs``, ``num_queue_reqs``, ``token_usage`` (a 0..1 ratio),
  ``max_total_num_tokens``; ``TokenizerMetricsCollector``: ``prompt_tokens_total``
  (whole prompts) and ``cached_tokens_total`` (prompt tokens served from the radix
  cache, one series per ``cache_source`` in recent versions: summed)).
* llama.cpp: ``tools/server/server-task.cpp`` (``server_task_result_metrics::to_metrics``):
  ``requests_processing``, ``requests_deferred``, ``prompt_tokens_total`` (processed,
  *excluding* cached) and ``prompt_tokens_cached_total``; it exposes no KV usage,
  which :mod:`steersman.engines.llamacpp` reads from ``/slots``.

One page may speak for several engines with a KV pool each: vLLM's data parallel API server
labels every sample ``engine="0"``, ``"1"``, ... (``PrometheusStatLogger(engine_indexes)``, the
cache_config_info gauge too), SGLang ``dp_rank`` (``scheduler_metrics_mixin.init_metrics``, with
``--dp-size`` > 1).  Counts add up over them; the usage ratio and the capacity do not
(:func:`steersman.engines.openai_http.parse_metrics`).  One engine may also repeat its figures: SGLang with
``--enable-metrics-for-all-schedulers`` has every tensor-parallel rank report the same batch (the series differ
in ``tp_rank`` only), so the running, waiting and usage gauges are read one figure per engine (the mean of its
series), never summed within one.

vLLM renamed samples in 0.9.2 (``loggers.py``: "Deprecated in 0.9.2 - Renamed"): ``gpu_cache_usage_perc`` is
``kv_cache_usage_perc``, ``gpu_prefix_cache_{queries,hits}`` are ``prefix_cache_*``; an older engine's page is
read through :attr:`MetricNames.legacy` (the old name of a field, read when its new one is absent).

``progress`` is a counter (or the sum of a few) that advances while the engine computes, whoever the work is for:
the outlier detector's live sign that a replica is not hung when none of the gateway's streams there shows an
event (its requests there are whole responses, or wait behind them).  vLLM counts ``generation_tokens_total`` at
every engine step that decodes and ``prompt_tokens_total`` when a prompt's prefill is done
(``PrometheusStatLogger.record`` of each step's ``IterationStats``: a long chunked prefill with nothing decoding
beside it moves neither until it ends, which the stall rule's allowance for a predicted TTFT covers);
llama.cpp's ``tokens_predicted_total`` moves only when a request ends (``on_prediction`` at the slot's release),
its ``n_decode_total`` at every ``llama_decode`` call (``on_decoded``: a recorded busy page reads 8 decode calls and
0 predicted tokens); SGLang's ``realtime_tokens_total`` (per ``mode``, since 2025) moves every decode log interval
(``--decode-log-interval``, 40 steps), ``generation_tokens_total`` at a request's end.  The counters are summed
over the engines one page speaks for (data parallelism): one hung engine among working ones shows no stall here.

vLLM's sleep mode (``--enable-sleep-mode``, ``POST /sleep?level=1|2``) leaves the replica answering ``/health`` and
``/metrics`` with its weights offloaded or discarded: ``vllm:engine_sleep_state`` (``loggers.py``, since vLLM PR
#24176, outside dev mode since #27867) is a one-hot gauge per engine labelled ``sleep_state`` = ``awake`` |
``weights_offloaded`` | ``discard_all``; a replica with a sleeping engine reads as cold weights
(:attr:`MetricNames.sleep_family`; an older vLLM without it is asked ``GET /is_sleeping``, see
:mod:`steersman.engines.openai_http`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from collections.abc import Mapping

__all__ = ["MetricNames", "METRIC_NAMES", "PER_ENGINE"]

#: the fields that are one figure per engine: summed over engines (usage: averaged), never within one
PER_ENGINE = frozenset({"num_running", "num_waiting", "kv_usage"})
_NONE: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class MetricNames:
    samples: Mapping[str, str]  # sample name -> EngineMetrics field
    weights_family: str | None = None  # one-hot gauge labelled state=cold|loading|warm
    cache_info_family: str | None = None  # info gauge with a num_gpu_blocks label
    kv_usage_is_percent: bool = False
    kv_capacity_tokens: str | None = None  # gauge: KV capacity in tokens (converted to blocks)
    #: one-hot gauge per engine labelled sleep_state=awake|weights_offloaded|discard_all (vLLM's sleep mode): a
    #: sleeping engine makes the replica's weights cold; an awake one, warm (unless weights_family says otherwise)
    sleep_family: str | None = None
    #: the engine serves ``/metrics`` through prometheus_client, which restricts the page to the samples named
    #: in ``name[]`` query parameters (``exposition._bake_output``): the gateway asks for :meth:`scraped` only
    filterable: bool = False
    #: the label telling apart the engines (each with its own KV pool) that one page speaks for
    engine_label: str | None = None
    #: field -> the sample name an older version of the engine gave it, read when the page lacks the current one
    legacy: Mapping[str, str] = field(default_factory=lambda: _NONE)
    #: derived: the samples summed over every label set (sample -> field), and the per-engine ones (field -> sample)
    summed: Mapping[str, str] = field(init=False, repr=False, compare=False)
    per_engine: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "summed", MappingProxyType(
            {s: f for s, f in self.samples.items() if f not in PER_ENGINE}))
        object.__setattr__(self, "per_engine", MappingProxyType(
            {f: s for s, f in self.samples.items() if f in PER_ENGINE}))

    def scraped(self) -> tuple[str, ...]:
        """Every sample name the gateway reads."""
        extra = (self.weights_family, self.sleep_family, self.cache_info_family, self.kv_capacity_tokens)
        return (*self.samples, *(n for n in extra if n), *self.legacy.values())


_VLLM = MetricNames(
    MappingProxyType(
        {
            "vllm:num_requests_running": "num_running",
            "vllm:num_requests_waiting": "num_waiting",
            "vllm:kv_cache_usage_perc": "kv_usage",
            "vllm:prefix_cache_queries_total": "prefix_queries",
            "vllm:prefix_cache_hits_total": "prefix_hits",
            "vllm:prompt_tokens_total": "progress",
            "vllm:generation_tokens_total": "progress",
        }
    ),
    weights_family="steersman_sim:weights_state",
    sleep_family="vllm:engine_sleep_state",
    cache_info_family="vllm:cache_config_info",
    engine_label="engine",
    legacy=MappingProxyType(
        {
            "kv_usage": "vllm:gpu_cache_usage_perc",  # vLLM <= 0.9.1
            "prefix_queries": "vllm:gpu_prefix_cache_queries_total",
            "prefix_hits": "vllm:gpu_prefix_cache_hits_total",
        }
    ),
    filterable=True,  # vllm/v1/metrics: prometheus_client's make_asgi_app on /metrics; engine-sim does the same
)

_SGLANG = MetricNames(
    MappingProxyType(
        {
            "sglang:num_running_reqs": "num_running",
            "sglang:num_queue_reqs": "num_waiting",
            "sglang:token_usage": "kv_usage",
            "sglang:prompt_tokens_total": "prefix_queries",
            "sglang:cached_tokens_total": "prefix_hits",
            "sglang:realtime_tokens_total": "progress",
            "sglang:generation_tokens_total": "progress",
        }
    ),
    kv_capacity_tokens="sglang:max_total_num_tokens",
    engine_label="dp_rank",
    filterable=True,  # prometheus_client's make_asgi_app too (multiprocess mode: an empty page, see the adapter)
)

_LLAMACPP = MetricNames(
    MappingProxyType(
        {
            "llamacpp:requests_processing": "num_running",
            "llamacpp:requests_deferred": "num_waiting",
            "llamacpp:prompt_tokens_total": "prompt_processed",  # excludes cached tokens
            "llamacpp:prompt_tokens_cached_total": "prefix_hits",
            # the engine's own timing of its work (per slot, summed): seconds per computed prompt token
            # and per generated token, what a request there sees (steersman.fleet.state learns them)
            "llamacpp:prompt_seconds_total": "prefill_seconds",
            "llamacpp:tokens_predicted_seconds_total": "decode_seconds",
            "llamacpp:tokens_predicted_total": "decode_tokens",
            "llamacpp:n_decode_total": "progress",  # every llama_decode call (tokens_predicted_total: at the end)
        }
    ),
)

METRIC_NAMES: Mapping[str, MetricNames] = MappingProxyType(
    {
        "vllm": _VLLM,
        "engine-sim": _VLLM,
        "sglang": _SGLANG,
        "llamacpp": _LLAMACPP,
        # unknown OpenAI-compatible servers: try vLLM's names, absent ones read as 0; the whole page (a server
        # may not serve a query string)
        "openai": replace(_VLLM, filterable=False),
    }
)
