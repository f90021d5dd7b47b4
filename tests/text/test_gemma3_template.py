"""The Gemma 3 chat template steersman hands llama-server (``--chat-template-file``), rendered with jinja2 (llama.cpp's
minja has the same trim, loop and namespace semantics).  Skipped where jinja2 is not installed."""

from __future__ import annotations

import json

import pytest

from steersman.fleet.processes import chat_template_path

jinja2 = pytest.importorskip("jinja2")

CALL = [{"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def render():
    env = jinja2.Environment()
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)  # minja's / Hugging Face's, not HTML-escaped
    template = env.from_string(chat_template_path().read_text())

    def go(messages, tools=None, add_generation_prompt=True):
        return template.render(messages=messages, tools=tools, bos_token="<bos>", add_generation_prompt=add_generation_prompt)

    return go


def test_without_tools_it_is_googles_template(render):
    msgs = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour"}, {"role": "user", "content": "Thanks"}]
    assert render(msgs) == ("<bos><start_of_turn>user\nAnswer in French.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
                            "Bonjour<end_of_turn>\n<start_of_turn>user\nThanks<end_of_turn>\n<start_of_turn>model\n")


def test_text_parts_join_as_llama_cpp_joins_them(render):
    # llama.cpp hands a template the parts' text joined with "\n" (common_chat_msgs_to_json_oaicompat): parts render
    # as that string would, not run together ("The answer is42, andnot 41.")
    parts = [{"type": "text", "text": "The answer is "}, {"type": "text", "text": "42, and "},
             {"type": "text", "text": "not 41."}]
    joined = "The answer is \n42, and \nnot 41."
    assert render([{"role": "user", "content": parts}]) == render([{"role": "user", "content": joined}])
    assert "is \n42" in render([{"role": "user", "content": parts}])
    system = [{"role": "system", "content": parts}, {"role": "user", "content": "x"}]
    assert render(system) == render([{"role": "system", "content": joined}, {"role": "user", "content": "x"}])


def test_an_assistants_parts_and_string_render_alike_with_tool_calls(render):
    as_text = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Let me check.", "tool_calls": CALL}]
    as_parts = [as_text[0], {**as_text[1], "content": [{"type": "text", "text": "Let me check."}]}]
    assert render(as_parts) == render(as_text)
    assert "Let me check.\n<tool_call>\n{\"name\": \"get_weather\"" in render(as_text)


def test_a_developer_message_is_folded_like_a_system_one(render):
    for role in ("system", "developer"):
        got = render([{"role": role, "content": "Be brief."}, {"role": "user", "content": "Hi"}], TOOLS)
        assert got.startswith("<bos><start_of_turn>user\nBe brief.\n\nYou may call one or more functions")
        assert got.count("<start_of_turn>") == 2  # the user's turn and the model's
    late = render([{"role": "user", "content": "Hi"}, {"role": "developer", "content": "Now in French."},
                   {"role": "system", "content": "Be brief."}])
    assert "<start_of_turn>developer" not in late and "<start_of_turn>system" not in late
    assert "<start_of_turn>user\nNow in French.<end_of_turn>\n<start_of_turn>user\nBe brief.<end_of_turn>" in late


def test_a_null_content_is_no_text(render):
    assert render([{"role": "system", "content": None}, {"role": "user", "content": "Hi"}]) == render(
        [{"role": "user", "content": "Hi"}])
    got = render([{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": CALL},
                  {"role": "tool", "content": None}])
    assert "<start_of_turn>model\n<tool_call>" in got and "<tool_response>\n\n</tool_response>" in got


def test_a_system_message_alone_is_not_dropped(render):
    got = render([{"role": "system", "content": "Be brief."}], TOOLS)
    assert got.startswith("<bos><start_of_turn>user\nBe brief.\n\nYou may call") and got.endswith("<start_of_turn>model\n")
