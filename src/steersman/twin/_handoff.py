"""The twin's prefill/decode hand-off (:mod:`steersman.twin.pd`): a prefill done, its KV moved to a decode replica.

A mixin of :class:`steersman.twin.core.Twin` (its state: ``tf``, ``fleet``, ``accounting``, ``decode_picker``,
``pd``, ``clock``, ``rec``, ``_reqs``; its ``_push``, ``_fail``, ``_failed``, ``_finished``).
"""

from __future__ import annotations

import dataclasses

from steersman.policy.base import Route
from steersman.sim import SimRequest
from steersman.twin._events import _KV, _WAKE

__all__ = ["Handoff"]


class Handoff:
    """The two events of a disaggregated request between its replicas."""

    def _handoff(self, r, i: int) -> None:
        """Prefill done on replica ``i``: its KV moves to the decode replica the control plane picks."""
        model = self.tf.plans[i].model
        d = self.decode_picker.pick_decode(self.fleet.snapshot(), r.sched, i)
        if not isinstance(d, Route):  # no decode replica of the model is available: the prefill one did its part
            self.fleet.report(r.started.ticket, True)
            self._fail(r)
            return
        j = d.replica
        r.pd, r.decode, r.cached = 2, j, max(r.sim.num_cached_tokens, 0)
        r.transfer = self.accounting.decode_ticket(r.started, j)  # the decode replica counts it from now on
        self._push(self.clock.t + self.pd.transfer_s(model, r.sim.prompt_len, i, j), _KV, (r, j))

    def _kv_arrived(self, r, j: int) -> None:
        """The KV is on decode replica ``j``: the first token reaches the client, decoding starts there."""
        now = self.clock.t
        rep = self.tf.replicas[j]
        t, r.transfer = r.transfer, None
        if rep.dead:
            self.rec.attempted(j)  # the decode replica's part, failed there
            self.rec.attempt_failed(j)
            self.fleet.set_healthy(j, False, active=False)  # passive detection: the transfer found no one, as a failed connection
            self.fleet.report(t, False)  # the decode replica's failure; the prefill replica did its part
            s = r.started  # the decode ticket's share of its replica's time is the request's cost too
            r.started = dataclasses.replace(s, earlier_cost=s.earlier_cost + self.fleet.end(t))
            self.fleet.report(r.started.ticket, True)
            self._fail(r)
            return
        r.started = self.accounting.handed_off(r.started, t, r.cached)
        self.rec.attempted(j)  # the decode replica's part of the request
        a = r.arrival
        if a.output_tokens <= 1:
            self.rec.first_token(r.idx, now)
            self._finished(r)
            return
        p = r.sim
        r.sim = SimRequest(req_id=p.req_id, prompt_len=p.prompt_len, max_output=a.output_tokens,
                           block_hashes=p.block_hashes, priority=p.priority, arrival=now, kv_ready=True)
        self._reqs[p.req_id] = r
        try:
            wake = rep.submit(r.sim, now)
        except ValueError:  # can never run there: no first token reached the client
            del self._reqs[p.req_id]
            self._failed(r)
            if rep.wake_at is not None:  # submit may have cut a decode run first: its new end must still wake it
                self._push(rep.wake_at, _WAKE, (j, rep.generation))
            return
        self.rec.first_token(r.idx, now)
        if wake is not None:
            self._push(wake, _WAKE, (j, rep.generation))
