"""Edge cases of the latency prediction (``steersman.policy.kernels.predict_kernel`` and the unprofiled model).

* an engine count not reported (NaN ``running`` / ``waiting``) is read as the gateway's own knowledge (the requests
  of ours decoding there, none of others waiting), not as a NaN that makes the replica unpickable;
* the hang floor (``stalled_since``) applies to the TTFT once the queue ahead has drained (``ttft_alone``, what
  holding a late request in the gateway reads) as to the TTFT now, on both models;
* work of exactly k step budgets takes k steps: vLLM samples the first token in the step that computes the
  prompt's last token (and so does the engine model the twin runs).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy import Queue, Route, make_policy
from steersman.policy.framework import DecisionContext
from steersman.policy.request import LatencyBudget
from steersman.sim import EngineModel, SimRequest, gpu_profile, model_profile
from steersman.testing.snapshots import MODEL, fleet_snapshot, sched_request
from steersman.text.tokenizer import block_hashes

NAN = math.nan
STANDARD = LatencyBudget(ttft_s=2.0, tpot_s=0.2)


def _policy(fused: bool):
    p = make_policy("steersman")
    if not fused:
        p._fast = None  # the plugin-by-plugin path
    return p


def _predict(snap, req):
    return DecisionContext(snap, req, snap.candidates(req.model)).feature("prediction")


def _unprofiled(snap):
    return dataclasses.replace(snap, statics=build_statics([ReplicaSpec(None, MODEL, 1, 0.0)] * snap.size))


# ---- NaN engine counts ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("row, reading", [("running", "decoding"), ("waiting", 0.0)])
def test_an_unreported_engine_count_is_read_as_the_gateway_knows_it(row, reading):
    busy = dict(in_flight=[4, 4], decoding=[3, 3], running=[3, 3], waiting=[1, 1], pending_prefill=[900, 900])
    unknown = fleet_snapshot(2, **{**busy, row: [NAN, busy[row][1]]})
    known = fleet_snapshot(2, **{**busy, row: [busy["decoding"][0] if reading == "decoding" else reading,
                                                busy[row][1]]})
    req = sched_request(prompt_tokens=2000)
    got, want = _predict(unknown, req), _predict(known, req)
    for field in ("ttft", "tpot", "e2e", "cost", "tpot_res", "ttft_alone"):
        assert np.isfinite(getattr(got, field)).all(), field
        assert getattr(got, field)[0] == getattr(want, field)[0], field


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("row", ["running", "waiting"])
def test_an_idle_replica_with_a_nan_count_is_picked_over_a_busy_one(fused, row):
    snap = fleet_snapshot(2, **{row: [NAN, 0.0]}, in_flight=[0, 30], decoding=[0, 30], pending_prefill=[0, 60_000])
    d = _policy(fused).pick(snap, sched_request(prompt_tokens=2000))
    assert isinstance(d, Route) and d.replica == 0 and math.isfinite(d.predicted_ttft_s)


# ---- the hang floor on the TTFT alone -----------------------------------------------------------------------------

#: replica 0 has made no progress on the requests of ours awaiting a first token there for 60 s; replica 1 is slow
#: (a learnt TTFT ratio of 30) but answers
HUNG = dict(time=100.0, pending_prefill=[2000, 0], in_flight=[1, 0], running=[0, 0], decoding=[0, 0],
            ttft_ratio=[1.0, 30.0], stalled_since=[40.0, NAN])


@pytest.mark.parametrize("unprofiled", [False, True])
def test_a_hung_replica_is_not_predicted_to_serve_soon_once_its_queue_drains(unprofiled):
    snaps = fleet_snapshot(2, **HUNG), fleet_snapshot(2, **{**HUNG, "stalled_since": [NAN, NAN]})
    if unprofiled:
        snaps = tuple(_unprofiled(s) for s in snaps)
    req = sched_request(prompt_tokens=4000, expected_output=50)
    hung, calm = (_predict(s, req) for s in snaps)
    assert calm.ttft_alone[0] < calm.ttft[0] < 60.0
    assert hung.ttft[0] == hung.ttft_alone[0] == 60.0  # the hang, whatever drains ahead of it
    assert hung.ttft_alone[1] == calm.ttft_alone[1]  # no stall there: no floor


@pytest.mark.parametrize("fused", [True, False])
def test_a_late_request_is_not_held_in_the_gateway_for_a_hung_replica(fused):
    """No replica meets its TTFT now; only the hung one looked able to once its queue drained: it goes (late) to
    the one that answers instead of waiting in the gateway until its budget is spent."""
    policy = _policy(fused)
    for waited in (0.0, 1.0, 1.8):
        req = sched_request(1, prompt_tokens=4000, expected_output=50, budget=STANDARD, arrival=100.0 - waited)
        d = policy.pick(fleet_snapshot(2, **HUNG), req)
        assert isinstance(d, Route) and d.replica == 1 and d.late, (waited, d)
    # a long backlog there instead of the hang: it meets the budget once drained, so the request waits for it
    calm = fleet_snapshot(2, **{**HUNG, "stalled_since": [NAN, NAN], "pending_prefill": [150_000, 0]})
    req = sched_request(1, prompt_tokens=4000, expected_output=50, budget=STANDARD, arrival=100.0)
    assert isinstance(policy.pick(calm, req), Queue)


# ---- the step that completes the prefill ------------------------------------------------------------------------

def _engine_ttft(prompt: int) -> tuple[float, int]:
    """The first token's time and steps of a lone prompt on an idle H100 in the twin's engine model."""
    eng = EngineModel(gpu_profile("H100"), model_profile("llama-3.1-8b"), DEFAULTS.engine, warm=True)
    eng.add(SimRequest("r", prompt, 1, block_hashes(list(range(1, prompt + 1)), 16)))
    t, steps = 0.0, 0
    while eng.has_work():
        r = eng.step(t)
        t, steps = r.end, steps + 1
        if "r" in r.first_tokens:
            return t, steps
    raise AssertionError("no first token")


def test_a_prompt_of_exactly_the_step_budget_takes_one_step():
    snap = fleet_snapshot(["H100"])
    budget = int(snap.statics.batch_tokens[0])
    ttft = {n: float(_predict(snap, sched_request(prompt_tokens=n)).ttft[0])
            for n in (budget - 1, budget, budget + 1, 2 * budget - 1, 2 * budget, 2 * budget + 1)}
    decode_step = ttft[budget + 1] - ttft[budget]  # the second step carries one prompt token
    assert decode_step > 100 * (ttft[budget] - ttft[budget - 1])
    for k in (1, 2):  # no jump onto the boundary: the jump is past it
        b = k * budget
        assert ttft[b] - ttft[b - 1] < 0.01 * decode_step, (k, ttft)
        assert ttft[b + 1] - ttft[b] > 0.5 * decode_step, (k, ttft)
    for n, steps in ((budget, 1), (budget + 1, 2), (2 * budget, 2)):  # as the twin's engine model has it
        engine, taken = _engine_ttft(n)
        assert taken == steps
        assert ttft[n] == pytest.approx(engine, rel=0.01), (n, ttft[n], engine)
