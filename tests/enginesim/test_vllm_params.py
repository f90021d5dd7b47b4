"""engine-sim reads vLLM's request parameters as vLLM's OpenAI server does (over real HTTP)."""

import json
import re

import httpx
import orjson

MODEL = "llama-3.1-8b"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]


def _chat(content: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


def _events(url: str, path: str, body: dict) -> list[dict]:
    r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    return [orjson.loads(b[6:]) for b in r.content.split(b"\n\n") if b.startswith(b"data: {")]


def test_completions_without_max_tokens_generate_at_most_16(sim):
    url = sim.sims[0].url
    for i in range(3):
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": f"Once upon a time {i}",
                                                      "ignore_eos": True}).json()
        assert r["usage"]["completion_tokens"] == 16 and r["choices"][0]["finish_reason"] == "length"
    chat = [httpx.post(url + "/v1/chat/completions", json=_chat(f"hi {i}")).json()["usage"]["completion_tokens"]
            for i in range(3)]
    assert max(chat) > 16  # chat's default: what the context leaves (EOS ends it)


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(sim):
    url = sim.sims[0].url
    opts = {"include_usage": True, "continuous_usage_stats": True}
    ev = _events(url, "/v1/chat/completions", _chat("hi", max_tokens=3, ignore_eos=True, stream=True, stream_options=opts))
    assert [e["usage"]["completion_tokens"] for e in ev] == [0, 1, 2, 3, 3]  # role chunk, 3 tokens, the final usage
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"] for e in ev)
    ev = _events(url, "/v1/chat/completions", _chat("hi", max_tokens=3, ignore_eos=True, stream=True,
                                                    stream_options={"include_usage": True}))
    assert [("usage" in e) for e in ev] == [False] * 4 + [True]  # without continuous_usage_stats: the last only
    ev = _events(url, "/v1/completions", {"model": MODEL, "prompt": "Once", "max_tokens": 2, "ignore_eos": True, "n": 2,
                                          "stream": True, "stream_options": opts})
    per_choice = {}
    for e in ev[:-1]:
        per_choice.setdefault(e["choices"][0]["index"], []).append(e["usage"]["completion_tokens"])
    assert per_choice == {0: [1, 2], 1: [1, 2]} and ev[-1]["usage"]["completion_tokens"] == 4  # vLLM: per choice


def test_min_tokens_holds_off_the_end_and_is_checked_against_max_tokens(sim):
    url = sim.sims[0].url + "/v1/chat/completions"
    short = 0
    for i in range(40):
        plain = httpx.post(url, json=_chat(f"q{i}", max_tokens=200)).json()["usage"]["completion_tokens"]
        if plain < 50:
            short += 1
            r = httpx.post(url, json=_chat(f"q{i}", max_tokens=200, min_tokens=50)).json()
            assert r["usage"]["completion_tokens"] >= 50
    assert short  # some answers end early without min_tokens
    r = httpx.post(url, json=_chat("q", min_tokens=50, max_tokens=10))
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    assert "min_tokens must be less than or equal to max_tokens=10, got 50" in r.json()["error"]["message"]
    for bad in (-1, "5"):
        r = httpx.post(url, json=_chat("q", min_tokens=bad, max_tokens=10))
        assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"


def test_stop_strings_count_every_token_generated_and_can_be_kept(sim):
    url = sim.sims[0].url + "/v1/completions"
    body = {"model": MODEL, "prompt": "The river", "max_tokens": 30, "ignore_eos": True}
    toks = httpx.post(url, json=dict(body, logprobs=0)).json()["choices"][0]["logprobs"]["tokens"]
    stop = "".join(toks[5:8])
    r = httpx.post(url, json=dict(body, stop=[stop])).json()
    assert r["choices"][0]["text"] == "".join(toks[:5]) and r["usage"]["completion_tokens"] == 8
    r = httpx.post(url, json=dict(body, stop=[stop], include_stop_str_in_output=True)).json()
    assert r["choices"][0]["text"] == "".join(toks[:8]) and r["choices"][0]["finish_reason"] == "stop"
    ev = _events(sim.sims[0].url, "/v1/completions", dict(body, stop=[stop], stream=True))
    assert "".join(e["choices"][0]["text"] for e in ev) == "".join(toks[:5]) and len(ev) == 8


def test_tool_choice_required_or_named_calls_a_tool_in_every_choice(sim):
    url = sim.sims[0].url
    for choice, reason in (("required", "tool_calls"), ({"type": "function", "function": {"name": "f"}}, "stop")):
        body = _chat("go", tools=TOOLS, tool_choice=choice, n=2, max_tokens=50)
        r = httpx.post(url + "/v1/chat/completions", json=body).json()
        assert [c["index"] for c in r["choices"]] == [0, 1]
        for c in r["choices"]:
            call = c["message"]["tool_calls"][0]
            assert c["finish_reason"] == reason and c["message"]["content"] is None and call["function"]["name"] == "f"
            assert isinstance(json.loads(call["function"]["arguments"])["a"], int)
        streamed: dict[int, dict] = {}
        for e in _events(url, "/v1/chat/completions", dict(body, stream=True)):
            ch = e["choices"][0]
            for tc in ch["delta"].get("tool_calls", ()):
                got = streamed.setdefault(ch["index"], {"id": None, "args": ""})
                got["id"] = got["id"] or tc.get("id")
                got["args"] += tc["function"]["arguments"]
            if ch["finish_reason"]:
                streamed[ch["index"]]["reason"] = ch["finish_reason"]
        assert sorted(streamed) == [0, 1]
        for got in streamed.values():
            assert got["id"].startswith("chatcmpl-tool-") and got["reason"] == reason
            assert isinstance(json.loads(got["args"])["a"], int)


def test_a_finished_tool_call_counts_as_stop_in_request_success(sim):
    url = sim.sims[0].url

    def counts():
        text = httpx.get(url + "/metrics").text
        return {m[1]: float(m[2]) for m in re.finditer(r'request_success_total\{[^}]*finished_reason="(\w+)"\} (\S+)', text)}

    before = counts()
    r = httpx.post(url + "/v1/chat/completions", json=_chat("go", tools=TOOLS, tool_choice="required", max_tokens=100)).json()
    assert r["choices"][0]["finish_reason"] == "tool_calls" and r["usage"]["completion_tokens"] < 100
    after = counts()
    assert (after["stop"] - before["stop"], after["length"] - before["length"]) == (1, 0)
