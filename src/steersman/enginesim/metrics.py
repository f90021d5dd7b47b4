"""Prometheus metrics of the simulated engine, with vLLM v1's names and buckets.

Names, label names (``model_name``, ``engine``) and histogram buckets follow
``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger), so an adapter written for
engine-sim reads a real vLLM unchanged.  Gauges and counters that mirror engine
state are produced at scrape time from :meth:`EngineModel.state`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from steersman.sim import EngineState

__all__ = ["SimMetrics"]

_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_REQ = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_ITER = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_WEIGHTS = ("cold", "loading", "warm")


def _buckets_125(max_value: int) -> tuple[int, ...]:
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp += 1


class _StateCollector:
    def __init__(self, labels: tuple[str, str], state: Callable[[], EngineState], info: dict[str, str]) -> None:
        self._labels = list(labels)
        self._state = state
        self._info = info

    def collect(self):
        s = self._state()
        names = ["model_name", "engine"]
        lv = self._labels

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(lv, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(lv, value)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage)
        yield gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (deprecated name).", s.kv_usage)
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.prefix_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.num_preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens_total)
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(self._info))
        info.add_metric(list(self._info.values()), 1.0)
        yield info
        w = GaugeMetricFamily("steersman_sim:weights_state", "Weights state of the replica (1 for the current state).", labels=names + ["state"])
        for name in _WEIGHTS:
            w.add_metric(lv + [name], 1.0 if s.weights.value == name else 0.0)
        yield w
        yield gauge("steersman_sim:kv_blocks_total", "KV-cache blocks of the replica.", s.kv_blocks_total)


class SimMetrics:
    """The registry one engine-sim server exposes on ``/metrics``."""

    def __init__(self, model_name: str, state: Callable[[], EngineState], max_model_len: int, info: dict[str, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        names = ["model_name", "engine"]
        lv = (model_name, "0")
        r = self.registry

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(*lv)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", _ITL)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _REQ)
        self.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _REQ)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _REQ)
        self.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _REQ)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", _ITER)
        b = _buckets_125(max_model_len)
        self.prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", b)
        self.generation_tokens = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", b)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.", names + ["finished_reason"], registry=r)
        self.success = {k: self._success.labels(*lv, k) for k in ("stop", "length", "abort")}
        r.register(_StateCollector(lv, state, info))

    def render(self) -> bytes:
        return generate_latest(self.registry)
