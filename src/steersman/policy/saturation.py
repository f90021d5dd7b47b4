"""The saturation detector: when is a replica too busy to take more work now?

Gateway API Inference Extension semantics (its defaults live in
:class:`~steersman.config.SchedulerSettings`): a replica is saturated when its
waiting queue reaches ``saturation_queue_depth`` or its KV cache usage reaches
``saturation_kv_usage``.  Between scrapes the engine's queue is stale, so the
requests this gateway routed since the last scrape count as waiting too; when
the metrics are older than ``saturation_staleness_s`` only the gateway's own
accounting is used (unacknowledged requests in flight), instead of GIE's
"stale means saturated", so a lagging scraper cannot freeze the fleet.
"""

from __future__ import annotations

import numpy as np

from steersman.config import SchedulerSettings
from steersman.policy.framework import DecisionContext

__all__ = ["Saturation", "saturated"]


def saturated(snap, idx: np.ndarray, settings: SchedulerSettings) -> np.ndarray:
    """Boolean mask over replicas ``idx``."""
    depth = settings.saturation_queue_depth
    fresh = snap.metrics_age[idx] <= settings.saturation_staleness_s
    waiting = snap.waiting[idx] + snap.since_scrape[idx]
    ours = np.maximum(snap.in_flight[idx] - snap.decoding[idx], 0.0)
    by_queue = np.where(fresh, waiting >= depth, ours >= depth)
    by_kv = fresh & (snap.kv_usage[idx] >= settings.saturation_kv_usage)
    return by_queue | by_kv


class Saturation:
    """The profile hook (``Profile(saturation=...)``)."""

    name = "saturation"

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings

    def __call__(self, ctx: DecisionContext) -> np.ndarray:
        return saturated(ctx.snapshot, ctx.candidates, self.settings)
