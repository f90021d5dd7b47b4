"""What happens to the fleet's books when a request is dispatched and when it ends.

Pure and synchronous, shared by the live gateway and the digital twin: the
replica's accounting (in flight, prefill queued, KV blocks, observed latencies),
the prefix index learning where prompts now live, tokens and spend settled with
admission, the workflow's sunk cost, the running estimate of output length, and
what the engine reported about its cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from steersman.config import SchedulerSettings
from steersman.control.admission import Admit
from steersman.control.output_estimate import OutputEstimate
from steersman.control.plane import ControlPlane, Dispatch
from steersman.control.workflow import WorkflowTracker
from steersman.fleet.state import Fleet, Ticket
from steersman.policy.base import Route
from steersman.policy.request import SchedRequest

__all__ = ["Started", "Accounting", "engine_priority"]


@dataclass(slots=True)
class Started:
    """A dispatched request's bookkeeping, returned by :meth:`Accounting.dispatched`."""

    req: SchedRequest
    replica: int
    ticket: Ticket | None  # None once it left its replica (:meth:`Accounting.left`) and waits for the next one
    admit: Admit
    uncached: int  # prompt tokens the replica is predicted to prefill
    predicted_hit_blocks: int  # prompt blocks the prefix index expected reused there (PrefixIndex.reusable)
    engine_priority: int = 0  # for engines with priority scheduling (lower first): see engine_priority()
    earlier_cost: float = 0.0  # $ of the replicas it left (a prefill replica after the hand-off, failed attempts)
    client_first_at: float | None = None  # its client's first token, from a replica it left (a stream continued)

    def first_seen(self, t: Ticket | None) -> float | None:
        """When its client saw its first token: from a replica it left, else on ``t`` (its current ticket)."""
        if self.client_first_at is not None:
            return self.client_first_at
        return t.first_at if t is not None else None


class Accounting:
    def __init__(self, fleet: Fleet, plane: ControlPlane, workflows: WorkflowTracker, settings: SchedulerSettings,
                 block_size: int) -> None:
        self.fleet = fleet
        self.plane = plane
        self.workflows = workflows
        self.settings = settings
        self.block_size = block_size
        self.outputs = OutputEstimate(settings.latency_ewma_alpha, settings.initial_output_estimate)

    def expected_output(self, model: str, tenant: str | None = None, max_tokens: int | None = None) -> int:
        """Output tokens to expect: the running mean per (model, tenant), capped by ``max_tokens``."""
        return self.outputs.expected(model, tenant, max_tokens)

    def dispatched(self, req: SchedRequest, d: Dispatch, defer_record: bool = False,
                   earlier: Started | None = None) -> Started:
        """The request goes to ``d.route.replica``: account it there now (before the next decision).

        ``defer_record``: the prefix index learns the prompt's blocks at its next access or ``flush()``
        (:meth:`PrefixIndex.record_later`), whichever is first; every later decision sees them either way.
        ``earlier``: the record of the attempt it left (:meth:`left`), whose cost it carries."""
        route = d.route
        i = route.replica
        fleet = self.fleet
        hashes = req.block_hashes
        bs = self.block_size
        # what the engine would reuse there (the policy's ``prefix_held``): at most (prompt - 1) // bs blocks
        held = int(fleet.prefix.reusable(hashes, req.prompt_tokens, bs)[i]) if fleet.prefix is not None and hashes else 0
        uncached = req.prompt_tokens - min(held * bs, max(req.prompt_tokens - 1, 0))
        ticket = fleet.begin(i, uncached, self._blocks(req), route.predicted_ttft_s, route.predicted_tpot_s, req.stream,
                             route.tpot_target_s, req.prompt_tokens)
        fleet.expect_first_token(ticket, route.expected_ttft_s)  # NaN (a policy that does not predict): nothing
        if not req.stream:
            fleet.expect_answer(ticket, route.expected_e2e_s)
        if fleet.caches_after_prefill[i]:  # llama.cpp: the request takes a slot; the prompt is reusable once it is free
            e2e = route.expected_e2e_s
            due = ticket.started + e2e if e2e == e2e else math.inf
            fleet.take_slot(ticket, hashes, due, e2e - route.expected_ttft_s)
        if fleet.prefix is not None and hashes:
            if fleet.caches_after_prefill[i]:
                ticket.cache_at_end = hashes  # not reusable there until it has run and its slot is free
            elif fleet.prefix.expect(i, ticket.key, hashes):
                pass  # its engine's KV events say when it is cached; credited there until its first token
            elif defer_record:
                fleet.prefix.record_later(i, hashes)
            else:
                fleet.prefix.record(i, hashes)
        return Started(req, i, ticket, d.admit, uncached, held, engine_priority(req, route, self.settings),
                       *((earlier.earlier_cost, earlier.client_first_at) if earlier is not None else ()))

    def left(self, s: Started) -> Started:
        """The request leaves the attempt's replica before its end (a failed attempt retried or continued
        elsewhere): its accounting there ends now, and the $ of the replica time it used is carried
        (``earlier_cost``), so the request's cost (its tenant's budget, its workflow's spend) counts the failed work
        too (issue #4: retries and failed work count as cost).  The record returned holds no ticket:
        :meth:`dispatched` (``earlier``) carries it into the next attempt, :meth:`ended` settles it if none
        comes.  Ending it at once, not when the next attempt starts, also keeps a retry that waits in the gateway
        queue from counting as in flight on the replica that failed it.  A stream's first token relayed from there
        stays its client's first token (``client_first_at``: its SLO is judged as its client saw it)."""
        t = s.ticket
        if t is None:
            return s
        first = s.first_seen(t)
        return replace(s, ticket=None, earlier_cost=s.earlier_cost + self.fleet.end(t, 0), client_first_at=first)

    def first_token(self, s: Started) -> None:
        self.fleet.first_token(s.ticket)

    def _blocks(self, req: SchedRequest) -> int:
        """KV blocks the request will hold: its prompt and the output expected of each of its samples."""
        return math.ceil(req.kv_tokens / self.block_size)

    def decode_ticket(self, s: Started, replica: int) -> Ticket:
        """Prefill/decode disaggregation: the request's KV starts moving to decode replica ``replica``, which
        counts it from now on (its blocks, nothing to prefill; not streamed: the transfer before its first
        token there is no stall).  :meth:`handed_off` takes the ticket over once the KV arrived."""
        return self.fleet.begin(replica, 0, self._blocks(s.req), streamed=False)

    def handed_off(self, s: Started, ticket: Ticket, cached_tokens: int) -> Started:
        """Prefill/decode disaggregation: the request's KV reached its decode replica, where ``ticket``
        (:meth:`decode_ticket`) carries it from now on.  Its first token reaches the client now: the prefill replica's part ends here, as a served
        attempt whose TTFT (the transfer included, as the client sees it) and prefix hit (``cached_tokens``
        of its prompt) that replica learns from; the decode replica starts decoding it."""
        fleet = self.fleet
        t = s.ticket
        fleet.first_token(t)
        fleet.report(t, True)
        cost = fleet.end(t, 1)
        fleet.observe_prefix(t.replica, s.predicted_hit_blocks, cached_tokens // self.block_size)
        fleet.first_token(ticket)
        first = s.first_seen(t)
        return Started(s.req, ticket.replica, ticket, s.admit, 0, 0, s.engine_priority, s.earlier_cost + cost, first)

    def withdrawn(self, s: Started) -> None:
        """The try was not its client's call (a Responses try refused for its context's length, sent again
        shorter): its replica accounting ends and its admission goes back (its rate limits' request and tokens).
        Nothing is recorded: the tenant's spend, the workflow and the output estimate count the try whose answer
        the client gets, once (a refusal before any prefill cost next to nothing)."""
        if s.ticket is not None:
            self.fleet.end(s.ticket, 0)
        self.plane.admitter.release(s.admit, self.fleet.clock.now())

    def ended(self, s: Started, output_tokens: int, ok: bool, cached_tokens: int | None = None,
              leg_tokens: int | None = None) -> float:
        """Settle the request once; returns the $ it cost (its share of the replica's GPU time).  ``ok``: served
        whole; ``leg_tokens``: of ``output_tokens``, those its ticket's replica made (a stream continued there)."""
        now = self.fleet.clock.now()
        t = s.ticket
        cost = s.earlier_cost
        req = s.req
        # ``n`` samples decode side by side: one sample's tokens make the TPOT and the output length to learn
        per_sample = output_tokens // req.samples if req.samples > 1 else output_tokens
        if t is not None:
            leg = per_sample if leg_tokens is None else leg_tokens // req.samples if req.samples > 1 else leg_tokens
            cost += self.fleet.end(t, leg, req.stream)  # (its TPOT: the tokens it made since its own first)
        self.plane.finish(s.admit, req.prompt_tokens + output_tokens, cost, now)
        if req.workflow is not None:
            first = s.first_seen(t)
            self.workflows.record(req.tenant, req.workflow.workflow_id, tokens=req.prompt_tokens + output_tokens,
                                  cost_usd=cost, now=now, met=ok and _met(req, first, per_sample, now))
        if ok and per_sample:
            self.outputs.observe(req.model, req.tenant, per_sample)
        if cached_tokens is not None and t is not None:
            self.fleet.observe_prefix(t.replica, s.predicted_hit_blocks, cached_tokens // self.block_size)
        return cost


def _met(req: SchedRequest, first: float | None, per_sample: int, now: float) -> bool:
    """A served request's SLO as its client saw it: first token (``first``: its client's, on whichever replica)
    within the TTFT target (from its arrival at the gateway), the tokens after it within the TPOT target, the end
    by its deadline.  A whole response (not streamed) shows its client only its end: judged against its deadline
    when it has one, else against the time its tokens were allowed (TTFT + TPOT per token after the first)."""
    b = req.budget
    if b.deadline is not None and now > b.deadline:
        return False
    if not req.stream:
        if b.deadline is not None or b.ttft_s is None:
            return True
        if per_sample <= 1:
            return now - req.arrival <= b.ttft_s
        return b.tpot_s is None or now - req.arrival <= b.ttft_s + (per_sample - 1) * b.tpot_s
    if first is None:
        return b.ttft_s is None and b.tpot_s is None
    if b.ttft_s is not None and first - req.arrival > b.ttft_s:
        return False
    return b.tpot_s is None or per_sample <= 1 or (now - first) / (per_sample - 1) <= b.tpot_s


def engine_priority(req: SchedRequest, route: Route, settings: SchedulerSettings) -> int:
    """The ``priority`` an engine with priority scheduling (vLLM ``--scheduling-policy priority``: lower first,
    then arrival) gets for this request: its band (critical 0, standard 1, sheddable 2, batch 3) x 2, plus 1 when
    no replica was predicted to meet its SLO and ``settings.demote_late``: inside its band, the engine serves the
    requests that can still meet their SLO before the late ones, never a lower band's before a higher one's."""
    return 2 * int(req.priority) + (1 if route.late and settings.demote_late else 0)
