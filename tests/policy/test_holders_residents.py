"""The SLO-cheapest rule's holders-first preference (Preble's exploit) and the TPOT its residents must keep."""

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.fleet import snapshot as S
from steersman.fleet.state import Fleet, Replica
from steersman.policy import make_policy
from steersman.policy.framework import DecisionContext
from steersman.policy.request import LatencyBudget
from steersman.testing.snapshots import chain, fleet_snapshot, prefix_index, sched_request

POLICY = make_policy("steersman")
STANDARD = LatencyBudget(ttft_s=2.0, tpot_s=0.2)
IMPOSSIBLE = LatencyBudget(ttft_s=1e-6, tpot_s=1e-6)


def _req(hashes, extra_tokens=0, budget=STANDARD, seq=0, arrival=0.0):
    return sched_request(seq, prompt_tokens=len(hashes) * 16 + extra_tokens, hashes=hashes, expected_output=100,
                         budget=budget, arrival=arrival)


def test_a_feasible_holder_of_most_of_the_prompt_wins_over_a_cheaper_idle_replica():
    hashes = chain("agent-ctx", 120)
    busy = dict(running=[60, 0], in_flight=[60, 0], decoding=[60, 0])
    # replica 0 holds the context but is busy, replica 1 idle: its predicted cost is lower, yet sending the
    # request there would prefill 1,900 tokens again
    snap = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}), **busy)
    assert POLICY.pick(snap, _req(hashes, 100)).replica == 0
    # a shared prefix under half the prompt is no reason to stay: the cost rule decides
    short = chain("agent-ctx", 10)
    snap = fleet_snapshot(2, prefix=prefix_index(2, {0: short}), **busy)
    p = _req(short, 2000)
    assert p.prompt_tokens > 2 * 10 * 16
    assert POLICY.pick(snap, p).replica == 1


def test_a_holder_that_cannot_meet_the_budget_gives_way_to_one_that_can():
    hashes = chain("ctx", 120)
    # the holder has stalled for 5 s (hang signal): its TTFT cannot meet 2 s
    snap = fleet_snapshot(["H100", "H100"], prefix=prefix_index(2, {0: hashes}), in_flight=[2, 0],
                          stalled_since=[5.0, np.nan], time=10.0)
    d = POLICY.pick(snap, _req(hashes, 100, arrival=10.0))  # it arrives now
    assert d.replica == 1 and d.reason.startswith("cheapest")


def test_when_nobody_meets_the_budget_the_holder_wins_unless_far_slower():
    hashes = chain("ctx", 100)
    near = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}), running=[20, 0], in_flight=[20, 0],
                          decoding=[20, 0])
    assert POLICY.pick(near, _req(hashes, budget=IMPOSSIBLE)).replica == 0
    far = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}), running=[400, 0], in_flight=[400, 0],
                         decoding=[400, 0])
    assert POLICY.pick(far, _req(hashes, budget=IMPOSSIBLE)).replica == 1


def test_a_newcomer_may_not_slow_the_steps_past_what_residents_must_keep():
    hashes = chain("ctx", 60)
    kw = dict(prefix=prefix_index(2, {0: hashes}), running=[8, 8], in_flight=[8, 8], decoding=[8, 8])
    free = fleet_snapshot(2, **kw)
    assert POLICY.pick(free, _req(hashes)).replica == 0  # its prefix is there
    # an interactive request there must keep a TPOT this standard one would break (1 ms: nothing meets it)
    guarded = fleet_snapshot(2, resident_tpot=[0.001, 0.0], **kw)
    d = POLICY.pick(guarded, _req(hashes))
    assert d.replica == 1 and d.reason.startswith("cheapest")
    # and the route says what it must keep itself: the budget's TPOT (x the margin when protected)
    assert d.tpot_target_s == STANDARD.tpot_s
    assert POLICY.pick(free, _req(hashes, budget=LatencyBudget())).tpot_target_s == 0.0


class _Clock:
    t = 0.0

    def now(self) -> float:
        return self.t


def test_the_fleet_keeps_the_tightest_tpot_target_in_flight_per_replica():
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "engine-sim", "H100", ("m",), "p", 2.0, 1, adapter=None)
            for i in range(2)]
    fleet = Fleet(reps, _Clock(), DEFAULTS.scheduler)
    row = lambda: fleet.snapshot().live[S.RESIDENT_TPOT]  # noqa: E731
    assert list(row()) == [0.0, 0.0]
    a = fleet.begin(0, tpot_target=0.2)
    b = fleet.begin(0, tpot_target=0.032)
    c = fleet.begin(0, tpot_target=0.032)
    fleet.begin(1)  # no target: nothing to keep
    assert list(row()) == [0.032, 0.0]
    fleet.end(b)
    assert row()[0] == 0.032  # c still keeps it
    fleet.end(c)
    assert row()[0] == 0.2
    fleet.end(a)
    assert row()[0] == 0.0


@pytest.mark.parametrize("fused", [True, False])
def test_residents_keep_their_tpot_against_a_long_prompt(fused):
    """Requests decoding on replica 0 must keep a TPOT; a new request's own TPOT there is within it, but its
    prefill, added to their decode steps, is not: it goes to replica 1 (no residents).  A short prompt,
    whose prefill hardly slows them, stays on replica 0 (first on ties)."""
    policy = make_policy("steersman")
    if not fused:
        policy._fast = None  # the plugin-by-plugin path
    busy = dict(running=[8, 8], decoding=[8, 8], in_flight=[8, 8])
    long_req = sched_request(prompt_tokens=8000, expected_output=100)
    p = DecisionContext(fleet_snapshot(2, **busy), long_req, np.arange(2)).feature("prediction")
    keep = (p.tpot[0] + p.tpot_res[0]) / 2  # between its own TPOT and what the residents would see
    assert p.tpot[0] < keep < p.tpot_res[0]
    snap = fleet_snapshot(2, resident_tpot=[keep, 0.0], **busy)
    assert policy.pick(fleet_snapshot(2, **busy), long_req).replica == 0  # no residents: the first
    assert policy.pick(snap, long_req).replica == 1
    assert policy.pick(snap, sched_request(prompt_tokens=64, expected_output=100)).replica == 0


@pytest.mark.parametrize("fused", [True, False])
def test_an_unprotected_request_stays_with_its_prompt_a_protected_one_goes_where_its_budget_is_met(fused):
    """Replica 0 holds the whole prompt but decodes a batch of 60: its TPOT (~14 ms) misses a 10.5 ms target
    that idle replica 1 (~8 ms) meets, and it is well within exploit_slowdown of it end to end.  A standard
    request stays with its prompt (computing it again elsewhere costs the fleet more); a critical one goes where
    its budget is met; and nobody stays where the requests decoding there would lose the TPOT they must keep."""
    from steersman.policy.request import PriorityClass

    policy = make_policy("steersman")
    if not fused:
        policy._fast = None
    hashes = chain("ctx", 120)
    busy = dict(prefix=prefix_index(2, {0: hashes}), running=[60, 0], in_flight=[60, 0], decoding=[60, 0])
    budget = LatencyBudget(ttft_s=2.0, tpot_s=0.0105)
    standard = _req(hashes, 100, budget=budget)
    p = DecisionContext(fleet_snapshot(2, **busy), standard, np.arange(2)).feature("prediction")
    assert p.tpot[0] > budget.tpot_s and p.tpot[1] < budget.tpot_s * DEFAULTS.scheduler.safety_margin
    assert p.e2e[0] < DEFAULTS.scheduler.exploit_slowdown * p.e2e[1]
    d = policy.pick(fleet_snapshot(2, **busy), standard)
    assert d.replica == 0 and d.reason.startswith("holder of its prompt")
    critical = sched_request(0, prompt_tokens=standard.prompt_tokens, hashes=hashes, expected_output=100,
                             budget=budget, priority=PriorityClass.CRITICAL)
    d = policy.pick(fleet_snapshot(2, **busy), critical)
    assert d.replica == 1 and d.reason.startswith("cheapest")
    guarded = fleet_snapshot(2, resident_tpot=[0.001, 0.0], **busy)
    d = policy.pick(guarded, standard)
    assert d.replica == 1 and d.reason.startswith("cheapest")
