"""The live, mutable state of the fleet, owned by the gateway's IO edge.

Writers: the request path (in-flight accounting), the metrics scraper and health
checks.  Readers: policies, through :meth:`Fleet.snapshot` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from steersman.clock import Clock
from steersman.engines.base import EngineAdapter, EngineMetrics, ReplicaAddress
from steersman.fleet.snapshot import WEIGHTS_CODES, FleetSnapshot

__all__ = ["Replica", "Fleet"]


@dataclass(slots=True)
class Replica:
    index: int
    name: str
    url: str
    engine: str
    gpu: str | None
    models: tuple[str, ...]
    pool: str
    price_per_hour: float
    tp: int
    adapter: EngineAdapter

    @property
    def address(self) -> ReplicaAddress:
        return ReplicaAddress(self.name, self.url)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class Fleet:
    def __init__(self, replicas: Sequence[Replica], clock: Clock) -> None:
        self.replicas = list(replicas)
        self.clock = clock
        n = len(self.replicas)
        self.in_flight = np.zeros(n, dtype=np.int64)
        self.healthy = np.ones(n, dtype=bool)
        self.running = np.zeros(n)
        self.waiting = np.zeros(n)
        self.kv_usage = np.zeros(n)
        self.prefix_queries = np.zeros(n)
        self.prefix_hits = np.zeros(n)
        self.weights = np.full(n, WEIGHTS_CODES["warm"], dtype=np.int8)
        self.scraped_at = np.full(n, -np.inf)
        self._static()

    def _static(self) -> None:
        reps = self.replicas
        self._names = tuple(r.name for r in reps)
        self._gpus = tuple(r.gpu for r in reps)
        self._pools = tuple(r.pool for r in reps)
        self._price = _frozen(np.array([r.price_per_hour for r in reps], dtype=float))
        masks: dict[str, np.ndarray] = {}
        for r in reps:
            for m in r.models:
                masks.setdefault(m, np.zeros(len(reps), dtype=bool))[r.index] = True
        self._masks = MappingProxyType({m: _frozen(a) for m, a in masks.items()})

    def set_models(self, index: int, models: Sequence[str]) -> None:
        """Models discovered from an engine's ``/v1/models``."""
        self.replicas[index].models = tuple(models)
        self._static()

    def models(self) -> list[str]:
        return sorted(self._masks)

    def has_model(self, model: str) -> bool:
        return model in self._masks

    # ---- request path -----------------------------------------------------
    def begin(self, index: int) -> None:
        self.in_flight[index] += 1

    def end(self, index: int) -> None:
        self.in_flight[index] -= 1

    # ---- scraper / health -------------------------------------------------
    def update_metrics(self, index: int, m: EngineMetrics) -> None:
        self.running[index] = m.num_running
        self.waiting[index] = m.num_waiting
        self.kv_usage[index] = m.kv_usage
        self.prefix_queries[index] = m.prefix_queries
        self.prefix_hits[index] = m.prefix_hits
        if m.weights is not None:
            self.weights[index] = WEIGHTS_CODES.get(m.weights, WEIGHTS_CODES["warm"])
        self.scraped_at[index] = self.clock.now()

    def set_healthy(self, index: int, healthy: bool) -> None:
        self.healthy[index] = healthy

    def snapshot(self) -> FleetSnapshot:
        now = self.clock.now()
        return FleetSnapshot(
            time=now,
            names=self._names,
            gpus=self._gpus,
            pools=self._pools,
            price_per_hour=self._price,
            model_masks=self._masks,
            healthy=_frozen(self.healthy.copy()),
            in_flight=_frozen(self.in_flight.copy()),
            running=_frozen(self.running.copy()),
            waiting=_frozen(self.waiting.copy()),
            kv_usage=_frozen(self.kv_usage.copy()),
            prefix_queries=_frozen(self.prefix_queries.copy()),
            prefix_hits=_frozen(self.prefix_hits.copy()),
            weights=_frozen(self.weights.copy()),
            metrics_age=_frozen(now - self.scraped_at),
        )
