"""Stored Responses in a real Redis (127.0.0.1:6379, database 0, a key prefix of the test's own), and two gateways
sharing them: a conversation started on one continues on the other."""

from __future__ import annotations

import asyncio
import socket
import uuid

import openai
import pytest
import redis

from steersman.api.response_store import StoreUnavailable
from steersman.enginesim.app import SimServerConfig
from steersman.state import RedisResponseStore
from steersman.testing import LiveFleet

URL = "redis://127.0.0.1:6379/0"
MODEL = "llama-3.1-8b"


@pytest.fixture
def prefix():
    p = f"steersman-test-{uuid.uuid4().hex[:12]}:"
    yield p
    r = redis.Redis.from_url(URL)
    keys = list(r.scan_iter(match=p + "*"))
    if keys:
        r.delete(*keys)
    r.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_put_get_delete_expiry_and_tenants(prefix):
    store = RedisResponseStore(URL, prefix, 10**6, ttl_s=0.3, timeout_s=1.0)
    try:
        store.put("acme", {"id": "resp_1", "output": []}, [{"role": "user", "content": "hi"}])
        got = await store.get("acme", "resp_1")  # answered from the pending write, or from Redis
        assert got is not None and got.conversation == ({"role": "user", "content": "hi"},)
        await asyncio.sleep(0.05)
        raw = redis.Redis.from_url(URL).get(store.key("acme", "resp_1"))
        assert raw is not None and b'"resp_1"' in raw  # it is in Redis itself
        assert await store.get("other", "resp_1") is None  # another tenant's key
        assert (await store.get("acme", "resp_1")).response == b'{"id":"resp_1","output":[]}'
        await asyncio.sleep(0.4)
        assert await store.get("acme", "resp_1") is None  # expired (PX)
        store.put("acme", {"id": "resp_2"}, [])
        assert await store.delete("acme", "resp_2") and await store.get("acme", "resp_2") is None
        assert not await store.delete("acme", "resp_2")
        store.put("acme", {"id": "big", "pad": "x" * 2_000_000}, [])
        assert await store.get("acme", "big") is None and store.failed_writes == 0
    finally:
        await store.close()


async def test_a_redis_that_is_down_is_a_store_unavailable_not_a_hang():
    store = RedisResponseStore(f"redis://127.0.0.1:{_free_port()}/0", "x:", 10**6, 60.0, timeout_s=0.5)
    try:
        with pytest.raises(StoreUnavailable):
            await store.get("acme", "resp_1")
        store.put("acme", {"id": "resp_1"}, [])
        await asyncio.sleep(0.3)
        assert store.failed_writes == 1
        with pytest.raises(StoreUnavailable):
            await store.delete("acme", "resp_1")
    finally:
        await store.close()


def test_two_gateways_share_a_conversation(prefix):
    gw = {"response_store_url": URL, "response_store_prefix": prefix}
    sims = lambda: [SimServerConfig(speedup=50.0, port=0)]  # noqa: E731
    with LiveFleet(sims=sims(), gateway=gw) as a, LiveFleet(sims=sims(), gateway=gw) as b:
        ca = openai.OpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0, timeout=30)
        cb = openai.OpenAI(base_url=b.url + "/v1", api_key="x", max_retries=0, timeout=30)
        with ca, cb:
            first = ca.responses.create(model=MODEL, input="What is a replica?", max_output_tokens=6,
                                        extra_body={"ignore_eos": True})
            streamed = list(cb.responses.create(model=MODEL, previous_response_id=first.id, input="And a router?",
                                                max_output_tokens=6, extra_body={"ignore_eos": True}, stream=True))
            second = streamed[-1].response
            assert second.usage.input_tokens > first.usage.input_tokens + 6  # the first turn was in its prompt
            assert ca.responses.retrieve(second.id).output_text == second.output_text
            assert [i.content[0].text for i in ca.responses.input_items.list(second.id).data] == ["And a router?"]
            cb.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                ca.responses.retrieve(first.id)
        ops = lambda lf: {tuple(k): v for k, v in lf.gateway.store_ops.values.items()}  # noqa: E731
        assert ops(a)[("write", "written")] >= 1 and ops(b)[("read", "found")] >= 1 and ops(a)[("read", "missing")] == 1


def test_a_gateway_whose_store_is_down_answers_503_for_stored_turns():
    gw = {"response_store_url": f"redis://127.0.0.1:{_free_port()}/0", "response_store_timeout_s": 0.5}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], gateway=gw) as lf:
        with openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
            assert c.responses.create(model=MODEL, input="Hi", max_output_tokens=4).output  # served; not stored
            for call in (lambda: c.responses.create(model=MODEL, input="Hi", previous_response_id="resp_x"),
                         lambda: c.responses.retrieve("resp_x"), lambda: c.responses.delete("resp_x")):
                with pytest.raises(openai.InternalServerError) as e:
                    call()
                assert e.value.status_code == 503 and e.value.body["code"] == "store_unavailable"
        assert lf.gateway.store_ops.get("read", "error") == 2 and lf.gateway.store_ops.get("delete", "error") == 1
        assert lf.gateway.store_ops.get("write", "error") == 1  # the first answer's write failed (logged)
