"""Idle probes (steersman.reliability.idle_probe): who gets a canary, and when a silent one is a hang."""

import math

import numpy as np

from steersman.config.reliability import ReliabilitySettings
from steersman.reliability.guard import ReplicaGuard
from steersman.reliability.idle_probe import IdleProbes

S = ReliabilitySettings(idle_probe_s=5.0, idle_probe_timeout_s=4.0)
NEVER = np.full(3, -np.inf)
ALL = np.ones(3, dtype=bool)
NONE = np.zeros(3, dtype=bool)


def test_an_idle_silent_replica_is_probed_once_an_interval_has_passed():
    p = IdleProbes(3, S, now=100.0)
    assert p.tick(104.9, NONE, NEVER, ALL) == ([], [])
    assert p.tick(105.0, NONE, NEVER, ALL) == ([0, 1, 2], [])
    assert p.tick(106.0, NONE, NEVER, ALL) == ([], [])  # one probe in flight at a time


def test_our_requests_in_flight_and_engine_work_are_signs_of_life():
    p = IdleProbes(3, S, now=0.0)
    busy = np.array([True, False, False])
    worked = np.array([-np.inf, 3.0, -np.inf])  # replica 1's work counter advanced at t=3 (or a stream's event)
    assert p.tick(2.0, busy, NEVER, ALL) == ([], [])
    assert p.tick(6.0, NONE, worked, ALL) == ([2], [])  # 0 was busy at 2, 1 worked at 3: not silent 5 s
    assert p.tick(7.0, NONE, worked, ALL) == ([0], [])
    assert p.tick(8.0, NONE, worked, ALL) == ([1], [])


def test_a_request_routed_to_a_replica_whose_probe_is_out_does_not_void_the_probe():
    """Our own request is no sign of life: a hung idle replica the next request went to was never judged by the probe
    already out (review, thirty-first session); an engine that works (its counter moves) is."""
    p = IdleProbes(3, S, now=0.0)
    assert p.tick(5.0, NONE, NEVER, ALL) == ([0, 1, 2], [])
    busy = np.array([True, True, False])
    assert p.answered(2, 5.1, 5.0)
    assert p.tick(5.4, busy, NEVER, ALL) == ([], [])
    worked = np.array([-np.inf, 6.0, -np.inf])
    assert p.tick(9.0, busy, worked, ALL) == ([], [0])  # 0: hung under our request; 1: working
    assert p.tick(30.0, busy, worked, ALL) == ([2], [])  # 0 and 1 busy: no new probe; 2 quiet since its answer


def test_out_of_rotation_replicas_are_not_probed_and_one_back_is_probed_at_once():
    p = IdleProbes(3, S, now=0.0)
    elig = np.array([True, False, True])
    assert p.tick(5.0, NONE, NEVER, elig) == ([0, 2], [])
    assert p.tick(40.0, NONE, NEVER, ALL)[0] == [1]  # back from an ejection: silent all along


def test_no_answer_in_time_without_work_meanwhile_is_a_hang():
    p = IdleProbes(3, S, now=0.0)
    p.tick(5.0, NONE, NEVER, ALL)
    assert p.answered(0, 5.01, 5.0)
    assert p.tick(8.9, NONE, NEVER, ALL) == ([], [])
    worked = np.array([-np.inf, 7.0, -np.inf])  # replica 1 is computing (a busy engine: someone else's work)
    assert p.tick(9.0, NONE, worked, ALL) == ([], [2])  # 2: 4 s and nothing; 1: it worked, no verdict
    assert not p.answered(2, 9.5, 5.0)  # too late: already judged
    assert math.isnan(p.sent_at[1]) and math.isnan(p.sent_at[2])


def test_an_error_answer_is_no_sign_of_life_and_paces_the_next_probe():
    p = IdleProbes(3, S, now=0.0)
    p.tick(5.0, NONE, NEVER, ALL)
    assert p.failed(1, 5.0) and not p.failed(1, 5.0)
    assert p.answered(0, 5.1, 5.0) and p.answered(2, 5.1, 5.0)
    assert p.tick(9.9, NONE, NEVER, np.array([False, True, False])) == ([], [])
    assert p.tick(10.0, NONE, NEVER, np.array([False, True, False])) == ([1], [])


def test_off_with_a_zero_interval():
    p = IdleProbes(3, ReliabilitySettings(idle_probe_s=0.0), now=0.0)
    assert not p.enabled
    assert p.tick(1e6, NONE, NEVER, ALL) == ([], [])


def test_a_timed_out_probe_ejects_and_an_answer_ends_probation():
    g = ReplicaGuard(3, S, alpha=0.3)
    assert g.probe_timed_out(2, 10.0, "no answer to an idle probe in 4s")
    st = g.state(2, 10.0)
    assert st["ejected"] and st["probation"] and "idle probe" in st["reason"]
    assert not g.probe_timed_out(2, 11.0, "again")  # already out
    assert not g.probe_timed_out(1, 11.0, "a second one")  # max_ejection_percent: one of three at most
    back = 10.0 + S.base_ejection_time_s
    assert not g.state(2, back)["ejected"]
    g.probe_answered(2)
    assert not g.state(2, back)["probation"] and g.state(2, back)["limit"] > S.probation_limit


def test_an_answered_probe_breaks_a_run_of_failures():
    """A failed probe counts among the consecutive failures; an answered one is a success (it was not: a replica
    answering 3 probes in 4 was ejected for "5 consecutive failures" after 20 probes)."""
    g = ReplicaGuard(3, S, alpha=0.3)
    for k in range(20):
        if k % 4 == 3:
            g.failed(1, -1, float(k))
        else:
            g.probe_answered(1)
    assert not g.state(1, 20.0)["ejected"] and g.outliers.consecutive[1] == 1  # (the last one failed)


def test_an_ejected_replica_that_serves_again_makes_room_when_the_cap_holds_back_a_hung_one():
    """Reliability audit: replica 0 ejected (then recovered, but out for its 30 s), replica 1 hangs: its ejection
    was refused by max_ejection_percent (one of three) and its waiting requests waited out replica 0's ejection
    (29 s, against 2.4 s without it).  While the cap refuses an ejection, the ejected replicas are probed, and one
    that answers comes back, making room."""
    g = ReplicaGuard(3, S, alpha=0.3)
    assert g.probe_timed_out(0, 10.0, "no answer to an idle probe in 4s")
    assert not g.probe_ejected(12.0).any()  # no pressure on the cap: an ejection runs its course
    assert not g.outliers.eject(1, 12.0, "no first token for 3s")  # the cap (1 of 3) refuses it
    assert g.probe_ejected(12.1).tolist() == [True, False, False]
    assert g.probe_answered(0, 12.2)  # replica 0 serves again: back at once
    assert not g.state(0, 12.2)["ejected"]
    assert g.outliers.eject(1, 12.3, "no first token for 3s")  # room for the hung one
    later = 12.0 + 10 * S.outlier_sweep_s + 0.01  # (each sweep refusing an ejection renews the pressure)
    assert not g.probe_ejected(later).any()  # the pressure passed
    assert not g.probe_answered(1, later) and g.state(1, later)["ejected"]  # (no pressure now: it stays out)


def test_the_prober_asks_an_ejected_replica_only_under_the_caps_pressure():
    import asyncio

    from steersman.fleet.prober import IdleProber
    from steersman.fleet.state import Fleet, Replica
    from steersman.testing.clock import FakeClock

    clock = FakeClock(start=100.0)
    reps = [Replica(i, f"r{i}", f"http://127.0.0.1:{9000 + i}", "openai", "H100", ("m",), "p", 1.0, 1, None)
            for i in range(3)]
    fleet = Fleet(reps, clock)
    fleet.guard = g = ReplicaGuard(3, S, alpha=0.3)
    prober = IdleProber(fleet, S, clock)
    asked: list[int] = []

    async def probe(rep, sent):
        asked.append(rep.index)
    prober._probe = probe  # (the IO edge: which replicas it asks is the question here)

    async def run():
        g.probe_timed_out(0, 100.0, "hung")
        clock.set(106.0)
        prober.tick()
        await asyncio.sleep(0)
        first = sorted(asked)
        asked.clear()
        prober.state.sent_at[:] = math.nan  # (the first tick's probes judged)
        clock.set(112.0)
        g.outliers.eject(1, 111.9, "stall")  # refused for the cap (each sweep while replica 1 stalls)
        prober.tick()
        await asyncio.sleep(0)
        return first, sorted(asked)
    first, second = asyncio.run(run())
    assert 0 not in first and 0 in second, (first, second)
