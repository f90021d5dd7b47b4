"""Retry budget (Envoy), adaptive throttling (Google SRE) and full-jitter backoff; a hypothesis state machine."""

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from steersman.config import DEFAULTS
from steersman.reliability import AdaptiveThrottle, RetryBudget, full_jitter

S = DEFAULTS.reliability


def test_budget_is_20_percent_of_active_requests_with_a_minimum_of_3():
    b = RetryBudget(S)
    for _ in range(10):
        b.begin()
    assert [b.try_retry() for _ in range(4)] == [True, True, True, False]  # 20 % of 10 = 2 < 3
    for _ in range(40):
        b.begin()
    assert [b.try_retry() for _ in range(8)] == [True] * 7 + [False]  # 20 % of 50 = 10
    assert b.try_retry(share=S.workflow_retry_share)  # a protected workflow step may use twice the share
    b.end_retry()
    assert b.retries == 10


def test_throttle_follows_the_sre_formula_capped_as_envoy_and_forgets_after_30_s():
    t = AdaptiveThrottle(S)
    for _ in range(100):
        assert t.admit(0.0, 0.999)
        t.result(0.0, True)
    assert t.reject_probability(1.0) == 0.0  # a healthy backend: never throttled
    for _ in range(300):
        if t.admit(1.0, 0.5):  # the backend rejects everything from now on
            t.result(1.0, False)
    req, acc = t.totals(1.0)
    assert (req, acc) == (400, 100)  # p stays under the draw's 0.5 for 300 failures: all sent, all counted
    assert t.reject_probability(1.0) == pytest.approx((400 - 2 * 100) / 401)
    assert sum(t.admit(1.0, 0.4) for _ in range(50)) == 0 and t.totals(1.0) == (400, 100)  # refusals uncounted
    for _ in range(1000):
        t.result(2.0, False)
    assert t.reject_probability(2.0) == 0.8  # Envoy's max_rejection_probability: a fifth still goes through
    assert t.reject_probability(32.5) == 0.0  # the window has passed


def test_a_burst_of_failures_does_not_keep_refusing_once_the_engines_serve_again():
    """Reliability audit: 80 requests failing at once, then one request every 0.5 s to engines that had recovered:
    ~90% refused for over 2.5 minutes, because the refusals themselves counted as requests the engines did not
    accept."""
    t = AdaptiveThrottle(S)
    for _ in range(240):
        t.result(0.0, False)
    rng = random.Random(7)
    refused = []
    for i in range(300):  # 150 s, every answer a success
        now = 0.2 + 0.5 * i
        if t.admit(now, rng.random()):
            t.result(now, True)
        else:
            refused.append(now)
    assert max(refused) < 30.0  # none once the failures left the window
    assert len(refused) <= 0.8 * 60 + 8  # at most 80% of the first 30 s


def test_throttle_judges_a_volume_not_a_first_failure():
    t = AdaptiveThrottle(S)
    t.result(0.0, False)  # a fresh gateway's first attempt failed (the SRE formula alone: p = 1/2 from here)
    assert t.reject_probability(0.0) == 0.0 and all(t.admit(0.0, 0.0) for _ in range(5))
    for _ in range(S.throttle_min_requests - 1):
        t.result(0.0, False)
    assert t.reject_probability(0.0) == 0.8  # 20 requests, none served: now it sheds (20/21, at most 80%)


def _offered(accept_rate: float) -> int:
    t = AdaptiveThrottle(S)
    rng = random.Random(1)
    sent = 0
    for i in range(4000):  # 4000 attempts over 40 s
        if t.admit(i * 0.01, rng.random()):
            sent += 1
            t.result(i * 0.01, rng.random() < accept_rate)
    return sent


def test_throttle_sheds_locally_when_the_backend_serves_under_1_over_k():
    assert _offered(0.9) > 0.95 * 4000  # a backend serving more than half: (almost) never throttled
    assert _offered(0.1) < 0.25 * 4000  # one serving 10 %: the gateway sends it little more than the fifth it must


@given(st.integers(0, 40), st.floats(0.001, 1.0), st.floats(0.01, 100.0), st.floats(0.0, 0.999999))
def test_full_jitter_stays_within_the_capped_exponential(attempt, base, cap, u):
    d = full_jitter(attempt, base, cap, u)
    assert 0.0 <= d < min(cap, base * 2 ** min(attempt, 30)) or d == 0.0


class BudgetMachine(RuleBasedStateMachine):
    """Concurrent retries never exceed the budget's limit at the moment they were taken."""

    def __init__(self):
        super().__init__()
        self.s = replace(S, retry_min_concurrency=2)
        self.b = RetryBudget(self.s)
        self.t = AdaptiveThrottle(self.s)
        self.active = 0
        self.retries = 0
        self.now = 0.0
        self.req = self.acc = 0

    @rule()
    def begin(self):
        self.b.begin()
        self.active += 1

    @precondition(lambda self: self.active > self.retries)
    @rule()
    def end(self):
        self.b.end()
        self.active -= 1

    @precondition(lambda self: self.active > 0)
    @rule(protected=st.booleans())
    def retry(self, protected):
        share = self.s.workflow_retry_share if protected else 1.0
        limit = max(self.s.retry_min_concurrency, 0.2 * self.active * share)
        took = self.b.try_retry(share)
        assert took == (self.retries + 1 <= limit)
        self.retries += took

    @precondition(lambda self: self.retries > 0)
    @rule()
    def retry_done(self):
        self.b.end_retry()
        self.retries -= 1

    @rule(ok=st.booleans(), u=st.floats(0, 0.999999))
    def attempt(self, ok, u):
        p = self.t.reject_probability(self.now)
        sre = min(self.s.throttle_max_reject, max(0.0, (self.req - 2 * self.acc) / (self.req + 1)))
        assert p == (sre if self.req >= self.s.throttle_min_requests else 0.0)
        assert 0.0 <= p <= self.s.throttle_max_reject
        admitted = self.t.admit(self.now, u)
        assert admitted == (u >= p)
        if admitted:  # (a local rejection is not counted)
            self.req += 1
            self.t.result(self.now, ok)
            self.acc += ok

    @invariant()
    def counts_agree(self):
        assert self.b.retries == self.retries and self.b.active == self.active
        assert self.t.totals(self.now) == (self.req, self.acc)  # all within the 30 s window here


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = hsettings(max_examples=150, stateful_step_count=80, deadline=None)
