"""The official openai client through the gateway to engine-sim replicas, over real HTTP."""

import httpx
import pytest

from steersman.engines.promtext import read_samples
from steersman.text import count_tokens, render_chat

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain KV caches."}]


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=16, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 16
    assert r.usage.prompt_tokens == count_tokens(render_chat(MSGS))


def test_chat_streaming_matches_non_streaming_and_reports_usage(client):
    kw = dict(model="llama-3.1-8b", messages=MSGS, max_tokens=20, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[-1].usage.completion_tokens == 20
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_max_completion_tokens_and_stop(client):
    r = client.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_completion_tokens=7, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 7
    full = client.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=30, extra_body={"ignore_eos": True}).choices[0].message.content
    stop_word = full.split()[5]
    r = client.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=30, stop=[" " + stop_word], extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop" and full.startswith(r.choices[0].message.content)
    assert (" " + stop_word) not in r.choices[0].message.content


def test_completions_both_ways(client):
    r = client.completions.create(model="qwen2.5-7b", prompt="The fleet", max_tokens=6, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 6
    s = list(client.completions.create(model="qwen2.5-7b", prompt="The fleet", max_tokens=6, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


def test_models_are_the_union_of_the_fleet(client):
    ids = sorted(m.id for m in client.models.list().data)
    assert ids == ["llama-3.1-8b", "qwen2.5-7b"]


def test_a_model_is_retrieved_by_id_and_heads_get_headers_alone(client, fleet):
    import openai

    m = client.models.retrieve("qwen2.5-7b")
    assert m.id == "qwen2.5-7b" and m.object == "model" and m.model_extra["replicas"] == 1
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("org/nope")  # an id may hold a slash, as Hugging Face names do
    assert e.value.body["code"] == "model_not_found" and "org/nope" in e.value.body["message"]
    for path in ("/health", "/v1/models", "/v1/models/llama-3.1-8b"):  # HEAD: a GET's headers, no body
        got, head = httpx.get(fleet.url + path), httpx.head(fleet.url + path)
        assert head.status_code == got.status_code == 200 and head.content == b""
        assert int(head.headers["content-length"]) == len(got.content) or path == "/v1/models"  # `created` ticks
    assert httpx.post(fleet.url + "/v1/models/llama-3.1-8b").status_code == 405
    for path in ("/health", "/v1/models", "/v1/models/nope", "/openapi.json"):  # every API answer has an id
        assert len(httpx.get(fleet.url + path).headers["x-request-id"]) == 32
    assert httpx.get(fleet.url + "/v1/models", headers={"x-request-id": "mine-1"}).headers["x-request-id"] == "mine-1"


def test_sampling_fields_out_of_range_are_refused_naming_them(client, fleet):
    client.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=2, presence_penalty=1.5,
                                   frequency_penalty=-1, logit_bias={"50256": -100},
                                   extra_body={"top_k": 40, "min_p": 0.1, "repetition_penalty": 1.1})
    # what the engines disagree on goes through as sent (llama.cpp: [[token, bias]] pairs, false bans a token)
    r = httpx.post(fleet.url + "/v1/chat/completions", json={"model": "llama-3.1-8b", "messages": MSGS, "max_tokens": 2,
                                                             "logit_bias": [[15043, False]], "top_k": -5})
    assert r.status_code == 200, r.text
    for body, param in (({"presence_penalty": 9}, "presence_penalty"), ({"frequency_penalty": -2.5}, "frequency_penalty"),
                        ({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0}, "repetition_penalty")):
        for path, extra in (("/v1/chat/completions", {"messages": MSGS}), ("/v1/completions", {"prompt": "x"})):
            r = httpx.post(fleet.url + path, json={"model": "llama-3.1-8b", "max_tokens": 2, **extra, **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_requests_spread_over_replicas_and_metrics_are_counted(fleet, client):
    from concurrent.futures import ThreadPoolExecutor

    def one(i):
        return client.chat.completions.create(model="llama-3.1-8b", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=24, extra_body={"ignore_eos": True})

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(16)))
    per = [read_samples(httpx.get(s.url + "/metrics").text, {"vllm:e2e_request_latency_seconds_count": "n"}).get("n", 0) for s in fleet.sims[:2]]
    assert min(per) >= 4, per
    g = httpx.get(fleet.url + "/metrics").text
    ok = read_samples(g, {'steersman:requests_total': "n"})
    assert ok["n"] >= 16
    routes = _routes(g, "llama-3.1-8b")  # least-request predicts nothing
    assert routes.get("none", 0) >= 16 and not routes.get("met") and not routes.get("missed"), routes
    assert "steersman:time_to_first_token_seconds_bucket" in g and "steersman:inter_token_latency_seconds_bucket" in g
    assert httpx.get(fleet.url + "/health").json()["replicas_healthy"] == 3


def _routes(metrics: str, model: str) -> dict[str, float]:
    """steersman:routes_total of ``model`` by slo_prediction."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("steersman:routes_total{") and f'model="{model}"' in line:
            kind = line.split('slo_prediction="')[1].split('"')[0]
            out[kind] = out.get(kind, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_logprobs_come_through_for_each_token_both_ways(client):
    """engine-sim answers logprobs in vLLM's shapes (greedy: the chosen token first and most likely) and the gateway
    relays them: streamed, one entry per token event, the same as the whole response's."""
    kw = dict(model="llama-3.1-8b", messages=MSGS, max_tokens=8, logprobs=True, top_logprobs=3,
              extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0]
    entries = whole.logprobs.content
    assert "".join(e.token for e in entries) == whole.message.content and len(entries) == 8
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert e.logprob <= 0 and bytes(e.bytes).decode() == e.token
    streamed = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    got = [e for ch in streamed if ch.logprobs for e in ch.logprobs.content]
    assert [(e.token, e.logprob) for e in got] == [(e.token, e.logprob) for e in entries]
    assert all(ch.logprobs.content[0].token == ch.delta.content for ch in streamed if ch.logprobs)

    c = client.completions.create(model="qwen2.5-7b", prompt="The fleet", max_tokens=5, logprobs=0,
                                  extra_body={"ignore_eos": True}).choices[0]
    lp = c.logprobs
    assert "".join(lp.tokens) == c.text and len(lp.token_logprobs) == 5
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    assert all(list(d) == [t] for d, t in zip(lp.top_logprobs, lp.tokens))  # logprobs 0: the chosen token alone
    streamed = [ch.choices[0].logprobs for ch in client.completions.create(
        model="qwen2.5-7b", prompt="The fleet", max_tokens=5, logprobs=0, stream=True, extra_body={"ignore_eos": True})]
    assert [o for s in streamed for o in s.text_offset] == lp.text_offset
    assert [t for s in streamed for t in s.token_logprobs] == lp.token_logprobs


def test_logprob_field_errors_name_the_field(client, fleet):
    for path, body, param in (
        ("/v1/chat/completions", {"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": MSGS, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": 10**6}, "logprobs"),
    ):
        r = httpx.post(fleet.url + path, json={"model": "llama-3.1-8b", "max_tokens": 2, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_completions_echo_comes_through(client):
    kw = dict(model="qwen2.5-7b", prompt="The fleet", max_tokens=4, extra_body={"ignore_eos": True})
    plain = client.completions.create(**kw).choices[0].text
    assert client.completions.create(echo=True, **kw).choices[0].text == "The fleet" + plain
    assert "".join(c.choices[0].text for c in client.completions.create(echo=True, stream=True, **kw)) == "The fleet" + plain


def test_several_samples_n_come_through_both_ways(client):
    """``n`` > 1 as vLLM answers it: a sequence per sample sharing the prompt, each its own answer; streamed, every
    event carries its choice's index and the samples interleave; usage counts every sample's tokens once."""
    kw = dict(model="llama-3.1-8b", messages=MSGS, max_tokens=6, n=3, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw)
    texts = [c.message.content for c in whole.choices]
    assert [c.index for c in whole.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert whole.usage.completion_tokens == 18
    assert texts[0] == client.chat.completions.create(**dict(kw, n=1)).choices[0].message.content  # sample 0 = n=1's
    got, order = {}, []
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        for c in chunk.choices:
            got[c.index] = got.get(c.index, "") + (c.delta.content or "")
            order.append(c.index)
        if chunk.usage:
            assert chunk.usage.completion_tokens == 18
    assert [got[i] for i in range(3)] == texts and order != sorted(order)  # interleaved as the tokens came
    c = client.completions.create(model="qwen2.5-7b", prompt="The fleet", max_tokens=4, n=2, logprobs=1,
                                  extra_body={"ignore_eos": True})
    assert [ch.index for ch in c.choices] == [0, 1] and all("".join(ch.logprobs.tokens) == ch.text for ch in c.choices)


def test_a_request_over_the_context_is_a_400_naming_the_prompt(client):
    import openai

    # prompt + max_tokens over max_model_len (131,072): the engine's refusal reaches the client in OpenAI's format
    for call, field in ((lambda: client.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=131_050),
                         "messages"),
                        (lambda: client.completions.create(model="llama-3.1-8b", prompt="word " * 100, max_tokens=131_000),
                         "prompt")):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert (e.value.code, e.value.param) == ("context_length_exceeded", field)
        assert "maximum context length is 131072 tokens" in e.value.message


def test_an_image_part_for_a_text_model_and_a_suffix_are_400s_naming_them(client):
    import openai

    with pytest.raises(openai.BadRequestError) as e:  # vLLM refuses a completion's suffix too
        client.completions.create(model="llama-3.1-8b", prompt="Once", max_tokens=3, suffix="end")
    assert e.value.param == "suffix"

    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="llama-3.1-8b", max_tokens=4, stream=stream,
                                           messages=[MSGS[0], {"role": "user", "content": parts}])
        assert (e.value.code, e.value.param) == ("unsupported_value", "messages[1].content[1]")
        assert "image_url" in e.value.message


def test_a_guided_regex_comes_through_both_ways(client):
    import re

    pattern = r"[A-Z]{3}-\d{4} (ok|late)"
    kw = dict(model="llama-3.1-8b", max_tokens=40, messages=MSGS, extra_body={"guided_regex": pattern})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert re.fullmatch(pattern, whole) and streamed == whole


def test_structured_output_and_tool_calls_come_through_both_ways(client):
    """engine-sim answers structured output and tool calls as vLLM does; through the gateway, streamed (one stream,
    not continuable) and whole alike: an agent loop runs against the simulated fleet."""
    import json

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1,
              "maximum": 7}}, "required": ["city", "days"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": schema}}
    whole = client.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=200, response_format=fmt)
    doc = json.loads(whole.choices[0].message.content)
    assert set(doc) >= {"city", "days"} and 1 <= doc["days"] <= 7 and whole.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="llama-3.1-8b", messages=MSGS, max_tokens=200, response_format=fmt, stream=True) if c.choices)
    assert streamed == whole.choices[0].message.content

    tools = [{"type": "function", "function": {"name": "plan_trip", "parameters": schema}}]
    ask = [{"role": "user", "content": "Plan a trip."}]
    r = client.chat.completions.create(model="llama-3.1-8b", messages=ask, max_tokens=200, tools=tools)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "plan_trip" and set(json.loads(call.function.arguments)) >= {"city", "days"}
    parts, ids = [], set()
    for c in client.chat.completions.create(model="llama-3.1-8b", messages=ask, max_tokens=200, tools=tools, stream=True):
        for t in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            ids.add(t.id) if t.id else None
            parts.append(t.function.arguments or "")
    assert len(ids) == 1 and "".join(parts) == call.function.arguments
    # the tool's result comes back: the model answers in text
    done = client.chat.completions.create(model="llama-3.1-8b", max_tokens=5, tools=tools, messages=ask + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "booked"}])
    assert done.choices[0].message.content and not done.choices[0].message.tool_calls


def test_a_batch_of_prompts_gets_a_choice_per_prompt_and_sample(client, fleet):
    """vLLM's batched completions (lm-eval-harness sends them): choice prompt * n + sample, each the answer that
    prompt alone gets; usage counts each prompt once."""
    prompts = ["The sea is", "A cache holds", "Routers pick"]
    alone = [client.completions.create(model="llama-3.1-8b", prompt=p, max_tokens=4) for p in prompts]
    r = client.completions.create(model="llama-3.1-8b", prompt=prompts, max_tokens=4, n=2)
    assert [c.index for c in r.choices] == list(range(6))
    assert [r.choices[2 * k].text for k in range(3)] == [a.choices[0].text for a in alone]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert 6 <= r.usage.completion_tokens <= 6 * 4
    got: dict[int, str] = {}
    for c in client.completions.create(model="llama-3.1-8b", prompt=prompts, max_tokens=4, stream=True, echo=True):
        for ch in c.choices:
            got[ch.index] = got.get(ch.index, "") + ch.text
    assert got == {k: prompts[k] + alone[k].choices[0].text for k in range(3)}
    r = httpx.post(fleet.url + "/v1/completions", json={"model": "llama-3.1-8b", "prompt": ["a", [1, 2]], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
