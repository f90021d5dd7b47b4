"""An async load generator for fault drills: streaming clients that retry like real ones.

Used by the live fault tests (``tests/faults``) and ``bench/faults``.  Each
client request streams a chat completion through the gateway with ``httpx``
and records its time to first token, end-to-end time and final status.  A
429 / 503 answer is retried after its ``Retry-After`` (scaled by
``retry_after_scale``, since drills run engines faster than real time), up to
``retries`` times while the request's own patience lasts; every HTTP request
sent (first tries and retries) is counted, so retry amplification can be
measured against the gateway's upstream attempts.

Run it on its own event loop in its own thread (:func:`run_in_thread`) beside a
:class:`~steersman.testing.LiveFleet`.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["Client", "Done", "Load", "closed_loop", "open_loop", "percentile", "run_in_thread", "in_background"]


@dataclass(slots=True)
class Done:
    """One client request's fate (after its retries)."""

    cls: str  # the traffic class label (e.g. a tenant)
    status: int  # the last HTTP status (0: transport error)
    start: float
    end: float
    ttft: float | None = None  # from the first try's send to the first content event (what the user waited)
    tries: int = 1
    tokens: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


@dataclass(slots=True)
class Load:
    """A traffic class: its headers and body, and how often it appears."""

    cls: str
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0


class Client:
    """Streaming chat requests through one gateway URL, retrying 429/503 after ``Retry-After``."""

    def __init__(self, url: str, retries: int = 3, retry_after_scale: float = 1.0, patience_s: float = 30.0,
                 max_connections: int = 512) -> None:
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.retries = retries
        self.retry_after_scale = retry_after_scale
        self.patience_s = patience_s
        self.sent = 0  # HTTP requests sent (first tries and retries)
        self.missing_retry_after = 0  # 429 / 503 answers without a Retry-After header
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(patience_s + 5.0),
                                      limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, load: Load) -> Done:
        start = time.monotonic()
        give_up = start + self.patience_s
        tries = 0
        while True:
            tries += 1
            self.sent += 1
            status, ttft, tokens, err, retry_after = await self._once(load)
            now = time.monotonic()
            if status in (429, 503) and retry_after is None:
                self.missing_retry_after += 1
            if status in (429, 503) and tries <= self.retries:
                wait = (retry_after if retry_after is not None else 1.0) * self.retry_after_scale
                if now + wait < give_up:
                    await asyncio.sleep(wait)
                    continue
            return Done(load.cls, status, start, now, None if ttft is None else ttft - start, tries, tokens, err)

    async def _once(self, load: Load) -> tuple[int, float | None, int, str, float | None]:
        ttft = None
        tokens = 0
        try:
            async with self.http.stream("POST", self.url, json={**load.body, "stream": True}, headers=load.headers) as r:
                if r.status_code != 200:
                    await r.aread()
                    ra = r.headers.get("retry-after")
                    return r.status_code, None, 0, "", float(ra) if ra else None
                err = ""
                done = False
                async for chunk in r.aiter_bytes():
                    if ttft is None and b'"content"' in chunk:
                        ttft = time.monotonic()
                    tokens += chunk.count(b'"content"')
                    if b'"error"' in chunk:
                        err = chunk.decode("utf-8", "replace")[:200]
                    if b"[DONE]" in chunk:
                        done = True
                if not done and not err:
                    err = "stream ended without [DONE]"
                return 200, ttft, tokens, err, None
        except httpx.HTTPError as e:
            return 0, None, 0, f"{type(e).__name__}: {e}", None


async def closed_loop(client: Client, load: Load, concurrency: int, duration_s: float) -> list[Done]:
    """``concurrency`` clients back to back for ``duration_s``: the fleet's capacity when it is the bottleneck."""
    out: list[Done] = []
    stop = time.monotonic() + duration_s

    async def worker() -> None:
        while time.monotonic() < stop:
            out.append(await client.request(load))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def open_loop(client: Client, loads: Sequence[Load], rate: float, duration_s: float, seed: int = 0,
                    on_tick: Callable[[float], None] | None = None) -> list[Done]:
    """Poisson arrivals at ``rate`` per second for ``duration_s``, each of a class drawn by weight."""
    rng = random.Random(seed)
    total = sum(x.weight for x in loads)
    tasks: list[asyncio.Task] = []
    t0 = time.monotonic()
    t = t0
    while True:
        t += rng.expovariate(rate)
        if t - t0 >= duration_s:
            break
        delay = t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if on_tick is not None:
            on_tick(t - t0)
        u = rng.random() * total
        for load in loads:
            u -= load.weight
            if u <= 0:
                break
        tasks.append(asyncio.ensure_future(client.request(load)))
    return list(await asyncio.gather(*tasks))


def in_background(fn: Callable[[], Any]) -> Callable[[float], Any]:
    """Run ``fn`` in a daemon thread; ``join(timeout)`` returns its result, or raises its error (TimeoutError while
    it still runs): the load's own failure, not a missing result, is what a failed drill must show."""
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["v"] = fn()
        except BaseException as e:  # noqa: BLE001 — handed to join
            box["e"] = e

    th = threading.Thread(target=main, name="load", daemon=True)
    th.start()

    def join(timeout: float) -> Any:
        th.join(timeout)
        if th.is_alive():
            raise TimeoutError(f"the load did not finish within {timeout:g} s")
        if "e" in box:
            raise box["e"]
        return box["v"]

    return join


def run_in_thread(coro_fn: Callable[[], Any], timeout: float = 120.0) -> Any:
    """Run ``coro_fn()`` on a fresh event loop in a new thread; returns its result (or raises its error)."""
    return in_background(lambda: asyncio.run(coro_fn()))(timeout)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100, nearest rank); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100.0 * len(s)) - 1))]
