"""A rolling count over a time window, kept as fixed buckets (bounded memory, no per-event state)."""

from __future__ import annotations

import math

__all__ = ["RollingCounts"]


class RollingCounts:
    """Counts of ``width`` kinds of events over the last ``window_s`` seconds, in ``buckets`` buckets.

    Time is passed in (pure): events older than the window fall out bucket by
    bucket, like Hystrix's rolling statistics.
    """

    __slots__ = ("span", "n", "width", "_counts", "_epoch")

    def __init__(self, window_s: float, buckets: int, width: int = 2) -> None:
        if not window_s > 0 or buckets < 1:
            raise ValueError("window_s must be > 0 and buckets >= 1")
        self.span = window_s / buckets
        self.n = buckets
        self.width = width
        self._counts = [[0] * width for _ in range(buckets)]
        self._epoch = [-1] * buckets  # which bucket epoch each slot holds

    def _slot(self, now: float) -> int:
        e = math.floor(now / self.span)
        i = e % self.n
        if self._epoch[i] != e:
            self._epoch[i] = e
            self._counts[i] = [0] * self.width
        return i

    def add(self, now: float, kind: int, count: int = 1) -> None:
        self._counts[self._slot(now)][kind] += count

    def totals(self, now: float) -> list[int]:
        e = math.floor(now / self.span)
        out = [0] * self.width
        for i in range(self.n):
            if e - self.n < self._epoch[i] <= e:
                for k in range(self.width):
                    out[k] += self._counts[i][k]
        return out

    def clear(self) -> None:
        self._counts = [[0] * self.width for _ in range(self.n)]
        self._epoch = [-1] * self.n
