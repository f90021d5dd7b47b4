"""The generic OpenAI-compatible HTTP adapter (vLLM, engine-sim, any OpenAI server).

One aiohttp session with a persistent connection pool (keep-alive, TCP_NODELAY,
which aiohttp sets on every connection) is shared by all replicas of the kind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import aiohttp
import orjson

from steersman.config import DEFAULTS, GatewaySettings
from steersman.engines.base import EngineMetrics, ReplicaAddress, UpstreamError
from steersman.engines.metric_names import METRIC_NAMES, MetricNames
from steersman.engines.promtext import read_labelled, read_samples

__all__ = ["OpenAIHttpAdapter", "AiohttpUpstream"]

_FORWARD_HEADERS = {"Content-Type": "application/json"}


class AiohttpUpstream:
    """An engine response being relayed."""

    __slots__ = ("_resp", "status", "headers")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, ConnectionError) as e:
            raise UpstreamError(f"engine connection broke mid-response: {e!r}", connected=True) from None

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (aiohttp.ClientError, ConnectionError) as e:
            raise UpstreamError(f"engine connection broke mid-response: {e!r}", connected=True) from None

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


class OpenAIHttpAdapter:
    """Talks to OpenAI-compatible engines over HTTP/1.1 keep-alive connections."""

    def __init__(self, kind: str = "openai", settings: GatewaySettings = DEFAULTS.gateway) -> None:
        self.kind = kind
        self.names: MetricNames = METRIC_NAMES.get(kind, METRIC_NAMES["openai"])
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._settings.upstream_pool_size, keepalive_timeout=60.0, enable_cleanup_closed=True
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._settings.connect_timeout_s),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def send(self, replica: ReplicaAddress, path: str, body: bytes, headers: Mapping[str, str] = _FORWARD_HEADERS) -> AiohttpUpstream:
        try:
            resp = await self._s().post(replica.url + path, data=body, headers=headers)
        except (aiohttp.ClientConnectorError, asyncio.TimeoutError) as e:
            raise UpstreamError(f"cannot connect to {replica.name}: {e}", connected=False) from None
        except (aiohttp.ClientError, ConnectionError) as e:
            raise UpstreamError(f"{replica.name} failed before responding: {e!r}", connected=True) from None
        return AiohttpUpstream(resp)

    async def _get(self, replica: ReplicaAddress, path: str) -> tuple[int, bytes]:
        t = aiohttp.ClientTimeout(total=self._settings.metrics_timeout_s)
        try:
            async with self._s().get(replica.url + path, timeout=t) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError) as e:
            raise UpstreamError(f"{replica.name} {path}: {e!r}", connected=False) from None

    async def scrape(self, replica: ReplicaAddress) -> EngineMetrics:
        status, body = await self._get(replica, "/metrics")
        if status != 200:
            raise UpstreamError(f"{replica.name} /metrics answered {status}", connected=True)
        text = body.decode("utf-8", "replace")
        v = read_samples(text, self.names.samples)
        weights = None
        if self.names.weights_family:
            states = read_labelled(text, self.names.weights_family, "state")
            weights = next((k for k, x in states.items() if x >= 1.0), None)
        kv = v.get("kv_usage", 0.0)
        if self.names.kv_usage_is_percent:
            kv /= 100.0
        return EngineMetrics(
            num_running=v.get("num_running", 0.0),
            num_waiting=v.get("num_waiting", 0.0),
            kv_usage=kv,
            prefix_queries=v.get("prefix_queries", 0.0),
            prefix_hits=v.get("prefix_hits", 0.0),
            weights=weights,
        )

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
        if self._session is not None:
            await self._session.close()
            self._session = None
