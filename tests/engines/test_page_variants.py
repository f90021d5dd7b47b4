"""Pages the adapter meets beyond one vLLM engine, scraped over 127.0.0.1 like a replica.

* SGLang with --enable-metrics-for-all-schedulers: every tensor-parallel rank reports its engine's batch (series
  differing in ``tp_rank``): running and waiting count once per engine (``dp_rank``), not once per rank;
* vLLM <= 0.9.1 names its KV usage and prefix counters ``gpu_*`` (renamed in 0.9.2): read when the new ones are
  absent, through the filtered scrape too;
* one non-200 answer to the filtered scrape is a failed scrape, not a registry that cannot filter: the next
  scrape is filtered again;
* a label that ``isdigit`` but is no number (``4096²``) is not read as one (was a ValueError out of the scrape).
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import unquote

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from steersman.api.errors import error_body
from steersman.engines import OpenAIHttpAdapter
from steersman.engines.base import ReplicaAddress, UpstreamError
from steersman.engines.metric_names import METRIC_NAMES
from steersman.engines.openai_http import metrics_path, parse_metrics
from steersman.http.server import HttpRequest, HttpServer

SGLANG_LAB = ("model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank")


def _logged(paths: list[str], n: int) -> list[str]:
    deadline = time.monotonic() + 10.0  # a handler thread logs after answering
    while len(paths) < n and time.monotonic() < deadline:
        time.sleep(0.001)
    return [unquote(p) for p in paths]


def _scrape(kind: str, url: str, times: int = 1):
    async def go():
        adapter = OpenAIHttpAdapter(kind)
        try:
            return [await adapter.scrape(ReplicaAddress("r0", url)) for _ in range(times)]
        finally:
            await adapter.close()
    return asyncio.run(go())


def _sglang(ranks: dict[tuple[str, str], tuple[float, float, float]], dp: bool) -> CollectorRegistry:
    """SGLang's scheduler gauges, one series per (dp_rank, tp_rank): (running, queued, token usage)."""
    r = CollectorRegistry()
    lab = SGLANG_LAB if dp else SGLANG_LAB[:-1]
    run = Gauge("sglang:num_running_reqs", "r", lab, registry=r)
    queue = Gauge("sglang:num_queue_reqs", "q", lab, registry=r)
    usage = Gauge("sglang:token_usage", "u", lab, registry=r)
    cap = Gauge("sglang:max_total_num_tokens", "c", lab, registry=r)
    for (d, t), (n, q, u) in ranks.items():
        values = ("m", "unified", t, "0", d) if dp else ("m", "unified", t, "0")
        run.labels(*values).set(n)
        queue.labels(*values).set(q)
        usage.labels(*values).set(u)
        cap.labels(*values).set(16384)
    return r


def test_sglang_tensor_parallel_ranks_report_one_batch(serve):
    url, paths = serve(_sglang({("0", "0"): (4, 6, 0.3), ("0", "1"): (4, 6, 0.3)}, dp=False))
    m = _scrape("sglang", url)[0]
    assert (m.num_running, m.num_waiting) == (4.0, 6.0)  # was 8 and 12: once per rank
    assert m.kv_usage == pytest.approx(0.3) and m.kv_blocks_total == 16384 / 16
    assert _logged(paths, 1)[0] == unquote(metrics_path(METRIC_NAMES["sglang"]))


def test_sglang_data_parallel_ranks_add_up_and_their_tensor_ranks_do_not(serve):
    ranks = {("0", "0"): (2, 1, 0.25), ("0", "1"): (2, 1, 0.25), ("1", "0"): (3, 5, 0.75), ("1", "1"): (3, 5, 0.75)}
    m = _scrape("sglang", serve(_sglang(ranks, dp=True))[0])[0]
    assert (m.num_running, m.num_waiting) == (5.0, 6.0)
    assert m.kv_usage == pytest.approx(0.5) and m.kv_blocks_total == 2 * 16384 / 16


def test_vllm_data_parallel_engines_still_add_up():
    page = "".join(f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {n}\n' for e, n in (("0", 3), ("1", 4)))
    page += "".join(f'vllm:num_requests_waiting{{engine="{e}",model_name="m"}} {n}\n' for e, n in (("0", 1), ("1", 2)))
    m = parse_metrics(page, METRIC_NAMES["vllm"])
    assert (m.num_running, m.num_waiting) == (7.0, 3.0)


def _old_vllm() -> CollectorRegistry:
    """vLLM 0.9.1's V1 names (loggers.py before "Deprecated in 0.9.2 - Renamed")."""
    r = CollectorRegistry()
    lab = ("model_name", "engine")
    Gauge("vllm:num_requests_running", "r", lab, registry=r).labels("m", "0").set(12)
    Gauge("vllm:num_requests_waiting", "w", lab, registry=r).labels("m", "0").set(30)
    Gauge("vllm:gpu_cache_usage_perc", "u", lab, registry=r).labels("m", "0").set(0.97)
    Counter("vllm:gpu_prefix_cache_queries", "q", lab, registry=r).labels("m", "0").inc(50000)
    Counter("vllm:gpu_prefix_cache_hits", "h", lab, registry=r).labels("m", "0").inc(40000)
    Gauge("vllm:cache_config_info", "i", ["num_gpu_blocks", "block_size"], registry=r).labels("64", "16").set(1)
    return r


def test_vllm_before_0_9_2_reads_its_gpu_names_through_the_filtered_scrape(serve):
    url, paths = serve(_old_vllm())
    m = _scrape("vllm", url)[0]
    assert (m.num_running, m.num_waiting, m.kv_usage) == (12.0, 30.0, 0.97)  # usage was 0
    assert (m.prefix_queries, m.prefix_hits) == (50000.0, 40000.0)  # were 0
    assert m.kv_blocks_total == 64
    # the filtered page has them (and no sleep gauge: the replica is asked GET /is_sleeping once)
    assert sorted(_logged(paths, 2)) == sorted([unquote(metrics_path(METRIC_NAMES["vllm"])), "/is_sleeping"])


def test_the_new_names_win_over_the_old_ones():
    page = ('vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:gpu_cache_usage_perc{engine="0"} 0.9\n'
            'vllm:prefix_cache_hits_total{engine="0"} 7\nvllm:gpu_prefix_cache_hits_total{engine="0"} 9\n')
    m = parse_metrics(page, METRIC_NAMES["vllm"])
    assert (m.kv_usage, m.prefix_hits, m.prefix_queries) == (0.5, 7.0, 0.0)


class _Flaky:
    """A /metrics that answers ``statuses`` first (then 200 with a running sample); every path asked."""

    PAGE = b'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.asked: list[str] = []
        self.http = HttpServer(error_body, 1 << 20)
        self.http.route("GET", "/metrics", self._metrics)

    async def _metrics(self, request: HttpRequest) -> None:
        self.asked.append("filtered" if request.query else "whole")
        status = self.statuses.pop(0) if self.statuses else 200
        request.respond(status, self.PAGE if status == 200 else b"upstream restarting", b"text/plain")


def test_a_non_200_filtered_answer_is_a_failed_scrape_and_filtering_goes_on():
    async def go():
        engine = _Flaky([503])
        port = await engine.http.start("127.0.0.1", 0)
        adapter = OpenAIHttpAdapter("vllm")
        rep = ReplicaAddress("r0", f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(UpstreamError, match="503"):
                await adapter.scrape(rep)
            got = [await adapter.scrape(rep) for _ in range(3)]
        finally:
            await adapter.close()
            await engine.http.stop()
        assert [m.num_running for m in got] == [1.0, 1.0, 1.0]
        assert engine.asked == ["filtered"] * 4  # was: filtered once, then the whole page for good

    asyncio.run(go())


def test_a_label_of_digits_that_is_no_number_is_left_unread():
    page = ('vllm:num_requests_running{engine="0"} 1\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="4096²"} 1.0\n')
    m = parse_metrics(page, METRIC_NAMES["vllm"])  # was: ValueError out of float("4096²")
    assert m.num_running == 1.0 and m.kv_blocks_total is None
