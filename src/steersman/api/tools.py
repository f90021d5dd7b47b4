"""A chat request's ``tools`` and ``tool_choice``, checked as OpenAI checks them (the gateway before any engine sees
the request, engine-sim again as vLLM does): each tool a function with a name; ``tool_choice`` one of ``none``,
``auto``, ``required`` or ``{"type": "function", "function": {"name": N}}`` naming one of the tools; any choice but
``none`` only with ``tools`` set (vLLM's check_tool_usage), ``required`` or a named function only with tools in it.
Errors are 400s naming the field."""

from __future__ import annotations

from typing import Any

from steersman.api.errors import bad_request

__all__ = ["tool_functions", "chosen_tool", "check_function_fields"]

_CHOICES = ("none", "auto", "required")
#: a function's optional fields and the JSON type each must have (OpenAI's FunctionObject; vLLM's
#: FunctionDefinition types them alike: a 200 for ``parameters: "x"`` made engine-sim call a tool it could not
#: describe, and a real engine answered a 400 naming a field the client did not write)
_FUNCTION_FIELDS = (("description", str, "a string"), ("parameters", dict, "an object"), ("strict", bool, "a boolean"))


def check_function_fields(fn: dict[str, Any], where: str) -> None:
    """A 400 naming ``{where}.{field}`` for a function field of the wrong JSON type (``null`` is absent)."""
    for key, kind, what in _FUNCTION_FIELDS:
        v = fn.get(key)
        if v is not None and not isinstance(v, kind):
            raise bad_request(f"`{where}.{key}` must be {what}.", f"{where}.{key}", "invalid_type")


def tool_functions(tools: list[Any] | None) -> list[dict[str, Any]]:
    """The ``function`` objects of ``tools``; a 400 naming ``tools[i]`` for an entry that is not a named function."""
    out = []
    for i, t in enumerate(tools or ()):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"`tools[{i}]` must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}.",
                              f"tools[{i}]")
        check_function_fields(fn, f"tools[{i}].function")
        out.append(fn)
    return out


def chosen_tool(tools: list[Any] | None, choice: Any) -> tuple[list[dict[str, Any]], str | dict[str, Any]]:
    """(the tools' functions, the choice: one of the three words, or the named function); 400s as above."""
    fns = tool_functions(tools)
    if choice is None:
        return fns, "auto" if fns else "none"
    if tools is None and choice != "none":  # vLLM's words; "none" needs nothing (nor do the engines' defaults)
        raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type", "function") != "function" or not isinstance(name, str):
            raise bad_request("`tool_choice` must be none, auto, required or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}.", "tool_choice")
        chosen = next((f for f in fns if f["name"] == name), None)
        if chosen is None:
            raise bad_request(f"`tool_choice` names function {name[:64]!r}, which is not in `tools`.", "tool_choice")
        return fns, chosen
    if choice not in _CHOICES:
        raise bad_request(f"`tool_choice` must be none, auto, required or a named function, got {str(choice)[:40]!r}.",
                          "tool_choice")
    if choice == "required" and not fns:
        raise bad_request("`tool_choice` \"required\" needs `tools`.", "tool_choice")
    return fns, choice
