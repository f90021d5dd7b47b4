"""A replica reporting 0 KV blocks (an engine starting, a metric misread): the KV-headroom score gives it no room
(-inf, as numpy's ``need / 0`` did) instead of a ZeroDivisionError from the compiled kernel failing the decision."""

from __future__ import annotations

import math

import numpy as np
import pytest

from steersman.policy import Route
from steersman.policy.framework import build
from steersman.policy.plugin_kernels import kv_headroom, kv_headroom_kernel
from steersman.testing.snapshots import fleet_snapshot, sched_request


def test_no_capacity_is_no_headroom_for_a_request_that_needs_some():
    assert kv_headroom(0.0, 1000.0, 0.5, 3.0) == -math.inf  # the engine's report wins over the modelled blocks
    assert kv_headroom(0.0, 1000.0, 0.5, 0.0) == 0.5  # nothing needed: its free share, as elsewhere
    assert kv_headroom(-4.0, 1000.0, 0.5, 3.0) == -math.inf  # nonsense capacity: no room either
    assert kv_headroom(math.nan, math.nan, 0.5, 3.0) == 0.5  # unknown capacity: + 0
    assert kv_headroom(100.0, math.nan, 0.5, 3.0) == pytest.approx(0.47)
    idx = np.arange(2, dtype=np.intp)
    out = kv_headroom_kernel(idx, np.array([0.0, 100.0]), np.array([10.0, 10.0]), np.array([0.5, 0.5]), 3.0, 0.0,
                             np.empty(2))
    assert out[0] == -math.inf and out[1] == pytest.approx(0.47)


@pytest.mark.parametrize("picker", ["max-score", "slo-cheapest"])
def test_a_profile_scoring_kv_headroom_routes_around_a_replica_reporting_no_blocks(picker):
    profile = build("kv", {"scorers": [{"type": "kv-headroom"}], "picker": picker})
    d = profile.pick(fleet_snapshot(2, kv_blocks_total=[0.0, 1000.0]), sched_request(prompt_tokens=100))
    assert isinstance(d, Route) and d.replica == 1
