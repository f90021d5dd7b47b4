"""A manual clock for tests and simulations: time moves only when told to."""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["FakeClock"]


class FakeClock:
    """Implements :class:`steersman.clock.Clock`; ``advance`` wakes due sleepers in time order."""

    def __init__(self, start: float = 0.0, wall_start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._wall0 = wall_start - start
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall0 + self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._ids), fut))
        await fut

    @property
    def pending(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking each sleeper at its deadline (letting it run) in order."""
        target = self._now + seconds
        while True:
            due = self.next_deadline()
            if due is None or due > target:
                break
            _, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, due)
            fut.set_result(None)
            for _ in range(3):  # let the woken task (and what it awaits next) run
                await asyncio.sleep(0)
        self._now = target
