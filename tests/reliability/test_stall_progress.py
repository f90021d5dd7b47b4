"""A stall is a replica that stopped making progress, not one that is full.

A replica with a long queue behind long decodes holds requests awaiting a first token for long (a waiting
request starts only when a running decode ends and frees its slot / KV), longer than the TTFT predicted for
them; it is streaming tokens to its running requests all the while.  That is queueing (the picker's
saturation and stall floor route around it), not a hang: ejecting it under load moved its traffic to the
other replicas, which then filled up in turn (a cascade).  A hung replica sends no event at all and is still
ejected, its stall judged from its last event."""

import re
from dataclasses import replace

import numpy as np
import pytest

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics
from steersman.fleet import snapshot as S_
from steersman.policy import make_policy
from steersman.reliability import OutlierDetector
from steersman.testing import poisson
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize

REL = DEFAULTS.reliability


# ---- the twin: the real gateway's accounting and guard on simulated engines --------------------------------

def _saturated_twin():
    """2 replicas of 8 batch slots, 40 requests a second of 300 tokens each: both run full, with requests
    waiting in their engines behind long decodes (the default saturation depth, 5)."""
    small = replace(DEFAULTS.engine, max_num_seqs=8)
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b", engine=small) for i in range(2)])
    return Twin(fleet, poisson(40.0, 800, output_tokens=300, max_tokens=300), make_policy("steersman"),
                cfg=TwinConfig(reliability=REL))


def test_a_full_replica_streaming_to_its_running_requests_is_not_ejected():
    twin = _saturated_twin()
    seen = []  # (replica, stall, predicted TTFT of its oldest waiting request, requests running there)

    def look(tw) -> None:  # the fleet's row read as is: a snapshot would sweep, on this drill's schedule
        for i in range(2):
            stall = tw.clock.t - float(tw.fleet.live[S_.STALLED_SINCE, i])  # NaN: none awaits
            seen.append((i, stall, tw.fleet.expected_first_token(i), tw.tf.replicas[i].engine.state().num_running))

    for k in range(1, 100):
        twin.schedule_drill(k * 0.1, look)
    s = summarize(twin.run())
    # the scenario: requests waited there well past the TTFT floor and 3x what was predicted for them, while the
    # replica ran full batches (it streamed tokens to them all the while)
    assert any(stall >= REL.latency_floor_ttft_s and stall >= 3 * allow and running >= 8
               for _, stall, allow, running in seen), max(seen, key=lambda x: x[1])
    g = twin.fleet.guard
    assert g.outliers.total.sum() == 0, g.outliers.reasons  # busy is not hung: nobody is ejected
    assert s["completed"] == 800 and s["failed"] == 0


def test_a_hung_replica_is_still_ejected_in_the_twin():
    """Replica 0 stops making progress at 5 s (its steps take forever: no token, no first token)."""
    fleet = TwinFleet([ReplicaPlan(f"h{i}", "H100", "llama-3.1-8b") for i in range(3)])
    twin = Twin(fleet, poisson(20.0, 400, output_tokens=300, max_tokens=300), make_policy("least-request"),
                cfg=TwinConfig(reliability=REL))
    twin.schedule_drill(5.0, lambda tw: tw.slow(0, 1000.0))  # a 15 ms step takes 15 s
    at = []
    twin.fleet.guard.on_eject = lambda i, why: at.append((twin.clock.t, i, why))
    twin.run()
    assert at and at[0][1] == 0 and "no first token" in at[0][2], at
    assert at[0][0] < 5.0 + 10.0, at  # within the 10 s
    # from its first request left waiting there, as soon as a sweep saw the stall past the floor (2 s)
    stall = float(re.search(r"no first token for ([0-9.]+)s", at[0][2]).group(1))
    assert REL.latency_floor_ttft_s <= stall < REL.latency_floor_ttft_s + 2 * REL.outlier_sweep_s, at
    assert all(i == 0 for _, i, _ in at)


# ---- the fleet: every event a stream of ours gets from its engine, and the engine's work counter, is progress -----

def _fleet():
    """3 replicas, each with 5 first tokens at 0.1 s (TTFT samples to compare with), a 0.2 s TTFT floor."""
    from test_guard import _stall_fleet  # (tests/reliability is on the path, as every test directory)

    return _stall_fleet()


def _event(fleet, k: int, now: float) -> None:
    fleet.streamed(2, now)  # a token on the running stream


def _scrape(fleet, k: int, now: float) -> None:
    fleet.update_metrics(2, EngineMetrics(num_running=1, num_waiting=1, progress=500.0 + 7 * k))  # the counter moves


@pytest.mark.parametrize("progress", [_event, _scrape])
def test_a_replica_making_progress_is_not_stalled_while_its_queue_waits_then_its_hang_is(progress):
    """Replica 2 runs a long decode with a stream queued behind it.  ``_event``: the decode streams to us, each
    token an event; ``_scrape``: it is a whole (non-streamed) response, which shows nothing until it ends, and the
    scrapes read the engine's work counter advancing (``EngineMetrics.progress``)."""
    fleet, clock = _fleet()
    clock.set(10.0)
    if progress is _event:
        fleet.first_token(fleet.begin(2))  # a long decode under way...
    else:
        fleet.update_metrics(2, EngineMetrics(progress=500.0))  # (the first read says nothing of when)
        fleet.begin(2, streamed=False)
    fleet.begin(2)  # ...and a request queued behind it, awaiting a first token
    for k in range(1, 51):  # 5 s of progress every 0.1 s: the queued request waits 25x the peers' TTFT
        clock.set(10.0 + k * 0.1)
        progress(fleet, k, clock.now())
        snap = fleet.snapshot()
        assert snap.blocked_until[2] <= snap.time, fleet.guard.state(2, snap.time)
    assert snap.stall[2] == 5.0  # the policies still see how long it has waited (their queueing signal)
    # the engine hangs: no progress after 15.0; judged from then (3x the peers' 0.1 s TTFT)
    clock.set(15.25)
    assert fleet.snapshot().blocked_until[2] <= clock.now()
    clock.set(15.4)
    snap = fleet.snapshot()
    assert snap.blocked_until[2] > snap.time
    assert "no first token for 0.4s" in fleet.guard.state(2, snap.time)["reason"]


def test_a_fleet_wide_freeze_is_still_no_outlier():
    fleet, clock = _fleet()
    clock.set(10.0)
    for i in range(3):
        fleet.first_token(fleet.begin(i))
        fleet.begin(i)
        fleet.streamed(i, 10.0)
    clock.set(12.0)  # nobody sent anything for 2 s
    snap = fleet.snapshot()
    assert (snap.blocked_until <= snap.time).all() and fleet.guard.outliers.total.sum() == 0


def test_the_detector_judges_a_stall_from_the_later_of_the_stall_row_and_the_last_event():
    s = replace(REL, latency_floor_ttft_s=0.2)
    d = OutlierDetector(3, s, alpha=0.2)
    for i in range(3):
        for _ in range(5):
            d.latency(i, ttft=0.1)
    last = np.array([-np.inf, 20.0, 11.9])
    d.last_output = lambda now: last
    since = np.array([np.nan, np.nan, 10.0])  # replica 1 streams but awaits nothing: no stall however long
    assert d.sweep(12.0, since) == []  # replica 2 awaits since 10.0 but sent an event at 11.9
    assert d.sweep(12.25, since) == [2] and "no first token for 0.35s" in d.reasons[2]


# ---- the engine's work counter: a restart is no progress --------------------------------------------------------

def test_a_restarted_engines_counter_is_no_progress():
    fleet, clock = _fleet()
    clock.set(10.0)
    fleet.update_metrics(2, EngineMetrics(progress=900.0))
    fleet.begin(2)
    clock.set(10.5)
    fleet.update_metrics(2, EngineMetrics(progress=3.0))  # went back: a new process, not work since 10.0
    assert fleet.last_output(clock.now())[2] == -np.inf
    clock.set(10.6)
    fleet.update_metrics(2, EngineMetrics(progress=5.0))  # counting from there on
    assert fleet.last_output(clock.now())[2] == 10.6
