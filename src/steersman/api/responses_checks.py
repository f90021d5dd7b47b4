"""The checks of a Responses request that are not its translation (:mod:`steersman.api.responses`): the fields the
gateway takes and does not pass on, chat fields sent under their chat names, the pairing of function calls and
their outputs over the conversation, and the ``reasoning`` a Response echoes.  Errors are 400s in OpenAI's words,
naming the Responses field."""

from __future__ import annotations

from typing import Any

from steersman.api.errors import bad_request

__all__ = ["check_own", "check_tool_pairs", "kind", "reasoning_echo", "str_field"]


# chat completion fields whose Responses counterpart has another name: forwarded as engine extensions, they ran
# behind the Responses field's back (max_completion_tokens 8 beside max_output_tokens 3 generated 8 tokens, and the
# Response echoed 3); refused with a 400 that names the field to use
_CHAT_ONLY = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
              "response_format": "text.format", "messages": "input", "functions": "tools", "function_call": "tool_choice"}


def check_own(doc: dict[str, Any]) -> None:
    """The types and values of the Responses fields the gateway takes and does not pass on (a 400 naming each;
    they were dropped unchecked, and the Response echoed ``parallel_tool_calls: "x"``)."""
    for key, use in _CHAT_ONLY.items():
        if key in doc:
            raise bad_request(f"Unknown parameter: '{key}' (a chat completion field): use '{use}' on /v1/responses.",
                              key, "unknown_parameter")
    ptc = doc.get("parallel_tool_calls")
    if ptc is not None and not isinstance(ptc, bool):
        raise bad_request(f"Invalid type for 'parallel_tool_calls': expected a boolean, but got {kind(ptc)}.",
                          "parallel_tool_calls", "invalid_type")
    # strings only: their values grow with OpenAI's models (the SDK already lists effort xhigh and max, service tiers
    # fast and ultrafast), and the gateway passes none of them on
    for key in ("prompt_cache_key", "safety_identifier", "prompt_cache_retention", "service_tier"):
        str_field(doc, key, key)
    mtc = doc.get("max_tool_calls")
    if mtc is not None and (type(mtc) is not int or mtc < 1):
        raise bad_request(f"Invalid value for 'max_tool_calls': expected an integer >= 1, got {str(mtc)[:40]}.",
                          "max_tool_calls", "invalid_value")
    include = doc.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(x, str) for x in include)):
        raise bad_request(f"Invalid type for 'include': expected an array of strings, but got {kind(include)}.",
                          "include", "invalid_type")
    reasoning = _obj(doc, "reasoning")
    if reasoning is not None:
        str_field(reasoning, "effort", "reasoning.effort")
        str_field(reasoning, "summary", "reasoning.summary")
    if _obj(doc, "stream_options") is not None and doc.get("stream") is not True:
        raise bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options", "invalid_value")


def reasoning_echo(doc: dict[str, Any]) -> dict[str, Any]:
    """The Response's ``reasoning``: what the request set (its type checked by :func:`check_own`), as OpenAI
    echoes it (a request's ``effort: "high"`` read back as null)."""
    r = doc.get("reasoning") or {}
    return {"effort": r.get("effort"), "summary": r.get("summary")}


def check_tool_pairs(history: Any, items: Any) -> None:
    """OpenAI's pairing of function calls and their outputs over the conversation: an output whose ``call_id``
    no call before it made, and a call (the previous response's included) left without an output, are 400s.
    Without it both went to the engine as a chat whose tool turns did not match, which a chat template renders as
    something the client did not mean, or refuses."""
    calls: set[str] = set()
    pending: list[str] = []
    for m in history:
        for c in m.get("tool_calls") or ():
            if isinstance(c, dict) and isinstance(c.get("id"), str):
                calls.add(c["id"])
                pending.append(c["id"])
        if m.get("role") == "tool" and m.get("tool_call_id") in pending:
            pending.remove(m["tool_call_id"])
    for j, it in enumerate(items if isinstance(items, list) else ()):
        kind = it.get("type", "message" if "role" in it else None)
        if kind == "function_call":
            calls.add(it["call_id"])
            pending.append(it["call_id"])
        elif kind == "function_call_output":
            if it["call_id"] not in calls:
                raise bad_request(f"No tool call found for function call output with call_id {it['call_id'][:64]}.",
                                  f"input[{j}].call_id", "invalid_value")
            if it["call_id"] in pending:
                pending.remove(it["call_id"])
    if pending:
        raise bad_request(f"No tool output found for function call {pending[0][:64]}: give its "
                          "function_call_output in `input`.", "input", "invalid_value")


def _obj(doc: dict, key: str) -> dict | None:
    """``doc[key]``: an object, or None when absent (a 400 naming ``key`` for any other type)."""
    v = doc.get(key)
    if v is not None and not isinstance(v, dict):
        raise bad_request(f"Invalid type for '{key}': expected an object, but got {kind(v)}.", key, "invalid_type")
    return v


def str_field(doc: dict, key: str, where: str, required: bool = False) -> str | None:
    v = doc.get(key)
    if v is None:
        if required:
            raise bad_request(f"Missing required parameter: '{where}'.", where, "missing_required_parameter")
        return None
    if not isinstance(v, str):
        raise bad_request(f"Invalid type for '{where}': expected a string, but got {kind(v)}.", where, "invalid_type")
    return v


def kind(v: Any) -> str:
    return {dict: "an object", list: "an array", bool: "a boolean", int: "an integer", float: "a decimal number",
            str: "a string", type(None): "null"}.get(type(v), type(v).__name__)
