"""An engine's own 4xx answer reaches the client in OpenAI's error format (api.errors.engine_error_body)."""

from __future__ import annotations

import orjson
import pytest

from steersman.api.errors import engine_error_body

# recorded: llama-server (llama-cpp-python 0.3.36's llama.cpp) over a slot's context, and vLLM's two shapes
LLAMACPP = (b'{"error":{"code":400,"message":"request (3009 tokens) exceeds the available context size (2048 tokens), '
            b'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":3009,"n_ctx":2048}}')
VLLM_OLD = (b'{"object":"error","message":"This model\'s maximum context length is 2048 tokens. However, you requested '
            b'3000 tokens (2990 in the messages, 10 in the completion). Please reduce the length of the messages or '
            b'completion.","type":"BadRequestError","param":null,"code":400}')
VLLM_NEW = b'{"error":{"message":"temperature must be non-negative, got -1.0.","type":"BadRequestError","param":null,"code":400}}'


def _err(body: bytes) -> dict:
    doc = orjson.loads(body)
    assert set(doc) == {"error"}
    e = doc["error"]
    assert isinstance(e["message"], str) and e["message"]
    assert isinstance(e["type"], str)
    assert e["param"] is None or isinstance(e["param"], str)
    assert e["code"] is None or isinstance(e["code"], str)
    return e


@pytest.mark.parametrize("field", ["messages", "prompt"])
def test_llamacpp_context_error(field):
    e = _err(engine_error_body(400, LLAMACPP, field))
    assert (e["type"], e["param"], e["code"]) == ("invalid_request_error", field, "context_length_exceeded")
    assert e["message"].startswith("request (3009 tokens) exceeds")
    assert (e["n_prompt_tokens"], e["n_ctx"]) == (3009, 2048)  # the engine's own fields are kept


def test_vllm_shapes():
    e = _err(engine_error_body(400, VLLM_OLD, "messages"))
    assert (e["param"], e["code"]) == ("messages", "context_length_exceeded")
    assert "object" not in e
    e = _err(engine_error_body(400, VLLM_NEW, "messages"))
    assert (e["type"], e["param"], e["code"]) == ("invalid_request_error", None, "BadRequestError")
    assert e["message"] == "temperature must be non-negative, got -1.0."


def test_openai_format_passes_unchanged_and_anything_else_is_wrapped():
    ok = b'{"error":{"message":"no","type":"invalid_request_error","param":"n","code":"invalid_value"}}'
    assert engine_error_body(400, ok, "messages") is ok
    e = _err(engine_error_body(404, b"Not Found", "prompt"))
    assert e["message"] == "The engine refused the request (404): Not Found."
    assert e["code"] is None
    e = _err(engine_error_body(429, b'{"error": 3}', "prompt"))
    assert e["type"] == "rate_limit_error"
    e = _err(engine_error_body(400, b"", "prompt"))
    assert e["message"] == "The engine refused the request (400)."


# recorded: llama-server (0.3.36) answering an image part without a multimodal projector, and tools without --jinja
LLAMACPP_IMAGE = (b'{"error":{"code":500,"message":"image input is not supported - hint: if this is unexpected, you may '
                  b'need to provide the mmproj","type":"server_error"}}')
LLAMACPP_TOOLS = b'{"error":{"code":500,"message":"tools param requires --jinja flag","type":"server_error"}}'
# recorded by a llama.cpp audit (thirty-fourth session): /v1/embeddings on a llama-server without --embeddings
LLAMACPP_501 = (b'{"error":{"code":501,"message":"This server does not support embeddings. Start it with '
                b'`--embeddings`","type":"not_supported_error"}}')


def test_a_5xx_that_refuses_the_request_itself_becomes_a_400_naming_the_field():
    from steersman.api.errors import refused_with_5xx

    for body in (LLAMACPP_IMAGE, LLAMACPP_TOOLS):
        assert refused_with_5xx(500, body)
        e = _err(engine_error_body(500, body, "messages"))
        assert (e["type"], e["code"], e["param"]) == ("invalid_request_error", "unsupported_value", "messages")
        assert e["message"] == orjson.loads(body)["error"]["message"]
    assert refused_with_5xx(501, LLAMACPP_501)  # Not Implemented: what it asks for, whatever the body says
    e = _err(engine_error_body(501, LLAMACPP_501, "input"))
    assert (e["code"], e["param"]) == ("unsupported_value", "input") and "--embeddings" in e["message"]
    assert not refused_with_5xx(503, LLAMACPP_IMAGE)
    assert not refused_with_5xx(500, b'{"error":{"code":500,"message":"failed to decode the batch","type":"server_error"}}')
