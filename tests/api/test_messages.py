"""Chat message checks (steersman.api.messages): what OpenAI refuses is a 400 naming the field; what vLLM itself
returns, and its own extensions, pass (found by review: the first version refused the SDK's usual multi-turn loop)."""

import json

import httpx
import openai
import pytest

from steersman.api.errors import ApiError
from steersman.api.schema import decode_chat
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

Q = {"role": "user", "content": "q"}


def _decode(*messages):
    return decode_chat(json.dumps({"model": "m", "messages": [Q, *messages]}).encode(), 4096)


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": "hi", "tool_calls": []},  # every vLLM (and engine-sim) answer carries one
    {"role": "assistant", "content": None},  # an answer cut off in its reasoning; the Responses store keeps it
    {"role": "assistant", "content": "", "refusal": None, "reasoning_content": None},
    {"role": "user", "content": [{"image_url": "https://x/a.png"}]},  # vLLM's untyped short forms
    {"role": "user", "content": [{"audio_url": "https://x/a.wav"}]},
    {"role": "user", "content": [{"type": "image_url", "image_url": None, "uuid": "img-1"}]},  # vLLM: a cached image
    {"role": "user", "content": [{"type": "image_url", "image_url": "https://x/a.png"}]},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
    {"role": "system", "content": "s", "tool_calls": []},
])
def test_accepted(message):
    _decode(message)


@pytest.mark.parametrize("message,param", [
    ({"role": "user", "content": None}, "messages[1].content"),
    ({"role": "developer", "content": None}, "messages[1].content"),
    ({"role": "user", "content": []}, "messages[1].content"),
    ({"role": "user", "content": [{"type": 5}]}, "messages[1].content[0].type"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}, "messages[1].content[0].image_url.url"),
    ({"role": "tool", "content": "42"}, "messages[1].tool_call_id"),
    ({"role": "user", "content": "q", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}]},
     "messages[1].tool_calls"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}, "messages[1].tool_calls[0].function.arguments"),
])
def test_refused(message, param):
    with pytest.raises(ApiError) as e:
        _decode(message)
    assert e.value.status == 400 and e.value.param == param


def test_the_sdks_multi_turn_loop_through_the_gateway():
    """The official client appends the answer it got (tool_calls: [] included) and asks again: served."""
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)]) as lf:
        _multi_turn(lf.url)


def _multi_turn(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "hello"}]
    for _ in range(2):
        r = client.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=3)
        messages.append(r.choices[0].message)
        messages.append({"role": "user", "content": "and then?"})
    assert r.choices[0].message.model_dump()["tool_calls"] == []  # (what the first version refused)
    sent = httpx.post(url + "/v1/chat/completions", json={
        "model": "llama-3.1-8b", "max_tokens": 3, "messages": [{"role": "user", "content": "q"},
                                                              r.choices[0].message.model_dump(), Q]})
    assert sent.status_code == 200, sent.text
