"""Busy polling: the event loop polls with a zero timeout while there is traffic, instead of sleeping.

HAProxy's ``busy-polling`` (off by default there too): "each time the process waits for an
I/O using the poller, the processor goes back to sleep or is offered to another VM for a
long time, and it causes excessively high latencies.  This option provides a solution
preventing the processor from sleeping by always using a null timeout on the pollers."

On the 2-core VMs this project is measured on, a thread woken from ``epoll_wait`` runs its
first tens of microseconds several times slower than a running one (the vCPU halted, its
caches went to other processes), and a request wakes the gateway twice before its first
token reaches the client: when it arrives, and when the engine's first bytes do.  With
busy polling on, ``bench/peers`` (sim fleet, 3 rounds, 2026-12-01) read steersman's added
latency 0.63 -> 0.50 ms on kept-alive connections and 0.69 -> 0.47 ms on new ones, and the
same under load; beside two llama-servers, which keep both cores busy, it backs off and
changes nothing.

The price is a core: the loop spins while requests are being served and for ``window_s``
after the last one ended, so the process shows 100% of a core while traffic flows.  Give
the gateway a core of its own, and do not use it under a CPU quota (a container limit
throttles a spinning process for the rest of each period).  Hence off by default
(``gateway.busy_poll_s`` = 0).

How: while active, a callback re-schedules itself with ``call_soon``; a loop with a ready
callback polls its sockets without blocking, runs what arrived, then the callback again.
It stops once nothing has been served for ``window_s``; the next request starts it again.

It also stops when the core is wanted by someone else: a turn that finds the thread was
kept off its core (wall time since the last turn exceeds the thread's CPU time over it by
``PREEMPTED_S``) ends the spin, and no spin starts for ``BACKOFF_S`` after.  A spinner the
scheduler has to preempt has used up its share: the engines beside it wait for it, and it
then waits behind them when its own work arrives.  Measured on the 2-core VM without this
back-off, 4 engine-sims beside the gateway under 16 streams: TTFT p50 7.6 -> 12.0 ms; two
llama-servers: output tokens/s -23%.

Process mechanics at the IO edge, on the process's own timer (as :mod:`steersman.obs.looplag`):
no policy reads it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["BusyPoll", "PREEMPTED_S", "BACKOFF_S"]

#: a turn that ran this much later than the thread's own CPU time explains was preempted (a CFS slice on a
#: contended core is 0.75-3 ms; a turn of a spinning loop takes a few us)
PREEMPTED_S = 0.0005
#: after a preemption, no spin for this long: the core is contended, sleep in the poller as without busy polling
BACKOFF_S = 1.0


class BusyPoll:
    """Keeps ``loop`` polling while ``active()`` is non-zero and for ``window_s`` after it last was."""

    __slots__ = ("window_s", "_active", "_timer", "_cpu", "_loop", "_spinning", "_last", "_since", "_prev", "_prev_cpu",
                 "_resume_at", "spun_s", "spins", "preempted")

    def __init__(self, window_s: float, active: Callable[[], int], timer: Callable[[], float] = time.perf_counter,
                 cpu: Callable[[], float] = time.thread_time) -> None:
        if not window_s > 0:
            raise ValueError(f"the busy-poll window must be > 0 s, got {window_s}")
        self.window_s = window_s
        self._active = active
        self._timer = timer
        self._cpu = cpu  # this thread's CPU time: how much of the wall time since the last turn it ran
        self._prev = self._prev_cpu = 0.0
        self._resume_at = -float("inf")  # no spin before this (after a preemption)
        self.preempted = 0  # spins ended because the thread was kept off its core
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spinning = False
        self._last = 0.0  # when something was last being served
        self._since = 0.0  # when the current spin began
        self.spun_s = 0.0  # seconds spent polling in spins that ended (steersman:busy_poll_seconds_total)
        self.spins = 0  # spins begun

    @property
    def spinning(self) -> bool:
        return self._spinning

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Poll on ``loop`` (the running one by default: anything with ``call_soon()``) from the next kick."""
        self._loop = loop if loop is not None else asyncio.get_running_loop()

    def stop(self) -> None:
        """No more spins; the one under way ends at its next turn."""
        self._loop = None

    def kick(self) -> None:
        """A request began: spin from now on, if not spinning already."""
        loop = self._loop
        if self._spinning or loop is None:
            return
        now = self._timer()
        if now < self._resume_at:
            return
        self._spinning = True
        self.spins += 1
        self._last = self._since = self._prev = now
        self._prev_cpu = self._cpu()
        loop.call_soon(self._turn)

    def total_s(self) -> float:
        """Seconds spent polling so far, the spin under way included."""
        return self.spun_s + (self._timer() - self._since if self._spinning else 0.0)

    def _turn(self) -> None:
        now, cpu = self._timer(), self._cpu()
        loop = self._loop
        if (now - self._prev) - (cpu - self._prev_cpu) > PREEMPTED_S:  # the core is wanted: give it back
            self.preempted += 1
            self._resume_at = now + BACKOFF_S
            loop = None
        elif self._active():
            self._last = now
        elif now - self._last > self.window_s:
            loop = None
        self._prev, self._prev_cpu = now, cpu
        if loop is None:  # idle for the window, preempted, or stopped
            self._spinning = False
            self.spun_s += now - self._since
            return
        loop.call_soon(self._turn)
