"""The drill actions of the twin: kill, slow, errors, restore, and an operator's drain / resume (what a drill step
does to a replica).

A mixin of :class:`steersman.twin.core.Twin`: the drill steps of the workload spec
(:mod:`steersman.twin.drills`) call these at their simulated times; the replica's
requests then go where the live gateway would send them.
"""

from __future__ import annotations

import math


__all__ = ["DrillActions"]


class DrillActions:
    """Drill steps on replica ``i`` (the twin's state: ``tf``, ``fleet``, ``plane``, ``clock``, ...)."""

    def kill(self, i: int) -> None:
        """Replica ``i`` dies.  Its requests fail, or, with the reliability mechanisms on, its streams under way
        continue elsewhere and the others are retried (:mod:`steersman.twin.retries`).  The gateway stops
        routing there after the failed scrapes (``unhealthy_after_failures`` x the scrape interval), or at
        once on a failed dispatch."""
        rep = self.tf.replicas[i]
        done, lost = rep.kill(self.clock.t)
        self.rec.replica_time(i, done.busy_s, done.compute_bound_s)
        for rid in done.first_tokens:  # a run that ended now, its wake not handled yet: as Twin._wake
            r = self._reqs.get(rid)
            if r is not None and r.started is not None and not r.pd:
                self.accounting.first_token(r.started)
                if not r.delivered or self.rec.lacks_first(r.idx):
                    self.rec.first_token(r.idx, self.clock.t)
        for rid in done.finished:
            r = self._reqs.pop(rid, None)
            if r is not None:
                if r.pd == 1:
                    self._handoff(r, i)
                else:
                    self._finished(r)
        for rid, unsent in lost:
            r = self._reqs.pop(rid, None)
            if r is not None:
                sent = r.sim.num_output - unsent if not r.pd else 0  # tokens its client already has
                r.delivered += sent
                self._failed(r, continue_only=r.delivered > 0)
        detect = self.cfg.unhealthy_after_failures * self.cfg.metrics_interval_s
        self.schedule_drill(self.clock.t + detect, lambda tw: tw.tf.replicas[i].dead and tw.fleet.set_healthy(i, False))

    def slow(self, i: int, factor: float) -> None:
        """Replica ``i``'s GPU degrades: every step from the next boundary on lasts ``factor`` x longer."""
        rep = self.tf.replicas[i]
        wake = rep.set_slowdown(factor, self.clock.t)
        if wake is not None:
            self._wake_at(wake, i)

    def errors(self, i: int, rate: float) -> None:
        self.tf.replicas[i].error_rate = rate

    def drain(self, i: int, draining: bool) -> None:
        """An operator takes replica ``i`` out of rotation (``draining``) or puts it back, as ``POST
        /admin/replicas/{name}/drain`` / ``resume`` on the live gateway (:meth:`Fleet.set_draining`)."""
        self.fleet.set_draining(i, draining)
        if not draining and self.plane.waiting:
            self._dispatch_queued()

    def restore(self, i: int) -> None:
        """Replica ``i`` recovers: no slowdown, no errors; a dead one restarts cold (weights load, empty KV cache)
        and takes traffic again once warm and scraped healthy, as the live gateway would see it."""
        rep = self.tf.replicas[i]
        self.errors(i, 0.0)
        self.slow(i, 1.0)
        if not rep.dead:
            return
        rep.dead = False
        rep.engine.unload()
        ready = rep.engine.begin_load(self.clock.t)
        self._scraped[i] = -math.inf
        self._scrape(i)  # loading: not routable

        def warm(tw) -> None:
            tw.tf.replicas[i].engine.state(tw.clock.t)  # the load finished
            tw._scraped[i] = -math.inf
            tw._scrape(i)
            tw.fleet.set_healthy(i, True)
            if tw.plane.waiting:
                tw._dispatch_queued()

        self.schedule_drill(ready, warm)
