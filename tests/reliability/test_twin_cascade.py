"""Cascade drill in the twin: the same mechanisms on the virtual clock take a 5x degraded replica out of rotation."""

from dataclasses import replace

from steersman.config import DEFAULTS
from steersman.policy import make_policy
from steersman.testing import poisson
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize


def _run(reliability):
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(3)])
    twin = Twin(fleet, poisson(30.0, 900), make_policy("round-robin"), cfg=TwinConfig(reliability=reliability))
    twin.schedule_drill(5.0, lambda tw: tw.slow(0, 5.0))
    twin.schedule_drill(20.0, lambda tw: tw.restore(0))
    s = summarize(twin.run())
    return s, twin


def test_the_twin_ejects_a_degraded_replica_and_takes_it_back():
    rel = replace(DEFAULTS.reliability, latency_floor_tpot_s=0.0, latency_floor_ttft_s=0.0)
    s, twin = _run(rel)
    g = twin.fleet.guard
    assert s["failed"] == 0 and s["completed"] == 900
    assert g.outliers.total[0] >= 1 and any(k in g.outliers.reasons[0] for k in ("TPOT", "no first token"))
    assert g.outliers.total[1] == 0 and g.outliers.total[2] == 0
    assert not g.outliers.is_ejected(0, twin.clock.t + 60.0)  # back after base x count (<= 300 s)
