"""A frozen, vectorised view of the fleet at one instant (struct of arrays).

Policies are pure functions of a snapshot and a request; they never see the
mutable :class:`~steersman.fleet.state.Fleet` or do IO.  The live numeric state
is one matrix (a row per field, a column per replica) copied once per snapshot;
every array is read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["FleetSnapshot", "WEIGHTS_CODES", "LIVE_FIELDS"]

#: Weights state codes used in :attr:`FleetSnapshot.weights`.
WEIGHTS_CODES: Mapping[str, int] = {"cold": 0, "loading": 1, "warm": 2}

#: Rows of the live matrix.
LIVE_FIELDS = ("in_flight", "running", "waiting", "kv_usage", "prefix_queries", "prefix_hits", "weights", "scraped_at")
IN_FLIGHT, RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES, PREFIX_HITS, WEIGHTS, SCRAPED_AT = range(len(LIVE_FIELDS))


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    time: float
    names: tuple[str, ...]
    gpus: tuple[str | None, ...]
    pools: tuple[str, ...]
    price_per_hour: np.ndarray
    model_masks: Mapping[str, np.ndarray]
    healthy: np.ndarray  # bool per replica
    routable: np.ndarray  # healthy and weights warm
    live: np.ndarray  # LIVE_FIELDS x replicas

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def in_flight(self) -> np.ndarray:
        return self.live[IN_FLIGHT]

    @property
    def running(self) -> np.ndarray:
        return self.live[RUNNING]

    @property
    def waiting(self) -> np.ndarray:
        return self.live[WAITING]

    @property
    def kv_usage(self) -> np.ndarray:
        return self.live[KV_USAGE]

    @property
    def prefix_queries(self) -> np.ndarray:
        return self.live[PREFIX_QUERIES]

    @property
    def prefix_hits(self) -> np.ndarray:
        return self.live[PREFIX_HITS]

    @property
    def weights(self) -> np.ndarray:
        return self.live[WEIGHTS]

    @property
    def metrics_age(self) -> np.ndarray:
        return self.time - self.live[SCRAPED_AT]

    def serves(self, model: str) -> np.ndarray:
        """Boolean mask of replicas configured for ``model`` (healthy or not)."""
        mask = self.model_masks.get(model)
        if mask is None:
            return np.zeros(self.size, dtype=bool)
        return mask

    def candidates(self, model: str) -> np.ndarray:
        """Indices of healthy replicas with warm weights serving ``model``."""
        mask = self.model_masks.get(model)
        if mask is None:
            return np.empty(0, dtype=np.intp)
        return np.flatnonzero(mask & self.routable)
