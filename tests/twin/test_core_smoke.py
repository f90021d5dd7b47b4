"""The twin's event loop on a tiny hand-made workload (the real generators are tested separately)."""

import random
from dataclasses import dataclass

import numpy as np

from steersman.fleet import snapshot as S
from steersman.policy import make_policy
from steersman.testing import ReplayWorkload
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize


@dataclass(frozen=True, slots=True)
class A:
    time: float
    seq: int
    tenant: str = "t"
    model: str = "llama-3.1-8b"
    prompt_tokens: int = 800
    block_hashes: tuple = ()
    output_tokens: int = 100
    max_tokens: int | None = 100
    slo_class: str | None = None
    deadline_s: float | None = None
    workflow: str | None = None
    step: int | None = None
    steps: int | None = None


def Poisson(rate: float, n: int, seed: int = 0, shared: int = 0) -> ReplayWorkload:
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        hashes = tuple(range(shared)) + tuple(hash((i, j)) for j in range(40 - shared))
        items.append(A(t, i, block_hashes=hashes, prompt_tokens=16 * 40 + 5))
    return ReplayWorkload(items)


def test_twin_runs_and_measures():
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(2)])
    twin = Twin(fleet, Poisson(20.0, 400, shared=30), make_policy("steersman"), cfg=TwinConfig())
    s = summarize(twin.run())
    assert s["requests"] == 400 and s["completed"] == 400 and s["failed"] == 0
    assert 0.005 < s["ttft_s"]["p50"] < 1.0 and 0.005 < s["tpot_s"]["p50"] < 0.05
    assert s["prefix_cache_hit_rate"] > 0.5  # 30 of 40 blocks shared, routed by prefix
    assert 0 < s["gpu_utilisation"] < 1 and s["cost_usd"] > 0 and s["tasks_succeeded"] == 400


def test_kill_drill_fails_in_flight_and_reroutes():
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(2)])
    twin = Twin(fleet, Poisson(20.0, 400), make_policy("least-request"), cfg=TwinConfig())
    twin.schedule_drill(5.0, lambda tw: tw.kill(0))
    s = summarize(twin.run())
    assert 0 < s["failed"] < 40 and s["completed"] == 400 - s["failed"]


def test_the_columns_are_made_with_collection_paused_and_its_state_restored():
    import gc

    fleet = TwinFleet([ReplicaPlan("h0", "H100", "llama-3.1-8b")])
    rec = Twin(fleet, Poisson(20.0, 50), make_policy("least-request"), cfg=TwinConfig()).run()
    seen = []
    real_asarray = np.asarray

    def spy(v, *a, **k):
        seen.append(gc.isenabled())
        return real_asarray(v, *a, **k)

    was = gc.isenabled()
    try:
        for on in (True, False):
            (gc.enable if on else gc.disable)()
            rec._arrays = None
            np.asarray = spy
            try:
                c = rec.arrays()
            finally:
                np.asarray = real_asarray
            assert gc.isenabled() is on  # as the caller left it
            assert seen and not any(seen)  # no collection during the conversion
            assert len(c["arrival"]) == 50 and np.isfinite(c["finish"]).all()
            seen.clear()
    finally:
        (gc.enable if was else gc.disable)()


def test_a_dispatched_requests_deadline_cancels_it_on_its_engine_as_live():
    """The live retry loop races each attempt against its deadline and cancels the engine request when the deadline
    wins (a 504, or a stream ended with an error event); the twin let it run to its end and only scored it late,
    its slot and KV held for the others (architecture audit, thirty-fifth session)."""
    from steersman.twin.results import FAILED, OK

    rng = random.Random(3)
    t, items = 0.0, []
    for i in range(300):
        t += rng.expovariate(60.0)  # an overloaded H100: answers take 6-10 s
        items.append(A(t, i, block_hashes=tuple(hash((i, j)) for j in range(40)), prompt_tokens=645,
                       output_tokens=300, max_tokens=300, deadline_s=8.0 if i % 2 else None))
    fleet = TwinFleet([ReplicaPlan("h0", "H100", "llama-3.1-8b")])
    twin = Twin(fleet, ReplayWorkload(items), make_policy("least-request"), cfg=TwinConfig())
    c = twin.run().arrays()
    timed = np.isfinite(c["deadline"])
    assert timed.sum() == 150
    assert not (timed & (c["status"] == OK) & (c["finish"] > c["deadline"] + 1e-9)).any()  # none served late
    cut = timed & (c["status"] == FAILED)
    assert cut.sum() > 10 and np.allclose(c["finish"][cut], c["deadline"][cut])  # failed at their deadline
    assert ((c["status"] == OK) & timed).sum() > 10  # some made it
    assert (c["status"][~timed] == OK).all()  # the rest ran, on what the cut ones no longer held
    assert not twin.fleet.live[S.IN_FLIGHT].any()  # every cut request's accounting settled


def test_an_engine_that_went_idle_just_after_a_scrape_is_read_idle_within_a_scrape_interval():
    """The twin read a replica's metrics only when it woke, at most once a scrape interval: one that finished its
    last request within 50 ms of a read kept reading busy (running 1) until it next changed; the live scraper
    reads every interval (architecture audit, thirty-fifth session)."""
    fleet = TwinFleet([ReplicaPlan("h0", "H100", "llama-3.1-8b")])
    twin = Twin(fleet, ReplayWorkload([A(0.0, 0, output_tokens=3, max_tokens=3)]), make_policy("least-request"),
                cfg=TwinConfig())
    twin.run()
    assert twin.fleet.live[S.RUNNING][0] == 0 and twin.fleet.live[S.KV_USAGE][0] == 0


def test_brown_out_moves_and_sheds_sheddable_traffic_in_the_twin_as_live():
    """The live gateway's brownout stage moved sheddable requests of a saturated model to its cheaper model, or shed
    them; the twin never asked it, so `reliability.brownout_*` changed nothing a simulation showed (architecture
    audit, thirty-fifth session).  Both now ask one BrownoutGate."""
    from dataclasses import replace

    from steersman.config import DEFAULTS
    from steersman.control import TenantConfig
    from steersman.policy.request import PriorityClass

    def run(models):
        rel = replace(DEFAULTS.reliability, brownout_models=models, brownout_queue_depth=8)
        fleet = TwinFleet([ReplicaPlan("big", "H100", "llama-3.1-8b"), ReplicaPlan("small", "H100", "qwen2.5-7b")])
        rng = random.Random(1)
        t, items = 0.0, []
        for i in range(600):
            t += rng.expovariate(120.0)  # far past one replica's capacity
            items.append(A(t, i, tenant="bulk", block_hashes=tuple(hash((i, j)) for j in range(40)),
                           prompt_tokens=645, output_tokens=200, max_tokens=200))
        twin = Twin(fleet, ReplayWorkload(items), make_policy("steersman"),
                    {"bulk": TenantConfig("bulk", PriorityClass.SHEDDABLE)}, TwinConfig(reliability=rel))
        return twin, twin.run().arrays()

    twin, c = run({"llama-3.1-8b": "qwen2.5-7b"})
    assert twin.brownout_counts["moved"] > 50, twin.brownout_counts
    assert (c["replica"] == 1).sum() >= twin.brownout_counts["moved"] // 2  # the cheaper model's replica served them
    twin, c = run({})  # no cheaper model: shed (503 with Retry-After) before taking a queue place
    assert twin.brownout_counts["shed"] > 50 and twin.brownout_counts["moved"] == 0
    assert (c["http"] == 503).sum() >= twin.brownout_counts["shed"]


def test_a_replica_ejected_for_its_latency_has_its_requests_moved_as_live(monkeypatch):
    """The live retry loop moves an ejected replica's attempts elsewhere (cancelled before their first token,
    continued after it); the twin never set the guard's callback, and a slowed replica kept every request it held
    to its end (architecture audit, thirty-fifth session)."""
    from dataclasses import replace

    from steersman.config import DEFAULTS
    from steersman.twin.replica import SimReplica
    from steersman.twin.results import OK

    rel = replace(DEFAULTS.reliability, latency_floor_ttft_s=0.0, latency_floor_tpot_s=0.0)
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(3)])
    twin = Twin(fleet, Poisson(40.0, 800), make_policy("least-request"), cfg=TwinConfig(reliability=rel))
    twin.schedule_drill(4.0, lambda tw: tw.slow(0, 20.0))
    crossed = []  # (replica, request) where a replica's run reported a request now on another one
    real = SimReplica.wake

    def wake(rep, now):
        res, nxt = real(rep, now)
        for rid in (*res.first_tokens, *res.finished):
            r = twin._reqs.get(rid)
            if r is not None and r.started.replica != rep.index:
                crossed.append((rep.index, rid))
        return res, nxt

    monkeypatch.setattr(SimReplica, "wake", wake)
    c = twin.run().arrays()
    assert twin.fleet.guard.outliers.reasons[0], "the slowed replica was ejected"
    e2e = c["finish"] - c["arrival"]
    assert e2e.max() < 5.0, e2e.max()  # was 17 s: what the slowed replica held finished there, 20x slower
    assert twin.evicted > 0 and not crossed, crossed[:3]  # no result of a cancelled attempt reached its next one
    counts = twin.retries.retrier.counts
    assert counts.get("evicted") + counts.get("continued") >= twin.evicted
    assert (c["status"] == OK).all()  # every moved request was served elsewhere


def test_a_dead_replica_is_not_read_by_a_scrape_deferred_before_it_died():
    """A read deferred to its interval's end ran on an engine killed meanwhile and stamped it idle and fresh; live,
    a dead engine's scrapes fail and its last reading stays (review, thirty-fifth session)."""
    for at in (2.0, 2.013, 2.029, 2.041):
        fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(2)])
        twin = Twin(fleet, Poisson(40.0, 200), make_policy("least-request"), cfg=TwinConfig())
        twin.schedule_drill(at, lambda tw: tw.kill(0))
        twin.run()
        assert twin.fleet.live[S.SCRAPED_AT][0] <= at, at
