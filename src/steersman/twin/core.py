"""The digital twin's event loop: the real control plane against simulated replicas on a virtual clock.

What runs unmodified from the live gateway: admission and rate limits
(``admission.admitter``, :class:`~steersman.control.DefaultAdmitter` by default), the gateway queue, the routing
policy on frozen :class:`~steersman.fleet.snapshot.FleetSnapshot`\\ s, the fleet's
accounting and prefix index (:class:`~steersman.control.accounting.Accounting`),
workflow tracking.  What is simulated: the engines (:mod:`steersman.sim` engine
model per replica), the network (zero latency), and the metrics scrape (engine
state copied into the fleet view at most every ``metrics_interval_s``, like the
live scraper).

Events, in time order (ties by insertion): arrivals pulled from the workload,
replica wake-ups (a step or decode run ended), closed-loop follow-ups from
workflows, queue expiry checks, and failure-drill steps.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from steersman.config import DEFAULTS, ReliabilitySettings
from steersman.control import GatewayQueue, TenantConfig, WorkflowTracker
from steersman.control.admission import make_admitter
from steersman.control.accounting import Accounting, Started
from steersman.control.plane import DISPATCH_BURST, ControlPlane, Dispatch, Refuse, Wait
from steersman.control.workflow import WorkflowHeaders, effective_priority
from steersman.engines.base import EngineMetrics
from steersman.fleet import snapshot as S
from steersman.fleet.state import Ticket
from steersman.policy.decode import make_decode_picker
from steersman.policy.request import LatencyBudget, PriorityClass, SchedRequest
from steersman.reliability import ReplicaGuard
from steersman.sim import SimRequest
from steersman.twin.clock import VirtualClock
from steersman.reliability.brownout_gate import BrownoutGate
from steersman.twin._brownout import TwinBrownout
from steersman.twin._deadlines import Deadlines
from steersman.twin._eviction import Eviction
from steersman.twin._events import (_ARRIVAL, _DEADLINE, _DELIVER, _DRILL, _EXPIRE, _KV, _PULL, _RETRY, _SCRAPE,
                                    _WAKE)
from steersman.twin._gctune import GcTuned
from steersman.twin.drill_actions import DrillActions
from steersman.twin._handoff import Handoff
from steersman.twin.fleet import TwinFleet
from steersman.twin.pd import Disaggregation
from steersman.twin.results import Recorder
from steersman.twin.retries import TwinRetries

if TYPE_CHECKING:
    from steersman.twin.workload import Arrival

__all__ = ["Twin", "TwinConfig"]

_PULL_WINDOW_S = 1.0  # open-loop arrivals are pulled from the workload one virtual second at a time


@dataclass(frozen=True, slots=True)
class TwinConfig:
    duration_s: float | None = None  # stop pulling arrivals after this (None: until the workload is done)
    drain: bool = True  # let requests in flight finish after the last arrival
    metrics_interval_s: float = DEFAULTS.gateway.metrics_interval_s  # the fleet file's gateway settings, as live
    unhealthy_after_failures: int = DEFAULTS.gateway.unhealthy_after_failures
    #: time from a request's arrival at the gateway to its arrival at the engine: the gateway's own
    #: added latency, measured by bench/overhead at one stream (+0.64-0.80 ms TTFT over loopback)
    gateway_latency_s: float = 0.0007
    seed: int = 0
    #: the gateway's reliability mechanisms (outlier ejection, breakers, adaptive concurrency, retries and
    #: stream continuation: :mod:`steersman.twin.retries`), on the virtual clock; None: off (a failed attempt
    #: fails its request; the twin's results before issue #5 stay as they were)
    reliability: ReliabilitySettings | None = None
    #: during the run, raise the GC thresholds (DEFAULTS.twin) and freeze the start-up heap; restored after
    tune_gc: bool = True


@dataclass(slots=True, eq=False)
class _Req:
    """One request's journey through the twin."""

    idx: int
    arrival: Arrival
    sched: SchedRequest
    tenant: TenantConfig
    started: Started | None = None
    sim: SimRequest | None = None
    pd: int = 0  # prefill/decode disaggregation: 0 colocated, 1 prefilling, 2 KV moving / decoding
    decode: int = -1  # its decode replica (``started`` accounts it there once its KV arrived: Accounting.handed_off)
    transfer: Ticket | None = None  # its ticket at the decode replica while its KV moves there
    cached: int = -1  # prompt tokens found in the prefill replica's prefix cache
    # retries (steersman.twin.retries): upstream attempts, replicas that failed it, budget token held,
    # begun in the retrier, tokens sent before its stream moved
    attempts: int = 0
    excluded: set = field(default_factory=set)
    holding: bool = False
    began: bool = False
    delivered: int = 0


class Twin(DrillActions, Handoff, Deadlines, TwinBrownout, Eviction):
    def __init__(self, fleet: TwinFleet, workload, policy, tenants: dict[str, TenantConfig] | None = None,
                 cfg: TwinConfig = TwinConfig(), progress: Callable[[float, int], None] | None = None) -> None:
        self.cfg = cfg
        self.clock = VirtualClock()
        self.tf = fleet
        self.fleet = fleet.build_state(self.clock, fleet.scheduler.kv_events and getattr(policy, "kv_events", False))
        if not getattr(policy, "prefix_residency", True):
            self.fleet.prefix_residency = False
        if cfg.reliability is not None:
            self.fleet.guard = ReplicaGuard(len(fleet.replicas), cfg.reliability, fleet.scheduler.latency_ewma_alpha)
            # the twin's engines emit no per-token events: the stall rule reads their last token off the model
            self.fleet.guard.outliers.last_output = self._last_output
            self.fleet.guard.on_eject = self._on_eject  # its attempts move, as live (steersman.twin._eviction)
        self.evicted = 0
        self.workload = workload
        admission = fleet.admission
        self.plane = ControlPlane(policy, make_admitter(admission), GatewayQueue(admission), fleet.scheduler)
        self.workflows = WorkflowTracker(admission)
        self._demotion = admission.workflow_missed_demotion
        self.accounting = Accounting(self.fleet, self.plane, self.workflows, fleet.scheduler, fleet.block_size)
        self.tenants = tenants or {}
        self.rec = Recorder(fleet)
        self.pd = Disaggregation(fleet) if fleet.disaggregated else None
        self.decode_picker = make_decode_picker(fleet.scheduler.decode_picker) if fleet.disaggregated else None
        self.retries = TwinRetries(self, cfg.reliability, cfg.seed + 1) if cfg.reliability is not None else None
        # brown-out, with the reliability mechanisms (the live gateway's stage: steersman.twin._brownout)
        self.brownout_gate = BrownoutGate(cfg.reliability, fleet.scheduler) if cfg.reliability is not None else None
        self.brownout_counts = {"moved": 0, "shed": 0}
        self.progress = progress
        self._heap: list = []
        self._seq = itertools.count()
        self._reqs: dict[str, _Req] = {}
        self._n = 0
        self._rng = random.Random(cfg.seed)
        self._scraped = [-math.inf] * len(fleet.replicas)
        self._scrape_due = [False] * len(fleet.replicas)  # a deferred read is scheduled
        self._expiring = False
        self._pulled_until = 0.0

    def _last_output(self, now: float):
        """Per replica, when its engine last produced a token by ``now`` (as the live gateway's
        ``Fleet.streamed`` keeps it from the events of its streams), for the replicas where a request of ours
        awaits a first token (the others' entries are stale: the stall rule ignores them)."""
        out = self.fleet.output_at
        reps = self.tf.replicas
        for i in np.flatnonzero(~np.isnan(self.fleet.live[S.STALLED_SINCE])).tolist():  # a request awaits there
            out[i] = reps[i].last_output(now)
        return out

    # ---- scheduling of events ------------------------------------------------------------
    def _push(self, t: float, kind: int, data) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, data))

    def schedule_drill(self, t: float, action: Callable[[Twin], None]) -> None:
        self._push(t, _DRILL, action)

    def _wake_at(self, t: float, i: int) -> None:
        """Replica ``i``'s run in progress ends at ``t`` (a later change of plan makes this wake stale)."""
        self._push(t, _WAKE, (i, self.tf.replicas[i].generation))

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> Recorder:
        if not self.cfg.tune_gc:
            return self._run()
        with GcTuned():
            return self._run()

    def _run(self) -> Recorder:
        for a in self.workload.start():
            self._push(a.time, _ARRIVAL, a)
        self._push(0.0, _PULL, None)
        heap, clock = self._heap, self.clock
        stop = self.cfg.duration_s
        drain = self.cfg.drain
        pop = heapq.heappop
        wake, arrive, deliver = self._wake, self._arrive, self._deliver  # bound once: the loop runs per event
        while heap:
            t, _, kind, data = pop(heap)
            if stop is not None and t > stop and (not drain or kind in (_ARRIVAL, _PULL)):
                if kind == _ARRIVAL and data.workflow is not None:
                    self.rec.cut_short.add(data.workflow)  # its task never completes: not a success
                continue
            clock.t = t
            if kind == _WAKE:
                wake(*data)
            elif kind == _ARRIVAL:
                arrive(data)
            elif kind == _DELIVER:
                deliver(data)
            elif kind == _PULL:
                self._pull(t)
            elif kind == _KV:
                self._kv_arrived(*data)
            elif kind == _RETRY:
                self._retry(data)
            elif kind == _EXPIRE:
                self._expire()
            elif kind == _DEADLINE:
                self._deadline(*data)
            elif kind == _SCRAPE:
                self._scrape_due[data] = False
                if not self.tf.replicas[data].dead:  # (a dead engine's scrapes fail: its last reading stays, as live)
                    self._scrape(data, force=True)
            else:
                data(self)
        self.rec.close(self.clock.t, self.fleet, stop)
        return self.rec

    def _pull(self, t: float) -> None:
        until = t + _PULL_WINDOW_S
        for a in self.workload.next_batch(until):
            self._push(a.time, _ARRIVAL, a)
        if not self.workload.done:
            self._push(until, _PULL, None)
        if self.progress is not None:
            self.progress(t, self._n)

    # ---- arrivals ------------------------------------------------------------------------
    def _tenant(self, name: str) -> TenantConfig:
        t = self.tenants.get(name)
        if t is None:
            # a tenant the fleet file and the workload do not list: the fleet's default class, as the gateway gives it
            t = self.tenants[name] = TenantConfig(name, PriorityClass.parse(self.tf.admission.default_priority))
        return t

    def _arrive(self, a: Arrival) -> None:
        now = self.clock.t
        tenant = self._tenant(a.tenant)
        slo = self.tf.scheduler.slo_classes.get(a.slo_class or self.tf.scheduler.default_slo)
        budget = LatencyBudget(slo.ttft_s if slo else None, slo.tpot_s if slo else None,
                               now + a.deadline_s if a.deadline_s is not None else None, a.slo_class)
        wf = None
        if a.workflow is not None:
            # a view only: the entry is made once admitted (as the gateway's Schedule stage), not for a refusal
            wf = self.workflows.peek(tenant.name, WorkflowHeaders(a.workflow, a.step, a.steps), now)
        expected = self.accounting.expected_output(a.model, tenant.name, a.max_tokens)
        self._n += 1
        sched = SchedRequest(seq=self._n, model=a.model, kind="chat", stream=True, tenant=tenant.name,
                             priority=effective_priority(tenant.priority, wf, self._demotion), arrival=now,
                             prompt_tokens=a.prompt_tokens,
                             block_hashes=a.block_hashes, max_tokens=a.max_tokens, expected_output=expected,
                             budget=budget, workflow=wf)
        r = _Req(self._n, a, sched, tenant)
        self.rec.arrived(r.idx, a, sched)
        if not self._brownout(r):
            return
        sched = r.sched  # (moved to a cheaper model by brown-out)
        out, shed = self.plane.arrive(r, sched, tenant, self.fleet.snapshot(), now)
        for victim, refusal in shed:
            self._refused(victim, refusal)
        if wf is not None and not isinstance(out, Refuse):
            self.workflows.admitted(tenant.name, wf.workflow_id, wf.steps, now)
        if isinstance(out, Dispatch):
            self._dispatch(r, out)
        elif isinstance(out, Refuse):
            self._refused(r, out)
        elif isinstance(out, Wait) and not self._expiring:
            self._expiring = True
            self._push(now + self.cfg.metrics_interval_s, _EXPIRE, None)  # as the gateway: at the scrape cadence

    def _refused(self, r: _Req, refusal: Refuse) -> None:
        if r.started is not None:  # a retry refused from the queue: its failed attempt is settled now
            self.accounting.ended(r.started, 0, False)
            if self.retries is not None:
                self.retries.ended(r, None)
        self.rec.refused(r.idx, self.clock.t, refusal.status)
        self._follow_up(r, ok=False)

    def _dispatch(self, r: _Req, d: Dispatch) -> None:
        now = self.clock.t
        r.started = self.accounting.dispatched(r.sched, d, earlier=r.started)  # a retry carries its failed attempt
        i = r.started.replica
        rep = self.tf.replicas[i]
        if self.retries is not None and not self.retries.attempt(r):  # the adaptive throttle refused it
            self.accounting.ended(r.started, 0, False)
            self.retries.ended(r, None)
            self.rec.refused(r.idx, now, 503)  # refused by the gateway: sent to no replica
            self._follow_up(r, ok=False)
            return
        self.rec.dispatched(r.idx, now, i, d.route.slo_prediction)
        self.rec.attempted(i)
        if rep.dead or (rep.error_rate and self._rng.random() < rep.error_rate):
            self._failed(r)  # the engine refused or the connection failed: a 502 at the gateway
            if rep.dead:
                self.fleet.set_healthy(i, False, active=False)  # passive detection, as the live gateway on connect failure
            return
        if self.cfg.gateway_latency_s > 0:
            self._push(now + self.cfg.gateway_latency_s, _DELIVER, r)
        else:
            self._deliver(r)

    def _deliver(self, r: _Req) -> None:
        """The request reaches its engine."""
        now = self.clock.t
        i = r.started.replica
        rep = self.tf.replicas[i]
        if rep.dead:
            self._failed(r)
            return
        a = r.arrival
        rid = str(r.idx)
        prefill = self.pd is not None and self.pd.is_prefill(i)  # prefill only: its first token, then KV moves
        r.pd = 1 if prefill else 0
        sent = r.delivered  # a continued stream: the prompt plus what was sent is prefilled, the rest generated
        r.sim = SimRequest(req_id=rid, prompt_len=max(a.prompt_tokens, 1) + sent,
                           max_output=1 if prefill else max(a.output_tokens - sent, 1),
                           block_hashes=a.block_hashes, priority=r.started.engine_priority, arrival=now)
        if not self._watch_deadline(r):
            return
        self._reqs[rid] = r
        try:
            wake = rep.submit(r.sim, now)
        except ValueError:  # can never run there (context too long for the replica): an answer, not retried
            del self._reqs[rid]
            self._failed(r, retryable=False)
            if rep.wake_at is not None:  # submit may have cut a decode run first: its new end must still wake it
                self._push(rep.wake_at, _WAKE, (i, rep.generation))  # (a duplicate of a live wake is dropped as stale)
            return
        if wake is not None:
            self._push(wake, _WAKE, (i, rep.generation))

    # ---- replica events -------------------------------------------------------------------
    def _wake(self, i: int, generation: int) -> None:
        rep = self.tf.replicas[i]
        if generation != rep.generation or rep.wake_at != self.clock.t:
            return  # stale: the replica died or its run was cut
        res, nxt = rep.wake(self.clock.t)
        self.rec.replica_time(i, res.busy_s, res.compute_bound_s)
        for rid in res.first_tokens:
            r = self._reqs.get(rid)
            if r is not None and r.started is not None and not r.pd:
                self.accounting.first_token(r.started)
                if not r.delivered or self.rec.lacks_first(r.idx):  # a continued stream's client saw its
                    # first token long ago (none recorded: it never did, NaN would poison the TTFT percentiles)
                    self.rec.first_token(r.idx, self.clock.t)
        for rid in res.finished:
            r = self._reqs.pop(rid, None)
            if r is not None:
                if r.pd == 1:
                    self._handoff(r, i)
                else:
                    self._finished(r)
        if nxt is not None:
            self._push(nxt, _WAKE, (i, rep.generation))
        self._scrape(i)
        if (res.finished or res.first_tokens) and self.plane.waiting:  # a request ended, or a prefill did:
            # capacity freed (late work held in the gateway waits for the prefill queued ahead to drain)
            self._dispatch_queued()

    def _scrape(self, i: int, force: bool = False) -> None:
        """Read replica ``i``'s engine state into the fleet, at most once a scrape interval; a change within the
        interval is read at its end (the live scraper reads every interval: an engine that went idle just after
        a read was otherwise seen busy until it next changed)."""
        now = self.clock.t
        if not force and now - self._scraped[i] < self.cfg.metrics_interval_s:
            if not self._scrape_due[i]:
                self._scrape_due[i] = True
                self._push(self._scraped[i] + self.cfg.metrics_interval_s, _SCRAPE, i)
            return
        self._scraped[i] = now
        s = self.tf.replicas[i].engine.state(now)  # as live: waiting as of the running step's schedule
        self.fleet.update_metrics(i, EngineMetrics(s.num_running, s.num_waiting, s.kv_usage, s.prefix_queries,
                                                   s.prefix_hits, s.weights.value, s.kv_blocks_total))

    def _finished(self, r: _Req) -> None:
        sim = r.sim
        cached = max(sim.num_cached_tokens, 0) if r.cached < 0 else r.cached
        self.fleet.report(r.started.ticket, True)  # the attempt's verdict on its replica (reliability guard)
        # a handed-off request's prefix hit was the prefill replica's, learnt at the hand-off
        cost = self.accounting.ended(r.started, sim.num_output, True, cached if r.decode < 0 else None)
        if self.retries is not None:
            self.retries.ended(r, True)
        self.rec.finished(r.idx, self.clock.t, r.delivered + sim.num_output, cached, cost)
        self._follow_up(r, ok=True)

    def _failed(self, r: _Req, continue_only: bool = False, retryable: bool = True, evicted: bool = False) -> None:
        """An attempt failed (``continue_only``: after its stream began; ``evicted``: the gateway abandoned it on
        an ejected replica, no verdict on that replica).  With the reliability mechanisms on, the request is
        retried or continued as live (:mod:`steersman.twin.retries`); else it fails."""
        if r.started is not None:  # after a hand-off, its ticket is at the decode replica: the failure is its
            if not evicted:
                self.fleet.report(r.started.ticket, False)
            self.rec.attempt_failed(r.started.replica)
            if self.retries is not None and retryable and self.pd is None:
                delay = self.retries.failed(r, continue_only, evicted)  # counts the attempt's end
                if delay is None:
                    self._fail(r)
                else:
                    self._push(self.clock.t + delay, _RETRY, r)
                return
        self._fail(r, served=False if r.started is not None else None)

    def _fail(self, r: _Req, served: bool | None = None, output_tokens: int = 0) -> None:
        """The request fails (``served``: the verdict of an attempt whose end is not counted yet; ``output_tokens``:
        what its last attempt generated, paid for)."""
        cost = self.accounting.ended(r.started, output_tokens, False) if r.started is not None else 0.0
        if self.retries is not None:
            self.retries.ended(r, served)
        self.rec.failed(r.idx, self.clock.t, cost)
        self._follow_up(r, ok=False)

    def _retry(self, r: _Req) -> None:
        """Route a failed request again (:meth:`TwinRetries.reroute`) and send it, or let it wait in the queue."""
        got = self.retries.reroute(r)
        if got is None:
            self._fail(r)
        elif isinstance(got, Dispatch):
            self._dispatch(r, got)
        elif isinstance(got, Refuse):
            self._refused(r, got)
        elif not self._expiring:  # waits in the queue: its expiry is checked, capacity that frees dispatches it
            self._expiring = True
            self._push(self.clock.t + self.cfg.metrics_interval_s, _EXPIRE, None)

    def _follow_up(self, r: _Req, ok: bool) -> None:
        for a in self.workload.on_complete(r.arrival, self.clock.t, ok):
            self._push(max(a.time, self.clock.t), _ARRIVAL, a)

    # ---- the queue -----------------------------------------------------------------------
    def _dispatch_queued(self) -> None:
        # one at a time, as the live gateway (api/lifecycle.py): each dispatch's accounting must be in the next
        # decision's snapshot (a batch of 64 routed on one state all went to the replica best at its start)
        for _ in range(DISPATCH_BURST):
            out = self.plane.dispatch(self.fleet.snapshot, self.clock.t, limit=1)
            if not out:
                return
            for r, d in out:
                if isinstance(d, Refuse):
                    self._refused(r, d)
                else:
                    self._dispatch(r, d)

    def _expire(self) -> None:
        for r, refusal in self.plane.expire(self.fleet.snapshot(), self.clock.t):
            self._refused(r, refusal)
        self._dispatch_queued()
        if self.plane.waiting:
            self._push(self.clock.t + self.cfg.metrics_interval_s, _EXPIRE, None)
        else:
            self._expiring = False
