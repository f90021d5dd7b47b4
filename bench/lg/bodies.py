"""OpenAI request bodies, JSON encoding, and the SSE "carries generated text" test."""

from __future__ import annotations

import json
import re

try:
    import orjson

    def dumps(o) -> bytes:
        return orjson.dumps(o)
except ImportError:  # pragma: no cover

    def dumps(o) -> bytes:
        return json.dumps(o, separators=(",", ":")).encode()


# An SSE data event that carries generated text: "content":"x… or "text":"x… (any JSON spacing).
CONTENT_RE = re.compile(rb'"(?:content|text)"\s*:\s*"[^"]')


def chat_body(model: str = "llama-3.1-8b", max_tokens: int = 16, prompt: str = "Say hello.", **extra) -> dict:
    b = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": max_tokens}
    b.update(extra)
    return b


def completion_body(model: str = "llama-3.1-8b", max_tokens: int = 16, prompt: str = "Say hello.", **extra) -> dict:
    b = {"model": model, "prompt": prompt, "stream": True, "max_tokens": max_tokens}
    b.update(extra)
    return b
