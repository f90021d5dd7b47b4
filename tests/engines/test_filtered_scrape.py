"""Scrapes ask prometheus_client engines for the samples the gateway reads only (``/metrics?name[]=...``).

Against prometheus_client's own HTTP server over 127.0.0.1 (the library vLLM and SGLang serve ``/metrics``
with): a registry of vLLM's names answers the filtered page, read the same as the whole one; a registry that
cannot restrict its page (a collector that describes no names, as prometheus_client's multiprocess collector)
answers it empty, and the adapter goes back to the whole page for that replica, for good.  engine-sim
restricts its page the same way.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import unquote

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from steersman.enginesim.app import SimServerConfig
from steersman.engines import OpenAIHttpAdapter
from steersman.engines.base import ReplicaAddress
from steersman.engines.metric_names import METRIC_NAMES
from steersman.engines.openai_http import metrics_path, parse_metrics
from steersman.testing import LiveFleet

LAB = ("model_name", "engine")


def _vllm_registry() -> CollectorRegistry:
    r = CollectorRegistry()
    for name, v in (("vllm:num_requests_running", 3), ("vllm:num_requests_waiting", 2), ("vllm:kv_cache_usage_perc", 0.5)):
        Gauge(name, name, LAB, registry=r).labels("m", "0").set(v)
    Counter("vllm:prefix_cache_queries", "q", LAB, registry=r).labels("m", "0").inc(100)
    Counter("vllm:prefix_cache_hits", "h", LAB, registry=r).labels("m", "0").inc(40)
    Gauge("vllm:cache_config_info", "i", ["num_gpu_blocks", "block_size"], registry=r).labels("64", "16").set(1)
    Histogram("vllm:time_to_first_token_seconds", "t", LAB, registry=r).labels("m", "0").observe(0.1)
    return r


class _Undescribed:
    """Collects vLLM's running gauge but describes no names (prometheus_client's MultiProcessCollector)."""

    def collect(self):
        g = GaugeMetricFamily("vllm:num_requests_running", "running", labels=list(LAB))
        g.add_metric(["m", "0"], 7.0)
        yield g


@pytest.fixture()
def sim():
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], with_gateway=False) as lf:
        yield lf


def _logged(paths: list[str], n: int) -> list[str]:
    """``paths`` once the server has logged ``n`` requests: a handler thread per request logs it after answering,
    so the client can be back before the line is there, and lines can come out of order (seen in CI under load)."""
    deadline = time.monotonic() + 10.0
    while len(paths) < n and time.monotonic() < deadline:
        time.sleep(0.001)
    return paths


def _scrape(adapter: OpenAIHttpAdapter, url: str, times: int = 1):
    async def go():
        try:
            return [await adapter.scrape(ReplicaAddress("r0", url)) for _ in range(times)]
        finally:
            await adapter.close()
    return asyncio.run(go())


def test_a_vllm_registry_serves_the_filtered_page_and_it_reads_as_the_whole_one(serve):
    url, paths = serve(_vllm_registry())
    names = METRIC_NAMES["vllm"]
    filtered = httpx.get(url + metrics_path(names)).text
    whole = httpx.get(url + "/metrics").text
    assert "time_to_first_token" in whole and "time_to_first_token" not in filtered and len(filtered) < len(whole) / 2
    assert parse_metrics(filtered, names) == parse_metrics(whole, names)
    m = _scrape(OpenAIHttpAdapter("vllm"), url)[0]
    assert (m.num_running, m.num_waiting, m.kv_usage, m.prefix_queries, m.prefix_hits) == (3, 2, 0.5, 100, 40)
    assert m.kv_blocks_total == 64
    filtered_path, logged = unquote(metrics_path(names)), sorted(unquote(p) for p in _logged(paths, 4))
    # the scrape: the filtered page, and (the page has no vllm:engine_sleep_state) one GET /is_sleeping, which this
    # server answers with its page (not vLLM's answer: asked again only a minute later)
    assert logged == sorted([filtered_path, "/metrics", filtered_path, "/is_sleeping"])


def test_a_registry_that_cannot_filter_is_scraped_whole_from_then_on(serve):
    r = CollectorRegistry()
    r.register(_Undescribed())
    url, paths = serve(r)
    assert "vllm:num_requests_running" not in httpx.get(url + metrics_path(METRIC_NAMES["vllm"])).text  # empty
    _logged(paths, 1)
    paths.clear()
    first, second = _scrape(OpenAIHttpAdapter("vllm"), url, times=2)
    assert first.num_running == second.num_running == 7.0
    got = sorted(p.split("?")[0] + ("?" if "?" in p else "") for p in _logged(paths, 4))  # (a thread per request)
    assert got == ["/is_sleeping", "/metrics", "/metrics", "/metrics?"]  # filtered once, whole from then on (and
    # the sleep state asked once: the page has none, and what answers is not vLLM's /is_sleeping)


def test_kinds_that_cannot_filter_are_asked_for_the_whole_page():
    assert metrics_path(METRIC_NAMES["llamacpp"]) == metrics_path(METRIC_NAMES["openai"]) == "/metrics"


def test_engine_sim_restricts_its_page_like_prometheus_client(sim):
    url = sim.sims[0].url
    whole = httpx.get(url + "/metrics").text
    some = httpx.get(url + "/metrics", params=[("name[]", "vllm:num_requests_running"),
                                               ("name[]", "vllm:time_to_first_token_seconds_count")]).text
    assert some.count("# HELP") == 2 and "vllm:num_requests_running{" in some
    assert "vllm:time_to_first_token_seconds_bucket" in some and "vllm:kv_cache_usage_perc" not in some
    names = METRIC_NAMES["engine-sim"]
    assert parse_metrics(httpx.get(url + metrics_path(names)).text, names) == parse_metrics(whole, names)
    assert httpx.get(url + "/metrics", params={"name[]": "nothing"}).text == ""
