"""Circuit breaker: Hystrix rules, and a hypothesis state machine checking them against a model."""

import math
from dataclasses import replace

from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from steersman.config import DEFAULTS
from steersman.reliability import BreakerState, CircuitBreaker

S = replace(DEFAULTS.reliability, breaker_min_requests=4, breaker_half_open_probes=2)


def test_opens_at_the_error_share_after_enough_requests_then_probes_and_closes():
    b = CircuitBreaker(DEFAULTS.reliability)  # 20 requests, 50 %, open 5 s, 1 probe
    for i in range(19):
        b.on_result(i % 2 == 0, now=0.1 * i)
    assert b.state(2.0) is BreakerState.CLOSED  # 9 of 19 failed, and under the volume threshold
    b.on_result(False, now=2.0)  # 10 of 20: 50 %
    assert b.state(2.0) is BreakerState.OPEN and not b.allows(6.9)
    assert b.allows(7.0) and b.state(7.0) is BreakerState.HALF_OPEN
    assert b.on_call(7.0) is True and not b.allows(7.0)  # one probe at a time
    b.on_result(True, 7.5, probe=True)
    assert b.state(7.5) is BreakerState.CLOSED and b.allows(7.5)


def test_a_failed_probe_opens_it_again_and_old_calls_do_not_judge_it():
    b = CircuitBreaker(DEFAULTS.reliability)
    for _ in range(20):
        b.on_result(False, 0.0)
    assert b.state(0.0) is BreakerState.OPEN
    b.on_result(True, 1.0)  # a call sent before it opened
    assert b.state(1.0) is BreakerState.OPEN
    assert b.on_call(5.0)
    b.on_result(True, 5.1)  # not a probe: ignored while half-open
    assert b.state(5.1) is BreakerState.HALF_OPEN
    b.on_result(False, 5.2, probe=True)
    assert b.state(5.2) is BreakerState.OPEN and not b.allows(10.1) and b.allows(10.3)
    assert b.opens == 2


def test_old_failures_leave_the_rolling_window():
    b = CircuitBreaker(DEFAULTS.reliability)
    for _ in range(15):
        b.on_result(False, 0.0)
    for _ in range(10):
        b.on_result(True, 11.0)  # the failures are more than 10 s old
    b.on_result(False, 11.0)
    assert b.state(11.0) is BreakerState.CLOSED


class BreakerMachine(RuleBasedStateMachine):
    """Against a model of the rules: state, probes bounded, only enough failures open it."""

    def __init__(self):
        super().__init__()
        self.b = CircuitBreaker(S)
        self.now = 0.0
        self.calls: list[tuple[float, bool]] = []  # closed-state results in the window (time, ok)
        self.probes = 0

    @rule(dt=st.floats(0, 3))
    def wait(self, dt):
        self.now += dt

    @precondition(lambda self: self.b.allows(self.now))
    @rule(ok=st.booleans())
    def call(self, ok):
        before = self.b.state(self.now)
        probe = self.b.on_call(self.now)
        assert probe == (before is BreakerState.HALF_OPEN)
        if probe:
            self.probes += 1
            assert self.probes <= S.breaker_half_open_probes
        self.b.on_result(ok, self.now, probe)
        if probe:
            self.probes -= 1
            assert self.b.state(self.now) is (BreakerState.CLOSED if ok else BreakerState.OPEN)
            self.calls = []
            return
        span = S.breaker_window_s / S.breaker_buckets  # the window is whole buckets
        epoch = math.floor(self.now / span)
        self.calls = [(t, o) for t, o in self.calls if math.floor(t / span) > epoch - S.breaker_buckets] + [(self.now, ok)]
        bad = sum(1 for _, o in self.calls if not o)
        should = len(self.calls) >= S.breaker_min_requests and bad * 100 >= S.breaker_error_percent * len(self.calls)
        assert (self.b.state(self.now) is BreakerState.OPEN) == should
        if should:
            self.calls = []

    @precondition(lambda self: self.b.allows(self.now) and self.b.state(self.now) is BreakerState.HALF_OPEN)
    @rule()
    def probe_abandoned(self):
        assert self.b.on_call(self.now)
        self.b.release_probe()

    @invariant()
    def open_blocks_everything(self):
        st_ = self.b.state(self.now)
        if st_ is BreakerState.OPEN:
            assert not self.b.allows(self.now)
        if st_ is BreakerState.CLOSED:
            assert self.b.allows(self.now)


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = hsettings(max_examples=150, stateful_step_count=60, deadline=None)
