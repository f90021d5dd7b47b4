"""Agent workflows: what a task has already cost, and how much a failure of its next step would waste.

A client marks the calls of one task with headers (names lower-case, as the HTTP
server stores them):

* ``x-steersman-workflow-id``: the task (scoped to the tenant, so tenants cannot
  touch each other's workflows);
* ``x-steersman-workflow-step``: k, this call's 1-based step (optional: when
  absent, k = calls recorded so far + 1);
* ``x-steersman-workflow-steps``: n, the expected number of steps (optional,
  remembered from earlier calls).

The tracker keeps, per workflow, the calls completed, tokens used, dollars spent
(the *sunk cost*) and the start time, at most ``workflow_max_entries`` of them
(memory), forgetting workflows idle for ``workflow_idle_ttl_s``.  At the cap the
entry that goes is the least recently used of the tenant holding the most (fair
share across tenants): one tenant sending random workflow ids evicts its own
entries, not the other tenants' sunk cost.

**Protection value** (what the scheduler protects under overload)::

    value    = sunk_usd * (1 + progress)
    progress = (k - 1) / n        (0 when n is unknown or k = 1; at most 1)

It is what a failure of this request would waste -- the money already spent on
the task -- weighted up to 2x by how far the task got, since a late step is
closer to delivering the result and cheaper to finish.  The first step of a new
workflow has value 0, so under overload new workflows' first steps are shed
before in-flight workflows' late steps.  Sunk cost is measured by the gateway,
not claimed by the client; the client-supplied k and n can at most double it.

**A failed task.**  A task succeeds when all its calls meet their SLO (the objective is cost per
successful task), so the gateway marks a workflow *missed* once one of its calls ends outside its
SLO (TTFT, TPOT, deadline) or fails.  With ``AdmissionSettings.workflow_missed_demotion`` (opt-in,
in bands) its later calls are scheduled that many priority bands lower (:func:`effective_priority`):
under overload, capacity goes to the tasks that can still succeed.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from steersman.config.admission import AdmissionSettings
from steersman.policy.request import PriorityClass, WorkflowView

__all__ = [
    "WorkflowTracker", "WorkflowHeaders", "WorkflowHeaderError", "parse_workflow_headers", "protection_value",
    "WORKFLOW_ID_HEADER", "WORKFLOW_STEP_HEADER", "WORKFLOW_STEPS_HEADER", "effective_priority",
]

WORKFLOW_ID_HEADER = "x-steersman-workflow-id"
WORKFLOW_STEP_HEADER = "x-steersman-workflow-step"
WORKFLOW_STEPS_HEADER = "x-steersman-workflow-steps"


class WorkflowHeaderError(ValueError):
    """A workflow header is invalid (the gateway answers 400); ``header`` names it."""

    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header = header


@dataclass(frozen=True, slots=True)
class WorkflowHeaders:
    workflow_id: str
    step: int | None  # k, 1-based
    steps: int | None  # n


def effective_priority(priority: PriorityClass, workflow: WorkflowView | None, demotion: int) -> PriorityClass:
    """The band a request is scheduled in: its tenant's, or ``demotion`` bands lower (never below batch) when a
    call of its workflow has already missed its SLO (``AdmissionSettings.workflow_missed_demotion``)."""
    if demotion <= 0 or workflow is None or not workflow.missed:
        return priority
    return PriorityClass(min(int(priority) + demotion, int(PriorityClass.BATCH)))


def protection_value(spent_usd: float, step: int, steps: int | None) -> float:
    """``spent_usd * (1 + progress)`` with ``progress = (step - 1) / steps`` clamped to [0, 1]."""
    progress = 0.0 if not steps or step <= 1 else min(1.0, (step - 1) / steps)
    return spent_usd * (1.0 + progress)


def _positive_int(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    s = raw.strip()
    if not s.isascii() or not s.isdigit() or len(s) > 9 or int(s) < 1:
        raise WorkflowHeaderError(name, f"{name} must be an integer from 1 to 999999999, got {raw[:40]!r}")
    return int(s)


def parse_workflow_headers(headers: Mapping[str, str], max_id_chars: int = AdmissionSettings().workflow_id_max_chars) -> WorkflowHeaders | None:
    """The workflow headers of a request (lower-case names), ``None`` if it is not part of a workflow."""
    wid = headers.get(WORKFLOW_ID_HEADER)
    step = _positive_int(headers, WORKFLOW_STEP_HEADER)
    steps = _positive_int(headers, WORKFLOW_STEPS_HEADER)
    if wid is None:
        for name, v in ((WORKFLOW_STEP_HEADER, step), (WORKFLOW_STEPS_HEADER, steps)):
            if v is not None:
                raise WorkflowHeaderError(name, f"{name} needs {WORKFLOW_ID_HEADER}")
        return None
    wid = wid.strip()
    if not wid or len(wid) > max_id_chars or not wid.isprintable():
        raise WorkflowHeaderError(
            WORKFLOW_ID_HEADER, f"{WORKFLOW_ID_HEADER} must be 1 to {max_id_chars} printable characters"
        )
    if step is not None and steps is not None and step > steps:
        raise WorkflowHeaderError(
            WORKFLOW_STEP_HEADER, f"{WORKFLOW_STEP_HEADER} ({step}) must be <= {WORKFLOW_STEPS_HEADER} ({steps})"
        )
    return WorkflowHeaders(wid, step, steps)


class _State:
    __slots__ = ("started", "last_seen", "calls", "tokens", "spent_usd", "steps", "missed")

    def __init__(self, now: float) -> None:
        self.started = now
        self.last_seen = now
        self.calls = 0
        self.tokens = 0
        self.spent_usd = 0.0
        self.steps: int | None = None
        self.missed = False  # a call missed its SLO


class WorkflowTracker:
    """Per-(tenant, workflow) usage, bounded with fair share across tenants and an idle TTL.

    Expired entries (idle ``workflow_idle_ttl_s``) of any tenant go first.  Past ``workflow_max_entries`` the least
    recently used entry of the tenant holding the most goes (ties: the one that has held that many longest), so no
    entry of a tenant below its fair share goes while another tenant is above it: a tenant flooding random workflow
    ids evicts its own.  O(1) per call (amortized, as the TTL sweep): entries in a global LRU (the sweep), each tenant's
    in its own LRU, and the tenants grouped by how many entries they hold.
    """

    def __init__(self, settings: AdmissionSettings = AdmissionSettings()) -> None:
        if settings.workflow_max_entries < 1:
            raise ValueError(f"workflow_max_entries must be >= 1, got {settings.workflow_max_entries}")
        if not settings.workflow_idle_ttl_s > 0:
            raise ValueError(f"workflow_idle_ttl_s must be > 0, got {settings.workflow_idle_ttl_s}")
        self._max = settings.workflow_max_entries
        self._ttl = settings.workflow_idle_ttl_s
        self._states: OrderedDict[tuple[str, str], _State] = OrderedDict()  # all entries, least recently used first
        self._tenants: dict[str, OrderedDict[str, None]] = {}  # a tenant's workflow ids, least recently used first
        # the tenants holding n >= 1 entries, the one that has held n longest first (ordered: O(1) to find)
        self._holding: dict[int, OrderedDict[str, None]] = {}
        self._most = 0  # the most entries a tenant holds

    def __len__(self) -> int:
        return len(self._states)

    def _held(self, tenant: str, before: int, after: int) -> None:
        """``tenant`` went from holding ``before`` entries to ``after`` (one more or one fewer)."""
        holding = self._holding
        group = holding.get(after) if after else None
        if before:
            left = holding[before]
            if group is None and after and len(left) == 1:  # alone at ``before``, nobody at ``after``: it moves
                del holding[before]
                holding[after] = left
            else:
                del left[tenant]
                if not left:
                    del holding[before]
                before = 0
        if after and before == 0:
            if group is None:
                group = holding[after] = OrderedDict()
            group[tenant] = None
        if after > self._most:
            self._most = after
        elif self._most not in holding:
            self._most = after  # one fewer, and it held the most alone

    def _evict(self, now: float) -> None:
        """Expired entries of any tenant go, then, past the cap, the least recently used of the tenant holding
        the most."""
        states = self._states
        while states:
            key, oldest = next(iter(states.items()))
            if oldest.last_seen + self._ttl <= now:
                tenant, workflow_id = key  # idle too long, whoever's
            elif len(states) > self._max:
                tenant = next(iter(self._holding[self._most]))
                workflow_id = next(iter(self._tenants[tenant]))
                key = (tenant, workflow_id)
            else:
                break
            del states[key]
            ids = self._tenants[tenant]
            del ids[workflow_id]
            n = len(ids)
            if not n:
                del self._tenants[tenant]
            self._held(tenant, n + 1, n)

    def _touch(self, tenant: str, workflow_id: str, now: float) -> _State:
        key = (tenant, workflow_id)
        states = self._states
        state = states.get(key)
        if state is None:
            ids = self._tenants.get(tenant)
            if ids is None:
                ids = self._tenants[tenant] = OrderedDict()
            n = len(ids)
            if n == self._most and len(states) >= self._max and next(iter(states.values())).last_seen + self._ttl > now:
                # at the cap, nothing idle, and this tenant holds the most: its own least recently used makes room
                gone = next(iter(ids))
                del ids[gone]
                del states[(tenant, gone)]
                ids[workflow_id] = None
                state = states[key] = _State(now)
            else:
                state = states[key] = _State(now)
                ids[workflow_id] = None
                self._held(tenant, n, n + 1)
                if len(states) > self._max:
                    self._evict(now)
        else:
            states.move_to_end(key)
            self._tenants[tenant].move_to_end(workflow_id)
            if state.last_seen + self._ttl <= now:
                state = states[key] = _State(now)  # idle too long: a new task under an old id
            else:
                state.last_seen = max(state.last_seen, now)
        if next(iter(states.values())).last_seen + self._ttl <= now:
            self._evict(now)
        return state

    def track(self, tenant: str, headers: WorkflowHeaders, now: float) -> WorkflowView:
        """A request of this workflow starts: its view, with the protection value (the entry made or refreshed)."""
        self.admitted(tenant, headers.workflow_id, headers.steps, now)
        return self.peek(tenant, headers, now)

    def peek(self, tenant: str, headers: WorkflowHeaders, now: float) -> WorkflowView:
        """The view :meth:`track` gives, changing nothing: for a request not admitted yet, which its tenant's budget
        or rate limits may still refuse (the entries are shared: a throttled tenant's refused requests must not evict
        other tenants' workflows, nor keep its own alive).  :meth:`admitted` makes the entry once it is let in."""
        state = self._states.get((tenant, headers.workflow_id))
        if state is not None and state.last_seen + self._ttl <= now:
            state = None  # idle too long: a new task under an old id
        steps = headers.steps if headers.steps is not None or state is None else state.steps
        calls, spent = (state.calls, state.spent_usd) if state is not None else (0, 0.0)
        step = headers.step if headers.step is not None else calls + 1
        return WorkflowView(
            workflow_id=headers.workflow_id,
            step=step,
            steps=steps,
            calls=calls,
            tokens=state.tokens if state is not None else 0,
            spent_usd=spent,
            started=state.started if state is not None else now,
            value=protection_value(spent, step, steps),
            missed=state.missed if state is not None else False,
        )

    def admitted(self, tenant: str, workflow_id: str, steps: int | None, now: float) -> None:
        """A request of this workflow was let in (admitted; it may still wait in the queue): its entry is made or
        refreshed, remembering ``steps`` (n) when given."""
        state = self._touch(tenant, workflow_id, now)
        if steps is not None:
            state.steps = steps

    def record(self, tenant: str, workflow_id: str, *, tokens: int, cost_usd: float, now: float,
               met: bool = True) -> None:
        """A call of this workflow ended having used ``tokens`` and cost ``cost_usd``; ``met``: within its SLO."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"tokens must be an int >= 0, got {tokens!r}")
        if not (isinstance(cost_usd, (int, float)) and math.isfinite(cost_usd) and cost_usd >= 0):
            raise ValueError(f"cost_usd must be a finite number >= 0, got {cost_usd!r}")
        state = self._touch(tenant, workflow_id, now)
        state.calls += 1
        state.tokens += tokens
        state.spent_usd += float(cost_usd)
        state.missed = state.missed or not met
