"""Fleet snapshots share the fleet's arrays until the fleet's next write (copy on write), and stay frozen."""

import gc

import numpy as np
import pytest

from steersman.engines.base import EngineMetrics
from steersman.fleet import snapshot as S
from steersman.fleet.state import Fleet, Replica
from steersman.testing.clock import FakeClock


def _fleet(n: int = 3) -> Fleet:
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "engine-sim", "H100", ("m",), "p", 2.0, 1, adapter=None)
            for i in range(n)]
    return Fleet(reps, FakeClock(start=10.0))


def test_a_snapshot_keeps_what_it_saw_after_every_kind_of_write():
    f = _fleet()
    s1 = f.snapshot()
    s2 = f.snapshot()  # two alive at once
    t = f.begin(0, uncached=100, blocks=4)
    assert s1.in_flight.tolist() == [0, 0, 0] and s2.in_flight.tolist() == [0, 0, 0]
    assert f.in_flight.tolist() == [1, 0, 0]
    s3 = f.snapshot()
    f.clock.set(f.clock.now() + 0.5)  # (FakeClock.advance is async; no sleepers here)
    f.first_token(t)
    f.end(t, 10)
    f.observe_prefix(1, 10, 5)
    f.update_metrics(2, EngineMetrics(3, 1, 0.5, 10, 5, "loading", 1000))
    f.set_healthy(1, False)
    assert s3.in_flight.tolist() == [1, 0, 0] and s3.pending_prefill[0] == 100
    assert s3.running[2] == 0 and s3.healthy.all() and s3.routable.all() and s3.prefix_accuracy[1] == 1.0
    assert s1.recent_tokens[0] == 0 and s3.recent_tokens[0] > 0
    now = f.snapshot()
    assert now.in_flight.tolist() == [0, 0, 0] and now.running[2] == 3
    assert now.healthy.tolist() == [True, False, True] and now.routable.tolist() == [True, False, False]
    assert now.prefix_accuracy[1] < 1.0  # learned (EWMA towards 0.5)
    for snap in (s1, s3, now):
        for a in (snap.live, snap.healthy, snap.routable, snap.recent_at):
            with pytest.raises(ValueError):
                a[0] = 1


def test_a_dropped_snapshot_costs_no_copy():
    f = _fleet()
    live = f.live
    snap = f.snapshot()
    assert np.shares_memory(snap.live, live)  # no copy taken
    del snap
    gc.collect()
    f.begin(1)
    assert f.live is live and f.live[S.IN_FLIGHT, 1] == 1 and f.live.flags.writeable
    kept = f.snapshot()
    f.begin(1)
    assert not np.shares_memory(kept.live, f.live) and kept.in_flight[1] == 1 and f.in_flight[1] == 2
