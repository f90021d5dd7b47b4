"""Early rejection of requests that wait in the gateway queue (control/shed_watch.py).

An audit (two replicas, 40 standard clients) found sheddable requests queued behind the standard band unasked
(the queue-first rule) and refused only on their turn, 17-22 s later, with a Retry-After of the time they had
waited.  Now a request of an early-rejection class is asked at arrival all the same, and again when its TTFT
budget runs out while it waits; a profile that does not shed keeps it queued."""

from dataclasses import replace

from steersman.config import DEFAULTS
from steersman.config.admission import AdmissionSettings
from steersman.control import DefaultAdmitter, GatewayQueue, TenantConfig
from steersman.control.plane import ControlPlane, Refuse, Wait
from steersman.policy import make_policy
from steersman.policy.request import LatencyBudget, PriorityClass, WorkflowView
from steersman.testing.snapshots import fleet_snapshot, sched_request

DEPTH = DEFAULTS.scheduler.saturation_queue_depth
FULL = fleet_snapshot(2, waiting=[DEPTH + 1, DEPTH + 1])  # saturated: arrivals queue


def at(t):
    """FULL as a snapshot taken at ``t`` (the plane's callers pass a fresh one)."""
    return replace(FULL, time=t)


STANDARD = LatencyBudget(ttft_s=2.0, tpot_s=0.2)
TIGHT = LatencyBudget(ttft_s=0.05, tpot_s=0.2)  # an 8k-token prompt needs ~0.3 s to its first token anywhere
STD, SHED = TenantConfig("s", PriorityClass.STANDARD), TenantConfig("x", PriorityClass.SHEDDABLE)


def plane(settings=DEFAULTS.scheduler):
    s = AdmissionSettings(queue_max_entries=1024)
    return ControlPlane(make_policy("steersman", settings), DefaultAdmitter(s), GatewayQueue(s), settings)


def _shed_req(seq, budget, arrival=0.0, **kw):
    return sched_request(seq, prompt_tokens=8000, expected_output=100, priority=PriorityClass.SHEDDABLE,
                         budget=budget, tenant="x", arrival=arrival, **kw)


def _queue_one_standard(p):
    out, _ = p.arrive("std", sched_request(0, budget=STANDARD, tenant="s"), STD, FULL, 0.0)
    assert isinstance(out, Wait)


def test_a_sheddable_arrival_behind_a_queue_that_cannot_meet_its_slo_is_refused_at_once():
    p = plane()
    _queue_one_standard(p)
    out, _ = p.arrive("late", _shed_req(1, TIGHT, 0.1), SHED, at(0.1), 0.1)
    assert isinstance(out, Refuse) and out.status == 503 and out.code == "slo_infeasible"
    assert p.waiting == 1  # it never joined the queue (and its admission went back: see the next arrival)
    # one whose SLO a replica could still meet waits behind the queue as before
    out, _ = p.arrive("ok", _shed_req(2, STANDARD, 0.1), SHED, at(0.1), 0.1)
    assert isinstance(out, Wait) and p.waiting == 2


def test_a_queued_sheddable_request_is_refused_when_its_ttft_budget_runs_out_not_on_its_turn():
    p = plane()
    _queue_one_standard(p)
    out, _ = p.arrive("x", _shed_req(1, STANDARD, 0.0), SHED, FULL, 0.0)
    assert isinstance(out, Wait)
    assert p.expire(at(1.0), 1.0) == []  # budget left: it waits
    gone = p.expire(at(2.05), 2.05)  # the budget ran out at 2.0: the next expiry pass refuses it
    assert [item for item, _ in gone] == ["x"] and p.waiting == 1
    r = gone[0][1]
    assert r.status == 503 and r.code == "slo_infeasible"
    # Retry-After: how late a fresh request would be now (the fleet would serve one within ~2 s), not the time
    # it waited (it read 17-22 s in the audit)
    assert 1.0 <= r.retry_after < 2.0
    assert "TTFT budget left" in r.reason
    assert p.expire(at(5.0), 5.0) == []  # asked once


def test_protected_and_standard_requests_are_not_shed_from_the_queue():
    p = plane()
    _queue_one_standard(p)
    wf = WorkflowView("w", step=3, steps=5, calls=2, tokens=1000, spent_usd=0.5, started=0.0, value=1.0)
    out, _ = p.arrive("prot", _shed_req(1, TIGHT, 0.0, workflow=wf), SHED, FULL, 0.0)
    assert isinstance(out, Wait)  # sunk cost: it runs late rather than waste what was spent
    assert p.expire(at(3.0), 3.0) == [] and p.waiting == 2  # nor is the standard one (not an early-rejection class)


def test_a_profile_that_does_not_shed_keeps_the_request_queued():
    p = plane(replace(DEFAULTS.scheduler, shed_infeasible=()))
    _queue_one_standard(p)
    out, _ = p.arrive("x", _shed_req(1, TIGHT, 0.0), SHED, FULL, 0.0)
    assert isinstance(out, Wait)
    assert p.expire(at(3.0), 3.0) == [] and p.waiting == 2
    # a profile whose picker has no early rejection refuses nothing either (the baselines: they never queue)
    assert make_policy("round-robin").early_reject(FULL, _shed_req(1, TIGHT)) is None


def test_opting_standard_in_sheds_queued_standard_requests_too():
    p = plane(replace(DEFAULTS.scheduler, shed_infeasible=("standard", "sheddable")))
    out, _ = p.arrive("a", sched_request(0, prompt_tokens=8000, budget=STANDARD, tenant="s"), STD, FULL, 0.0)
    assert isinstance(out, Wait)
    assert [item for item, _ in p.expire(at(2.1), 2.1)] == ["a"]


def test_replicas_at_their_concurrency_limit_are_still_predicted_over():
    """A review: early rejection went through the reliability gate, which drops a replica at its adaptive
    concurrency limit, so with every replica there it saw none and the request waited for its turn."""
    import numpy as np

    p = plane()
    _queue_one_standard(p)
    out, _ = p.arrive("x", _shed_req(1, STANDARD, 0.0), SHED, FULL, 0.0)
    assert isinstance(out, Wait)
    at_limit = replace(fleet_snapshot(2, waiting=[DEPTH + 1] * 2, in_flight=[5, 5], time=2.05), limits=np.full(2, 5.0))
    assert [item for item, _ in p.expire(at_limit, 2.05)] == ["x"]


def test_a_request_due_with_no_replica_to_predict_over_is_asked_again():
    import numpy as np

    p = plane()
    _queue_one_standard(p)
    p.arrive("x", _shed_req(1, STANDARD, 0.0), SHED, FULL, 0.0)
    down = replace(at(2.05), routable=np.zeros(2, dtype=bool))
    assert p.expire(down, 2.05) == [] and p.waiting == 2  # none routable: nothing to predict over
    assert [item for item, _ in p.expire(at(3.1), 3.1)] == ["x"]  # asked again a second later


def test_a_sheddable_arrival_the_saturated_fleet_would_queue_is_asked_too():
    """A review: with the queue empty but every replica saturated, the policy answers "queue" and the request went
    into the queue unasked until its budget ran out."""
    p = plane()
    out, _ = p.arrive("late", _shed_req(1, TIGHT, 0.0), SHED, FULL, 0.0)
    assert isinstance(out, Refuse) and out.code == "slo_infeasible" and p.waiting == 0


def test_requests_that_left_the_queue_do_not_fill_a_passs_bound():
    """A review: every queued sheddable request stayed in the watch until its due time, dispatched or not, and the
    departed counted towards the 64 a pass: one that had truly waited its budget out waited more passes."""
    from steersman.control.plane import EXPIRE_CHECKS

    p = plane()
    n = EXPIRE_CHECKS + 36
    for k in range(n):
        assert isinstance(p.arrive(f"gone{k}", _shed_req(k, STANDARD, 0.0), SHED, FULL, 0.0)[0], Wait)
    assert isinstance(p.arrive("x", _shed_req(n, STANDARD, 0.5), SHED, FULL, 0.5)[0], Wait)
    for k in range(n):
        p.abandon(f"gone{k}", 1.0)  # (they left: dispatched, or their clients went away)
    assert [item for item, _ in p.expire(at(2.6), 2.6)] == ["x"]


def test_a_profile_whose_picker_has_no_early_rejection_watches_nothing():
    """A review: under the baselines every queued sheddable request was asked again every second it waited."""
    s = AdmissionSettings(queue_max_entries=1024)
    p = ControlPlane(make_policy("round-robin"), DefaultAdmitter(s), GatewayQueue(s))
    assert p._early is None
