"""A scripted OpenAI-compatible engine over real HTTP, for gateway tests.

Unlike engine-sim (which models a GPU), every response here is exactly what the
test scripts: the pieces to stream, the gap between them, and a fault (crash
after k pieces, an HTTP error, a hang, or malformed SSE).  It records every
request body it received and every request whose client went away.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson
from aiohttp import web

__all__ = ["Script", "ScriptedEngine"]


@dataclass(slots=True)
class Script:
    pieces: tuple[str, ...] = ("Hello", ",", " world", ".")
    gap_s: float = 0.0
    crash_after: int | None = None  # reset the connection after this many pieces
    status: int = 200
    hang: bool = False
    malformed: bytes | None = None  # raw bytes sent instead of a well-formed stream
    model: str = "scripted"


@dataclass(slots=True)
class _Seen:
    bodies: list[dict] = field(default_factory=list)
    cancelled: int = 0
    completed: int = 0


class ScriptedEngine:
    def __init__(self, script: Script | None = None, host: str = "127.0.0.1") -> None:
        self.script = script or Script()
        self.host = host
        self.port = 0
        self.seen = _Seen()
        self._runner: web.AppRunner | None = None
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self.app = app

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.script.model, "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running{engine=\"0\"} 0\n", content_type="text/plain")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        s = self.script
        body = orjson.loads(await request.read())
        self.seen.bodies.append(body)
        try:
            if s.status != 200:
                err = {"error": {"message": "scripted failure", "type": "server_error", "param": None, "code": None}}
                return web.json_response(err, status=s.status)
            if s.hang:
                await asyncio.Event().wait()
            if not body.get("stream"):
                await asyncio.sleep(s.gap_s * len(s.pieces))
                text = "".join(s.pieces)
                self.seen.completed += 1
                return web.json_response({"id": "x", "object": "chat.completion", "model": s.model,
                                          "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                                          "usage": {"prompt_tokens": 1, "completion_tokens": len(s.pieces), "total_tokens": 1 + len(s.pieces)}})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if s.malformed is not None:
                await resp.write(s.malformed)
                return resp
            for i, p in enumerate(s.pieces):
                if s.crash_after is not None and i >= s.crash_after:
                    request.transport.abort()
                    return resp
                if s.gap_s:
                    await asyncio.sleep(s.gap_s)
                chunk = {"id": "x", "object": "chat.completion.chunk", "model": s.model,
                         "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            self.seen.completed += 1
            return resp
        except asyncio.CancelledError:
            self.seen.cancelled += 1
            raise
