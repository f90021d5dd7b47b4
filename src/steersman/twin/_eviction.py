"""What the live retry loop does when the reliability guard ejects a replica (``pipeline/runner.py``
``Pipeline.evict``), in the twin: its attempts that sent nothing yet are cancelled there and retried elsewhere (the
gateway's own abandoning: no verdict on the replica, no retry-budget token), and its streams under way continue on
another replica (the prompt and the tokens already sent are prefilled there).  Without it, a replica ejected for
its latency (a slowed GPU) kept every request it held to the end, as slow as it had become.

A mixin of :class:`steersman.twin.core.Twin` (its state: ``tf``, ``fleet``, ``clock``, ``pd``, ``_reqs``; its
``schedule_drill``, ``_wake_at``, ``_failed``).  Disaggregated fleets keep their requests where they are.
"""

from __future__ import annotations

__all__ = ["Eviction"]


class Eviction:
    def _on_eject(self, i: int, reason: str) -> None:
        """The guard's callback: it may run inside a snapshot (its sweep), so the eviction is an event of its own,
        at this time, after the one being handled."""
        self.schedule_drill(self.clock.t, lambda tw: tw._evict(i))

    def _evict(self, i: int) -> None:
        if self.pd is not None or not self.fleet.blocked(i):
            return  # (let back in meanwhile: nothing to move)
        rep = self.tf.replicas[i]
        now = self.clock.t
        held = [r for r in self._reqs.values() if r.started is not None and r.started.replica == i]
        for r in held:
            sim = r.sim
            del self._reqs[sim.req_id]
            wake, unsent = rep.abort(sim.req_id, now)
            if wake is not None:
                self._wake_at(wake, i)
            r.delivered += sim.num_output - unsent  # tokens its client already has (the twin's requests stream)
            self.evicted += 1
            # as live: an attempt that sent nothing is the gateway's own abandoning (no verdict on the replica); a
            # stream it drops to continue elsewhere fails there as any broken stream (Pipeline.evict)
            self._failed(r, continue_only=r.delivered > 0, evicted=r.delivered == 0)
