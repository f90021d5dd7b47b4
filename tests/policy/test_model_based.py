"""The model-based default profile: predictions, the SLO-cheapest picker, saturation, filters, clamping."""

import numpy as np
from hypothesis import given, settings, strategies as st

from steersman.config import DEFAULTS
from steersman.policy import Queue, Reject, Route, make_policy
from steersman.policy.framework import DecisionContext, Profile, WeightedScorer
from steersman.policy.framework import MaxScore
from steersman.policy.request import LatencyBudget, PriorityClass, WorkflowView
from steersman.testing.snapshots import chain, fleet_snapshot, prefix_index, sched_request

POLICY = make_policy("steersman")


def predict(snap, req):
    return DecisionContext(snap, req, snap.candidates(req.model)).feature("prediction")


def test_faster_gpu_predicts_lower_latency_and_queue_ahead_adds_ttft():
    snap = fleet_snapshot(["H100", "A100", "L40S"])
    p = predict(snap, sched_request(prompt_tokens=2000, expected_output=100))
    assert p.ttft[0] < p.ttft[1] and p.tpot[0] < p.tpot[1] < p.tpot[2]
    busy = fleet_snapshot(["H100", "H100"], pending_prefill=[20000, 0])
    q = predict(busy, sched_request(prompt_tokens=2000))
    assert q.ttft[0] > 5 * q.ttft[1]
    slow = fleet_snapshot(["H100", "H100"], tpot_ratio=[5.0, 1.0], in_flight=1, decoding=1, running=1)
    s = predict(slow, sched_request())
    assert np.isclose(s.tpot[0], 5 * s.tpot[1])
    # idle, its TPOT ratio (batch interference it saw then) gives way to the fleet's
    idle = fleet_snapshot(["H100", "H100"], tpot_ratio=[5.0, 1.0])
    s = predict(idle, sched_request())
    assert np.isclose(s.tpot[0], s.tpot[1])


def test_cached_prefix_cuts_predicted_ttft_and_cost():
    hashes = chain("sys", 200)
    snap = fleet_snapshot(2, prefix=prefix_index(2, {1: hashes}))
    p = predict(snap, sched_request(hashes=hashes))
    assert p.uncached[1] < 20 and p.uncached[0] == 200 * 16
    assert p.ttft[1] < p.ttft[0] and p.cost[1] < p.cost[0]
    assert POLICY.pick(snap, sched_request(hashes=hashes)).replica == 1


def test_cheapest_replica_that_meets_the_slo_else_least_latency():
    snap = fleet_snapshot(["H100", "A100"])
    req = sched_request(prompt_tokens=1000, expected_output=100)
    p = predict(snap, req)
    cheap = int(np.argmin(p.cost))
    loose = POLICY.pick(snap, sched_request(prompt_tokens=1000, expected_output=100, budget=LatencyBudget(10.0, 1.0)))
    assert loose.replica == cheap and "cheapest" in loose.reason
    fast = int(np.argmin(p.ttft))
    only_fast = LatencyBudget(ttft_s=float(p.ttft.min()) * 1.01, tpot_s=1.0)
    assert POLICY.pick(snap, sched_request(prompt_tokens=1000, expected_output=100, budget=only_fast)).replica == fast
    impossible = LatencyBudget(ttft_s=1e-6, tpot_s=1e-6)
    d = POLICY.pick(snap, sched_request(prompt_tokens=1000, expected_output=100, budget=impossible))
    assert d.late and "no replica meets the SLO" in d.reason
    assert p.e2e[d.replica] <= DEFAULTS.scheduler.late_latency_tie * p.e2e.min()


def test_late_work_spreads_by_the_scores_among_the_least_late():
    """No replica meets the budget: every candidate within ``late_latency_tie`` of the least predicted latency
    is equally late, so the scores (here the load) choose, not the latency ranking; one further behind is not
    a candidate at all."""
    from steersman.policy.kernels import slo_pool_kernel

    e2e = np.array([1.0, 3.0, 20.0])
    one = np.ones(3)
    for late_tie, want in ((4.0, [True, True, False]), (1.10, [True, False, False])):
        pool = np.empty(3, dtype=np.bool_)
        count, feasible, stay = slo_pool_kernel(e2e, one, e2e, one, np.zeros(3), np.zeros(3), one, 1.0, 4.0,
                                                0.5, 0.5, 0.5, 1.0, False, 1.05, 1.10, late_tie, pool, np.empty(0))
        assert not feasible and not stay and pool.tolist() == want and count == sum(want)
    # the feasible case keeps latency_tie: 3x slower is not "equally fast" there
    pool = np.empty(3, dtype=np.bool_)
    count, feasible, _ = slo_pool_kernel(e2e, one, e2e, one, np.zeros(3), np.zeros(3), one, 1.0, 4.0,
                                         100.0, 100.0, 100.0, 1.0, False, 1.05, 1.10, 4.0, pool, np.empty(0))
    assert feasible and pool.tolist() == [True, False, False] and count == 1
    # through the profile, both paths: a fast busy H100 and an idle A100, a budget neither meets
    snap = fleet_snapshot(["H100", "A100"], in_flight=[40, 0], running=[40, 0], decoding=[40, 0])
    req = sched_request(prompt_tokens=1000, expected_output=100, budget=LatencyBudget(ttft_s=1e-6, tpot_s=1e-6))
    p = predict(snap, req)
    assert p.e2e[0] < p.e2e[1] / DEFAULTS.scheduler.latency_tie  # the H100 is clearly the least late
    for fused in (True, False):
        policy = make_policy("steersman")
        if not fused:
            policy._fast = None
        d = policy.pick(snap, req)
        assert isinstance(d, Route) and d.late and d.replica == 1  # the idle one: the load decides


def test_critical_and_valuable_workflows_keep_a_safety_margin():
    snap = fleet_snapshot(["H100", "A100"])
    req = sched_request(prompt_tokens=1000, expected_output=100)
    p = predict(snap, req)
    slower, faster = int(np.argmax(p.ttft)), int(np.argmin(p.ttft))
    # a budget the slower replica meets with 10% to spare: fine for standard, too tight for protected requests
    b = LatencyBudget(ttft_s=float(p.ttft[slower]) / 0.9, tpot_s=float(p.tpot.max()) / 0.5)
    std = POLICY.pick(snap, sched_request(prompt_tokens=1000, expected_output=100, budget=b))
    crit = POLICY.pick(snap, sched_request(prompt_tokens=1000, expected_output=100, budget=b, priority=PriorityClass.CRITICAL))
    wf = WorkflowView("w", 5, 6, 4, 10000, 0.3, 0.0, 0.5)
    late_step = POLICY.pick(snap, sched_request(prompt_tokens=1000, expected_output=100, budget=b, workflow=wf))
    assert crit.replica == faster and late_step.replica == faster
    assert std.replica in (0, 1)


def test_saturated_fleet_queues_and_saturated_replicas_are_skipped():
    s = DEFAULTS.scheduler
    all_sat = fleet_snapshot(2, waiting=[s.saturation_queue_depth + 1] * 2)  # past the depth (GIE)
    assert isinstance(POLICY.pick(all_sat, sched_request()), Queue)
    kv_full = fleet_snapshot(2, kv_usage=[0.95, 0.1])
    assert POLICY.pick(kv_full, sched_request()).replica == 1
    # routed since the scrape, beyond the batch slots that were free: they wait on the engine
    routed_since_scrape = fleet_snapshot(2, running=[1020, 0], since_scrape=[5 + s.saturation_queue_depth, 0])
    assert POLICY.pick(routed_since_scrape, sched_request()).replica == 1
    stale_but_idle = fleet_snapshot(2, time=10.0, scraped_at=0.0, waiting=[50, 50])
    assert isinstance(POLICY.pick(stale_but_idle, sched_request()), Route)  # stale metrics don't freeze the fleet


def test_no_candidates_and_kv_filter():
    assert isinstance(POLICY.pick(fleet_snapshot(2, routable=[False, False]), sched_request()), Reject)
    assert isinstance(POLICY.pick(fleet_snapshot(2), sched_request(model="other")), Reject)
    snap = fleet_snapshot(2, kv_blocks_total=[1000, 1000], kv_usage=[0.5, 0.79])
    big = sched_request(prompt_tokens=16 * 300, expected_output=16)  # 301 blocks: only replica 0 has them free
    assert POLICY.pick(snap, big).replica == 0


class _Wild:
    name = "wild"

    def __init__(self, values):
        self.values = values

    def score(self, ctx):
        return np.asarray(self.values[: ctx.candidates.size], dtype=float)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6)), min_size=4, max_size=4),
       st.floats(min_value=0, max_value=10))
def test_framework_clamps_every_score(values, weight):
    seen = {}

    class Spy(MaxScore):
        def pick(self, ctx, scores):
            seen["scores"] = scores().copy()
            return super().pick(ctx, scores)

    prof = Profile("t", [], [WeightedScorer(_Wild(values), weight)], Spy())
    prof.pick(fleet_snapshot(4), sched_request())
    s = seen["scores"]
    assert np.all(np.isfinite(s)) and np.all(s >= 0) and np.all(s <= weight + 1e-9)


def test_custom_profile_from_the_fleet_file():
    import pytest

    from steersman.fleet.config import FleetConfigError, make_profile, parse_fleet

    spec = {"filters": ["shortlist", {"type": "fits-kv"}], "scorers": [{"type": "prefix-affinity", "weight": 3},
            {"type": "load-balance", "weight": 1}], "picker": "max-score", "queue_when_saturated": True}
    base = {"endpoints": [{"url": "http://127.0.0.1:1", "models": ["m"]}]}
    cfg = parse_fleet({**base, "policy": "mine", "scheduler": {"profiles": {"mine": spec}}})
    prof = make_profile("mine", cfg.profiles["mine"], cfg.scheduler)
    hashes = chain("p", 40)
    snap = fleet_snapshot(3, prefix=prefix_index(3, {2: hashes}))
    assert prof.pick(snap, sched_request(hashes=hashes)).replica == 2
    assert isinstance(prof.pick(fleet_snapshot(2, waiting=[50, 50]), sched_request()), Queue)
    bad = {"scorers": [{"type": "prefix-afinity"}]}
    with pytest.raises(FleetConfigError, match="profiles.mine.*prefix-afinity"):
        parse_fleet({**base, "policy": "mine", "scheduler": {"profiles": {"mine": bad}}})
    with pytest.raises(FleetConfigError, match="unknown policy 'nope'"):
        parse_fleet({**base, "policy": "nope"})


def test_a_late_tie_beyond_exploit_slowdown_is_refused_naming_it():
    from dataclasses import replace

    import pytest

    from steersman.fleet.config import FleetConfigError, parse_fleet

    with pytest.raises(ValueError, match="late_latency_tie"):
        replace(DEFAULTS.scheduler, late_latency_tie=DEFAULTS.scheduler.exploit_slowdown * 2)
    with pytest.raises(ValueError, match="latency_tie must be >= 1"):
        replace(DEFAULTS.scheduler, latency_tie=0.5)
    assert replace(DEFAULTS.scheduler, late_latency_tie=8.0, exploit_slowdown=8.0).late_latency_tie == 8.0
    endpoint = {"name": "e0", "url": "http://127.0.0.1:1", "engine": "vllm", "models": ["llama-3.1-8b"], "gpu": "H100"}
    with pytest.raises(FleetConfigError, match="late_latency_tie"):
        parse_fleet({"scheduler": {"late_latency_tie": 9}, "endpoints": [endpoint]})
