"""Helpers: run a stream with the official client and keep everything the client saw."""

from __future__ import annotations

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
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("steersman_stream_migrations_total"))


def sims(n: int = 2, speedup: float = 50.0):
    from steersman.enginesim.app import SimServerConfig

    return [SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=speedup, port=0) for _ in range(n)]
