"""Token buckets and per-tenant rate limits."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steersman.config.admission import AdmissionSettings
from steersman.control.ratelimit import RateLimiter, Reservation, Throttle, TokenBucket, TooLarge
from steersman.policy.request import PriorityClass
from steersman.control.tenants import TenantConfig


def _tenant(rpm=None, tpm=None, name="t"):
    return TenantConfig(name, PriorityClass.STANDARD, rpm, tpm)


def test_bucket_starts_full_refills_continuously_and_caps():
    b = TokenBucket(rate=2.0, capacity=10.0, now=0.0)
    assert b.take(10, 0.0) == 0.0 and b.level(0.0) == 0.0
    assert b.take(1, 0.0) == pytest.approx(0.5)  # nothing taken, wait 0.5 s
    assert b.level(0.25) == pytest.approx(0.5)
    assert b.level(100.0) == 10.0  # capped
    assert b.wait(11, 100.0) == math.inf


def test_time_going_backwards_refills_nothing():
    b = TokenBucket(1.0, 5.0, now=10.0)
    b.take(5, 10.0)
    assert b.level(3.0) == 0.0 and b.level(11.0) == pytest.approx(1.0)


@pytest.mark.parametrize("rate, cap", [(0, 1), (-1, 1), (1, 0), (math.inf, 1), (1, math.nan)])
def test_bucket_rejects_bad_parameters(rate, cap):
    with pytest.raises(ValueError, match="token bucket"):
        TokenBucket(rate, cap, 0.0)


def test_capacity_is_one_minutes_worth_by_default():
    rl = RateLimiter()
    t = _tenant(rpm=60)
    got = [rl.reserve(t, 0, 0.0) for _ in range(61)]
    assert all(isinstance(g, Reservation) for g in got[:60])
    assert isinstance(got[60], Throttle) and got[60].limit == "requests_per_minute"
    assert got[60].retry_after == pytest.approx(1.0) and got[60].status == 429
    assert AdmissionSettings().rate_burst_s == 60.0


def test_retry_after_is_when_the_bucket_holds_enough():
    rl = RateLimiter()
    t = _tenant(rpm=600, tpm=6000)  # 100 tokens/s, capacity 6000
    assert isinstance(rl.reserve(t, 5000, 0.0), Reservation)
    thr = rl.reserve(t, 3000, 0.0)
    assert isinstance(thr, Throttle) and thr.limit == "tokens_per_minute"
    assert thr.retry_after == pytest.approx(20.0)  # needs 2000 more at 100/s
    assert isinstance(rl.reserve(t, 3000, 19.9), Throttle)
    assert isinstance(rl.reserve(t, 3000, 20.0), Reservation)


def test_refusal_takes_nothing_from_either_bucket():
    rl = RateLimiter()
    t = _tenant(rpm=2, tpm=100)
    rl.reserve(t, 90, 0.0)
    assert isinstance(rl.reserve(t, 50, 0.0), Throttle)  # tokens short
    assert rl.levels("t", 0.0) == (1.0, 10.0)  # the request slot was not taken


def test_settle_refunds_unused_tokens_and_charges_overuse_as_debt():
    rl = RateLimiter()
    t = _tenant(tpm=600)  # 10 tokens/s, capacity 600
    r = rl.reserve(t, 500, 0.0)
    rl.settle(r, 100, 0.0)  # used less: refund 400
    assert rl.levels("t", 0.0)[1] == pytest.approx(500)
    r = rl.reserve(t, 500, 0.0)
    rl.settle(r, 1500, 0.0)  # used 1000 more than reserved: debt
    assert rl.levels("t", 0.0)[1] == pytest.approx(-1000)
    thr = rl.reserve(t, 100, 0.0)
    assert isinstance(thr, Throttle) and thr.retry_after == pytest.approx(110.0)  # (1000 + 100) / 10
    assert isinstance(rl.reserve(t, 100, 110.0), Reservation)


def test_refund_never_exceeds_capacity():
    rl = RateLimiter()
    t = _tenant(tpm=60)
    r = rl.reserve(t, 60, 0.0)
    rl.settle(r, 0, 1000.0)
    assert rl.levels("t", 1000.0)[1] == 60.0


def test_release_gives_back_the_request_slot_too():
    rl = RateLimiter()
    t = _tenant(rpm=1, tpm=100)
    r = rl.reserve(t, 80, 0.0)
    assert isinstance(rl.reserve(t, 1, 0.0), Throttle)
    rl.release(r, 0.0)
    assert rl.levels("t", 0.0) == (1.0, 100.0)


def test_a_reservation_ends_exactly_once():
    rl = RateLimiter()
    r = rl.reserve(_tenant(tpm=100), 10, 0.0)
    rl.settle(r, 10, 0.0)
    with pytest.raises(ValueError, match="already settled"):
        rl.release(r, 0.0)


def test_a_request_larger_than_the_bucket_is_too_large_not_throttled():
    rl = RateLimiter()
    got = rl.reserve(_tenant(tpm=1000), 1001, 0.0)
    assert isinstance(got, TooLarge) and got.retry_after is None and "1001 tokens" in got.reason


def test_unlimited_tenants_are_always_admitted():
    rl = RateLimiter()
    assert all(isinstance(rl.reserve(_tenant(), 10**9, 0.0), Reservation) for _ in range(1000))
    assert rl.levels("t", 0.0) == (None, None)


def test_changed_limits_rebuild_the_buckets():
    rl = RateLimiter()
    rl.reserve(_tenant(rpm=1), 0, 0.0)
    assert isinstance(rl.reserve(_tenant(rpm=1), 0, 0.0), Throttle)
    assert isinstance(rl.reserve(_tenant(rpm=100), 0, 0.0), Reservation)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_token_counts_are_rejected(bad):
    rl = RateLimiter()
    with pytest.raises(ValueError, match="int >= 0"):
        rl.reserve(_tenant(), bad, 0.0)
    r = rl.reserve(_tenant(), 1, 0.0)
    with pytest.raises(ValueError, match="int >= 0"):
        rl.settle(r, bad, 0.0)


# -- properties -----------------------------------------------------------------------------

_events = st.lists(
    st.tuples(st.floats(0, 5, allow_nan=False), st.floats(0, 1.2), st.booleans(), st.floats(0, 1)), min_size=1, max_size=80
)


@settings(max_examples=300, deadline=None)
@given(rate=st.floats(0.1, 100), burst_s=st.floats(0.1, 60), events=_events)
def test_bucket_never_hands_out_more_than_rate_times_t_plus_burst(rate, burst_s, events):
    """(d) over every window [t_i, t_j] between events: taken - refunded <= rate * (t_j - t_i) + capacity."""
    cap = rate * burst_s
    b = TokenBucket(rate, cap, 0.0)
    now, log, taken = 0.0, [], []  # log: (time, net amount handed out)
    for dt, frac, refund, rfrac in events:
        now += dt
        if refund and taken:
            amount = taken.pop() * rfrac
            b.give(amount, now)
            log.append((now, -amount))
        else:
            cost = frac * cap
            if b.take(cost, now) == 0.0:
                taken.append(cost)
                log.append((now, cost))
    for i, (ti, _) in enumerate(log):
        net = 0.0
        for tj, amount in log[i:]:
            net += amount
            assert net <= rate * (tj - ti) + cap + 1e-6 * cap


@settings(max_examples=200, deadline=None)
@given(rpm=st.floats(1, 1000), tpm=st.floats(100, 1e5), sizes=st.lists(st.floats(0, 1), min_size=1, max_size=40))
def test_waiting_retry_after_is_always_enough(rpm, tpm, sizes):
    rl = RateLimiter()
    t = _tenant(rpm=rpm, tpm=tpm)
    now = 0.0
    for frac in sizes:
        tokens = int(frac * tpm)
        got = rl.reserve(t, tokens, now)
        if isinstance(got, Throttle):
            assert got.retry_after > 0
            now += got.retry_after
            assert isinstance(rl.reserve(t, tokens, now), Reservation)
        else:
            assert isinstance(got, Reservation)


def test_a_minutes_worth_of_tokens_is_never_too_large():
    """Found by hypothesis: with tokens_per_minute 999 the bucket held (999 / 60) x 60 = 998.9999999999999 tokens,
    and a 999-token request was refused as larger than the limit."""
    for tpm in (999, 7, 1e5 - 1, 12345):
        got = RateLimiter().reserve(_tenant(rpm=10, tpm=tpm), int(tpm), 0.0)
        assert isinstance(got, Reservation), (tpm, got)


@pytest.mark.parametrize("rpm, burst_s", [(0.5, 60.0), (30.0, 1.0)])
def test_a_request_bucket_holds_at_least_one_request(rpm, burst_s):
    # it held rpm x burst / 60 < 1 request: the tenant was refused forever, with Retry-After infinite (a 500)
    rl = RateLimiter(AdmissionSettings(rate_burst_s=burst_s))
    t = _tenant(rpm=rpm)
    assert isinstance(rl.reserve(t, 0, 0.0), Reservation)
    thr = rl.reserve(t, 0, 0.0)
    assert isinstance(thr, Throttle) and thr.retry_after == pytest.approx(60.0 / rpm)
    assert isinstance(rl.reserve(t, 0, 60.0 / rpm), Reservation)


def test_an_infinite_retry_after_sends_no_header():
    from steersman.api.errors import ApiError

    assert ApiError(429, "x", "rate_limit_error", None, "c", math.inf).headers() == {}
    assert ApiError(429, "x", "rate_limit_error", None, "c", 0.2).headers() == {"Retry-After": "1"}
