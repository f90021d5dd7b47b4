"""The idle prober's IO edge on a fake clock: whom it asks, and what it does with each kind of answer.

* a replica that answers is counted ``ok`` and asked again only after another silent interval;
* one that never answers is ejected once the timeout passes, and its probe's connection is dropped;
* one answering 5xx counts a server-side failure (the consecutive-failure count and the breaker see it);
* a llama.cpp replica (its adapter's ``idle_probe`` False: a hung loop fails its /metrics scrape) is never
  asked: a canary there took a free slot and evicted the prompt cached in it.
"""

from __future__ import annotations

import asyncio

import msgspec

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics
from steersman.fleet.prober import IdleProber
from steersman.fleet.state import Fleet, Replica
from steersman.reliability.guard import ReplicaGuard
from steersman.testing.clock import FakeClock

REL = DEFAULTS.reliability  # 5 s silent, 4 s timeout


class _Exchange:
    def __init__(self, status: int, answer: asyncio.Future) -> None:
        self.status = status
        self.answer = answer
        self.released = False

    async def done(self) -> None:
        await self.answer

    def release(self) -> None:
        self.released = True


class _Engine:
    shares_prefill_in_flight = True
    idle_probe = True

    def __init__(self, status: int = 200, hang: bool = False) -> None:
        self.status, self.hang = status, hang
        self.sent: list[tuple[str, dict]] = []
        self.exchanges: list[_Exchange] = []

    async def send(self, replica, path, body, sent=None, headers=b""):
        self.sent.append((path, msgspec.json.decode(body)))
        answer = asyncio.get_running_loop().create_future()
        if not self.hang:
            answer.set_result(None)
        ex = _Exchange(self.status, answer)
        self.exchanges.append(ex)
        return ex

    async def scrape(self, replica) -> EngineMetrics:
        return EngineMetrics(1, 0, 0.0)


class _LlamaCpp(_Engine):
    idle_probe = False


def _fleet(engines) -> Fleet:
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9 + i}", "engine-sim", "H100", ("llama-3.1-8b",), "default", 2.0, 1,
                    adapter=e) for i, e in enumerate(engines)]
    fleet = Fleet(reps, FakeClock(start=0.0))
    fleet.guard = ReplicaGuard(len(reps), REL, 0.3)
    return fleet


async def _ticks(prober: IdleProber, clock: FakeClock, seconds: float) -> None:
    """Time moves on ``seconds`` in the prober's ticks; each tick's probes get to run (and answer)."""
    for _ in range(round(seconds / prober.tick_s)):
        await clock.advance(prober.tick_s)
        prober.tick()
        for _ in range(3):
            await asyncio.sleep(0)


def test_answers_hangs_errors_and_engines_left_alone():
    async def run():
        ok, hung, failing, llama = _Engine(), _Engine(hang=True), _Engine(status=503), _LlamaCpp()
        fleet = _fleet([ok, hung, failing, llama])
        clock = fleet.clock
        prober = IdleProber(fleet, REL, clock)
        await _ticks(prober, clock, REL.idle_probe_s - 0.5)
        assert not ok.sent  # not silent long enough yet
        await _ticks(prober, clock, 1.0)
        assert ok.sent == [("/v1/completions", {"model": "llama-3.1-8b", "prompt": "ping", "max_tokens": 1,
                                                "temperature": 0.0})]
        assert len(hung.sent) == len(failing.sent) == 1 and not llama.sent
        assert prober.counts.get("r0", "ok") == 1 and prober.counts.get("r2", "error") == 1
        assert fleet.guard.outliers.consecutive[2] == 1
        await _ticks(prober, clock, REL.idle_probe_timeout_s)
        assert fleet.blocked(1) and prober.counts.get("r1", "timeout") == 1
        assert "idle probe" in fleet.guard.state(1, clock.now())["reason"]
        assert not fleet.blocked(0) and not fleet.blocked(2)
        await asyncio.sleep(0)
        assert hung.exchanges[0].released  # its connection dropped (the engine sees the client go)
        assert len(ok.sent) == 1  # answered 4 s ago: not silent for 5 s yet
        await _ticks(prober, clock, 1.5)
        assert len(ok.sent) == 2 and len(hung.sent) == 1 and not llama.sent  # the ejected one is not asked
        await prober.stop()

    asyncio.run(run())


def test_our_requests_in_flight_mean_no_probe():
    async def run():
        eng = _Engine()
        fleet = _fleet([eng, _Engine()])
        clock = fleet.clock
        prober = IdleProber(fleet, REL, clock)
        t = fleet.begin(0, prompt_tokens=10)
        await _ticks(prober, clock, 3 * REL.idle_probe_s)
        assert not eng.sent  # busy: the stall rule and the stream idle timeout judge it meanwhile
        fleet.end(t, 4)
        await _ticks(prober, clock, REL.idle_probe_s + 0.5)
        assert len(eng.sent) == 1
        await prober.stop()

    asyncio.run(run())
