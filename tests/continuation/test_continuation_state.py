"""Continuation state: what is recorded from a stream, the continuation request, the rewritten chunks."""

import orjson
import pytest

from steersman.api.schema import decode_chat, decode_completion
from steersman.engines.sse import DONE
from steersman.enginesim.chunks import ChunkWriter
from steersman.pipeline.continuation import BadEvent, Continuation

LIMIT = 131072


def chat_cont(**extra):
    body = orjson.dumps({"model": "m", "stream": True, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
                         "x_unknown": 1, **extra})
    return Continuation(decode_chat(body, LIMIT), body, 7)


def payload(event: bytes) -> bytes:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return event[6:-2]


def test_records_text_tokens_and_builds_the_assistant_prefix_request():
    c = chat_cont()
    w = ChunkWriter(True, "chatcmpl-1", 123, "m")
    c.begin_leg()
    for e in (w.role(), w.token("Hello"), w.token(" world")):
        c.observe(payload(e))
    assert (c.text, c.tokens, c.remaining, c.allowed) == ("Hello world", 2, 8, True)
    body = orjson.loads(c.request_body())
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello world"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8 and body["stream_options"] == {"include_usage": True}
    assert body["x_unknown"] == 1  # unknown fields travel on, as in the original request


def test_a_truncated_prompt_keeps_the_emitted_text_too():
    """``truncate_prompt_tokens`` k: the engine keeps the prompt's last k tokens.  The next leg's prompt is the prompt
    and the emitted text: it keeps k more (with k alone it dropped as many of the prompt's as were emitted)."""
    raw = orjson.dumps({"model": "m", "stream": True, "max_tokens": 10, "truncate_prompt_tokens": 12,
                        "messages": [{"role": "user", "content": "hi"}]})
    c = Continuation(decode_chat(raw, LIMIT), raw, 7)
    w = ChunkWriter(True, "chatcmpl-1", 123, "m")
    c.begin_leg()
    for e in (w.role(), w.token("Hello"), w.token(" world"), w.token("!")):
        c.observe(payload(e))
    assert orjson.loads(c.request_body())["truncate_prompt_tokens"] == 12 + 3
    raw = orjson.dumps({"model": "m", "stream": True, "truncate_prompt_tokens": -1,
                        "messages": [{"role": "user", "content": "hi"}]})
    c = Continuation(decode_chat(raw, LIMIT), raw, 7)  # -1 (the model's context): as it was
    c.begin_leg()
    c.observe(payload(w.token("a")))
    assert orjson.loads(c.request_body())["truncate_prompt_tokens"] == -1


def test_values_the_gateway_forwards_unread_are_written_back_byte_for_byte():
    """An unknown field holding what no JSON library takes as a float (``1e999``) or an integer past 64 bits, at
    the top level or inside a message, is forwarded untouched: the continuation request keeps it (it was an
    internal error: the body was decoded whole again)."""
    raw = (b'{"model":"m","stream":true,"max_tokens":10,"x_big":1e999,"x_int":123456789012345678901234567890,'
           b'"messages":[{"role":"user","content":"hi","x_m":1e999}],"continue_final_message":false}')
    c = Continuation(decode_chat(raw, LIMIT), raw, 7)
    w = ChunkWriter(True, "chatcmpl-1", 123, "m")
    c.begin_leg()
    for e in (w.role(), w.token("Hello")):
        c.observe(payload(e))
    out = c.request_body()
    assert b'"x_big":1e999' in out and b'"x_int":123456789012345678901234567890' in out and b'"x_m":1e999' in out
    tail = orjson.loads(out.replace(b"1e999", b"0"))
    assert tail["messages"][-1] == {"role": "assistant", "content": "Hello"} and tail["max_tokens"] == 9
    assert tail["continue_final_message"] is True and tail["stream_options"] == {"include_usage": True}


def test_the_clients_prefill_goes_on_in_its_own_message_with_its_parts():
    raw = orjson.dumps({"model": "m", "stream": True, "max_tokens": 10, "continue_final_message": True,
                        "add_generation_prompt": False, "min_tokens": 3, "messages": [
                            {"role": "user", "content": "hi"},
                            {"role": "assistant", "content": [{"type": "text", "text": "Sure:"}]}]})
    c = Continuation(decode_chat(raw, LIMIT), raw, 7)
    w = ChunkWriter(True, "chatcmpl-1", 123, "m")
    c.begin_leg()
    for e in (w.role(), w.token(" yes")):
        c.observe(payload(e))
    b = orjson.loads(c.request_body())
    assert b["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "Sure: yes"}]}
    assert len(b["messages"]) == 2 and b["min_tokens"] == 2 and b["max_tokens"] == 9


def test_rewrite_drops_the_second_role_chunk_and_keeps_the_first_head():
    c = chat_cont(stream_options={"include_usage": True})
    c.begin_leg()
    w1 = ChunkWriter(True, "chatcmpl-1", 123, "m")
    for e in (w1.role(), w1.token("a"), w1.token(" b")):
        c.observe(payload(e))
    c.begin_leg()
    w2 = ChunkWriter(True, "chatcmpl-2", 999, "m2")
    assert c.rewrite(payload(w2.role())) is None
    t = orjson.loads(c.rewrite(payload(w2.token(" c", "length"))))
    assert (t["id"], t["created"], t["model"]) == ("chatcmpl-1", 123, "m")
    assert t["choices"][0]["delta"] == {"content": " c"}
    u = orjson.loads(c.rewrite(payload(w2.usage({"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}))))
    assert u["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert c.rewrite(DONE) == DONE and c.done


def test_usage_chunk_dropped_when_the_client_did_not_ask():
    c = chat_cont()
    c.begin_leg()
    c.begin_leg()
    w = ChunkWriter(True, "x", 1, "m")
    assert c.rewrite(payload(w.usage({"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}))) is None


def test_completion_continuation_appends_to_the_prompt():
    body = orjson.dumps({"model": "m", "prompt": "Once ", "max_tokens": 5, "stream": True})
    c = Continuation(decode_completion(body, LIMIT), body, None)
    c.begin_leg()
    w = ChunkWriter(False, "cmpl-1", 1, "m")
    c.observe(payload(w.token("upon")))
    b = orjson.loads(c.request_body())
    assert b["prompt"] == "Once upon" and b["max_tokens"] == 4


@pytest.mark.parametrize("extra,reason", [
    ({"n": 2}, "n > 1"),
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"guided_json": {"type": "object"}}, "guided"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ({"guided_regex": "a+"}, "guided"),
    ({"guided_choice": ["a", "b"]}, "guided"),
    ({"guided_grammar": "root ::= x"}, "guided"),
    ({"structured_outputs": {"json": {}}}, "guided"),
    ({"grammar": "root ::= x"}, "guided"),
    ({"json_schema": {"type": "object"}}, "guided"),
])
def test_unsafe_requests_are_not_continued(extra, reason):
    c = chat_cont(**extra)
    assert not c.allowed and reason in c.reason


@pytest.mark.parametrize("extra", [{"logprobs": False}, {"logprobs": None}, {"top_logprobs": 0},
                                   {"guided_json": None}, {"grammar": ""}, {"guided_choice": []},
                                   {"response_format": {"type": "text"}},
                                   {"messages_note": "guided_json logprobs grammar json_schema"}])
def test_absent_or_empty_constraints_leave_continuation_allowed(extra):
    assert chat_cont(**extra).allowed


def test_completion_logprobs_forbid_continuation():
    for k in (3, 0):  # 0: the chosen token's log probability alone, still one per token
        body = orjson.dumps({"model": "m", "prompt": "Once", "stream": True, "logprobs": k})
        c = Continuation(decode_completion(body, LIMIT), body, None)
        assert not c.allowed and "logprobs" in c.reason


def test_a_tool_call_in_progress_forbids_continuation():
    c = chat_cont(tools=[{"type": "function", "function": {"name": "f"}}])
    assert c.allowed
    c.begin_leg()
    c.observe(b'{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}')
    assert not c.allowed and "tool call" in c.reason


def test_token_id_prompts_are_not_continued():
    body = orjson.dumps({"model": "m", "prompt": [1, 2, 3], "stream": True})
    assert not Continuation(decode_completion(body, LIMIT), body, None).allowed


def test_malformed_events_raise():
    c = chat_cont()
    for bad in (b"{not json", b"[1,2]", b'{"choices": 5}', b'{"error": {"message": "boom"}}'):
        with pytest.raises(BadEvent):
            c.observe(bad)


def test_closing_events_when_the_engine_died_after_its_last_token():
    c = chat_cont(stream_options={"include_usage": True})
    c.begin_leg()
    w = ChunkWriter(True, "chatcmpl-1", 5, "m")
    c.observe(payload(w.role()))
    for i in range(10):
        c.observe(payload(w.token(f" t{i}")))
    assert c.remaining == 0
    events = [orjson.loads(e[6:]) for e in c.closing_events().split(b"\n\n") if e and e != b"data: [DONE]"]
    assert events[0]["choices"][0]["finish_reason"] == "length"
    assert events[1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17}


def test_plain_token_events_take_the_template_path_and_stay_validated():
    c = chat_cont()
    c.begin_leg()
    w = ChunkWriter(True, "chatcmpl-1", 5, "m")
    events = [w.role(), w.token("a"), w.token(' "quoted" \\ é'), w.token("\n"), w.token(""), w.token(" b", "length")]
    assert c.observe_many([payload(e) for e in events]) == len(events)
    assert c._fh  # learned from the first plain token event
    assert (c.text, c.tokens, c.finish_reason) == ('a "quoted" \\ é\n b', 5, "length")
    bad = payload(w.token("x")).replace(b'"x"', b'"x')  # the same bytes around a broken string
    with pytest.raises(BadEvent):
        c.observe(bad)
    with pytest.raises(BadEvent):
        c.observe(payload(w.token("x")).replace(b'"x"', b'"x",'))


from hypothesis import given, settings, strategies as st  # noqa: E402


def _relay_run(chunks):
    from types import SimpleNamespace

    from steersman.clock import WallClock
    from steersman.engines.sse import SseParser
    from steersman.obs.metrics import GatewayMetrics
    from steersman.pipeline.forward import _Relay

    sent = []
    ended = []  # indexes of the writes that ended the stream

    def send(data, last=False):
        if last:
            ended.append(len(sent))
        sent.append(data)

    ctx = SimpleNamespace(model="m", started=0.0, ticket=None, bytes_sent=False, http=SimpleNamespace(send=send))
    c = chat_cont()
    c.begin_leg()
    ex = SimpleNamespace(abort=lambda: None, last=False)
    r = _Relay(ctx, None, WallClock(), GatewayMetrics(), c, False, 1 << 20, ex)
    final = max((i for i, ch in enumerate(chunks) if ch), default=-1)
    for i, ch in enumerate(chunks):
        ex.last = i == final  # the connection hands over the response's last bytes (never an empty piece)
        r(ch)
    # the write carrying [DONE] ends the stream when those were the response's last bytes, and only then
    assert ended == ([len(sent) - 1] if c.done and sent and sent[-1].endswith(b"data: [DONE]\n\n") else []), (ended, sent)
    p = SseParser(1 << 20)
    return p.feed(b"".join(sent)) + p.close(), c


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_relay_sends_and_records_the_same_whatever_the_reads(data):
    w = ChunkWriter(True, "chatcmpl-1", 5, "m")
    words = [" a", ' "q"', " é", ",", " b\\\\", ""]
    stream = w.role() + b"".join(w.token(x) for x in words) + w.token(" end", "length") + w.done()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    got, c = _relay_run(chunks)
    want, ref = _relay_run([stream])
    per_event, _ = _relay_run([e + b"\n\n" for e in stream.split(b"\n\n")[:-1]])  # the template fast path
    assert per_event == want
    assert got == want and got[-1] == DONE
    assert (c.text, c.tokens, c.finish_reason, c.done) == (ref.text, ref.tokens, ref.finish_reason, True)
    assert c.text == "".join(words) + " end" and c.tokens == len(words) + 1


def test_reads_of_several_plain_token_events_skip_the_event_parser():
    # an engine ahead of the gateway: one read carries several token events; when every one of them is a plain
    # token event (the learnt template around one JSON string) they are recorded without the SSE parser
    from steersman.engines.sse import SseParser

    feeds = []

    class Spy(SseParser):
        def feed(self, data):
            feeds.append(data)
            return super().feed(data)

    w = ChunkWriter(True, "chatcmpl-1", 5, "m")
    words = [" a", ' "q"', " é", ",", " b\\\\", "", " c\\nd"]
    events = [w.role()] + [w.token(x) for x in words] + [w.token(" end", "length"), w.done()]
    groups = [events[0:1], events[1:2], events[2:5], events[5:8], events[8:10]]  # role | 1 | 3 | 3 | end + [DONE]
    import steersman.pipeline.forward as fwd

    real = fwd.SseParser
    fwd.SseParser = Spy
    try:
        got, c = _relay_run([b"".join(g) for g in groups])
    finally:
        fwd.SseParser = real
    want, ref = _relay_run([b"".join(events)])
    assert got == want and (c.text, c.tokens, c.finish_reason, c.done) == (ref.text, ref.tokens, ref.finish_reason, True)
    assert c.tokens == len(words) + 1
    # parsed: the role event, the first token (the template is learnt from it), the finishing event with [DONE];
    # both 3-event reads took the template, the first of them as soon as it was learnt
    assert feeds == [events[0], events[1], b"".join(events[8:10])]


def test_a_group_with_one_different_event_takes_the_event_parser():
    # the same head and tail around the group, but one event inside it differs (a finish reason, another
    # `created`): the split leaves a piece that is not one JSON string, and the parser handles the read
    w = ChunkWriter(True, "chatcmpl-1", 5, "m")
    first = [w.role(), w.token(" a")]
    odd = w.token(" x", "stop")
    other = ChunkWriter(True, "chatcmpl-1", 6, "m").token(" y")  # a different `created`
    for middle in (odd, other):
        group = w.token(" b") + middle + w.token(" c")
        got, c = _relay_run(first + [group, w.done()])
        want, ref = _relay_run([b"".join(first) + group + w.done()])
        assert got == want and (c.text, c.tokens, c.finish_reason) == (ref.text, ref.tokens, ref.finish_reason)


@pytest.mark.parametrize("include,stops,pieces,expect", [
    # the stop string's end comes in the new leg's first piece: cut there (included) or at its start (not)
    (True, ["this of"], [" than this", " of public"], " of"),
    (False, ["this of"], [" than this", " of public"], ""),
    # of two stop strings the one that ends first wins; a stop string wholly in the new leg is the engine's own
    (True, ["is of", "this o"], [" than this", " of"], " o"),
    (True, ["public"], [" than this", " of public"], None),
    # one that ends two pieces into the leg
    (True, ["this of pub"], [" than this", " of", " public"], " pub"),
    # less text sent before the failover than the stop string's length (review: the tail kept the wrong end)
    (True, ["abcd"], ["ab", "cd and more"], "cd"),
    (True, ["###END"], ["a ##", "#END then"], "#END"),
])
def test_a_stop_string_the_failover_split_ends_the_stream_in_the_next_leg(include, stops, pieces, expect):
    c = chat_cont(stop=stops, include_stop_str_in_output=include)
    w = ChunkWriter(True, "chatcmpl-1", 123, "m")
    c.begin_leg()
    for e in (w.role(), w.token(pieces[0])):
        c.observe(payload(e))
    c.begin_leg()  # the engine died: another replica goes on
    out = [c.rewrite(payload(w.token(p))) for p in pieces[1:]]
    last = orjson.loads(out[-1])["choices"][0]
    if expect is None:
        assert not c.stopped and last["finish_reason"] is None
        return
    assert c.stopped and c.finish_reason == "stop" and last["finish_reason"] == "stop"
    assert last["delta"]["content"] == expect and c.text == pieces[0] + "".join(pieces[1:-1]) + expect


def test_a_stop_string_longer_than_the_text_before_the_failover_is_watched_over_several_pieces():
    """Re-review: with less text before the failover than the stop string's length, the window closed once the
    new leg's text reached the (shorter) tail: "a" + "bc" + "def" ran past the stop "abcdef"."""
    c = chat_cont(stop=["abcdef"], include_stop_str_in_output=True)
    w = ChunkWriter(True, "chatcmpl-1", 123, "m")
    c.begin_leg()
    for e in (w.role(), w.token("a")):
        c.observe(payload(e))
    c.begin_leg()
    assert orjson.loads(c.rewrite(payload(w.token("bc"))))["choices"][0]["finish_reason"] is None
    last = orjson.loads(c.rewrite(payload(w.token("def then"))))["choices"][0]
    assert c.stopped and last["finish_reason"] == "stop" and last["delta"]["content"] == "def"
