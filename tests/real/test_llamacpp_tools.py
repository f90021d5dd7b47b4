"""Chat template, tools and structured output on real llama-server replicas (Gemma 3 270M), through the gateway.

steersman starts llama-server with ``--jinja`` and the Gemma 3 template it ships (``steersman.fleet``): the prompt
of a plain chat must stay what llama.cpp's legacy "gemma" template gave (prefix reuse, the slot mirror), and tools
must reach the model and come back as ``tool_calls`` (before, ``--no-jinja`` answered any request with tools 500).
"""

from __future__ import annotations

import json

import orjson
import pytest
from openai import OpenAI

from steersman.testing import LiveFleet

from realhelpers import CLOCK, MODEL, WEATHER

pytestmark = pytest.mark.timeout(300)

# The base 270M model continues the text it sees: an example call in the user turn makes it write one within a few
# dozen tokens (greedy), which llama.cpp's parser turns into tool_calls; the arguments are held to the schema by its
# grammar once the call starts.
ASK = [{"role": "user", "content": 'Example:\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                   "</tool_call>"}]
BATCH = {"x-steersman-slo": "batch"}  # no TTFT target on CPU replicas without a hardware profile (see test_llamacpp_e2e)


def _render(url: str, body: dict) -> str:
    import urllib.request

    req = urllib.request.Request(url + "/apply-template", data=orjson.dumps(body), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return orjson.loads(r.read())["prompt"]


@pytest.fixture(scope="module")
def client(engines):
    with LiveFleet(endpoints=engines.endpoints(), policy="steersman") as lf:
        with OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=120, default_headers=BATCH) as c:
            yield c


def test_a_plain_chat_renders_as_gemma_turns_and_tools_in_hermes_tags(engines):
    url = engines.endpoints()[0]["url"]
    chat = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Sea?"}]
    # llama.cpp's legacy "gemma" template (llama-chat.cpp): the system text trimmed, opening the first user turn
    assert _render(url, {"messages": chat}) == (
        "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nSea?<end_of_turn>\n<start_of_turn>model\n")
    assert _render(url, {"messages": chat[1:2]}) == "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"

    agent = [chat[0], {"role": "user", "content": "Weather in Rome?"},
             {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    text = _render(url, {"messages": agent, "tools": [WEATHER]})
    first = text[:text.index("<end_of_turn>")]
    assert first.startswith("<start_of_turn>user\nBe brief.\n\nYou may call one or more functions")
    assert json.dumps(WEATHER) in first and first.endswith("</tool_call>\n\nWeather in Rome?")
    assert text.endswith(
        '<start_of_turn>model\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        "<end_of_turn>\n<start_of_turn>user\n<tool_response>\nsunny\n</tool_response><end_of_turn>\n"
        "<start_of_turn>model\n")


def _streamed_calls(client: OpenAI, **kw) -> tuple[dict[int, dict], int]:
    calls: dict[int, dict] = {}
    prompt_tokens = 0
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage:
            prompt_tokens = chunk.usage.prompt_tokens
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            c["id"] += d.id or ""
            c["name"] += (d.function.name or "") if d.function else ""
            c["arguments"] += (d.function.arguments or "") if d.function else ""
    return calls, prompt_tokens


def test_tools_reach_a_real_engine_and_its_calls_come_back_whole_and_streamed(client):
    kw = dict(model=MODEL, max_tokens=60, temperature=0, messages=ASK, tools=[WEATHER], tool_choice="required")
    plain = client.chat.completions.create(model=MODEL, max_tokens=1, temperature=0, messages=ASK)
    whole = client.chat.completions.create(**kw)
    assert whole.usage.prompt_tokens > plain.usage.prompt_tokens + 60  # the tool's definition was in the prompt
    calls = whole.choices[0].message.tool_calls
    assert calls, whole.choices[0]
    for c in calls:
        assert c.type == "function" and c.function.name == "get_weather" and c.id
        assert isinstance(json.loads(c.function.arguments)["city"], str)
    streamed, prompt_tokens = _streamed_calls(client, **kw)
    assert prompt_tokens == whole.usage.prompt_tokens
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(streamed.items())] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls]
    assert all(c["id"] for c in streamed.values())

    # the agent's next turn: the tool's result goes back, the model answers in text when no call is allowed
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls[:1]]},
                  {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 24 C"}]
    after = client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, messages=turn, tools=[WEATHER],
                                           tool_choice="none")
    assert after.choices[0].message.content and not after.choices[0].message.tool_calls


def test_a_named_tool_choice_calls_that_function(client):
    """llama-server takes tool_choice only as a word: the gateway sends a named one as "required" over that function."""
    r = client.chat.completions.create(model=MODEL, max_tokens=60, temperature=0, messages=ASK, tools=[WEATHER, CLOCK],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert calls and {c.function.name for c in calls} == {"get_time"}, r.choices[0]
    assert isinstance(json.loads(calls[0].function.arguments)["city"], str)


def test_a_json_schema_response_format_is_held_to_its_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=MODEL, max_tokens=60, temperature=0, messages=[{"role": "user", "content": "Forecast for Oslo, 3 days."}],
        response_format={"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema}})
    assert r.choices[0].finish_reason == "stop", r.choices[0]  # the grammar ends the document (~24 tokens here)
    doc = json.loads(r.choices[0].message.content)
    assert set(doc) == {"city", "days"} and isinstance(doc["city"], str) and isinstance(doc["days"], int)


def test_an_image_for_a_text_only_engine_is_a_400_naming_messages(client):
    """llama-server answers 500 to an image part without a multimodal projector: a refusal of the request, which the
    gateway relays as the 400 vLLM and OpenAI give (it was retried elsewhere, then a 502 upstream_error)."""
    import openai

    pixel = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
             "RU5ErkJggg==")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": pixel}}]}])
    err = e.value.body
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "unsupported_value", "messages")
    assert "image" in err["message"]


def test_the_responses_api_runs_an_agent_turn_on_a_real_engine(client):
    """/v1/responses, translated by the gateway into the chat request above: the same call comes back as a
    function_call item (whole and streamed), the tool's output goes back by previous_response_id, and the
    conversation's prompt is what the chat API would have rendered (the same prompt tokens)."""
    tool = {"type": "function", **WEATHER["function"]}
    kw = dict(model=MODEL, max_output_tokens=60, temperature=0, tools=[tool], tool_choice="required",
              input=ASK[0]["content"], extra_headers=BATCH)
    chat = client.chat.completions.create(model=MODEL, max_tokens=60, temperature=0, messages=ASK, tools=[WEATHER],
                                          tool_choice="required")
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in chat.choices[0].message.tool_calls]
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    events = list(client.responses.create(stream=True, **kw))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(d.name, json.loads(d.arguments)) for d in done] == [(c.name, json.loads(c.arguments)) for c in calls]
    # the base model writes some text before its call, in a message item of its own (both ways)
    assert [o.type for o in events[-1].response.output] == [o.type for o in r.output]
    assert events[-1].type == f"response.{r.status}" and events[-1].response.output_text == r.output_text
    after = client.responses.create(model=MODEL, previous_response_id=r.id, max_output_tokens=12, temperature=0,
                                    tools=[tool], tool_choice="none", extra_headers=BATCH,
                                    input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                            "output": "sunny, 24 C"}])
    assert after.output_text and not [o for o in after.output if o.type == "function_call"]
    assert after.usage.input_tokens > r.usage.input_tokens
