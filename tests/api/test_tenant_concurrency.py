"""A tenant's ``max_concurrent_requests`` (LiteLLM's max_parallel_requests per key): past it a new request is a 429
``concurrency_limit_exceeded`` until one of its requests ends; other tenants are not touched.  Over real HTTP with
the official client, and the admitter's books alone (settle and release both give the place back)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import openai
import pytest

from steersman.control import DefaultAdmitter, TenantConfig, TenantConfigError, TenantDirectory, TooManyInFlight
from steersman.control.admission import Admit
from steersman.policy.request import PriorityClass
from steersman.testing import LiveFleet, tenants_with_keys
from steersman.testing.scripted import Script
from steersman.testing.snapshots import sched_request

HI = [{"role": "user", "content": "hi"}]


def test_the_admitter_counts_a_tenants_requests_until_each_ends():
    adm = DefaultAdmitter()
    capped = TenantConfig("t", PriorityClass.STANDARD, max_concurrent_requests=2)
    free = TenantConfig("u", PriorityClass.STANDARD)
    a = adm.admit(sched_request(tenant="t"), capped, 0.0)
    b = adm.admit(sched_request(tenant="t"), capped, 0.0)
    assert isinstance(a, Admit) and isinstance(b, Admit)
    third = adm.admit(sched_request(tenant="t"), capped, 0.0)
    assert isinstance(third, TooManyInFlight) and (third.status, third.code, third.retry_after) == (
        429, "concurrency_limit_exceeded", 1.0) and "max_concurrent_requests" in third.reason
    assert all(isinstance(adm.admit(sched_request(tenant="u"), free, 0.0), Admit) for _ in range(5))  # not u's
    adm.release(a, 1.0)  # it never ran (shed, expired): its place is back
    c = adm.admit(sched_request(tenant="t"), capped, 1.0)
    assert isinstance(c, Admit)
    adm.settle(b, used_tokens=10, cost_usd=0.0, now=2.0)  # it ran
    adm.settle(c, used_tokens=10, cost_usd=0.0, now=2.0)
    assert adm.in_flight == {}  # (nothing kept for a tenant with none in flight)
    with pytest.raises(ValueError):
        adm.settle(c, used_tokens=10, cost_usd=0.0, now=3.0)  # once only: the count is not taken twice
    assert adm.in_flight == {}


def test_at_its_cap_a_request_retrying_cannot_help_gets_that_refusal_not_the_concurrency_one():
    # checked last: a request too large for the tenant's token bucket is a 429 request_too_large (no Retry-After),
    # not a retryable concurrency_limit_exceeded its client would retry until a place freed, to be refused then
    adm = DefaultAdmitter()
    t = TenantConfig("t", PriorityClass.STANDARD, tokens_per_minute=1000, max_concurrent_requests=1)
    assert isinstance(adm.admit(sched_request(tenant="t", prompt_tokens=10, max_tokens=10), t, 0.0), Admit)
    left = adm.limiter.levels("t", 0.0)[1]
    huge = adm.admit(sched_request(tenant="t", prompt_tokens=5000, max_tokens=10), t, 0.0)
    assert huge.code == "request_too_large"
    capped = adm.admit(sched_request(tenant="t", prompt_tokens=10, max_tokens=10), t, 0.0)
    assert isinstance(capped, TooManyInFlight)
    assert adm.limiter.levels("t", 0.0)[1] == left < 1000  # (its reservation given back)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_max_concurrent_requests_is_refused_naming_it(bad):
    with pytest.raises(TenantConfigError, match=r"tenants\.t\.max_concurrent_requests must be an integer >= 1"):
        TenantDirectory.from_data({"tenants": {"t": {"max_concurrent_requests": bad}}})


def test_past_its_concurrency_a_tenants_request_is_a_429_until_one_of_its_streams_ends():
    keys, extra = tenants_with_keys({"capped": {"max_concurrent_requests": 2}, "other": {}})
    slow = Script(pieces=tuple(f"w{i} " for i in range(20)), gap_s=0.05)  # ~1 s a stream
    with LiveFleet(scripted=[slow, slow], policy="least-request", extra=extra) as lf:
        async def run():
            capped = openai.AsyncOpenAI(base_url=lf.url + "/v1", api_key=keys["capped"], max_retries=0, timeout=30)
            other = openai.AsyncOpenAI(base_url=lf.url + "/v1", api_key=keys["other"], max_retries=0, timeout=30)
            async with capped, other:
                started = [asyncio.Event(), asyncio.Event()]

                async def stream(k):
                    text = ""
                    async for c in await capped.chat.completions.create(model="scripted", messages=HI, stream=True):
                        if c.choices and c.choices[0].delta.content:
                            text += c.choices[0].delta.content
                            started[k].set()
                    return text

                streams = [asyncio.ensure_future(stream(k)) for k in range(2)]
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 20)
                with pytest.raises(openai.RateLimitError) as third:
                    await capped.chat.completions.create(model="scripted", messages=HI)
                theirs = await other.chat.completions.create(model="scripted", messages=HI)  # another tenant: served
                texts = await asyncio.gather(*streams)
                after = await capped.chat.completions.create(model="scripted", messages=HI)  # one ended: room again
                return third.value, theirs, texts, after
        third, theirs, texts, after = asyncio.run(run())
        assert third.code == "concurrency_limit_exceeded" and "max_concurrent_requests" in third.message
        assert theirs.choices[0].message.content and after.choices[0].message.content
        assert texts == ["".join(f"w{i} " for i in range(20))] * 2
        deadline = time.monotonic() + 10  # (the gateway settles a request just after its last byte: on its thread)
        while lf.gateway.plane.admitter.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lf.gateway.plane.admitter.in_flight == {}


def test_the_twin_holds_a_tenant_to_its_concurrency_as_the_gateway_does(shared_dir):
    from steersman.fleet.config import parse_fleet
    from steersman.twin.run import Experiment

    fleet = parse_fleet({"simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 2}]}})
    spec = {"model": "llama-3.1-8b", "tenants": {"capped": {"max_concurrent_requests": 3}},
            "sources": [{"kind": "trace", "path": str(shared_dir / "traces" / "azure-llm-2023-conv.csv"),
                         "slo": "standard", "limit": 300, "speed": 4.0, "tenant": "capped"}]}
    exp = Experiment(fleet, spec)
    exp.run("steersman")
    c = exp.last.arrays()
    refused = c["http"] == 429
    assert refused.sum() > 10 and (~refused).sum() > 20
    # the admitted ones overlap 3 at most, and the count never leaks: admitted requests run to the trace's end
    ends = sorted([(a, 1) for a in c["arrival"][~refused]] + [(f, -1) for f in c["finish"][~refused]],
                  key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in ends:
        level += d
        peak = max(peak, level)
    assert peak == 3
    last_quarter = c["arrival"] > np.quantile(c["arrival"], 0.75)
    assert (~refused & last_quarter).sum() > 3
