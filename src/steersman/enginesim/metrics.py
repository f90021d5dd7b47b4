"""Prometheus metrics of the simulated engine, with vLLM v1's names and buckets.

Names, label names (``model_name``, ``engine``) and histogram buckets follow
``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger), so an adapter written for
engine-sim reads a real vLLM unchanged.  Gauges and counters that mirror engine
state are produced at scrape time from :meth:`EngineModel.state`.

The gateway scrapes every 50 ms, so the exposition is rendered directly from
lock-free histograms (~0.1 ms) rather than through prometheus_client's generic
collector path (~3 ms a scrape, 5% of a core per replica at 20 Hz).  Like vLLM's page
(prometheus_client's ``make_asgi_app``), ``/metrics?name[]=S&name[]=T`` holds only the families with a
sample named S or T (:func:`wanted`): the gateway asks for the few it reads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from urllib.parse import parse_qs

from steersman.obs.histogram import FastHistogram
from steersman.sim import EngineState

__all__ = ["SimMetrics", "wanted"]

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


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@functools.lru_cache(maxsize=64)
def wanted(query: str) -> frozenset[str] | None:
    """The sample names a ``/metrics`` query string restricts the page to (prometheus_client's ``name[]``), or
    None for the whole page."""
    names = parse_qs(query).get("name[]")
    return frozenset(names) if names else None


class _Hist:
    __slots__ = ("name", "doc", "h", "lines")

    def __init__(self, name: str, doc: str, buckets, labels: str) -> None:
        self.name, self.doc = name, doc
        self.h = FastHistogram(buckets)
        self.lines = [f'{name}_bucket{{{labels},le="{le}"}} ' for le, _ in self.h.cumulative()]
        self.lines.append(labels)

    def observe(self, v: float) -> None:
        self.h.observe(v)

    def render(self, out: list[str]) -> None:
        n, labels = self.name, self.lines[-1]
        out.append(f"# HELP {n} {self.doc}\n# TYPE {n} histogram\n")
        total = 0
        counts = self.h.counts
        for prefix, c in zip(self.lines, counts):
            total += c
            out.append(f"{prefix}{total}.0\n")
        out.append(f"{n}_sum{{{labels}}} {self.h.sum!r}\n{n}_count{{{labels}}} {total}.0\n")


class _Counter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, n: int = 1) -> None:
        self.value += n


class SimMetrics:
    """What one engine-sim server exposes on ``/metrics``."""

    def __init__(self, model_name: str, state: Callable[[], EngineState], max_model_len: int, info: dict[str, str]) -> None:
        self._state = state
        self._labels = f'engine="0",model_name="{_esc(model_name)}"'
        self._info = ",".join(f'{k}="{_esc(v)}"' for k, v in info.items())
        lab = self._labels

        def hist(name: str, doc: str, buckets) -> _Hist:
            h = _Hist(name, doc, buckets, lab)
            self._hists.append(h)
            return h

        self._hists: list[_Hist] = []
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL)
        # vLLM v1 observes its time per output token at every token (iteration_stats.time_per_output_tokens_iter),
        # the inter-token latency under its older name (0.11 keeps it as a deprecated alias); the request's mean
        # is vllm:request_time_per_output_token_seconds (an engine-sim audit: it was the request's mean, once a request)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", _ITL)
        self.request_tpot = hist("vllm:request_time_per_output_token_seconds",
                                 "Histogram of time_per_output_token_seconds per request.", _ITL)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _REQ)
        self.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _REQ)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _REQ)
        self.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _REQ)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", _ITER)
        b = _buckets_125(max_model_len)
        self.prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", b)
        self.generation_tokens = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", b)
        self.success = {k: _Counter() for k in ("stop", "length", "abort")}
        #: vLLM's sleep mode: 0 awake, 1 weights offloaded, 2 weights discarded (``vllm:engine_sleep_state``)
        self.sleep_level = 0

    def render(self, only: frozenset[str] | None = None) -> bytes:
        """The page; ``only``: just the families with a sample of these names (:func:`wanted`)."""
        s = self._state()
        lab = self._labels
        out: list[str] = []

        def want(*samples: str) -> bool:
            return only is None or not only.isdisjoint(samples)

        def one(kind: str, name: str, doc: str, value: float) -> None:
            if want(name):
                out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name}{{{lab}}} {float(value)!r}\n")

        one("gauge", "vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running)
        one("gauge", "vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
        if want("vllm:engine_sleep_state"):  # vLLM renders it always (awake = 1 until a POST /sleep)
            out.append("# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; "
                       "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
                       "discard_all = 1 means sleep level 2.\n# TYPE vllm:engine_sleep_state gauge\n")
            level = self.sleep_level
            for state, at in (("awake", 0), ("weights_offloaded", 1), ("discard_all", 2)):
                out.append(f'vllm:engine_sleep_state{{{lab},sleep_state="{state}"}} {1.0 if level == at else 0.0}\n')
        one("gauge", "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage)
        one("gauge", "vllm:gpu_cache_usage_perc", "GPU KV-cache usage (deprecated name).", s.kv_usage)
        for name, doc, v in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.prefix_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.num_preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total),
            ("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens_total),
        ):
            if want(f"{name}_total"):
                out.append(f"# HELP {name}_total {doc}\n# TYPE {name}_total counter\n{name}_total{{{lab}}} {float(v)!r}\n")
        if want("vllm:request_success_total"):
            out.append("# HELP vllm:request_success_total Count of successfully processed requests.\n"
                       "# TYPE vllm:request_success_total counter\n")
            for reason, c in self.success.items():
                out.append(f'vllm:request_success_total{{{lab},finished_reason="{reason}"}} {float(c.value)!r}\n')
        if want("vllm:cache_config_info"):
            out.append(f"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                       f"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{self._info}}} 1.0\n")
        if want("steersman_sim:weights_state"):
            out.append("# HELP steersman_sim:weights_state Weights state of the replica (1 for the current state).\n"
                       "# TYPE steersman_sim:weights_state gauge\n")
            for w in _WEIGHTS:
                out.append(f'steersman_sim:weights_state{{{lab},state="{w}"}} {1.0 if s.weights.value == w else 0.0}\n')
        one("gauge", "steersman_sim:kv_blocks_total", "KV-cache blocks of the replica.", s.kv_blocks_total)
        for h in self._hists:
            if want(f"{h.name}_bucket", f"{h.name}_sum", f"{h.name}_count"):
                h.render(out)
        return "".join(out).encode()
