"""Busy polling (gateway.busy_poll_s): the loop polls instead of sleeping while requests are served, then stops."""

import time

import httpx
import pytest

from steersman.http.busypoll import BACKOFF_S, PREEMPTED_S, BusyPoll
from steersman.testing import LiveFleet


class _Loop:
    """What BusyPoll uses of a loop: ``call_soon``; the test runs the ready callbacks one turn at a time."""

    def __init__(self):
        self.ready = []

    def call_soon(self, callback):
        self.ready.append(callback)

    def turn(self) -> int:
        """One loop turn: run what was ready at its start.  Returns how many ran."""
        now, self.ready = self.ready, []
        for cb in now:
            cb()
        return len(now)


class _World:
    """Wall time and the thread's CPU time: the thread runs all the time unless ``off_core`` says otherwise."""

    def __init__(self):
        self.t = 0.0
        self.off_core = 0.0  # wall time the thread spent waiting for a core
        self.serving = 0

    def timer(self):
        return self.t

    def cpu(self):
        return self.t - self.off_core


def _poll(window=0.05):
    w, loop = _World(), _Loop()
    bp = BusyPoll(window, lambda: w.serving, timer=w.timer, cpu=w.cpu)
    return w, loop, bp


def test_a_kick_spins_the_loop_while_requests_are_served_and_for_the_window_after():
    w, loop, bp = _poll(0.05)
    bp.kick()
    assert not bp.spinning and loop.ready == []  # not started: nothing to spin
    bp.start(loop)
    w.serving = 1
    bp.kick()
    assert bp.spinning and bp.spins == 1 and len(loop.ready) == 1
    bp.kick()  # a second request while spinning: still one spin, one callback per turn
    assert bp.spins == 1 and len(loop.ready) == 1
    for _ in range(100):  # a long request: every turn re-arms, whatever the time
        w.t += 0.01
        assert loop.turn() == 1
    w.serving = 0  # the last request ended at t = 1.0
    w.t += 0.04
    assert loop.turn() == 1 and bp.spinning  # within the window: still polling
    w.t += 0.02  # 0.06 s idle > 0.05: this turn ends the spin
    assert loop.turn() == 1
    assert not bp.spinning and loop.ready == []
    assert bp.spun_s == pytest.approx(1.06) and bp.total_s() == pytest.approx(1.06)
    w.t = 5.0  # idle: no turns, no time counted
    assert loop.turn() == 0 and bp.total_s() == pytest.approx(1.06)
    w.serving = 1
    bp.kick()  # the next request spins again
    assert bp.spinning and bp.spins == 2
    w.t = 5.5
    assert bp.total_s() == pytest.approx(1.56)  # the spin under way counts


def test_stop_ends_the_spin_at_its_next_turn_even_while_requests_are_served():
    w, loop, bp = _poll()
    bp.start(loop)
    w.serving = 3
    bp.kick()
    loop.turn()
    bp.stop()
    w.t = 0.5
    assert loop.turn() == 1 and not bp.spinning and loop.ready == []
    assert bp.spun_s == pytest.approx(0.5)
    bp.kick()  # stopped: no more spins
    assert not bp.spinning and loop.ready == []


def test_a_preempted_spin_gives_the_core_back_and_does_not_spin_again_for_the_backoff():
    w, loop, bp = _poll(0.05)
    bp.start(loop)
    w.serving = 1
    bp.kick()
    w.t += 0.01
    w.off_core += PREEMPTED_S * 0.9  # a short wait for the core (an interrupt): keeps spinning
    assert loop.turn() == 1 and bp.spinning and bp.preempted == 0
    w.t += 0.01
    w.off_core += PREEMPTED_S * 2  # a CFS slice given to another process: the core is contended
    assert loop.turn() == 1
    assert not bp.spinning and loop.ready == [] and bp.preempted == 1
    assert bp.spun_s == pytest.approx(0.02)
    w.t += BACKOFF_S * 0.9
    bp.kick()  # still backing off: the loop sleeps in its poller as without busy polling
    assert not bp.spinning and loop.ready == [] and bp.spins == 1
    w.t += BACKOFF_S * 0.2
    bp.kick()
    assert bp.spinning and bp.spins == 2
    w.t += 0.3  # requests still served, no preemption: spinning
    assert loop.turn() == 1 and bp.spinning


@pytest.mark.parametrize("window", [0.0, -1.0, float("nan")])
def test_a_nonpositive_window_is_refused(window):
    with pytest.raises(ValueError, match="window"):
        BusyPoll(window, lambda: 0)


def _metric(url: str, name: str) -> float | None:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_gateway_polls_while_it_streams_and_stops_after_the_window():
    from openai import OpenAI

    from steersman.enginesim.app import SimServerConfig

    window = 0.5
    with LiveFleet(sims=[SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=1.0, port=0)],
                   policy="least-request", gateway={"busy_poll_s": window}) as lf:
        bp = lf.gateway.busy_poll
        assert bp is not None and bp.window_s == window and bp._loop is lf._loop
        with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            stream = client.chat.completions.create(model="llama-3.1-8b", stream=True, max_tokens=32,
                                                    messages=[{"role": "user", "content": "Spin, please."}])
            chunks = 0
            for _ in stream:
                if not chunks:  # in real time 32 tokens take ~0.3 s: the gateway is serving, the loop spinning
                    assert lf.gateway._serving == 1
                chunks += 1
        assert chunks >= 32 and bp.spins >= 1
        deadline = time.monotonic() + 30
        # the request ends in the gateway's thread a moment after the client read the last chunk (on a busy machine,
        # after the spin already backed off: this once read _serving == 1), and the spin ends once idle for the window
        while (bp.spinning or lf.gateway._serving) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not bp.spinning and lf.gateway._serving == 0
        # at least the window after the last request, unless the loop's thread was kept off the CPU (here it shares
        # the GIL with this test's client: a wait for it reads as a preemption) and backed off
        assert bp.spun_s > window or bp.preempted >= 1
        assert _metric(lf.url, "steersman:busy_poll_seconds_total") == pytest.approx(bp.spun_s)
        assert _metric(lf.url, "steersman:busy_poll_preemptions_total") == bp.preempted
        spins = bp.spins
        assert httpx.get(lf.url + "/health", timeout=10).status_code == 200
        assert bp.spins == spins and not bp.spinning  # only chat and completion requests spin the loop
    assert bp._loop is None  # stopped with the gateway


def test_off_by_default():
    from steersman.enginesim.app import SimServerConfig

    with LiveFleet(sims=[SimServerConfig(gpu="H100", model="llama-3.1-8b", speedup=50.0, port=0)],
                   policy="least-request") as lf:
        assert lf.gateway.busy_poll is None
        assert _metric(lf.url, "steersman:busy_poll_seconds_total") is None
        assert _metric(lf.url, "steersman:busy_poll_preemptions_total") is None
