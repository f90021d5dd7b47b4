"""A stream resumed on another replica (its replica failed mid-stream) is not new work: the adaptive
concurrency limit and the saturation queue do not hold it back, on the fused path and the plugin path of
every profile; ejection and exclusions still apply."""

from dataclasses import replace

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.policy import Queue, Reject, Route, make_policy
from steersman.policy.baselines import BASELINES
from steersman.testing.snapshots import fleet_snapshot, sched_request

PROFILES = ["steersman", *BASELINES]


def _plugin_path(name):
    p = make_policy(name, DEFAULTS.scheduler)
    p._fast = None  # the plugin-by-plugin path
    return p


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("fused", [True, False])
def test_the_concurrency_limit_holds_new_work_but_not_a_resumed_stream(name, fused):
    policy = make_policy(name, DEFAULTS.scheduler) if fused else _plugin_path(name)
    snap = replace(fleet_snapshot(2, in_flight=[8, 8]), limits=np.array([8.0, 8.0]))
    new = replace(sched_request(), excluded=frozenset({0}))
    assert isinstance(policy.pick(snap, new), Queue)
    d = policy.pick(snap, replace(new, resumed=True))
    assert isinstance(d, Route) and d.replica == 1  # not the excluded one
    ejected = replace(snap, blocked_until=np.array([0.0, 1e9]))
    # the one replica not excluded is ejected: panic (the reliability filter), the exclusion still holds
    d = policy.pick(ejected, replace(new, resumed=True))
    assert isinstance(d, Route) and d.replica == 1
    assert isinstance(policy.pick(ejected, replace(new, resumed=True, excluded=frozenset({0, 1}))), Reject)


@pytest.mark.parametrize("fused", [True, False])
def test_a_saturated_fleet_queues_new_work_but_takes_a_resumed_stream(fused):
    policy = make_policy("steersman", DEFAULTS.scheduler) if fused else _plugin_path("steersman")
    sat = fleet_snapshot(2, waiting=[DEFAULTS.scheduler.saturation_queue_depth + 1] * 2)
    assert isinstance(policy.pick(sat, sched_request()), Queue)
    assert isinstance(policy.pick(sat, replace(sched_request(), resumed=True)), Route)
