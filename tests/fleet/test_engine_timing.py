"""The fleet learns each engine's own seconds per prompt token and per generated token from its cumulative
timing counters (llama.cpp reports them), and the linear model of replicas without a GPU profile uses them
instead of its priors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics
from steersman.fleet import snapshot as S
from steersman.fleet.state import Fleet, Replica
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy.framework import DecisionContext
from steersman.testing.clock import FakeClock
from steersman.testing.snapshots import MODEL, fleet_snapshot, sched_request

SCHED = DEFAULTS.scheduler


def _fleet() -> Fleet:
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "llamacpp", None, ("m",), "p", 0.0, 1, adapter=None)
            for i in range(2)]
    return Fleet(reps, FakeClock(start=1.0))


def _timing(ps: float, pt: float, ds: float, dt: float) -> EngineMetrics:
    return EngineMetrics(1, 0, 0.1, prefill_seconds=ps, prefill_tokens=pt, decode_seconds=ds, decode_tokens=dt)


def test_the_first_read_is_the_engines_lifetime_average_then_each_scrape_adds_its_work():
    f = _fleet()
    f.update_metrics(0, _timing(3.0, 600, 0.9, 30))  # an engine that worked before the gateway came
    assert math.isclose(f.live[S.PREFILL_S_TOKEN, 0], 0.005) and math.isclose(f.live[S.DECODE_S_TOKEN, 0], 0.03)
    ps, pt = 3.0, 600
    for _ in range(40):  # then 100 prompt tokens in 1 s between scrapes: 10 ms a token; nothing generated
        f.clock.set(f.clock.now() + 1.0)  # (FakeClock.advance is async; no sleepers here)
        ps, pt = ps + 1.0, pt + 100
        f.update_metrics(0, _timing(ps, pt, 0.9, 30))
        assert 0.005 < f.live[S.PREFILL_S_TOKEN, 0] <= 0.01  # a learnt average (steersman.fleet.state._weight)
    assert math.isclose(f.live[S.PREFILL_S_TOKEN, 0], 0.01, rel_tol=1e-3)
    assert math.isclose(f.live[S.DECODE_S_TOKEN, 0], 0.03)  # no tokens generated: nothing learnt
    assert np.isnan(f.live[S.PREFILL_S_TOKEN, 1])  # never reported


def test_a_restarted_engine_counts_from_zero():
    f = _fleet()
    f.update_metrics(0, _timing(30.0, 3000, 3.0, 100))  # 10 ms a prompt token, 30 ms a generated one
    f.clock.set(f.clock.now() + 60.0)
    f.update_metrics(0, _timing(0.4, 200, 0.2, 10))  # counters went back: 2 ms and 20 ms since the restart
    a = DEFAULTS.scheduler.latency_ewma_alpha
    assert math.isclose(f.live[S.PREFILL_S_TOKEN, 0], 0.01 + a * (0.002 - 0.01))
    assert math.isclose(f.live[S.DECODE_S_TOKEN, 0], 0.03 + a * (0.02 - 0.03))


def test_an_engine_without_timing_counters_keeps_the_priors():
    f = _fleet()
    f.update_metrics(0, EngineMetrics(1, 0, 0.1))
    assert np.isnan(f.live[S.PREFILL_S_TOKEN, 0]) and np.isnan(f.live[S.DECODE_S_TOKEN, 0])


def _unprofiled(**rows):
    snap = fleet_snapshot(2, **rows)
    return dataclasses.replace(snap, statics=build_statics([ReplicaSpec(None, MODEL, 1, 0.0)] * 2))


def test_the_linear_model_uses_the_measured_speeds_where_known():
    snap = _unprofiled(prefill_s_token=[0.006, np.nan], decode_s_token=[0.03, np.nan])
    req = sched_request(prompt_tokens=400, expected_output=16)
    p = DecisionContext(snap, req, snap.candidates(req.model)).feature("prediction")
    assert np.isclose(p.ttft[0], 0.03 + 400 * 0.006)  # measured: 2.43 s
    assert np.isclose(p.tpot[0], 0.03)
    assert np.isclose(p.ttft[1], SCHED.unprofiled_decode_step_s + 400 * SCHED.unprofiled_prefill_s_per_token)
    assert np.isclose(p.tpot[1], 0.03)  # not measured yet: an alike replica's measured decode speed, not the prior
    apart = dataclasses.replace(snap, statics=build_statics([ReplicaSpec(None, MODEL, 1, 0.0, kind="llamacpp"),
                                                             ReplicaSpec(None, MODEL, 1, 0.0, kind="vllm")]))
    p = DecisionContext(apart, req, apart.candidates(req.model)).feature("prediction")
    assert np.isclose(p.tpot[1], SCHED.unprofiled_decode_step_s)  # another engine kind: the prior


def test_admin_fleet_shows_the_learnt_speeds():
    from steersman.api.admin import fleet_view

    f = _fleet()
    f.update_metrics(0, _timing(3.0, 600, 0.9, 30))
    reps = fleet_view(f)["replicas"]
    assert math.isclose(reps[0]["prefill_s_per_token"], 0.005) and math.isclose(reps[0]["decode_s_per_token"], 0.03)
    assert reps[1]["prefill_s_per_token"] is None and reps[1]["decode_s_per_token"] is None
