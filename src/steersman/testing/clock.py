"""A manual clock for tests and simulations: time moves only when told to."""

from __future__ import annotations

import asyncio
import heapq
import math

__all__ = ["FakeClock"]

#: loop turns in a row with nothing else to run (and no new sleeper) before time moves on
_QUIET_TURNS = 3
#: at most this many turns per settling: a task that never blocks (a busy loop of ``sleep(0)``) cannot hang ``advance``
_MAX_TURNS = 1000


class FakeClock:
    """Implements :class:`steersman.clock.Clock`; ``advance`` wakes due sleepers in time order."""

    def __init__(self, start: float = 0.0, wall_start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._wall0 = wall_start - start
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._seq = 0  # sleeps registered so far: the heap's tie-break, and how settling sees a new sleeper

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall0 + self._now

    async def sleep(self, seconds: float) -> None:
        if seconds != seconds:  # a NaN deadline would break the heap's order (and wake with time itself NaN)
            raise ValueError("FakeClock.sleep: seconds is NaN")
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._sleepers, (self._now + seconds, self._seq, fut))
        await fut

    @property
    def pending(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    def set(self, t: float) -> None:
        """Move time to ``t`` at once, for synchronous code (nothing sleeps on this clock: a due sleeper would be
        skipped, so that is refused, as is time going back; :meth:`advance` wakes sleepers in order)."""
        if not self._now <= t < math.inf:  # (NaN too)
            raise ValueError(f"FakeClock.set: time only moves forward, from {self._now!r}; got {t!r}")
        due = self.next_deadline()
        if due is not None and due <= t:
            raise ValueError(f"FakeClock.set({t!r}) would skip a sleeper due at {due!r}: use advance()")
        self._now = float(t)

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking each sleeper at its deadline (letting it run) in order.

        Before time moves past a deadline, every task that can run does, until it waits again (its next sleep
        on this clock, or anything else): a periodic task that awaits a sub-task between two sleeps must have
        registered its next sleep, or its ticks inside the window would be skipped.
        """
        if not 0 <= seconds < math.inf:  # (NaN too) time never goes back, nor to a deadline no sleeper can have
            raise ValueError(f"FakeClock.advance needs a finite number of seconds >= 0, got {seconds!r}")
        target = self._now + seconds
        await self._settle()
        while True:
            due = self.next_deadline()
            if due is None or due > target:
                break
            _, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, due)
            fut.set_result(None)
            await self._settle()
        self._now = target

    async def _settle(self) -> None:
        """Yield until the loop is quiet: nothing else ready to run and no new sleeper for a few turns.

        asyncio's run queue tells when nothing else is ready; on a loop without one (uvloop) only the
        sleepers are watched, which a task taking more than ``_QUIET_TURNS`` hops between sleeps outruns.
        """
        ready = getattr(asyncio.get_running_loop(), "_ready", None)
        quiet, seen = 0, self._seq
        for _ in range(_MAX_TURNS):
            await asyncio.sleep(0)
            if self._seq != seen or ready:  # something registered a sleep, or still has work queued
                quiet, seen = 0, self._seq
                continue
            quiet += 1
            if quiet >= _QUIET_TURNS:
                return
