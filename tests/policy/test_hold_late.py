"""Holding back late work (``scheduler.hold_late``, on by default): an unprotected request that no replica is predicted
to serve within its TTFT now, but one could once the prefill queued ahead of it has drained, waits in the gateway
queue, unless a replica holds most of its prompt (its place is in that replica's queue); the queue serves first
the requests whose TTFT budget has time left.  Fused and plugin paths alike."""

from dataclasses import replace

import pytest

from steersman.config import DEFAULTS
from steersman.config.admission import AdmissionSettings
from steersman.control import DefaultAdmitter, GatewayQueue, TenantConfig
from steersman.control.plane import ControlPlane, Dispatch, Wait
from steersman.policy import Queue, Route, make_policy
from steersman.policy.request import LatencyBudget, PriorityClass
from steersman.testing.snapshots import chain, fleet_snapshot, prefix_index, sched_request

STANDARD = LatencyBudget(ttft_s=2.0, tpot_s=0.2)
HOLD = DEFAULTS.scheduler
OFF = replace(DEFAULTS.scheduler, hold_late=False)
#: both replicas have ~150k prompt tokens queued for prefill in three long prompts (several seconds of work on an H100;
#: the first admitted, two waiting: under the saturation depth)
BACKLOG = dict(pending_prefill=[150_000, 150_000], in_flight=[20, 20], running=[20, 20], decoding=[17, 17])


def _plane(settings=DEFAULTS.scheduler) -> ControlPlane:
    s = AdmissionSettings()
    return ControlPlane(make_policy("steersman", settings), DefaultAdmitter(s), GatewayQueue(s))


def _policy(fused, settings=HOLD):
    p = make_policy("steersman", settings)
    if not fused:
        p._fast = None
    return p


@pytest.mark.parametrize("fused", [True, False])
def test_a_request_the_backlog_would_make_late_waits_for_a_replica_that_can_serve_it(fused):
    policy = _policy(fused)
    snap = fleet_snapshot(2, time=10.0, **BACKLOG)
    short = sched_request(1, prompt_tokens=500, expected_output=50, budget=STANDARD, arrival=10.0)
    d = policy.pick(snap, short)
    assert isinstance(d, Queue) and "waits in the gateway" in d.reason and "2.00 s left" in d.reason
    # its budget spent in the queue: it goes where it finishes soonest, marked late (engines serve it last)
    stale = policy.pick(snap, replace(short, arrival=7.5))
    assert isinstance(stale, Route) and stale.late
    # a critical request, or one of a workflow with sunk cost, is never held back
    crit = policy.pick(snap, replace(short, priority=PriorityClass.CRITICAL))
    assert isinstance(crit, Route) and crit.late
    # nor a prompt too long to meet its TTFT even once the queue ahead has drained, nor a stream under way
    huge = policy.pick(snap, sched_request(2, prompt_tokens=120_000, expected_output=50, budget=STANDARD,
                                           arrival=10.0))
    assert isinstance(huge, Route) and huge.late
    assert isinstance(policy.pick(snap, replace(short, resumed=True)), Route)
    # an idle replica meets it: routed at once, not late
    idle = fleet_snapshot(2, time=10.0, pending_prefill=[150_000, 0], in_flight=[20, 0], running=[20, 0])
    ok = policy.pick(idle, short)
    assert isinstance(ok, Route) and ok.replica == 1 and not ok.late
    # off: routed late at once
    assert DEFAULTS.scheduler.hold_late
    assert isinstance(_policy(fused, OFF).pick(snap, short), Route)


@pytest.mark.parametrize("fused", [True, False])
def test_a_request_whose_prompt_a_replica_holds_joins_that_replicas_queue_rather_than_wait(fused):
    """The holder's queue is its place: held in the gateway it would go wherever capacity frees first and compute
    its prompt again.  A prompt held below exploit_share is no such tie: held back as any other."""
    policy = _policy(fused)
    hashes = chain("tenant-prompt", 64)  # 1,024 tokens
    for share, held_back in ((1.0, False), (0.25, True)):
        index = prefix_index(2, {0: hashes[: int(64 * share)]})
        snap = fleet_snapshot(2, time=10.0, prefix=index, **BACKLOG)
        req = sched_request(1, hashes=hashes, expected_output=50, budget=STANDARD, arrival=10.0)
        d = policy.pick(snap, req)
        if held_back:
            assert isinstance(d, Queue), d
        else:
            assert isinstance(d, Route) and d.replica == 0 and d.late, d


def test_the_queue_serves_requests_with_time_left_first_and_held_ones_keep_their_place():
    p = _plane(HOLD)
    t = TenantConfig("t", PriorityClass.STANDARD)
    full = fleet_snapshot(2, waiting=[DEFAULTS.scheduler.saturation_queue_depth + 1] * 2, time=0.0)
    old = sched_request(1, prompt_tokens=500, expected_output=50, budget=STANDARD, arrival=0.0)
    assert isinstance(p.arrive("old", old, t, full, 0.0)[0], Wait)
    new = sched_request(2, prompt_tokens=500, expected_output=50, budget=STANDARD, arrival=2.5)
    assert isinstance(p.arrive("new", new, t, full, 2.5)[0], Wait)
    free = fleet_snapshot(2, time=3.0)
    # at 3 s "old" has spent its 2 s TTFT budget, "new" has 1.5 s left: "new" goes first although it came later
    first = p.dispatch(lambda: free, 3.0, limit=1)
    assert [item for item, _ in first] == ["new"] and isinstance(first[0][1], Dispatch)
    second = p.dispatch(lambda: free, 3.0, limit=1)
    assert [item for item, _ in second] == ["old"] and p.waiting == 0
    # a request held back keeps its place and is not asked again in the same pass
    backlog = fleet_snapshot(2, time=10.0, **BACKLOG)
    a = sched_request(3, prompt_tokens=500, expected_output=50, budget=STANDARD, arrival=10.0)
    assert isinstance(p.arrive("a", a, t, backlog, 10.0)[0], Wait)  # held: the backlog would make it late
    assert p.dispatch(lambda: backlog, 10.1) == [] and p.waiting == 1
    got = p.dispatch(lambda: fleet_snapshot(2, time=10.2), 10.2)
    assert [item for item, _ in got] == ["a"] and not got[0][1].route.late


def test_time_left_never_lets_a_lower_band_pass_a_higher_one():
    """A stale standard request (its TTFT budget spent) still goes before a fresh sheddable one: the preference
    for requests with time left applies inside the most important band waiting."""
    p = _plane()
    full = fleet_snapshot(2, waiting=[DEFAULTS.scheduler.saturation_queue_depth + 1] * 2, time=0.0)
    stale = sched_request(1, prompt_tokens=500, expected_output=50, budget=STANDARD, arrival=0.0)
    assert isinstance(p.arrive("stale", stale, TenantConfig("t", PriorityClass.STANDARD), full, 0.0)[0], Wait)
    fresh = sched_request(2, prompt_tokens=500, expected_output=50, budget=STANDARD, arrival=2.9,
                          priority=PriorityClass.SHEDDABLE, tenant="s")
    assert isinstance(p.arrive("fresh", fresh, TenantConfig("s", PriorityClass.SHEDDABLE), full, 2.9)[0], Wait)
    free = fleet_snapshot(2, time=3.0)
    assert [item for item, _ in p.dispatch(lambda: free, 3.0, limit=1)] == ["stale"]
    assert [item for item, _ in p.dispatch(lambda: free, 3.0, limit=1)] == ["fresh"]


def test_the_first_pass_looks_at_a_bounded_number_of_entries():
    """Behind more stale entries than DISPATCH_FIRST_LOOKS, a fresh request is not searched for: the queue's own
    order (oldest first) takes over, so a long overload does not make every pop walk the whole queue."""
    from steersman.control.plane import DISPATCH_FIRST_LOOKS

    p = _plane()
    t = TenantConfig("t", PriorityClass.STANDARD)
    full = fleet_snapshot(2, waiting=[DEFAULTS.scheduler.saturation_queue_depth + 1] * 2, time=0.0)
    for k in range(DISPATCH_FIRST_LOOKS + 1):
        req = sched_request(k, prompt_tokens=100, expected_output=10, budget=STANDARD, arrival=0.0)
        assert isinstance(p.arrive(f"stale{k}", req, t, full, 0.0)[0], Wait)
    fresh = sched_request(9999, prompt_tokens=100, expected_output=10, budget=STANDARD, arrival=2.9)
    assert isinstance(p.arrive("fresh", fresh, t, full, 2.9)[0], Wait)
    free = fleet_snapshot(2, time=3.0)
    assert [item for item, _ in p.dispatch(lambda: free, 3.0, limit=1)] == ["stale0"]


@pytest.mark.parametrize("fused", [True, False])
def test_the_time_a_request_waited_is_spent_from_its_ttft_budget(fused):
    """The TTFT budget is the client's, from its arrival: a request released from the gateway queue 1.99 s after it
    came is judged on the 0.01 s it has left (late, where it finishes soonest), not on the whole 2 s; a stream
    under way keeps its target (its first token was sent long ago)."""
    policy = _policy(fused)
    # replica 0 has ~0.5 s of prefill queued; replica 1 is idle (~0.02 s)
    snap = fleet_snapshot(2, time=10.0, pending_prefill=[20_000, 0], in_flight=[2, 0], running=[2, 0])
    fresh = sched_request(1, prompt_tokens=500, expected_output=50, budget=STANDARD, arrival=10.0)
    d = policy.pick(snap, fresh)
    assert isinstance(d, Route) and not d.late
    waited = policy.pick(snap, replace(fresh, arrival=8.01))
    assert isinstance(waited, Route) and waited.late and waited.replica == 1, waited
    resumed = policy.pick(snap, replace(fresh, arrival=0.0, resumed=True))
    assert isinstance(resumed, Route) and not resumed.late
