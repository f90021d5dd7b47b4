"""The fused decision path (steersman.policy.fastpath) against the plugin-by-plugin one: same decisions,
same per-plugin latency observations, and only for profiles made of the plugins it knows."""

from __future__ import annotations

import itertools

import pytest
from replayscenarios import describe, random_cases

from steersman.config import DEFAULTS
from steersman.policy import PLUGIN_LATENCY, make_policy
from steersman.policy.framework import MaxScore, Profile, WeightedScorer, build
from steersman.policy.model_based import SloCheapest
from steersman.policy.saturation import Saturation
from steersman.policy.scorers import CostEfficiency, FitsKv, KvHeadroom, LoadBalance, PrefixAffinity, Shortlist

CASES = list(itertools.islice(random_cases(), 900))


def _variants() -> dict[str, Profile]:
    s = DEFAULTS.scheduler
    return {
        "steersman": make_policy("steersman"),
        # other orders, weights, shortlist sizes, no saturation hook: the fused path follows the profile
        "reordered": Profile("reordered", [FitsKv(), Shortlist(8)],
                             [WeightedScorer(LoadBalance(), 0.5), WeightedScorer(PrefixAffinity(), 3.0),
                              WeightedScorer(KvHeadroom(), 0.0)], SloCheapest(s)),
        "two-shortlists": Profile("two-shortlists", [Shortlist(64), FitsKv(), Shortlist(4)],
                                  [WeightedScorer(KvHeadroom(), 1.0)], SloCheapest(s), Saturation(s)),
        "yaml": build("yaml", {"filters": [{"type": "shortlist", "params": {"k": 16}}, "fits-kv"],
                               "scorers": [{"type": "prefix-affinity", "weight": 2}], "picker": "slo-cheapest",
                               "queue_when_saturated": True}, Saturation(s)),
    }


def _counts() -> dict[str, int]:
    return {k[0]: h.count for k, h in PLUGIN_LATENCY._children.items()}


@pytest.mark.parametrize("name", list(_variants()))
def test_fused_path_decides_and_observes_as_the_plugins_do(name):
    # two of the profile: its picker counts each model's tied decisions (SloCheapest.tie_break), so each path
    # starts from none, as the other did
    profile, plugins = _variants()[name], _variants()[name]
    assert profile._fast is not None
    before = _counts()
    fast = [describe(profile.pick(snap, req)) for snap, req in CASES]
    mid = _counts()
    slow = [describe(plugins.decide(plugins.context(snap, req))) for snap, req in CASES]
    after = _counts()
    diff = [(a, b) for a, b in zip(slow, fast) if a != b]
    assert not diff, f"{len(diff)} of {len(CASES)} decisions differ, e.g. plugins {diff[0][0]!r} fused {diff[0][1]!r}"
    observed_fast = {k: mid[k] - before.get(k, 0) for k in mid}
    observed_slow = {k: after[k] - mid.get(k, 0) for k in after}
    assert observed_fast == observed_slow
    assert sum(observed_fast.values()) > len(CASES)


def test_profiles_with_other_plugins_take_the_plugin_path():
    s = DEFAULTS.scheduler
    assert Profile("p", [FitsKv()], [WeightedScorer(CostEfficiency(), 1.0)], SloCheapest(s))._fast is None
    assert Profile("p", [FitsKv()], [WeightedScorer(KvHeadroom(), 1.0)], MaxScore())._fast is None
    assert make_policy("llm-d")._fast is None
