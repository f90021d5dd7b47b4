"""``/v1/responses`` through the gateway with the official client: engine-sim replicas over real HTTP.

engine-sim's text is a function of the rendered conversation, so a Response and the chat completion of the same
conversation must carry the same text: that pins the translation both ways.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from steersman.control.tenants import hash_key
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

MODEL = "llama-3.1-8b"
EXACT = {"ignore_eos": True}  # every answer runs to its token limit: equal lengths on both APIs
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _chat_text(client, messages, n, **kw):
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, extra_body=EXACT, **kw)
    return r.choices[0].message.content, r


def test_a_response_is_the_chat_completion_of_its_conversation(client):
    r = client.responses.create(model=MODEL, instructions="Be terse.", input="Explain KV caches.",
                                max_output_tokens=14, extra_body=EXACT, metadata={"run": "t1"})
    text, chat = _chat_text(client, [{"role": "system", "content": "Be terse."},
                                     {"role": "user", "content": "Explain KV caches."}], 14)
    assert r.output_text == text and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == 14
    assert r.id.startswith("resp_") and r.model == MODEL and r.metadata == {"run": "t1"}
    assert r.instructions == "Be terse." and r.max_output_tokens == 14
    done = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=200)
    assert done.status == "completed" and done.output_text  # engine-sim stops by itself well before 200


def test_a_streamed_response_sends_openais_events_and_the_same_text(client):
    kw = dict(model=MODEL, input="Tell me about replicas.", max_output_tokens=16, extra_body=EXACT)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == 16 and events[0].response.status == "in_progress"
    # the client's helper that assembles a stream (it wants response.completed: an answer that ends by itself)
    free = dict(model=MODEL, input="Tell me about replicas.", max_output_tokens=400)
    with client.responses.stream(**free) as s:
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == client.responses.create(**free).output_text


def test_previous_response_id_continues_the_conversation_and_the_store_answers_retrieve_and_delete(client):
    first = client.responses.create(model=MODEL, instructions="Be terse.", input="What is a replica?",
                                    max_output_tokens=10, extra_body=EXACT)
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="And a router?",
                                     max_output_tokens=10, extra_body=EXACT)
    # instructions are not carried over (OpenAI's rule); the earlier turn and its answer are
    text, _ = _chat_text(client, [{"role": "user", "content": "What is a replica?"},
                                  {"role": "assistant", "content": first.output_text},
                                  {"role": "user", "content": "And a router?"}], 10)
    assert second.output_text == text and second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    for call in (lambda: client.responses.retrieve(first.id), lambda: client.responses.delete(first.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, previous_response_id=first.id, input="Again?")
    assert e.value.body["param"] == "previous_response_id" and e.value.body["code"] == "previous_response_not_found"
    # a streamed turn is stored too; store: false is not
    streamed = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, stream=True))[-1].response
    assert client.responses.retrieve(streamed.id).output_text == streamed.output_text
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_an_agent_calls_a_tool_and_sends_its_output_back(client):
    call = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                                   max_output_tokens=60)
    fc = [o for o in call.output if o.type == "function_call"]
    assert len(fc) >= 1 and fc[0].name == "get_weather" and fc[0].call_id
    assert "city" in __import__("json").loads(fc[0].arguments)
    events = list(client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                          tool_choice="required", max_output_tokens=60, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == fc[0].arguments == [e for e in events if e.type == "response.function_call_arguments.done"][0].arguments
    answer = client.responses.create(model=MODEL, previous_response_id=call.id, tools=[WEATHER], max_output_tokens=12,
                                     input=[{"type": "function_call_output", "call_id": fc[0].call_id,
                                             "output": "sunny, 21 C"}])
    assert answer.status in ("completed", "incomplete") and answer.output
    named = client.responses.create(model=MODEL, input="Time?", max_output_tokens=60, tool_choice={
        "type": "function", "name": "get_weather"}, tools=[WEATHER, {**WEATHER, "name": "get_time"}])
    assert {o.name for o in named.output if o.type == "function_call"} == {"get_weather"}


def test_json_schema_output(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="A number.", max_output_tokens=40,
                                text={"format": {"type": "json_schema", "name": "num", "schema": schema, "strict": True}})
    assert isinstance(__import__("json").loads(r.output_text)["n"], int)


@pytest.mark.parametrize("kw,param,status", [
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", 400),
    ({"input": "x", "max_output_tokens": -1}, "max_output_tokens", 400),
    ({"input": "x", "max_output_tokens": 10**9}, "max_output_tokens", 400),
    ({"input": "x", "temperature": "hot"}, "temperature", 400),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", 400),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice", 400),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", 400),
    ({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "input[0].content[0].type", 400),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]},
     "input", 400),  # engine-sim is a text-only model (vLLM's text models answer the same)
    ({"input": "x", "background": True}, "background", 400),
    ({"input": "x", "extra_body": {"n": 2}}, "n", 400),  # a response is one answer (a stream would mix them)
    ({"input": "word " * 150_000, "truncation": "auto"}, "input", 400),  # over the context: not silently cut
    ({"input": "x", "model": "nope"}, "model", 404),
])
def test_bad_requests_get_openai_errors_naming_the_responses_field(client, kw, param, status):
    kw = {"model": MODEL, **kw}
    with pytest.raises(openai.APIStatusError) as e:
        client.responses.create(**kw)
    assert e.value.status_code == status and e.value.body["param"] == param, e.value.body
    if param == "max_output_tokens":
        assert "max_output_tokens" in e.value.body["message"] and "max_tokens`" not in e.value.body["message"]


def test_malformed_bodies_and_headers(fleet):
    url = fleet.url + "/v1/responses"
    r = httpx.post(url, content=b"{nope", headers={"content-type": "application/json", "x-request-id": "req-abc"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json" and r.headers["x-request-id"] == "req-abc"
    r = httpx.post(url, content=b'{"model": "m", "input": "x"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 or r.status_code == 400
    r = httpx.post(url, json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = httpx.post(url, json={"model": MODEL, "input": "x", "max_output_tokens": 3}, headers={"x-request-id": "req-ok"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-ok" and r.json()["object"] == "response"
    r = httpx.get(fleet.url + "/v1/responses/resp_none")
    assert r.status_code == 404 and r.json()["error"]["message"] == "No response found with id 'resp_none'."
    assert httpx.put(url, json={}).status_code == 405


KEY_A, KEY_B = "sk-steersman-resp-a", "sk-steersman-resp-b"


def test_stored_responses_are_each_tenants_own():
    extra = {"tenants": {"a": {}, "b": {}}, "api_keys": [{"sha256": hash_key(KEY_A), "tenant": "a"},
                                                         {"sha256": hash_key(KEY_B), "tenant": "b"}]}
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], extra=extra) as lf:
        a, b = (openai.OpenAI(base_url=lf.url + "/v1", api_key=k, max_retries=0, timeout=30) for k in (KEY_A, KEY_B))
        with a, b:
            r = a.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
            assert a.responses.retrieve(r.id).id == r.id
            with pytest.raises(openai.NotFoundError):
                b.responses.retrieve(r.id)
            with pytest.raises(openai.BadRequestError):
                b.responses.create(model=MODEL, input="Go on", previous_response_id=r.id)
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=lf.url + "/v1", api_key="wrong", max_retries=0).responses.create(
                    model=MODEL, input="Hi")
            assert a.responses.create(model=MODEL, input="Go on", previous_response_id=r.id, max_output_tokens=4).output


def test_a_conversation_continued_by_id_is_routed_to_the_replica_that_cached_it():
    long = " ".join(f"rule{i} keeps replicas honest" for i in range(120))  # ~600 tokens of instructions-free context
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0) for _ in range(3)]) as lf:
        with openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
            first = c.responses.create(model=MODEL, input=long, max_output_tokens=8)
            turn = first
            for q in ("Why?", "And then?", "Summarise."):
                turn = c.responses.create(model=MODEL, previous_response_id=turn.id, input=q, max_output_tokens=8)
                # every earlier token but the last partial block is served from the engine's prefix cache
                assert turn.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16


def test_a_responses_input_items_are_listed_back_as_openai_lists_them(client):
    items = [{"role": "user", "content": "What is a replica?"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A copy."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "And a router?"}]}]
    r = client.responses.create(model=MODEL, input=items, max_output_tokens=4)
    listed = client.responses.input_items.list(r.id)  # newest first by default, as OpenAI's
    texts = [i.content[0].text for i in listed.data]
    assert texts == ["And a router?", "A copy.", "What is a replica?"] and not listed.has_more
    assert all(i.id.startswith("msg_") for i in listed.data) and listed.data[1].role == "assistant"
    first = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.content[0].text for i in first.data] == ["What is a replica?", "A copy."] and first.has_more
    rest = client.responses.input_items.list(r.id, order="asc", after=first.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["And a router?"]
    one = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    assert [i.content[0].text for i in client.responses.input_items.list(one.id).data] == ["Hi"]
    for bad in (dict(limit=0), dict(order="up"), dict(after="msg_nope")):
        with pytest.raises(openai.BadRequestError):
            client.responses.input_items.list(r.id, **bad)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")


def test_truncation_auto_drops_the_oldest_turns_when_the_conversation_outgrows_the_context():
    from steersman.config.engine import EngineSettings

    sim = SimServerConfig(speedup=50.0, port=0, engine=EngineSettings(max_model_len=512))
    words = lambda tag: " ".join(f"{tag}{i}" for i in range(110))  # noqa: E731  (~120 tokens a turn)
    with LiveFleet(sims=[sim]) as lf, openai.OpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0,
                                                    timeout=30) as c:
        turn = c.responses.create(model=MODEL, input=words("a"), max_output_tokens=8)
        for tag in "bc":
            turn = c.responses.create(model=MODEL, input=words(tag), previous_response_id=turn.id,
                                      max_output_tokens=8, truncation="auto")
        with pytest.raises(openai.BadRequestError) as e:  # the whole conversation no longer fits
            c.responses.create(model=MODEL, input=words("d"), previous_response_id=turn.id, max_output_tokens=8)
        assert (e.value.body["param"], e.value.body["code"]) == ("input", "context_length_exceeded")
        counted = lambda: lf.gateway.metrics.requests.get(MODEL, "400")  # noqa: E731
        refused = counted()
        fit = c.responses.create(model=MODEL, input=words("d"), previous_response_id=turn.id, max_output_tokens=8,
                                 truncation="auto")
        assert fit.status == "incomplete" and 300 < fit.usage.input_tokens <= 504 and fit.truncation == "auto"
        assert counted() == refused  # the tries refused for their length and sent again: not answers (were 400s)
        events = list(c.responses.create(model=MODEL, input=words("d"), previous_response_id=turn.id,
                                         max_output_tokens=8, truncation="auto", stream=True))
        assert events[-1].response.usage.input_tokens == fit.usage.input_tokens
        with pytest.raises(openai.BadRequestError):  # the newest turn alone is too long: nothing left to drop
            c.responses.create(model=MODEL, input=words("e") * 5, previous_response_id=turn.id, truncation="auto")
