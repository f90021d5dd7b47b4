"""Budgets, the default admitter and the deadline feasibility check."""

import math
from dataclasses import replace

import pytest

from steersman.config.admission import AdmissionSettings
from steersman.control.admission import Admit, Admitter, DefaultAdmitter, Infeasible, check_deadline
from steersman.control.budget import BudgetLedger, OverBudget
from steersman.control.ratelimit import Throttle, TooLarge
from steersman.control.tenants import TenantConfig
from steersman.policy.request import PriorityClass, SchedRequest


def _req(tenant="acme", prompt=100, out=100, seq=0):
    return SchedRequest(seq, "m", "chat", False, tenant, PriorityClass.STANDARD, 0.0, prompt, (), out, out)


ACME = TenantConfig("acme", PriorityClass.CRITICAL, requests_per_minute=60, tokens_per_minute=6000, budget_usd=1.0)


def test_ledger_refuses_at_or_over_budget():
    led = BudgetLedger()
    assert led.check(ACME) is None
    led.charge("acme", 0.6)
    assert led.check(ACME) is None
    led.charge("acme", 0.4)
    over = led.check(ACME)
    assert isinstance(over, OverBudget) and over.spent_usd == pytest.approx(1.0)
    assert (over.status, over.code, over.retry_after) == (429, "insufficient_quota", None)
    led.reset("acme")
    assert led.check(ACME) is None and led.spent("acme") == 0.0


def test_zero_budget_refuses_and_no_budget_never_does():
    led = BudgetLedger()
    assert isinstance(led.check(TenantConfig("z", PriorityClass.BATCH, budget_usd=0.0)), OverBudget)
    led.charge("u", 1e9)
    assert led.check(TenantConfig("u", PriorityClass.BATCH)) is None


@pytest.mark.parametrize("bad", [-0.01, math.nan, math.inf, "1", True])
def test_ledger_rejects_bad_costs(bad):
    with pytest.raises(ValueError, match="cost"):
        BudgetLedger().charge("t", bad)


def test_admitter_is_an_admitter_and_reserves_prompt_plus_expected_output():
    adm = DefaultAdmitter()
    assert isinstance(adm, Admitter)
    got = adm.admit(_req(prompt=1000, out=500), ACME, 0.0)
    assert isinstance(got, Admit) and got.reservation.tokens == 1500
    assert adm.limiter.levels("acme", 0.0) == (59.0, 4500.0)


def test_the_token_bucket_reserves_max_tokens_not_the_expected_output():
    """OpenAI counts max_tokens against a TPM limit on arrival: a tenant whose answers were learnt to be short
    cannot burst requests asking for long ones past its bucket (state audit: 30 requests of max_tokens 1,000 took
    30,660 tokens of a 2,000-token minute in 0.5 s when the reservation was the expected output)."""
    adm = DefaultAdmitter()
    tenant = TenantConfig("acme", PriorityClass.STANDARD, tokens_per_minute=2000)
    short = SchedRequest(0, "m", "chat", False, "acme", PriorityClass.STANDARD, 0.0, 10, (), 1000, 1)
    assert short.limit_tokens == 1010 and short.kv_tokens == 11
    first = adm.admit(short, tenant, 0.0)
    assert isinstance(first, Admit) and first.reservation.tokens == 1010
    assert isinstance(adm.admit(short, tenant, 0.0), Throttle)  # 1,010 more do not fit the 990 left
    adm.settle(first, used_tokens=11, now=0.0, cost_usd=0.0)  # it used 11: the rest comes back
    assert isinstance(adm.admit(short, tenant, 0.0), Admit)
    # a request whose max_tokens alone exceeds the bucket can never be served within it
    huge = replace(short, max_tokens=20_000)
    got = adm.admit(huge, tenant, 0.0)
    assert isinstance(got, TooLarge) and got.tokens == 20_010
    # n samples reserve max_tokens each; without max_tokens the expected output is what there is to reserve
    assert replace(short, samples=3).limit_tokens == 3010
    assert replace(short, max_tokens=None, expected_output=211).limit_tokens == 221


def test_requests_in_flight_hold_their_expected_cost_against_the_budget():
    """A burst of concurrent requests stops once their expected costs reach what is left of the budget (state
    audit: 30 of 30 admitted after the budget was spent, 35x over, because spend was counted only at the end)."""
    adm = DefaultAdmitter()
    tenant = TenantConfig("acme", PriorityClass.STANDARD, budget_usd=1.0)
    first = adm.admit(_req(prompt=128, out=128), tenant, 0.0)
    assert first.held_usd == 0.0  # nothing has ended yet: no price to expect
    adm.settle(first, used_tokens=256, cost_usd=0.125, now=0.0)  # model "m": 0.125 / 256 $ a token
    assert adm.ledger.spent("acme") == 0.125
    got = [adm.admit(_req(prompt=128, out=128, seq=i), tenant, 0.0) for i in range(1, 12)]
    admitted = [t for t in got if isinstance(t, Admit)]
    assert len(admitted) == 7  # 0.125 spent + 7 x 0.125 held reaches 1.0: the eighth is refused
    assert all(t.held_usd == 0.125 for t in admitted)
    over = got[7]
    assert isinstance(over, OverBudget) and "in flight are expected to cost $0.875 more" in over.reason
    # not spent yet: a retryable 429 (the holds clear as the requests end), not the exhausted quota's
    assert (over.status, over.code, over.retry_after) == (429, "rate_limit_exceeded", 1.0)
    adm.release(admitted[0], 0.0)  # one never ran: its hold comes back
    assert adm.ledger.held("acme") == 0.75
    assert isinstance(adm.admit(_req(prompt=128, out=128, seq=20), tenant, 0.0), Admit)
    for t in admitted[1:]:  # each ends cheaper than expected: the real cost is what counts
        adm.settle(t, used_tokens=256, cost_usd=0.0625, now=0.0)
    assert adm.ledger.spent("acme") == 0.5 and adm.ledger.held("acme") == 0.125


def test_a_tiny_budget_reads_in_significant_digits():
    led = BudgetLedger()
    led.charge("z", 2.3e-05)
    over = led.check(TenantConfig("z", PriorityClass.BATCH, budget_usd=2e-05))
    assert "has spent $2.3e-05 of its $2e-05 budget" in over.reason
    led.charge("big", 12.5)
    assert "$12.50 of its $10.00 budget" in led.check(TenantConfig("big", PriorityClass.BATCH, budget_usd=10)).reason


def test_admitter_checks_budget_first_then_buckets():
    adm = DefaultAdmitter()
    t = adm.admit(_req(), ACME, 0.0)
    adm.settle(t, used_tokens=200, cost_usd=1.0, now=1.0)
    assert isinstance(adm.admit(_req(), ACME, 1.0), OverBudget)
    assert adm.limiter.levels("acme", 1.0)[0] == pytest.approx(59.0 + 1.0)  # refused before the buckets


def test_admitter_throttles_and_says_when_to_retry():
    adm = DefaultAdmitter()
    tenant = TenantConfig("acme", PriorityClass.STANDARD, tokens_per_minute=6000)
    adm.admit(_req(prompt=5000, out=0), tenant, 0.0)
    thr = adm.admit(_req(prompt=2000, out=0), tenant, 0.0)
    assert isinstance(thr, Throttle) and thr.retry_after == pytest.approx(10.0)
    assert isinstance(adm.admit(_req(prompt=8000, out=0), tenant, 0.0), TooLarge)


def test_release_returns_everything_for_requests_that_never_ran():
    adm = DefaultAdmitter()
    t = adm.admit(_req(prompt=3000, out=3000), ACME, 0.0)
    adm.release(t, 0.0)
    assert adm.limiter.levels("acme", 0.0) == (60.0, 6000.0) and adm.ledger.spent("acme") == 0.0


def test_tenant_mismatch_is_a_programming_error():
    with pytest.raises(ValueError, match="tenant 'other'"):
        DefaultAdmitter().admit(_req(tenant="other"), ACME, 0.0)


async def test_admitter_on_a_fake_clock():
    from steersman.testing.clock import FakeClock  # imported here: the helper package pulls in the gateway

    clock = FakeClock(start=100.0)
    adm = DefaultAdmitter(AdmissionSettings(rate_burst_s=1.0))  # capacity: one second's worth
    tenant = TenantConfig("acme", PriorityClass.STANDARD, requests_per_minute=120)  # 2/s, capacity 2
    assert [type(adm.admit(_req(seq=i), tenant, clock.now())).__name__ for i in range(3)] == ["Admit", "Admit", "Throttle"]
    await clock.advance(0.5)
    assert isinstance(adm.admit(_req(), tenant, clock.now()), Admit)


# -- deadlines ------------------------------------------------------------------------------


def test_no_deadline_or_a_meetable_one_is_feasible():
    assert check_deadline(None, 1e9, 0.0) is None
    assert check_deadline(10.0, 10.0, 0.0) is None


def test_late_prediction_is_infeasible_with_retry_after_the_excess():
    got = check_deadline(10.0, 13.5, 2.0)
    assert isinstance(got, Infeasible) and got.retry_after == pytest.approx(3.5)
    assert (got.status, got.code) == (503, "deadline_infeasible")


def test_hopeless_cases_have_no_retry_after():
    assert check_deadline(5.0, 6.0, 5.0).retry_after is None  # deadline passed
    alone = check_deadline(5.0, 9.0, 0.0, min_service_s=6.0)  # cannot fit even alone: the client's to change
    assert (alone.retry_after, alone.status) == (None, 400)
    assert check_deadline(5.0, 6.0, 5.0).status == 400  # passed before it was scheduled: the same header fails again
    assert check_deadline(5.0, 9.0, 0.0).status == 503 and check_deadline(5.0, math.inf, 0.0).status == 503
    assert check_deadline(5.0, 9.0, 0.0, min_service_s=4.0).retry_after == pytest.approx(4.0)
    assert check_deadline(5.0, math.inf, 0.0).retry_after is None


def test_nan_is_an_error():
    with pytest.raises(ValueError, match="predicted_finish"):
        check_deadline(5.0, math.nan, 0.0)


def test_a_spent_budget_is_refused_with_openais_quota_error_type():
    from steersman.control.plane import Refuse
    from steersman.pipeline.admit import refusal_error

    err = refusal_error(Refuse(429, "insufficient_quota", "tenant 'acme' has spent its budget", None))
    assert (err.status, err.type, err.code) == (429, "insufficient_quota", "insufficient_quota")  # was rate_limit_error
    assert refusal_error(Refuse(429, "rate_limited", "over", 1.0)).type == "rate_limit_error"
