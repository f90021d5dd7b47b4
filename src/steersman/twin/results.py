"""What a twin run measured: per request, per replica, per workflow; and the summary metrics.

Definitions (stable keys of ``results.json``, see the README):

* **SLO met**: the request completed, its TTFT and TPOT are within its class's
  targets and it finished before its deadline (if any).
* **goodput**: requests that met their SLO per second of simulated time.
* **task**: a workflow (or a single request without one); it **succeeds** when all
  its calls completed and met their SLO.  **cost per successful task** = the
  fleet's cost (every replica's $/h for the whole run, idle included) / successful tasks.
* **utilisation**: engine busy time / run time; **compute-bound share**: the part of
  busy time in steps whose roofline compute side exceeds the memory side.
* **capacity**: the fleet's roofline decode limit (every replica at its largest
  batch at the run's mean context); reported as achieved output tokens/s / limit.
"""

from __future__ import annotations

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


class Recorder:
    def __init__(self, fleet) -> None:
        self.fleet = fleet
        n = len(fleet.replicas)
        self.busy = np.zeros(n)
        self.compute_bound = np.zeros(n)
        self.cols: dict[str, list] = {k: [] for k in (
            "arrival", "dispatch", "first", "finish", "status", "replica", "prompt", "output", "cached", "cost",
            "ttft_target", "tpot_target", "deadline", "tenant", "workflow", "http")}
        self._index: dict[int, int] = {}
        self.duration = 0.0
        self.engine_states: list = []

    def arrived(self, idx: int, a, s: SchedRequest) -> None:
        c = self.cols
        self._index[idx] = len(c["arrival"])
        for k, v in (("arrival", s.arrival), ("dispatch", np.nan), ("first", np.nan), ("finish", np.nan),
                     ("status", PENDING), ("replica", -1), ("prompt", a.prompt_tokens), ("output", 0), ("cached", 0),
                     ("cost", 0.0), ("ttft_target", s.budget.ttft_s if s.budget.ttft_s is not None else np.inf),
                     ("tpot_target", s.budget.tpot_s if s.budget.tpot_s is not None else np.inf),
                     ("deadline", s.budget.deadline if s.budget.deadline is not None else np.inf),
                     ("tenant", s.tenant), ("workflow", a.workflow or f"#{idx}"), ("http", 0)):
            c[k].append(v)

    def _set(self, idx: int, **kw) -> None:
        j = self._index[idx]
        for k, v in kw.items():
            self.cols[k][j] = v

    def dispatched(self, idx: int, t: float, replica: int) -> None:
        self._set(idx, dispatch=t, replica=replica)

    def first_token(self, idx: int, t: float) -> None:
        self._set(idx, first=t)

    def finished(self, idx: int, t: float, output: int, cached: int, cost: float) -> None:
        self._set(idx, finish=t, output=output, cached=cached, cost=cost, status=OK, http=200)

    def refused(self, idx: int, t: float, status: int) -> None:
        self._set(idx, finish=t, status=REFUSED, http=status)

    def failed(self, idx: int, t: float, cost: float) -> None:
        self._set(idx, finish=t, status=FAILED, http=502, cost=cost)

    def replica_time(self, i: int, busy: float, compute_bound: float) -> None:
        self.busy[i] += busy
        self.compute_bound[i] += compute_bound

    def close(self, t: float, fleet) -> None:
        self.duration = t
        self.engine_states = [r.engine.state() for r in self.fleet.replicas]

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in self.cols.items()}
