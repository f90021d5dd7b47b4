"""A dispatched request's deadline in the twin, as the live retry loop keeps it (``pipeline/runner.py``
``_before_deadline``): the attempt races its ``x-steersman-deadline-ms``; when the deadline passes first, the engine
request is cancelled (its slot and KV freed for the others) and the request fails (a 504, or a stream ended with
an error event), no verdict on its replica and no retry.  An attempt that reaches its engine with its deadline
already gone fails there and then (the live runner's ``left <= 0``).

A mixin of :class:`steersman.twin.core.Twin` (its state: ``tf``, ``clock``, ``accounting``, ``rec``, ``retries``,
``_reqs``; its ``_push``, ``_wake_at``, ``_fail``).  Disaggregated requests keep their deadline in the
results only (their two replicas' hand-off is not raced).
"""

from __future__ import annotations

from steersman.twin._events import _DEADLINE

__all__ = ["Deadlines"]


class Deadlines:
    def _watch_deadline(self, r) -> bool:
        """Called as attempt ``r`` reaches its engine: False if its deadline has passed (it failed now); else its
        deadline's event is scheduled (a later attempt's own event makes this one stale)."""
        deadline = r.sched.budget.deadline
        if deadline is None or self.pd is not None:
            return True
        if deadline <= self.clock.t:
            self._fail(r)  # (no verdict on the replica: a deadline that passed says nothing of it)
            return False
        self._push(deadline, _DEADLINE, (r, r.sim))
        return True

    def _deadline(self, r, sim) -> None:
        """``r``'s deadline passed: if that attempt (``sim``) is still on its engine, cancel it there and fail the
        request."""
        if r.sim is not sim or self._reqs.get(sim.req_id) is not r:
            return  # it ended, failed or moved meanwhile (a retry watches its own)
        del self._reqs[sim.req_id]
        i = r.started.replica
        wake, unsent = self.tf.replicas[i].abort(sim.req_id, self.clock.t)
        if wake is not None:
            self._wake_at(wake, i)
        self._fail(r, output_tokens=sim.num_output - unsent)  # (no verdict on the replica, as live)
