"""The control plane's decision core: admission, scheduling and the gateway queue as one machine.

Pure and synchronous: callers pass ``now``, fleet snapshots and opaque items (the
live gateway passes its pending requests and waits on futures; the digital twin
passes simulated requests and schedules events).  Every call returns typed
outcomes saying what to do with which item:

* :meth:`ControlPlane.arrive` — a new request: :class:`Dispatch` it to a replica,
  let it :class:`Wait` in the queue, or :class:`Refuse` it (429 rate limit, budget or
  the tenant's concurrency, 503 no capacity / a deadline the load ahead makes infeasible / shed, 400 a deadline the request alone
  cannot meet).  Queueing may shed an
  older, less important request: it comes back as a ``(victim, Refuse)`` pair.
* :meth:`ControlPlane.requeue` — a retry that no replica can take now waits in the
  queue again, already admitted.
* :meth:`ControlPlane.dispatch` — capacity may have freed: queued requests that
  can now run, in queue order.
* :meth:`ControlPlane.expire` — queued requests whose deadline can no longer be met, and those of an
  early-rejection class whose TTFT budget ran out while they waited (when the policy sheds them).
* :meth:`ControlPlane.finish` / :meth:`ControlPlane.abandon` — a dispatched request
  ended (settle tokens and spend) / a queued one was given up by its client.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


from steersman.config import DEFAULTS, SchedulerSettings
from steersman.control.admission import Admit, Admitter, check_deadline
from steersman.control.deadlines import alone as _alone, earliest_finish as _earliest_finish
from steersman.control.queue import STOP, Enqueued, GatewayQueue
from steersman.control.shed_watch import REASK_S, ShedWatch
from steersman.control.tenants import TenantConfig
from steersman.fleet.snapshot import FleetSnapshot
from steersman.policy.base import Queue, Reject, Route, RoutingPolicy
from steersman.policy.request import PriorityClass, SchedRequest
from steersman.policy.saturation import saturated

__all__ = ["Dispatch", "Wait", "Refuse", "ControlPlane", "DISPATCH_BURST"]

#: queued requests dispatched per wake-up of the queue, one decision at a time (each dispatch's accounting in the
#: next decision's snapshot); the rest wait for the next wake-up, so a long queue does not stall the event loop
DISPATCH_BURST = 64
#: decisions made per queued request dispatched (requests held back for a replica that can meet their SLO are
#: asked in queue order): bounds a drain's cost when many wait
DISPATCH_PICKS = 32
#: entries the first pass (requests with TTFT budget left) looks at per pop before the queue's plain order takes
#: over: the oldest entries, which a long overload makes stale, come first in it, so this bounds the walk
DISPATCH_FIRST_LOOKS = 256
#: queued requests with a deadline whose feasibility one expiry pass (every 50 ms) predicts, earliest deadlines
#: first: a prediction each (~25 us), 1,024 queued took ~25 ms of every 50 (review, twenty-seventh session); the
#: later ones are judged when they come up, and expire when their deadline passes
EXPIRE_CHECKS = 64


def _first(req: SchedRequest, now: float) -> bool:
    """Served in the queue's first pass: protected (critical, sunk cost), or its TTFT budget has time left."""
    if req.priority == PriorityClass.CRITICAL or req.protection > 0:
        return True
    ttft = req.budget.ttft_s
    return ttft is not None and now - req.arrival < ttft


def _first_until(req: SchedRequest) -> float:
    """Until when :func:`_first` holds for ``req`` (inf: always; -inf: never)."""
    if req.priority == PriorityClass.CRITICAL or req.protection > 0:
        return math.inf
    ttft = req.budget.ttft_s
    return -math.inf if ttft is None else req.arrival + ttft


@dataclass(frozen=True, slots=True)
class Dispatch:
    route: Route
    admit: Admit


@dataclass(frozen=True, slots=True)
class Wait:
    depth: int


@dataclass(frozen=True, slots=True)
class Refuse:
    status: int
    code: str
    reason: str
    retry_after: float | None = None
    param: str | None = None  # the request field a 4xx names


def _refusal(decision: Reject, settings: SchedulerSettings) -> Refuse:
    """A policy's refusal as the gateway answers it: a 503 that names no wait of its own gets
    ``scheduler.no_replica_retry_after_s``."""
    wait = decision.retry_after
    if wait is None and decision.status == 503:
        wait = settings.no_replica_retry_after_s
    return Refuse(decision.status, decision.code, decision.reason, wait, decision.param)


@dataclass(slots=True)
class _Queued:
    req: SchedRequest
    admit: Admit
    ran: bool = False  # a retry waiting again (requeue): its admission is settled when the request ends, not here


class ControlPlane:
    def __init__(self, policy: RoutingPolicy, admitter: Admitter, queue: GatewayQueue,
                 settings: SchedulerSettings = DEFAULTS.scheduler) -> None:
        self.policy = policy
        self.admitter = admitter
        self.queue = queue
        self.settings = settings
        self._waiting: dict[Any, _Queued] = {}
        self._held_at: float | None = None  # the ``now`` of the last dispatch pass ...
        self._held: set[int] = set()  # ... and the queued requests the policy held back in it (by id)
        self._kept: set[int] = set()  # queued requests waiting for a slot (Queue.keeps_place), by id: first pass
        self._no_replica: dict[str, float] = {}  # a model waited for that has had no replica in rotation since
        #: band -> heap of (until when its TTFT budget has time left, seq, item) of the requests that waited there
        #: with one (see _queued); entries that left or whose budget ran out are dropped as they surface
        self._fresh: dict[int, list[tuple[float, int, Any]]] = {}
        self._fresh_seq = itertools.count()
        # the profile's early rejection (policy/framework.py Profile), when its picker has one (the baselines' none),
        # and the classes it sheds, the picker's own (control/shed_watch.py)
        picker = getattr(policy, "picker", None)
        self._early = getattr(policy, "early_reject", None) if getattr(picker, "early_reject", None) else None
        self._shed_watch = ShedWatch(getattr(picker, "shed", frozenset()) if self._early is not None else frozenset())

    # ---- arrivals ------------------------------------------------------------------
    def arrive(self, item: Any, req: SchedRequest, tenant: TenantConfig, snapshot: FleetSnapshot,
               now: float) -> tuple[Dispatch | Wait | Refuse, list[tuple[Any, Refuse]]]:
        a = self.admitter.admit(req, tenant, now)
        if not isinstance(a, Admit):
            return Refuse(a.status, a.code, a.reason, a.retry_after), []
        if req.budget.deadline is not None and snapshot.candidates(req.model).size:  # (none: the policy's 503 says
            # when to retry; refused at once, not queued or sent to time out)
            finish = _earliest_finish(snapshot, req, self.settings)
            late = check_deadline(req.budget.deadline, finish, now)
            if late is not None and late.retry_after is not None:  # late because of the load ahead, or always?
                # (at most the loaded prediction: both are predictions, and "alone" must not read longer)
                late = check_deadline(req.budget.deadline, finish, now,
                                      min_service_s=min(_alone(snapshot, req, self.settings), finish - now))
            if late is not None:
                self.admitter.release(a, now)
                return Refuse(late.status, late.code, late.reason, late.retry_after), []
        if len(self.queue) and self.queue.waiting_models().get(req.model) and snapshot.candidates(req.model).size:
            # requests already wait for this model: capacity that frees goes to them in queue order (band,
            # fairness, value, deadline), not to whoever arrives at that moment (issue #5: a critical request
            # queued behind a stream of new standard arrivals missed its SLO)
            decision = Queue("requests for this model are already waiting")
        else:
            decision = self.policy.pick(snapshot, req)
        if isinstance(decision, Queue) and self._early is not None and self._shed_watch.applies(req):
            asked = self._early(snapshot, req)  # early rejection of what would wait: asked all the same, over the
            if asked is not None:  # saturated replicas too (control/shed_watch.py)
                self.admitter.release(a, now)
                return _refusal(asked, self.settings), []
        if isinstance(decision, Route):
            return Dispatch(decision, a), []
        if isinstance(decision, Reject):
            self.admitter.release(a, now)
            return _refusal(decision, self.settings), []
        assert isinstance(decision, Queue)
        pushed = self.queue.push(item, req, now, weight=tenant.weight)
        if decision.keeps_place:
            self._kept.add(id(item))
        if isinstance(pushed, Enqueued):
            self._queued(item, _Queued(req, a))
            return Wait(pushed.depth), []
        if pushed.newcomer:
            self._kept.discard(id(item))
            self.admitter.release(a, now)
            return Refuse(503, "shed", "the gateway queue is full of more important requests",
                          self.settings.no_replica_retry_after_s), []
        self._queued(item, _Queued(req, a))
        return Wait(len(self.queue)), [self._shed(pushed.item, now)]

    def requeue(self, item: Any, req: SchedRequest, admit: Admit, weight: float,
                now: float) -> tuple[Wait | Refuse, list[tuple[Any, Refuse]]]:
        """An admitted request whose attempt failed, re-routed (``req.excluded``: the replicas that failed it) when
        no replica can take it now (the policy said :class:`Queue`): it waits in the queue as a new arrival would,
        under its first arrival time, and leaves through :meth:`dispatch` or :meth:`expire` like the others.  It is
        not admitted again, and a refusal from the queue does not release its admission: it ran, and its end
        settles it.  Like :meth:`arrive`, queueing it may shed a less important request."""
        pushed = self.queue.push(item, req, now, weight=weight)
        if isinstance(pushed, Enqueued):
            self._queued(item, _Queued(req, admit, ran=True))
            return Wait(pushed.depth), []
        if pushed.newcomer:
            return Refuse(503, "shed", "the gateway queue is full of more important requests",
                          self.settings.no_replica_retry_after_s), []
        self._queued(item, _Queued(req, admit, ran=True))
        return Wait(len(self.queue)), [self._shed(pushed.item, now)]

    def _queued(self, item: Any, q: _Queued) -> None:
        """``item`` waits in the queue now.  Until when it is served in the first pass (:func:`_first`) is kept per
        band, so a pass over a band where no waiting request has TTFT budget left skips that walk (a long overload
        leaves the queue like that: DISPATCH_FIRST_LOOKS stale entries were walked for nothing at every pop)."""
        self._waiting[item] = q
        req = q.req
        if self._early is not None and self._shed_watch.applies(req):
            self._shed_watch.watch(item, req)
        until = _first_until(req)
        if until > -math.inf:
            h = self._fresh.setdefault(int(req.priority), [])
            heapq.heappush(h, (until, next(self._fresh_seq), item))
            if len(h) > 2 * len(self._waiting) + 64:  # entries of requests gone hold their contexts: drop them
                h[:] = [e for e in h if e[2] in self._waiting]  # (an entry leaves the top only when _any_first asks,
                heapq.heapify(h)  # which it never does while slot waiters are kept, and never-expiring ones stay)

    def _any_first(self, band: int, now: float) -> bool:
        """Might a request waiting in ``band`` be served in the first pass at ``now``?  (False: surely none.)"""
        h = self._fresh.get(band)
        waiting = self._waiting
        while h:
            q = waiting.get(h[0][2])
            if q is not None and _first(q.req, now):
                return True
            heapq.heappop(h)  # it left the queue, or its budget ran out (for good: _first_until)
        return False

    def _shed(self, victim: Any, now: float) -> tuple[Any, Refuse]:
        q = self._waiting.pop(victim)
        self._kept.discard(id(victim))
        self._release(q, now)
        return victim, Refuse(503, "shed", "shed from the gateway queue for more important requests",
                              self.settings.no_replica_retry_after_s)

    def _release(self, q: _Queued, now: float) -> None:
        """A queued request leaves without being dispatched: its admission goes back, unless it ran before."""
        if not q.ran:
            self.admitter.release(q.admit, now)

    # ---- capacity freed ----------------------------------------------------------------
    def servable_models(self, snapshot: FleetSnapshot) -> set[str]:
        """Models waiting in the queue that have a routable, unsaturated replica."""
        out = set()
        for model in self.queue.waiting_models():
            idx = snapshot.candidates(model)
            if idx.size and not saturated(snapshot, idx, self.settings).all():
                out.add(model)
        return out

    def dispatch(self, snapshot_fn: Callable[[], FleetSnapshot], now: float,
                 limit: int = DISPATCH_BURST) -> list[tuple[Any, Dispatch | Refuse]]:
        """Pop queued requests that can run now (at most ``limit``), routing each on a fresh snapshot.

        The caller must start each returned dispatch (the fleet's accounting moves)
        before the next snapshot is taken; ``snapshot_fn`` is called once per pop.

        Order: the queue's (band, fair share, value, deadline, arrival), but inside the
        most important band waiting, the tenant whose turn it is (fair share) is served first
        the requests whose TTFT budget has time left (or that are protected, or that the
        policy made wait for a slot holding their prompt: ``Queue.keeps_place``); its requests
        whose budget ran out go when none of the former can use the capacity.  The tenants'
        shares hold either way: a scheduling audit found the first pass across tenants
        (fresh requests of any tenant before stale ones of the tenant whose turn it was) served
        a weight-2 tenant at 0.35x a weight-1 tenant's rate, its requests waiting up to 33 s.
        A request the policy holds back (``Queue``: no replica can
        meet its SLO now, see ``SchedulerSettings.hold_late``) keeps its place and is not
        asked again at this ``now``; one it refuses (its SLO can no longer be met, see
        ``shed_infeasible``) comes back as a :class:`Refuse`, its admission released.  At most
        ``DISPATCH_PICKS`` decisions are made per request dispatched, and the first pass
        looks at most at ``DISPATCH_FIRST_LOOKS`` entries.
        """
        out: list[tuple[Any, Dispatch | Refuse]] = []
        if self._held_at != now:
            self._held_at, self._held = now, set()
        held = self._held
        while len(out) < limit and len(self.queue):
            snap = snapshot_fn()
            models = self.servable_models(snap)
            if not models:
                break
            got = self._next(snap, models, now, held)
            if got is None:
                break
            item, decision = got
            self._kept.discard(id(item))
            q = self._waiting.pop(item)
            if isinstance(decision, Route):
                out.append((item, Dispatch(decision, q.admit)))
            else:
                self._release(q, now)
                out.append((item, _refusal(decision, self.settings)))
        return out

    def _next(self, snap: FleetSnapshot, models: set[str], now: float,
              held: set[int]) -> tuple[Any, Route | Reject] | None:
        """The next queued request to leave (popped) and the policy's decision for it, in :meth:`dispatch`'s
        order; requests the policy holds back join ``held`` and keep their place."""
        top = min((b for b, n in self.queue.counts().items() if n), default=None)
        picks = looks = 0
        decision: Route | Reject | None = None
        kept = self._kept
        waiters: dict[int, int] = {}  # a prompt's first block -> requests met so far that wait for its slots
        counted: set[int] = set()

        def serve(item: Any) -> bool | None:
            """Take ``item`` now?  :data:`STOP` once no later entry can be taken in this pop either (the walk
            ends: before, a pop out of decisions walked the whole queue, ~5 us an entry, at every dispatch pass
            of an overload)."""
            nonlocal picks, decision
            key = id(item)
            if picks >= DISPATCH_PICKS:
                return STOP
            if key in held:
                if key in kept and key not in counted:
                    counted.add(key)
                    req = self._waiting[item].req
                    if req.block_hashes:
                        waiters[req.block_hashes[0]] = waiters.get(req.block_hashes[0], 0) + 1
                return False
            req = self._waiting[item].req
            picks += 1
            first = req.block_hashes[0] if req.block_hashes else None
            ahead = waiters.get(first, 0) if first is not None else 0
            d = self.policy.pick(snap, replace(req, slot_waiters_ahead=ahead) if ahead else req)
            if isinstance(d, Queue):
                held.add(key)  # saturation moved, or held back for a replica that can meet its SLO
                if d.keeps_place:
                    kept.add(key)
                    counted.add(key)
                    if first is not None:
                        waiters[first] = ahead + 1
                else:
                    kept.discard(key)
                return False
            decision = d
            return True

        def fresh(item: Any) -> bool | None:
            """The first pass: asked first inside the tenant whose turn it is (its TTFT budget has time left, it is
            protected, or it waits for a slot holding its prompt); :data:`STOP` once DISPATCH_FIRST_LOOKS entries
            were looked at (the oldest, which a long overload makes stale, come first: this bounds the walk)."""
            nonlocal looks
            looks += 1
            if looks > DISPATCH_FIRST_LOOKS:
                return STOP
            req = self._waiting[item].req
            if req.priority != top:  # bands are walked in order: none after it is in the top band either
                return STOP
            return _first(req, now) or id(item) in kept

        # (with none that can be preferred, the first pass would look for nothing)
        prefer = fresh if kept or self._any_first(int(top), now) else None
        item = self.queue.pop(now, serve, models=models, prefer=prefer)
        return None if item is None else (item, decision)

    def expire(self, snapshot: FleetSnapshot, now: float) -> list[tuple[Any, Refuse]]:
        """Queued requests whose deadline passed or can no longer be met."""
        def feasible(item: Any, t: float) -> bool:
            q = self._waiting.get(item)
            return q is None or check_deadline(q.req.budget.deadline, _earliest_finish(snapshot, q.req, self.settings),
                                               t) is None

        out = []
        for item in self.queue.expire(now, feasible, EXPIRE_CHECKS):
            q = self._waiting.pop(item, None)
            self._kept.discard(id(item))
            if q is not None:
                self._release(q, now)
                if q.req.budget.deadline <= now:  # passed while it waited: the 504 the request path gives then
                    out.append((item, Refuse(504, "deadline_exceeded", "its deadline passed while it waited in "
                                             "the gateway queue", None)))
                    continue
                # Retry-After: a retry (with a fresh deadline) can succeed once the queue has drained (issue #5)
                out.append((item, Refuse(503, "deadline_infeasible", "its deadline can no longer be met", 1.0)))
        # its TTFT budget ran out while it waited: refused if the policy sheds (a prediction each: bounded per pass)
        for item in self._shed_watch.due(now, EXPIRE_CHECKS, self._waiting.__contains__):
            q = self._waiting.get(item)
            if q is not None and self._early is not None:
                asked = self._early(snapshot, q.req)
                if asked is not None:
                    self.abandon(item, now)
                    out.append((item, _refusal(asked, self.settings)))
                elif self._shed_watch.applies(q.req):  # no replica to predict over now (all ejected or down):
                    self._shed_watch.again(item, now + REASK_S)  # asked again, not left to its turn
        for model in self._orphaned(snapshot, now):
            gone = Refuse(503, "no_capacity", f"no replica of model {model!r} has been in rotation for "
                          f"{self.settings.queue_without_replica_s:g} s", self.settings.no_replica_retry_after_s)
            for item in [it for it, q in self._waiting.items() if q.req.model == model]:
                self.abandon(item, now)
                out.append((item, gone))
        return out

    def _orphaned(self, snapshot: FleetSnapshot, now: float) -> list[str]:
        """Models waited for whose replicas have all been out of rotation for ``queue_without_replica_s``."""
        since = self._no_replica
        waited = self.queue.waiting_models()
        out = []
        for model in list(since):
            if not waited.get(model):
                del since[model]
        for model, n in waited.items():
            if not n:
                continue
            if snapshot.candidates(model).size:
                since.pop(model, None)
            elif now - since.setdefault(model, now) >= self.settings.queue_without_replica_s:
                del since[model]
                out.append(model)
        return out

    # ---- endings -------------------------------------------------------------------------
    def abandon(self, item: Any, now: float) -> None:
        """A queued request's client went away (or the caller gave up on it)."""
        q = self._waiting.pop(item, None)
        self._kept.discard(id(item))
        if q is not None:
            self.queue.remove(item)
            self._release(q, now)

    def finish(self, admit: Admit, used_tokens: int, cost_usd: float, now: float) -> None:
        self.admitter.settle(admit, used_tokens=used_tokens, cost_usd=cost_usd, now=now)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def waiting_for(self, model: str) -> int:
        """Requests waiting in the gateway queue for ``model`` (brown-out is judged per model)."""
        return self.queue.waiting_for(model)
