"""How late the gateway's event loop runs what is due: ``steersman:event_loop_lag_seconds``.

Every request, relayed chunk and scrape of the gateway runs on one event loop.  When
its core is busy (a burst beyond what one process relays, a long synchronous step,
a collector pause) everything due waits: the lag is added to every TTFT and
inter-token gap in flight, and no engine metric shows it.  A timer due every
``interval_s`` observes how late it fired.

A process fact measured at the IO edge on the process's own timer (like the collector's
pauses; no policy reads it).  Not on ``loop.time()``: uvloop's is libuv's, updated once per
loop turn in whole milliseconds, which hides the lag inside a turn.  libuv fires timers at
millisecond granularity, so an idle loop reads 0-1 ms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from steersman.obs.histogram import FastHistogram

__all__ = ["LoopLag", "LAG_BUCKETS"]

#: an idle loop reads 0-1 ms (libuv fires timers at millisecond granularity); a saturated one milliseconds more, a stalled one seconds
LAG_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag:
    """Samples the running loop's lag every ``interval_s`` while started."""

    def __init__(self, hist: FastHistogram, interval_s: float, timer: Callable[[], float] = time.perf_counter) -> None:
        if not interval_s > 0:
            raise ValueError(f"the loop lag interval must be > 0, got {interval_s}")
        self.hist = hist
        self.interval_s = interval_s
        self._timer = timer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Sample ``loop`` (the running one by default: anything with ``call_later()``); started again, the
        earlier sampling stops (one timer chain, not two)."""
        self.stop()
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._arm()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        assert self._loop is not None
        self._due = self._timer() + self.interval_s
        self._handle = self._loop.call_later(self.interval_s, self._fire)

    def _fire(self) -> None:
        self.hist.observe(max(self._timer() - self._due, 0.0))
        self._arm()
