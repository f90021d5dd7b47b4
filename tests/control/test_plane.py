"""The control plane's decision core, pure: admission + scheduling + queue, driven with plain floats."""

from dataclasses import replace

import pytest

from steersman.config import DEFAULTS
from steersman.config.admission import AdmissionSettings
from steersman.control import DefaultAdmitter, GatewayQueue, TenantConfig
from steersman.control.deadlines import alone, earliest_finish
from steersman.control.plane import DISPATCH_PICKS, ControlPlane, Dispatch, Refuse, Wait
from steersman.policy.base import Queue
from steersman.policy import make_policy
from steersman.policy.request import LatencyBudget, PriorityClass
from steersman.testing.snapshots import fleet_snapshot, sched_request

DEPTH = DEFAULTS.scheduler.saturation_queue_depth
FREE = fleet_snapshot(2)
FULL = fleet_snapshot(2, waiting=[DEPTH + 1, DEPTH + 1])  # saturated: more than the depth waits


def plane(max_entries=1024, scheduler=DEFAULTS.scheduler, **tenant):
    s = AdmissionSettings(queue_max_entries=max_entries)
    return (ControlPlane(make_policy("steersman", scheduler), DefaultAdmitter(s), GatewayQueue(s), scheduler),
            TenantConfig("t", PriorityClass.STANDARD, **tenant))


def _alone(snap, req, settings=DEFAULTS.scheduler):
    return alone(snap, req, settings)


def _earliest_finish(snap, req, settings=DEFAULTS.scheduler):
    return earliest_finish(snap, req, settings)


def test_dispatch_now_when_there_is_room():
    p, t = plane()
    out, shed = p.arrive("a", sched_request(), t, FREE, 0.0)
    assert isinstance(out, Dispatch) and out.route.replica in (0, 1) and not shed


def test_queue_then_dispatch_when_capacity_frees():
    p, t = plane()
    out, _ = p.arrive("a", sched_request(), t, FULL, 0.0)
    assert isinstance(out, Wait) and p.waiting == 1
    assert p.dispatch(lambda: FULL, 0.1) == []
    got = p.dispatch(lambda: FREE, 0.2)
    assert [item for item, _ in got] == ["a"] and isinstance(got[0][1], Dispatch) and p.waiting == 0


def test_rate_limit_refuses_with_retry_after_and_release_gives_it_back():
    p, t = plane(requests_per_minute=1)
    out, _ = p.arrive("a", sched_request(), t, FULL, 0.0)
    assert isinstance(out, Wait)
    out2, _ = p.arrive("b", sched_request(seq=1), t, FREE, 0.0)
    assert isinstance(out2, Refuse) and out2.status == 429 and out2.retry_after > 0
    p.abandon("a", 0.5)  # never ran: its slot comes back
    out3, _ = p.arrive("c", sched_request(seq=2), t, FREE, 0.5)
    assert isinstance(out3, Dispatch)


def test_full_queue_sheds_the_least_important():
    p, t = plane(max_entries=1)
    crit = TenantConfig("c", PriorityClass.CRITICAL)
    batch = TenantConfig("b", PriorityClass.BATCH)
    assert isinstance(p.arrive("low", sched_request(priority=PriorityClass.BATCH, tenant="b"), batch, FULL, 0.0)[0], Wait)
    out, shed = p.arrive("high", sched_request(seq=1, priority=PriorityClass.CRITICAL, tenant="c"), crit, FULL, 0.1)
    assert isinstance(out, Wait) and [v for v, _ in shed] == ["low"] and shed[0][1].status == 503
    out, shed = p.arrive("low2", sched_request(seq=2, priority=PriorityClass.BATCH, tenant="b"), batch, FULL, 0.2)
    assert isinstance(out, Refuse) and out.code == "shed" and not shed


def test_infeasible_deadline_refused_at_once_and_queued_ones_expire():
    p, t = plane()
    loaded = sched_request(prompt_tokens=2000, expected_output=200, budget=LatencyBudget(deadline=2.0))
    out, _ = p.arrive("x", loaded, t, FULL, 0.0)  # ~2.3 s with the load ahead, ~1.7 s alone: retry once it drains
    assert isinstance(out, Refuse) and (out.status, out.code) == (503, "deadline_infeasible") and out.retry_after > 0
    tight = replace(loaded, budget=LatencyBudget(deadline=1.0))
    for snap in (FULL, FREE):  # longer than its window even on an idle fleet: the client's to change, not retried
        out, _ = p.arrive("x", tight, t, snap, 0.0)
        assert isinstance(out, Refuse) and (out.status, out.code, out.retry_after) == (400, "deadline_infeasible", None)
        assert "alone" in out.reason
    ok = sched_request(seq=1, prompt_tokens=100, expected_output=10, budget=LatencyBudget(deadline=5.0))
    assert isinstance(p.arrive("y", ok, t, FULL, 0.0)[0], Wait)
    assert p.expire(FULL, 1.0) == []
    expired = p.expire(FULL, 5.0)
    assert [item for item, _ in expired] == ["y"] and p.waiting == 0
    # its deadline passed while it waited: the 504 the request path gives then (was a 503 saying "retry in 1 s")
    assert (expired[0][1].status, expired[0][1].code, expired[0][1].retry_after) == (504, "deadline_exceeded", None)


def test_a_queued_request_the_policy_now_refuses_leaves_the_queue_refused_not_stuck_at_its_head():
    """A sheddable request waits while the fleet is saturated; when capacity frees, no replica can give it its
    first token in time any more (scheduler.shed_infeasible): it comes back as a Refuse with the policy's code,
    its admission released, and the standard request behind it is dispatched in the same pass."""
    s = AdmissionSettings()
    p = ControlPlane(make_policy("steersman"), DefaultAdmitter(s), GatewayQueue(s))
    spare = TenantConfig("s", PriorityClass.SHEDDABLE, requests_per_minute=1)
    std = TenantConfig("t", PriorityClass.STANDARD)
    # (a budget a replica could meet at its arrival: one none could is refused then, control/shed_watch.py)
    doomed = sched_request(prompt_tokens=8000, expected_output=10, priority=PriorityClass.SHEDDABLE, tenant="s",
                           budget=LatencyBudget(ttft_s=2.0, tpot_s=0.2))
    assert isinstance(p.arrive("doomed", doomed, spare, FULL, 0.0)[0], Wait)
    assert isinstance(p.arrive("next", sched_request(seq=1), std, FULL, 0.0)[0], Wait)
    got = dict(p.dispatch(lambda: replace(FREE, time=2.5), 2.5))  # its budget ran out while it waited
    assert isinstance(got["doomed"], Refuse) and got["doomed"].code == "slo_infeasible" and got["doomed"].status == 503
    assert isinstance(got["next"], Dispatch) and p.waiting == 0
    # released: the sheddable tenant's one request per minute is free again
    assert isinstance(p.arrive("again", sched_request(seq=2, priority=PriorityClass.SHEDDABLE, tenant="s"), spare,
                               FREE, 2.6)[0], Dispatch)


def test_a_retry_no_replica_can_take_now_waits_in_the_queue_already_admitted():
    """A request whose attempt failed, re-routed while every replica is saturated, waits again (requeue) instead of
    failing: capacity that frees dispatches it with its first admission, avoiding the replica that failed it; a
    refusal from the queue (expiry, shedding, its client gone) does not give its admission back: it ran, and the
    request's end settles it."""
    p, t = plane(requests_per_minute=1)
    out, _ = p.arrive("a", sched_request(), t, FREE, 0.0)
    assert isinstance(out, Dispatch)
    admit = out.admit
    failed = out.route.replica
    retry = replace(sched_request(), excluded=frozenset({failed}))
    out, shed = p.requeue("a", retry, admit, t.weight, 0.1)
    assert isinstance(out, Wait) and not shed and p.waiting == 1
    got = p.dispatch(lambda: FREE, 0.2)
    assert [item for item, _ in got] == ["a"] and got[0][1].admit is admit and got[0][1].route.replica != failed
    # given up while waiting again: the tenant's one request a minute stays spent (its end settles it)
    p.requeue("a", retry, admit, t.weight, 0.3)
    p.abandon("a", 0.4)
    assert isinstance(p.arrive("b", sched_request(seq=1), t, FREE, 0.5)[0], Refuse)
    # expired while waiting again: the same
    p2, t2 = plane(requests_per_minute=1)
    out, _ = p2.arrive("c", sched_request(), t2, FREE, 0.0)
    late = sched_request(budget=LatencyBudget(deadline=1.0))
    assert isinstance(p2.requeue("c", late, out.admit, t2.weight, 0.1)[0], Wait)
    assert [item for item, _ in p2.expire(FULL, 1.0)] == ["c"] and p2.waiting == 0
    assert isinstance(p2.arrive("d", sched_request(seq=1), t2, FREE, 1.1)[0], Refuse)


def test_a_requeued_retry_can_be_shed_and_can_shed_like_an_arrival():
    p, t = plane(max_entries=1)
    crit = TenantConfig("c", PriorityClass.CRITICAL)
    batch = TenantConfig("b", PriorityClass.BATCH)
    out, _ = p.arrive("run", sched_request(priority=PriorityClass.BATCH, tenant="b"), batch, FREE, 0.0)
    assert isinstance(p.requeue("run", sched_request(priority=PriorityClass.BATCH, tenant="b"), out.admit, 1.0, 0.1)[0],
                      Wait)
    out, shed = p.arrive("high", sched_request(seq=1, priority=PriorityClass.CRITICAL, tenant="c"), crit, FULL, 0.2)
    assert isinstance(out, Wait) and [v for v, _ in shed] == ["run"] and shed[0][1].code == "shed"
    # a batch retry meeting a full queue of more important work is refused itself
    x = sched_request(seq=2, priority=PriorityClass.BATCH, tenant="b")
    out, shed = p.requeue("x", x, p.admitter.admit(x, batch, 0.3), 1.0, 0.4)
    assert isinstance(out, Refuse) and out.code == "shed" and not shed and p.waiting == 1


# ---- found by review (twenty-seventh session); each failed before its fix ----------------------------------------
DOWN = fleet_snapshot(2, routable=[False, False])


def test_requests_queued_for_a_model_whose_replicas_all_left_are_refused_after_a_grace():
    p, t = plane(requests_per_minute=2)
    assert isinstance(p.arrive("A", sched_request(seq=1), t, FULL, 0.0)[0], Wait)
    # every replica leaves rotation: a new arrival is refused at once (it was queued behind A, skipping the policy)
    out, _ = p.arrive("B", sched_request(seq=2), t, DOWN, 1.0)
    assert isinstance(out, Refuse) and out.status == 503 and out.retry_after == 1.0
    grace = DEFAULTS.scheduler.queue_without_replica_s
    assert p.expire(DOWN, 1.0) == [] and p.expire(DOWN, 1.0 + grace / 2) == [] and p.waiting == 1
    (item, refused), = p.expire(DOWN, 1.0 + grace)  # A waited for ever
    assert item == "A" and refused.status == 503 and refused.code == "no_capacity" and refused.retry_after == 1.0
    assert p.waiting == 0 and p.admitter.limiter.levels("t", 1.0 + grace)[0] == 2.0  # both admissions back


def test_a_replica_coming_back_within_the_grace_keeps_the_queue():
    p, t = plane()
    p.arrive("A", sched_request(seq=1), t, FULL, 0.0)
    grace = DEFAULTS.scheduler.queue_without_replica_s
    assert p.expire(DOWN, 1.0) == [] and p.expire(FULL, 1.0 + grace / 2) == []  # back (saturated) ...
    assert p.expire(DOWN, 1.0 + grace) == [] and p.waiting == 1  # ... so the grace starts again


def test_a_deadline_request_with_no_replica_in_rotation_is_told_when_to_retry():
    p, t = plane()
    out, _ = p.arrive("a", sched_request(budget=LatencyBudget(deadline=30.0)), t, DOWN, 0.0)
    # was 503 deadline_infeasible without Retry-After ("retrying cannot help") where one without a deadline gets 1 s
    assert isinstance(out, Refuse) and out.status == 503 and out.retry_after == 1.0


def test_an_expiry_pass_predicts_a_bounded_number_of_deadlines():
    from steersman.control import plane as plane_mod

    p, t = plane()
    for i in range(3 * plane_mod.EXPIRE_CHECKS):
        p.arrive(f"r{i}", sched_request(seq=i, budget=LatencyBudget(deadline=1e6 - i)), t, FULL, 0.0)
    asked = []
    real = plane_mod._earliest_finish

    def counted(snapshot, req, settings):
        asked.append(req.budget.deadline)
        return real(snapshot, req, settings)

    plane_mod._earliest_finish = counted
    try:
        p.expire(FULL, 1.0)
    finally:
        plane_mod._earliest_finish = real
    # every queued request was predicted each pass (every 50 ms: ~25 ms for 1,024); the earliest deadlines first
    assert sorted(asked) == sorted(1e6 - i for i in range(3 * plane_mod.EXPIRE_CHECKS))[:plane_mod.EXPIRE_CHECKS]


class _Holding:
    """A policy that holds every request back (no replica meets its SLO now), counting its decisions."""

    def __init__(self) -> None:
        self.picks = 0

    def pick(self, snap, req):
        self.picks += 1
        return Queue("held back")


class _CountingQueue(GatewayQueue):
    """Counts the entries a pop's walk visits."""

    walked = 0

    def _candidates(self, flow, models):
        for e in super()._candidates(flow, models):
            self.walked += 1
            yield e


@pytest.mark.parametrize("now", [1.0, 100.0])  # TTFT budgets with time left (first pass) / all spent (second)
def test_a_dispatch_pass_walks_a_bounded_part_of_a_long_queue(now):
    """3,000 requests wait and the policy holds each back: a pass makes its DISPATCH_PICKS decisions, then stops.
    It walked the whole queue, twice, once its decisions were spent (~5 us an entry, at every request end of an
    overload: the twin's retry drill walked 4.7M entries for 800 requests)."""
    s = AdmissionSettings(queue_max_entries=4096)
    policy, q = _Holding(), _CountingQueue(s)
    p, t = ControlPlane(policy, DefaultAdmitter(s), q), TenantConfig("t", PriorityClass.STANDARD)
    for i in range(3000):
        out, _ = p.arrive(i, sched_request(seq=i, budget=LatencyBudget(ttft_s=2.0)), t, FREE, 0.0)
        assert isinstance(out, Wait)
    policy.picks, q.walked = 0, 0
    assert p.dispatch(lambda: FREE, now) == [] and p.waiting == 3000
    assert policy.picks == DISPATCH_PICKS
    # its picks, and the entry each pass stopped at; with every budget spent the first pass is not walked at all
    # (it looked at DISPATCH_FIRST_LOOKS stale entries for nothing)
    assert q.walked <= DISPATCH_PICKS + 2, q.walked


def test_a_request_with_budget_left_behind_stale_ones_is_still_served_first():
    """The first pass is skipped only when no waiting request of the band has TTFT budget left: one that has, behind
    200 whose budget ran out (fewer than DISPATCH_FIRST_LOOKS; and one that left the queue while it had some), goes
    first."""
    p, t = plane()
    for i in range(200):
        assert isinstance(p.arrive(i, sched_request(seq=i, budget=LatencyBudget(ttft_s=2.0)), t, FULL, 0.0)[0], Wait)
    assert isinstance(p.arrive("gone", sched_request(seq=300, arrival=99.0, budget=LatencyBudget(ttft_s=2.0)), t,
                               FULL, 99.0)[0], Wait)
    p.abandon("gone", 99.0)
    assert p.dispatch(lambda: FREE, 100.0, limit=1)[0][0] == 0  # none with budget left: the queue's order
    fresh = sched_request(seq=301, arrival=99.5, budget=LatencyBudget(ttft_s=2.0))
    assert isinstance(p.arrive("fresh", fresh, t, FULL, 99.5)[0], Wait)
    assert p.dispatch(lambda: FREE, 100.0, limit=1)[0][0] == "fresh"
    assert p.dispatch(lambda: FREE, 102.0, limit=1)[0][0] == 1  # (its budget would have run out by now)


def test_a_deadline_the_load_makes_late_stays_retryable_on_a_replica_faster_than_the_prior():
    """The idle bound keeps each replica's learnt speed: an idle replica predicted with the fleet's TPOT prior, slower
    than the 0.6 this busy one learnt, so "alone" read 3.2 s where the load gave 1.95 s, and a deadline the load alone
    made late was a 400 no retry could pass (review, thirty-first session).  Between the two it is a 503 to retry."""
    p, t = plane()
    snap = fleet_snapshot(1, running=[1], in_flight=[1], decoding=[1], tpot_ratio=[0.6])
    req = sched_request(prompt_tokens=200, expected_output=400)
    finish = _earliest_finish(snap, req)
    alone = _alone(snap, req)
    assert 0.9 * finish < alone < finish, (alone, finish)
    out, _ = p.arrive("x", replace(req, budget=LatencyBudget(deadline=(alone + finish) / 2)), t, snap, 0.0)
    assert isinstance(out, Refuse) and out.status == 503 and out.retry_after > 0, out
    out, _ = p.arrive("y", replace(req, seq=1, budget=LatencyBudget(deadline=alone * 0.99)), t, snap, 0.0)
    assert isinstance(out, Refuse) and out.status == 400, out


def test_requests_that_went_through_the_queue_are_not_kept_alive_by_it():
    """Each queued request's first-pass deadline sits in a heap its band keeps; entries left the heap only from its
    top, so protected requests (never stale) and everything behind a slot waiter stayed, holding each request's
    context: 5,000 of 10,000 dispatched requests were still referenced (review, thirty-first session)."""
    import gc
    import weakref

    from steersman.policy.request import WorkflowView

    class Item:
        pass

    p, t = plane()
    wf = WorkflowView("w", 1, 3, 0, 0, 0.0, 0.0, 1.0)  # an agent's step: protected (its first pass never ends)
    refs, seq = [], 0
    for k in range(2000):
        now = k * 0.5
        for protected in (True, False):
            it = Item()
            refs.append(weakref.ref(it))
            req = sched_request(seq=seq, arrival=now, budget=LatencyBudget(ttft_s=2.0))
            seq += 1
            assert isinstance(p.arrive(it, replace(req, workflow=wf) if protected else req, t, FULL, now)[0], Wait)
        del it
        assert len(p.dispatch(lambda: FREE, now + 0.1)) == 2
    gc.collect()
    assert p.waiting == 0 and sum(r() is not None for r in refs) <= 2 * 64 + 2


def test_a_correction_learnt_under_overload_does_not_make_a_request_alone_infeasible():
    """A scheduling audit: corrections learnt while the engines' slots were full held their queueing (ratios ~2), and
    on the idle fleet a request of 0.81 s read 1.53 s "alone": every deadline up to 1.5 s was a final 400 telling
    the client to allow more time.  The request alone misses its window only if the uncorrected model says so too;
    between the two it is a 503 to retry (where the correction is right, a retry is refused again)."""
    p, t = plane()
    idle = fleet_snapshot(1)
    inflated = replace(fleet_snapshot(1, ttft_ratio=[2.0], tpot_ratio=[2.0]), ttft_prior=2.0, tpot_prior=2.0)
    req = sched_request(prompt_tokens=200, expected_output=100, max_tokens=100)
    model = _alone(idle, req)
    assert _alone(inflated, req) == pytest.approx(model)  # the lesser: the uncorrected model's
    assert _earliest_finish(inflated, req) > 1.5 * model  # what the learnt ratios predict
    out, _ = p.arrive("x", replace(req, budget=LatencyBudget(deadline=model * 1.2)), t, inflated, 0.0)
    assert isinstance(out, Refuse) and out.status == 503, out
    out, _ = p.arrive("y", replace(req, seq=1, budget=LatencyBudget(deadline=model * 0.8)), t, inflated, 0.0)
    assert isinstance(out, Refuse) and out.status == 400, out


def test_tenants_keep_their_weighted_shares_when_one_tenants_requests_ran_out_of_ttft_budget():
    """A scheduling audit (12 clients of a weight-2 tenant against 40 of a weight-1 one): the first pass served
    any tenant's requests with TTFT budget left before the stale ones of the tenant whose turn it was, so the
    backlogged weight-2 tenant got 0.35x the other's rate, its requests waiting up to 33 s.  The fair share picks
    the tenant; the first pass orders that tenant's own requests."""
    p, _ = plane()
    a, b = TenantConfig("a", PriorityClass.STANDARD, weight=2.0), TenantConfig("b", PriorityClass.STANDARD)
    budget = LatencyBudget(ttft_s=2.0, tpot_s=0.2)
    for k in range(30):  # a's requests came first and ran out of budget while they waited
        p.arrive(f"a{k}", sched_request(k, tenant="a", budget=budget, arrival=0.0), a, FULL, 0.0)
    for k in range(30):  # b's arrive later: budget left at t = 10
        p.arrive(f"b{k}", sched_request(100 + k, tenant="b", budget=budget, arrival=9.5), b, FULL, 9.5)
    served = [item for item, d in p.dispatch(lambda: FREE, 10.0, limit=30) if isinstance(d, Dispatch)]
    share = sum(x.startswith("a") for x in served) / len(served)
    assert len(served) == 30 and abs(share - 2 / 3) <= 0.05, served
    # inside a tenant, its requests with budget left still go first
    p, _ = plane()
    for k in range(3):
        p.arrive(f"old{k}", sched_request(k, tenant="a", budget=budget, arrival=0.0), a, FULL, 0.0)
    p.arrive("new", sched_request(9, tenant="a", budget=budget, arrival=9.5), a, FULL, 9.5)
    assert [item for item, _ in p.dispatch(lambda: FREE, 10.0, limit=1)] == ["new"]


def test_deadline_checks_predict_unprofiled_replicas_with_the_fleets_priors():
    """The deadline checks built their predictions without the scheduler settings: a replica with no hardware profile
    (llama.cpp, a generic OpenAI endpoint) was predicted from the default priors while routing used the fleet file's,
    so a request the configured priors say fits its deadline was refused (architecture audit, thirty-fifth
    session)."""
    from steersman.fleet.statics import ReplicaSpec, build_statics

    fast = replace(DEFAULTS.scheduler, unprofiled_prefill_s_per_token=1e-4, unprofiled_decode_step_s=0.005)
    snap = replace(fleet_snapshot(1), statics=build_statics([ReplicaSpec(None, "llama-3.1-8b", 1, 0.0)]))
    req = sched_request(prompt_tokens=200, expected_output=100, max_tokens=100)
    configured, default = _earliest_finish(snap, req, fast), _earliest_finish(snap, req)
    assert configured < 0.5 * default and _alone(snap, req, fast) < 0.5 * _alone(snap, req)
    p, t = plane(scheduler=fast)
    out, _ = p.arrive("x", replace(req, budget=LatencyBudget(deadline=2 * configured)), t, snap, 0.0)
    assert isinstance(out, Dispatch), out  # was a 400: "alone" with the default priors missed the deadline
    p, t = plane()  # the default priors: the same deadline is one the request alone cannot meet
    out, _ = p.arrive("x", replace(req, budget=LatencyBudget(deadline=2 * configured)), t, snap, 0.0)
    assert isinstance(out, Refuse) and out.status == 400, out


@pytest.mark.parametrize("wait", [DEFAULTS.scheduler.no_replica_retry_after_s, 7.0])
def test_a_refusal_that_names_no_wait_gets_the_fleet_files_retry_after(wait):
    # no replica serves the model: the policy refuses without a wait of its own, the plane says how long to wait
    # (scheduler.no_replica_retry_after_s; policies no longer write 1.0 each)
    p, t = plane(scheduler=replace(DEFAULTS.scheduler, no_replica_retry_after_s=wait))
    out, _ = p.arrive("a", sched_request(model="no-such-model"), t, FREE, 0.0)
    assert isinstance(out, Refuse) and out.status == 503 and out.retry_after == wait
