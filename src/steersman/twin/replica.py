"""One simulated replica in the twin: the engine model driven on the virtual timeline.

A replica is either idle or in the middle of a *run*: one engine step, or a run of
identical decode steps in closed form.  Its results (first tokens, finished
requests) become true at the run's end, when the twin wakes it.  A request that
arrives mid-run joins at the next step boundary, as in vLLM: a decode run is cut
at the step in progress (``EngineModel.commit`` with fewer steps).

Faults for failure drills: ``slowdown`` stretches every step (a degraded GPU),
``dead`` drops everything (the process died), ``error_rate`` is applied by the
twin when it dispatches (the engine answers 5xx).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from steersman.sim import EngineModel, SimRequest

__all__ = ["SimReplica", "RunResult"]


@dataclass(slots=True)
class RunResult:
    """What a finished run produced."""

    end: float
    first_tokens: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    busy_s: float = 0.0
    compute_bound_s: float = 0.0  # part of busy_s in steps whose compute side exceeds the memory side


class SimReplica:
    __slots__ = ("index", "engine", "slowdown", "dead", "error_rate", "wake_at", "generation", "_run", "_seen_first")

    def __init__(self, index: int, engine: EngineModel) -> None:
        self.index = index
        self.engine = engine
        self.slowdown = 1.0
        self.dead = False
        self.error_rate = 0.0
        self.wake_at: float | None = None  # end of the run in progress
        self.generation = 0  # bumped when a scheduled wake becomes stale
        self._run = None  # the StepResult / MacroStep in progress
        self._seen_first: set[str] = set()

    @property
    def busy(self) -> bool:
        return self.wake_at is not None

    def submit(self, req: SimRequest, now: float) -> float | None:
        """Add a request; returns a new wake time if the replica was idle (else None: it joins the next step)."""
        self.engine.add(req)
        if self.wake_at is None:
            return self._start(now)
        return None

    def abort(self, req_id: str) -> None:
        self.engine.abort(req_id)
        self._seen_first.discard(req_id)

    def wake(self, now: float) -> tuple[RunResult, float | None]:
        """The run in progress ended at ``now``: its results, and when the next one ends (None: idle)."""
        run, self._run = self._run, None
        self.wake_at = None
        out = RunResult(now)
        if run is not None:
            d = run.end - run.start
            out.busy_s = d
            if run.compute_s > run.memory_s:
                out.compute_bound_s = d
            seen = self._seen_first
            for rid, n in run.outputs:
                if rid not in seen:
                    seen.add(rid)
                    out.first_tokens.append(rid)
            for rid in run.finished:
                seen.discard(rid)
            out.finished = list(run.finished)
        return out, self._start(now)

    def _start(self, now: float) -> float | None:
        eng = self.engine
        if self.dead or not eng.has_work():
            return None
        res = eng.step(now)
        if res is None:
            t = eng.next_event_time(now)
            if t is None or math.isinf(t):
                return None
            self.wake_at = t  # e.g. weights still loading: try again then
            return t
        end = res.start + (res.end - res.start) * self.slowdown
        if self.slowdown != 1.0:
            res = _stretched(res, end)
            eng._busy_until = end  # noqa: SLF001 - the degraded GPU's next step starts after this one
        self._run = res
        self.wake_at = end
        return end

    def kill(self) -> list[str]:
        """The replica dies: every request on it is lost.  Returns their ids."""
        self.dead = True
        self.generation += 1
        self.wake_at = None
        self._run = None
        lost = [r.req_id for r in (*self.engine.running(), *self.engine.waiting())]
        for rid in lost:
            self.engine.abort(rid)
        self._seen_first.clear()
        return lost


def _stretched(res, end: float):
    from dataclasses import replace

    return replace(res, end=end, duration=end - res.start)
