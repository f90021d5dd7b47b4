"""Near-equal loads and KV readings tie (``scheduler.balance_tie``, ``scheduler.kv_headroom_tie``).

Ranking two replicas by one request more in a batch of 32, or by a scraped KV reading 0.1% lower, herded
requests in a closed loop (bench/overhead rounds.py: added TTFT p50 +0.43 -> +0.16 ms at 64 streams).
Within the band each model's tied requests take the candidates in turn (a count per model); outside it the least loaded
(or the most KV headroom) still wins, and both decision paths (fused and plugin-by-plugin) agree.
"""

from dataclasses import replace

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.policy import make_policy
from steersman.policy.framework import DecisionContext, Profile, WeightedScorer
from steersman.policy.model_based import SloCheapest
from steersman.policy.plugin_kernels import balance_score, load_balance_kernel
from steersman.policy.scorers import KvHeadroom, LoadBalance
from steersman.testing.snapshots import MODEL, fleet_snapshot, sched_request

POLICY = make_policy("steersman")
S = DEFAULTS.scheduler


def _picks(profile, snap, n=40):
    """Replica chosen for ``n`` consecutive requests on the same snapshot, by both decision paths."""
    fast = [profile.pick(snap, sched_request(seq=k, prompt_tokens=12, expected_output=16)).replica for k in range(n)]
    slow = [profile.decide(profile.context(snap, sched_request(seq=k, prompt_tokens=12, expected_output=16))).replica
            for k in range(n)]
    assert fast == slow
    return fast


def _live(in_flight, kv_usage):
    return dict(in_flight=in_flight, decoding=in_flight, running=in_flight, kv_usage=kv_usage)


def test_defaults_tie_one_request_more_and_a_kv_reading_within_one_percent():
    assert S.balance_tie == 0.15 and S.kv_headroom_tie == 0.01
    picks = _picks(POLICY, fleet_snapshot(2, **_live([31, 32], [0.0020, 0.0021])))
    # the old strict ranking sent every one of them to replica 0 (one request fewer in flight)
    assert picks.count(0) == picks.count(1) == 20
    assert picks[:4] in ([0, 1, 0, 1], [1, 0, 1, 0])


def test_ties_alternate_per_model_when_models_interleave():
    """The gateway's request counter (seq) counts every model's requests: with two models' requests alternating,
    each model's were all even or all odd, and seq's parity sent all of one model's tied requests to one replica
    of its two.  A count of each model's tied decisions alternates them (both paths, as round-robin does)."""
    half = np.arange(4) < 2
    snap = replace(fleet_snapshot(4, **_live([31, 32, 31, 32], [0.0020, 0.0021, 0.0020, 0.0021])),
                   model_masks={MODEL: half, "other": ~half})
    for path in ("pick", "decide"):
        profile = make_policy("steersman")
        order = {MODEL: [], "other": []}
        for seq in range(1, 41):  # the gateway counts from 1
            req = sched_request(seq=seq, model=MODEL if seq % 2 else "other", prompt_tokens=12, expected_output=16)
            d = profile.pick(snap, req) if path == "pick" else profile.decide(profile.context(snap, req))
            order[req.model].append(d.replica)
        assert order[MODEL] == [0, 1] * 10 and order["other"] == [2, 3] * 10, (path, order)


def test_asking_again_for_the_same_request_does_not_advance_the_ties():
    """The gateway's warm-up asks several times with one seq, a reroute asks again for the request it placed:
    the same request keeps its turn, the next one takes the next."""
    profile = make_policy("steersman")
    snap = fleet_snapshot(2, **_live([31, 32], [0.0020, 0.0021]))
    picks = [profile.pick(snap, sched_request(seq=s, prompt_tokens=12, expected_output=16)).replica
             for s in (5, 5, 5, 6, 6, 7)]
    assert picks == [0, 0, 0, 1, 1, 0]


def test_the_tie_counts_are_kept_for_a_bounded_number_of_models():
    picker = SloCheapest(S)
    picker.MAX_MODELS = 2
    pool, total = np.ones(2, dtype=np.bool_), np.ones(2)
    turns = [picker.tie_break(sched_request(seq=k, model=m), pool, total) for k, m in enumerate("abcc")]
    assert turns == [0, 0, 0, 1] and list(picker._ties) == ["b", "c"]  # "a", the longest kept, dropped
    assert picker.tie_break(sched_request(seq=9, model="a"), pool, total) == 0  # starts again


def test_a_real_load_difference_still_decides():
    # 20 vs 33 in flight: (33 + 1) / (20 + 1) is 62% above, far outside the 15% band
    assert set(_picks(POLICY, fleet_snapshot(2, **_live([33, 20], [0.002, 0.002])))) == {1}


def test_a_real_kv_difference_still_decides():
    # equal loads, KV headroom 5 points apart: the emptier cache wins every time
    assert set(_picks(POLICY, fleet_snapshot(2, **_live([8, 8], [0.40, 0.35])))) == {1}


def test_zero_ties_are_the_strict_ranking():
    strict = Profile("strict", [], [WeightedScorer(KvHeadroom(0.0), 1.0), WeightedScorer(LoadBalance(0.0), 1.0)],
                     SloCheapest(S))
    assert strict._fast is not None
    assert set(_picks(strict, fleet_snapshot(2, **_live([31, 32], [0.0020, 0.0020])))) == {0}
    assert set(_picks(strict, fleet_snapshot(2, **_live([32, 32], [0.0021, 0.0020])))) == {1}


def test_band_edges_and_min_max_outside():
    idx = np.arange(4, dtype=np.intp)
    loads = np.array([20.0, 23.0, 24.0, 40.0])  # band: (20 + 1) x 1.15 - 1 = 23.15
    out = load_balance_kernel(idx, loads, np.zeros(4), 0.15, np.empty(4))
    assert out.tolist() == [1.0, 1.0, (40 - 24) / 20, 0.0]
    assert load_balance_kernel(idx, loads, np.zeros(4), 0.0, np.empty(4)).tolist() == [1.0, 17 / 20, 16 / 20, 0.0]
    assert np.isnan(load_balance_kernel(idx, np.array([1.0, np.nan, 2.0, 3.0]), np.zeros(4), 0.15, np.empty(4))).all()
    assert balance_score(5.0, 5.0, 5.0, 5.0) == 1.0  # every load equal


def test_kv_headroom_ties_within_the_band_and_keeps_nan():
    snap = fleet_snapshot(4, kv_usage=[0.100, 0.105, 0.130, np.nan], kv_blocks_total=1000.0)
    ctx = DecisionContext(snap, sched_request(prompt_tokens=0, expected_output=0), np.arange(4, dtype=np.intp))
    s = KvHeadroom(0.01).score(ctx)
    assert s[0] == s[1] == pytest.approx(0.9) and s[2] == pytest.approx(0.87) and np.isnan(s[3])
    strict = KvHeadroom(0.0).score(ctx)
    assert strict[1] < strict[0]


@pytest.mark.parametrize("bad", [-0.1, float("nan")])
def test_a_negative_tie_is_refused(bad):
    with pytest.raises(ValueError, match="tie"):
        LoadBalance(bad)
    with pytest.raises(ValueError, match="tie"):
        KvHeadroom(bad)
    with pytest.raises(ValueError, match="tie"):
        KvHeadroom(1.0)


def test_fleet_settings_refuse_bad_ties():
    from dataclasses import replace

    with pytest.raises(ValueError, match="balance_tie"):
        replace(S, balance_tie=-0.5)
    with pytest.raises(ValueError, match="kv_headroom_tie"):
        replace(S, kv_headroom_tie=1.0)
    assert replace(S, balance_tie=0.0, kv_headroom_tie=0.0).balance_tie == 0.0
