"""Fields OpenAI checks that the engines let by, from an audit with the official client (thirty-fourth session):
chat ``parallel_tool_calls`` / ``metadata`` of the wrong type went by unread, audio output, web search and the
legacy ``functions`` were answered as plain text; a Responses conversation whose function calls and outputs did
not pair went to the engine; a Response echoed ``reasoning.effort`` as null; a lone surrogate escape read
"Input data was truncated"; a 1 MB model name came back whole in the 404."""

from __future__ import annotations

import orjson
import pytest

from steersman.api.errors import ApiError, not_found_model
from steersman.api.responses import parse_body, translate_request
from steersman.api.schema import decode_chat

LIMIT = 1000
MSG = [{"role": "user", "content": "x"}]


def _chat(**extra):
    return decode_chat(orjson.dumps({"model": "m", "messages": MSG, **extra}), LIMIT)


def _chat_refused(param, **extra) -> ApiError:
    with pytest.raises(ApiError) as e:
        _chat(**extra)
    assert e.value.status == 400 and e.value.param == param, e.value
    return e.value


@pytest.mark.parametrize("param,extra", [
    ("parallel_tool_calls", {"parallel_tool_calls": "yes"}),
    ("metadata", {"metadata": 5}),
    ("metadata[...]", {"metadata": {"k": 1}}),
    ("metadata", {"metadata": {f"k{i}": "v" for i in range(17)}}),
    ("metadata." + "k" * 64, {"metadata": {"k" * 65: "v"}}),
    ("metadata.k", {"metadata": {"k": "v" * 513}}),
])
def test_wrong_types_and_sizes_of_openai_fields_are_400s_naming_them(param, extra):
    _chat_refused(param, **extra)


@pytest.mark.parametrize("key,value", [
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("modalities", ["text", "audio"]),
    ("web_search_options", {}),
    ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
    ("function_call", {"name": "f"}),
])
def test_what_no_engine_here_does_is_refused_not_answered_as_plain_text(key, value):
    e = _chat_refused(key, **{key: value})
    assert e.code == "unsupported_value"


def test_the_same_fields_within_openai_limits_are_taken():
    r = _chat(parallel_tool_calls=False, metadata={"k" * 64: "v" * 512}, modalities=["text"])
    assert r.parallel_tool_calls is False and r.metadata == {"k" * 64: "v" * 512}
    _chat(audio=None, functions=None)  # explicit nulls are absent
    _chat_refused("modalities", modalities="text")


CALL = [{"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "w", "arguments": "{}"}}]}]


def _turn(history, items):
    return translate_request(orjson.dumps({"model": "m", "input": items}), history)


def _refused(param, history, items) -> ApiError:
    with pytest.raises(ApiError) as e:
        _turn(history, items)
    assert e.value.status == 400 and e.value.param == param, e.value
    return e.value


def test_function_calls_and_their_outputs_pair_over_the_conversation_as_openai_checks():
    out = [{"type": "function_call_output", "call_id": c, "output": "21C"} for c in ("c1", "c2")]
    assert [m["role"] for m in _turn(CALL, out).chat["messages"]] == ["user", "assistant", "tool", "tool"]
    # the previous response's calls left unanswered: a new message alone is refused
    e = _refused("input", CALL, "never mind")
    assert "No tool output found for function call c1" in e.message
    e = _refused("input", CALL, out[:1])  # one of two parallel calls answered
    assert "c2" in e.message
    # an output for a call no one made, with or without a previous response
    e = _refused("input[2].call_id", CALL, [*out, {"type": "function_call_output", "call_id": "zz", "output": "x"}])
    assert "No tool call found for function call output with call_id zz" in e.message
    _refused("input[0].call_id", None, [{"type": "function_call_output", "call_id": "zz", "output": "x"}])
    # a conversation replayed whole (manual chaining) pairs within the input itself
    whole = [{"role": "user", "content": "q"}, {"type": "function_call", "call_id": "a", "name": "w", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "a", "output": "x"}, {"role": "user", "content": "thanks"}]
    assert len(_turn(None, whole).chat["messages"]) == 4
    _refused("input", None, whole[:2])


def test_a_response_echoes_the_reasoning_it_was_asked_for():
    call = translate_request(orjson.dumps({"model": "m", "input": "x", "reasoning": {"effort": "high"}}))
    assert call.echo["reasoning"] == {"effort": "high", "summary": None}
    assert translate_request(orjson.dumps({"model": "m", "input": "x"})).echo["reasoning"] == {"effort": None,
                                                                                               "summary": None}
    with pytest.raises(ApiError) as e:
        translate_request(orjson.dumps({"model": "m", "input": "x", "reasoning": {"summary": 3}}))
    assert e.value.param == "reasoning.summary"


def test_responses_metadata_keys_and_values_have_openai_lengths():
    with pytest.raises(ApiError) as e:
        translate_request(orjson.dumps({"model": "m", "input": "x", "metadata": {"k": "v" * 513}}))
    assert e.value.status == 400 and e.value.param == "metadata.k"


@pytest.mark.parametrize("body", [b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
                                  b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800"}]}'])
def test_a_lone_surrogate_escape_is_named_not_called_truncated(body):
    with pytest.raises(ApiError) as e:
        decode_chat(body, LIMIT)
    assert e.value.code == "invalid_json" and "surrogate" in e.value.message and "truncated" not in e.value.message
    with pytest.raises(ApiError) as e:
        parse_body(body)
    assert "surrogate" in e.value.message
    # a body that is truly cut short still says so, and an escaped backslash before "ud800" is plain text
    with pytest.raises(ApiError) as e:
        decode_chat(b'{"model": "m", "messages": [', LIMIT)
    assert "truncated" in e.value.message
    assert decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "a\\\\ud800"}]}', LIMIT)


def test_an_unknown_model_of_any_length_is_named_in_a_short_404():
    e = not_found_model("m" * 1_000_000)
    assert e.status == 404 and len(e.message) < 200 and "m" * 64 + "..." in e.message
