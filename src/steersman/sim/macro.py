"""Macro-steps: many identical decode steps of the engine model in closed form.

While every running request is decoding, nothing waiting can be admitted and no
request finishes, consecutive steps have the same batch: each schedules one token
per request.  Only the context grows, by one token per request per step, and the
step time is affine in it (the decode-attention part is max(a x ctx, b x ctx) =
max(a, b) x ctx; everything else is constant), so step j of the run lasts
``d0 + slope x j`` and the run of k steps lasts k x d0 + slope x k (k - 1) / 2.
The compute and memory sides of the roofline are affine in j the same way.

:meth:`EngineModel.decode_plan` describes, without changing anything, the longest
such run starting at the next step (a :class:`DecodePlan`): it ends

* at the first step in which a request finishes (that step is included: its
  finishers are freed at its end, as step() does),
* before the first step that would need a preemption: the blocks allocated as
  requests cross block boundaries (counted per position within a block, O(block
  size)) must fit in the free queue,

and there is none when the waiting queue's head could be admitted at the first
step (over such a run the free blocks only shrink and the head's cache hits only
get evicted, so a head that cannot be admitted at the first step cannot be at any
later one).  :meth:`EngineModel.commit` applies the first ``steps`` steps of a plan
and leaves the engine exactly where repeated :meth:`EngineModel.step` calls would
(same counters, blocks, evictions, cached output blocks, finish times up to float
rounding).  A caller with events of its own (an arrival, an abort) commits only
the steps that start before the event (:meth:`DecodePlan.steps_before`): a step
that starts before a request arrives cannot include it, as in vLLM.
:meth:`EngineModel.advance` is plan + commit up to a time.

Cost: a plan is O(block size) (plus a prefix lookup of the waiting head); a commit
is O(block size + requests finishing), independent of the batch, except

* ``outputs=True`` lists every running request: O(batch);
* when some request caches its output blocks (``output_token_ids``) and one of its
  blocks fills during the run: O(batch + blocks allocated) and a sort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MacroStep", "DecodePlan"]


@dataclass(slots=True)
class MacroStep:
    """What :meth:`EngineModel.commit` / :meth:`EngineModel.advance` did (read-only)."""

    steps: int  # 0: the next step is not a plain decode step (call step())
    start: float
    end: float
    num_seqs: int  # requests decoding in every step
    first_duration: float  # step j lasts first_duration + duration_slope * j
    duration_slope: float
    # (req_id, output tokens so far) at the end, every running request: O(batch), only when asked
    # for (advance() does by default, commit() does not); None otherwise
    outputs: list[tuple[str, int]] | None
    finished: list[str]  # finished at the end of the last step (finished_at = end)
    compute_s: float  # summed over the steps
    memory_s: float


class DecodePlan:
    """The longest run of plain decode steps from ``start`` (see :meth:`EngineModel.decode_plan`).

    Step j (0-based) starts at ``start + j d0 + slope j (j-1) / 2`` and lasts
    ``first_duration + slope * j``; its roofline compute / memory sides are
    ``compute_s + compute_slope * j`` and ``memory_s + memory_slope * j``.
    ``max_steps`` ends at the first finish (included), before the KV cache would run
    out, or never past a point where a waiting request could be admitted.
    Read-only; valid until the engine changes (any call but :meth:`EngineModel.state`,
    :meth:`EngineModel.request`, :meth:`EngineModel.decode_plan`).
    """

    __slots__ = (
        "start", "first_duration", "slope", "max_steps", "num_seqs",
        "compute_s", "compute_slope", "memory_s", "memory_slope", "finish_steps", "_ver",
    )

    def __init__(
        self, start: float, first_duration: float, slope: float, max_steps: int, num_seqs: int,
        compute_s: float, compute_slope: float, memory_s: float, memory_slope: float, finish_steps: int, ver: int,
    ) -> None:
        self.start = start
        self.first_duration = first_duration
        self.slope = slope
        self.max_steps = max_steps
        self.num_seqs = num_seqs
        self.compute_s = compute_s
        self.compute_slope = compute_slope
        self.memory_s = memory_s
        self.memory_slope = memory_slope
        self.finish_steps = finish_steps  # steps until the first finish (>= max_steps)
        self._ver = ver

    def __repr__(self) -> str:
        return (
            f"DecodePlan(start={self.start!r}, first_duration={self.first_duration!r}, slope={self.slope!r}, "
            f"max_steps={self.max_steps}, num_seqs={self.num_seqs})"
        )

    def end_after(self, k: int) -> float:
        """When step k-1 ends (the run's end if k steps are committed)."""
        return self.start + k * self.first_duration + self.slope * k * (k - 1) / 2

    def sides(self, k: int) -> tuple[float, float]:
        """(compute_s, memory_s) summed over the first k steps."""
        tri = k * (k - 1) / 2
        return k * self.compute_s + self.compute_slope * tri, k * self.memory_s + self.memory_slope * tri

    def steps_before(self, t: float) -> int:
        """Steps (<= max_steps) that start before ``t``: 0 if t <= start; max_steps if t is inf."""
        if t <= self.start:
            return 0
        return _steps_before(self.start, self.first_duration, self.slope, t, self.max_steps)

    def steps_done_by(self, t: float) -> int:
        """Steps (<= max_steps) that end by ``t``."""
        if t == math.inf:
            return self.max_steps
        k = _steps_before(self.start, self.first_duration, self.slope, t, self.max_steps)  # starts < t
        while k > 0 and self.end_after(k) > t:
            k -= 1
        return k


def _none(t: float) -> MacroStep:
    return MacroStep(0, t, t, 0, 0.0, 0.0, [], [], 0.0, 0.0)


def _steps_before(start: float, d0: float, slope: float, until: float, cap: int) -> int:
    """Largest k <= cap such that step k-1 starts before ``until`` (start_j = start + j d0 + slope j(j-1)/2)."""
    if until == math.inf:
        return cap

    def start_of(j: int) -> float:
        return start + j * d0 + slope * j * (j - 1) / 2

    # solve slope/2 j^2 + (d0 - slope/2) j + (start - until) = 0 for the last j with start_of(j) < until
    a, b, c = slope / 2, d0 - slope / 2, start - until
    j = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a) if a > 0 else -c / b
    j = min(int(j), cap)
    while j > 0 and start_of(j) >= until:
        j -= 1
    while j + 1 < cap and start_of(j + 1) < until:
        j += 1
    return min(j + 1, cap)
