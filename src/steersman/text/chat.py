"""Rendering chat messages to one prompt string.

The simulated engine and the gateway render chats identically, so the gateway's
prefix hashes match the engine's cache.  The format is ChatML-like.  With
``continue_final=True`` a trailing assistant message is left open, which is how a
stream is continued from an assistant prefix (vLLM's ``continue_final_message``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["render_chat", "message_text"]

_START = "<|im_start|>"
_END = "<|im_end|>\n"


def message_text(content: Any) -> str:
    """Text of an OpenAI message ``content`` (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping):
            if part.get("type") == "text":
                parts.append(str(part.get("text", "")))
        elif isinstance(part, str):
            parts.append(part)
    return "".join(parts)


def _role_content(m: Any) -> tuple[str, Any]:
    if isinstance(m, Mapping):
        return str(m.get("role", "user")), m.get("content")
    return str(m.role), m.content


def render_chat(messages: Iterable[Any], continue_final: bool = False) -> str:
    """One prompt string for ``messages`` (mappings or objects with ``role``/``content``).

    Ends with an open assistant turn, or, with ``continue_final``, with the final
    assistant message left open so generation continues it.
    """
    msgs = list(messages)
    out = []
    last = len(msgs) - 1
    for i, m in enumerate(msgs):
        role, content = _role_content(m)
        text = message_text(content)
        if i == last and continue_final and role == "assistant":
            out.append(f"{_START}assistant\n{text}")
            return "".join(out)
        out.append(f"{_START}{role}\n{text}{_END}")
    out.append(f"{_START}assistant\n")
    return "".join(out)
