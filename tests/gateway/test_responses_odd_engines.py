"""``/v1/responses`` over engines whose chat stream is odd but relayed as is to chat clients: the Responses stream
still ends as OpenAI's (completed, or failed), never as a 500."""

from __future__ import annotations

import orjson
import openai
import pytest

from steersman.testing import LiveFleet
from steersman.testing.scripted import Script


def _stream(*chunks: dict) -> bytes:
    return b"".join(b"data: %b\n\n" % orjson.dumps({"id": "x", "object": "chat.completion.chunk", "model": "m", **c})
                    for c in chunks) + b"data: [DONE]\n\n"


ARGS_OBJECT = _stream(  # some engines send a tool call's arguments as an object
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {
        "name": "w", "arguments": {"city": "Paris"}}}]}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
USAGE_NOT_INT = _stream(
    {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": "n/a", "completion_tokens": 1}})


@pytest.mark.parametrize("stream", [ARGS_OBJECT, USAGE_NOT_INT], ids=["arguments_object", "usage_not_int"])
def test_a_chunk_the_chat_relay_takes_is_a_completed_response(stream):
    with LiveFleet(scripted=[Script(model="m", malformed=stream)]) as lf, \
            openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        events = list(c.responses.create(model="m", input="x", stream=True))
        final = events[-1].response
        assert events[-1].type == "response.completed" and final.status == "completed"
        if stream is ARGS_OBJECT:
            assert final.output[0].type == "function_call" and orjson.loads(final.output[0].arguments) == {
                "city": "Paris"}
        else:
            assert final.output_text == "hi" and final.usage.input_tokens == 0 and final.usage.output_tokens == 1
        assert c.responses.retrieve(final.id).output == final.output  # stored, so a next turn continues it
