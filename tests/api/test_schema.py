import pytest

from steersman.api.errors import ApiError
from steersman.api.schema import decode_chat, decode_completion

LIMIT = 1000


def err(body: bytes, chat: bool = True) -> ApiError:
    with pytest.raises(ApiError) as e:
        (decode_chat if chat else decode_completion)(body, LIMIT)
    return e.value


@pytest.mark.parametrize(
    "body,param",
    [
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": 5, "messages": []}', "model"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": "hi"}', "messages"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 3}]}', "messages[0].content"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": true}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1001}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 99999999}', "max_completion_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 7}', "temperature"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}', "stream_options"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}', "logprobs"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": 3}', "logprobs"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', "top_logprobs"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}', "top_logprobs"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": -1}', "top_logprobs"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 1.5}', "top_logprobs"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}', "tools[0]"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}, 3]}', "tools[1]"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": "f"}', "tools"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}', "tool_choice"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ""}', "stop"),  # (as [""] is)
        (b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
         "messages[0].content[0].text"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}', "tool_choice"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}', "tool_choice"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function"}}', "tool_choice"),
    ],
)
def test_field_errors_name_the_field(body, param):
    e = err(body)
    assert e.status == 400 and e.param == param
    assert param.split(".")[0].split("[")[0] in e.message
    assert e.payload()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"{", b"not json", b"", b"[1, 2]", b'{"model": "m\xff", "messages": []}', b"[" * 5000 + b"]" * 5000])
def test_malformed_bodies_are_400(body):
    e = err(body)
    assert e.status == 400 and set(e.payload()["error"]) == {"message", "type", "param", "code"}


def test_tools_and_every_kind_of_tool_choice_decode():
    tools = b'"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]'
    for choice in (b"", b', "tool_choice": "none"', b', "tool_choice": "auto"', b', "tool_choice": "required"',
                   b', "tool_choice": {"type": "function", "function": {"name": "f"}}'):
        req = decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], ' + tools + choice + b"}", LIMIT)
        assert req.tools[0]["function"]["name"] == "f"
    # "none" needs no tools; "auto" needs them set, if empty (vLLM: "When using `tool_choice`, `tools` must be set.")
    decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "none"}', LIMIT)
    decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "auto"}', LIMIT)


def test_valid_requests_decode_and_keep_extensions():
    r = decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5, "unknown_field": 1}', LIMIT)
    assert r.output_limit == 5 and r.stream is False
    c = decode_completion(b'{"model": "m", "prompt": "hello", "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}', LIMIT)
    assert c.max_tokens == 3 and c.stream_options.include_usage
    assert err(b'{"model": "m", "prompt": []}', chat=False).param == "prompt"


def test_logprobs_fields_are_checked_by_kind():
    """Chat: ``logprobs`` a boolean, ``top_logprobs`` 0-20 alternatives with it; completions: ``logprobs`` the number of
    alternatives, 0-20 (``GatewaySettings.max_logprobs``: OpenAI's bound, vLLM's default ``--max-logprobs``)."""
    r = decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 20}', LIMIT)
    assert r.wants_logprobs and r.top_logprobs == 20
    r = decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": false, "top_logprobs": 0}', LIMIT)
    assert not r.wants_logprobs
    assert decode_completion(b'{"model": "m", "prompt": "x", "logprobs": 0}', LIMIT).wants_logprobs
    assert not decode_completion(b'{"model": "m", "prompt": "x"}', LIMIT).wants_logprobs
    for v in (b"21", b"-1", b"true", b'"2"'):
        e = err(b'{"model": "m", "prompt": "x", "logprobs": ' + v + b"}", chat=False)
        assert e.status == 400 and e.param == "logprobs", v
    with pytest.raises(ApiError):  # a gateway configured for fewer
        decode_completion(b'{"model": "m", "prompt": "x", "logprobs": 5}', LIMIT, max_logprobs=4)
