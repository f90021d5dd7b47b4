"""A replica's recent server-side failure share counts in the picker: ``1 / (1 - p)`` attempts a success.

A replica that fails fast holds few requests, so by load alone it looks the least busy and draws traffic;
the fleet keeps each replica's failure share over the breaker's window (``fail_share``) and the SLO-cheapest
picker prices it, on both decision paths; the share leaves with the window, also while no traffic goes there.
"""

from dataclasses import replace

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.fleet import snapshot as S
from steersman.fleet.state import Fleet, Replica
from steersman.policy import Route, make_policy
from steersman.policy.kernels import FAIL_SHARE_CAP, slo_pool_kernel
from steersman.reliability import ReplicaGuard
from steersman.engines.base import EngineMetrics
from steersman.testing import FakeClock
from steersman.testing.snapshots import fleet_snapshot, sched_request

MIN = DEFAULTS.reliability.breaker_min_requests


def _pool(fail):
    e2e, one = np.array([1.0, 1.0]), np.ones(2)
    pool = np.empty(2, dtype=np.bool_)
    count, feasible, _ = slo_pool_kernel(e2e, one, e2e, one, np.zeros(2), np.zeros(2), one, 1.0, 4.0, 100.0, 100.0,
                                         100.0, 1.0, False, 1.05, 1.10, 2.0, pool, fail)
    return pool.tolist(), feasible


def test_a_failing_replica_leaves_the_pool_of_equally_good_ones():
    assert _pool(np.empty(0)) == ([True, True], True)
    assert _pool(np.zeros(2)) == ([True, True], True)
    assert _pool(np.array([0.4, 0.0])) == ([False, True], True)  # 1.67x the cost: not within cost_tie
    assert _pool(np.array([0.02, 0.0])) == ([True, True], True)  # 1.02x: within it (an odd failure changes nothing)
    # a failure share of 1 counts as the cap, not as infinitely many attempts (no inf/NaN in the arithmetic)
    assert _pool(np.array([1.0, 1.0])) == ([True, True], True) and FAIL_SHARE_CAP < 1.0


@pytest.mark.parametrize("fused", [True, False])
def test_the_less_loaded_replica_loses_to_the_busier_one_when_it_fails(fused):
    """Replica 0 is idle because it fails fast; without the failure share it wins on load and cost."""
    req = sched_request(prompt_tokens=500, expected_output=50)
    policy = make_policy("steersman")
    if not fused:
        policy._fast = None
    for share, want in ((0.0, 0), (0.3, 1), (0.01, 0)):
        snap = fleet_snapshot(2, in_flight=[0, 6], running=[0, 6], decoding=[0, 6], fail_share=[share, 0.0])
        d = policy.pick(snap, req)
        assert isinstance(d, Route) and d.replica == want, (share, d)
    # what the fleet learns from (observed / predicted) is the model's prediction, not the priced one
    alone = [policy.pick(fleet_snapshot(1, fail_share=[share]), req) for share in (0.0, 0.5)]
    assert alone[0].replica == alone[1].replica == 0
    assert alone[0].predicted_ttft_s == alone[1].predicted_ttft_s and alone[0].expected_e2e_s == alone[1].expected_e2e_s


def _fleet(n=2, **settings):
    clock = FakeClock()
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "openai", "H100", ("m",), "p", 1.0, 1, None)
            for i in range(n)]
    fleet = Fleet(reps, clock)
    fleet.guard = ReplicaGuard(n, replace(DEFAULTS.reliability, **settings), 0.2)
    return fleet, clock


def _attempt(fleet, i, ok):
    t = fleet.begin(i)
    fleet.first_token(t)
    fleet.report(t, ok)
    fleet.end(t, 10)


def _share(fleet, i):
    return float(fleet.snapshot().live[S.FAIL_SHARE, i])


def test_the_fleet_keeps_the_failure_share_of_the_breaker_window():
    fleet, clock = _fleet(breaker_error_percent=100.0)  # the breaker stays closed: the share alone acts
    for k in range(MIN - 1):
        _attempt(fleet, 0, ok=k % 5 != 0)  # 4 failures in 19
    assert _share(fleet, 0) == 0.0  # under the window's minimum volume: no verdict yet
    _attempt(fleet, 0, ok=False)
    assert _share(fleet, 0) == pytest.approx(5 / MIN) and _share(fleet, 1) == 0.0
    _attempt(fleet, 0, ok=True)  # a success lowers it at once
    assert _share(fleet, 0) == pytest.approx(5 / (MIN + 1))
    # no more traffic there: the failures leave the window with time, read at the next scrape
    clock.set(DEFAULTS.reliability.breaker_window_s + 1.0)
    assert _share(fleet, 0) == pytest.approx(5 / (MIN + 1))  # nothing read it yet
    fleet.update_metrics(0, EngineMetrics(num_running=0, num_waiting=0, kv_usage=0.0))
    assert _share(fleet, 0) == 0.0


def test_failure_routing_off_keeps_the_row_at_zero():
    fleet, _ = _fleet(breaker_error_percent=100.0, failure_routing=False)
    for _ in range(MIN):
        _attempt(fleet, 0, ok=False)
    assert _share(fleet, 0) == 0.0
