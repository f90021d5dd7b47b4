"""The generic OpenAI-compatible HTTP adapter (vLLM, engine-sim, any OpenAI server).

One :class:`~steersman.http.UpstreamPool` of keep-alive connections (TCP_NODELAY)
is shared by all replicas of the kind.

Scrapes of an engine that serves its metrics through prometheus_client (vLLM, SGLang, engine-sim:
``MetricNames.filterable``) ask for the samples the gateway reads only (``/metrics?name[]=...``): vLLM's
page carries dozens of histograms the gateway never reads, and rendering them is most of what a scrape every
50 ms costs the engine's API server (``bench/scrape/run.py``: 2.0 ms vs 66 us a scrape on vLLM's families);
the gateway reads fewer bytes too.  A registry that cannot restrict its page (prometheus_client's
multiprocess collector, as SGLang and vLLM with several API servers use, describes no names) answers the
filtered request with an empty page: a page without the running-requests sample sends that replica back to
the whole page for good.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import quote

import orjson

from steersman.config import DEFAULTS, GatewaySettings
from steersman.engines.base import EngineMetrics, Exchange, ReplicaAddress, UpstreamError
from steersman.engines.metric_names import METRIC_NAMES, MetricNames
from steersman.engines.promtext import label_value, read_labelled, read_samples, read_series
from steersman.http.client import UpstreamPool

__all__ = ["OpenAIHttpAdapter", "parse_metrics", "metrics_path"]

log = logging.getLogger("steersman.scraper")

_JSON = b"Content-Type: application/json\r\n"


def parse_metrics(text: str, names: MetricNames, block_size: int = DEFAULTS.engine.block_size) -> EngineMetrics:
    """An engine's Prometheus page read with one kind's :class:`MetricNames` (pure).

    Counts (running, waiting, the prefix counters) are summed over every label set; with several engines behind
    the page (data parallel, ``MetricNames.engine_label``) the KV capacity is their sum and the KV usage their
    mean weighted by capacity: N engines each 45 % full are 45 % full, not 90 %.
    """
    v = read_samples(text, names.samples)
    weights = None
    if names.weights_family:
        states = read_labelled(text, names.weights_family, "state")
        weights = next((k for k, x in states.items() if x >= 1.0), None)
    caps = _capacities(text, names, block_size)
    usage = _by_engine(text, names.usage_sample, names.engine_label) if names.usage_sample else {}
    if usage and all(caps.get(e, 0.0) > 0 for e in usage):
        kv = sum(u * caps[e] for e, u in usage.items()) / sum(caps[e] for e in usage)
    else:
        kv = sum(usage.values()) / len(usage) if usage else 0.0
    if names.kv_usage_is_percent:
        kv /= 100.0
    return EngineMetrics(
        num_running=v.get("num_running", 0.0),
        num_waiting=v.get("num_waiting", 0.0),
        kv_usage=kv,
        prefix_queries=v.get("prefix_queries", 0.0),
        prefix_hits=v.get("prefix_hits", 0.0),
        weights=weights,
        kv_blocks_total=sum(caps.values()) if caps else None,
    )


def metrics_path(names: MetricNames) -> str:
    """The scrape's path: ``/metrics`` restricted to :meth:`MetricNames.scraped` when the engine can filter."""
    if not names.filterable:
        return "/metrics"
    return "/metrics?" + "&".join("name%5B%5D=" + quote(n, safe="") for n in names.scraped())


def _engine(labels: str, label: str | None) -> str:
    return (label_value(labels, label) if label else None) or ""


def _by_engine(text: str, sample: str, label: str | None) -> dict[str, float]:
    """``{engine: value}`` of a gauge that is one figure per engine (a page without the label: one engine, "").

    Several series of one engine (SGLang's tensor-parallel ranks with --enable-metrics-for-all-schedulers) repeat
    its figure: their mean."""
    seen: dict[str, list[float]] = {}
    for labels, x in read_series(text, sample):
        seen.setdefault(_engine(labels, label), []).append(x)
    return {e: sum(xs) / len(xs) for e, xs in seen.items()}


def _number(s: str | None) -> float | None:
    return float(s) if s is not None and s.replace(".", "", 1).isdigit() else None


def _capacities(text: str, names: MetricNames, block_size: int) -> dict[str, float]:
    """KV capacity in steersman's blocks of ``block_size`` tokens, by engine (only those that say).

    A token count (SGLang's max_total_num_tokens) when given, else vLLM's cache_config_info: it counts
    ``num_gpu_blocks`` of its own ``block_size`` (16 on CUDA, 128 on CPU); recent versions also give
    ``kv_cache_size_tokens`` (the real capacity with hybrid/sliding-window layers).
    """
    caps: dict[str, float] = {}
    if names.cache_info_family:
        for labels, _ in read_series(text, names.cache_info_family):
            tokens = _number(label_value(labels, "kv_cache_size_tokens"))
            if tokens is None:
                blocks = _number(label_value(labels, "num_gpu_blocks"))
                if blocks is None:
                    continue
                tokens = blocks * (_number(label_value(labels, "block_size")) or block_size)
            caps[_engine(labels, names.engine_label)] = tokens / block_size
    if names.kv_capacity_tokens:
        for e, tokens in _by_engine(text, names.kv_capacity_tokens, names.engine_label).items():
            if tokens:
                caps[e] = tokens / block_size
    return caps


class OpenAIHttpAdapter:
    """Talks to OpenAI-compatible engines over HTTP/1.1 keep-alive connections."""

    shares_prefill_in_flight = True  # vLLM, SGLang, engine-sim (see EngineAdapter)

    def __init__(self, kind: str = "openai", settings: GatewaySettings = DEFAULTS.gateway) -> None:
        self.kind = kind
        self.names: MetricNames = METRIC_NAMES.get(kind, METRIC_NAMES["openai"])
        self._path = metrics_path(self.names)
        #: the running-requests sample: a filtered page without it comes from a registry that cannot filter
        self._needle = next((s for s, f in self.names.samples.items() if f == "num_running"), None)
        self._whole: set[str] = set()  # replicas scraped without the filter (their registry cannot apply it)
        self._settings = settings
        self.pool = UpstreamPool(settings.connect_timeout_s, settings.upstream_idle_timeout_s,
                                 settings.upstream_preconnect)

    async def send(self, replica: ReplicaAddress, path: str, body: bytes,
                   sent: Callable[[], None] | None = None, headers: bytes = b"") -> Exchange:
        return await self.pool.request(replica.endpoint, b"POST", path, body, _JSON + headers, sent)

    async def _get(self, replica: ReplicaAddress, path: str) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(self._settings.metrics_timeout_s):  # not wait_for: no task, no cycle (see _connect)
                return await self.pool.get(replica.endpoint, path)
        except TimeoutError:
            raise UpstreamError(f"{replica.name} {path} took longer than {self._settings.metrics_timeout_s} s", connected=True) from None

    async def scrape(self, replica: ReplicaAddress) -> EngineMetrics:
        if self._path != "/metrics" and replica.name not in self._whole:
            status, body = await self._get(replica, self._path)
            text = body.decode("utf-8", "replace") if status == 200 else ""
            if self._needle is None or self._needle in text:
                return parse_metrics(text, self.names)
            self._whole.add(replica.name)
            log.info("replica %s: its /metrics cannot be restricted to the samples read (name[]: %s); scraping "
                     "the whole page", replica.name, "no samples" if status == 200 else f"status {status}")
        status, body = await self._get(replica, "/metrics")
        if status != 200:
            raise UpstreamError(f"{replica.name} /metrics answered {status}", connected=True)
        return parse_metrics(body.decode("utf-8", "replace"), self.names)

    async def list_models(self, replica: ReplicaAddress) -> list[str]:
        status, body = await self._get(replica, "/v1/models")
        if status != 200:
            raise UpstreamError(f"{replica.name} /v1/models answered {status}", connected=True)
        try:
            return [str(m["id"]) for m in orjson.loads(body).get("data", [])]
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise UpstreamError(f"{replica.name} /v1/models is not an OpenAI model list: {e}", connected=True) from None

    async def health(self, replica: ReplicaAddress) -> bool:
        try:
            status, _ = await self._get(replica, "/health")
        except UpstreamError:
            return False
        return status == 200

    async def close(self) -> None:
        await self.pool.close()
