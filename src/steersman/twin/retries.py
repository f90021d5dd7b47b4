"""The live gateway's retries and stream continuation, on the twin's virtual clock.

With :attr:`TwinConfig.reliability <steersman.twin.core.TwinConfig.reliability>` set, a
request whose attempt fails is handled as the live request path handles it
(:class:`steersman.pipeline.runner.Pipeline`), with the same
:class:`~steersman.reliability.retrier.Retrier` deciding:

* before every upstream attempt, the adaptive throttle may refuse it (503);
* an attempt that failed before the first token (a dead replica, a 5xx, a replica
  killed while the request waited or prefilled) is retried while the attempts, the
  retry budget and the deadline allow, after a full-jitter backoff, routed again by
  the policy with the failed replicas excluded and without being admitted again;
* a stream whose replica died after its first token continues on another replica
  at once: the new replica prefills the prompt plus the tokens already sent (the
  prompt's blocks may be cached there; the sent tokens are not) and generates the
  rest, so the client sees one stream with a gap, and the TTFT it saw stands;
* a re-route that finds no replica free waits in the gateway queue, already admitted,
  as live (:meth:`~steersman.control.plane.ControlPlane.requeue`); a resumed stream is
  not held back by the gates on new work (concurrency limit, saturation queue:
  :attr:`~steersman.policy.request.SchedRequest.resumed`).

The failed attempt's replica accounting ends when the next replica is chosen, as
live.  Not modelled: retries in prefill/decode-disaggregated mode (a failure there
ends the request), and a continuation being refused because its stream held a tool
call (the twin's requests have none).
"""

from __future__ import annotations

import random
from dataclasses import replace

from steersman.config import ReliabilitySettings
from steersman.control.plane import Dispatch, Refuse, Wait
from steersman.policy.base import Queue, Route
from steersman.reliability.retrier import Retrier

__all__ = ["TwinRetries"]


class TwinRetries:
    """Per-twin retry state; the twin calls it at each attempt, failure and end of a request."""

    __slots__ = ("tw", "retrier")

    def __init__(self, twin, settings: ReliabilitySettings, seed: int) -> None:
        self.tw = twin
        self.retrier = Retrier(settings, twin.clock, random.Random(seed))

    @property
    def counts(self) -> dict[str, float]:
        return {k[0]: v for k, v in self.retrier.counts.values.items()}

    # ---- attempts ---------------------------------------------------------------------------
    def attempt(self, r) -> bool:
        """Before an upstream attempt (``r.started`` is its accounting): False when the throttle refuses it."""
        rt = self.retrier
        if not r.began:
            rt.begin()
            r.began = True
        if not rt.admit_attempt(r.delivered > 0):  # (a stream under way is continued, as live)
            return False
        r.attempts += 1
        if r.holding:  # the retried attempt's first token gives the budget token back
            r.started.ticket.on_first = lambda: self._release(r)
        return True

    def _release(self, r) -> None:
        if r.holding:
            r.holding = False
            self.retrier.release()

    def ended(self, r, served: bool | None) -> None:
        """The request is over (``served``: its last attempt's verdict, None when it never went upstream)."""
        if served is not None:
            self.retrier.attempt_ended(served)
        if r.began:
            self.retrier.end(r.holding)
            r.began = r.holding = False

    def failed(self, r, continue_only: bool, evicted: bool = False) -> float | None:
        """Attempt ``r.started`` failed on its replica: seconds until the request is routed again, or None
        (the request fails).  ``continue_only``: its stream had begun; ``evicted``: the gateway abandoned it on an
        ejected replica (as live: no retry-budget token)."""
        rt = self.retrier
        rt.attempt_ended(False)
        i = r.started.replica
        r.excluded.add(i)
        fleet = self.tw.fleet
        d = rt.after_failure(continue_only, r.attempts, True, rt.remaining(r.sched),
                             lambda: evicted or fleet.out_of_rotation(i), evicted, r.holding, rt.share(r.sched))
        r.holding = d.holding
        return d.delay_s if d.again else None

    # ---- routing again ------------------------------------------------------------------------
    def reroute(self, r) -> Dispatch | Wait | Refuse | None:
        """Route ``r`` again, avoiding the replicas that failed it: a dispatch (the failed attempt's accounting
        ended, its cost carried: :meth:`Accounting.left`); a wait in the gateway queue when no replica can take it
        now (:meth:`ControlPlane.requeue`, as live: its failed attempt's accounting ended, the twin dispatches it
        from there); a refusal (the queue shed
        it); or None (no replica at all: the request fails).  A request its queueing sheds is refused through the
        twin (``Twin._refused``)."""
        tw = self.tw
        req = replace(r.sched, excluded=frozenset(r.excluded), resumed=r.delivered > 0)
        decision = tw.plane.policy.pick(tw.fleet.snapshot(), req)
        if isinstance(decision, Route):
            r.started = tw.accounting.left(r.started)  # Twin._dispatch carries its cost into the next attempt
            r.sched = req
            return Dispatch(decision, r.started.admit)
        if not isinstance(decision, Queue):
            return None
        r.started = tw.accounting.left(r.started)  # not in flight there while it waits
        r.sched = req
        out, shed = tw.plane.requeue(r, req, r.started.admit, r.tenant.weight, tw.clock.t)
        for victim, refusal in shed:
            tw._refused(victim, refusal)
        return out
