"""Cascade drill in the twin: the same mechanisms on the virtual clock take a 5x degraded replica out of rotation."""

import random
from dataclasses import dataclass, replace

from steersman.config import DEFAULTS
from steersman.policy import make_policy
from steersman.testing import ReplayWorkload
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize


@dataclass(frozen=True, slots=True)
class _A:  # the twin's arrival shape
    time: float
    seq: int
    tenant: str = "t"
    model: str = "llama-3.1-8b"
    prompt_tokens: int = 645
    block_hashes: tuple = ()
    output_tokens: int = 100
    max_tokens: int | None = 100
    slo_class: str | None = None
    deadline_s: float | None = None
    workflow: str | None = None
    step: int | None = None
    steps: int | None = None


def Poisson(rate: float, n: int, seed: int = 0) -> ReplayWorkload:
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        items.append(_A(t, i, block_hashes=tuple(hash((i, j)) for j in range(40))))
    return ReplayWorkload(items)


def _run(reliability):
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(3)])
    twin = Twin(fleet, Poisson(30.0, 900), make_policy("round-robin"), cfg=TwinConfig(reliability=reliability))
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
