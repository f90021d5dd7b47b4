"""A tenant's token and dollar limits hold against a burst of concurrent requests, over real HTTP with the official
client (a state audit found both beaten 15-35x in under a second: the token bucket reserved the expected output,
which a tenant can teach to be short, and the budget counted a request only once it ended)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet, tenants_with_keys

MODEL = "llama-3.1-8b"
HI = [{"role": "user", "content": "hi"}]


async def _burst(client: openai.AsyncOpenAI, n: int, **kw) -> tuple[int, list[openai.APIStatusError]]:
    async def one():
        try:
            await client.chat.completions.create(model=MODEL, messages=HI, **kw)
            return None
        except openai.APIStatusError as e:
            return e
    got = await asyncio.gather(*(one() for _ in range(n)))
    return sum(e is None for e in got), [e for e in got if e is not None]


def test_a_burst_asking_for_long_answers_takes_no_more_than_the_token_bucket():
    keys, extra = tenants_with_keys({"t": {"tokens_per_minute": 2000}})
    key = keys["t"]
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=extra) as lf:
        client = openai.AsyncOpenAI(base_url=lf.url + "/v1", api_key=key, max_retries=0, timeout=30)

        async def run():
            async with client:
                # teach the gateway this tenant's answers are one token long
                for _ in range(3):
                    await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1)
                await asyncio.sleep(0)  # (nothing to wait for: the bucket's minute does not refill meanwhile)
                ok, errors = await _burst(client, 8, max_tokens=1500)
                with pytest.raises(openai.RateLimitError) as too_large:
                    await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=20_000)
                return ok, errors, too_large.value
        ok, errors, too_large = asyncio.run(run())
        assert ok == 1, [e.message for e in errors]  # 1,500 + the prompt fit the ~1,990 left once, not 8 times
        assert all(isinstance(e, openai.RateLimitError) and e.code == "rate_limit_exceeded" for e in errors)
        assert all(float(e.response.headers["retry-after"]) > 0 for e in errors)
        assert too_large.code == "request_too_large" and "max_tokens" in too_large.message
        assert "retry-after" not in too_large.response.headers


def test_a_burst_stops_at_the_budget_not_after_it():
    keys, extra = tenants_with_keys({"t": {"budget_usd": 2e-5}})
    key = keys["t"]
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=extra) as lf:
        client = openai.AsyncOpenAI(base_url=lf.url + "/v1", api_key=key, max_retries=0, timeout=30)
        ledger = lf.gateway.plane.admitter.ledger

        async def run():
            async with client:
                await client.chat.completions.create(model=MODEL, messages=HI, max_tokens=16)  # a price to expect
                one = ledger.spent("t")
                ok, errors = await _burst(client, 30, max_tokens=16)
                return one, ok, errors
        one, ok, errors = asyncio.run(run())
        spent = ledger.spent("t")
        assert one > 0 and 0 < ok < 30
        # over by the requests' misestimates at most (a request costs up to ~2x more in a batch than alone, its
        # price learnt from one alone; before: all 30 admitted, ~4x over here, 35x over in the audit's)
        assert spent <= 2 * 2e-5 and ok < 15, (spent, one, ok)
        # refused while the burst's own requests held the rest of the budget: retryable (rate_limit_exceeded with
        # Retry-After), not the exhausted quota's insufficient_quota
        assert all(isinstance(e, openai.RateLimitError) for e in errors)
        assert {e.code for e in errors} <= {"insufficient_quota", "rate_limit_exceeded"}
        held = [e for e in errors if e.code == "rate_limit_exceeded"]
        assert all(e.response.headers.get("retry-after") == "1" for e in held)
        assert ledger.held("t") == 0.0  # every request ended: nothing is held any more
