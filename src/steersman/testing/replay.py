"""A workload double for the twin: replays a fixed list of arrivals, open loop.

Anything with the fields the twin reads from an arrival (``time``, ``seq``,
``prompt_tokens``, ``block_hashes``, ``output_tokens``, ...) will do; the list must
be sorted by time.  Completions trigger nothing.  :func:`arrival` builds the twin's own
:class:`~steersman.twin.workload.base.Arrival` with test defaults; :func:`poisson` a
replay of Poisson arrivals whose prompts share nothing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from steersman.twin.workload.base import Arrival

__all__ = ["ReplayWorkload", "arrival", "poisson"]

_DEFAULTS = dict(tenant="t", model="llama-3.1-8b", prompt_tokens=645, block_hashes=(), output_tokens=100,
                 max_tokens=100, slo_class=None, deadline_s=None, workflow=None, step=None, steps=None)


def arrival(time: float, seq: int, **fields: Any) -> Arrival:
    """One arrival: tenant ``t``, Llama-3.1-8B, 645 prompt tokens, 100 output tokens, unless ``fields`` say."""
    return Arrival(time, seq, **{**_DEFAULTS, **fields})


def poisson(rate: float, n: int, seed: int = 0, blocks: int = 40, **fields: Any) -> ReplayWorkload:
    """``n`` arrivals at ``rate`` per second (exponential gaps drawn from ``random.Random(seed)``), each with
    ``blocks`` prompt block hashes of its own."""
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        items.append(arrival(t, i, block_hashes=tuple(hash((i, j)) for j in range(blocks)), **fields))
    return ReplayWorkload(items)


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
