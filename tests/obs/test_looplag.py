"""steersman:event_loop_lag_seconds: how late the gateway's event loop runs a timer that was due."""

import httpx
import pytest

from steersman.obs.histogram import FastHistogram
from steersman.obs.looplag import LAG_BUCKETS, LoopLag
from steersman.testing import LiveFleet


class _Handle:
    def __init__(self, when, callback):
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self):
        self.cancelled = True


class _Loop:
    """What LoopLag uses of a loop, on a clock the test moves (also its timer)."""

    def __init__(self):
        self.now, self.timers = 0.0, []

    def time(self):
        return self.now

    def call_later(self, delay, callback):
        h = _Handle(self.now + delay, callback)
        self.timers.append(h)
        return h

    def run_late(self, by: float) -> None:
        """The next timer fires ``by`` seconds after it was due (the loop was busy)."""
        h = self.timers.pop(0)
        assert not h.cancelled
        self.now = h.when + by
        h.callback()


def test_each_sample_is_how_late_the_timer_fired_and_it_rearms_from_then():
    hist, loop = FastHistogram(LAG_BUCKETS), _Loop()
    lag = LoopLag(hist, 0.1, timer=loop.time)
    lag.start(loop)
    assert [h.when for h in loop.timers] == [0.1]
    loop.run_late(0.0)
    loop.run_late(0.03)  # a busy loop: 30 ms late
    loop.run_late(2.0)  # a stalled one
    assert hist.count == 3 and hist.sum == pytest.approx(2.03)
    assert hist.counts[LAG_BUCKETS.index(0.05)] == 1  # 0.03 s lands in the (0.025, 0.05] bucket
    assert loop.timers[0].when == pytest.approx(0.1 + 0.1 + 0.03 + 0.1 + 2.0 + 0.1)  # each due interval_s after the last fire
    lag.stop()
    assert loop.timers[0].cancelled


def test_started_twice_it_keeps_one_timer_chain_and_stop_ends_it():
    hist, loop = FastHistogram(LAG_BUCKETS), _Loop()
    lag = LoopLag(hist, 0.1, timer=loop.time)
    lag.start(loop)
    lag.start(loop)
    assert [h.cancelled for h in loop.timers] == [True, False]  # the first chain was stopped
    lag.stop()
    assert all(h.cancelled for h in loop.timers)


def test_a_nonpositive_interval_is_refused():
    with pytest.raises(ValueError, match="interval"):
        LoopLag(FastHistogram(LAG_BUCKETS), 0.0)


def _lag_count(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("steersman:event_loop_lag_seconds_count"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no steersman:event_loop_lag_seconds on /metrics")


def test_the_gateway_samples_its_loop_while_it_runs():
    from steersman.enginesim.app import SimServerConfig

    with LiveFleet(sims=[SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=50.0, port=0)],
                   policy="least-request", gateway={"loop_lag_interval_s": 0.25}) as lf:
        lag = lf.gateway.metrics.loop_lag
        assert lag.interval_s == 0.25  # from the gateway's settings
        assert lag._handle is not None and lag._loop is lf._loop  # a timer armed on the gateway's own loop
        assert _lag_count(lf.url) >= 0  # exported on /metrics
    assert lag._handle is None  # stopped with the gateway: no timer left on the loop
