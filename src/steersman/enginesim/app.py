"""``steersman engine-sim``: one simulated replica served over real HTTP.

OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions`` (SSE and
plain), ``/v1/models``, ``/health``, ``/metrics`` with vLLM's metric names, and
``/admin/faults`` for fault injection.  Tokens are paced by the engine model
(:mod:`steersman.sim`) on the injected clock.

With ``sleep_mode`` (vLLM's ``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``, which registers the routes)
``POST /sleep?level=1|2`` unloads the weights (the KV cache goes; requests wait, unscheduled, for the wake-up),
``POST /wake_up`` loads them again (the engine model's load time) and ``GET /is_sleeping`` answers
``{"is_sleeping": bool}``; ``vllm:engine_sleep_state`` on ``/metrics`` says the same, as vLLM's does.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from urllib.parse import parse_qs

import msgspec
import orjson

from steersman.api.admin import AdminGuard
from steersman.api.errors import ApiError, bad_request, error_body
from steersman.clock import Clock, ScaledClock
from steersman.config import DEFAULTS, EngineSettings
from steersman.enginesim.faults import Faults, FaultSpec
from steersman.enginesim.generate import Generator
from steersman.enginesim.kv_events import KvEventPublisher
from steersman.enginesim.metrics import SimMetrics, wanted
from steersman.enginesim.runner import EngineRunner
from steersman.http.server import HttpRequest, HttpServer, http_url
from steersman.obs.tracing import OtlpSpans
from steersman.enginesim.embeddings import Embedder
from steersman.sim import EngineModel, gpu_profile, model_profile
from steersman.text._fast_tokenize import warm_up as warm_up_tokenizer

__all__ = ["SimServerConfig", "SimServer"]


@dataclass(frozen=True, slots=True)
class SimServerConfig:
    gpu: str = DEFAULTS.sim_server.gpu
    model: str = DEFAULTS.sim_server.model
    host: str = DEFAULTS.sim_server.host
    port: int = DEFAULTS.sim_server.port
    speedup: float = DEFAULTS.sim_server.speedup
    served_model_name: str | None = None
    mean_output_tokens: float = DEFAULTS.sim_server.mean_output_tokens
    engine: EngineSettings = field(default_factory=EngineSettings)
    cold_start: bool = False
    faults: FaultSpec = field(default_factory=FaultSpec)
    admin_key_sha256: str | None = None  # SHA-256 hex of the key /admin needs (the key itself is never stored)
    exit_on_crash: bool = False
    otlp_traces_endpoint: str | None = None  # vLLM's --otlp-traces-endpoint: export an llm_request span per request
    #: vLLM's --kv-events-config ZMQ publisher: bind a PUB socket here (tcp://127.0.0.1:* takes a free port) and
    #: publish the prefix cache's changes after every step (steersman.enginesim.kv_events); None: off (vLLM's default)
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""  # vLLM KVEventsConfig.topic default
    #: vLLM's KVEventsConfig.replay_endpoint: a ROUTER socket bound here replays the last batches on request
    kv_events_replay_endpoint: str | None = None
    #: vLLM's --enable-sleep-mode in dev mode: POST /sleep, POST /wake_up, GET /is_sleeping (404 without)
    sleep_mode: bool = False
    #: vLLM's --lora-modules: adapters served besides the model, listed in /v1/models with it as ``parent``; a
    #: request names one as its ``model``, and its prompt's KV is the adapter's own (keyed: steersman.text.lora)
    lora_modules: tuple[str, ...] = ()


class SimServer:
    """HTTP endpoints and lifecycle of one simulated replica."""

    def __init__(self, cfg: SimServerConfig, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.clock = clock or ScaledClock(cfg.speedup)
        gpu = gpu_profile(cfg.gpu)
        self.model_name = cfg.served_model_name or cfg.model  # like vLLM: the --model argument as typed
        self.engine = EngineModel(gpu=gpu, model=model_profile(cfg.model), settings=cfg.engine, warm=not cfg.cold_start, now=self.clock.now())
        if cfg.cold_start:
            self.engine.begin_load(self.clock.now())
        self.max_model_len = self.engine.max_model_len
        info = {
            "block_size": str(cfg.engine.block_size),
            "gpu_memory_utilization": str(cfg.engine.gpu_memory_utilization),
            "enable_prefix_caching": str(cfg.engine.enable_prefix_caching),
            "num_gpu_blocks": str(self.engine.state().kv_blocks_total),
            "gpu": gpu.name,
        }
        self.metrics = SimMetrics(self.model_name, lambda: self.engine.state(self.clock.now()), self.max_model_len, info)
        self.faults = Faults(cfg.faults)
        self.admin = AdminGuard(cfg.admin_key_sha256)
        self.runner = EngineRunner(self.engine, self.clock, self.metrics, self.faults)
        self.spans = OtlpSpans(cfg.otlp_traces_endpoint, "engine-sim") if cfg.otlp_traces_endpoint else None
        self.generator = Generator(self.model_name, self.max_model_len, cfg.engine.block_size, cfg.mean_output_tokens,
                                   self.runner, self.faults, self.clock, self.crash,
                                   cfg.engine.scheduling_policy == "priority", self.spans, cfg.lora_modules)
        self.generator.vocab = self.engine.model.vocab
        self.embedder = Embedder(self.generator, self.engine.model.hidden)
        self.kv_events: KvEventPublisher | None = None
        if cfg.kv_events_endpoint:
            self.kv_events = KvEventPublisher(cfg.kv_events_endpoint, cfg.kv_events_topic, cfg.engine.block_size,
                                              cfg.kv_events_replay_endpoint)
            self.engine.kv.listener = self.kv_events
            self.runner.after_step = self.kv_events.flush
        self.port = cfg.port
        self._refusal: asyncio.Task | None = None  # refuse_for_s under way
        self._stopping = False
        self.http = HttpServer(error_body, DEFAULTS.gateway.max_body_bytes)
        for method, path, handler in (
            ("POST", "/v1/chat/completions", self.generator.chat),
            ("POST", "/v1/completions", self.generator.completions),
            ("POST", "/v1/embeddings", self.embedder.embeddings),
            ("GET", "/v1/models", self.models),
            ("GET", "/health", self.health),
            ("GET", "/metrics", self.metrics_handler),
            ("GET", "/admin/faults", self.get_faults),
            ("POST", "/admin/faults", self.set_faults),
            ("DELETE", "/admin/faults", self.clear_faults),
        ):
            self.http.route(method, path, handler)
        if cfg.sleep_mode:
            self.http.route("POST", "/sleep", self.sleep)
            self.http.route("POST", "/wake_up", self.wake_up)
            self.http.route("GET", "/is_sleeping", self.is_sleeping)

    @property
    def url(self) -> str:
        return http_url(self.cfg.host, self.port)

    # ---- lifecycle -------------------------------------------------------
    async def start(self) -> int:
        warm_up_tokenizer()  # compile (or load) the prompt tokenizer before the first request
        self.runner.start()
        if self.kv_events is not None:
            self.kv_events.start()
        self.port = await self.http.start(self.cfg.host, self.cfg.port)
        return self.port

    async def stop(self) -> None:
        self._stopping = True
        self._end_refusal()
        await self.runner.stop()
        await self.http.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()
        if self.spans is not None:
            await asyncio.to_thread(self.spans.shutdown)  # what is buffered is exported

    async def crash(self) -> None:
        """Die like a killed process: reset every connection, stop listening."""
        self.faults.dead = True
        for c in list(self.http.connections):
            if c.transport is not None:
                c.transport.abort()
        await self.http.stop()
        if self.cfg.exit_on_crash:
            os._exit(17)

    async def refuse(self, seconds: float) -> None:
        """Close the listener for ``seconds`` (real time): new connections are refused, and so are the idle
        keep-alive ones (a client's or gateway's pool would otherwise go on being served); requests and streams in
        flight go on, their connections closing after them.  Then listen again and clear ``refuse_for_s`` from
        the fault spec."""
        self._end_refusal()  # a new refusal replaces one under way
        self._refusal = asyncio.current_task()
        self.http.close_listener(idle_too=True)
        try:
            await asyncio.sleep(seconds)
        finally:
            if self._refusal is asyncio.current_task():
                self._refusal = None
        if not self.faults.dead and not self._stopping:
            await self.http.start(self.cfg.host, self.port)
        if self.faults.spec.refuse_for_s:
            self.faults.spec = msgspec.structs.replace(self.faults.spec, refuse_for_s=0.0)

    def _end_refusal(self) -> bool:
        """Cancel a refusal under way (its listener stays closed); True if there was one."""
        task, self._refusal = self._refusal, None
        if task is None or task.done():
            return False
        task.cancel()
        return True

    # ---- admin -------------------------------------------------------------
    def _check_admin(self, request: HttpRequest) -> None:
        err = self.admin.check(request.headers.get("authorization"))
        if err is not None:
            raise err

    async def get_faults(self, request: HttpRequest) -> None:
        try:
            self._check_admin(request)
        except ApiError as e:
            request.respond(e.status, e.body())
            return
        request.respond(200, msgspec.json.encode(self.faults.spec))

    async def set_faults(self, request: HttpRequest) -> None:
        try:
            self._check_admin(request)
            spec = msgspec.json.decode(request.body, type=FaultSpec)
            self.faults.apply(spec)
        except ApiError as e:
            request.respond(e.status, e.body())
            return
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
            request.respond(400, bad_request(f"Invalid fault spec: {e}", None).body())
            return
        await self._refuse_as(spec)
        await self.get_faults(request)

    async def clear_faults(self, request: HttpRequest) -> None:
        try:
            self._check_admin(request)
        except ApiError as e:
            request.respond(e.status, e.body())
            return
        self.faults.apply(FaultSpec())
        await self._refuse_as(self.faults.spec)
        await self.get_faults(request)

    async def _refuse_as(self, spec: FaultSpec) -> None:
        """A new fault spec replaces every fault: a refusal under way ends (the port listens again) and the spec's
        own, if any, begins."""
        if self._end_refusal() and spec.refuse_for_s <= 0 and not self.faults.dead:
            await self.http.start(self.cfg.host, self.port)
        if spec.refuse_for_s > 0:
            self.http.close_listener(idle_too=True)  # at once: refused from the answer on (its connection closes)
            asyncio.get_running_loop().create_task(self.refuse(spec.refuse_for_s))

    # ---- sleep mode (vLLM's dev-mode routes) ---------------------------------
    async def sleep(self, request: HttpRequest) -> None:
        level = parse_qs(request.query).get("level", ["1"])[-1]
        if level not in ("1", "2"):
            request.respond(400, bad_request(f"sleep level must be 1 or 2, got {level!r}", "level").body())
            return
        self.engine.unload()  # level 1 keeps the weights in host memory, level 2 drops them: both leave the GPU
        self.metrics.sleep_level = int(level)
        request.respond(200, b"", b"text/plain")

    async def wake_up(self, request: HttpRequest) -> None:
        if self.metrics.sleep_level:
            self.metrics.sleep_level = 0
            self.engine.begin_load(self.clock.now())
            self.runner.poke()  # requests that came while asleep run once the weights are back
        request.respond(200, b"", b"text/plain")

    async def is_sleeping(self, request: HttpRequest) -> None:
        request.respond(200, orjson.dumps({"is_sleeping": self.metrics.sleep_level > 0}))

    # ---- plain endpoints ---------------------------------------------------
    async def health(self, request: HttpRequest) -> None:
        request.respond(200, b"", b"text/plain")

    async def metrics_handler(self, request: HttpRequest) -> None:
        page = self.metrics.render(wanted(request.query) if request.query else None)
        request.respond(200, page, b"text/plain; version=0.0.4; charset=utf-8")

    async def models(self, request: HttpRequest) -> None:
        created = int(self.clock.wall())
        data = {"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": created,
            "owned_by": "steersman-sim", "root": self.model_name, "parent": None, "max_model_len": self.max_model_len,
        }, *({"id": name, "object": "model", "created": created, "owned_by": "steersman-sim", "root": name,
              "parent": self.model_name, "max_model_len": self.max_model_len} for name in self.cfg.lora_modules)]}
        request.respond(200, orjson.dumps(data))
