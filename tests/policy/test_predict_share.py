"""TPOT under interference (the share of decode steps carrying prefill) and the hang signal (stall floor on TTFT)."""

import numpy as np

from steersman.config import DEFAULTS
from steersman.fleet import snapshot as fleet_rows
from steersman.fleet.state import Fleet, Replica
from steersman.policy import make_policy
from steersman.policy.framework import DecisionContext
from steersman.testing.snapshots import fleet_snapshot, sched_request


def predict(snap, req):
    return DecisionContext(snap, req, snap.candidates(req.model)).feature("prediction")


def test_queued_prefill_raises_tpot_in_proportion_not_all_or_nothing():
    req = sched_request(prompt_tokens=500, expected_output=200)
    base = predict(fleet_snapshot(["H100"], running=8, decoding=8, in_flight=8), req).tpot[0]
    small = predict(fleet_snapshot(["H100"], running=8, decoding=8, in_flight=8, pending_prefill=2000), req).tpot[0]
    large = predict(fleet_snapshot(["H100"], running=8, decoding=8, in_flight=8, pending_prefill=2_000_000), req).tpot[0]
    assert base < small < large
    assert small < base + 0.2 * (large - base)  # 2k queued tokens touch a few of 200 steps, not all of them
    # once that much is queued every step of the decode carries a full prefill chunk: the full-step TPOT
    full = predict(fleet_snapshot(["H100"], running=8, decoding=8, in_flight=8, pending_prefill=20_000_000), req).tpot[0]
    assert np.isclose(large, full)


def test_prefill_arriving_at_a_high_rate_fills_every_step():
    req = sched_request(prompt_tokens=500, expected_output=200)
    kw = dict(running=8, decoding=8, in_flight=8, time=100.0)
    quiet = predict(fleet_snapshot(["H100"], recent_tokens=10.0, **kw), req).tpot[0]
    busy = predict(fleet_snapshot(["H100"], recent_tokens=1e9, **kw), req).tpot[0]
    flood = predict(fleet_snapshot(["H100"], pending_prefill=1e9, **kw), req).tpot[0]
    assert quiet < busy and np.isclose(busy, flood)


def test_a_stalled_replica_predicts_at_least_its_stall_as_ttft_and_loses_the_pick():
    req = sched_request(prompt_tokens=200, expected_output=50)
    kw = dict(in_flight=[3, 3], time=50.0)
    fresh = predict(fleet_snapshot(["H100", "H100"], stalled_since=[49.999, 49.999], **kw), req)
    hung = predict(fleet_snapshot(["H100", "H100"], stalled_since=[45.0, 49.999], **kw), req)
    assert np.isclose(fresh.ttft[0], fresh.ttft[1])
    assert hung.ttft[0] >= 5.0 > hung.ttft[1]
    assert make_policy("steersman").pick(fleet_snapshot(["H100", "H100"], stalled_since=[45.0, 49.999], **kw), req).replica == 1
    # NaN: nothing of ours awaits a first token there
    idle = predict(fleet_snapshot(["H100", "H100"], stalled_since=[np.nan, np.nan], time=50.0), req)
    assert np.isclose(idle.ttft[0], idle.ttft[1]) and idle.ttft[0] < 1.0


class _Clock:  # Fleet reads only now(); advancing a FakeClock needs an event loop
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def _fleet(n=2):
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "engine-sim", "H100", ("m",), "p", 2.0, 1, adapter=None)
            for i in range(n)]
    clock = _Clock(10.0)
    return Fleet(reps, clock, DEFAULTS.scheduler), clock


def test_fleet_tracks_since_when_its_requests_await_a_first_token():
    fleet, clock = _fleet()
    assert fleet.snapshot().stall[0] == 0.0
    a = fleet.begin(0)
    clock.advance(1.0)
    b = fleet.begin(0)
    clock.advance(2.0)
    assert fleet.snapshot().stall[0] == 3.0  # since a's dispatch
    fleet.end(a)  # a leaves without a token (client gone): b waits since its own dispatch
    assert fleet.snapshot().stall[0] == 2.0
    c = fleet.begin(0)
    clock.advance(1.0)
    fleet.first_token(b)  # progress: c waits since then
    assert fleet.snapshot().stall[0] == 0.0
    clock.advance(0.5)
    assert fleet.snapshot().stall[0] == 0.5
    clock.advance(0.5)
    fleet.report(b, True)  # served to its end (one the client left would be no progress)
    fleet.end(b, output_tokens=5)  # a finished stream is progress as well
    assert fleet.snapshot().stall[0] == 0.0
    fleet.first_token(c)
    clock.advance(9.0)
    assert fleet.snapshot().stall[0] == 0.0  # nothing awaits a first token: no stall however long
    assert fleet.snapshot().stall[1] == 0.0


def test_a_non_streamed_request_is_no_stall_and_no_ttft_sample():
    fleet, clock = _fleet()
    t = fleet.begin(0, streamed=False, predicted_ttft=0.01)
    clock.advance(5.0)
    assert fleet.snapshot().stall[0] == 0.0  # its response comes whole: no first token to wait for
    fleet.first_token(t)  # the whole body arrived
    assert np.isnan(fleet.live[fleet_rows.TTFT_EWMA, 0]) and np.isnan(fleet.live[fleet_rows.TTFT_RATIO, 0])
    fleet.end(t, output_tokens=50)
    assert fleet.live[fleet_rows.IN_FLIGHT, 0] == 0 and fleet.live[fleet_rows.DECODING, 0] == 0
