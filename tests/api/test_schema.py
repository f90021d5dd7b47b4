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


def test_valid_requests_decode_and_keep_extensions():
    r = decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5, "unknown_field": 1}', LIMIT)
    assert r.output_limit == 5 and r.stream is False
    c = decode_completion(b'{"model": "m", "prompt": "hello", "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}', LIMIT)
    assert c.max_tokens == 3 and c.stream_options.include_usage
    assert err(b'{"model": "m", "prompt": []}', chat=False).param == "prompt"
