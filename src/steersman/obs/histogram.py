"""Lock-free histograms for the request path, exposed through prometheus_client.

prometheus_client's ``Histogram.observe`` takes a lock and two counter
increments (~2-3 µs); the gateway observes every relayed chunk, so that was ~10%
of its CPU.  The gateway is single-threaded (one event loop), so a bisect and
two additions suffice; a collector turns the counts into the standard
cumulative ``_bucket``/``_sum``/``_count`` exposition at scrape time.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

__all__ = ["FastHistogram", "HistogramFamily", "CounterFamily"]


class FastHistogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        # the +Inf bucket is always there: a bound of inf among them would be exposed twice (le="inf", le="+Inf")
        self.bounds = tuple(sorted(b for b in bounds if b != math.inf))
        self.counts = [0] * (len(self.bounds) + 1)  # last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """A NaN is dropped: bisect would count it in the lowest bucket and the sum would stay NaN for good
        (prometheus_client counts it in no bucket but still adds it to the sum)."""
        if value == value:
            self.counts[bisect_left(self.bounds, value)] += 1
            self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for b, c in zip(self.bounds, self.counts):
            total += c
            out.append((_le(b), float(total)))
        out.append(("+Inf", float(total + self.counts[-1])))
        return out


def _le(b: float) -> str:
    return repr(float(b))


class HistogramFamily:
    """A labelled family of :class:`FastHistogram`; register it on a CollectorRegistry."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.buckets = tuple(buckets)
        self._children: dict[tuple[str, ...], FastHistogram] = {}

    def labels(self, *values: str) -> FastHistogram:
        h = self._children.get(values)
        if h is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}")
            h = self._children[values] = FastHistogram(self.buckets)
        return h

    def collect(self):
        fam = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labelnames))
        for values, h in self._children.items():
            fam.add_metric(list(values), h.cumulative(), h.sum)
        yield fam

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation, labels=list(self.labelnames))]


class CounterFamily:
    """A labelled counter without locks (same single-threaded reasoning); ``inc`` is a dict update."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name  # without the _total suffix, as prometheus_client names counters
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def get(self, *labels: str) -> float:
        return self.values.get(labels, 0.0)

    def collect(self):
        fam = CounterMetricFamily(self.name, self.documentation, labels=list(self.labelnames))
        for labels, v in self.values.items():
            fam.add_metric(list(labels), v)
        yield fam

    def describe(self):
        return [CounterMetricFamily(self.name, self.documentation, labels=list(self.labelnames))]
