"""The prefix index credits a replica only with what its KV cache can still hold (``scheduler.prefix_residency``).

An engine's prefix cache evicts its least recently used free blocks; the index, left to its own memory budget,
remembers many times more than the engines keep.  With a capacity per replica it counts, from the newest
generation back, the generations whose blocks still fit in that replica's cache (half a straddling one counts).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.state import Fleet, Replica
from steersman.testing.clock import FakeClock

MiB = 1 << 20


def chain(tag: object, n: int) -> list[int]:
    return [hash((tag, i)) for i in range(n)]


def test_a_replica_is_credited_only_with_the_generations_its_cache_holds():
    idx = PrefixIndex(2, 4 * MiB)
    for r in (0, 1):
        idx.set_capacity(r, 1000.0)  # fleet cache 2,000 blocks: generations of 500 (a quarter)
    assert idx.gen_cap == 500
    old = chain("old", 400)
    idx.record(0, old)
    idx.record(1, old)
    assert idx.match(old).tolist() == [400, 400]
    # replica 0 then computes 2,000 other blocks (4 generations): its cache has evicted ``old`` since
    for k in range(4):
        idx.record(0, chain(("new", k), 500))
    got = idx.match(old).tolist()
    assert got[0] == 0, "evicted by the replica's own later work"
    assert got[1] == 400, "replica 1 did nothing since: still held there"
    # what the replica holds: its newest generations only (the view the predictions' residency discount reads)
    assert idx.blocks_view()[0] <= 1000 + 250
    assert idx.blocks_per_replica()[0] == 2400  # the index itself still remembers them all
    assert idx.match(chain(("new", 3), 500)).tolist() == [500, 0]


def test_without_capacities_the_index_is_unchanged():
    a, b = PrefixIndex(2, 4 * MiB), PrefixIndex(2, 4 * MiB)
    b.set_capacity(0, math.nan)  # unknown: no limit
    b.set_capacity(1, 0.0)
    assert a.gen_cap == b.gen_cap
    for idx in (a, b):
        idx.record(0, chain("x", 300))
        for k in range(20):
            idx.record(0, chain(("y", k), 400))
    assert a.match(chain("x", 300)).tolist() == b.match(chain("x", 300)).tolist()
    assert a.blocks_view().tolist() == b.blocks_view().tolist()


def test_a_capacity_removed_credits_everything_again():
    idx = PrefixIndex(1, 4 * MiB)
    idx.set_capacity(0, 400.0)
    idx.record(0, chain("x", 100))
    for k in range(8):
        idx.record(0, chain(("y", k), 100))
    assert idx.match(chain("x", 100)).tolist() == [0]
    idx.set_capacity(0, math.inf)
    assert idx.match(chain("x", 100)).tolist() == [100]


def test_the_mask_follows_every_write_between_matches():
    """The match memo and the mask are refreshed together: a record between two matches of the same prompt
    is seen by the second."""
    idx = PrefixIndex(1, 4 * MiB)
    idx.set_capacity(0, 400.0)  # generations of 256 blocks (the smallest)
    p = chain("p", 100)
    idx.record(0, p)
    assert idx.match(p).tolist() == [100]
    seen = []
    for k in range(6):
        idx.record(0, chain(("q", k), 200))
        seen.append(int(idx.match(p)[0]))
    assert seen[0] == 100 and seen[-1] == 0 and seen == sorted(seen, reverse=True)


def _fleet(kv_blocks_total=None, residency=True) -> Fleet:
    settings = DEFAULTS.scheduler if residency else replace(DEFAULTS.scheduler, prefix_residency=False)
    reps = [Replica(i, f"r{i}", f"http://r{i}.invalid", "engine-sim", "H100", ("llama-3.1-8b",), "p", 2.0, 1,
                    adapter=None) for i in range(2)]
    fleet = Fleet(reps, FakeClock(start=1.0), settings)
    fleet.prefix = PrefixIndex(2, 8 * MiB)
    return fleet


def test_the_fleet_gives_the_index_each_replicas_modelled_then_reported_cache():
    fleet = _fleet()
    modelled = fleet.statics.kv_blocks
    assert np.isfinite(modelled).all()
    assert fleet.prefix._caps.tolist() == modelled.tolist()  # noqa: SLF001
    fleet.update_metrics(1, EngineMetrics(num_running=0, num_waiting=0, kv_usage=0.0, prefix_queries=0,
                                          prefix_hits=0, kv_blocks_total=1234.0))
    assert fleet.prefix._caps.tolist() == [modelled[0], 1234.0]  # noqa: SLF001
    fleet.prefix_residency = False  # a profile modelling a router that knows nothing of evictions
    assert np.isinf(fleet.prefix._caps).all()  # noqa: SLF001
    fleet.prefix_residency = True
    assert fleet.prefix._caps.tolist() == [modelled[0], 1234.0]  # noqa: SLF001


def test_the_setting_turns_it_off():
    fleet = _fleet(residency=False)
    assert np.isinf(fleet.prefix._caps).all()  # noqa: SLF001
    fleet.update_metrics(0, EngineMetrics(num_running=0, num_waiting=0, kv_usage=0.0, prefix_queries=0,
                                          prefix_hits=0, kv_blocks_total=99.0))
    assert np.isinf(fleet.prefix._caps).all()  # noqa: SLF001


@pytest.mark.parametrize("policy, on", [("steersman", True), ("llm-d", True), ("sglang-cache-aware", False)])
def test_each_profile_sees_the_index_as_its_router_would(policy, on):
    """sglang-router's radix tree evicts by its own size, not the engines' (the twin's baseline must not know
    better); llm-d (GIE caps each server's LRU), Dynamo (KV events) and steersman know what engines hold."""
    from steersman.fleet.config import parse_fleet
    from steersman.policy import make_policy
    from steersman.twin.core import Twin
    from steersman.twin.fleet import TwinFleet

    cfg = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 2}]}})
    twin = Twin(TwinFleet.from_config(cfg), iter(()), make_policy(policy, cfg.scheduler))
    assert twin.fleet.prefix_residency is on
    assert bool(np.isfinite(twin.fleet.prefix._caps).all()) is on  # noqa: SLF001


def _evicted_on_replica_0() -> tuple[PrefixIndex, list[int]]:
    """An index where replica 0 was sent ``old`` and has since computed four generations of other work."""
    idx = PrefixIndex(2, 4 * MiB)
    for r in (0, 1):
        idx.set_capacity(r, 1000.0)
    old = chain("old", 400)
    idx.record(0, old)
    for k in range(4):
        idx.record(0, chain(("new", k), 500))
    return idx, old


def test_the_raw_match_still_credits_what_the_replica_was_sent():
    idx, old = _evicted_on_replica_0()
    assert idx.match(old).tolist() == [0, 0]
    assert idx.match_raw(old).tolist() == [400, 0]
    assert idx.match_raw(old) is idx.match_raw(old)  # memoised until the next write
    fresh = chain(("new", 3), 500)
    assert idx.match_raw(fresh).tolist() == idx.match(fresh).tolist() == [500, 0]
    roomy = PrefixIndex(2, 4 * MiB)
    roomy.record(0, old)
    assert roomy.match_raw(old) is roomy.match(old)  # nothing evicted: one match


def test_a_workflow_goes_back_to_the_replica_that_evicted_its_context_and_is_predicted_to_compute_it():
    """The holders-first rule reads the raw match (the request's later calls will find there what this one
    computes), the prediction the resident one (the whole prompt is computed again): both decision paths."""
    from steersman.policy import make_policy
    from steersman.policy.base import Route
    from steersman.testing.snapshots import fleet_snapshot, sched_request

    idx, old = _evicted_on_replica_0()
    snap = fleet_snapshot(["H100", "H100"], prefix=idx, in_flight=[1, 0])
    req = sched_request(hashes=old, expected_output=50)
    profile = make_policy("steersman")
    fused, plugins = profile.pick(snap, req), profile.decide(profile.context(snap, req))
    assert isinstance(fused, Route) and fused == plugins
    assert fused.replica == 0
    def ttft0(index) -> float:  # the predicted TTFT on replica 0
        return float(profile.context(fleet_snapshot(["H100", "H100"], prefix=index, in_flight=[1, 0]), req)
                     .feature("prediction").ttft[0])

    roomy = PrefixIndex(2, 4 * MiB)
    roomy.record(0, old)
    assert ttft0(idx) == pytest.approx(ttft0(None))  # evicted: predicted as computed again
    assert ttft0(roomy) < 0.5 * ttft0(None)  # held: its prefill mostly skipped


def test_a_match_of_no_blocks_after_a_write_leaves_no_stale_mask():
    idx = PrefixIndex(1, 4 * MiB)
    idx.set_capacity(0, 400.0)
    idx.record(0, chain("x", 100))
    assert idx.blocks_view().tolist() == [100]
    for k in range(8):
        idx.record(0, chain(("y", k), 100))
    idx.match(())  # nothing to look up: the mask must still follow the writes before it
    assert idx.blocks_per_replica().tolist() == [900]
    assert idx.blocks_view()[0] < 600
    assert idx.match(chain("x", 100)).tolist() == [0]


def _generations(idx: PrefixIndex, hashes: list[int]) -> list[int]:
    """The generation of each block (all of them indexed)."""
    from steersman.fleet import _prefix_table as T

    return [int(T._packed(idx._tab, h, idx._shift, idx._mask)) & 255 for h in hashes]  # noqa: SLF001


def test_a_record_cut_by_a_rotation_is_moved_whole_by_the_next_one():
    """A record cut at a generation boundary leaves its first blocks in the older generation: the next record of
    that prompt must bring them to the newest too (a binary search over "held in the newest" assumed a leading
    run, skipped them, and the replica's cache was then predicted to have evicted the prompt it was just sent)."""
    idx = PrefixIndex(1, 4 * MiB)
    idx.set_capacity(0, 300.0)  # generations of 256 blocks
    assert idx.gen_cap == 256
    idx.record(0, chain("filler", 240))
    p = chain("p", 100)
    idx.record(0, p)  # p[:16] closes the first generation, p[16:] opens the second
    assert _generations(idx, p) == [idx._order[0]] * 16 + [idx._order[1]] * 84  # noqa: SLF001
    idx.record(0, p)  # the hot prompt again: all of it in the newest generation now
    assert _generations(idx, p) == [idx._order[-1]] * 100  # noqa: SLF001
    idx.record(0, chain("other", 100))  # the first generation no longer fits in the replica's cache
    idx.record(0, p)
    assert idx.match(p).tolist() == [100]


def test_a_replica_of_unknown_size_leaves_the_known_ones_their_generations():
    """An unknown capacity (inf, NaN) is no limit on its replica: it must not make the generations as large as the
    budget, in which a known replica sent more than twice its cache was credited with nothing, even its last prompt."""
    idx = PrefixIndex(2, 128 * MiB)
    idx.set_capacity(0, 1000.0)
    idx.set_capacity(1, math.nan)
    assert idx.gen_cap == 256  # a quarter of the known cache (at least the smallest generation)
    first = chain(("old", 0), 25)
    for q in range(100):
        idx.record(0, chain(("old", q), 25))  # 2,500 blocks sent to replica 0
    p = chain("p", 30)
    idx.record(0, p)
    assert idx.match(p).tolist() == [30, 0]
    assert idx.match(first).tolist() == [0, 0]  # long evicted by the replica's own later work
    assert 0 < idx.blocks_view()[0] <= 1000 + 256


def test_a_small_replica_beside_a_large_one_is_cut_at_its_own_size():
    """Uneven capacities: the generations, a quarter of the fleet's cache, are each many times the small replica's
    cache; one replica's blocks in a generation stop at half its cache, so the mask cuts it that fine too."""
    idx = PrefixIndex(2, 128 * MiB)
    idx.set_capacity(0, 100_000.0)
    idx.set_capacity(1, 1000.0)
    assert idx.gen_cap == 25_250
    first = chain(("old", 0), 25)
    for q in range(100):
        idx.record(1, chain(("old", q), 25))
    p = chain("p", 30)
    idx.record(1, p)
    assert idx.match(p).tolist() == [0, 30]
    assert idx.match(first).tolist() == [0, 0]
    assert idx.blocks_view()[1] <= 1000 + 500


def test_the_newest_generation_of_a_replica_always_counts():
    """A replica whose blocks in the newest generation outgrow twice its cache (a cache under the smallest
    generation) still holds the last blocks it was sent."""
    idx = PrefixIndex(1, 4 * MiB)
    idx.set_capacity(0, 100.0)
    for q in range(10):
        idx.record(0, chain(("q", q), 25))  # 250 blocks: one generation
    p = chain("p", 5)
    idx.record(0, p)
    assert idx.match(p).tolist() == [5]


def test_generations_never_outgrow_the_budgets_table():
    """A small budget (its largest generation under the smallest one for a KV cache): capacities must not raise
    the generations past what its table holds half full (the table filled, and a lookup probed it for ever)."""
    idx = PrefixIndex(2, 0.05 * MiB)
    idx.set_capacity(0, 1000.0)
    idx.set_capacity(1, 1000.0)
    assert idx.gen_cap == idx._max_gen_cap == 64  # noqa: SLF001
    assert 2 * idx.capacity <= idx._max_slots  # noqa: SLF001


def test_replicas_whose_models_are_listed_late_give_the_index_their_capacity():
    """A fleet file without ``models:``: the models (and so the modelled KV capacity) come from ``/v1/models`` after
    the index is attached; the index must take them (it kept "unknown: no limit", residency off for them)."""
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "openai", "H100", (), "p", 2.0, 1, adapter=None)
            for i in range(2)]
    fleet = Fleet(reps, FakeClock(start=0.0))
    fleet.prefix = PrefixIndex(2, 8 << 20)
    assert not np.isfinite(fleet.prefix._caps).any()
    for i in range(2):
        fleet.set_models(i, ["llama-3.1-8b"])
    assert np.isfinite(fleet.statics.kv_blocks).all()
    assert fleet.prefix._caps.tolist() == fleet.statics.kv_blocks.tolist()
