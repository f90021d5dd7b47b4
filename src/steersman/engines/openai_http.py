"""The generic OpenAI-compatible HTTP adapter (vLLM, engine-sim, any OpenAI server).

One :class:`~steersman.http.UpstreamPool` of keep-alive connections (TCP_NODELAY)
is shared by all replicas of the kind.

Scrapes of an engine that serves its metrics through prometheus_client (vLLM, SGLang, engine-sim:
``MetricNames.filterable``) ask for the samples the gateway reads only (``/metrics?name[]=...``): vLLM's
page carries dozens of histograms the gateway never reads, and rendering them is most of what a scrape every
50 ms costs the engine's API server (``bench/scrape/run.py``: 2.0 ms vs 66 us a scrape on vLLM's families);
the gateway reads fewer bytes too.  A registry that cannot restrict its page (prometheus_client's
multiprocess collector, as SGLang and vLLM with several API servers use, describes no names) answers the
filtered request with an empty page: a 200 page without the running-requests sample sends that replica back
to the whole page for good (any other answer is a failed scrape, the next one filtered again).

A vLLM in sleep mode (``POST /sleep``) still answers ``/health`` and ``/metrics``: its page's
``vllm:engine_sleep_state`` makes the replica's weights cold (not routable) while an engine sleeps, warm once awake
(:attr:`MetricNames.sleep_family`).  A page without that gauge (vLLM before it, or any OpenAI server) says nothing,
and the replica is asked ``GET /is_sleeping`` (``{"is_sleeping": bool}``; vLLM registers it with
``VLLM_SERVER_DEV_MODE=1`` only): at most every ``gateway.sleep_poll_s`` (the last answer stands between; vLLM of
those versions logs every call), and where it is absent (any answer but vLLM's: a 404 above all) again only after
``gateway.sleep_recheck_s``, not at every scrape.  A connection error or timeout asking it keeps the last answer.  A
replica read asleep whose page and route then say nothing of sleep reads awake (restarted: a new vLLM wakes up).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import quote

import orjson

from steersman.config import DEFAULTS, GatewaySettings
from steersman.engines.base import EngineMetrics, Exchange, ModelList, ReplicaAddress, UpstreamError, model_list
from steersman.engines.metric_names import METRIC_NAMES, MetricNames
from steersman.engines.promtext import (label_value, read_labelled, read_per_label, read_samples, read_series,
                                        read_total)
from steersman.http.client import UpstreamPool

__all__ = ["OpenAIHttpAdapter", "parse_metrics", "metrics_path"]

log = logging.getLogger("steersman.scraper")

_JSON = b"Content-Type: application/json\r\n"


def parse_metrics(text: str, names: MetricNames, block_size: int = DEFAULTS.engine.block_size) -> EngineMetrics:
    """An engine's Prometheus page read with one kind's :class:`MetricNames` (pure).

    The prefix counters are summed over every label set.  Running, waiting and the KV usage are one figure per
    engine (``MetricNames.engine_label``: several with data parallelism); series repeating one engine's figure
    (SGLang's tensor-parallel ranks with --enable-metrics-for-all-schedulers) count once.  Running and waiting
    add up over the engines, the KV capacity too, and the KV usage is their mean weighted by capacity: N engines
    each 45 % full are 45 % full, not 90 %.
    """
    v = read_samples(text, names.summed)
    if names.legacy and any(f not in v and f not in names.per_engine for f in names.legacy):  # an old page
        v = _legacy_counts(text, names, v)
    weights = None
    if names.weights_family:
        states = read_labelled(text, names.weights_family, "state")
        weights = next((k for k, x in states.items() if x >= 1.0), None)
    sleeping = _sleeping(text, names)
    if sleeping:
        weights = "cold"  # offloaded (level 1) or discarded (level 2): nothing runs until a wake-up
    elif sleeping is False and weights is None:
        weights = "warm"  # awake (again): routable
    caps = _capacities(text, names, block_size)
    usage = _gauge(text, names, "kv_usage")
    if usage and all(caps.get(e, 0.0) > 0 for e in usage):
        kv = sum(u * caps[e] for e, u in usage.items()) / sum(caps[e] for e in usage)
    else:
        kv = sum(usage.values()) / len(usage) if usage else 0.0
    if names.kv_usage_is_percent:
        kv /= 100.0
    return EngineMetrics(
        num_running=_total(text, names, "num_running"),
        num_waiting=_total(text, names, "num_waiting"),
        kv_usage=kv,
        prefix_queries=v.get("prefix_queries", 0.0),
        prefix_hits=v.get("prefix_hits", 0.0),
        weights=weights,
        kv_blocks_total=sum(caps.values()) if caps else None,
        progress=v.get("progress"),
    )


def _sleeping(text: str, names: MetricNames) -> bool | None:
    """Whether an engine of the page sleeps (vLLM's one-hot ``vllm:engine_sleep_state``: ``awake`` 0, or
    ``weights_offloaded`` / ``discard_all`` 1); None when the page has no such gauge.

    One sleeping engine of several (data parallel) is enough: requests balanced to it would wait for its wake-up
    (vLLM sleeps and wakes them all together)."""
    if not names.sleep_family:
        return None
    said = None
    for labels, v in read_series(text, names.sleep_family):
        state = label_value(labels, "sleep_state")
        if state == "awake":
            if v < 0.5:
                return True
        elif state in ("weights_offloaded", "discard_all"):
            if v >= 0.5:
                return True
        else:
            continue
        said = False
    return said


def _is_sleeping(status: int, body: bytes) -> bool | None:
    """vLLM's ``GET /is_sleeping`` answer (``{"is_sleeping": bool}``); None for any other (no such route)."""
    if status != 200:
        return None
    try:
        said = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    flag = said.get("is_sleeping") if isinstance(said, dict) else None
    return flag if isinstance(flag, bool) else None


def _gauge(text: str, names: MetricNames, field: str) -> dict[str, float]:
    """``{engine: figure}`` of a per-engine field (a page without the engine label: one engine, ""), under its
    legacy name when the page lacks the current one.

    Several series of one engine repeat its figure: their mean.  SGLang's tensor-parallel ranks with
    --enable-metrics-for-all-schedulers do (``tp_rank`` tells them apart, ``dp_rank`` the engines); so do
    prometheus_client's per-process series (``pid``) of a gauge in multiprocess mode ``all``.  With
    --enable-dp-attention SGLang labels its attention data-parallel groups by ``tp_rank`` only (their schedulers
    get no ``dp_rank``), which the page cannot tell from repeated ranks: they read as one engine, their mean (the
    load per KV capacity stays right: the capacity is their mean too).
    """
    sample = names.per_engine.get(field)
    got = read_per_label(text, sample, names.engine_label) if sample else {}
    if not got and field in names.legacy:
        got = read_per_label(text, names.legacy[field], names.engine_label)
    return got


def _total(text: str, names: MetricNames, field: str) -> float:
    """A per-engine count (see :func:`_gauge`) added up over the engines."""
    sample = names.per_engine.get(field)
    got = read_total(text, sample, names.engine_label) if sample else None
    if got is None and field in names.legacy:
        got = read_total(text, names.legacy[field], names.engine_label)
    return got or 0.0


def _legacy_counts(text: str, names: MetricNames, v: dict[str, float]) -> dict[str, float]:
    """``v`` completed with the counters an older engine version gives under their old names."""
    old = {s: f for f, s in names.legacy.items() if f not in v and f not in names.per_engine}
    return {**read_samples(text, old), **v} if old else v


def metrics_path(names: MetricNames) -> str:
    """The scrape's path: ``/metrics`` restricted to :meth:`MetricNames.scraped` when the engine can filter."""
    if not names.filterable:
        return "/metrics"
    return "/metrics?" + "&".join("name%5B%5D=" + quote(n, safe="") for n in names.scraped())


def _engine(labels: str, label: str | None) -> str:
    return (label_value(labels, label) if label else None) or ""


def _number(s: str | None) -> float | None:
    """A label's plain non-negative number; None for anything else (``isdecimal``, not ``isdigit``: "4096²" is
    digits to ``isdigit`` and no number to ``float``)."""
    return float(s) if s is not None and s.replace(".", "", 1).isdecimal() else None


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
        for e, tokens in read_per_label(text, names.kv_capacity_tokens, names.engine_label).items():
            if tokens:
                caps[e] = tokens / block_size
    return caps


class OpenAIHttpAdapter:
    """Talks to OpenAI-compatible engines over HTTP/1.1 keep-alive connections."""

    shares_prefill_in_flight = True  # vLLM, SGLang, engine-sim (see EngineAdapter)
    idle_probe = True  # their /metrics answers while the engine core hangs (see EngineAdapter)

    def __init__(self, kind: str = "openai", settings: GatewaySettings = DEFAULTS.gateway,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.kind = kind
        self.names: MetricNames = METRIC_NAMES.get(kind, METRIC_NAMES["openai"])
        self._path = metrics_path(self.names)
        #: the running-requests sample: a filtered page without it comes from a registry that cannot filter
        self._needle = next((s for s, f in self.names.samples.items() if f == "num_running"), None)
        self._whole: set[str] = set()  # replicas scraped without the filter (their registry cannot apply it)
        self._settings = settings
        self._now = now
        #: replicas whose page has no sleep gauge: when to ask ``/is_sleeping`` next, and the weights its last
        #: answer meant ("cold" / "warm"; None: not asked yet, or no such route)
        self._asleep: dict[str, tuple[float, str | None]] = {}
        self._cold: set[str] = set()  # replicas last read with cold weights
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
        m = await self._scrape_page(replica)
        if not self.names.sleep_family:
            return m
        weights = m.weights
        if weights is None:  # the page does not say: the replica may (an older vLLM)
            weights = await self._sleep_weights(replica)
            if weights is None and replica.name in self._cold:
                weights = "warm"  # it said it slept, and now says nothing of sleep at all: restarted, awake
        if weights == "cold":
            self._cold.add(replica.name)
        else:
            self._cold.discard(replica.name)
        return m if weights == m.weights else replace(m, weights=weights)

    async def _scrape_page(self, replica: ReplicaAddress) -> EngineMetrics:
        if self._path != "/metrics" and replica.name not in self._whole:
            status, body = await self._get(replica, self._path)
            if status != 200:  # a failed scrape (a proxy's 503 in a restart), not a registry that cannot filter
                raise UpstreamError(f"{replica.name} /metrics?name[]=... answered {status}", connected=True)
            text = body.decode("utf-8", "replace")
            if self._needle is None or self._needle in text:
                return parse_metrics(text, self.names)
            self._whole.add(replica.name)
            log.info("replica %s: its /metrics cannot be restricted to the samples read (name[]: no samples); "
                     "scraping the whole page", replica.name)
        status, body = await self._get(replica, "/metrics")
        if status != 200:
            raise UpstreamError(f"{replica.name} /metrics answered {status}", connected=True)
        return parse_metrics(body.decode("utf-8", "replace"), self.names)

    async def _sleep_weights(self, replica: ReplicaAddress) -> str | None:
        """The weights ``GET /is_sleeping`` means ("cold" asleep, "warm" awake), None where the replica has no such
        route; asked at most every ``gateway.sleep_poll_s``, where absent every ``gateway.sleep_recheck_s``."""
        at, last = self._asleep.get(replica.name, (-math.inf, None))
        now = self._now()
        if now < at:
            return last
        try:
            status, body = await self._get(replica, "/is_sleeping")
        except UpstreamError:  # the page came, this did not: keep what the replica said last, ask at the next poll
            self._asleep[replica.name] = (now + self._settings.sleep_poll_s, last)
            return last
        said = _is_sleeping(status, body)
        if said is None:
            if at == -math.inf or last is not None:
                log.debug("replica %s: no sleep state on its /metrics nor at /is_sleeping (%d); asking again in %g s",
                          replica.name, status, self._settings.sleep_recheck_s)
            self._asleep[replica.name] = (now + self._settings.sleep_recheck_s, None)
            return None
        weights = "cold" if said else "warm"
        if weights != last and last is not None:
            log.info("replica %s %s (/is_sleeping)", replica.name, "sleeps" if said else "is awake again")
        self._asleep[replica.name] = (now + self._settings.sleep_poll_s, weights)
        return weights

    async def list_models(self, replica: ReplicaAddress) -> ModelList:
        status, body = await self._get(replica, "/v1/models")
        if status != 200:
            raise UpstreamError(f"{replica.name} /v1/models answered {status}", connected=True)
        try:
            return model_list(orjson.loads(body))
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
