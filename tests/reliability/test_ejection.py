"""Outlier ejection: consecutive failures, latency outliers (incl. a stalled first token), timing and the fleet cap.

Stalls are the fleet's ``stalled_since`` row, handed to each sweep (how the fleet keeps it: test_guard.py)."""

from dataclasses import replace

import numpy as np

from steersman.config import DEFAULTS
from steersman.reliability import OutlierDetector

S = DEFAULTS.reliability
NAN = np.nan


def _idle(n: int) -> np.ndarray:
    """No replica holds a request awaiting a first token."""
    return np.full(n, NAN)


def _warm(d: OutlierDetector, ttft: list[float], tpot: list[float] | None = None, n: int = 5) -> None:
    for i, t in enumerate(ttft):
        for _ in range(n):
            d.latency(i, ttft=t, tpot=None if tpot is None else tpot[i])


def test_five_consecutive_failures_eject_for_base_times_count():
    d = OutlierDetector(4, S, alpha=0.2)
    for k in range(4):
        assert not d.failure(0, now=1.0)
    d.success(0)
    assert [d.failure(0, 2.0) for _ in range(5)] == [False] * 4 + [True]
    assert d.is_ejected(0, 31.9) and not d.is_ejected(0, 32.0)  # base 30 s x 1
    for _ in range(5):
        d.failure(0, 33.0)
    assert d.is_ejected(0, 92.9) and not d.is_ejected(0, 93.0)  # 30 s x 2: back within a decay interval
    for _ in range(5):
        d.failure(0, 93.0 + 25.0)  # 25 s back (2 decay intervals): the multiplier drops 2 -> 0 before counting 1
    assert not d.is_ejected(0, 118.0 + 30.0)


def test_ejection_time_is_capped():
    d = OutlierDetector(2, replace(S, base_ejection_time_s=100.0), alpha=0.2)
    t, spans = 0.0, []
    for _ in range(4):
        for _ in range(5):
            d.failure(0, t)
        spans.append(float(d.until[0]) - t)
        t = float(d.until[0])  # fails again the moment it is back
    assert spans == [100.0, 200.0, 300.0, 300.0]


def test_at_most_ten_percent_but_always_one():
    d = OutlierDetector(4, S, alpha=0.2)  # 10 % of 4 = 0, but one may always go
    assert d.max_ejected() == 1
    for _ in range(5):
        d.failure(0, 0.0)
        d.failure(1, 0.0)
    assert d.is_ejected(0, 1.0) and not d.is_ejected(1, 1.0)
    assert OutlierDetector(30, S, 0.2).max_ejected() == 3
    assert OutlierDetector(4, replace(S, always_eject_one=False), 0.2).max_ejected() == 0


def test_a_replica_whose_tpot_is_far_above_its_peers_is_ejected_but_not_for_queueing():
    d = OutlierDetector(3, S, alpha=0.2)
    _warm(d, [3.0, 3.2, 10.0])  # a long TTFT is queueing: never judged on its own
    assert d.sweep(1.0, _idle(3)) == []
    d = OutlierDetector(3, S, alpha=0.2)
    _warm(d, [3.0, 3.0, 3.0], [0.3, 0.3, 1.5])
    assert d.sweep(1.0, _idle(3)) == [2] and "TPOT" in d.reasons[2]


def test_fast_replicas_are_never_latency_outliers():
    d = OutlierDetector(3, S, alpha=0.2)
    _warm(d, [0.05, 0.05, 1.5], [0.01, 0.01, 0.15])  # 30x and 15x, but within the standard SLO targets
    assert d.sweep(1.0, _idle(3)) == []


def test_a_stalled_first_token_ejects_a_hung_replica_but_not_a_fleet_wide_queue():
    s = replace(S, latency_floor_ttft_s=0.2)
    d = OutlierDetector(3, s, alpha=0.2)
    _warm(d, [0.1, 0.1, 0.1])
    since = np.array([NAN, NAN, 10.0])  # replica 2 awaits a first token since 10.0; 0's request got one
    assert d.sweep(10.25, since) == []  # 0.25 s: under 3x the peers' TTFT
    assert d.sweep(10.4, since) == [2] and "no first token for 0.4s" in d.reasons[2]
    d = OutlierDetector(3, s, alpha=0.2)
    _warm(d, [0.1, 0.1, 0.1])
    assert d.sweep(11.0, np.full(3, 10.0)) == []  # everyone's queue is deep: nobody is an outlier
    assert d.sweep(11.0, np.array([10.9, 10.9, 10.0])) == [2]  # ...but one stalled 3x longer than the rest is


def test_a_stall_under_the_ttft_floor_is_no_outlier():
    d = OutlierDetector(3, S, alpha=0.2)  # the standard 2 s TTFT target
    _warm(d, [0.1, 0.1, 0.1])
    assert d.sweep(11.9, np.array([NAN, NAN, 10.0])) == []
    assert d.sweep(12.0, np.array([NAN, NAN, 10.0])) == [2]


def test_an_ejected_replica_comes_back_with_fresh_statistics():
    d = OutlierDetector(3, S, alpha=0.2)
    _warm(d, [3.0, 3.0, 3.0], [0.3, 0.3, 3.0])
    assert d.sweep(0.0, _idle(3)) == [2]
    assert d.samples[2] == 0 and np.isnan(d.ttft[2])
    assert d.sweep(31.0, _idle(3)) == []  # back, no samples yet: not judged


def test_a_busy_replica_is_judged_from_its_last_progress_not_its_oldest_request():
    s = replace(S, latency_floor_ttft_s=0.2)
    d = OutlierDetector(3, s, alpha=0.2)
    _warm(d, [0.1, 0.1, 0.1])
    # a request queued there since 10.0 while others got first tokens, the last at 11.15: stalled since then
    assert d.sweep(11.2, np.array([NAN, NAN, 11.15])) == []
    assert d.sweep(11.5, np.array([NAN, NAN, 11.15])) == [2]  # ...until it stops producing


def _reference_sweep(d: OutlierDetector, now: float, stalled_since: np.ndarray) -> list[int]:
    """The sweep as written before it skipped replicas under both floors: every active replica judged."""
    s = d.s
    if d.n < 2:
        return []
    active = d.until <= now
    judged = active & (d.samples >= s.latency_min_samples)
    stalls = np.nan_to_num(np.maximum(now - np.asarray(stalled_since, dtype=float), 0.0))
    out = []
    for i in np.flatnonzero(active):
        peers = judged.copy()
        peers[i] = False
        if not peers.any():
            continue
        ref_ttft = float(np.median(d.ttft[peers]))
        ref_tpot = float(np.nanmedian(d.tpot[peers])) if np.isfinite(d.tpot[peers]).any() else np.nan
        others = active.copy()
        others[i] = False
        ref_stall = float(np.median(stalls[others])) if others.any() else 0.0
        r = s.latency_outlier_ratio
        why = ""
        if judged[i] and d.tpot[i] >= max(r * ref_tpot, s.latency_floor_tpot_s):
            why = "tpot"
        elif stalls[i] >= max(r * ref_ttft, r * ref_stall, s.latency_floor_ttft_s):
            why = "stall"
        if why and d.eject(int(i), now, why):
            out.append(int(i))
    return out


def test_the_sweep_ejects_exactly_what_judging_every_replica_ejects():
    """Skipping the replicas under both floors is an optimisation only: same ejections, same order, on random
    fleets (healthy, degraded, hung, some already ejected, some without samples)."""
    rng = np.random.default_rng(11)
    settings = replace(S, max_ejection_percent=50.0)
    ejected = 0
    for trial in range(400):
        n = int(rng.integers(2, 9))
        a, b = OutlierDetector(n, settings, alpha=0.2), OutlierDetector(n, settings, alpha=0.2)
        now = 100.0
        for d in (a, b):
            r = np.random.default_rng(trial)
            d.ttft[:] = r.choice([0.05, 0.3, 1.0, 2.5, 8.0], n)
            d.tpot[:] = np.where(r.random(n) < 0.2, np.nan, r.choice([0.01, 0.05, 0.15, 0.3, 0.9], n))
            d.samples[:] = r.choice([0, 3, 5, 20], n)
            d.until[:] = np.where(r.random(n) < 0.15, now + 5.0, -np.inf)
        stalled = np.where(rng.random(n) < 0.5, now - rng.choice([0.1, 1.0, 2.5, 7.0, 30.0], n), np.nan)
        got, want = a.sweep(now, stalled.copy()), _reference_sweep(b, now, stalled.copy())
        assert got == want, (trial, got, want)
        assert a.reasons != [""] * n or not got
        ejected += len(got)
    assert ejected > 50  # the random fleets do exercise ejections
