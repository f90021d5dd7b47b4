"""``steersman engine-sim``: one simulated replica served over real HTTP.

OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions`` (SSE and
plain), ``/v1/models``, ``/health``, ``/metrics`` with vLLM's metric names, and
``/admin/faults`` for fault injection.  Tokens are paced by the engine model
(:mod:`steersman.sim`) on the injected clock.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
from dataclasses import dataclass, field

import msgspec
import orjson
from aiohttp import web

from steersman.api.body import read_body
from steersman.api.errors import ApiError, bad_request, not_found_model
from steersman.api.schema import ChatCompletionRequest, CompletionRequest, decode_chat, decode_completion
from steersman.clock import Clock, ScaledClock
from steersman.config import DEFAULTS, EngineSettings
from steersman.enginesim.chunks import ChunkWriter, full_response, usage_of
from steersman.enginesim.faults import Faults, FaultSpec
from steersman.enginesim.metrics import SimMetrics
from steersman.enginesim.runner import EngineRunner, Job
from steersman.enginesim.textgen import generate
from steersman.sim import EngineModel, SimRequest, gpu_profile, model_profile
from steersman.text import block_hashes, render_chat, tokenize

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
    admin_key: str | None = None
    exit_on_crash: bool = False


class SimServer:
    """The aiohttp application and lifecycle of one simulated replica."""

    def __init__(self, cfg: SimServerConfig, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.clock = clock or ScaledClock(cfg.speedup)
        gpu = gpu_profile(cfg.gpu)
        model = model_profile(cfg.model)
        self.model_name = cfg.served_model_name or cfg.model  # like vLLM: the --model argument as typed
        self.engine = EngineModel(gpu=gpu, model=model, settings=cfg.engine, warm=not cfg.cold_start, now=self.clock.now())
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
        self.metrics = SimMetrics(self.model_name, self.engine.state, self.max_model_len, info)
        self.faults = Faults(cfg.faults)
        self.runner = EngineRunner(self.engine, self.clock, self.metrics, self.faults)
        self._ids = itertools.count()
        self._id_prefix = secrets.token_hex(4)
        self._transports: set[asyncio.Transport] = set()
        self._app_runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = cfg.port
        self.app = self._build_app()

    # ---- lifecycle -------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=DEFAULTS.gateway.max_body_bytes + 1024)
        r = app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics_handler)
        r.add_get("/admin/faults", self.get_faults)
        r.add_post("/admin/faults", self.set_faults)
        r.add_delete("/admin/faults", self.clear_faults)
        return app

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    async def start(self) -> int:
        self.runner.start()
        self._app_runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._app_runner.setup()
        await self._listen(self.cfg.port)
        return self.port

    async def _listen(self, port: int) -> None:
        assert self._app_runner is not None
        self._site = web.TCPSite(self._app_runner, self.cfg.host, port, reuse_address=True)
        await self._site.start()
        server = self._site._server  # noqa: SLF001 - aiohttp exposes no public accessor for the bound port
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await self.runner.stop()
        if self._app_runner is not None:
            await self._app_runner.cleanup()
            self._app_runner = None

    async def crash(self) -> None:
        """Die like a killed process: reset every connection, stop listening."""
        self.faults.dead = True
        for t in list(self._transports):
            t.abort()
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self.cfg.exit_on_crash:
            os._exit(17)

    async def refuse(self, seconds: float) -> None:
        """Close the listener for ``seconds`` (real time): connections are refused."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        await asyncio.sleep(seconds)
        if not self.faults.dead:
            await self._listen(self.port)

    # ---- admin -------------------------------------------------------------
    def _check_admin(self, request: web.Request) -> None:
        key = self.cfg.admin_key
        if key and request.headers.get("Authorization", "") != f"Bearer {key}":
            raise ApiError(401, "Admin endpoints need the admin key.", "authentication_error", None, "invalid_api_key")

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.Response(body=msgspec.json.encode(self.faults.spec), content_type="application/json")

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            self._check_admin(request)
            spec = msgspec.json.decode(await request.read(), type=FaultSpec)
            self.faults.apply(spec)
        except ApiError as e:
            return e.response()
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
            return bad_request(f"Invalid fault spec: {e}", None).response()
        if spec.refuse_for_s > 0:
            asyncio.get_running_loop().create_task(self.refuse(spec.refuse_for_s))
        return await self.get_faults(request)

    async def clear_faults(self, request: web.Request) -> web.Response:
        try:
            self._check_admin(request)
        except ApiError as e:
            return e.response()
        self.faults.apply(FaultSpec())
        return await self.get_faults(request)

    # ---- plain endpoints ---------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        data = {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": int(self.clock.wall()),
                    "owned_by": "steersman-sim",
                    "root": self.model_name,
                    "max_model_len": self.max_model_len,
                }
            ],
        }
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    # ---- generation --------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def _prepare(self, req: ChatCompletionRequest | CompletionRequest, chat: bool) -> tuple[list[int], str]:
        if req.model != self.model_name:
            raise not_found_model(req.model)
        if req.n != 1:
            raise bad_request("engine-sim supports only `n` = 1.", "n")
        if chat:
            prompt = render_chat(req.messages, continue_final=req.continue_final_message)
            return tokenize(prompt), prompt[-1:]
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], list):
            if len(p) != 1:
                raise bad_request("engine-sim supports one prompt per request.", "prompt")
            p = p[0]
        if isinstance(p, list) and p and isinstance(p[0], int):
            return list(p), "x"
        if isinstance(p, list):
            if len(p) != 1:
                raise bad_request("engine-sim supports one prompt per request.", "prompt")
            p = p[0]
        return tokenize(p), p[-1:]

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            self._transports.add(transport)
        job = None
        try:
            body = await read_body(request, DEFAULTS.gateway.max_body_bytes)
            limit = DEFAULTS.gateway.max_tokens_limit
            req = decode_chat(body, limit) if chat else decode_completion(body, limit)
            if self.faults.should_error():
                raise ApiError(self.faults.spec.error_status, "Injected engine failure.", "server_error", None, "injected_fault")
            ids, tail = self._prepare(req, chat)
            room = self.max_model_len - len(ids)
            want = req.output_limit
            if room < 1 or (want is not None and want > room):
                raise bad_request(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{len(ids) + (want or 1)} tokens ({len(ids)} in the prompt, {want or 1} for the completion).",
                    "messages" if chat else "prompt",
                )
            gen = generate(ids, tail, want or room, self.cfg.mean_output_tokens, req.ignore_eos, _stops(req.stop))
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{self._id_prefix}{next(self._ids):x}"
            now = self.clock.now()
            sim = SimRequest(
                req_id=rid,
                prompt_len=len(ids),
                max_output=len(gen.pieces),
                block_hashes=block_hashes(ids, self.cfg.engine.block_size),
                priority=req.priority,
                arrival=now,
            )
            job = Job(sim=sim, gen=gen, arrival=now)
            try:
                self.runner.submit(job)
            except ValueError as e:
                job = None
                raise bad_request(str(e), "messages" if chat else "prompt") from None
            created = int(self.clock.wall())
            if req.stream:
                include_usage = bool(req.stream_options and req.stream_options.include_usage)
                return await self._stream(request, job, ChunkWriter(chat, rid, created, self.model_name), include_usage)
            await self.runner.wait(job, len(gen.pieces))
            text = "".join(gen.pieces[: job.produced]) if job.produced < len(gen.pieces) else gen.text
            usage = usage_of(sim.prompt_len, job.produced, sim.num_cached_tokens)
            return web.Response(
                body=full_response(chat, rid, created, self.model_name, text, gen.finish_reason, usage),
                content_type="application/json",
            )
        except ApiError as e:
            return e.response()
        finally:
            if job is not None and not job.done:
                self.runner.cancel(job)
            if transport is not None:
                self._transports.discard(transport)

    async def _stream(self, request: web.Request, job: Job, w: ChunkWriter, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        # like vLLM, the assistant-role chunk goes out together with the first token
        head = w.role() if w.chat else b""
        pieces = job.gen.pieces
        total = len(pieces)
        sent = 0
        while sent < total:
            await self.runner.wait(job, sent)
            ready = min(job.produced, total)
            if ready <= sent:
                if job.done:
                    break
                continue
            n = self.faults.tokens_allowed(ready - sent)
            last = total - 1
            buf = head + b"".join(
                w.token(pieces[i], job.gen.finish_reason if i == last else None) for i in range(sent, sent + n)
            )
            head = b""
            await resp.write(buf)
            sent += n
            if self.faults.streamed(n):
                await self.crash()
                return resp
        tail = head
        if include_usage:
            tail += w.usage(usage_of(job.sim.prompt_len, sent, job.sim.num_cached_tokens))
        await resp.write(tail + w.done())
        await resp.write_eof()
        return resp


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)
