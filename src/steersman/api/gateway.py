"""The gateway: OpenAI-compatible HTTP in front of a fleet of engines.

Wiring only: the request path is the ordered :class:`~steersman.pipeline.Pipeline`
of stages; routing is a pure policy over fleet snapshots; engines are reached
through adapters; the scraper feeds engine metrics into the fleet state.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import orjson
from aiohttp import web

from steersman.api.errors import ApiError
from steersman.clock import Clock, WallClock
from steersman.engines import EngineAdapter, UpstreamError, adapter_for
from steersman.fleet.config import EndpointConfig, FleetConfig
from steersman.fleet.embedded import SimulatedFleet
from steersman.fleet.scraper import Scraper
from steersman.fleet.state import Fleet, Replica
from steersman.obs.metrics import GatewayMetrics
from steersman.pipeline.context import RequestContext
from steersman.pipeline.forward import Forward
from steersman.pipeline.runner import Pipeline
from steersman.pipeline.stages import ParseRequest, ResolveModel, RouteRequest
from steersman.policy import make_policy
from steersman.sim import gpu_profile

__all__ = ["Gateway"]

log = logging.getLogger("steersman.gateway")


@dataclass(frozen=True, slots=True)
class _Endpoint:
    kind: str
    path: str


_CHAT = _Endpoint("chat", "/v1/chat/completions")
_COMPLETION = _Endpoint("completion", "/v1/completions")


class Gateway:
    def __init__(self, cfg: FleetConfig, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.settings = cfg.gateway
        self.clock = clock or WallClock()
        self.metrics = GatewayMetrics()
        self.policy = make_policy(cfg.policy)
        self.sim_fleet = SimulatedFleet(cfg.simulated, self.settings.host) if cfg.simulated else None
        self.adapters: dict[str, EngineAdapter] = {}
        self.fleet: Fleet | None = None
        self.scraper: Scraper | None = None
        self.pipeline: Pipeline | None = None
        self._seq = 0
        self._runner: web.AppRunner | None = None
        self.port = self.settings.port
        self.app = web.Application(client_max_size=self.settings.max_body_bytes + 1)
        r = self.app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics_handler)

    # ---- lifecycle ---------------------------------------------------------
    def _replica(self, i: int, ep: EndpointConfig) -> Replica:
        adapter = self.adapters.get(ep.engine)
        if adapter is None:
            adapter = self.adapters[ep.engine] = adapter_for(ep.engine, settings=self.settings)
        price = ep.price_per_hour
        if price is None:
            price = gpu_profile(ep.gpu).price_per_hour * ep.tp if ep.gpu else 0.0
        return Replica(i, ep.name or f"replica-{i}", ep.url.rstrip("/"), ep.engine, ep.gpu, tuple(ep.models), ep.pool, price, ep.tp, adapter)

    async def start(self) -> None:
        endpoints = list(self.cfg.endpoints)
        if self.sim_fleet is not None:
            endpoints += await self.sim_fleet.start()
        replicas = [self._replica(i, ep) for i, ep in enumerate(endpoints)]
        self.fleet = Fleet(replicas, self.clock)
        await self._discover_models()
        self.scraper = Scraper(self.fleet, self.settings, self.clock)
        await asyncio.gather(*(self.scraper.scrape_once(r) for r in replicas))
        self.scraper.start()
        self.pipeline = Pipeline(
            [
                ParseRequest(self.settings),
                ResolveModel(self.fleet),
                RouteRequest(self.fleet, self.policy),
                Forward(self.fleet, self.metrics, self.clock),
            ]
        )
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, reuse_address=True)
        await site.start()
        server = site._server  # noqa: SLF001 - the bound port when port 0 was asked
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]

    async def _discover_models(self) -> None:
        assert self.fleet is not None
        for rep in self.fleet.replicas:
            if rep.models:
                continue
            try:
                models = await rep.adapter.list_models(rep.address)
            except UpstreamError as e:
                log.warning("cannot list models of %s (%s); it gets no traffic until configured", rep.name, e)
                continue
            self.fleet.set_models(rep.index, models)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.scraper is not None:
            await self.scraper.stop()
        for a in self.adapters.values():
            await a.close()
        if self.sim_fleet is not None:
            await self.sim_fleet.stop()

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    # ---- handlers ----------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, _CHAT)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, _COMPLETION)

    async def _handle(self, request: web.Request, ep: _Endpoint) -> web.StreamResponse:
        assert self.pipeline is not None and self.fleet is not None
        self._seq += 1
        ctx = RequestContext(http=request, kind=ep.kind, path=ep.path, seq=self._seq, started=self.clock.now())
        m = self.metrics
        m.in_flight.inc()
        resp: web.StreamResponse | None = None
        try:
            resp = await self.pipeline.handle(ctx)
            return resp
        except asyncio.CancelledError:
            ctx.status = 499  # client closed the request
            raise
        except Exception:
            log.exception("internal error on %s", ep.path)
            ctx.status = 500
            resp = ApiError(500, "Internal gateway error.", "server_error", None, "internal_error").response()
            return resp
        finally:
            m.in_flight.dec()
            label = ctx.model if self.fleet.has_model(ctx.model) else "_unknown"
            m.count(label, ctx.status or (resp.status if resp is not None else 0))
            m.model(label).e2e.observe(self.clock.now() - ctx.started)

    async def models(self, request: web.Request) -> web.Response:
        assert self.fleet is not None
        created = int(self.clock.wall())
        counts: dict[str, int] = {}
        for r in self.fleet.replicas:
            for mdl in r.models:
                counts[mdl] = counts.get(mdl, 0) + 1
        data = [{"id": mdl, "object": "model", "created": created, "owned_by": "steersman", "replicas": n} for mdl, n in sorted(counts.items())]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        fleet = self.fleet
        healthy = int(fleet.healthy.sum()) if fleet is not None else 0
        total = len(fleet.replicas) if fleet is not None else 0
        body = {"status": "ok" if healthy else "unavailable", "replicas_healthy": healthy, "replicas": total}
        return web.Response(status=200 if healthy else 503, body=orjson.dumps(body), content_type="application/json")

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")
