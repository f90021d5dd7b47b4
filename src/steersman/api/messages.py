"""The checks of a chat request's ``messages`` that OpenAI's API makes and an engine may not (a 400 naming the field).

vLLM accepts what its chat template can render: a user message with ``content: null``, an empty content array, a
tool message that answers no call, an assistant tool call without an id or arguments.  Such a request is a client's
bug: OpenAI answers it 400 (``Invalid value for 'content': expected a string, got null``, ``Missing required
parameter: 'messages[1].tool_call_id'``, ``empty array. Expected an array with minimum length 1``), and a template
renders it as something the client did not mean (an empty turn; a tool answer with nothing to answer) or fails
inside the engine.  Content part types other than text and image are left to the engine (vLLM reads audio, video
and more), as are its untyped short forms; so is the order of the turns.  What vLLM itself sends back is
accepted: an assistant message with ``tool_calls: []`` or ``content: null``.
"""

from __future__ import annotations

from typing import Any

from steersman.api.errors import bad_request

__all__ = ["check_message"]

_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


def check_message(i: int, role: str, content: Any, tool_calls: list | None, tool_call_id: str | None,
                  name: str | None) -> None:
    """Raise the 400 of ``messages[i]``'s first problem (its role is known to be valid)."""
    at = f"messages[{i}]"
    if tool_calls:  # (an empty list is no calls: vLLM answers every assistant message with one, and SDKs send it back)
        if role != "assistant":
            raise bad_request(f"`{at}.tool_calls` is only for assistant messages, not {role} ones.", f"{at}.tool_calls")
        for k, call in enumerate(tool_calls):
            _check_call(f"{at}.tool_calls[{k}]", call)
    if isinstance(content, list):
        if not content:
            raise bad_request(f"`{at}.content` is an empty array: give at least one content part, or a string.",
                              f"{at}.content")
        for j, part in enumerate(content):
            _check_part(f"{at}.content[{j}]", part)
    elif content is None and role in _CONTENT_REQUIRED:  # (an assistant's may be null: an answer cut off in its
        # reasoning is one, as vLLM returns it and the Responses store keeps it for the next turn)
        raise bad_request(f"`{at}.content` is required for a {role} message: a string or an array of content "
                          "parts, not null.", f"{at}.content")
    if role == "tool" and not tool_call_id:
        raise bad_request(f"`{at}.tool_call_id` is required: a tool message answers the assistant's tool call of "
                          "that id.", f"{at}.tool_call_id", "missing_required_parameter")
    if role == "function" and not name:
        raise bad_request(f"`{at}.name` is required for a function message: the function it answers.",
                          f"{at}.name", "missing_required_parameter")


def _check_part(at: str, part: Any) -> None:
    """A typed part's own fields; a part without ``type`` is vLLM's short form (``{"image_url": "https://..."}``,
    ``chat_utils``' simple content params), left to the engine."""
    if not isinstance(part, dict) or "type" not in part:
        return
    kind = part["type"]
    if not isinstance(kind, str):
        raise bad_request(f"`{at}.type` must be a string (e.g. \"text\").", f"{at}.type")
    if kind == "text" and not isinstance(part.get("text"), str):
        raise bad_request(f"`{at}.text` must be a string.", f"{at}.text")
    if kind == "image_url" and not (part.get("image_url") is None and part.get("uuid")):  # (vLLM: a cached one)
        img = part.get("image_url")
        url = img.get("url") if isinstance(img, dict) else img
        if not isinstance(url, str) or not url:
            raise bad_request(f"`{at}.image_url.url` must be a non-empty string (a URL or a data: URL).",
                              f"{at}.image_url.url")


def _check_call(at: str, call: Any) -> None:
    if not isinstance(call, dict):
        raise bad_request(f"`{at}` must be an object with `id`, `type` and `function`.", at)
    if not isinstance(call.get("id"), str) or not call["id"]:
        raise bad_request(f"`{at}.id` must be a non-empty string: the tool message answering it names it.",
                          f"{at}.id")
    if call.get("type", "function") != "function":
        raise bad_request(f"`{at}.type` must be \"function\".", f"{at}.type")
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"`{at}.function` must be an object with `name` and `arguments`.", f"{at}.function")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"`{at}.function.name` must be a non-empty string.", f"{at}.function.name")
    if not isinstance(fn.get("arguments"), str):
        raise bad_request(f"`{at}.function.arguments` must be a string (the arguments as JSON text).",
                          f"{at}.function.arguments")
