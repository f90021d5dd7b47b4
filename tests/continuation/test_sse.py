"""The engine-stream SSE parser: same events however the bytes are split; spec corner cases."""

import pytest
from hypothesis import given, settings, strategies as st

from steersman.engines.sse import DONE, SseError, SseParser


def reference(stream: bytes) -> list[bytes]:
    """WHATWG event-stream dispatch, written plainly (line by line, whole input)."""
    text = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    out, data = [], None
    for line in text.split(b"\n")[:-1]:  # the last element is an unterminated line
        if not line:
            if data is not None:
                out.append(b"\n".join(data))
            data = None
            continue
        if line.startswith(b":"):
            continue
        name, colon, value = line.partition(b":")
        if name == b"data":
            value = value[1:] if value.startswith(b" ") else value
            data = [value] if data is None else data + [value]
    return out


def feed_all(chunks, limit=1 << 20):
    p = SseParser(limit)
    out = []
    for c in chunks:
        out += p.feed(c)
    return out + p.close()


payload = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
line_end = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def event_streams(draw):
    parts = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["data", "multi", "comment", "field", "json"]))
        end = draw(line_end)
        if kind == "data":
            parts.append(b"data: " + draw(payload) + end)
        elif kind == "multi":
            parts.append(b"data:" + draw(payload) + end + b"data: " + draw(payload) + end)
        elif kind == "comment":
            parts.append(b": keep-alive " + draw(payload) + end)
        elif kind == "field":
            parts.append(draw(st.sampled_from([b"event: x", b"id: 7", b"retry: 10"])) + end)
        else:
            parts.append(b'data: {"choices":[{"delta":{"content":"a b"}}]}' + end)
        parts.append(end)  # blank line: dispatch (the same line end: "\r" then "\n" would be one "\r\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


@settings(max_examples=300, deadline=None)
@given(stream=event_streams(), data=st.data())
def test_arbitrary_splits_give_the_same_events(stream, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    whole = feed_all([stream])
    assert whole == reference(stream)
    assert feed_all(chunks) == whole
    assert whole[-1] == DONE


@settings(max_examples=50, deadline=None)
@given(stream=event_streams())
def test_one_byte_at_a_time(stream):
    assert feed_all([stream[i : i + 1] for i in range(len(stream))]) == reference(stream)


def test_openai_shapes():
    s = b'data: {"a":1}\n\ndata: {"a":2}\r\n\r\n: ping\n\ndata: x\ndata: y\n\nevent: e\nid: 1\n\ndata: [DONE]\n\n'
    assert feed_all([s]) == [b'{"a":1}', b'{"a":2}', b"x\ny", DONE]


def test_unfinished_event_at_the_end_is_an_error():
    with pytest.raises(SseError):
        feed_all([b'data: {"a":1}\n\ndata: {"a":'])
    assert feed_all([b"data: [DONE]\n"]) == [DONE]  # a missing final blank line after [DONE] is tolerated


def test_oversized_event_is_an_error_not_a_growing_buffer():
    p = SseParser(1000)
    p.feed(b"data: " + b"x" * 900)
    with pytest.raises(SseError):
        p.feed(b"x" * 200)
    p = SseParser(1000)
    with pytest.raises(SseError):
        p.feed(b"\r" + b"y" * 2000)


@settings(max_examples=200, deadline=None)
@given(stream=event_streams(), data=st.data())
def test_clean_means_the_read_was_exactly_its_events(stream, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    p = SseParser(1 << 20)
    for a, b in zip([0] + cuts, cuts + [len(stream)]):
        chunk = stream[a:b]
        got = p.feed(chunk)
        if p.clean:
            assert chunk == b"".join(b"data: " + e + b"\n\n" for e in got)
