"""Adaptive concurrency (Gradient2): a slow replica gets a smaller limit; a hypothesis state machine for bounds."""

from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from steersman.config import DEFAULTS
from steersman.reliability import GradientLimiter

S = DEFAULTS.reliability


def test_a_replica_that_slows_down_gets_a_lower_limit_and_recovers():
    lim = GradientLimiter(S)
    for _ in range(200):
        lim.on_sample(0.02, in_flight=lim.limit)  # steady latency at full use: the limit grows
    grown = lim.limit
    assert grown > S.limit_initial
    for _ in range(30):
        lim.on_sample(0.10, in_flight=lim.limit)  # 5x slower (a degraded GPU)
    assert lim.limit < 0.5 * grown
    assert lim.limit >= S.limit_min
    low = lim.limit
    for _ in range(200):
        lim.on_sample(0.02, in_flight=lim.limit)
    assert lim.limit > low


def test_app_limited_samples_do_not_move_the_limit_and_failures_cut_it():
    lim = GradientLimiter(S)
    for _ in range(50):
        lim.on_sample(1.0, in_flight=2)  # far under half the limit
    assert lim.limit == S.limit_initial
    lim.on_failure()
    assert lim.limit == S.limit_initial * S.limit_backoff_ratio
    assert lim.allows(17) and not lim.allows(18)


class LimiterMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.lim = GradientLimiter(S)

    @rule(rtt=st.floats(1e-4, 10.0), use=st.floats(0, 2))
    def sample(self, rtt, use):
        before = self.lim.limit
        after = self.lim.on_sample(rtt, in_flight=use * before)
        if use * before < before / 2:
            assert after == before  # app-limited: unchanged
        else:  # one step moves at most by smoothing x (half the limit or the queue allowance)
            assert after <= before + S.limit_smoothing * S.limit_queue_size + 1e-9 or after == S.limit_min
            assert after >= min(before, before * (1 - S.limit_smoothing * 0.5)) - 1e-9 or after == S.limit_min

    @rule()
    def failure(self):
        before = self.lim.limit
        assert self.lim.on_failure() == max(S.limit_min, before * S.limit_backoff_ratio)

    @invariant()
    def bounded(self):
        assert S.limit_min <= self.lim.limit <= S.limit_max


TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = hsettings(max_examples=100, stateful_step_count=80, deadline=None)
