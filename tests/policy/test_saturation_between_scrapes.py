"""Saturation between scrapes: the engine's queue is estimated from its last scrape plus this gateway's
net traffic since (routed minus finished), so a replica turning over short requests is not saturated."""

import numpy as np

from steersman.config import DEFAULTS
from steersman.engines.base import EngineMetrics
from steersman.fleet import snapshot as S
from steersman.fleet.state import Fleet, Replica
from steersman.policy.saturation import saturated
from steersman.testing.clock import FakeClock

S_ = DEFAULTS.scheduler
DEPTH = S_.saturation_queue_depth


def _fleet() -> Fleet:
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "engine-sim", "H100", ("llama-3.1-8b",), "p", 2.0, 1,
                    adapter=None) for i in range(2)]
    f = Fleet(reps, FakeClock(start=10.0))
    f.update_metrics(0, EngineMetrics(32, 2, 0.1))  # queueing at the scrape: no free slot
    f.update_metrics(1, EngineMetrics(32, 0, 0.1))
    return f


def _sat(f: Fleet) -> list[bool]:
    return saturated(f.snapshot(), np.arange(2), S_).tolist()


def test_requests_that_finished_since_the_scrape_free_the_queue_they_would_have_filled():
    f = _fleet()
    for _ in range(10 * DEPTH):  # many short requests come and go between two scrapes
        f.end(f.begin(0), 4)
    assert _sat(f) == [False, False]


def test_net_arrivals_since_the_scrape_join_the_queue_of_an_engine_with_no_free_slot():
    f = _fleet()
    held = [f.begin(0) for _ in range(DEPTH - 1)]  # 2 waiting at the scrape + DEPTH - 1 new ones: past the depth
    assert _sat(f) == [True, False]
    f.end(held.pop(), 4)  # one left: DEPTH queued, at the depth (GIE: still capacity)
    assert _sat(f) == [False, False]


def test_more_finished_than_routed_counts_as_room_for_the_waiting_ones():
    f = _fleet()
    old = [f.begin(0) for _ in range(3)]
    f.update_metrics(0, EngineMetrics(32, DEPTH + 1, 0.1))  # saturated by its own report
    assert _sat(f) == [True, False]
    for t in old:  # three of the engine's requests finish: three of the waiting ones start
        f.end(t, 4)
    assert _sat(f) == [False, False]
    for _ in range(3):
        f.begin(0)
    assert _sat(f) == [True, False]


def test_a_burst_past_the_step_token_budget_waits_in_an_engine_with_free_slots():
    """vLLM admits a waiting request only while the step's token budget lasts (max_num_batched_tokens, 8,192 on an
    H100): a burst of prompts routed since the scrape queues there however many sequence slots are free.  Of our
    requests awaiting a first token, those past what one step admits at their mean size count as waiting."""
    f = _fleet()  # replica 1: 32 running of 1,024 slots, none waiting at the scrape
    burst = [f.begin(1, 2_000) for _ in range(2 * DEPTH)]  # 20,000 tokens: a step admits ~4 of the 10
    assert _sat(f) == [False, True]
    for t in burst[: DEPTH + 1]:  # their first tokens: the rest fit a step or two
        f.first_token(t)
    assert _sat(f) == [False, False]
    g = _fleet()
    for _ in range(2 * DEPTH):
        g.begin(1, 400)  # 4,000 tokens: one step admits them all
    assert _sat(g) == [False, False]
    h = _fleet()
    for _ in range(DEPTH + 1):
        h.begin(1, 40_000)  # long prompts, one at a time: DEPTH wait behind the one admitted
    assert _sat(h) == [False, False]
    h.begin(1, 40_000)
    assert _sat(h) == [False, True]



def test_whole_responses_are_not_counted_as_waiting_once_their_prefill_may_be_done():
    """A non-streamed request shows no first token (its whole response comes at the end), so the gateway cannot
    tell its prefill done: only streams awaiting a first token count for the budget estimate."""
    f = _fleet()
    for _ in range(2 * DEPTH):
        f.begin(1, 2_000, streamed=False)
    assert _sat(f) == [False, False]
    streams = [f.begin(1, 2_000) for _ in range(DEPTH)]  # 5 streams, 15 requests sharing 30,000 pending tokens
    assert _sat(f) == [False, False]  # a step admits ~4 of the 15: only 1 of the 5 streams waits by the estimate
    streams += [f.begin(1, 2_000) for _ in range(2 * DEPTH)]
    assert _sat(f) == [False, True]
    live = f.snapshot().live
    assert live[S.AWAITING, 1] == 3 * DEPTH  # the streams awaiting a first token, as the fleet counts them
    f.first_token(streams[0])
    f.end(streams[1])  # one left before its first token
    assert f.snapshot().live[S.AWAITING, 1] == 3 * DEPTH - 2


def test_an_engine_of_unknown_step_budget_is_judged_by_its_counts_alone():
    """llama.cpp reports no max_num_batched_tokens (NaN): the budget estimate does not apply there."""
    from steersman.policy.kernels import is_saturated

    # a fresh scrape of an idle engine with free slots; 20 of our prompts (1M tokens) await their first token
    args = (10.0, 0.0, 0.0, 0.0, 0.1, 20.0, 0.0, 1024.0, 10.0, 5.0, float(DEPTH), 0.8, 1e6, 20.0)
    assert is_saturated(*args, 8192.0)
    assert not is_saturated(*args, float("nan"))


def test_a_queue_at_the_depth_or_kv_at_the_threshold_still_has_capacity():
    """GIE's detector (saturationdetector.go): a pod has capacity while WaitingQueueSize <= QueueDepthThreshold and
    KVCacheUsagePercent <= KVCacheUtilThreshold; saturated only past them, with fresh metrics or stale."""
    from dataclasses import replace

    from steersman.policy import Queue, Route, make_policy
    from steersman.testing.snapshots import fleet_snapshot, sched_request

    kv = S_.saturation_kv_usage
    snap = fleet_snapshot(4, time=1.0, running=[1024] * 4, waiting=[DEPTH, DEPTH + 1, 0, 0],
                          kv_usage=[0.1, 0.1, kv, kv + 0.01])
    assert saturated(snap, np.arange(4), S_).tolist() == [False, True, False, True]
    # stale metrics: our requests there without a first token are the queue
    stale = fleet_snapshot(2, time=10.0, scraped_at=0.0, in_flight=[DEPTH, DEPTH + 1], decoding=[0, 0])
    assert saturated(stale, np.arange(2), S_).tolist() == [False, True]
    for fused in (True, False):
        policy = make_policy("steersman", S_)
        if not fused:
            policy._fast = None
        at_depth = fleet_snapshot(2, time=1.0, running=[1024, 1024], waiting=[DEPTH, DEPTH])
        assert isinstance(policy.pick(at_depth, sched_request()), Route)
        assert isinstance(policy.pick(fleet_snapshot(2, time=1.0, running=[1024, 1024], waiting=[DEPTH + 1] * 2),
                                      sched_request()), Queue)
        # a depth of 0: saturated once one waits, not always (>= 0 held every idle fleet in the gateway)
        none_waiting = make_policy("steersman", replace(S_, saturation_queue_depth=0))
        if not fused:
            none_waiting._fast = None
        assert isinstance(none_waiting.pick(fleet_snapshot(2, time=1.0), sched_request()), Route)
        assert isinstance(none_waiting.pick(fleet_snapshot(2, time=1.0, running=[1024, 1024], waiting=[1, 1]),
                                            sched_request()), Queue)
