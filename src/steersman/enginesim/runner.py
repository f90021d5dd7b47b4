"""Paces the engine model in (scaled) real time and hands tokens to request streams.

The model keeps a continuous virtual timeline: while the engine is busy, step
*k+1* starts exactly when step *k* ends (in model seconds), and the runner
sleeps until that moment on the injected clock.  If the process falls behind
(CPU-bound), sleeps return at once and it catches up instead of stretching the
model's time.  A ``slowdown`` fault multiplies each step's duration; a step begun
under one ends as the factor in force says, should it change while the step runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncio
from dataclasses import dataclass, field

from steersman.clock import Clock
from steersman.enginesim.faults import Faults
from steersman.enginesim.metrics import SimMetrics
from steersman.enginesim.textgen import Generation
from steersman.sim import EngineModel, SimRequest

__all__ = ["Job", "EngineRunner"]


@dataclass(slots=True, eq=False)
class Job:
    """One request inside the server: its planned output and streaming progress."""

    sim: SimRequest
    gen: Generation
    arrival: float
    produced: int = 0
    done: bool = False
    first_at: float | None = None
    last_at: float | None = None
    finished_at: float | None = None
    waiter: asyncio.Future | None = field(default=None, repr=False)
    tool: Any = None  # a ToolCall (steersman.enginesim.tools): the output is its arguments
    prompt: int = 0  # which of the request's prompts (a completion may bring a batch)

    @property
    def req_id(self) -> str:
        return self.sim.req_id

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class EngineRunner:
    """Owns the engine model's step loop for one engine-sim server."""

    def __init__(self, engine: EngineModel, clock: Clock, metrics: SimMetrics, faults: Faults) -> None:
        self.engine = engine
        self.clock = clock
        self.metrics = metrics
        self.faults = faults
        self.jobs: dict[str, Job] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._end: float | None = None  # end of the last step while busy
        self.after_step: Callable[[float], None] | None = None  # called with each step's end (KV events' flush)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine-sim-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for job in list(self.jobs.values()):
            job.done = True
            job._wake()

    def now(self) -> float:
        return self.clock.now()

    def submit(self, job: Job) -> None:
        self.engine.add(job.sim)
        self.jobs[job.req_id] = job
        self._wake.set()

    def poke(self) -> None:
        """The engine's state changed outside a step (weights loading again): look at it anew."""
        self._wake.set()

    def cancel(self, job: Job) -> None:
        """The client went away: free the request in the engine."""
        if self.jobs.pop(job.req_id, None) is not None and not job.done:
            self.engine.abort(job.req_id)
            job.done = True
            self.metrics.success["abort"].inc()
            job._wake()

    async def wait(self, job: Job, have: int) -> None:
        """Return once ``job`` has produced more than ``have`` tokens or is done."""
        while job.produced <= have and not job.done:
            job.waiter = asyncio.get_running_loop().create_future()
            await job.waiter
            job.waiter = None

    async def _idle(self, until: float | None) -> None:
        """Wait for new work, or (if ``until`` is given) until that clock time."""
        self._wake.clear()
        if until is None:
            await self._wake.wait()
            return
        delay = until - self.clock.now()
        if delay > 0:
            await self._sleep_or(self._wake, delay)

    async def _sleep_or(self, event: asyncio.Event, delay: float) -> None:
        """Sleep ``delay`` on the clock, or less if ``event`` is set meanwhile."""
        waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.clock.sleep(delay))}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def _slowed_step(self, start: float, duration: float) -> float:
        """Sleep to the end of a step run under a ``slowdown`` fault; returns that end.

        The end follows the fault as it changes: a new spec (``DELETE /admin/faults`` above all) wakes the
        sleep and the end is computed again from the current factor, so clearing a slowdown takes effect at
        once instead of after the step begun under it (hours of model time for a large factor).  The time already
        slept stays spent: a step whose new end has passed ends now (its tokens are not dated in the past, and the
        steps after it do not burst out to catch up).
        """
        faults = self.faults
        changed = faults.changed
        end = start + duration * faults.slowdown
        while True:
            self._end = end
            delay = end - self.clock.now()
            if delay <= 0:
                return end
            changed.clear()
            await self._sleep_or(changed, delay)
            if not changed.is_set():
                return end
            end = max(start + duration * faults.slowdown, self.clock.now())

    async def _loop(self) -> None:
        eng = self.engine
        while True:
            if self.faults.hung:
                await self.faults.unhung.wait()
                self._end = None
            if not eng.has_work():
                self._end = None
                await self._idle(None)
                continue
            start = self._end if self._end is not None else self.clock.now()
            res = eng.step(start)
            if res is None:
                self._end = None
                await self._idle(eng.next_event_time(self.clock.now()))
                continue
            if self.faults.slowdown == 1.0:  # no slowdown (the usual case): a plain sleep, nothing to follow
                end = self._end = start + res.duration
                delay = end - self.clock.now()
                if delay > 0:
                    await self.clock.sleep(delay)
            else:
                end = await self._slowed_step(start, res.duration)
            if self.faults.hung:  # a hang freezes the step's results too: they come out once it is lifted
                await self.faults.unhung.wait()
                end = max(end, self.clock.now())
                self._end = None
            self._deliver(res, end)
            if self.after_step is not None:
                self.after_step(end)

    def _deliver(self, res, end: float) -> None:
        m = self.metrics
        m.iteration_tokens.observe(res.num_prefill_tokens + res.num_decode_tokens)
        jobs = self.jobs
        for rid, n in res.outputs:
            job = jobs.get(rid)
            if job is None:
                continue
            if job.first_at is None:
                job.first_at = end
                m.ttft.observe(end - job.arrival)
            elif job.last_at is not None:
                m.itl.observe(end - job.last_at)
                m.tpot.observe(end - job.last_at)
            job.last_at = end
            job.produced = n
            job._wake()
        for rid in res.finished:
            job = jobs.pop(rid, None)
            if job is None:
                continue
            job.done = True
            job.finished_at = end
            self._finish_metrics(job, end)
            job._wake()

    def _finish_metrics(self, job: Job, end: float) -> None:
        m = self.metrics
        m.success["length" if job.gen.finish_reason == "length" else "stop"].inc()  # a tool call ends as "stop"
        m.e2e.observe(end - job.arrival)
        sched = job.sim.first_scheduled_at
        first = job.first_at if job.first_at is not None else end
        if sched is not None:
            m.queue.observe(max(0.0, sched - job.arrival))
            m.prefill.observe(max(0.0, first - sched))
        m.decode.observe(max(0.0, end - first))
        if job.produced > 1:
            m.request_tpot.observe((end - first) / (job.produced - 1))
        m.prompt_tokens.observe(job.sim.prompt_len)
        m.generation_tokens.observe(job.produced)
