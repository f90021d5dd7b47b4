"""The fleet's outcome hooks feed the guard; snapshots carry what the reliability filter applies; the guard's
sweep judges stalls from the fleet's ``stalled_since`` row (the one place that tracks them)."""

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics
from steersman.fleet import snapshot as S_
from steersman.fleet.state import Fleet, Replica
from steersman.reliability import ReplicaGuard
from steersman.testing import FakeClock

S = replace(DEFAULTS.reliability, breaker_min_requests=4)


def _fleet(n=3):
    clock = FakeClock()
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "openai", "H100", ("m",), "p", 1.0, 1, None) for i in range(n)]
    fleet = Fleet(reps, clock)
    fleet.guard = ReplicaGuard(n, S, 0.2)
    return fleet, clock


def _attempt(fleet, i, ok, tokens=10):
    t = fleet.begin(i)
    fleet.first_token(t)
    fleet.report(t, ok)
    fleet.end(t, tokens)


def test_failures_reported_through_the_fleet_block_the_replica_in_snapshots():
    fleet, clock = _fleet()
    ejected = []
    fleet.guard.on_eject = lambda i, why: ejected.append((i, why))
    for _ in range(5):
        _attempt(fleet, 1, ok=False)
    snap = fleet.snapshot()
    assert snap.blocked_until[1] > snap.time and np.all(snap.blocked_until[[0, 2]] <= snap.time)
    assert ejected == [(1, "5 consecutive failures")]
    assert fleet.guard.state(1, clock.now())["breaker"] == "open"  # 5 of 5 failed, over the 4-request volume


def test_half_open_admits_one_probe_and_its_success_closes_the_breaker():
    fleet, clock = _fleet()
    g = fleet.guard
    for _ in range(4):
        _attempt(fleet, 0, ok=False)  # breaker opens (4 of 4); 4 < 5 consecutive: not ejected
    assert g.state(0, 0.0)["breaker"] == "open" and not g.state(0, 0.0)["ejected"]
    clock.set(S.breaker_open_s + 0.01)
    assert fleet.snapshot().blocked_until[0] <= clock.now()  # half-open: open to a probe
    t = fleet.begin(0)
    assert fleet.snapshot().blocked_until[0] == np.inf  # the probe is out: no more
    fleet.first_token(t)
    fleet.report(t, True)
    fleet.end(t, 5)
    assert g.state(0, clock.now())["breaker"] == "closed"


def test_an_unjudged_end_frees_the_probe_slot():
    fleet, clock = _fleet()
    for _ in range(4):
        _attempt(fleet, 0, ok=False)
    clock.set(S.breaker_open_s + 0.01)
    t = fleet.begin(0)
    fleet.end(t, 0)  # the client left: no verdict
    assert fleet.snapshot().blocked_until[0] <= clock.now()


def test_limits_in_snapshots_shrink_when_a_replica_slows_down():
    fleet, clock = _fleet(2)
    g = fleet.guard
    low = {0: np.inf, 1: np.inf}
    for k in range(60):
        for i, dt in ((0, 0.01), (1, 0.05 if k >= 30 else 0.01)):  # replica 1 degrades 5x at round 30
            ts = [fleet.begin(i) for _ in range(int(g.limits[i]))]
            clock.set(clock.now() + dt)
            for t in ts:
                fleet.first_token(t)
                fleet.report(t, True)
                fleet.end(t, 1)
            if k >= 30:
                low[i] = min(low[i], fleet.snapshot().limits[i])
    assert low[1] < 0.5 * low[0]


def test_back_from_an_ejection_a_replica_takes_one_request_until_it_shows_progress():
    fleet, clock = _fleet()
    g = fleet.guard
    for _ in range(5):
        _attempt(fleet, 1, ok=False)  # 5 consecutive failures: ejected
    assert g.state(1, clock.now())["ejected"] and g.state(1, clock.now())["probation"]
    clock.set(S.max_ejection_time_s + 1.0)  # the ejection (and the breaker's sleep) are over
    snap = fleet.snapshot()
    assert snap.blocked_until[1] <= snap.time and snap.limits[1] == S.probation_limit == 1.0
    t = fleet.begin(1)
    assert fleet.snapshot().in_flight[1] >= fleet.snapshot().limits[1]  # the filter admits no second one
    fleet.first_token(t)  # progress: its own limit again
    assert not g.state(1, clock.now())["probation"] and fleet.snapshot().limits[1] == np.floor(g.limiters[1].limit)
    fleet.report(t, True)
    fleet.end(t, 5)
    assert fleet.snapshot().limits[1] > 1.0


# ---- stalls: the fleet's stalled_since row is what the guard's sweep judges ----------------------------------

def _stall_fleet():
    """3 replicas, each with 5 first tokens at 0.1 s (TTFT samples to compare with), a 0.2 s TTFT floor."""
    clock = FakeClock()
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "openai", "H100", ("m",), "p", 1.0, 1, None) for i in range(3)]
    fleet = Fleet(reps, clock)
    fleet.guard = ReplicaGuard(3, replace(S, latency_floor_ttft_s=0.2), 0.2)
    for _ in range(5):
        ts = [fleet.begin(i) for i in range(3)]
        clock.set(clock.now() + 0.1)
        for t in ts:
            fleet.first_token(t)
            fleet.report(t, True)
            fleet.end(t, 1)
    return fleet, clock


def _at(fleet, clock, t: float):
    clock.set(t)
    return fleet.snapshot()  # every snapshot may sweep


def test_a_hung_replica_is_ejected_from_the_fleets_stall_row():
    fleet, clock = _stall_fleet()
    clock.set(10.0)
    t0 = clock.now()
    fleet.begin(2)
    fleet.first_token(fleet.begin(0))  # replica 0 answers: nothing of ours awaits there
    snap = _at(fleet, clock, t0 + 0.25)
    assert np.isnan(snap.live[S_.STALLED_SINCE, 0]) and snap.stall[2] == 0.25
    assert snap.blocked_until[2] <= snap.time  # 0.25 s: under 3x the peers' TTFT
    snap = _at(fleet, clock, t0 + 0.4)
    assert snap.blocked_until[2] > snap.time and "no first token for 0.4s" in fleet.guard.state(2, snap.time)["reason"]
    assert snap.blocked_until[0] <= snap.time and snap.blocked_until[1] <= snap.time


def test_a_replica_computing_a_prompt_predicted_to_take_long_is_not_stalled_until_well_past_that():
    """A CPU engine computing a cold prompt (llama.cpp: ~2 s for 350 tokens) shows no first token for longer
    than its peers' TTFT, which prompts they had cached made short: the stall is judged against the
    prediction too (3x the predicted TTFT of what awaits there), so it is not ejected (bench/peers traced
    one such false ejection, and the 2 streams it moved computed their prompts again elsewhere)."""
    fleet, clock = _stall_fleet()
    clock.set(10.0)
    t0 = clock.now()
    fleet.expect_first_token(fleet.begin(2), 1.5)  # predicted 1.5 s: 3x is 4.5 s
    fleet.first_token(fleet.begin(0))
    snap = _at(fleet, clock, t0 + 4.0)
    assert snap.stall[2] == 4.0 and snap.blocked_until[2] <= snap.time
    snap = _at(fleet, clock, t0 + 4.6)  # ...but a hang still shows: 3x past what was predicted
    assert snap.blocked_until[2] > snap.time
    assert "predicted 1.5s" in fleet.guard.state(2, snap.time)["reason"]


def test_a_hung_replica_is_not_excused_by_predictions_its_stall_inflated():
    """Requests routed to a replica already stalled are predicted with the stall in (it only grows): the stall
    is judged against the oldest awaiting request's prediction, made before it."""
    fleet, clock = _stall_fleet()
    clock.set(10.0)
    t0 = clock.now()
    fleet.expect_first_token(fleet.begin(2), 0.1)
    fleet.first_token(fleet.begin(0))
    clock.set(t0 + 0.25)
    fleet.expect_first_token(fleet.begin(2), 5.0)  # predicted late because the replica has stalled 0.25 s
    snap = _at(fleet, clock, t0 + 0.4)
    assert snap.blocked_until[2] > snap.time


def test_a_busy_replica_that_keeps_producing_is_not_stalled():
    fleet, clock = _stall_fleet()
    clock.set(10.0)
    fleet.begin(2)  # a request queued long in the engine...
    for k in range(2, 12):
        clock.set(10.0 + k * 0.1)
        t = fleet.begin(2)
        clock.set(clock.now() + 0.05)
        fleet.first_token(t)  # ...while others get their first tokens
        fleet.snapshot()
    snap = _at(fleet, clock, 11.2)
    assert snap.stall[2] < 0.1 and snap.blocked_until[2] <= snap.time
    assert fleet.guard.outliers.total.sum() == 0


def test_a_failed_attempt_awaits_nothing_while_its_request_waits_to_be_rerouted():
    # the guard drops a failed attempt at its verdict; the ticket itself ends at the reroute (after a backoff)
    fleet, clock = _stall_fleet()
    clock.set(10.0)
    t = fleet.begin(2)
    clock.set(10.01)
    fleet.report(t, False)  # a 5xx: one failure, not five
    snap = _at(fleet, clock, 11.0)
    assert snap.stall[2] == 0.0 and snap.blocked_until[2] <= snap.time
    fleet.end(t, 0)
    assert fleet.guard.outliers.total.sum() == 0 and np.isnan(fleet.snapshot().live[S_.STALLED_SINCE, 2])


def _stream_and_one_queued():
    """Replica 2 streams one request (first token at 10.0) and has one more awaiting a first token from 10.01."""
    fleet, clock = _stall_fleet()
    clock.set(10.0)
    under_way = fleet.begin(2)
    fleet.first_token(under_way)
    clock.set(10.01)
    fleet.begin(2)
    return fleet, clock, under_way


def test_a_stream_the_client_left_is_no_progress():
    fleet, clock, under_way = _stream_and_one_queued()  # then the engine hangs
    clock.set(10.35)
    fleet.end(under_way, 3)  # the client gave up on the frozen stream: no verdict, and no sign of life
    snap = _at(fleet, clock, 10.42)
    assert snap.stall[2] == pytest.approx(0.41) and snap.blocked_until[2] > snap.time


def test_a_stream_served_to_its_end_is_progress():
    fleet, clock, under_way = _stream_and_one_queued()
    clock.set(10.35)
    fleet.report(under_way, True)
    fleet.end(under_way, 3)
    snap = _at(fleet, clock, 10.42)
    assert snap.stall[2] == pytest.approx(0.07) and snap.blocked_until[2] <= snap.time


def test_a_non_streamed_request_is_watched_for_its_answer_not_a_first_token():
    """Reliability audit: a replica that hung under whole responses alone was never ejected (a whole response
    shows no first token); it is judged now by when its answers were predicted, or by its engine's progress."""
    fleet, clock = _stall_fleet()
    for i in range(3):
        fleet._worked(i, 0.0)  # their engines report a work counter (a scrape read it)
    clock.set(10.0)
    t = fleet.begin(2, streamed=False)  # its response comes whole: no first token to await, an answer to
    fleet.expect_answer(t, 6.0)  # predicted to take 6 s (a long answer)
    snap = _at(fleet, clock, 15.0)
    assert snap.stall[2] == 0.0  # not a stall of the saturation's (its row counts first tokens awaited)
    assert snap.blocked_until[2] <= snap.time  # within what its answer was predicted to take (x the outlier ratio)
    fleet.output_at[2] = 40.0  # its engine's work counter rose at 40 s (a scrape): progress
    assert _at(fleet, clock, 45.0).blocked_until[2] <= 45.0
    snap = _at(fleet, clock, 10.0 + 6.0 * S.latency_outlier_ratio + 40.0)  # long past it, no progress since 40 s
    assert snap.blocked_until[2] > snap.time
    fleet.first_token(t)  # it came after all (the ejection stands; nothing is awaited there any more)
    fleet.end(t, 10, streamed=False)
    assert np.isnan(fleet.whole_since()[2])


def test_a_whole_response_is_not_watched_where_no_work_counter_shows_progress():
    """Review: an ``engine: openai`` endpoint (TGI, Ollama, a hosted API) reports no work counter, so a long whole
    answer there looked like a hang (and a baseline policy predicts no answer time to allow it)."""
    fleet, clock = _stall_fleet()
    clock.set(10.0)
    fleet.begin(2, streamed=False)
    assert np.isnan(fleet.whole_since()[2])
    snap = _at(fleet, clock, 100.0)
    assert snap.blocked_until[2] <= snap.time


def test_a_scrape_sweeps_too_with_no_traffic():
    fleet, clock = _stall_fleet()
    clock.set(10.0)
    fleet.begin(2)  # the hung replica's last request; no snapshot is taken after it
    clock.set(10.5)
    fleet.update_metrics(2, EngineMetrics(1, 0, 0.1))
    assert fleet.guard.outliers.is_ejected(2, clock.now())


def test_a_replica_whose_checks_failed_and_pass_again_leaves_its_ejection_a_passive_failure_does_not():
    """A restart: the scraper's checks failed while the engine was dead and pass once it serves again; the
    failures that ejected it were the dead process's (a twin drill's restored replica waited out its 30 s
    ejection idle).  A connection refused on the request path (passive) followed by a good check is not a
    restart: the ejection stands (a replica refusing some connections would leave every ejection)."""
    for active in (True, False):
        fleet, clock = _fleet()
        for _ in range(5):
            _attempt(fleet, 1, ok=False)
        assert fleet.guard.outliers.is_ejected(1, clock.now())
        fleet.set_healthy(1, False, active=active)
        asyncio.run(clock.advance(1.0))
        fleet.set_healthy(1, True)
        assert fleet.guard.outliers.is_ejected(1, clock.now()) is (not active), active
    fleet, clock = _fleet()  # checks down for less than restart_down_s: a blip, no restart (no flapping ejection)
    for _ in range(5):
        _attempt(fleet, 1, ok=False)
    fleet.set_healthy(1, False)
    asyncio.run(clock.advance(0.2))
    fleet.set_healthy(1, True)
    assert fleet.guard.outliers.is_ejected(1, clock.now())
    fleet, clock = _fleet()  # a good check of a replica never down lifts nothing (uneject_on_active_health: off)
    for _ in range(5):
        _attempt(fleet, 1, ok=False)
    fleet.set_healthy(1, True)
    assert fleet.guard.outliers.is_ejected(1, clock.now())


def test_admin_fleet_shows_an_ejected_replica_out_of_rotation_with_its_engine_load():
    """An observability audit: /admin/fleet showed an ejected replica ``routable: true`` (it read health and warm
    weights only), and no engine load at all."""
    from steersman.api.admin import fleet_view

    fleet, clock = _fleet()
    fleet.update_metrics(0, EngineMetrics(num_running=3, num_waiting=2, kv_usage=0.25))
    for _ in range(5):
        _attempt(fleet, 1, ok=False)
    reps = fleet_view(fleet)["replicas"]
    assert (reps[1]["healthy"], reps[1]["routable"], reps[1]["ejected"]) == (True, False, True)
    assert (reps[0]["routable"], reps[0]["ejected"]) == (True, False)
    assert (reps[0]["running"], reps[0]["waiting"], reps[0]["kv_cache_usage"]) == (3.0, 2.0, 0.25)
    fleet.set_draining(1, True)  # drained by an operator too: its ejection still shows (a review: it read false)
    reps = fleet_view(fleet)["replicas"]
    assert (reps[1]["draining"], reps[1]["routable"], reps[1]["ejected"]) == (True, False, True)
