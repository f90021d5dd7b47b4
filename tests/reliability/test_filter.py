"""The reliability filter runs first in every profile, baselines included."""

import numpy as np
import pytest

from steersman.policy import POLICIES, Queue, Reject, Route, make_policy
from steersman.testing.snapshots import fleet_snapshot, sched_request
from dataclasses import replace


def _snap(**kw):
    base = dict(time=100.0)
    base.update(kw)
    return replace(fleet_snapshot(3, **{k: v for k, v in base.items() if k in ("time", "in_flight")}),
                   blocked_until=kw.get("blocked_until"), limits=kw.get("limits"))


@pytest.mark.parametrize("name", sorted(POLICIES.names()))
def test_every_profile_avoids_blocked_and_excluded_replicas(name):
    policy = make_policy(name)
    blocked = np.array([np.inf, 0.0, 0.0])  # replica 0 ejected / breaker open
    for seq in range(12):
        req = replace(sched_request(seq), excluded=frozenset({1}))
        d = policy.pick(_snap(blocked_until=blocked), req)
        assert isinstance(d, Route) and d.replica == 2, (name, d)


@pytest.mark.parametrize("name", sorted(POLICIES.names()))
def test_concurrency_limited_fleet_queues_and_a_blocked_one_panics(name):
    policy = make_policy(name)
    d = policy.pick(_snap(in_flight=[3.0, 5.0, 4.0], limits=np.array([3.0, 5.0, 4.0])), sched_request(1))
    assert isinstance(d, Queue), (name, d)
    d = policy.pick(_snap(in_flight=[3.0, 1.0, 4.0], limits=np.array([3.0, 5.0, 4.0])), sched_request(1))
    assert isinstance(d, Route) and d.replica == 1
    # every replica out of rotation: panic (Envoy's), the guard's blocks are ignored, a retry's exclusions are not
    d = policy.pick(_snap(blocked_until=np.array([130.0, 104.0, np.inf])), replace(sched_request(1), excluded=frozenset({0})))
    assert isinstance(d, Route) and d.replica in (1, 2), (name, d)
    d = policy.pick(_snap(blocked_until=np.array([130.0, 104.0, np.inf])), replace(sched_request(1), excluded=frozenset({0, 1, 2})))
    assert isinstance(d, Reject) and d.retry_after == pytest.approx(4.0)
