"""What a twin run measured: per request, per replica, per workflow; and the summary metrics.

Definitions (stable keys of ``results.json``, see the README):

* **SLO met**: the request completed, its TTFT and TPOT are within its class's
  targets and it finished before its deadline (if any).
* **goodput**: requests that met their SLO per second of simulated time.
* **task**: a workflow (or a single request without one); it **succeeds** when the
  workload completed it (every call sent) and all its calls completed and met their
  SLO.  A task still under way when the run stopped (``duration_s``: its next call
  was not sent, or a call never ended) is **unfinished**: not a success.  **cost per
  successful task** = the fleet's cost (every replica's $/h for the whole run, idle
  included) / successful tasks.
* **utilisation**: engine busy time / run time; **compute-bound share**: the part of
  busy time in steps whose roofline compute side exceeds the memory side.
* **capacity**: the fleet's roofline decode limit (every replica at its largest
  batch at the run's mean context); reported as achieved output tokens/s / limit.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np

from steersman.policy.request import SchedRequest

__all__ = ["Recorder", "OK", "REFUSED", "FAILED"]

OK, REFUSED, FAILED, PENDING = 0, 1, 2, 3


@dataclass(slots=True)
class _Wf:
    calls: int = 0
    good: int = 0
    bad: int = 0


_COLUMNS = ("arrival", "dispatch", "first", "finish", "status", "replica", "prompt", "output", "cached", "cost",
            "ttft_target", "tpot_target", "deadline", "tenant", "workflow", "http", "predicted")
(_ARRIVAL, _DISPATCH, _FIRST, _FINISH, _STATUS, _REPLICA, _PROMPT, _OUTPUT, _CACHED, _COST,
 _TTFT_T, _TPOT_T, _DEADLINE, _TENANT, _WORKFLOW, _HTTP, _PREDICTED) = range(len(_COLUMNS))
#: ``predicted`` column: Route.slo_prediction of the request's last route ("met", "missed", "none"; "none" too
#: when it was never routed)
_NAN, _INF = float("nan"), float("inf")


class Recorder:
    """Per-request rows (one small list each, written in place as the request moves), turned into
    columns once, by :meth:`arrays`."""

    __slots__ = ("fleet", "busy", "compute_bound", "_rows", "_by_idx", "duration", "engine_states", "_arrays",
                 "cut_short", "attempts", "attempt_failures")

    def __init__(self, fleet) -> None:
        self.fleet = fleet
        n = len(fleet.replicas)
        self.busy = np.zeros(n)
        self.compute_bound = np.zeros(n)
        self._rows: list[list] = []
        self._by_idx: dict[int, list] = {}
        self.duration = 0.0
        self.engine_states: list = []
        self._arrays: dict[str, np.ndarray] | None = None
        self.cut_short: set[str] = set()  # workflows whose next call came after the run stopped (not sent)
        # per replica: attempts sent there (retries, continuations and a disaggregated request's decode included),
        # and those that failed there (a request's row names only its last replica)
        self.attempts = np.zeros(n, dtype=np.int64)
        self.attempt_failures = np.zeros(n, dtype=np.int64)

    def arrived(self, idx: int, a, s: SchedRequest) -> None:
        b = s.budget
        row = [s.arrival, _NAN, _NAN, _NAN, PENDING, -1, a.prompt_tokens, 0, 0, 0.0,
               _INF if b.ttft_s is None else b.ttft_s, _INF if b.tpot_s is None else b.tpot_s,
               _INF if b.deadline is None else b.deadline, s.tenant, a.workflow or f"#{idx}", 0, "none"]
        self._rows.append(row)
        self._by_idx[idx] = row
        self._arrays = None

    def dispatched(self, idx: int, t: float, replica: int, predicted: str = "none") -> None:
        row = self._by_idx[idx]
        row[_DISPATCH] = t
        row[_REPLICA] = replica
        row[_PREDICTED] = predicted
        self._arrays = None

    def attempted(self, replica: int) -> None:
        self.attempts[replica] += 1

    def attempt_failed(self, replica: int) -> None:
        self.attempt_failures[replica] += 1

    def first_token(self, idx: int, t: float) -> None:
        self._by_idx[idx][_FIRST] = t
        self._arrays = None

    def lacks_first(self, idx: int) -> bool:
        f = self._by_idx[idx][_FIRST]
        return f != f  # NaN

    def finished(self, idx: int, t: float, output: int, cached: int, cost: float) -> None:
        row = self._by_idx[idx]
        row[_FINISH], row[_OUTPUT], row[_CACHED], row[_COST], row[_STATUS], row[_HTTP] = t, output, cached, cost, OK, 200
        self._arrays = None

    def refused(self, idx: int, t: float, status: int) -> None:
        row = self._by_idx[idx]
        row[_FINISH], row[_STATUS], row[_HTTP] = t, REFUSED, status
        self._arrays = None

    def failed(self, idx: int, t: float, cost: float) -> None:
        row = self._by_idx[idx]
        row[_FINISH], row[_STATUS], row[_HTTP], row[_COST] = t, FAILED, 502, cost
        self._arrays = None

    def replica_time(self, i: int, busy: float, compute_bound: float) -> None:
        self.busy[i] += busy
        self.compute_bound[i] += compute_bound

    def close(self, t: float, fleet, stop: float | None = None) -> None:
        """The run ended; ``t``: its last event's time, ``stop``: the time it was stopped at (requests still
        under way then did not drain).  ``duration``: until the last request ended (its end, or its arrival if it
        never ended), ``stop`` if some were still under way then: not the last event's time, which a drill step
        after the last request, a replica's weight load or the workload's 1 s pull cadence put past it (an
        audit: a kill at 5,000 s in a 34 s trace replay billed 5,000 s of the fleet; every run read up to 1 s long)."""
        last, cut = 0.0, False
        for row in self._rows:
            f = row[_FINISH]
            if f != f:  # NaN: under way when the run stopped
                cut = True
                f = row[_ARRIVAL]
            if f > last:
                last = f
        if cut and stop is not None:
            last = max(last, stop)
        self.duration = last if self._rows else t
        self.engine_states = [r.engine.state() for r in self.fleet.replicas]
        self._arrays = None

    @property
    def cols(self) -> dict[str, list]:
        """The columns as lists (a copy)."""
        return {k: [row[j] for row in self._rows] for j, k in enumerate(_COLUMNS)}

    def arrays(self) -> dict[str, np.ndarray]:
        """One array per column (computed once per state of the recorder; treat as read-only)."""
        if self._arrays is None:
            # with collection off: the conversion makes no reference cycles, but after a run the heap holds
            # millions of objects and a collection in the middle scanned them all for nothing (bench/twin,
            # 100,000 requests over 1,000 GPUs: 1.53 s with Python's default thresholds, 0.29 s without)
            was_on = gc.isenabled()
            gc.disable()
            try:
                cols = list(zip(*self._rows)) if self._rows else [()] * len(_COLUMNS)
                self._arrays = {k: np.asarray(v) for k, v in zip(_COLUMNS, cols)}
            finally:
                if was_on:
                    gc.enable()
        return self._arrays
