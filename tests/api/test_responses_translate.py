"""The Responses API's translation to and from chat completions (no server): items, tools, formats, errors,
stream events, and the store's bounds."""

from __future__ import annotations

import orjson
import pytest

from steersman.api.errors import ApiError
from steersman.api.response_store import MemoryResponseStore
from steersman.testing import FakeClock
from steersman.api.responses import chat_param, translate_request
from steersman.api.responses_out import ResponseBuilder, ResponseEvents


def _t(**doc):
    return translate_request(orjson.dumps({"model": "m", **doc}))


def _refused(param: str, **doc) -> ApiError:
    with pytest.raises(ApiError) as e:
        _t(**doc)
    assert e.value.status == 400 and e.value.param == param, e.value
    return e.value


def test_a_string_input_with_instructions_is_a_system_and_a_user_message():
    call = _t(input="Hi", instructions="Be terse.", max_output_tokens=9, temperature=0.2, top_k=5)
    assert call.chat["messages"] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert call.chat["max_tokens"] == 9 and call.chat["temperature"] == 0.2
    assert call.chat["top_k"] == 5  # an engine's own field: forwarded as sent, like every unknown field
    assert call.history == [{"role": "user", "content": "Hi"}]  # instructions are not carried to the next turn
    assert "stream" not in call.chat and call.store and call.echo["instructions"] == "Be terse."


def test_items_become_the_chat_conversation_an_agent_sends():
    items = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Rome?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"city\":\"Rome\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "a"}, {"type": "input_image",
                                                                              "image_url": "data:x"}]},
    ]
    msgs = _t(input=items).chat["messages"]
    assert msgs[0] == {"role": "system", "content": "Use tools."}
    assert msgs[1] == {"role": "user", "content": "Weather in Paris and Rome?"}
    assert msgs[2]["role"] == "assistant" and msgs[2]["content"] is None
    assert [c["id"] for c in msgs[2]["tool_calls"]] == ["c1", "c2"]  # one turn's calls: one assistant message
    assert msgs[2]["tool_calls"][1]["function"] == {"name": "w", "arguments": "{\"city\":\"Rome\"}"}
    assert msgs[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert msgs[4] == {"role": "tool", "tool_call_id": "c2", "content": "rain"}
    assert msgs[5]["content"] == [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:x"}}]


def test_tools_choice_and_formats_in_chat_form():
    call = _t(input="x", stream=True, tool_choice={"type": "function", "name": "w"},
              tools=[{"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": True}],
              text={"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": True}})
    assert call.chat["tools"] == [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"},
                                                                     "strict": True}}]
    assert call.chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert call.chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "s", "schema": {"type": "object"}, "strict": True}}
    assert call.chat["stream"] and call.chat["stream_options"] == {"include_usage": True}
    assert _t(input="x", text={"format": {"type": "json_object"}}).chat["response_format"] == {"type": "json_object"}
    assert "response_format" not in _t(input="x", text={"format": {"type": "text"}}).chat


def test_auto_or_none_without_tools_is_taken_as_openai_takes_it():
    """The Responses API takes ``tool_choice`` "auto" / "none" with no tools; the chat request (checked as vLLM checks
    it) would refuse a tool_choice without tools, so those are not passed on; "required" without tools still is."""
    for choice in ("auto", "none"):
        assert "tool_choice" not in _t(input="x", tool_choice=choice).chat
    assert _t(input="x", tool_choice="required").chat["tool_choice"] == "required"
    assert _t(input="x", tool_choice="auto", tools=[{"type": "function", "name": "w"}]).chat["tool_choice"] == "auto"


def test_a_previous_turn_is_the_conversation_before_the_new_input():
    before = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    call = translate_request(orjson.dumps({"model": "m", "input": "c", "instructions": "I"}), before)
    assert call.chat["messages"] == [{"role": "system", "content": "I"}, *before, {"role": "user", "content": "c"}]
    assert call.history == [*before, {"role": "user", "content": "c"}]


@pytest.mark.parametrize("param,doc", [
    ("model", {"model": None, "input": "x"}),
    ("input", {}),
    ("input", {"input": []}),
    ("input", {"input": 3}),
    ("input[0]", {"input": ["x"]}),
    ("input[0].type", {"input": [{"type": "file_search_call"}]}),
    ("input[0].type", {"input": [{"content": "no role, no type"}]}),
    ("input[0].role", {"input": [{"role": "tool", "content": "x"}]}),
    ("input[0].content", {"input": [{"role": "user"}]}),
    ("input[0].content[0].type", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
    ("input[0].content[0].image_url", {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
    ("input[0].content[0].text", {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}),
    ("input[1].call_id", {"input": ["a", {"type": "function_call", "name": "w", "arguments": "{}"}][1:] * 2}),
    ("input[0].output", {"input": [{"type": "function_call_output", "call_id": "c"}]}),
    ("tools[0].type", {"input": "x", "tools": [{"type": "web_search"}]}),
    ("tools[1].name", {"input": "x", "tools": [{"type": "function", "name": "a"}, {"type": "function"}]}),
    ("tools[1].name", {"input": "x", "tools": [{"type": "function", "name": "a"}, {"type": "function", "name": ""}]}),
    ("tool_choice", {"input": "x", "tool_choice": {"type": "file_search"}}),
    ("text.format.type", {"input": "x", "text": {"format": {"type": "xml"}}}),
    ("text.format.schema", {"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}),
    ("background", {"input": "x", "background": True}),
    ("conversation", {"input": "x", "conversation": "conv_1"}),
    ("top_logprobs", {"input": "x", "top_logprobs": 3}),
    ("stream", {"input": "x", "stream": "yes"}),
    ("store", {"input": "x", "store": 1}),
    ("metadata", {"input": "x", "metadata": {"a": 1}}),
    ("truncation", {"input": "x", "truncation": "middle"}),
])
def test_bad_requests_name_the_field(param, doc):
    if param == "input[1].call_id":
        doc = {"input": [{"role": "user", "content": "x"}, {"type": "function_call", "name": "w", "arguments": "{}"}]}
    _refused(param, **doc)


def test_a_body_that_is_not_a_json_object_is_a_400():
    for body in (b"{nope", b"[1]"):
        with pytest.raises(ApiError) as e:
            translate_request(body)
        assert e.value.status == 400


@pytest.mark.parametrize("chat,own", [
    ("max_tokens", "max_output_tokens"), ("max_completion_tokens", "max_output_tokens"),
    ("messages", "input"), ("messages[3].content[0]", "input"), ("response_format", "text.format"),
    ("response_format.json_schema.schema", "text.format.schema"), ("tools[2].function.name", "tools[2].name"),
    ("tool_choice.function.name", "tool_choice.name"), ("tool_choice", "tool_choice"), ("temperature", "temperature"),
    (None, None),
])
def test_chat_fields_named_in_errors_are_named_as_the_responses_request_names_them(chat, own):
    assert chat_param(chat) == own


def _sse(*payloads: dict | str) -> bytes:
    return b"".join(b"data: %b\n\n" % (p.encode() if isinstance(p, str) else orjson.dumps(p)) for p in payloads)


def _events(raw: bytes) -> list[dict]:
    out = []
    for block in raw.split(b"\n\n"):
        if block:
            kind, data = block.split(b"\n")
            ev = orjson.loads(data[len(b"data: "):])
            assert kind == b"event: " + ev["type"].encode()
            out.append(ev)
    return out


def _chunk(delta=None, finish=None, usage=None):
    d = {"id": "c", "object": "chat.completion.chunk", "choices": [] if delta is None and finish is None else
         [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage:
        d["usage"] = usage
    return d


def test_a_text_stream_becomes_the_responses_events_in_order_with_sequence_numbers():
    ev = ResponseEvents(ResponseBuilder(_t(input="x", stream=True), "m", 1))
    raw = ev.feed(_sse(_chunk({"role": "assistant"}), _chunk({"content": "Hel"})))
    raw += ev.feed(_sse(_chunk({"content": "lo"}), _chunk(finish="stop")))
    raw += ev.feed(_sse(_chunk(usage={"prompt_tokens": 5, "completion_tokens": 2,
                                      "prompt_tokens_details": {"cached_tokens": 4}}), "[DONE]"))
    got = _events(raw)
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[6]["text"] == "Hello" and got[8]["item"]["content"][0]["text"] == "Hello"
    final = got[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert final["usage"]["total_tokens"] == 7 and ev.assistant == {"role": "assistant", "content": "Hello"}


def test_streamed_tool_calls_become_function_call_items_and_length_is_incomplete():
    ev = ResponseEvents(ResponseBuilder(_t(input="x", stream=True), "m", 1))
    tc = lambda i, **f: {"tool_calls": [{"index": i, **f}]}  # noqa: E731
    raw = ev.feed(_sse(_chunk({"content": "Let me look."}),
                       _chunk(tc(0, id="c0", type="function", function={"name": "w", "arguments": ""})),
                       _chunk(tc(0, function={"arguments": "{\"a\""})), _chunk(tc(0, function={"arguments": ":1}"})),
                       _chunk(tc(1, id="c1", type="function", function={"name": "v", "arguments": "{}"})),
                       _chunk(finish="length"), "[DONE]"))
    got = _events(raw)
    done = [e["item"] for e in got if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["message", "function_call", "function_call"]
    assert done[1]["arguments"] == "{\"a\":1}" and done[1]["call_id"] == "c0" and done[2]["name"] == "v"
    assert got[-1]["type"] == "response.incomplete"
    assert got[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [c["id"] for c in ev.assistant["tool_calls"]] == ["c0", "c1"]
    # the answer was cut in its last call: that item is incomplete (its arguments may be cut), the first one whole
    assert [i["status"] for i in done] == ["completed", "completed", "incomplete"]
    assert [o["status"] for o in got[-1]["response"]["output"]] == ["completed", "completed", "incomplete"]


def test_a_whole_answer_cut_in_a_call_has_that_call_incomplete():
    b = ResponseBuilder(_t(input="x"), "m", 7)
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": "w", "arguments": a}}
             for k, a in enumerate(("{}", '{"city": "Par'))]
    body = orjson.dumps({"choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": None, "tool_calls": calls}}]})
    resp, _ = b.from_chat(body)
    assert resp["status"] == "incomplete" and [o["status"] for o in resp["output"]] == ["completed", "incomplete"]
    body = orjson.dumps({"choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": "Let me look.", "tool_calls": calls[1:]}}]})
    resp, _ = b.from_chat(body)  # text, then the cut call: the message is whole (as the stream closes it)
    assert [(o["type"], o["status"]) for o in resp["output"]] == [("message", "completed"), ("function_call", "incomplete")]


def test_an_error_event_becomes_error_and_response_failed():
    ev = ResponseEvents(ResponseBuilder(_t(input="x", stream=True), "m", 1))
    raw = ev.feed(_sse(_chunk({"content": "a"}),
                       {"error": {"message": "boom", "type": "server_error", "param": None, "code": "upstream_error"}}))
    got = _events(raw)
    assert [e["type"] for e in got][-2:] == ["error", "response.failed"]
    assert got[-2]["code"] == "upstream_error" and got[-1]["response"]["error"]["message"] == "boom"
    assert ev.feed(_sse("[DONE]")) == b""  # nothing after the failure


def test_a_whole_completion_becomes_a_response_object():
    b = ResponseBuilder(_t(input="x", metadata={"k": "v"}), "m", 7)
    body = orjson.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "w", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    resp, assistant = b.from_chat(body)
    assert resp["id"].startswith("resp_") and resp["created_at"] == 7 and resp["metadata"] == {"k": "v"}
    assert [o["type"] for o in resp["output"]] == ["function_call"] and resp["status"] == "completed"
    assert assistant["tool_calls"][0]["id"] == "c0" and assistant["content"] is None


def test_the_store_keeps_the_most_recently_used_within_its_bytes_and_per_tenant():
    s = MemoryResponseStore(2500, 3600.0, FakeClock())  # two of these entries, each record and its ~440 B held
    for i in range(10):
        s.put("t", {"id": f"r{i}", "pad": "x" * 400}, [{"role": "user", "content": "y" * 100}])
    assert 0 < s.bytes <= 2500 and s.lookup("t", "r9") is not None and s.lookup("t", "r0") is None
    kept = [i for i in range(10) if s.lookup("t", f"r{i}") is not None]
    s.lookup("t", f"r{kept[0]}")  # used: the next put evicts another one
    s.put("t", {"id": "new", "pad": "x" * 400}, [])
    assert s.lookup("t", f"r{kept[0]}") is not None and s.lookup("t", f"r{kept[1]}") is None
    assert s.lookup("other", "new") is None  # another tenant's id reads as unknown
    assert s.remove("t", "new") and not s.remove("t", "new")
    s.put("t", {"id": "huge", "pad": "x" * 5000}, [])
    assert s.lookup("t", "huge") is None  # larger than the whole store: not kept


async def test_a_stored_response_expires_after_its_ttl():
    clock = FakeClock()
    s = MemoryResponseStore(10**6, 60.0, clock)
    s.put("t", {"id": "r"}, [{"role": "user", "content": "a"}])
    await clock.advance(59.0)
    got = s.lookup("t", "r")
    assert got is not None and orjson.loads(got.response) == {"id": "r"} and got.conversation[0]["content"] == "a"
    await clock.advance(1.0)
    assert s.lookup("t", "r") is None and s.bytes == 0


class _Inner:
    """What ResponsesHttp writes to (the client's request)."""

    def __init__(self):
        self.answers = []

    def respond(self, status, body, content_type=b"application/json", extra=b""):
        self.answers.append((status, orjson.loads(body)))


def test_an_engine_answer_that_is_not_a_chat_completion_is_a_502_not_a_traceback():
    from steersman.api.responses_http import ResponsesHttp

    inner, done = _Inner(), []
    sink = ResponsesHttp(inner, ResponseBuilder(_t(input="x"), "m", 1), b"{}", lambda r, a: done.append(r))
    sink.respond(200, b"<html>oops</html>")
    sink2 = ResponsesHttp(inner, ResponseBuilder(_t(input="x"), "m", 1), b"{}", lambda r, a: done.append(r))
    sink2.respond(200, b'{"choices": "nope"}')
    assert [(s, b["error"]["code"]) for s, b in inner.answers] == [(502, "malformed_response")] * 2 and not done
    sink3 = ResponsesHttp(inner, ResponseBuilder(_t(input="x"), "m", 1), b"{}", lambda r, a: done.append(r))
    sink3.respond(400, orjson.dumps({"error": {"message": "`max_tokens` must be at least 1, got 0.",
                                               "type": "invalid_request_error", "param": "max_tokens", "code": None}}))
    assert inner.answers[-1][1]["error"]["param"] == "max_output_tokens"
    assert inner.answers[-1][1]["error"]["message"] == "`max_output_tokens` must be at least 1, got 0."


def test_truncation_auto_drops_the_oldest_turns_at_user_messages():
    hist = [{"role": "user", "content": f"q{i}"} if i % 2 == 0 else {"role": "assistant", "content": f"a{i}"}
            for i in range(10)]  # 5 turns
    call = translate_request(orjson.dumps({"model": "m", "input": "now", "instructions": "I", "truncation": "auto"}),
                             hist)
    assert call.skips() == [0, 2, 4, 8, 10]  # none, 1, 2, 4 and all 5 earlier turns
    last = orjson.loads(call.chat_body(10))["messages"]
    assert last == [{"role": "system", "content": "I"}, {"role": "user", "content": "now"}]
    assert orjson.loads(call.chat_body(2))["messages"][1] == {"role": "user", "content": "q2"}
    assert translate_request(orjson.dumps({"model": "m", "input": "now"}), hist).skips() == [0]  # disabled
    tool_turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    call = translate_request(orjson.dumps({"model": "m", "truncation": "auto", "input": [
        {"type": "function_call_output", "call_id": "c", "output": "x"}]}), tool_turn)
    assert call.skips() == [0]  # the tool's output keeps the call it answers: no cut inside the turn


def test_a_replayed_output_is_the_conversation_previous_response_id_continues():
    """OpenAI's manual chaining (input += response.output) and previous_response_id send the engine one conversation:
    a message and the function_call after it are one assistant message with its tool calls."""
    first = _t(input="Weather in Paris?", tools=[{"type": "function", "name": "w"}])
    resp, assistant = ResponseBuilder(first, "m", 1).from_chat(orjson.dumps({"choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "Let me check.",
                                                               "tool_calls": [{"id": "c1", "type": "function",
                                                                               "function": {"name": "w", "arguments": "{}"}}]}}]}))
    assert [o["type"] for o in resp["output"]] == ["message", "function_call"]
    fco = {"type": "function_call_output", "call_id": "c1", "output": "21C"}
    by_id = translate_request(orjson.dumps({"model": "m", "input": [fco]}), first.history + [assistant])
    manual = _t(input=[{"role": "user", "content": "Weather in Paris?"}, *resp["output"], fco])
    assert manual.chat["messages"] == by_id.chat["messages"]
    assert [m["role"] for m in manual.chat["messages"]] == ["user", "assistant", "tool"]
    assert manual.chat["messages"][1] == {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]}


@pytest.mark.parametrize("key,value", [("n", 2), ("n", 0), ("n", True), ("best_of", 3)])
def test_n_and_best_of_other_than_one_are_refused(key, value):
    e = _refused(key, input="x", **{key: value})
    assert e.code == "unsupported_value"
    call = _t(input="x", n=1, best_of=1)  # one answer: what a response is anyway
    assert "n" not in call.chat and "best_of" not in call.chat


def test_a_stream_of_several_choices_is_translated_from_the_first_only():
    ev = ResponseEvents(ResponseBuilder(_t(input="x", stream=True), "m", 1))
    two = lambda i, text: {"id": "c", "object": "chat.completion.chunk", "choices": [  # noqa: E731
        {"index": i, "delta": {"content": text}, "finish_reason": None}]}
    raw = ev.feed(_sse(two(0, "a"), two(1, "X"), two(0, "b"), two(1, "Y"), _chunk(finish="stop"), "[DONE]"))
    got = _events(raw)
    assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") == "ab"
    assert got[-1]["response"]["output"][0]["content"][0]["text"] == "ab" and ev.assistant["content"] == "ab"


def test_chunks_a_chat_client_takes_do_not_break_the_translation():
    tc = {"tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "w",
                                                                                  "arguments": {"city": "Paris"}}}]}
    ev = ResponseEvents(ResponseBuilder(_t(input="x", stream=True), "m", 1))
    got = _events(ev.feed(_sse(_chunk(tc), _chunk(finish="tool_calls"), _chunk(usage={
        "prompt_tokens": "n/a", "completion_tokens": 2.0, "prompt_tokens_details": {"cached_tokens": -1}}), "[DONE]")))
    assert got[-1]["type"] == "response.completed"
    call = got[-1]["response"]["output"][0]
    assert call["type"] == "function_call" and orjson.loads(call["arguments"]) == {"city": "Paris"}
    assert got[-1]["response"]["usage"]["input_tokens"] == 0 and got[-1]["response"]["usage"]["output_tokens"] == 2
    assert ev.assistant["tool_calls"][0]["function"]["arguments"] == call["arguments"]
    resp, assistant = ResponseBuilder(_t(input="x"), "m", 1).from_chat(orjson.dumps({"choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
                                                               "tool_calls": [tc["tool_calls"][0]]}}],
        "usage": {"prompt_tokens": None, "completion_tokens": "2"}}))
    assert orjson.loads(resp["output"][0]["arguments"]) == {"city": "Paris"} and resp["usage"]["total_tokens"] == 0
    assert assistant["tool_calls"][0]["function"]["arguments"] == resp["output"][0]["arguments"]


@pytest.mark.parametrize("chunk", [
    {"id": "c", "object": "chat.completion.chunk", "choices": ["not a choice"]},
    {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": [0], "function": {"name": "w"}}]}, "finish_reason": None}]},
])
def test_a_chunk_the_translation_cannot_read_fails_the_response_and_ends_the_stream(chunk):
    ev = ResponseEvents(ResponseBuilder(_t(input="x", stream=True), "m", 1))
    got = _events(ev.feed(_sse(_chunk({"content": "a"}), chunk, _chunk({"content": "b"}))))
    assert [e["type"] for e in got][-2:] == ["error", "response.failed"] and got[-2]["code"] == "server_error"
    assert got[-1]["response"]["status"] == "failed" and ev.assistant is None
    assert ev.feed(_sse(_chunk({"content": "c"}), "[DONE]")) == b""  # nothing after the failure


def test_a_tool_call_without_an_id_is_given_one_the_response_and_the_conversation_share():
    resp, assistant = ResponseBuilder(_t(input="x"), "m", 1).from_chat(orjson.dumps({"choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "w", "arguments": "{}"}}]}}]}))
    call_id = resp["output"][0]["call_id"]
    assert call_id.startswith("call_") and assistant["tool_calls"][0]["id"] == call_id
    nxt = translate_request(orjson.dumps({"model": "m", "input": [
        {"type": "function_call_output", "call_id": call_id, "output": "sunny"}]}), [{"role": "user", "content": "x"},
                                                                                    assistant])
    assert nxt.chat["messages"][1]["tool_calls"][0]["id"] == nxt.chat["messages"][2]["tool_call_id"]


def test_explicit_nulls_are_the_defaults_and_falsy_wrong_types_are_still_refused():
    # OpenAI takes `stream: null` / `store: null` as absent; they were 400s
    call = _t(input="x", stream=None, store=None)
    assert call.stream is False and call.store is True and "stream" not in call.chat
    for field in ("stream", "store"):
        with pytest.raises(ApiError) as e:
            _t(input="x", **{field: 0})
        assert e.value.param == field


def test_a_chat_error_is_worded_with_the_responses_fields():
    from steersman.api.responses_http import _mapped_error

    body = orjson.dumps({"error": {"message": "`messages[3].content` must be a string; see `messages`.",
                                   "type": "invalid_request_error", "param": "messages[3].content", "code": "x"}})
    err = orjson.loads(_mapped_error(body))["error"]
    assert err["param"] == "input" and err["message"] == "`input` must be a string; see `input`."  # kept messages[3]
