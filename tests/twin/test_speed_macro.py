"""Macro steps in the twin: runs of identical decode steps jumped over in closed form give the same
per-request times as stepping the engine one step at a time."""

import random
from dataclasses import dataclass

import numpy as np
import pytest

from steersman.policy import make_policy
from steersman.testing import ReplayWorkload
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize
from steersman.twin.results import OK


@dataclass(frozen=True, slots=True)
class _A:
    time: float
    seq: int
    prompt_tokens: int
    block_hashes: tuple
    output_tokens: int
    tenant: str = "t"
    model: str = "llama-3.1-8b"
    max_tokens: int | None = None
    slo_class: str | None = None
    deadline_s: float | None = None
    workflow: str | None = None
    step: int | None = None
    steps: int | None = None


def _Stream(n: int, rate: float, seed: int = 3) -> ReplayWorkload:
    """Poisson arrivals: prompts 200-3,000 tokens (half share one of 4 prefixes), outputs 5-400 tokens."""
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        blocks = rng.randint(12, 187)
        shared = rng.randint(4, 10) if rng.random() < 0.5 else 0
        p = rng.randrange(4)
        hashes = tuple(hash(("p", p, j)) for j in range(shared)) + tuple(hash((i, j)) for j in range(blocks - shared))
        items.append(_A(t, i, blocks * 16 + rng.randrange(16), hashes, rng.randint(5, 400)))
    return ReplayWorkload(items)


def _run(macro: bool, policy: str, drill=None, n: int = 600, rate: float = 14.0):
    fleet = TwinFleet([ReplicaPlan(f"g{i}", gpu, "llama-3.1-8b") for i, gpu in enumerate(("H100", "A100", "H100"))])
    for rep in fleet.replicas:
        rep.macro = macro
    twin = Twin(fleet, _Stream(n, rate), make_policy(policy), cfg=TwinConfig())
    if drill is not None:
        twin.schedule_drill(*drill)
    wakes = 0
    wake = twin._wake

    def counting(i, generation):
        nonlocal wakes
        wakes += 1
        wake(i, generation)

    twin._wake = counting
    rec = twin.run()
    return rec, wakes, [r.engine.num_steps for r in fleet.replicas]


@pytest.mark.parametrize("drill", [None, (12.0, lambda tw: tw.slow(1, 2.5))], ids=["plain", "slowdown"])
def test_macro_runs_give_the_same_per_request_times_as_single_steps(drill):
    one, wakes_one, steps_one = _run(False, "round-robin", drill)
    mac, wakes_mac, steps_mac = _run(True, "round-robin", drill)
    a, b = one.arrays(), mac.arrays()
    assert (a["status"] == OK).all() and (b["status"] == OK).all()
    np.testing.assert_array_equal(a["replica"], b["replica"])
    np.testing.assert_allclose(b["first"], a["first"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(b["finish"], a["finish"], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(a["cached"], b["cached"])
    assert steps_mac == steps_one  # the same engine steps ...
    assert wakes_mac < wakes_one / 3  # ... in far fewer events
    np.testing.assert_allclose(mac.busy, one.busy, rtol=1e-9)
    np.testing.assert_allclose(mac.compute_bound, one.compute_bound, rtol=1e-9, atol=1e-9)
    assert one.compute_bound.sum() > 0  # prefill steps are compute-bound: the split is exercised


def test_slowdown_drill_stretches_the_slowed_replica_only():
    base, _, _ = _run(True, "round-robin")
    slow, _, _ = _run(True, "round-robin", (0.0, lambda tw: tw.slow(1, 3.0)))
    a, b = base.arrays(), slow.arrays()
    e2e_a, e2e_b = a["finish"] - a["arrival"], b["finish"] - b["arrival"]
    on1 = a["replica"] == 1
    assert np.median(e2e_b[on1]) > 2.0 * np.median(e2e_a[on1])
    np.testing.assert_allclose(b["finish"][a["replica"] == 0], a["finish"][a["replica"] == 0], atol=1e-9)


def test_model_aware_policy_results_agree_within_noise():
    """The steersman policy reads scraped engine metrics; macro runs wake replicas less often, so scrapes land
    at other times and a few routing decisions differ -- the aggregate must not move beyond noise."""
    one, _, _ = _run(False, "steersman")
    mac, _, _ = _run(True, "steersman")
    s1, s2 = summarize(one), summarize(mac)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert s2[key]["p50"] == pytest.approx(s1[key]["p50"], rel=0.1), key
    assert s2["prefix_cache_hit_rate"] == pytest.approx(s1["prefix_cache_hit_rate"], abs=0.05)
