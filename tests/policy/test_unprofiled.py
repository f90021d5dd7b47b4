"""Replicas without a GPU profile (llama.cpp): TTFT from uncached prompt tokens, learned online;
and the picker hands the fleet the model's prediction before the per-replica correction."""

import dataclasses

import numpy as np

from steersman.config import DEFAULTS
from steersman.fleet import snapshot as S
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy import make_policy
from steersman.policy.framework import DecisionContext
from steersman.policy.model_based import corrections
from steersman.testing.snapshots import MODEL, chain, fleet_snapshot, prefix_index, sched_request

POLICY = make_policy("steersman")
SCHED = DEFAULTS.scheduler


def unprofiled(n: int, prefix=None, **rows):
    """``n`` llama.cpp-like replicas: no GPU, no roofline, free."""
    snap = fleet_snapshot(n, prefix=prefix, **rows)
    statics = build_statics([ReplicaSpec(None, MODEL, 1, 0.0)] * n)
    assert not statics.modelled.any()
    return dataclasses.replace(snap, statics=statics)


def predict(snap, req):
    return DecisionContext(snap, req, snap.candidates(req.model)).feature("prediction")


def test_warm_replica_predicts_low_ttft_even_after_a_slow_observed_average():
    hashes = chain("agent", 120)  # 1920 prompt tokens
    # replica 0 holds the prefix; its *observed* average TTFT is high (it served cold prompts before)
    snap = unprofiled(2, prefix=prefix_index(2, {0: hashes}), ttft_ewma=[3.0, 0.4])
    req = sched_request(prompt_tokens=120 * 16 + 8, hashes=hashes, budget=sched_request().budget)
    p = predict(snap, req)
    assert p.uncached[0] < 32 and p.uncached[1] == req.prompt_tokens
    assert p.ttft[0] < p.ttft[1] / 5
    expect_cold = (SCHED.unprofiled_decode_step_s + req.prompt_tokens * SCHED.unprofiled_prefill_s_per_token)
    assert np.isclose(p.ttft[1], expect_cold)
    assert POLICY.pick(snap, req).replica == 0


def test_learned_ratios_scale_prefill_and_decode_per_replica():
    # replica 1 was observed 4x slower than the prior model at prefill and 12x at decode (past the pooling spread)
    snap = unprofiled(2, ttft_ratio=[1.0, 4.0], tpot_ratio=[1.0, 12.0], in_flight=1, running=1, decoding=1)
    p = predict(snap, sched_request(prompt_tokens=1000, expected_output=50))
    assert np.isclose(p.ttft[1], 4 * p.ttft[0])
    assert np.isclose(p.tpot[1], 12 * p.tpot[0])
    assert np.allclose(p.e2e, p.ttft + 50 * p.tpot)


def test_alike_replicas_pool_their_learnt_tpot_within_the_spread():
    # two identical engines whose requests saw 2.5x different TPOT (the prefills each ran beside them): noise
    snap = unprofiled(2, tpot_ratio=[1.0, 2.5], decode_s_token=[0.02, 0.02], in_flight=1, running=1, decoding=1)
    p = predict(snap, sched_request(prompt_tokens=1000, expected_output=50))
    assert np.isclose(p.tpot[0], p.tpot[1]) and np.isclose(p.tpot[0], 0.02 * 1.75)
    # the route still tells the fleet the replica's own base prediction (its ratio keeps learning from it)
    d = POLICY.pick(snap, sched_request(prompt_tokens=1000, expected_output=50))
    assert np.isclose(d.predicted_tpot_s, 0.02)
    # replicas configured differently (another pool here) keep their own
    apart = dataclasses.replace(snap, statics=build_statics([ReplicaSpec(None, MODEL, 1, 0.0, pool="a"),
                                                             ReplicaSpec(None, MODEL, 1, 0.0, pool="b")]))
    p = predict(apart, sched_request(prompt_tokens=1000, expected_output=50))
    assert np.isclose(p.tpot[1], 2.5 * p.tpot[0])


def test_pooling_sends_an_equally_cached_request_to_the_idle_replica_not_the_lucky_one():
    # replica 0 is busy (a prompt prefilling, 3 requests) but its requests happened to see a 2.5x lower TPOT;
    # replica 1 is idle.  Per-replica TPOTs made the end-to-end latency favour replica 0 by ~1 s of decode.
    snap = unprofiled(2, tpot_ratio=[1.0, 2.5], decode_s_token=[0.03, 0.03], prefill_s_token=[0.002, 0.002],
                      in_flight=[3, 0], running=[3, 1], decoding=[2, 0], pending_prefill=[160, 0])
    req = sched_request(prompt_tokens=350, expected_output=16, budget=sched_request().budget)
    assert POLICY.pick(snap, req).replica == 1
    off = make_policy("steersman", dataclasses.replace(SCHED, unprofiled_tpot_pool_spread=1.0))
    assert off.pick(snap, req).replica == 0  # without pooling: the lucky replica
    assert off.decide(off.context(snap, req)).replica == 0  # the plugin-by-plugin path reads the profile's too


def test_a_replica_far_slower_than_its_class_keeps_its_own_tpot():
    snap = unprofiled(3, tpot_ratio=[1.0, 1.2, 15.0], decode_s_token=0.02, in_flight=1, running=1, decoding=1)
    p = predict(snap, sched_request(prompt_tokens=100, expected_output=50))
    assert np.isclose(p.tpot[0], p.tpot[1]) and np.isclose(p.tpot[0] / p.tpot[1], 1.0)
    assert np.isclose(p.tpot[2] / p.tpot[0], 15.0 / 1.1)


def test_queued_prefill_adds_ttft_on_an_unprofiled_replica():
    snap = unprofiled(2, pending_prefill=[5000, 0], in_flight=[2, 0])
    p = predict(snap, sched_request(prompt_tokens=500))
    assert np.isclose(p.ttft[0] - p.ttft[1], 5000 * SCHED.unprofiled_prefill_s_per_token)
    assert POLICY.pick(snap, sched_request(prompt_tokens=500)).replica == 1


def test_route_carries_the_prediction_before_the_correction():
    # observed/predicted is learned from what the route says it predicted: were that the corrected
    # prediction, r <- r + a (k / r - r) would settle at sqrt(k), not k
    snap = fleet_snapshot(["H100"], ttft_ratio=3.0, tpot_ratio=2.0, in_flight=1, running=1, decoding=1)
    req = sched_request(prompt_tokens=1000)
    p = predict(snap, req)
    d = POLICY.pick(snap, req)
    assert corrections(snap, 0) == (3.0, 2.0)
    assert np.isclose(d.predicted_ttft_s * 3.0, p.ttft[0]) and np.isclose(d.predicted_tpot_s * 2.0, p.tpot[0])


def test_learned_ratio_converges_to_the_true_slowdown():
    k, a = 4.0, SCHED.latency_ewma_alpha  # the replica is 4x slower than its roofline
    snap = fleet_snapshot(["H100"], in_flight=1, running=1, decoding=1)
    req = sched_request(prompt_tokens=1000)
    for _ in range(100):
        d = POLICY.pick(snap, req)
        observed = k * d.predicted_ttft_s
        r = snap.live[S.TTFT_RATIO, 0]
        snap.live[S.TTFT_RATIO, 0] = r + a * (observed / d.predicted_ttft_s - r)  # the fleet's update
    assert np.isclose(snap.live[S.TTFT_RATIO, 0], k, rtol=1e-3)


def test_no_replica_meets_the_slo_near_equal_latency_goes_to_the_cached_prefix():
    from steersman.config import DEFAULTS
    from steersman.policy.request import LatencyBudget

    hashes = chain("ctx", 100)
    impossible = LatencyBudget(ttft_s=1e-6, tpot_s=1e-6)
    # replica 0 holds the prompt but decodes a slightly larger batch: a little slower end to end
    snap = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}), running=[6, 0], in_flight=[6, 0], decoding=[6, 0])
    req = sched_request(prompt_tokens=100 * 16, hashes=hashes, expected_output=100, budget=impossible)
    p = predict(snap, req)
    assert p.e2e[1] < p.e2e[0] <= p.e2e[1] * DEFAULTS.scheduler.latency_tie
    d = POLICY.pick(snap, req)
    assert d.replica == 0 and "no replica meets" in d.reason
    # far slower (over exploit_slowdown x the idle replica end to end): the least latency wins
    busy = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}), running=[800, 0], in_flight=[800, 0],
                          decoding=[800, 0])
    p = predict(busy, req)
    assert p.e2e[0] > DEFAULTS.scheduler.exploit_slowdown * p.e2e[1]
    assert POLICY.pick(busy, req).replica == 1
    # slower, but within exploit_slowdown: the holder keeps it (its prefill skipped, its prefix kept hot)
    slower = fleet_snapshot(2, prefix=prefix_index(2, {0: hashes}), running=[200, 0], in_flight=[200, 0],
                            decoding=[200, 0])
    p = predict(slower, req)
    assert p.e2e[1] * DEFAULTS.scheduler.latency_tie < p.e2e[0] < DEFAULTS.scheduler.exploit_slowdown * p.e2e[1]
    assert POLICY.pick(slower, req).replica == 0
