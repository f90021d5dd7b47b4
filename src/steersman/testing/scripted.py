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

from steersman.api.errors import error_body
from steersman.http.server import HttpRequest, HttpServer

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
    scheduling: str = "fcfs"  # "priority": takes a request's `priority` (its fleet endpoint says so); fcfs: 400s it


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
        self.http = HttpServer(error_body, 64 * 1024 * 1024)
        for path in ("/v1/chat/completions", "/v1/completions"):
            self.http.route("POST", path, self._generate)
        self.http.route("GET", "/v1/models", self._models)
        self.http.route("GET", "/health", self._health)
        self.http.route("GET", "/metrics", self._metrics)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self.port = await self.http.start(self.host, 0)

    async def stop(self) -> None:
        await self.http.stop()

    async def _models(self, request: HttpRequest) -> None:
        request.respond(200, orjson.dumps({"object": "list", "data": [{"id": self.script.model, "object": "model"}]}))

    async def _health(self, request: HttpRequest) -> None:
        request.respond(200, b"", b"text/plain")

    async def _metrics(self, request: HttpRequest) -> None:
        request.respond(200, b'vllm:num_requests_running{engine="0"} 0\n', b"text/plain")

    async def _generate(self, request: HttpRequest) -> None:
        s = self.script
        body = orjson.loads(request.body)
        self.seen.bodies.append(body)
        try:
            if s.status != 200:
                request.respond(s.status, error_body(s.status, "scripted failure", "scripted"))
                return
            if body.get("priority", 0) != 0 and s.scheduling != "priority":  # as vLLM without priority scheduling
                request.respond(400, error_body(400, f"Got priority {body['priority']} but Priority scheduling is "
                                                     "not enabled.", "invalid_priority"))
                return
            if s.hang:
                await asyncio.Event().wait()
            if not body.get("stream"):
                await asyncio.sleep(s.gap_s * len(s.pieces))
                text = "".join(s.pieces)
                self.seen.completed += 1
                request.respond(200, orjson.dumps({
                    "id": "x", "object": "chat.completion", "model": s.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": len(s.pieces), "total_tokens": 1 + len(s.pieces)},
                }))
                return
            request.start_stream()
            if s.malformed is not None:
                request.send(s.malformed)
                request.end_stream()
                return
            for i, p in enumerate(s.pieces):
                if s.crash_after is not None and i >= s.crash_after:
                    request.conn.transport.abort()
                    return
                if s.gap_s:
                    await asyncio.sleep(s.gap_s)
                chunk = {"id": "x", "object": "chat.completion.chunk", "model": s.model,
                         "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
                request.send(b"data: " + orjson.dumps(chunk) + b"\n\n")
            request.send(b"data: [DONE]\n\n")
            request.end_stream()
            self.seen.completed += 1
        except asyncio.CancelledError:
            self.seen.cancelled += 1
            raise
