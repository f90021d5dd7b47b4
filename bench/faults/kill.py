"""bench/faults "kill" scenario: a replica dies mid-stream under load; what the clients see.

Starts engine-sim replicas and the real gateway on 127.0.0.1 (``LiveFleet``),
runs every request once on the healthy fleet (the reference: engine-sim's text
is a function of the context), then runs them all again concurrently and kills
replica 0 (engine-sim's crash: connections reset, port closed) once every stream
has its first token, so every stream it serves is mid-way.  Prints, side by side
in the same run:

* streams completed / started, lost and duplicated tokens against the
  reference, streams whose ``usage`` differs, migrations counted by the gateway;
* the failover gap (longest pause a migrated stream saw) against the normal
  inter-token gap of the same run (p50 / p99 of streams that were not moved),
  and the failover gaps as a ratio of the normal p99.

    .venv/bin/python bench/faults/kill.py [--replicas 3] [--streams 24] [--max-tokens 256] [--speedup 4]

Importable: ``run(argv) -> dict`` returns the numbers (for a scenario runner).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from openai import OpenAI

from steersman.enginesim.app import SimServerConfig
from steersman.enginesim.faults import FaultSpec
from steersman.testing import LiveFleet

MODEL = "llama-3.1-8b"
_FULL = {"ignore_eos": True}  # every stream runs its max_tokens: each one on replica 0 is mid-way at the kill


@dataclass
class Stream:
    pieces: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    usage: tuple[int, int] | None = None
    error: str | None = None

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:])]


def _one(client: OpenAI, i: int, max_tokens: int, started: threading.Semaphore | None = None) -> Stream:
    s = Stream()
    try:
        if i % 2 == 0:
            it = client.chat.completions.create(
                model=MODEL, stream=True, max_tokens=max_tokens, stream_options={"include_usage": True}, extra_body=_FULL,
                messages=[{"role": "user", "content": f"Request {i}: tell me about replicas and queues."}])
        else:
            it = client.completions.create(model=MODEL, stream=True, max_tokens=max_tokens, stream_options={"include_usage": True},
                                           prompt=f"Request {i}: once upon a time ", extra_body=_FULL)
        for ch in it:
            now = time.monotonic()
            if ch.usage is not None:
                s.usage = (ch.usage.prompt_tokens, ch.usage.completion_tokens)
            for c in ch.choices:
                text = c.delta.content if hasattr(c, "delta") else c.text
                if hasattr(c, "delta") and c.delta.role is not None:
                    continue
                if text is not None:
                    s.pieces.append(text)
                    s.times.append(now)
                    if started is not None and len(s.pieces) == 1:
                        started.release()
    except Exception as e:  # noqa: BLE001 - a broken stream is a result here
        s.error = f"{type(e).__name__}: {e}"[:200]
    return s


def _diff(got: list[str], ref: list[str]) -> tuple[int, int]:
    """(lost, duplicated) tokens of ``got`` against ``ref`` (as multisets: order errors show as both)."""
    g, r = Counter(got), Counter(ref)
    return sum((r - g).values()), sum((g - r).values())


def _migrations(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("steersman:stream_migrations_total"))


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def run(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="kill a replica mid-stream under load")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--streams", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--speedup", type=float, default=4.0)
    a = ap.parse_args(argv)
    sims = [SimServerConfig(gpu="H100", model=MODEL, speedup=a.speedup, port=0) for _ in range(a.replicas)]
    with LiveFleet(sims=sims, policy="round-robin") as lf, \
            OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        with ThreadPoolExecutor(a.streams) as pool:
            refs = list(pool.map(lambda i: _one(client, i, a.max_tokens), range(a.streams)))
        assert not any(r.error for r in refs), [r.error for r in refs if r.error]
        before = _migrations(lf.url)

        started = threading.Semaphore(0)
        t0 = time.monotonic()
        with ThreadPoolExecutor(a.streams) as pool:
            futs = [pool.submit(_one, client, i, a.max_tokens, started) for i in range(a.streams)]
            for _ in range(a.streams):  # every stream has its first token (bounded wait)
                if not started.acquire(timeout=max(0.0, t0 + 10 - time.monotonic())):
                    break

            async def kill() -> None:
                lf.sims[0].faults.apply(FaultSpec(die_after_tokens=0))
                await lf.sims[0].crash()

            lf.call(kill)
            got = [f.result() for f in futs]
        wall = time.monotonic() - t0
        moved = _migrations(lf.url) - before
        died = lf.sims[0].faults.dead
    lost = dup = bad_usage = 0
    for g, r in zip(got, refs):
        lo, du = _diff(g.pieces, r.pieces)
        lost, dup = lost + lo, dup + du
        bad_usage += g.usage != r.usage
    normal = [max(g.gaps(), default=0.0) for g, r in zip(got, refs) if g.pieces == r.pieces]
    all_gaps = [x for g in got for x in g.gaps()]
    worst = sorted((max(g.gaps(), default=0.0) for g in got), reverse=True)[: int(moved) or 1]
    itl50, itl99 = _pct(all_gaps, 0.5), _pct(all_gaps, 0.99)
    res = {
        "replicas": a.replicas, "streams": a.streams, "max_tokens": a.max_tokens, "speedup": a.speedup,
        "replica_killed": died, "completed": sum(g.error is None for g in got), "errors": [g.error for g in got if g.error],
        "lost_tokens": lost, "duplicated_tokens": dup, "usage_mismatches": bad_usage,
        "exact_streams": sum(g.pieces == r.pieces for g, r in zip(got, refs)), "migrations": moved,
        "itl_p50_ms": itl50 * 1e3, "itl_p99_ms": itl99 * 1e3,
        "failover_gap_ms": [x * 1e3 for x in worst], "wall_s": wall, "normal_streams": len(normal),
    }
    return res


def main() -> None:
    r = run(sys.argv[1:])
    print(f"bench/faults kill: {r['replicas']} engine-sim replicas (x{r['speedup']:g}), {r['streams']} concurrent streams "
          f"of {r['max_tokens']} tokens (chat + completions, include_usage); replica 0 killed mid-stream: {r['replica_killed']}")
    print(f"  streams completed        {r['completed']}/{r['streams']}   (a relay without continuation loses the "
          f"{int(r['migrations'])} that were on the dead replica)")
    print(f"  token-exact vs reference {r['exact_streams']}/{r['streams']}   lost tokens {r['lost_tokens']}   "
          f"duplicated tokens {r['duplicated_tokens']}   usage mismatches {r['usage_mismatches']}")
    print(f"  migrations (gateway)     {int(r['migrations'])}")
    gaps = r["failover_gap_ms"]
    ratio = ", ".join(f"{g / r['itl_p99_ms']:.1f}x" for g in gaps)
    print(f"  inter-token gap, ms      p50 {r['itl_p50_ms']:.2f}   p99 {r['itl_p99_ms']:.2f}   "
          f"failover gaps {', '.join(f'{g:.1f}' for g in gaps)}  (= {ratio} the p99)")
    if r["errors"]:
        print("  errors:", *r["errors"][:5], sep="\n    ")


if __name__ == "__main__":
    main()
