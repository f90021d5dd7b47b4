"""Token ids of a chat prompt, message by message, with the messages seen recently cached.

A chat prompt is rendered message by message (:func:`steersman.text.chat.render_chat`)
and every closed message ends with ``<|im_end|>\\n`` while every message starts with
``<|im_start|>``.  The tokenizer's pieces never cross that boundary: the ``\\n`` after
``>`` is a piece of its own whatever follows (it is a single whitespace character
between two non-space ones), and matching restarts at the ``<``.  So the prompt's
token ids are the concatenation of each message's, and a message seen before (a
system prompt shared by every request of an application, the earlier turns of a
conversation, an agent's growing context) need not be tokenized again: only the new
ones are.  ``tests/text/test_chat_tokens.py`` checks the equality on arbitrary text.

The cache is bounded (``DEFAULTS.engine.message_token_cache_mib``), keyed by role
and text, least recently used dropped first; a hit costs a dict lookup (the text's
hash, computed once per string object) instead of ~0.2 µs per token.  It is an
:class:`~collections.OrderedDict`: a hit moves its entry to the end and an eviction
pops the first one, both O(1).  (On a plain dict, popping and re-inserting leaves
deleted slots at the front that ``next(iter(d))`` walks past on every eviction: once
full, a request of many new messages took quadratic time and stalled the event loop.)
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from steersman.config import DEFAULTS
from steersman.text.chat import _END, _START, role_text, with_tools
from steersman.text.tokenizer import tokenize_array

__all__ = ["MessageTokens", "tokenize_chat", "tokenize_chat_array"]

_ENTRY_BYTES = 320  # per entry: the ordered dict's slot and node, the (role, text) key tuple, the ids array's header (measured:
# tests/text/test_cache_memory.py; 200 undercounted short messages ~1.2x)


class MessageTokens:
    """Bounded cache: (role, text) -> token ids of the closed message ``<|im_start|>role\\ntext<|im_end|>\\n``."""

    __slots__ = ("max_bytes", "nbytes", "hits", "misses", "_d", "_get", "_touch")

    def __init__(self, max_bytes: float) -> None:
        self.max_bytes = float(max_bytes)
        self.nbytes = 0
        self.hits = self.misses = 0
        self._d: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()  # int64, read-only; least recent first
        self._get, self._touch = self._d.get, self._d.move_to_end  # bound once: a hit costs what a dict's pop did

    def __len__(self) -> int:
        return len(self._d)

    def ids(self, role: str, text: str) -> np.ndarray:
        key = (role, text)
        got = self._get(key)
        if got is not None:
            self.hits += 1
            self._touch(key)  # most recently used last
            return got
        self.misses += 1
        got = tokenize_array(f"{_START}{role}\n{text}{_END}")
        if got.base is not None:
            got = got.copy()  # the tokenizer's ids are a view of a buffer sized by characters: keep only the ids
        got.flags.writeable = False  # shared by every prompt that holds the message
        cost = _cost(role, text, got)
        if cost > self.max_bytes:
            return got  # larger than the whole cache: not kept
        self.nbytes += cost
        d = self._d
        d[key] = got
        while self.nbytes > self.max_bytes:
            (r, t), old = d.popitem(last=False)  # the least recently used
            self.nbytes -= _cost(r, t, old)
        return got


def _cost(role: str, text: str, ids: np.ndarray) -> int:
    return sys.getsizeof(text) + len(role) + 8 * len(ids) + _ENTRY_BYTES


_CACHE = MessageTokens(DEFAULTS.engine.message_token_cache_mib * 2**20)
_OPEN = tokenize_array(f"{_START}assistant\n")


def tokenize_chat(messages: Iterable[Any], continue_final: bool = False,
                  cache: MessageTokens | None = None, tools: Any = None) -> list[int]:
    """``tokenize(render_chat(messages, continue_final, tools))``, reusing the ids of messages seen before."""
    return tokenize_chat_array(messages, continue_final, cache, tools).tolist()


def tokenize_chat_array(messages: Iterable[Any], continue_final: bool = False,
                        cache: MessageTokens | None = None, tools: Any = None) -> np.ndarray:
    """:func:`tokenize_chat` as an int64 array (the tools' section, a system message, cached like any other)."""
    c = _CACHE if cache is None else cache
    msgs = list(messages)
    if tools:
        with_tools(msgs, tools)
    parts: list[np.ndarray] = []
    last = len(msgs) - 1
    for i, m in enumerate(msgs):
        role, text = role_text(m)
        if i == last and continue_final and role == "assistant":
            parts.append(tokenize_array(f"{_START}assistant\n{text}"))  # left open: the prompt ends inside it
            return np.concatenate(parts)
        parts.append(c.ids(role, text))
    parts.append(_OPEN)
    return np.concatenate(parts)
