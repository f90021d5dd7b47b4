"""The gateway: OpenAI-compatible HTTP in front of a fleet of engines.

Wiring only: the request path is the ordered :class:`~steersman.pipeline.Pipeline`
of stages; routing is a pure policy over fleet snapshots; engines are reached
through adapters; the scraper feeds engine metrics into the fleet state.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, replace
from urllib.parse import unquote

from collections.abc import Callable

import orjson

from steersman.api.errors import ApiError, error_body, not_found_model
from steersman.api.headers import tag_request_id
from steersman.api.lifecycle import RequestLifecycle
from steersman.api.responses_http import ResponsesEndpoints
from steersman.api.calibrate import calibrate
from steersman.api.admin import REPLICAS_PATH, AdminGuard
from steersman.api.admin_http import AdminEndpoints
from steersman.api.openapi import openapi_document
from steersman.api.reload import directory_of
from steersman.api.prompt import with_cache_salt
from steersman.clock import Clock, WallClock
from steersman.config import DEFAULTS
from steersman.control import DefaultAdmitter, GatewayQueue, WorkflowTracker
from steersman.control.admission import make_admitter
from steersman.control.tenants import AuthError
from steersman.control.accounting import Accounting
from steersman.control.plane import ControlPlane
from steersman.engines import EngineAdapter, adapter_for
from steersman.engines.kv_events import subscribe_all
from steersman.fleet.config import EndpointConfig, FleetConfig, make_profile
from steersman.fleet.embedded import SimulatedFleet
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.prober import IdleProber
from steersman.fleet.scraper import Scraper, discover_models
from steersman.fleet.state import Fleet, Replica
from steersman.http.busypoll import BusyPoll
from steersman.http.server import HttpRequest, HttpServer, http_url
from steersman.obs.metrics import GatewayMetrics
from steersman.obs.tracing import make_tracer, request_id
from steersman.pipeline.admit import Authenticate, Describe, Schedule
from steersman.pipeline.context import RequestContext
from steersman.pipeline.forward import Forward
from steersman.pipeline.brownout import Brownout
from steersman.pipeline.runner import Pipeline, Retrier, send_error
from steersman.pipeline.stages import ParseRequest, ResolveModel
from steersman.policy import PLUGIN_LATENCY, make_policy
from steersman.policy.kernels import warm_up
from steersman.policy.request import PriorityClass, SchedRequest
from steersman.text._fast_tokenize import warm_up as warm_up_tokenizer
from steersman.reliability import ReplicaGuard
from steersman.sim import gpu_profile

__all__ = ["Gateway"]

log = logging.getLogger("steersman.gateway")


@dataclass(frozen=True, slots=True)
class _Endpoint:
    kind: str
    path: str


_CHAT = _Endpoint("chat", "/v1/chat/completions")
_COMPLETION = _Endpoint("completion", "/v1/completions")
_EMBEDDING = _Endpoint("embedding", "/v1/embeddings")


class Gateway(RequestLifecycle, ResponsesEndpoints, AdminEndpoints):
    def __init__(self, cfg: FleetConfig, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.settings = cfg.gateway
        self.admin = AdminGuard(self.settings.admin_key_sha256)  # first: a bad digest raises before anything is built
        self.scheduler_settings = cfg.scheduler
        self.block_size = DEFAULTS.engine.block_size
        self.clock = clock or WallClock()
        self._models_created = int(self.clock.wall())  # the models' ``created``: fixed, as OpenAI's (was: every call's now)
        self.metrics = GatewayMetrics(self.settings.loop_lag_interval_s)
        self.tracer = make_tracer(self.settings.otlp_traces_endpoint, self.settings.trace_sample_ratio,
                                  self.settings.otlp_shutdown_timeout_s)
        self.metrics.registry.register(PLUGIN_LATENCY)
        if cfg.policy in cfg.profiles:
            self.policy = make_profile(cfg.policy, cfg.profiles[cfg.policy], cfg.scheduler)
        else:
            self.policy = make_policy(cfg.policy, cfg.scheduler)
        self.tenants = directory_of(cfg)
        self.workflows = WorkflowTracker(cfg.admission)
        self.plane = ControlPlane(self.policy, make_admitter(cfg.admission), GatewayQueue(cfg.admission), cfg.scheduler)
        RequestLifecycle.__init__(self)
        # engine-sims listen on loopback whatever the gateway's host: their /admin/faults is open (the gateway is
        # their only client; `up --host 0.0.0.0` exposed every one of them)
        self.sim_fleet = SimulatedFleet(cfg.simulated, "127.0.0.1", kv_events=cfg.scheduler.kv_events) \
            if cfg.simulated else None
        self.adapters: dict[str, EngineAdapter] = {}
        self.fleet: Fleet | None = None
        self.scraper: Scraper | None = None
        self.prober: IdleProber | None = None
        self.shared_limits = None  # steersman.state.shared_limits.SharedLimits with gateway.limits_url
        self.kv_events: list = []  # steersman.engines.kv_events.KvEventSubscriber, one per endpoint naming kv_events
        self.pipeline: Pipeline | None = None
        self._seq = 0
        self.port = self.settings.port
        self.http = HttpServer(error_body, self.settings.max_body_bytes, self.settings.client_idle_timeout_s,
                               self.settings.client_request_timeout_s, self.settings.max_buffered_body_mib * 2**20,
                               self.settings.max_client_connections)
        self.http.route("POST", "/v1/chat/completions", self.chat)
        self.http.route("POST", "/v1/completions", self.completions)
        self.http.route("POST", "/v1/embeddings", self.embeddings)
        self._route_responses()
        for path, handler in (("/v1/models", self._keyed(self.models)), ("/v1/models/", self._keyed(self.model)),
                              ("/health", self.health), ("/metrics", self.metrics_handler),
                              ("/openapi.json", self.openapi), ("/admin/fleet", self.admin_fleet)):
            self.http.route("GET", path, _with_request_id(handler))
        self.http.route("POST", REPLICAS_PATH, _with_request_id(self.admin_replica))
        self.http.route("POST", "/admin/reload", _with_request_id(self.admin_reload))
        #: reads the fleet file again (``steersman serve`` sets it; None: started without one): POST /admin/reload
        self.reload_from: Callable[[], FleetConfig] | None = None
        self._reload_lock: asyncio.Lock | None = None  # (made in the loop: one reload at a time)
        self.http.on_error = self._protocol_answer
        self._serving = 0  # chat/completion requests being handled (busy polling spins while any is)
        self.busy_poll = BusyPoll(self.settings.busy_poll_s, self._busy) if self.settings.busy_poll_s > 0 else None

    # ---- lifecycle ---------------------------------------------------------
    def _replica(self, i: int, ep: EndpointConfig) -> Replica:
        adapter = self.adapters.get(ep.engine)
        if adapter is None:
            adapter = self.adapters[ep.engine] = adapter_for(ep.engine, settings=self.settings, now=self.clock.now)
        price = ep.price_per_hour
        if price is None:
            price = gpu_profile(ep.gpu).price_per_hour * ep.tp if ep.gpu else 0.0
        return Replica(i, ep.name or f"replica-{i}", ep.url.rstrip("/"), ep.engine, ep.gpu,
                       (*ep.models, *ep.lora_modules), ep.pool, price, ep.tp, adapter,
                       ep.scheduling == "priority", kv_unified=ep.kv_unified, loras=tuple(ep.lora_modules),
                       model_profile=ep.model_profile)

    async def start(self) -> None:
        warm_up()  # compile (or load cached) scheduling kernels before the first request
        warm_up_tokenizer()
        endpoints = list(self.cfg.endpoints)
        if self.sim_fleet is not None:
            endpoints += await self.sim_fleet.start()
        replicas = [self._replica(i, ep) for i, ep in enumerate(endpoints)]
        self.fleet = Fleet(replicas, self.clock, self.scheduler_settings)
        # its full-table passes (a generation dropped, a growth, a replica forgotten) on a worker thread, not on the loop
        self.fleet.prefix = PrefixIndex(len(replicas), self.scheduler_settings.prefix_index_max_mib * 2**20,
                                        background=True)
        if not getattr(self.policy, "prefix_residency", True):
            self.fleet.prefix_residency = False
        self.fleet.guard = ReplicaGuard(len(replicas), self.cfg.reliability, self.scheduler_settings.latency_ewma_alpha)
        self.kv_events, kv_counts = subscribe_all(self.fleet, endpoints, self.block_size,
                                                  self.scheduler_settings.kv_events_mismatch_after,
                                                  self.scheduler_settings.kv_events_replay_timeout_s)
        self.metrics.registry.register(kv_counts)
        self.accounting = Accounting(self.fleet, self.plane, self.workflows, self.scheduler_settings, self.block_size)
        self.metrics.track_in_flight(lambda: float(self.fleet.in_flight.sum()))
        self.metrics.gc.install()
        self.metrics.loop_lag.start()
        self.metrics.track_queue(lambda: float(self.plane.waiting))
        if self.admin.open:
            log.warning("no admin key configured (gateway.admin_key_sha256): /metrics and /admin/* are open "
                        "(POST /admin/reload refused)")
        if self.tenants.open:
            log.warning("no API keys configured: the gateway is OPEN, every request runs as tenant %r", self.tenants.open_tenant.name)
            unused = sorted(set(self.tenants.tenants) - {self.tenants.open_tenant.name})
            if unused:  # (a file with tenants and their limits but no api_keys ran with none of them, silently)
                log.warning("tenants %s are configured but no api_keys name them: their limits and priorities apply to "
                            "no request (add api_keys: `steersman keys create --tenant NAME`)", ", ".join(unused))
        check = getattr(self.response_store, "check", None)  # a store with IO says at start whether it answers
        await self._discover_models()
        for model, cheaper in self.cfg.reliability.brownout_models.items():
            if self.fleet.has_model(model) and not self.fleet.has_model(cheaper):
                log.warning("reliability.brownout_models maps %r to %r, which no replica serves: in brown-out %r's "
                            "sheddable requests are shed, not moved", model, cheaper, model)
        if check is not None:
            await check()
        if self.settings.limits_url:
            await self._share_limits()
        self.scraper = Scraper(self.fleet, self.settings, self.clock, on_update=self.kick)
        self.fleet.on_first_token = self.kick  # a prefill done: requests held back for one may go
        await asyncio.gather(*(self.scraper.scrape_once(r) for r in replicas))
        if self.settings.calibrate_unprofiled:
            await calibrate(self.fleet, self.scraper, self.settings.calibrate_timeout_s)
        self.scraper.start()
        self.pipeline = Pipeline(
            [
                Authenticate(self.tenants),  # a request without a valid key is refused before its body is read
                ParseRequest(self.settings),
                ResolveModel(self.fleet),
                Describe(self),
                Brownout(self),
                Schedule(self),
                Forward(self.fleet, self.metrics, self.clock, self.settings.max_sse_event_bytes, self.tracer),
            ],
            Retrier(self.cfg.reliability, self.clock),
            self.fleet,
        )
        self.pipeline.watch(self.fleet.guard, [r.name for r in replicas])
        self.prober = IdleProber(self.fleet, self.cfg.reliability, self.clock)
        self.metrics.registry.register(self.prober.counts)
        self.prober.start()
        self._warm_decisions()
        for fam in self.pipeline.retrier.families:
            self.metrics.registry.register(fam)
        self.port = await self.http.start(self.settings.host, self.settings.port, self.settings.reuse_port)
        if self.busy_poll is not None:
            self.busy_poll.start()
            bp = self.busy_poll
            self.metrics.track_busy_poll(bp.total_s, lambda: float(bp.preempted))

    def _warm_decisions(self) -> None:
        """One decision per model on the live fleet's snapshot (nothing dispatched, nothing recorded): the
        routing kernels get compiled (or loaded) for the snapshot's read-only array types now, not on the
        first requests (a cold numba cache cost the first requests ~2 s).  Each plugin's latency histogram
        gets one sample from each.  Retries and stream continuations route again avoiding the replicas that
        failed, and with every replica avoided no candidate is left: those decisions are made here too, so the
        first failure after start does not compile on the event loop while streams are in flight
        (``tests/reliability/test_no_compile_on_request_path.py``)."""
        assert self.fleet is not None
        snap = self.fleet.snapshot()
        everyone = frozenset(range(len(snap.names)))
        for model in self.fleet.models():
            for n in (0, 8):  # without and with prompt blocks (the prefix match path)
                req = SchedRequest(seq=0, model=model, kind="chat", stream=True, tenant="warm-up",
                                   priority=PriorityClass.STANDARD, arrival=snap.time, prompt_tokens=16 * n + 1,
                                   block_hashes=tuple(range(1, n + 1)), max_tokens=16, expected_output=16)
                self.policy.pick(snap, req)
                for excluded in (frozenset({0}), everyone):  # a reroute; one with no replica left
                    for resumed in (False, True):  # a retry; a continued stream
                        self.policy.pick(snap, replace(req, excluded=excluded, resumed=resumed))
        forget = getattr(self.policy, "forget_turns", None)  # (a Profile; a custom policy may keep no turns)
        if forget is not None:
            forget()  # the first request takes the first turn (round-robin's first replica), as in the twin

    async def _share_limits(self) -> None:
        """Tenants' rate limits and spend shared through Redis (``gateway.limits_url``), synced once before the first
        request."""
        from steersman.state.shared_limits import SharedLimits

        adm = self.plane.admitter
        if not isinstance(adm, DefaultAdmitter):
            log.warning("gateway.limits_url is set but the admitter (%s) keeps no token buckets: nothing is shared",
                        type(adm).__name__)
            return
        s = self.settings
        tenants = self.tenants
        self.shared_limits = SharedLimits(
            s.limits_url, s.limits_prefix, s.limits_sync_s, s.limits_timeout_s, adm.limiter, adm.ledger,
            lambda: {**tenants.tenants, tenants.open_tenant.name: tenants.open_tenant}, self.clock.now)
        self.metrics.registry.register(self.shared_limits.counts)
        await self.shared_limits.start()

    async def _discover_models(self) -> None:
        assert self.fleet is not None
        for rep in self.fleet.replicas:
            if not rep.models:
                await discover_models(self.fleet, rep)  # the scraper lists again those down now, once they are up

    async def drain(self) -> None:
        """A graceful shutdown's first half (SIGTERM; :meth:`stop` is the second): the listener closes (new
        connections are refused: a load balancer still sending some retries them elsewhere; under Kubernetes a
        ``preStop`` sleep lets its endpoints forget the pod first), idle keep-alive connections close, and every
        request already received is answered to its last byte, queued ones included, each answer closing its
        connection; for at most ``gateway.drain_timeout_s``, then :meth:`stop` cuts what is left."""
        timeout = self.settings.drain_timeout_s
        busy = self.http.busy_connections
        if busy:
            log.info("draining: no new connections; %d connection(s) with a request in flight have up to %g s to "
                     "finish (signal again to stop now)", busy, timeout)
        left = await self.http.drain(timeout)
        if left:
            log.warning("drain: %g s passed, %d connection(s) still open are cut", timeout, left)

    async def stop(self) -> None:
        try:
            if self.busy_poll is not None:
                self.busy_poll.stop()
            self.metrics.gc.uninstall()
            self.metrics.loop_lag.stop()
            await self.http.stop()
            self.stop_lifecycle()
            await self.response_store.close()
            if self.shared_limits is not None:
                await self.shared_limits.close()
            if self.prober is not None:
                await self.prober.stop()
            if self.scraper is not None:
                await self.scraper.stop()
            for sub in self.kv_events:
                await sub.stop()
            for a in self.adapters.values():
                await a.close()
            if self.fleet is not None and self.fleet.prefix is not None:
                self.fleet.prefix.close()  # its worker thread (a pass still running finishes first)
        finally:  # a step above that failed (or a start cut short) leaves no engine-sim running
            if self.sim_fleet is not None:
                await self.sim_fleet.stop()
        if self.tracer.exporting:
            await asyncio.to_thread(self.tracer.shutdown)  # exports what is buffered (for at most gateway.otlp_shutdown_timeout_s)

    @property
    def url(self) -> str:
        return http_url(self.settings.host, self.port)

    # ---- handlers ----------------------------------------------------------
    async def chat(self, request: HttpRequest) -> None:
        await self._handle(request, _CHAT)

    async def completions(self, request: HttpRequest) -> None:
        await self._handle(request, _COMPLETION)

    async def embeddings(self, request: HttpRequest) -> None:
        await self._handle(request, _EMBEDDING)

    async def _handle(self, request: HttpRequest, ep: _Endpoint) -> None:
        assert self.pipeline is not None and self.fleet is not None
        self._seq += 1
        ctx = RequestContext(http=request, kind=ep.kind, path=ep.path, seq=self._seq, started=self.clock.now())
        headers = request.headers
        ctx.request_id = tag_request_id(request)
        tracer = self.tracer
        tracer.begin(ctx, headers, request.method, request.path)
        m = self.metrics
        if self.settings.isolate_tenant_caches:
            self._salt(request)
        if self.settings.log_prompts:
            log.debug("request %d %s body: %s", ctx.seq, ep.path, request.body[:65536].decode("utf-8", "replace"))
        self._serving += 1
        if self.busy_poll is not None:
            self.busy_poll.kick()
        try:
            await self.pipeline.handle(ctx)
        except asyncio.CancelledError:
            ctx.status = 499  # client closed the request
            raise
        except Exception:
            log.exception("internal error on %s", ep.path)
            send_error(ctx, ApiError(500, "Internal gateway error.", "server_error", None, "internal_error"))
            ctx.status = 500
        finally:
            self._serving -= 1
            self.end_request(ctx)
            tracer.end(ctx)
            if getattr(request, "held", None) is None:  # (a Responses try refused for its length, sent again
                # shorter: not an answer the client saw)
                label = ctx.model if self.fleet.has_model(ctx.model) else "_unknown"
                m.count(label, ctx.status)
                if ctx.status == 200:  # answers, as vLLM's finished requests: an instant 4xx or a client gone is no
                    m.model(label).e2e.observe(self.clock.now() - ctx.started)  # latency (it pulled the model's down)

    def _busy(self) -> int:
        return self._serving

    def _protocol_answer(self, status: int, headers) -> bytes:
        """An answer the HTTP server gives itself (a malformed, oversized or slow request, no such route): counted
        in ``steersman:requests_total`` under ``_unknown`` and named with an X-Request-Id (the client's when valid),
        as every other answer (an observability audit found 400/404/405/408/413/431 answers uncounted and unnamed)."""
        self.metrics.count("_unknown", status)
        rid = request_id(headers.get("x-request-id") if headers else None)
        return b"X-Request-Id: %b\r\n" % rid.encode()

    def _salt(self, request: HttpRequest) -> None:
        """Each tenant's prompts share the engines' prefix caches only with its own (vLLM ``cache_salt``)."""
        got = self.tenants.authenticate(request.headers.get("authorization"))
        if not isinstance(got, AuthError):  # refused later by the authenticate stage
            salt = "steersman-" + hashlib.sha256(got.name.encode()).hexdigest()[:24]
            request.body = with_cache_salt(request.body, salt)

    def _model_objects(self) -> dict[str, dict]:
        """OpenAI model objects of the fleet's models (the union of its replicas'), by id."""
        assert self.fleet is not None
        created = self._models_created
        counts: dict[str, int] = {}
        for r in self.fleet.replicas:
            for mdl in r.models:
                counts[mdl] = counts.get(mdl, 0) + 1
        return {mdl: {"id": mdl, "object": "model", "created": created, "owned_by": "steersman", "replicas": n}
                for mdl, n in sorted(counts.items())}

    def _keyed(self, handler):
        """A GET of the API that needs a tenant's key when keys are configured (401 ``invalid_api_key`` otherwise),
        as OpenAI's ``/v1/models`` and vLLM's (``--api-key`` guards every ``/v1`` route) do.  ``/health`` and
        ``/openapi.json`` stay open (the latter names the models only to a tenant's key); ``/metrics`` and
        ``/admin/*`` take the admin key."""
        async def keyed(request: HttpRequest) -> None:
            if self._tenant_or_refuse(request) is not None:  # (ResponsesEndpoints': a 401 answered when refused)
                await handler(request)
        return keyed

    async def models(self, request: HttpRequest) -> None:
        request.respond(200, orjson.dumps({"object": "list", "data": list(self._model_objects().values())}))

    async def model(self, request: HttpRequest) -> None:
        """``GET /v1/models/{model}`` (OpenAI's retrieve; an id may hold ``/``, as Hugging Face names do)."""
        model = unquote(request.path[len("/v1/models/"):])
        obj = self._model_objects().get(model)
        if obj is None:
            err = not_found_model(model)
            request.respond(err.status, err.body())
            return
        request.respond(200, orjson.dumps(obj))

    async def openapi(self, request: HttpRequest) -> None:
        """Open, as the API's description is; its list of models (the ``model`` field's enum) only with a tenant's
        key when keys are configured, as ``/v1/models`` (the open document listed the fleet's models to anyone)."""
        assert self.fleet is not None
        known = not isinstance(self.tenants.authenticate(request.headers.get("authorization")), AuthError)
        models = sorted({m for r in self.fleet.replicas for m in r.models}) if known else []
        doc = openapi_document(models, self.settings.max_tokens_limit, self.settings.max_logprobs)
        request.respond(200, orjson.dumps(doc))

    async def health(self, request: HttpRequest) -> None:
        fleet = self.fleet
        # a replica an operator drained serves nothing new: with every healthy one drained the gateway is unavailable
        healthy = int((fleet.healthy & ~fleet.draining).sum()) if fleet is not None else 0
        total = len(fleet.replicas) if fleet is not None else 0
        body = {"status": "ok" if healthy else "unavailable", "replicas_healthy": healthy, "replicas": total,
                "replicas_draining": int(fleet.draining.sum()) if fleet is not None else 0}
        request.respond(200 if healthy else 503, orjson.dumps(body))


def _with_request_id(handler):
    """A GET handler whose answers carry X-Request-Id, as OpenAI's API does on every response."""
    async def tagged(request: HttpRequest) -> None:
        tag_request_id(request)
        await handler(request)
    return tagged
