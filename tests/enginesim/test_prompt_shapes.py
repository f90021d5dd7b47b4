"""The gateway's view of a prompt (``prompt_shape``: token count, block hashes) is engine-sim's, for every shape of
chat request: tools, assistant tool calls, tool results, parts, an assistant prefix, a salt.  Tools and tool calls
are in the prompt (real engines' templates render both): they count and they are hashed."""

from __future__ import annotations

import json

import httpx
import pytest

from steersman.api.prompt import prompt_shape
from steersman.api.schema import decode_chat
from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet
from steersman.text import render_chat, tokenize

MODEL = "llama-3.1-8b"


def _tool(name: str, n: int) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name}: " + "does a useful thing. " * 8,
                                             "parameters": {"type": "object",
                                                            "properties": {f"arg{i}": {"type": "string"} for i in range(n)}}}}


TOOLS_A = [_tool(f"tool_a{i}", 3) for i in range(4)]
TOOLS_B = [_tool(f"tool_b{i}", 3) for i in range(4)]
ASK = [{"role": "system", "content": "You are an agent. " * 10}, {"role": "user", "content": "Book a flight to Paris."}]


def _history(city: str) -> list[dict]:
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}
    return [{"role": "user", "content": "What is the weather like? " * 4},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny, 24 degrees"}]


SHAPES = {
    "text": {"messages": ASK},
    "tools": {"messages": ASK, "tools": TOOLS_A},
    "tools, choice none": {"messages": ASK, "tools": TOOLS_B, "tool_choice": "none"},
    "tools, developer first": {"messages": [{"role": "developer", "content": "Be brief. " * 12}] + ASK[1:],
                               "tools": TOOLS_A, "tool_choice": "none"},
    "tool call history": {"messages": _history("Paris"), "tools": TOOLS_A, "tool_choice": "none"},
    "tool call with text": {"messages": [ASK[1], {"role": "assistant", "content": "Let me check. " * 5, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"q\": \"fares\"}"}},
        {"id": "d", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "none"}]},
    "text parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one " * 9},
                                                            {"type": "text", "text": "part two " * 9}]}]},
    "assistant prefix": {"messages": ASK + [{"role": "assistant", "content": "The flight leaves at"}],
                         "continue_final_message": True, "add_generation_prompt": False, "tools": TOOLS_A,
                         "tool_choice": "none"},
    "salted tools": {"messages": ASK, "tools": TOOLS_A, "tool_choice": "none", "cache_salt": "tenant-1"},
}


def _body(shape: dict) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 2, **shape}).encode()


def test_tools_and_tool_calls_are_in_the_prompt():
    plain, with_a, with_b = (prompt_shape(decode_chat(_body(s), 1 << 20), 16)
                             for s in (SHAPES["text"], SHAPES["tools"], {**SHAPES["tools"], "tools": TOOLS_B}))
    assert with_a[0] > plain[0] + 4 * 60  # every tool's JSON counts (it was 43 tokens with or without 11 kB of tools)
    assert with_a[1][0] == plain[1][0]  # the system prompt comes first: it is still shared...
    assert set(with_a[1]) != set(with_b[1])  # ...and other tools are another prompt
    paris, tokyo = (prompt_shape(decode_chat(_body({"messages": _history(c)}), 1 << 20), 16) for c in ("Paris", "Tokyo"))
    assert paris[0] == tokyo[0] and paris[1] != tokyo[1]  # the calls' arguments are hashed


def test_a_text_only_chat_renders_as_before():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "a "},
                                                                             {"type": "text", "text": "b"}]}]
    assert render_chat(msgs) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(msgs, tools=[]) == render_chat(msgs)


def test_different_images_are_different_prompts_and_the_same_image_is_the_same():
    def shape(url: str, detail: str = "auto"):
        content = [{"type": "text", "text": "Describe this picture in detail. " * 3},
                   {"type": "image_url", "image_url": {"url": url, "detail": detail}}]
        return prompt_shape(decode_chat(_body({"messages": [{"role": "user", "content": content}]}), 1 << 20), 16)

    cat, dog = shape("data:image/png;base64," + "Q2F0" * 500), shape("data:image/png;base64," + "RG9n" * 500)
    assert cat[1] != dog[1] and cat[1] == shape("data:image/png;base64," + "Q2F0" * 500, "low")[1]


@pytest.fixture(scope="module")
def spied_sim():
    """One engine-sim replica whose runner records each job's prompt length and block hashes."""
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)], with_gateway=False) as lf:
        runner = lf.sims[0].generator.runner
        seen: list = []
        submit = runner.submit

        def spy(job):
            seen.append((job.sim.prompt_len, list(job.sim.block_hashes)))
            submit(job)

        runner.submit = spy
        yield lf, seen


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_gateway_sees_the_prompt_engine_sim_runs(spied_sim, name):
    lf, seen = spied_sim
    body = _body(SHAPES[name])
    tokens, hashes = prompt_shape(decode_chat(body, 1 << 20), 16)
    seen.clear()
    r = httpx.post(lf.sims[0].url + "/v1/chat/completions", content=body, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == tokens
    assert seen == [(tokens, list(hashes))]


def test_the_rendered_prompt_is_what_is_tokenized():
    for shape in SHAPES.values():
        req = decode_chat(_body(shape), 1 << 20)
        text = render_chat(req.messages, req.continue_final_message, req.tools)
        assert prompt_shape(req, 16)[0] == len(tokenize(text))
