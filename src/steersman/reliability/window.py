"""A rolling count over a time window, kept as fixed buckets (bounded memory, no per-event state)."""

from __future__ import annotations

import math

__all__ = ["RollingCounts"]


class RollingCounts:
    """Counts of ``width`` kinds of events over the last ``window_s`` seconds, in ``buckets`` buckets.

    Time is passed in (pure): events older than the window fall out bucket by
    bucket, like Hystrix's rolling statistics.  The window's totals are kept
    as running sums (a bucket leaving the window is subtracted once), so
    :meth:`add` and :meth:`totals` cost O(1) per call, not O(buckets): both run
    on every upstream attempt.  Time that goes backwards counts in the newest
    bucket.
    """

    __slots__ = ("span", "n", "width", "_counts", "_sums", "_epoch", "_slot")

    def __init__(self, window_s: float, buckets: int, width: int = 2) -> None:
        if not window_s > 0 or buckets < 1:
            raise ValueError("window_s must be > 0 and buckets >= 1")
        self.span = window_s / buckets
        self.n = buckets
        self.width = width
        self.clear()

    def _advance(self, now: float) -> int:
        """Move the window to ``now``'s bucket (dropping the buckets that left it); that bucket's slot."""
        e = math.floor(now / self.span)
        last = self._epoch
        if e == last or (last is not None and e < last):
            return self._slot
        if last is None or e - last >= self.n:
            for row in self._counts:
                row[:] = [0] * self.width
            self._sums = [0] * self.width
        else:
            sums = self._sums
            for ep in range(last + 1, e + 1):
                row = self._counts[ep % self.n]
                for k, c in enumerate(row):
                    if c:
                        sums[k] -= c
                        row[k] = 0
        self._epoch = e
        self._slot = e % self.n
        return self._slot

    def add(self, now: float, kind: int, count: int = 1) -> None:
        self._counts[self._advance(now)][kind] += count
        self._sums[kind] += count

    def totals(self, now: float) -> list[int]:
        self._advance(now)
        return list(self._sums)

    def clear(self) -> None:
        self._counts = [[0] * self.width for _ in range(self.n)]
        self._sums = [0] * self.width
        self._epoch: int | None = None  # the newest bucket's epoch (floor(now / span)); None: nothing yet
        self._slot = 0
