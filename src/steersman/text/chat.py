"""Rendering chat messages to one prompt string.

The simulated engine and the gateway render chats identically, so the gateway's
prefix hashes match the engine's cache.  The format is ChatML-like.  With
``continue_final=True`` a trailing assistant message is left open, which is how a
stream is continued from an assistant prefix (vLLM's ``continue_final_message``).

What real engines' templates put in the prompt besides the text is rendered too,
deterministically (the same JSON in both processes), so the token count and the
block hashes follow it: the request's ``tools`` as a system section (after a
leading system or developer message, as Qwen's and Hermes' templates list them
after the system prompt), an assistant message's ``tool_calls`` in
``<tool_call>`` tags after its text, and a non-text part (an image, audio, a
file) as a placeholder naming a 64-bit BLAKE2b of its payload (vLLM keys an
image's blocks by its hash: different images are different prompts).  A
text-only chat renders exactly as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

__all__ = ["render_chat", "message_text", "with_tools"]

_START = "<|im_start|>"
_END = "<|im_end|>\n"
_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query. The functions you may "
               "call are listed in <tools></tools> tags:\n<tools>\n")
_TOOLS_TAIL = ("\n</tools>\n\nTo call a function, answer with a JSON object holding its name and arguments in "
               "<tool_call></tool_call> tags.")
_LEADS = ("system", "developer")  # a leading message of these roles stays before the tools


def message_text(content: Any) -> str:
    """Text of an OpenAI message ``content`` (a string, or a list of parts: text parts joined as they are, other
    parts as placeholders naming their payload's hash)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping):
            kind = part.get("type")
            if kind == "text":
                parts.append(str(part.get("text", "")))
            elif kind == "refusal":  # an assistant's refusal is text to vLLM too
                parts.append(str(part.get("refusal", "")))
            else:
                parts.append(_placeholder(part))
        elif isinstance(part, str):
            parts.append(part)
    return "".join(parts)


def _placeholder(part: Mapping) -> str:
    """``<|image_url:hash|>`` for an image part (the hash of its URL or data URL, not of its ``detail``), and
    likewise for audio, video or a file: the same payload, the same text."""
    kind = part.get("type")
    payload = part.get(kind) if isinstance(kind, str) else part
    if isinstance(payload, Mapping) and isinstance(payload.get("url"), str):
        payload = payload["url"]
    data = payload if isinstance(payload, str) else _json(payload)
    digest = hashlib.blake2b(data.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"<|{str(kind)[:40]}:{digest}|>"


def _json(value: Any) -> str:
    """Compact JSON, keys in the order sent (a template's ``tojson``); what orjson cannot write (an integer past 64
    bits, a lone surrogate) through :mod:`json`, as deterministic (a non-JSON object, from a Python caller only:
    its ``repr``)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)


def _calls_text(text: str, calls: Any) -> str:
    """``text`` followed by each tool call as Hermes / Qwen templates write it: ``<tool_call>`` tags around
    ``{"name": ..., "arguments": ...}``, the arguments as sent (OpenAI's are a JSON string)."""
    out = [text]
    for call in calls if isinstance(calls, list) else (calls,):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            fn = call if isinstance(call, Mapping) else {"name": call}
        args = fn.get("arguments")
        if out[-1]:
            out.append("\n")
        out.append('<tool_call>\n{"name": ' + _json(fn.get("name")) + ', "arguments": '
                   + (args if isinstance(args, str) else _json(args)) + "}\n</tool_call>")
    return "".join(out)


def role_text(m: Any) -> tuple[str, str]:
    """(role, text) of a message (an object with ``role``/``content``/``tool_calls`` such as the schema's, or a
    mapping): its content and its tool calls, as the prompt holds them between ``<|im_start|>role\\n`` and
    ``<|im_end|>``.  Attributes are tried first: the gateway's messages are objects, and ``isinstance(m,
    Mapping)`` costs ~0.4 µs on one."""
    try:
        role, content, calls = m.role, m.content, m.tool_calls
    except AttributeError:
        if isinstance(m, Mapping):
            role, content, calls = str(m.get("role", "user")), m.get("content"), m.get("tool_calls")
        else:
            role, content, calls = str(m.role), m.content, getattr(m, "tool_calls", None)
    text = content if isinstance(content, str) else message_text(content)
    if calls:
        text = _calls_text(text, calls)
    return role, text


def with_tools(msgs: list[Any], tools: Any) -> list[Any]:
    """``msgs`` (a list of the request's own) with ``tools`` listed in a system message of their own, after a
    leading system or developer message or else first; unchanged without tools."""
    if tools:
        first = msgs[0] if msgs else None
        role = first.get("role") if isinstance(first, Mapping) else getattr(first, "role", None)
        at = 1 if role in _LEADS else 0
        listed = "\n".join(_json(t) for t in (tools if isinstance(tools, list) else (tools,)))
        msgs.insert(at, {"role": "system", "content": f"{_TOOLS_HEAD}{listed}{_TOOLS_TAIL}"})
    return msgs


def render_chat(messages: Iterable[Any], continue_final: bool = False, tools: Any = None) -> str:
    """One prompt string for ``messages`` (mappings or objects with ``role``/``content``) and the request's
    ``tools`` (:func:`with_tools`).

    Ends with an open assistant turn, or, with ``continue_final``, with the final
    assistant message left open so generation continues it.
    """
    msgs = list(messages)
    if tools:
        with_tools(msgs, tools)
    out = []
    last = len(msgs) - 1
    for i, m in enumerate(msgs):
        role, text = role_text(m)
        if i == last and continue_final and role == "assistant":
            out.append(f"{_START}assistant\n{text}")
            return "".join(out)
        out.append(f"{_START}{role}\n{text}{_END}")
    out.append(f"{_START}assistant\n")
    return "".join(out)
