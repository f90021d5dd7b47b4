"""The fleet's outcome hooks feed the guard; snapshots carry what the reliability filter applies."""

from dataclasses import replace

import numpy as np

from steersman.config import DEFAULTS
from steersman.fleet.state import Fleet, Replica
from steersman.reliability import ReplicaGuard
from steersman.testing import FakeClock

S = replace(DEFAULTS.reliability, breaker_min_requests=4)


def _fleet(n=3):
    clock = FakeClock()
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "openai", "H100", ("m",), "p", 1.0, 1, None) for i in range(n)]
    fleet = Fleet(reps, clock)
    fleet.guard = ReplicaGuard(n, S, 0.2)
    return fleet, clock


def _attempt(fleet, i, ok, tokens=10):
    t = fleet.begin(i)
    fleet.first_token(t)
    fleet.report(t, ok)
    fleet.end(t, tokens)


def test_failures_reported_through_the_fleet_block_the_replica_in_snapshots():
    fleet, clock = _fleet()
    ejected = []
    fleet.guard.on_eject = lambda i, why: ejected.append((i, why))
    for _ in range(5):
        _attempt(fleet, 1, ok=False)
    snap = fleet.snapshot()
    assert snap.blocked_until[1] > snap.time and np.all(snap.blocked_until[[0, 2]] <= snap.time)
    assert ejected == [(1, "5 consecutive failures")]
    assert fleet.guard.state(1, clock.now())["breaker"] == "open"  # 5 of 5 failed, over the 4-request volume


def test_half_open_admits_one_probe_and_its_success_closes_the_breaker():
    fleet, clock = _fleet()
    g = fleet.guard
    for _ in range(4):
        _attempt(fleet, 0, ok=False)  # breaker opens (4 of 4); 4 < 5 consecutive: not ejected
    assert g.state(0, 0.0)["breaker"] == "open" and not g.state(0, 0.0)["ejected"]
    clock._now = S.breaker_open_s + 0.01
    assert fleet.snapshot().blocked_until[0] <= clock.now()  # half-open: open to a probe
    t = fleet.begin(0)
    assert fleet.snapshot().blocked_until[0] == np.inf  # the probe is out: no more
    fleet.first_token(t)
    fleet.report(t, True)
    fleet.end(t, 5)
    assert g.state(0, clock.now())["breaker"] == "closed"


def test_an_unjudged_end_frees_the_probe_slot():
    fleet, clock = _fleet()
    for _ in range(4):
        _attempt(fleet, 0, ok=False)
    clock._now = S.breaker_open_s + 0.01
    t = fleet.begin(0)
    fleet.end(t, 0)  # the client left: no verdict
    assert fleet.snapshot().blocked_until[0] <= clock.now()


def test_limits_in_snapshots_shrink_when_a_replica_slows_down():
    fleet, clock = _fleet(2)
    g = fleet.guard
    low = {0: np.inf, 1: np.inf}
    for k in range(60):
        for i, dt in ((0, 0.01), (1, 0.05 if k >= 30 else 0.01)):  # replica 1 degrades 5x at round 30
            ts = [fleet.begin(i) for _ in range(int(g.limits[i]))]
            clock._now += dt
            for t in ts:
                fleet.first_token(t)
                fleet.report(t, True)
                fleet.end(t, 1)
            if k >= 30:
                low[i] = min(low[i], fleet.snapshot().limits[i])
    assert low[1] < 0.5 * low[0]


def test_back_from_an_ejection_a_replica_takes_one_request_until_it_shows_progress():
    fleet, clock = _fleet()
    g = fleet.guard
    for _ in range(5):
        _attempt(fleet, 1, ok=False)  # 5 consecutive failures: ejected
    assert g.state(1, clock.now())["ejected"] and g.state(1, clock.now())["probation"]
    clock._now = S.max_ejection_time_s + 1.0  # the ejection (and the breaker's sleep) are over
    snap = fleet.snapshot()
    assert snap.blocked_until[1] <= snap.time and snap.limits[1] == S.probation_limit == 1.0
    t = fleet.begin(1)
    assert fleet.snapshot().in_flight[1] >= fleet.snapshot().limits[1]  # the filter admits no second one
    fleet.first_token(t)  # progress: its own limit again
    assert not g.state(1, clock.now())["probation"] and fleet.snapshot().limits[1] == np.floor(g.limiters[1].limit)
    fleet.report(t, True)
    fleet.end(t, 5)
    assert fleet.snapshot().limits[1] > 1.0
