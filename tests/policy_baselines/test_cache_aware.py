"""SGLang cache-aware, llm-d, Dynamo KV router and Preble E2 on hand-built snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from baselinehelpers import BS, chain, index, request, snapshot

from steersman.config import DEFAULTS
from steersman.policy import POLICIES, SCORERS
from steersman.policy.baselines import dynamo, preble
from steersman.policy.baselines.common import prefill_s_per_token
from steersman.policy.framework import DecisionContext

SYS = chain("system", 40)  # a 640-token system prompt
USER = chain("user", 10)


def make(name):
    return POLICIES.get(name)(DEFAULTS.scheduler)


def ctx_for(snap, req):
    return DecisionContext(snap, req, snap.candidates(req.model))


# ---- SGLang cache-aware ---------------------------------------------------------------------------
def test_sglang_goes_to_the_prefix_holder_when_balanced():
    idx = index(4, {2: SYS + USER})
    snap = snapshot(4, prefix=idx, in_flight=[0, 1, 30, 2])  # 30 - 0 < 64: balanced
    d = make("sglang-cache-aware").pick(snap, request(5, SYS + USER))
    assert d.replica == 2 and "prefix match" in d.reason


def test_sglang_goes_to_the_least_loaded_when_imbalanced():
    idx = index(4, {2: SYS + USER})
    snap = snapshot(4, prefix=idx, in_flight=[10, 3, 100, 20])  # 97 > 64 and 100 > 1.5 x 3
    d = make("sglang-cache-aware").pick(snap, request(5, SYS + USER))
    assert d.replica == 1 and "imbalanced" in d.reason


def test_sglang_imbalance_needs_both_thresholds():
    idx = index(3, {0: SYS})
    # max - min = 70 > 64 but 300 < 1.5 x 230: still balanced, so the cache rule applies
    snap = snapshot(3, prefix=idx, in_flight=[300, 230, 260])
    assert make("sglang-cache-aware").pick(snap, request(1, SYS + USER)).replica == 0


def test_sglang_low_match_goes_to_the_smallest_tree():
    idx = index(3, {0: chain("a", 50), 1: chain("b", 5), 2: chain("c", 20) + SYS[:2]})
    snap = snapshot(3, prefix=idx, in_flight=[0, 0, 0])
    # replica 2 holds 2 of 50 blocks (4% <= 30%): the smallest tree (replica 1) wins
    d = make("sglang-cache-aware").pick(snap, request(0, SYS[:2] + chain("new", 48)))
    assert d.replica == 1 and "smallest tree" in d.reason


# ---- llm-d ----------------------------------------------------------------------------------------
def test_llmd_scorers_follow_the_published_formulas():
    idx = index(3, {1: SYS + USER, 2: SYS})
    snap = snapshot(3, prefix=idx, waiting=[4, 0, 2], kv_usage=[0.5, 0.9, 0.2])
    ctx = ctx_for(snap, request(0, SYS + USER))
    np.testing.assert_allclose(SCORERS.get("queue-depth")().score(ctx), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(SCORERS.get("kv-utilization")().score(ctx), [0.5, 0.1, 0.8])
    np.testing.assert_allclose(SCORERS.get("prefix-match-fraction")().score(ctx), [0.0, 1.0, 0.8])
    equal = ctx_for(snapshot(3, waiting=[3, 3, 3]), request(0))
    np.testing.assert_allclose(SCORERS.get("queue-depth")().score(equal), [1.0, 1.0, 1.0])


def test_llmd_weights_trade_prefix_against_load():
    pol = make("llm-d")
    idx = index(3, {0: SYS + USER})
    req = request(0, SYS + USER)
    # holder: 3x1 + 2x0 + 2x0.5 = 4.0; idle replica 1: 0 + 2x1 + 2x0.9 = 3.8 -> the holder wins
    assert pol.pick(snapshot(3, prefix=idx, waiting=[6, 0, 3], kv_usage=[0.5, 0.1, 0.5]), req).replica == 0
    # with a full KV cache on the holder: 3 + 0 + 2x0.05 = 3.1 < 3.8 -> the idle replica wins
    assert pol.pick(snapshot(3, prefix=idx, waiting=[6, 0, 3], kv_usage=[0.95, 0.1, 0.5]), req).replica == 1


# ---- Dynamo KV router ---------------------------------------------------------------------------
def test_dynamo_cost_is_weighted_prefill_plus_decode_blocks():
    idx = index(3, {0: SYS, 1: SYS[:10]})
    snap = snapshot(3, prefix=idx, active_blocks=[300, 100, 150])
    req = request(0, SYS + USER, prompt_tokens=50 * BS + 8)  # 51 blocks incl. a partial one
    ctx = ctx_for(snap, req)
    isl = 50 * BS + 8
    expected = []
    for overlap, active in ((40, 300), (10, 100), (0, 150)):
        prefill = (isl - overlap * BS) / BS
        decode = active + (51 - overlap)
        expected.append(1.0 * prefill + decode)
    np.testing.assert_allclose(dynamo.cost(ctx), expected)
    assert make("dynamo-kv").pick(snap, req).replica == int(np.argmin(expected)) == 1


def test_dynamo_counts_the_prefill_queued_on_each_worker():
    """Dynamo's potential prefill tokens are the request's uncached ones plus the worker's ``active_tokens``: the
    prompt tokens of its requests whose prefill has not finished (sequence.rs ``potential_blocks_and_tokens``);
    ours are the gateway's pending prefill there.  A worker 40,000 tokens behind is not as cheap as an idle one."""
    idx = index(2, {0: SYS})
    snap = snapshot(2, prefix=idx, active_blocks=[100, 100], pending_prefill=[40_000, 500])
    req = request(0, SYS + USER)
    isl = 50 * BS
    expected = [(isl - 40 * BS + 40_000) / BS + 100 + 10, (isl + 500) / BS + 100 + 50]
    np.testing.assert_allclose(dynamo.cost(ctx_for(snap, req)), expected)
    assert make("dynamo-kv").pick(snap, req).replica == 1  # the holder's prefill queue outweighs its cache hit
    idle = snapshot(2, prefix=idx, active_blocks=[100, 100])
    assert make("dynamo-kv").pick(idle, req).replica == 0  # nothing queued: the cache hit wins


def test_dynamo_weight_moves_the_balance_between_cache_and_load():
    idx = index(2, {0: SYS + USER})
    snap = snapshot(2, prefix=idx, active_blocks=[150, 60])
    req = request(0, SYS + USER)
    # weight 1: holder 0 + 150 = 150 vs 50 + (60 + 50) = 160 -> holder; weight 0: least active blocks
    assert dynamo.KvRouterCost(1.0).pick(ctx_for(snap, req)).replica == 0
    assert dynamo.KvRouterCost(0.0).pick(ctx_for(snap, req)).replica == 1
    # a busier holder: weight 1 -> 250 vs 160, the other replica; weight 3 -> 250 vs 260, the holder
    busier = snapshot(2, prefix=idx, active_blocks=[250, 60])
    assert dynamo.KvRouterCost(1.0).pick(ctx_for(busier, req)).replica == 1
    assert dynamo.KvRouterCost(3.0).pick(ctx_for(busier, req)).replica == 0


# ---- Preble E2 ------------------------------------------------------------------------------------
def test_e2_exploits_when_the_cached_part_is_larger():
    idx = index(3, {0: SYS, 1: SYS})
    # replicas 0 and 1 hold 40 of 50 blocks: exploit, even though replica 2 is idle; of the two
    # holders the one with less recent work wins
    snap = snapshot(3, prefix=idx, recent_tokens=[50_000, 20_000, 0])
    d = make("preble-e2").pick(snap, request(0, SYS + USER))
    assert d.replica == 1 and "exploit" in d.reason


def test_e2_explores_when_the_uncached_part_is_larger():
    idx = index(3, {0: SYS[:10]})
    snap = snapshot(3, prefix=idx, recent_tokens=[0, 30_000, 5_000])
    req = request(0, SYS + USER)  # 10 of 50 blocks cached: explore
    ctx = ctx_for(snap, req)
    load, s_tok = preble.load_cost(ctx)
    cost = load + (req.prompt_tokens - np.array([10, 0, 0]) * BS) * s_tok
    d = make("preble-e2").pick(snap, req)
    assert "explore" in d.reason and d.replica == int(np.argmin(cost)) == 0
    # with replica 0 busy enough the explore cost sends the request elsewhere despite the partial hit
    busy = snapshot(3, prefix=idx, recent_tokens=[60_000, 30_000, 5_000])
    assert make("preble-e2").pick(busy, req).replica == 2


def test_e2_prices_load_in_time_with_the_roofline():
    snap = snapshot(2, recent_tokens=[1000, 0], decoding=[0, 4], tpot_ewma=[np.nan, 0.02])
    ctx = ctx_for(snap, request(0, expected_output=100))
    load, s_tok = preble.load_cost(ctx)
    s = prefill_s_per_token(snap.statics)
    assert 1e-5 < s[0] < 1e-3  # an 8B model prefills 1k-100k tokens/s on an H100
    np.testing.assert_allclose(load, [1000 * s[0], 4 * 100 * 0.02])


@pytest.mark.parametrize("name", ["sglang-cache-aware", "llm-d", "dynamo-kv", "preble-e2"])
def test_cache_aware_profiles_work_without_an_index(name):
    snap = snapshot(3, in_flight=[2, 0, 1])
    assert make(name).pick(snap, request(0, SYS)).replica in (0, 1, 2)


@pytest.mark.parametrize("name", ["sglang-cache-aware", "llm-d", "dynamo-kv", "preble-e2"])
def test_cache_aware_profiles_map_candidates_back_to_replicas(name):
    """With some replicas out, the features and rows are sliced to the candidates consistently."""
    idx = index(5, {1: SYS + USER, 3: SYS + USER})
    snap = snapshot(5, prefix=idx, routable=[True, False, True, True, True], in_flight=[0, 0, 0, 1, 0],
                    active_blocks=[50, 0, 50, 60, 50], recent_tokens=[0, 0, 0, 100, 0])
    assert make(name).pick(snap, request(3, SYS + USER)).replica == 3  # the routable holder


def test_prefix_match_feature_is_computed_once_per_decision():
    idx = index(3, {0: SYS})
    calls = []
    match = idx.match
    idx.match = lambda hs: calls.append(1) or match(hs)
    snap = snapshot(3, prefix=idx)
    make("llm-d").pick(snap, request(0, SYS + USER))
    assert len(calls) == 1


def test_nan_costs_never_win():
    from steersman.policy.baselines.common import choose_min

    ctx = ctx_for(snapshot(3), request(4))
    assert choose_min(ctx, np.array([np.nan, 2.0, 1.0]), "x").replica == 2
    assert choose_min(ctx, np.array([np.nan, np.nan, np.nan]), "x").replica == 4 % 3


def test_reused_scorers_follow_filters_that_ran_first():
    """In a profile with a filter ahead of them, the shared feature lines up with the survivors."""
    from steersman.policy.framework import FILTERS, MaxScore, Profile, WeightedScorer

    class DropFirstTwo:
        name = "drop-first-two"

        def filter(self, ctx):
            return ctx.candidates >= 2

    idx = index(5, {1: SYS + USER, 3: SYS})
    prof = Profile("t", [DropFirstTwo()], [WeightedScorer(SCORERS.get("prefix-match-fraction")(), 1.0)], MaxScore())
    assert prof.pick(snapshot(5, prefix=idx), request(0, SYS + USER)).replica == 3
    assert "drop-first-two" not in FILTERS
