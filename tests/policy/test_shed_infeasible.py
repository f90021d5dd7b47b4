"""Early rejection (Mooncake, FAST'25): a request of a class in ``scheduler.shed_infeasible`` that no replica is
predicted to serve within its SLO is refused at once (503 slo_infeasible, Retry-After), on the fused path and the
plugin path; by default only the 'sheddable' class.  Protected requests and streams under way are never shed."""

from dataclasses import replace

import pytest

from steersman.config import DEFAULTS, SchedulerSettings
from steersman.policy import Reject, Route, make_policy
from steersman.policy.request import LatencyBudget, PriorityClass, WorkflowView
from steersman.testing.snapshots import chain, fleet_snapshot, prefix_index, sched_request

STANDARD = LatencyBudget(ttft_s=2.0, tpot_s=0.2)
#: an 8k-token prompt on an idle H100 needs ~0.3 s before its first token: 50 ms cannot be met anywhere
TIGHT = LatencyBudget(ttft_s=0.05, tpot_s=0.2)
SHED_STANDARD = replace(DEFAULTS.scheduler, shed_infeasible=("standard", "sheddable"))


def _policy(fused: bool, settings: SchedulerSettings = DEFAULTS.scheduler):
    p = make_policy("steersman", settings)
    if not fused:
        p._fast = None  # the plugin-by-plugin path
    return p


def _req(priority, budget=TIGHT, **kw):
    return sched_request(7, prompt_tokens=8000, expected_output=100, priority=priority, budget=budget, **kw)


def test_the_default_sheds_only_the_sheddable_class():
    assert DEFAULTS.scheduler.shed_infeasible == ("sheddable",)


@pytest.mark.parametrize("fused", [True, False])
def test_a_sheddable_request_no_replica_can_serve_in_time_is_refused_early(fused):
    policy = _policy(fused)
    snap = fleet_snapshot(2)
    d = policy.pick(snap, _req(PriorityClass.SHEDDABLE))
    assert isinstance(d, Reject) and d.code == "slo_infeasible"
    assert "first token in" in d.reason and "0.05 s TTFT budget left" in d.reason and "shed_infeasible" in d.reason
    # Retry-After: how late the best predicted first token is, at least 1 s
    assert d.retry_after is not None and d.retry_after >= 1.0
    # the same request with a budget a replica meets is routed; a standard one is routed late (default)
    assert isinstance(policy.pick(snap, _req(PriorityClass.SHEDDABLE, STANDARD)), Route)
    late = policy.pick(snap, _req(PriorityClass.STANDARD))
    assert isinstance(late, Route) and late.reason.startswith("no replica meets the SLO")


@pytest.mark.parametrize("fused", [True, False])
def test_opting_in_sheds_standard_requests_but_never_protected_or_resumed_ones(fused):
    policy = _policy(fused, SHED_STANDARD)
    snap = fleet_snapshot(2)
    assert isinstance(policy.pick(snap, _req(PriorityClass.STANDARD)), Reject)
    # a stream under way moves on: it is never refused for being late
    assert isinstance(policy.pick(snap, replace(_req(PriorityClass.STANDARD), resumed=True)), Route)
    # a workflow with sunk cost is protected: it runs late rather than waste what was spent
    wf = WorkflowView("w", step=3, steps=5, calls=2, tokens=1000, spent_usd=0.5, started=0.0, value=1.0)
    assert isinstance(policy.pick(snap, _req(PriorityClass.STANDARD, workflow=wf)), Route)
    # critical requests are never in the set (see the settings test) and batch ones have no target
    assert isinstance(policy.pick(snap, _req(PriorityClass.CRITICAL)), Route)
    assert isinstance(policy.pick(snap, _req(PriorityClass.BATCH, LatencyBudget())), Route)


@pytest.mark.parametrize("fused", [True, False])
def test_a_request_that_stays_with_its_prompt_is_not_shed(fused):
    """Replica 0 holds the whole prompt but its batch of 60 misses the TPOT target that idle replica 1 meets
    (test_holders_residents' stay case): the fleet can meet the SLO and the policy keeps the request with its
    prompt instead, so it is routed there, not refused."""
    policy = _policy(fused, SHED_STANDARD)
    hashes = chain("ctx", 120)
    snap = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}), running=[60, 0], in_flight=[60, 0],
                          decoding=[60, 0])
    req = sched_request(1, prompt_tokens=120 * 16 + 100, hashes=hashes, expected_output=100,
                        budget=LatencyBudget(ttft_s=2.0, tpot_s=0.0105))
    d = policy.pick(snap, req)
    assert isinstance(d, Route) and d.replica == 0 and d.reason.startswith("holder of its prompt")


def test_unknown_or_critical_classes_are_refused_in_config():
    with pytest.raises(ValueError, match="unknown priority class"):
        replace(DEFAULTS.scheduler, shed_infeasible=("stnadard",))
    with pytest.raises(ValueError, match="never shed"):
        replace(DEFAULTS.scheduler, shed_infeasible=("critical",))
    # the names the settings check are the priority classes'
    assert {c.name.lower() for c in PriorityClass} == {"critical", "standard", "sheddable", "batch"}
