"""Malformed engine streams end the client's stream with a clear error event, never a hang.

A small raw asyncio TCP server on 127.0.0.1 plays a broken engine behind the
real gateway; the scenario is named by the user message.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

from cont_streams import raw_engines, serve_script

CHUNK = b'data: {"id":"x1","object":"chat.completion.chunk","created":1,"model":"raw","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
ROLE = b'data: {"id":"x1","object":"chat.completion.chunk","created":1,"model":"raw","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
MAX_EVENT = 4096

SCENARIOS = {
    "bad-json": [ROLE, CHUNK, b"data: {not json at all\n\n", "hang"],
    "garbage-then-close": [ROLE, CHUNK, b"\x00\xff\xfe garbage without a line end", "reset"],
    "no-done": [ROLE, CHUNK, CHUNK, "end"],
    "oversized": [ROLE, CHUNK, b"data: " + b"x" * (MAX_EVENT * 3), "hang"],
    "not-a-chunk": [ROLE, b'data: [1, 2, 3]\n\n', "hang"],
    "engine-error-event": [ROLE, CHUNK, b'data: {"error": {"message": "engine OOM", "code": 500}}\n\n', "hang"],
    "bad-first-event": [b"data: {{{\n\n", "hang"],
    "tool-call-then-reset": [ROLE, b'data: {"id":"x1","object":"chat.completion.chunk","created":1,"model":"raw","choices":'
                             b'[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":'
                             b'{"name":"f","arguments":"{\\"a\\""}}]},"finish_reason":null}]}\n\n', "reset"],
    "split-bytes": [ROLE[:7], ROLE[7:50], ROLE[50:], CHUNK[:1], CHUNK[1:], b"data: [DONE]\r\n", b"\r\n", "end"],
}


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await serve_script(reader, writer, lambda body: SCENARIOS[body["messages"][-1]["content"]])


@pytest.fixture(scope="module")
def raw_engine():
    """The broken engine, on its own loop in a thread: its URL."""
    with raw_engines(_handle) as (url,):
        yield url


@pytest.fixture
def fleet(raw_engine):
    """A fresh gateway per scenario: failures of one scenario must not eject / throttle the next one's engine."""
    raw = [{"name": "raw", "url": raw_engine, "engine": "openai", "models": ["raw"]}]
    sim = [SimServerConfig(gpu="H100", model="qwen2.5-7b", speedup=50.0, port=0)]
    with LiveFleet(sims=sim, endpoints=raw, gateway={"max_sse_event_bytes": MAX_EVENT}) as lf:
        yield lf


@pytest.fixture
def client(fleet):
    with openai.OpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0, timeout=10) as c:
        yield c


@pytest.mark.parametrize("scenario,says", [
    ("bad-json", "not an OpenAI chunk"),
    ("garbage-then-close", "failed mid-response"),
    ("no-done", "inside an event|without finishing"),
    ("oversized", "longer than 4096 bytes"),
    ("not-a-chunk", "not an OpenAI chunk"),
    ("engine-error-event", "engine OOM"),
    ("bad-first-event", "not an OpenAI chunk"),
    ("tool-call-then-reset", "cannot be continued .*tool call in progress"),
])
def test_malformed_engine_stream_ends_with_an_error_event(fleet, client, scenario, says):
    import re

    t0 = time.monotonic()
    seen = []
    with pytest.raises(openai.APIError) as e:
        for ch in client.chat.completions.create(model="raw", stream=True, messages=[{"role": "user", "content": scenario}]):
            seen += [c.delta.content for c in ch.choices if c.delta.content]
    assert time.monotonic() - t0 < 5, "the gateway must not wait for the broken engine"
    assert re.search(says, str(e.value)), str(e.value)
    assert "Traceback" not in str(e.value)
    assert all(s == " tok" for s in seen)  # only the valid events before the fault reached the client
    if scenario.startswith("tool-call"):  # refused continuation, not migrated
        samples = [x for x in httpx.get(fleet.url + "/metrics").text.splitlines()
                   if x.startswith("steersman:stream_migrations_total{")]
        assert not samples, samples


def test_events_split_anywhere_and_crlf_are_relayed_whole(client):
    got = []
    for ch in client.chat.completions.create(model="raw", stream=True, messages=[{"role": "user", "content": "split-bytes"}]):
        got += [c.delta.content for c in ch.choices if c.delta.content]
    assert got == [" tok"]


def test_gateway_stays_healthy_after(fleet, client):
    # some good traffic first: the gateway's adaptive throttle (SRE, K = 2) then tolerates a few broken streams
    for _ in range(4):
        client.chat.completions.create(model="qwen2.5-7b", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    for scenario in ("bad-json", "oversized", "no-done"):
        with pytest.raises(openai.APIError):
            list(client.chat.completions.create(model="raw", stream=True, messages=[{"role": "user", "content": scenario}]))
    r = client.chat.completions.create(model="qwen2.5-7b", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content
    assert httpx.get(fleet.url + "/health", timeout=5).status_code == 200
