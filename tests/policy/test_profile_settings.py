"""A profile reads the fleet file's scheduler settings, wherever it comes from (the ``steersman`` profile or a
custom one under ``scheduler.profiles``); a plugin refusing its parameters is a startup error naming it; and the
``slo-headroom`` scorer ranks the replicas that meet the budget."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.fleet.config import FleetConfigError, make_profile, parse_fleet
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy import make_policy
from steersman.policy.base import Reject, Route
from steersman.policy.framework import DecisionContext, MaxScore, Profile, WeightedScorer, build
from steersman.policy.request import LatencyBudget, PriorityClass
from steersman.policy.scorers import Shortlist, SloHeadroom
from steersman.testing.snapshots import MODEL, fleet_snapshot, sched_request

SCHED = DEFAULTS.scheduler


def _fleet(scheduler: dict) -> object:
    return parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": MODEL, "count": 2}]}, "policy": "mine",
                        "scheduler": scheduler})


# --- custom profiles take the fleet file's scheduler settings ----------------------------------------------------

STRICT = {"balance_tie": 0.0, "kv_headroom_tie": 0.0, "safety_margin": 0.3, "shed_infeasible": ["sheddable", "standard"],
          "hold_late": False}


def test_a_custom_profiles_plugins_take_the_fleet_files_settings():
    cfg = _fleet({**STRICT, "profiles": {"mine": {"scorers": ["load-balance", "kv-headroom"], "picker": "slo-cheapest"}}})
    mine = make_profile("mine", cfg.profiles["mine"], cfg.scheduler)
    assert [ws.scorer.tie for ws in mine.scorers] == [0.0, 0.0]
    assert mine.picker.safety_margin == 0.3 and not mine.picker.hold
    assert {c.name for c in mine.picker.shed} == {"SHEDDABLE", "STANDARD"}
    assert mine.settings is cfg.scheduler
    # a strict balance: loads 10 and 11 are not a tie, every request goes to the less loaded replica
    snap = fleet_snapshot(2, in_flight=[10, 11], decoding=[10, 11], running=[10, 11])
    for s in range(4):
        req = sched_request(seq=s, prompt_tokens=12, expected_output=16)
        assert mine.pick(snap, req).replica == 0 and mine.decide(mine.context(snap, req)).replica == 0
    # an infeasible standard request is shed, as the fleet file says
    late = sched_request(prompt_tokens=2000, budget=LatencyBudget(ttft_s=0.001), priority=PriorityClass.STANDARD)
    d = mine.pick(snap, late)
    assert isinstance(d, Reject) and d.code == "slo_infeasible"


def test_build_takes_the_settings_and_yaml_params_still_win():
    settings = dataclasses.replace(SCHED, balance_tie=0.0, kv_headroom_tie=0.0)
    p = build("p", {"scorers": [{"type": "load-balance", "params": {"tie": 0.4}}, "kv-headroom"]}, settings=settings)
    assert [ws.scorer.tie for ws in p.scorers] == [0.4, 0.0] and p.settings is settings
    assert [ws.scorer.tie for ws in build("p", {"scorers": ["load-balance"]}).scorers] == [SCHED.balance_tie]


def test_the_settings_are_no_yaml_param():
    with pytest.raises(ValueError, match="slo-cheapest.*takes no params"):
        build("p", {"picker": {"type": "slo-cheapest", "params": {"settings": {"safety_margin": 0.1}}}})
    with pytest.raises(ValueError, match="load-balance"):
        build("p", {"scorers": [{"type": "load-balance", "params": {"settings": {}}}]})


# --- the unprofiled model's priors are the profile's -------------------------------------------------------------

def _unprofiled_snap(n: int = 2, **rows):
    snap = fleet_snapshot(n, **rows)
    return dataclasses.replace(snap, statics=build_statics([ReplicaSpec(None, MODEL, 1, 0.0)] * n))


@pytest.mark.parametrize("step,prefill", [(0.05, 0.001), (0.5, 0.01)])
def test_the_unprofiled_priors_of_the_fleet_file_are_used(step, prefill):
    cfg = parse_fleet({"endpoints": [{"url": "http://127.0.0.1:9", "engine": "llamacpp", "models": [MODEL]}],
                       "scheduler": {"unprofiled_decode_step_s": step, "unprofiled_prefill_s_per_token": prefill}})
    policy = make_policy("steersman", cfg.scheduler)
    snap, req = _unprofiled_snap(), sched_request(prompt_tokens=1000, expected_output=100)
    want_ttft = step + 1000 * prefill
    for d in (policy.pick(snap, req), policy.decide(policy.context(snap, req))):
        assert isinstance(d, Route)
        assert np.isclose(d.expected_ttft_s, want_ttft) and np.isclose(d.expected_e2e_s, want_ttft + 100 * step)
    p = DecisionContext(snap, req, snap.candidates(MODEL), settings=cfg.scheduler).feature("prediction")
    assert np.allclose(p.ttft, want_ttft)


def test_the_pooled_tpot_memo_is_keyed_on_the_settings():
    # replica 0 busy but its requests saw a 2.5x lower TPOT; replica 1 idle: pooling sends the request to 1
    snap = _unprofiled_snap(tpot_ratio=[1.0, 2.5], decode_s_token=[0.03, 0.03], prefill_s_token=[0.002, 0.002],
                            in_flight=[3, 0], running=[3, 1], decoding=[2, 0], pending_prefill=[160, 0])
    req = sched_request(prompt_tokens=350, expected_output=16, budget=sched_request().budget)
    pooled, apart = make_policy("steersman"), make_policy("steersman", dataclasses.replace(SCHED, unprofiled_tpot_pool_spread=1.0))
    for _ in range(2):  # one snapshot, the two policies in turn: neither reads the other's memo
        assert pooled.pick(snap, req).replica == 1 and apart.pick(snap, req).replica == 0
        assert pooled.decide(pooled.context(snap, req)).replica == 1
        assert apart.decide(apart.context(snap, req)).replica == 0


# --- a plugin refusing its params fails at startup, named ------------------------------------------------------

@pytest.mark.parametrize("k", [4.5, 8.0, True, "8", 3, None])
def test_shortlist_k_must_be_an_integer_of_at_least_4(k):
    with pytest.raises(ValueError, match="shortlist k must be an integer >= 4"):
        Shortlist(k)
    with pytest.raises(ValueError, match="scheduling filter 'shortlist'"):
        build("p", {"filters": [{"type": "shortlist", "params": {"k": k}}]})


def test_shortlist_k_integer_is_kept_as_an_int():
    assert Shortlist(np.int64(8)).k == 8 and type(Shortlist(np.int64(8)).k) is int


@pytest.mark.parametrize("k", [4.5, 8.0])
def test_a_fleet_file_with_a_fractional_shortlist_k_is_refused_naming_it(k):
    with pytest.raises(FleetConfigError, match=r"scheduler\.profiles\.mine.*shortlist.*integer >= 4"):
        _fleet({"profiles": {"mine": {"filters": [{"type": "shortlist", "params": {"k": k}}],
                                      "scorers": ["load-balance"]}}})


@pytest.mark.parametrize("item,what", [
    ({"type": "fits-kv", "params": {"x": 1}}, "scheduling filter 'fits-kv'"),  # a param it does not take
    ({"type": "load-balance", "params": {"tie": [1]}}, "scheduling scorer 'load-balance'"),  # float([1]): TypeError
    ({"type": "kv-headroom", "params": {"tie": "high"}}, "scheduling scorer 'kv-headroom'"),
])
def test_any_constructor_error_is_a_value_error_naming_the_plugin(item, what):
    key = "filters" if item["type"] == "fits-kv" else "scorers"
    with pytest.raises(ValueError, match=what):
        build("p", {key: [item]})


# --- slo-headroom ranks the replicas that meet the budget --------------------------------------------------------

def test_slo_headroom_ranks_replicas_that_meet_the_budget():
    snap = fleet_snapshot(2, in_flight=[0, 40], running=[0, 40], decoding=[0, 40])
    budget = LatencyBudget(ttft_s=10.0, tpot_s=1.0)  # both replicas meet it; replica 0 by more
    req = sched_request(prompt_tokens=2000, budget=budget)
    ctx = DecisionContext(snap, req, snap.candidates(MODEL))
    p, s = ctx.feature("prediction"), SloHeadroom().score(ctx)
    assert (p.ttft < 10.0).all() and (p.tpot < 1.0).all()
    assert ((0.0 < s) & (s < 1.0)).all() and s[0] > s[1]
    want = np.minimum(1 - p.ttft / 10.0, 1 - p.tpot / 1.0)
    assert np.allclose(s, want)
    profile = Profile("t", [], [WeightedScorer(SloHeadroom(), 1.0)], MaxScore())
    assert {profile.decide(profile.context(snap, sched_request(seq=i, prompt_tokens=2000, budget=budget))).replica
            for i in range(4)} == {0}


def test_slo_headroom_is_0_over_budget_and_1_without_targets():
    snap = fleet_snapshot(2, in_flight=[0, 40], running=[0, 40], decoding=[0, 40])
    for budget, want in ((LatencyBudget(ttft_s=1e-6), 0.0), (LatencyBudget(), 1.0)):
        req = sched_request(prompt_tokens=2000, budget=budget)
        assert np.array_equal(SloHeadroom().score(DecisionContext(snap, req, snap.candidates(MODEL))), [want, want])
    spent = sched_request(prompt_tokens=2000, budget=LatencyBudget(ttft_s=1.0), arrival=-5.0)  # waited 5 s already
    assert np.array_equal(SloHeadroom().score(DecisionContext(snap, spent, snap.candidates(MODEL))), [0.0, 0.0])
