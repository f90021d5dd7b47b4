"""``tool_choice`` other than "none" without ``tools`` is refused as vLLM refuses it (check_tool_usage): a 400 naming
``tool_choice``, from the gateway before any engine sees the request, and from engine-sim."""

from __future__ import annotations

import httpx
import openai
import pytest

from steersman.api.errors import ApiError
from steersman.api.schema import decode_chat
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

MODEL = "llama-3.1-8b"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHOICES = ["auto", "required", NAMED]


@pytest.mark.parametrize("choice", CHOICES)
def test_a_tool_choice_without_tools_is_refused(choice):
    import orjson

    with pytest.raises(ApiError) as e:
        decode_chat(orjson.dumps({"model": MODEL, "messages": MESSAGES, "tool_choice": choice}), 4096)
    assert e.value.status == 400 and e.value.param == "tool_choice"
    assert e.value.message == "When using `tool_choice`, `tools` must be set."
    with pytest.raises(ApiError):  # null is no tools either
        decode_chat(orjson.dumps({"model": MODEL, "messages": MESSAGES, "tools": None, "tool_choice": choice}), 4096)


@pytest.fixture(scope="module")
def fleet():
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)]) as lf:
        yield lf


@pytest.mark.parametrize("choice", CHOICES)
def test_the_gateway_and_engine_sim_refuse_it_over_http(fleet, choice):
    with openai.OpenAI(base_url=fleet.url + "/v1", api_key="x", max_retries=0, timeout=30) as client:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, tool_choice=choice)
        assert e.value.body["param"] == "tool_choice" and "`tools` must be set" in e.value.body["message"]
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, tool_choice="none")
        assert r.choices[0].message.content  # "none" needs no tools
    r = httpx.post(fleet.sims[0].url + "/v1/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "tool_choice": choice})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "tool_choice" and set(err) == {"message", "type", "param", "code"}
