"""Stored Responses in a real Redis (127.0.0.1:6379, database 0, a key prefix of the test's own), and two gateways
sharing them: a conversation started on one continues on the other."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import openai
import pytest
import redis

from steersman.api.response_store import StoreUnavailable
from steersman.enginesim.app import SimServerConfig
from steersman.state import RedisResponseStore
from steersman.testing import LiveFleet

URL = "redis://127.0.0.1:6379/0"
MODEL = "llama-3.1-8b"


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


async def test_a_ttl_past_what_redis_takes_is_clamped_and_every_write_lands(prefix):
    """A TTL of 1e17 s (1e20 ms, past a 64-bit integer) made every SET ... PX fail: nothing was ever stored."""
    for ttl_s in (1e17, float("inf")):
        store = RedisResponseStore(URL, prefix, 10**6, ttl_s=ttl_s, timeout_s=1.0)
        try:
            await store.put("acme", {"id": "resp_long"}, [])
            assert store.failed_writes == 0
            r = redis.Redis.from_url(URL)
            assert r.pttl(store.key("acme", "resp_long")) > 10**15  # stored, with a (very) long expiry
            r.close()
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


def test_a_gateway_whose_store_is_down_answers_503_for_stored_turns(caplog):
    gw = {"response_store_url": f"redis://127.0.0.1:{_free_port()}/0", "response_store_timeout_s": 0.5}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], gateway=gw) as lf:
        assert any("does not answer at start" in m for m in caplog.messages)  # said at start, not at a first write
        with openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
            assert c.responses.create(model=MODEL, input="Hi", max_output_tokens=4).output  # served; not stored
            for call in (lambda: c.responses.create(model=MODEL, input="Hi", previous_response_id="resp_x"),
                         lambda: c.responses.retrieve("resp_x"), lambda: c.responses.delete("resp_x")):
                with pytest.raises(openai.InternalServerError) as e:
                    call()
                assert e.value.status_code == 503 and e.value.body["code"] == "store_unavailable"
                assert "127.0.0.1" not in e.value.message and "Connection" not in e.value.message  # logged, not sent
        assert lf.gateway.store_ops.get("read", "error") == 2 and lf.gateway.store_ops.get("delete", "error") == 1
        assert lf.gateway.store_ops.get("write", "error") == 1  # the first answer's write failed (logged)


class _SlowProxy:
    """A TCP proxy to Redis adding ``delay`` to each write toward it (a distant or loaded Redis), on its own thread;
    ``delay=None``: it accepts connections and never answers (a Redis that hangs)."""

    def __init__(self, delay: float | None) -> None:
        self.delay = delay
        self.port = _free_port()
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        started.wait(5)

    def _run(self, started: threading.Event) -> None:
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        started.set()
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(server.wait_closed())

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        if self.delay is None:
            await cr.read()  # until the client gives up
            cw.close()
            return
        ur, uw = await asyncio.open_connection("127.0.0.1", 6379)
        await asyncio.gather(self._pipe(cr, uw, self.delay), self._pipe(ur, cw, 0.0))

    @staticmethod
    async def _pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await r.read(65536):
                await asyncio.sleep(delay)
                w.write(data)
                await w.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_a_next_turn_sent_at_once_to_another_gateway_finds_the_response_a_slow_store_is_writing(prefix):
    """The client gets a Response only once its write landed: the load balancer may give the next turn to another
    gateway, which finds it in Redis (not only the writing gateway's own pending write)."""
    proxy = _SlowProxy(0.3)
    sims = lambda: [SimServerConfig(speedup=50.0, port=0)]  # noqa: E731
    try:
        with LiveFleet(sims=sims(), gateway={"response_store_url": f"redis://127.0.0.1:{proxy.port}/0",
                                             "response_store_prefix": prefix}) as a, \
                LiveFleet(sims=sims(), gateway={"response_store_url": URL, "response_store_prefix": prefix}) as b, \
                openai.OpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0, timeout=30) as ca, \
                openai.OpenAI(base_url=b.url + "/v1", api_key="x", max_retries=0, timeout=30) as cb:
            with pytest.raises(openai.NotFoundError):
                ca.responses.retrieve("resp_warm")  # A's connection to Redis is open: its write is the only wait
            for stream in (False, True, False, True):
                first = ca.responses.create(model=MODEL, input="What is a replica?", max_output_tokens=3,
                                            stream=stream)
                first = list(first)[-1].response if stream else first
                nxt = cb.responses.create(model=MODEL, input="And a router?", max_output_tokens=3,
                                          previous_response_id=first.id)
                assert nxt.previous_response_id == first.id and nxt.output
    finally:
        proxy.close()


def test_a_hanging_store_delays_the_answer_by_its_timeout_at_most():
    proxy = _SlowProxy(None)
    gw = {"response_store_url": f"redis://127.0.0.1:{proxy.port}/0", "response_store_timeout_s": 0.3}
    try:
        with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], gateway=gw) as lf, \
                openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
            for stream in (False, True):
                t0 = time.monotonic()
                got = c.responses.create(model=MODEL, input="Hi", max_output_tokens=3, stream=stream)
                got = list(got)[-1].response if stream else got
                assert got.output_text and time.monotonic() - t0 < 0.3 + 0.5
    finally:
        proxy.close()


def test_a_corrupt_record_is_answered_as_not_found_counted_and_logged(prefix, caplog):
    """A key under the gateway's prefix that it did not write (bad JSON, another JSON shape, a conversation of
    non-objects, a Redis hash instead of a string) was a 500 with a traceback (``decode_stored``), a retryable 503
    naming Redis's WRONGTYPE, or a 200 whose continuation blamed the client's input; none was counted."""
    gw = {"response_store_url": URL, "response_store_prefix": prefix}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], gateway=gw) as lf, \
            openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        store = lf.gateway.response_store
        r = redis.Redis.from_url(URL)
        bad = {"resp_json": b"{not json", "resp_array": b"[1, 2]", "resp_noconv": b'{"response": {"id": "resp_noconv"}}',
               "resp_int": b'{"response": {"id": "resp_int"}, "conversation": 5}',
               "resp_items": b'{"response": {"id": "resp_items"}, "conversation": [1, "x"]}'}
        for rid, raw in bad.items():
            r.set(store.key("default", rid), raw)
        r.hset(store.key("default", "resp_hash"), "a", "b")
        r.close()
        for rid in [*bad, "resp_hash"]:
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(rid)
            with pytest.raises(openai.NotFoundError):
                c.responses.input_items.list(rid)
            with pytest.raises(openai.BadRequestError) as e:  # (OpenAI's answer to an unknown previous response)
                c.responses.create(model=MODEL, input="Hi", previous_response_id=rid, max_output_tokens=3)
            assert e.value.body["param"] == "previous_response_id"
        assert lf.gateway.store_ops.get("read", "corrupt") == 3 * 6
        assert sum("corrupt" in m or "unreadable" in m for m in caplog.messages) == 3 * 6


@pytest.mark.parametrize("err,expect", [
    ("WRONGTYPE Operation against a key holding the wrong kind of value", "corrupt"),
    ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", "unavailable"),
    ("TRYAGAIN Multiple keys request during rehashing of slot", "unavailable"),
])
async def test_only_a_wrong_type_is_a_corrupt_record_other_redis_errors_are_retryable(prefix, err, expect):
    """Review: every ResponseError was answered as a corrupt record (404: the client's previous_response_id lost
    for good), BUSY or MASTERDOWN included, which pass."""
    from redis.exceptions import ResponseError

    from steersman.api.response_store import StoredCorrupt

    store = RedisResponseStore(URL, prefix, 10**6, 60.0, timeout_s=1.0)

    async def failing(key):
        raise ResponseError(err)
    store.client.get = failing
    try:
        with pytest.raises(StoredCorrupt if expect == "corrupt" else StoreUnavailable):
            await store.get("acme", "resp_1")
    finally:
        await store.close()
