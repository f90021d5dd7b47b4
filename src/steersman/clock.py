"""The one clock of steersman.

Every component takes a :class:`Clock` instead of reading ``time`` itself, so the
same control-plane code runs live (:class:`WallClock`), accelerated
(:class:`ScaledClock`, used by ``engine-sim --speedup``) and inside the digital
twin or tests (:class:`steersman.testing.FakeClock` / the twin's virtual clock).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "WallClock", "ScaledClock"]


@runtime_checkable
class Clock(Protocol):
    """Monotonic time in seconds plus an awaitable sleep on the same timeline."""

    def now(self) -> float:
        """Seconds on this clock's monotonic timeline."""
        ...

    def wall(self) -> float:
        """Unix epoch seconds (for timestamps shown to users, e.g. ``created``)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the caller for ``seconds`` of this clock's time."""
        ...


class WallClock:
    """Real time: ``time.monotonic`` and ``asyncio.sleep``."""

    __slots__ = ()

    #: ``time.monotonic`` itself: read ~14 times per gateway request, a Python-level wrapper was a frame each
    now = staticmethod(time.monotonic)

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ScaledClock:
    """Real time running ``speedup`` times faster.

    ``now()`` advances ``speedup`` seconds per real second and ``sleep(d)`` waits
    ``d / speedup`` real seconds, so a model paced on this clock runs faster
    without changing any of its arithmetic.
    """

    __slots__ = ("speedup", "_t0")

    def __init__(self, speedup: float = 1.0) -> None:
        if not 0 < speedup < math.inf:  # NaN too: every latency it measured would be NaN (and sleeps zero)
            raise ValueError(f"speedup must be a finite number > 0, got {speedup!r}")
        self.speedup = float(speedup)
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.speedup

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.speedup)

    async def sleep_until(self, t: float) -> None:
        """Sleep until ``now() >= t`` (anchored, so repeated steps do not drift)."""
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay / self.speedup)
