"""Helpers: run a stream with the official client and keep everything the client saw."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx


@dataclass
class Seen:
    pieces: list[str] = field(default_factory=list)  # one entry per token chunk, in order
    roles: int = 0
    heads: set = field(default_factory=set)  # (id, created, model) of every chunk
    finish: str | None = None
    usage: object = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def chat(client, **kw) -> Seen:
    s = Seen()
    for ch in client.chat.completions.create(stream=True, **kw):
        s.heads.add((ch.id, ch.created, ch.model))
        if ch.usage is not None:
            s.usage = ch.usage
        for c in ch.choices:
            if c.delta.role is not None:
                s.roles += 1
            if c.delta.content is not None and c.delta.role is None:
                s.pieces.append(c.delta.content)
            if c.finish_reason is not None:
                s.finish = c.finish_reason
    return s


def completion(client, **kw) -> Seen:
    s = Seen()
    for ch in client.completions.create(stream=True, **kw):
        s.heads.add((ch.id, ch.created, ch.model))
        if ch.usage is not None:
            s.usage = ch.usage
        for c in ch.choices:
            s.pieces.append(c.text)
            if c.finish_reason is not None:
                s.finish = c.finish_reason
    return s


def migrations(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("steersman:stream_migrations_total"))


def sims(n: int = 2, speedup: float = 50.0):
    from steersman.enginesim.app import SimServerConfig

    return [SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=speedup, port=0) for _ in range(n)]


async def serve_script(reader, writer, steps_for) -> None:
    """A raw engine's connection: GETs (the gateway's scrapes) answered empty until a POST, whose JSON body
    ``steps_for(body)`` turns into the steps of its streamed answer: bytes (one chunk each), ``"hang"`` (30 s),
    ``"reset"`` (abort), ``"end"`` (the last chunk, then wait); after the last step the response ends."""
    import asyncio

    import orjson

    try:
        while True:  # keep-alive for the gateway's scrapes (GET /metrics every 50 ms); a POST ends the connection
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await reader.readexactly(length) if length else b""
            if head.startswith(b"POST"):
                break
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        steps = steps_for(orjson.loads(body))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n")
        for step in steps:
            if step == "hang":
                await asyncio.sleep(30)  # the gateway must end the client's stream long before
                return
            if step == "reset":
                await asyncio.sleep(0.02)
                writer.transport.abort()
                return
            if step == "end":
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.2)
                return
            writer.write(b"%x\r\n%s\r\n" % (len(step), step))
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


@contextmanager
def raw_engines(handle, n: int = 1):
    """``n`` raw engines serving connections with ``handle(reader, writer)``, on a loop of their own in a thread:
    their URLs."""
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    servers = [loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0)) for _ in range(n)]
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
    finally:
        async def shutdown():
            for s in servers:
                s.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
