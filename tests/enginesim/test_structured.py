"""engine-sim's structured output and tool calls (vLLM's guided decoding, OpenAI's tool calls): what it generates
satisfies the request's schema or choice, is reproducible, and is cut by max_tokens like text."""

from __future__ import annotations

import json

import jsonschema_rs
import msgspec
import pytest

from steersman.api.errors import ApiError
from steersman.api.schema import ChatCompletionRequest, CompletionRequest
from steersman.enginesim.structured import constraint, structured
from steersman.enginesim.tools import plan_tool_call

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 3, "maxLength": 12}, "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "minimum": -1.5, "maximum": 1.5}, "ok": {"type": "boolean"},
        "kind": {"enum": ["a", "b", 3]}, "v": {"const": 7}, "nick": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4}},
        "required": ["name", "age", "kind", "tags"]},
    "nested": {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "sub": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["id", "sub"]}}}, "required": ["items"]},
    "recursive": {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
        "type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"},
    "definitions": {"definitions": {"x": {"type": "string", "enum": ["p", "q"]}}, "type": "object",
                    "properties": {"x": {"$ref": "#/definitions/x"}}, "required": ["x"]},
    "untyped": {"properties": {"a": {}}, "required": ["a"]},
    "array-root": {"type": "array", "items": {"type": "integer", "minimum": 5, "maximum": 5}, "minItems": 1},
    "allof": {"allOf": [{"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}]},
    # one-sided and exclusive bounds (pydantic's lt=0, gt=0): a maximum alone was ignored, exclusive ones too
    "bounds": {"type": "object", "properties": {
        "neg": {"type": "integer", "maximum": -1}, "low": {"type": "number", "maximum": -200.5},
        "pos": {"type": "integer", "exclusiveMinimum": 0, "maximum": 3},
        "under": {"type": "number", "exclusiveMaximum": -2.5}, "over": {"type": "number", "exclusiveMinimum": 1000}},
        "required": ["neg", "low", "pos", "under", "over"]},
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_output_is_valid_against_the_schema_and_reproducible(name):
    schema = SCHEMAS[name]
    check = jsonschema_rs.validator_for(schema)
    seen = set()
    for k in range(60):
        context = f"prompt {k} asks for {name}"
        g = structured(context, "json", schema, 10_000)
        assert g.finish_reason == "stop" and "".join(g.pieces) == g.text
        doc = json.loads(g.text)
        assert check.is_valid(doc), (g.text, list(check.iter_errors(doc))[:1])
        assert structured(context, "json", schema, 10_000).text == g.text  # a function of the context
        seen.add(g.text)
    assert len(seen) > 1 or name == "array-root"


def test_json_object_is_an_object_samples_differ_and_max_tokens_cuts():
    g = structured("hello", "json", None, 10_000)
    assert isinstance(json.loads(g.text), dict) and json.loads(g.text)
    texts = {structured("hello", "json", SCHEMAS["person"], 10_000, variant=v).text for v in range(4)}
    assert len(texts) > 1  # n > 1: each sample its own answer
    cut = structured("hello", "json", SCHEMAS["person"], 3)
    assert cut.finish_reason == "length" and len(cut.pieces) == 3 and cut.text == "".join(cut.pieces)
    assert structured("x", "choice", ["yes", "no", "maybe"], 10).text in ("yes", "no", "maybe")


def _chat(**kw) -> ChatCompletionRequest:
    return msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}, ChatCompletionRequest)


def test_every_way_to_ask_for_structured_output_is_read():
    s = SCHEMAS["definitions"]
    assert constraint(_chat()) is None
    assert constraint(_chat(response_format={"type": "text"})) is None
    assert constraint(_chat(response_format={"type": "json_object"})) == ("json", None)
    assert constraint(_chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": s}})) == ("json", s)
    assert constraint(_chat(guided_json=s)) == ("json", s)
    assert constraint(_chat(guided_json=json.dumps(s))) == ("json", s)
    assert constraint(_chat(structured_outputs={"json": s})) == ("json", s)
    assert constraint(_chat(guided_choice=["a", "b"])) == ("choice", ["a", "b"])
    assert constraint(_chat(structured_outputs={"choice": ["a"]})) == ("choice", ["a"])
    assert constraint(_chat(json_schema=s)) == ("json", s)  # llama.cpp
    comp = msgspec.convert({"model": "m", "prompt": "x", "guided_json": s}, CompletionRequest)
    assert constraint(comp) == ("json", s)


PATTERNS = [r"\d{3}-\d{4}", r"(yes|no|maybe)", r"[A-Z][a-z]+ [A-Z][a-z]+", r"[^aeiou]{5}", r"\w+@\w+\.(com|org)",
            r"(\d+)\.\1", r"(?i)hello", r"a.b.c", r"\s*\{\"x\": \d+\}", r"(ab)*c?", r"[\d\s]{2,4}", r"^foo$",
            r"(?P<y>\d{4})-(?P=y)", r"colou?r", r"[-+]?\d*\.\d+", r"\bword\b", r"(?:a|b|c){1,}", r".*", r"[a-f0-9]{32}"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_regex_gets_a_string_it_matches_whole_a_function_of_the_context(pattern):
    import re

    kind, spec = constraint(_chat(guided_regex=pattern))
    assert kind == "regex" and constraint(_chat(structured_outputs={"regex": pattern})) == (kind, spec)
    for ctx in [f"context {i}" for i in range(30)] + [[1, 2, 3]]:
        g = structured(ctx, kind, spec, 10_000)
        assert re.fullmatch(pattern, g.text) and g.finish_reason == "stop" and "".join(g.pieces) == g.text
        assert structured(ctx, kind, spec, 10_000).text == g.text


def test_a_regex_it_cannot_honour_is_a_400_naming_the_field():
    for pattern, field, code in (("(unclosed", "guided_regex", "invalid_value"),
                                 ("(a{60000}){60000}", "guided_regex", "unsupported_value"),
                                 ("a(?!b)b", "guided_regex", "unsupported_value")):
        with pytest.raises(ApiError) as e:
            constraint(_chat(guided_regex=pattern))
        assert (e.value.status, e.value.param, e.value.code) == (400, field, code)
    with pytest.raises(ApiError) as e:
        constraint(_chat(structured_outputs={"regex": "[z-a]"}))
    assert e.value.param == "structured_outputs"


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMAS["person"]}},
         {"type": "function", "function": {"name": "noop"}}]


def test_tool_calls_follow_tool_choice():
    ask = [{"role": "user", "content": "weather?"}]
    answered = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "noop", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert plan_tool_call(_chat(messages=ask), "ctx", 100) is None
    call, gen = plan_tool_call(_chat(messages=ask, tools=TOOLS), "ctx", 100)  # auto, the user's turn: a call
    assert call.name in ("get_weather", "noop") and call.call_id.startswith("chatcmpl-tool-")
    assert gen.finish_reason == "tool_calls" and isinstance(json.loads(gen.text), dict)
    assert plan_tool_call(_chat(messages=answered, tools=TOOLS), "ctx", 100) is None  # the result came: text
    assert plan_tool_call(_chat(messages=answered, tools=TOOLS, tool_choice="required"), "ctx", 100) is not None
    assert plan_tool_call(_chat(messages=ask, tools=TOOLS, tool_choice="none"), "ctx", 100) is None
    for ctx in ("a", "b", "c", "d"):
        call, gen = plan_tool_call(_chat(messages=ask, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "get_weather"}}), ctx, 1000)
        assert call.name == "get_weather" and gen.finish_reason == "stop"  # OpenAI's answer to a named choice
        assert jsonschema_rs.validator_for(SCHEMAS["person"]).is_valid(json.loads(gen.text))
    _, cut = plan_tool_call(_chat(messages=ask, tools=TOOLS, tool_choice="required"), "ctx", 2)
    assert cut.finish_reason == "length" and len(cut.pieces) == 2
    for bad, param in (({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                       ({"tool_choice": "sometimes"}, "tool_choice"), ({"tools": [{"type": "function"}]}, "tools[0]")):
        with pytest.raises(ApiError) as e:
            plan_tool_call(_chat(messages=ask, **{"tools": TOOLS, **bad}), "ctx", 100)
        assert e.value.status == 400 and e.value.param == param


def test_a_grammar_is_a_400_naming_the_field_not_text_that_ignores_it():
    for kw, field in (({"guided_grammar": "root ::= \"a\""}, "guided_grammar"), ({"grammar": "root ::= \"a\""}, "grammar"),
                      ({"structured_outputs": {"grammar": "root ::= \"a\""}}, "structured_outputs")):
        with pytest.raises(ApiError) as e:
            constraint(_chat(**kw))
        assert (e.value.status, e.value.param, e.value.code) == (400, field, "unsupported_value")
    assert constraint(_chat(grammar="")) is None  # an empty grammar constrains nothing


def test_any_pattern_gets_a_match_or_a_400_never_another_error():
    import re

    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(st.text(alphabet="ab01.*+?|()[]{}^$\\-,dwsDWSbB=!<>:P", max_size=14))
    def check(pattern):
        try:
            kind, spec = constraint(_chat(guided_regex=pattern))
        except ApiError as e:
            assert e.status == 400 and e.param == "guided_regex"
            return
        assert re.fullmatch(pattern, structured("ctx", kind, spec, 10_000).text)

    check()
