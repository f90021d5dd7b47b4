"""A closed-loop streaming client (aiohttp, TCP_NODELAY) that times TTFT and counts output tokens."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import orjson

from workload import Request


@dataclass(slots=True)
class Result:
    ok: bool
    ttft: float | None  # seconds to the first content token
    tokens: int  # content events (one token each on llama-server / engine-sim)
    e2e: float
    error: str = ""


async def _one(session: aiohttp.ClientSession, url: str, model: str, req: Request, max_tokens: int,
               headers: dict[str, str]) -> Result:
    body = {"model": model, "messages": list(req.messages), "stream": True, "max_tokens": max_tokens, "temperature": 0}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    try:
        async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                                headers={"Content-Type": "application/json", **headers}) as resp:
            if resp.status != 200:
                return Result(False, None, 0, time.perf_counter() - t0, f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                try:
                    ev = orjson.loads(line[6:])
                except orjson.JSONDecodeError:
                    continue
                for ch in ev.get("choices") or ():
                    if (ch.get("delta") or {}).get("content"):
                        tokens += 1
                        if ttft is None:
                            ttft = time.perf_counter() - t0
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return Result(False, ttft, tokens, time.perf_counter() - t0, repr(e))
    return Result(ttft is not None, ttft, tokens, time.perf_counter() - t0, "" if ttft is not None else "no token")


async def probe(session: aiohttp.ClientSession, url: str, model: str, text: str) -> float | None:
    """One short unique prompt, one output token, on ``session``'s kept-alive connection: its TTFT in seconds
    minus the engine's own prompt time where the engine reports it (llama-server's ``timings.prompt_ms``),
    so that what remains is the path to and from the engine, not how much of the prompt its slot reused.

    llama-server closes the connection after every streamed response (though it answers ``Keep-Alive``);
    a request that finds its kept connection closed before any answer is sent once more on a new one, timed
    from then, as a pooling client (and steersman's upstream pool) does."""
    for attempt in (0, 1):
        try:
            return await _probe_once(session, url, model, text)
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            if attempt:
                return None
    return None


async def _probe_once(session: aiohttp.ClientSession, url: str, model: str, text: str) -> float | None:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": True, "max_tokens": 1,
            "temperature": 0}
    t0 = time.perf_counter()
    ttft, prompt_s = None, 0.0
    try:
        async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                                headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                return None
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                ev = orjson.loads(line[6:])
                # the first token's event: its text, or (a greedy first token that renders as nothing, which
                # llama-server sends no content event for) the final event carrying the finish reason
                if ttft is None and any((ch.get("delta") or {}).get("content") or ch.get("finish_reason")
                                        for ch in ev.get("choices") or ()):
                    ttft = time.perf_counter() - t0
                timings = ev.get("timings")
                if timings and timings.get("prompt_ms") is not None:
                    prompt_s = timings["prompt_ms"] / 1e3
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
        if ttft is not None:
            return None  # broke after its first token: a failed request, not a stale connection
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError):
        return None
    return None if ttft is None else ttft - prompt_s


async def run(url: str, model: str, reqs: list[Request], concurrency: int, max_tokens: int,
              timeout: float = 300.0, headers: dict[str, str] | None = None) -> tuple[list[Result], float]:
    """Send ``reqs`` in order with ``concurrency`` streams in flight; returns (results, wall seconds)."""
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    results: list[Result | None] = [None] * len(reqs)
    nxt = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal nxt
        while nxt < len(reqs):
            i = nxt
            nxt += 1
            results[i] = await _one(session, url, model, reqs[i], max_tokens, headers or {})

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    return [r for r in results if r is not None], time.perf_counter() - t0
