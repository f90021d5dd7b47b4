"""Sends the idle probes :class:`~steersman.reliability.idle_probe.IdleProbes` asks for (the IO edge).

A probe is a ``/v1/completions`` request of one output token for one of the replica's base models (every
engine here serves it: vLLM, SGLang, llama-server, engine-sim), sent outside the request path: it is not
admitted, accounted or routed, and no client sees it.  An answer of any status below 500 is a sign of life
(a 4xx is the engine answering); a 5xx or a broken connection is a failure, as a request's would be (the
breaker and the consecutive-failure count see it); no answer within the timeout, with no sign of work
meanwhile, ejects the replica.  Counted in ``steersman:idle_probes_total`` by replica and result.
"""

from __future__ import annotations

import asyncio
import logging
import math

import msgspec
import numpy as np

from steersman.clock import Clock
from steersman.config.reliability import ReliabilitySettings
from steersman.engines.base import UpstreamError
from steersman.fleet.state import Fleet, Replica
from steersman.obs.histogram import CounterFamily
from steersman.reliability.idle_probe import IdleProbes

__all__ = ["IdleProber"]

log = logging.getLogger("steersman.prober")

_HEADERS = b"x-request-id: steersman-idle-probe\r\n"


def _model(rep: Replica) -> str | None:
    """A base model of the replica (an adapter's request would load the adapter), None while none is known."""
    return next((m for m in rep.models if m not in rep.loras), None)


class IdleProber:
    def __init__(self, fleet: Fleet, settings: ReliabilitySettings, clock: Clock) -> None:
        self.fleet = fleet
        self.clock = clock
        self.state = IdleProbes(len(fleet.replicas), settings, clock.now())
        # a tick a tenth of the shorter of the two times (at most 1 s): a timeout is judged within 10% of it
        self.tick_s = min(1.0, min(settings.idle_probe_s or math.inf, settings.idle_probe_timeout_s) / 10)
        self.counts = CounterFamily("steersman:idle_probes", "Canary requests to idle replicas, by result.",
                                    ["replica", "result"])
        self._task: asyncio.Task | None = None
        self._probes: dict[int, asyncio.Task] = {}  # replica -> its probe in flight

    def tick(self) -> None:
        """Judge timed-out probes and send the ones due (called every ``tick_s``)."""
        fleet = self.fleet
        now = self.clock.now()
        guard = fleet.guard
        eligible = fleet.in_rotation()
        if guard is not None:  # an ejected replica holding the place a hung one needs is asked too
            eligible |= guard.probe_ejected(now) & fleet.routable
        for i in np.flatnonzero(eligible):
            rep = fleet.replicas[i]
            if _model(rep) is None or not getattr(rep.adapter, "idle_probe", True):
                eligible[i] = False
        due, late = self.state.tick(now, fleet.in_flight > 0, fleet.output_at, eligible)
        for i in late:
            t = self._probes.pop(i, None)
            if t is not None:
                t.cancel()  # (its connection is dropped: the engine sees the client go)
            name = fleet.replicas[i].name
            self.counts.inc(name, "timeout")
            reason = f"no answer to an idle probe in {self.state.timeout:g}s"
            if guard is not None and guard.probe_timed_out(i, now, reason):
                log.warning("replica %s: %s", name, reason)
        loop = asyncio.get_running_loop()
        for i in due:
            old = self._probes.pop(i, None)
            if old is not None:  # (one whose probe was judged when life was seen: its answer says nothing now)
                old.cancel()
            self._probes[i] = loop.create_task(self._probe(fleet.replicas[i], now), name=f"idle-probe-{i}")

    async def _probe(self, rep: Replica, sent: float) -> None:
        body = msgspec.json.encode({"model": _model(rep), "prompt": "ping", "max_tokens": 1, "temperature": 0.0})
        ex = None
        try:
            ex = await rep.adapter.send(rep.address, "/v1/completions", body, headers=_HEADERS)
            await ex.done()
            ok = ex.status < 500
        except (UpstreamError, OSError):
            ok = False
        finally:
            if ex is not None:
                ex.release()
        if self._probes.get(rep.index) is asyncio.current_task():
            del self._probes[rep.index]
        now = self.clock.now()
        guard = self.fleet.guard
        if ok and self.state.answered(rep.index, now, sent):
            self.counts.inc(rep.name, "ok")
            if guard is not None and guard.probe_answered(rep.index, now):
                log.warning("replica %s: answered an idle probe while ejected, and the ejection cap held back another "
                            "replica's ejection: back in rotation now", rep.name)
        elif not ok and self.state.failed(rep.index, sent):
            self.counts.inc(rep.name, "error")
            if guard is not None:
                guard.failed(rep.index, -1, now)

    async def _loop(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # a bug must not end the probes (cancellation is no Exception)
                log.exception("idle probe tick failed")
            await self.clock.sleep(self.tick_s)

    def start(self) -> None:
        if self.state.enabled and len(self.fleet.replicas) > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="idle-probes")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._probes.values()) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        self._task = None
        self._probes.clear()
