"""One simulated replica in the twin: the engine model driven on the virtual timeline.

A replica is either idle or in the middle of a *run*: one engine step, or a run of
identical decode steps (``EngineModel.decode_plan``: every running request decodes,
nothing can be admitted) that ends at the next completion, or before the KV cache
would run out.  A step is applied when it starts and its results (first tokens,
finished requests) become true at its end, when the twin wakes the replica.  A
decode run stays a *plan* until it ends (then ``EngineModel.commit`` applies it);
a request that arrives (or is aborted, or a slowdown that starts) mid-run takes
effect at the next step boundary, as in vLLM: the run is cut at the step in
progress (the steps started before now are committed, the replica wakes at that
step's end).  Per-token outputs are never listed (``outputs=False``): the twin
needs first tokens, finishes, busy and compute- vs memory-bound time.

``macro=False`` steps one by one instead (the reference the macro runs are tested
against).  Faults for failure drills: :meth:`SimReplica.set_slowdown` stretches
every step (a degraded GPU, ``EngineModel.set_slowdown``), :meth:`SimReplica.kill`
drops everything (the process died: the steps that ended by then stand, the one in
progress is lost), ``error_rate`` is applied by the twin when it dispatches (the
engine answers 5xx).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from steersman.sim import DecodePlan, EngineModel, SimRequest

__all__ = ["SimReplica", "RunResult"]


@dataclass(slots=True)
class RunResult:
    """What a finished run produced."""

    end: float
    first_tokens: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    busy_s: float = 0.0
    compute_bound_s: float = 0.0  # part of busy_s in steps whose compute side exceeds the memory side
    steps: int = 0
    emitted: bool = False  # a token came out of it (a decode, or a first token): its streams got an event


def _token_in_flight(r) -> bool:
    """Request ``r`` produced a token in the step being computed (its run was applied when it started): it has the
    KV of all but that token computed (a decoder the step left out reads the same: rare, it then resends one)."""
    return bool(r.num_output) and r.num_computed == r.prompt_len + r.num_output - 1


class SimReplica:
    __slots__ = ("index", "engine", "dead", "error_rate", "wake_at", "generation", "macro", "emitted_at", "_run",
                 "_plan")

    def __init__(self, index: int, engine: EngineModel, macro: bool = True) -> None:
        self.index = index
        self.engine = engine
        self.dead = False
        self.error_rate = 0.0
        self.macro = macro
        self.wake_at: float | None = None  # end of the run in progress
        self.generation = 0  # bumped when a scheduled wake becomes stale
        self.emitted_at = -math.inf  # the end of its latest run that produced a token (see last_output)
        self._run: RunResult | None = None  # the applied step / decode run in progress
        self._plan: DecodePlan | None = None  # the decode run in progress, not applied yet

    @property
    def busy(self) -> bool:
        return self.wake_at is not None

    @property
    def slowdown(self) -> float:
        return self.engine.slowdown

    def last_output(self, now: float) -> float:
        """When its engine last produced a token (the end of a step with decoders or a first token in it), by
        ``now``: the latest event the gateway saw on its streams there (the stall rule's progress, as
        :meth:`steersman.fleet.state.Fleet.streamed` keeps it live).  Mid-run, the last decode step done."""
        plan = self._plan
        if plan is not None:
            k = plan.steps_done_by(now)
            if k:
                return plan.end_after(k)
        return self.emitted_at

    # -- changes (each returns a wake time to schedule, or None: nothing new) ------------------
    def submit(self, req: SimRequest, now: float) -> float | None:
        """Add a request (ValueError if it can never run here); it joins at the next step boundary."""
        cut = self._cut(now)
        self.engine.add(req)
        return self._resume(now, cut)

    def abort(self, req_id: str, now: float) -> tuple[float | None, int]:
        """Cancel request ``req_id`` at ``now``: (a wake time to schedule or None, the tokens of the step in
        progress in its ``num_output``, 0 or 1, which its client never got: as :meth:`kill` counts them).  Its
        results in the run in progress (a first token, its end) are dropped: the step they belong to has not ended."""
        cut = self._cut(now)
        run = self._run
        unsent = 0
        sim = next((r for r in self.engine.running() if r.req_id == req_id), None)
        if run is not None and run.end > now and sim is not None and _token_in_flight(sim):
            unsent = 1  # (applied when its run started, as a step is: its token is still being computed)
        if run is not None and run.end > now:
            run.first_tokens = [r for r in run.first_tokens if r != req_id]
            run.finished = [r for r in run.finished if r != req_id]
        self.engine.abort(req_id)
        return self._resume(now, cut), unsent

    def set_slowdown(self, factor: float, now: float) -> float | None:
        """A degraded GPU: every step from the next boundary on lasts ``factor`` x its normal time."""
        cut = self._cut(now)
        self.engine.set_slowdown(factor)
        return self._resume(now, cut)

    def _cut(self, now: float) -> bool:
        """Apply the steps of the pending decode run that started before ``now`` (the one in progress
        ends later: the replica wakes then); True if the wake time changed."""
        plan = self._plan
        if plan is None:
            return False
        self._plan = None
        self.generation += 1
        done = plan.steps_done_by(now)
        if done:
            self.emitted_at = plan.end_after(done)
        k = plan.steps_before(now)
        if k == 0:  # the run starts now: drop it, the next one includes the change
            self.wake_at = None
            return True
        self._run = self._apply(plan, k)
        self.wake_at = self._run.end
        return True

    def _resume(self, now: float, cut: bool) -> float | None:
        if self.wake_at is None:
            return self._start(now)
        return self.wake_at if cut else None

    # -- the timeline ---------------------------------------------------------------------
    def wake(self, now: float) -> tuple[RunResult, float | None]:
        """The run in progress ended at ``now``: its results, and when the next one ends (None: idle)."""
        plan, run = self._plan, self._run
        self._plan = self._run = None
        self.wake_at = None
        if plan is not None:
            run = self._apply(plan, plan.max_steps)
        if run is None:
            run = RunResult(now)
        elif run.emitted:
            self.emitted_at = run.end
        return run, self._start(now)

    def _start(self, now: float) -> float | None:
        eng = self.engine
        if self.dead or not eng.has_work():
            return None
        if self.macro:
            plan = eng.decode_plan(now)
            if plan is not None:
                self._plan = plan
                self.wake_at = end = plan.end_after(plan.max_steps)
                return end
        res = eng.step(now, outputs=False)
        if res is None:
            t = eng.next_event_time(now)
            if t is None or math.isinf(t):
                return None
            self.wake_at = t  # e.g. weights still loading: try again then
            return t
        d = res.duration
        self._run = RunResult(res.end, res.first_tokens, res.finished, d, d if res.compute_s > res.memory_s else 0.0, 1,
                              bool(res.num_decode_tokens or res.first_tokens))
        self.wake_at = res.end
        return res.end

    def _apply(self, plan: DecodePlan, k: int) -> RunResult:
        m = self.engine.commit(plan, k)
        return RunResult(m.end, [], m.finished, m.end - m.start, _compute_bound_s(plan, k), k, k > 0)

    def kill(self, now: float) -> tuple[RunResult, list[tuple[str, int]]]:
        """The replica dies at ``now``.  Returns what had ended by then (the steps' first tokens and finishes
        stand; busy time counts until now, the step in progress included) and every request lost, each with
        the tokens of the step in progress in its ``num_output`` (0 or 1: its client never got them)."""
        plan, run = self._plan, self._run
        self._plan = self._run = None
        self.dead = True
        self.generation += 1
        self.wake_at = None
        eng = self.engine
        done, unsent = RunResult(now), set()
        if plan is not None:  # only the steps that ended apply (steps_before would count the one in progress)
            k = plan.steps_done_by(now)
            if k:
                done = self._apply(plan, k)
            if k < plan.max_steps and now > plan.start:  # the GPU was busy with the step in progress until now
                done.busy_s = now - plan.start
                if plan.compute_s - plan.memory_s + (plan.compute_slope - plan.memory_slope) * k > 0:
                    done.compute_bound_s += now - plan.end_after(k)
        elif run is not None:
            if run.end <= now:  # ended (its wake is due now, after this): its results stand
                done = run
            else:  # applied when it started: what its last step produced never reached a client
                busy = max(run.busy_s - (run.end - now), 0.0)
                done.busy_s = busy
                done.compute_bound_s = run.compute_bound_s * busy / run.busy_s if run.busy_s else 0.0  # prorated
                unsent = {r.req_id for r in eng.running() if _token_in_flight(r)}
        lost = [r.req_id for r in (*eng.running(), *eng.waiting())]
        for rid in lost:
            eng.abort(rid)
        if run is None or run.end <= now:
            return done, [(rid, 0) for rid in lost]
        # its finishers left the engine when it was applied: lost too, their last token unsent
        return done, [(rid, 1) for rid in run.finished] + [(rid, int(rid in unsent)) for rid in lost]


def _compute_bound_s(plan: DecodePlan, k: int) -> float:
    """Summed duration of the steps j < k of ``plan`` whose compute side exceeds the memory side.

    Both sides are affine in j, so those steps are one range [lo, hi): found in closed
    form, then checked against the per-step comparison.
    """
    a = plan.compute_s - plan.memory_s
    b = plan.compute_slope - plan.memory_slope

    def bound(j: int) -> bool:
        return a + b * j > 0

    if b == 0 or (bound(0) == bound(k - 1)):
        lo, hi = (0, k) if bound(0) else (0, 0)
    else:
        x = min(max(int(-a / b), 0), k - 1)  # near the crossing
        while x > 0 and bound(x - 1) != bound(0):
            x -= 1
        while x < k and bound(x) == bound(0):
            x += 1
        lo, hi = (0, x) if bound(0) else (x, k)
    if hi <= lo:
        return 0.0
    d0, sl = plan.first_duration, plan.slope
    return (hi - lo) * d0 + sl * (hi * (hi - 1) - lo * (lo - 1)) / 2
