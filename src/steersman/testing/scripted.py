"""A scripted OpenAI-compatible engine over real HTTP, for gateway tests.

Unlike engine-sim (which models a GPU), every response here is exactly what the
test scripts: the pieces to stream, the gap between them, and a fault (crash
after k pieces, an HTTP error, a hang, or malformed SSE).  Answers are shaped as
vLLM's: chat or text completion by path, ``max_tokens`` pieces at most (finish
reason ``length``, else ``stop``), a usage chunk when ``stream_options.include_usage``.
It records every request body it received and every request whose client went away.
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
    crash_after: int | None = None  # reset the connection after this many pieces (<= them; a whole answer: unsent)
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
            if body.get("stream"):
                await self._stream(request, body)
            else:
                await self._whole(request, body)
        except asyncio.CancelledError:
            self.seen.cancelled += 1
            raise

    def _answer(self, request: HttpRequest, body: dict) -> tuple[_Shape, tuple[str, ...], str, bool]:
        """The answer's shape (chat or text completion), its pieces (``max_tokens`` of them at most, one a token),
        its finish reason, and whether the engine crashes before finishing (``crash_after`` <= the pieces)."""
        s = self.script
        shape = _Shape(request.path != "/v1/completions", s.model)
        limit = body.get("max_completion_tokens")
        if limit is None:
            limit = body.get("max_tokens")
        pieces, finish = s.pieces, "stop"
        if isinstance(limit, int) and 0 <= limit < len(pieces):
            pieces, finish = pieces[:limit], "length"
        return shape, pieces, finish, s.crash_after is not None and s.crash_after <= len(pieces)

    async def _whole(self, request: HttpRequest, body: dict) -> None:
        shape, pieces, finish, crash = self._answer(request, body)
        gap = self.script.gap_s
        await asyncio.sleep(gap * (self.script.crash_after if crash else len(pieces)))
        if crash:  # the engine died before its answer was whole: nothing of it was sent
            request.start_stream(hold=True)  # (answered, as far as the server knows: its held head never leaves)
            request.conn.transport.abort()
            return
        self.seen.completed += 1
        request.respond(200, orjson.dumps(shape.whole("".join(pieces), finish, _usage(len(pieces)))))

    async def _stream(self, request: HttpRequest, body: dict) -> None:
        s = self.script
        shape, pieces, finish, crash = self._answer(request, body)
        request.start_stream()
        if s.malformed is not None:
            request.send(s.malformed)
            request.end_stream()
            return
        for p in pieces[:s.crash_after] if crash else pieces:
            if s.gap_s:
                await asyncio.sleep(s.gap_s)
            request.send(_event(shape.chunk(p, None)))
        if crash:  # after its crash_after-th piece (the last one too): no finish reason, no [DONE]
            request.conn.transport.abort()
            return
        request.send(_event(shape.chunk("", finish)))
        if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM: one chunk without choices
            request.send(_event(shape.usage_chunk(_usage(len(pieces)))))
        request.send(b"data: [DONE]\n\n")
        request.end_stream()
        self.seen.completed += 1


def _usage(completion_tokens: int) -> dict:
    return {"prompt_tokens": 1, "completion_tokens": completion_tokens, "total_tokens": 1 + completion_tokens}


def _event(data: dict) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


@dataclass(slots=True, frozen=True)
class _Shape:
    """The OpenAI objects of a chat completion, or of a text completion (``/v1/completions``: ``choices[i].text``)."""

    chat: bool
    model: str

    def _obj(self, kind: str, choices: list, **rest) -> dict:
        return {"id": "x", "object": kind, "created": 0, "model": self.model, "choices": choices, **rest}

    def whole(self, text: str, finish: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            return self._obj("chat.completion", [choice], usage=usage)
        return self._obj("text_completion", [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                         usage=usage)

    def chunk(self, piece: str, finish: str | None) -> dict:
        if self.chat:
            delta = {"content": piece} if piece else {}
            return self._obj("chat.completion.chunk", [{"index": 0, "delta": delta, "finish_reason": finish}])
        return self._obj("text_completion", [{"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}])

    def usage_chunk(self, usage: dict) -> dict:
        return self._obj("chat.completion.chunk" if self.chat else "text_completion", [], usage=usage)
