"""The chat request's fields that OpenAI checks and an engine would let by (a 400 naming the field).

vLLM and llama.cpp ignore a chat field they do not know, so a request asking for what no text engine does (audio
output, web search, the legacy ``functions``) got a plain text answer, and a field of the wrong type
(``parallel_tool_calls: "yes"``, ``metadata: 5``) went by unread; OpenAI answers each 400, and so does the gateway's
own Responses API (``api/responses.py``).  Left to the engines as vLLM takes them, though OpenAI refuses them: an
empty ``tools`` array (no tools) and function names outside ``[a-zA-Z0-9_-]{1,64}`` (a dotted name works on vLLM,
and clients written for it send them).
"""

from __future__ import annotations

from typing import Any

from steersman.api.errors import bad_request

__all__ = ["check_metadata", "check_unsupported"]

#: OpenAI's Metadata: "up to 16 key-value pairs ... keys are strings with a maximum length of 64 characters.
#: Values are strings with a maximum length of 512 characters."
_METADATA_KEYS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512

#: fields asking for what no engine behind the gateway does, and why (a 400 naming each rather than ignoring it)
_UNSUPPORTED = {
    "audio": "audio output is not supported by this gateway's engines (text only)",
    "web_search_options": "web search is not supported by this gateway's engines",
    "functions": "the deprecated `functions` is not supported: use `tools`",
    "function_call": "the deprecated `function_call` is not supported: use `tool_choice`",
}


def check_metadata(metadata: Any, where: str = "metadata") -> None:
    """OpenAI's limits on ``metadata`` (its type, an object of strings, is the caller's to check)."""
    if not metadata:
        return
    if len(metadata) > _METADATA_KEYS:
        raise bad_request(f"`{where}` has {len(metadata)} keys: at most {_METADATA_KEYS} are allowed.", where)
    for k, v in metadata.items():
        if len(k) > _METADATA_KEY_CHARS:
            raise bad_request(f"`{where}` key {k[:40]!r}... is {len(k)} characters long: at most "
                              f"{_METADATA_KEY_CHARS} are allowed.", f"{where}.{k[:64]}")
        if len(v) > _METADATA_VALUE_CHARS:
            raise bad_request(f"`{where}.{k}` is {len(v)} characters long: at most {_METADATA_VALUE_CHARS} are "
                              "allowed.", f"{where}.{k}")


def check_unsupported(fields: dict[str, Any]) -> None:
    """``fields``: the request's values of :data:`_UNSUPPORTED` and ``modalities`` (None when absent)."""
    for key, why in _UNSUPPORTED.items():
        if fields.get(key) is not None:
            raise bad_request(f"`{key}`: {why}.", key, "unsupported_value")
    modalities = fields.get("modalities")
    if modalities is None:
        return
    if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
        raise bad_request("`modalities` must be an array of strings.", "modalities", "invalid_type")
    other = [m for m in modalities if m != "text"]
    if other:
        raise bad_request(f"`modalities` {other[0][:20]!r} is not supported by this gateway's engines: only "
                          "[\"text\"].", "modalities", "unsupported_value")
