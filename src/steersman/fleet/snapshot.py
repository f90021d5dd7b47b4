"""A frozen, vectorised view of the fleet at one instant (struct of arrays).

Policies are pure functions of a snapshot and a request; they never see the
mutable :class:`~steersman.fleet.state.Fleet` or do IO.  Per-replica arrays are
indexed by replica index; every array is read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["FleetSnapshot", "WEIGHTS_CODES"]

#: Weights state codes used in :attr:`FleetSnapshot.weights`.
WEIGHTS_CODES: Mapping[str, int] = {"cold": 0, "loading": 1, "warm": 2}


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    time: float
    names: tuple[str, ...]
    gpus: tuple[str | None, ...]
    pools: tuple[str, ...]
    price_per_hour: np.ndarray
    model_masks: Mapping[str, np.ndarray]
    healthy: np.ndarray
    in_flight: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    kv_usage: np.ndarray
    prefix_queries: np.ndarray
    prefix_hits: np.ndarray
    weights: np.ndarray
    metrics_age: np.ndarray

    @property
    def size(self) -> int:
        return len(self.names)

    def serves(self, model: str) -> np.ndarray:
        """Boolean mask of replicas configured for ``model`` (healthy or not)."""
        mask = self.model_masks.get(model)
        if mask is None:
            return np.zeros(self.size, dtype=bool)
        return mask

    def candidates(self, model: str) -> np.ndarray:
        """Indices of healthy replicas with warm weights serving ``model``."""
        mask = self.serves(model) & self.healthy & (self.weights == WEIGHTS_CODES["warm"])
        return np.flatnonzero(mask)
