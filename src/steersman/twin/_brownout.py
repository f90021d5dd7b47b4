"""Brown-out in the twin, as the live gateway's ``brownout`` stage (:mod:`steersman.pipeline.brownout`): with the
reliability mechanisms on, a sheddable request for a model in brown-out moves to the cheaper model
``reliability.brownout_models`` names, or is refused with 503 and Retry-After, before admission; the same
:class:`~steersman.reliability.brownout_gate.BrownoutGate` decides.

A mixin of :class:`steersman.twin.core.Twin` (its state: ``brownout_gate``, ``plane``, ``fleet``, ``accounting``,
``clock``; its ``_refused``).
"""

from __future__ import annotations

from dataclasses import replace

from steersman.control.plane import Refuse
from steersman.policy.request import PriorityClass
from steersman.reliability.brownout import MoveTo, Shed

__all__ = ["TwinBrownout"]


class TwinBrownout:
    def _brownout(self, r) -> bool:
        """Brown-out's say on arriving request ``r`` (its ``sched`` rewritten when moved); False: it was refused."""
        gate, sched = self.brownout_gate, r.sched
        if gate is None or sched.priority != PriorityClass.SHEDDABLE:
            return True
        act = gate.decide(sched, self.plane.waiting_for(sched.model), self.fleet.snapshot, self.fleet.has_model,
                          self.clock.t)
        if isinstance(act, Shed):
            self.brownout_counts["shed"] += 1
            self._refused(r, Refuse(503, "brownout", act.reason, self.plane.settings.no_replica_retry_after_s))
            return False
        if isinstance(act, MoveTo):
            self.brownout_counts["moved"] += 1
            r.sched = replace(sched, model=act.model,
                              expected_output=self.accounting.expected_output(act.model, sched.tenant, sched.max_tokens))
        return True
