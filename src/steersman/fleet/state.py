"""The live, mutable state of the fleet, owned by the gateway's IO edge.

Writers: the request path (in-flight accounting), the metrics scraper and health
checks.  Readers: policies, through :meth:`Fleet.snapshot` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from steersman.clock import Clock
from steersman.engines.base import EngineAdapter, EngineMetrics, ReplicaAddress
from steersman.fleet import snapshot as S
from steersman.fleet.snapshot import WEIGHTS_CODES, FleetSnapshot

__all__ = ["Replica", "Fleet"]

_WARM = WEIGHTS_CODES["warm"]


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
    address: ReplicaAddress = field(init=False)

    def __post_init__(self) -> None:
        self.address = ReplicaAddress(self.name, self.url)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class Fleet:
    def __init__(self, replicas: Sequence[Replica], clock: Clock) -> None:
        self.replicas = list(replicas)
        self.clock = clock
        n = len(self.replicas)
        self.live = np.zeros((len(S.LIVE_FIELDS), n))
        self.live[S.WEIGHTS] = _WARM
        self.live[S.SCRAPED_AT] = -np.inf
        self.healthy = np.ones(n, dtype=bool)
        self.routable = np.ones(n, dtype=bool)
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

    @property
    def in_flight(self) -> np.ndarray:
        return self.live[S.IN_FLIGHT]

    # ---- request path -----------------------------------------------------
    def begin(self, index: int) -> None:
        self.live[S.IN_FLIGHT, index] += 1

    def end(self, index: int) -> None:
        self.live[S.IN_FLIGHT, index] -= 1

    # ---- scraper / health -------------------------------------------------
    def update_metrics(self, index: int, m: EngineMetrics) -> None:
        col = self.live[:, index]
        col[S.RUNNING] = m.num_running
        col[S.WAITING] = m.num_waiting
        col[S.KV_USAGE] = m.kv_usage
        col[S.PREFIX_QUERIES] = m.prefix_queries
        col[S.PREFIX_HITS] = m.prefix_hits
        if m.weights is not None:
            col[S.WEIGHTS] = WEIGHTS_CODES.get(m.weights, _WARM)
            self._route(index)
        col[S.SCRAPED_AT] = self.clock.now()

    def set_healthy(self, index: int, healthy: bool) -> None:
        self.healthy[index] = healthy
        self._route(index)

    def _route(self, index: int) -> None:
        self.routable[index] = self.healthy[index] and self.live[S.WEIGHTS, index] == _WARM

    def snapshot(self) -> FleetSnapshot:
        return FleetSnapshot(
            time=self.clock.now(),
            names=self._names,
            gpus=self._gpus,
            pools=self._pools,
            price_per_hour=self._price,
            model_masks=self._masks,
            healthy=_frozen(self.healthy.copy()),
            routable=_frozen(self.routable.copy()),
            live=_frozen(self.live.copy()),
        )
