"""A UTF-8 byte order mark starting an engine's event stream is dropped (WHATWG event-stream grammar), not read
into the first line's field name (which dropped the stream's first event); one later in the stream is data."""

from __future__ import annotations

import openai
import orjson
import pytest

from steersman.engines.sse import SseParser
from steersman.testing import LiveFleet
from steersman.testing.scripted import Script

BOM = b"\xef\xbb\xbf"
STREAM = BOM + b'data: {"a":1}\n\ndata: {"b":2}\n\n'


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, len(STREAM)])
def test_a_leading_bom_is_dropped_however_the_reads_split_it(size):
    p = SseParser(1 << 20)
    got = []
    for i in range(0, len(STREAM), size):
        got += p.feed(STREAM[i:i + size])
    assert got + p.close() == [b'{"a":1}', b'{"b":2}']


def test_the_read_that_lost_its_bom_is_not_relayed_as_it_came():
    p = SseParser(1 << 20)
    assert p.feed(BOM + b"data: x\n\n") == [b"x"] and not p.clean  # the relay writes the event, not the BOM
    assert p.feed(b"data: y\n\n") == [b"y"] and p.clean


def test_only_the_streams_start_is_a_bom():
    p = SseParser(1 << 20)
    assert p.feed(b"data: x\n\n") == [b"x"]
    assert p.feed(BOM + b"data: y\n\n") == []  # the field is named BOM + "data": not data
    assert p.feed(b"\xef") == [] and p.feed(b"\xbb\xbfdata: z\n\ndata: w\n\n") == [b"w"]


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    return b"data: %b\n\n" % orjson.dumps({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_an_engine_stream_starting_with_a_bom_reaches_the_client_whole():
    stream = BOM + _chunk("Hel") + _chunk("lo") + _chunk(None, "stop") + b"data: [DONE]\n\n"
    with LiveFleet(scripted=[Script(model="m", malformed=stream)]) as lf, \
            openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hello"  # was "lo"
    assert chunks[-1].choices[0].finish_reason == "stop"
