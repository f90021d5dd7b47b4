#!/usr/bin/env python
"""bench/scrape: what one metrics scrape costs the engine and the gateway, whole page vs ``name[]``-filtered.

The gateway scrapes every replica every 50 ms (``gateway.metrics_interval_s``).  Engines that serve
``/metrics`` through prometheus_client (vLLM, SGLang) restrict the page to the samples named in ``name[]``
query parameters, and the gateway asks for the ones it reads (``steersman.engines.openai_http.metrics_path``).
Side by side in one run, each the best of ``--rounds`` timings:

* prometheus_client rendering a registry with vLLM v1's families (gauges, counters, cache info and its 11
  histograms with vLLM's buckets, one label set): the whole page vs the filtered one;
* engine-sim rendering its page, whole vs filtered;
* the gateway's parse of the whole page vs the filtered one (the bytes it reads per scrape too).

    .venv/bin/python bench/scrape/run.py [--rounds 5] [--number 500]
"""

from __future__ import annotations

import argparse
import timeit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import _bake_output

from steersman.engines.metric_names import METRIC_NAMES
from steersman.engines.openai_http import metrics_path, parse_metrics
from steersman.enginesim import metrics as M
from steersman.config import DEFAULTS
from steersman.sim import EngineModel, gpu_profile, model_profile

LAB = ["model_name", "engine"]
HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", M._TTFT), ("vllm:inter_token_latency_seconds", M._ITL),
    ("vllm:time_per_output_token_seconds", M._ITL), ("vllm:e2e_request_latency_seconds", M._REQ),
    ("vllm:request_queue_time_seconds", M._REQ), ("vllm:request_prefill_time_seconds", M._REQ),
    ("vllm:request_decode_time_seconds", M._REQ), ("vllm:request_inference_time_seconds", M._REQ),
    ("vllm:iteration_tokens_total", M._ITER), ("vllm:request_prompt_tokens", M._buckets_125(131072)),
    ("vllm:request_generation_tokens", M._buckets_125(131072)),
)


def vllm_like_registry() -> CollectorRegistry:
    r = CollectorRegistry()
    for n in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        Gauge(n, n, LAB, registry=r).labels("m", "0").set(1)
    for n in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens"):
        Counter(n, n, LAB, registry=r).labels("m", "0").inc(5)
    Gauge("vllm:cache_config_info", "info", ["num_gpu_blocks", "block_size"], registry=r).labels("4096", "16").set(1)
    for n, b in HISTOGRAMS:
        Histogram(n, n, LAB, buckets=b, registry=r).labels("m", "0").observe(0.1)
    return r


def best(fn, rounds: int, number: int) -> float:
    """Microseconds a call, the best of ``rounds`` timings of ``number`` calls."""
    return min(timeit.repeat(fn, repeat=rounds, number=number)) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--number", type=int, default=500)
    a = ap.parse_args()
    names = METRIC_NAMES["vllm"]
    only = {"name[]": list(names.scraped())}
    print(f"the filtered scrape asks for {len(names.scraped())} samples: {metrics_path(names)[:90]}...")
    rows = []

    reg = vllm_like_registry()
    whole, some = _bake_output(reg, "text/plain", None, {}, True)[2], _bake_output(reg, "text/plain", None, only, True)[2]
    rows.append(("prometheus_client renders (vLLM's families)", len(whole), len(some),
                 best(lambda: _bake_output(reg, "text/plain", None, {}, True), a.rounds, a.number),
                 best(lambda: _bake_output(reg, "text/plain", None, only, True), a.rounds, a.number)))

    engine = EngineModel(gpu=gpu_profile("H100"), model=model_profile("llama-3.1-8b"), settings=DEFAULTS.engine,
                         warm=True, now=0.0)
    sim = M.SimMetrics("llama-3.1-8b", lambda: engine.state(0.0), 131072, {"num_gpu_blocks": "4096", "block_size": "16"})
    wanted = M.wanted(metrics_path(names).split("?", 1)[1])
    sw, ss = sim.render(), sim.render(wanted)
    rows.append(("engine-sim renders", len(sw), len(ss), best(sim.render, a.rounds, a.number),
                 best(lambda: sim.render(wanted), a.rounds, a.number)))
    assert parse_metrics(sw.decode(), names) == parse_metrics(ss.decode(), names)
    rows.append(("the gateway parses (engine-sim's page)", len(sw), len(ss),
                 best(lambda: parse_metrics(sw.decode("utf-8", "replace"), names), a.rounds, a.number * 4),
                 best(lambda: parse_metrics(ss.decode("utf-8", "replace"), names), a.rounds, a.number * 4)))

    print(f"{'':42} {'bytes whole':>11} {'filtered':>9} {'us whole':>9} {'filtered':>9} {'ratio':>7}")
    for what, bw, bf, tw, tf in rows:
        print(f"{what:42} {bw:11,} {bf:9,} {tw:9.1f} {tf:9.1f} {tw / tf:6.1f}x")
    print("at 20 scrapes a second (one gateway, 50 ms): prometheus_client's whole page costs the engine's API "
          f"server {rows[0][3] * 20 / 1e4:.2f}% of a core, the filtered one {rows[0][4] * 20 / 1e4:.3f}%")


if __name__ == "__main__":
    main()
