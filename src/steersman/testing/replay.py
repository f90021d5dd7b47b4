"""A workload double for the twin: replays a fixed list of arrivals, open loop.

Anything with the fields the twin reads from an arrival (``time``, ``seq``,
``prompt_tokens``, ``block_hashes``, ``output_tokens``, ...) will do; the list must
be sorted by time.  Completions trigger nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ReplayWorkload"]


class ReplayWorkload:
    __slots__ = ("items", "pos")

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = list(items)
        self.pos = 0

    def start(self) -> list[Any]:
        return []

    def next_batch(self, until: float) -> list[Any]:
        items, pos = self.items, self.pos
        end = pos
        while end < len(items) and items[end].time < until:
            end += 1
        self.pos = end
        return items[pos:end]

    def on_complete(self, a: Any, finished_at: float, ok: bool) -> list[Any]:
        return []

    @property
    def done(self) -> bool:
        return self.pos >= len(self.items)
