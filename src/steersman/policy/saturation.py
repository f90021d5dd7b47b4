"""The saturation detector: when is a replica too busy to take more work now?

Gateway API Inference Extension semantics (its defaults live in
:class:`~steersman.config.SchedulerSettings`): a replica is saturated when its
waiting queue reaches ``saturation_queue_depth`` or its KV cache usage reaches
``saturation_kv_usage``.  Between scrapes the engine's queue is stale, so the
requests this gateway routed since the last scrape are added to it once they
exceed the batch slots the engine had free at the scrape (``max_num_seqs -
running``; they only wait if no slot is left).  When the metrics are older than
``saturation_staleness_s`` only the gateway's own accounting is used
(unacknowledged requests in flight), instead of GIE's "stale means saturated",
so a lagging scraper cannot freeze the fleet.
"""

from __future__ import annotations

import numpy as np

from steersman.config import SchedulerSettings
from steersman.fleet import snapshot as S
from steersman.policy.framework import DecisionContext

__all__ = ["Saturation", "saturated"]


def saturated(snap, idx: np.ndarray, settings: SchedulerSettings) -> np.ndarray:
    """Boolean mask over replicas ``idx``."""
    depth = settings.saturation_queue_depth
    live = snap.live if idx.size == snap.size else snap.live[:, idx]  # all replicas: no copy
    if idx.size == snap.size:
        idx = slice(None)
    fresh = snap.time - live[S.SCRAPED_AT] <= settings.saturation_staleness_s
    slots = np.fmax(snap.statics.max_seqs[idx] - live[S.RUNNING], 0.0)  # NaN (unknown engine) -> 0 slots
    waiting = live[S.WAITING] + np.fmax(live[S.SINCE_SCRAPE] - slots, 0.0)
    by_fresh = (waiting >= depth) | (live[S.KV_USAGE] >= settings.saturation_kv_usage)
    by_ours = live[S.IN_FLIGHT] - live[S.DECODING] >= depth
    return np.where(fresh, by_fresh, by_ours)


class Saturation:
    """The profile hook (``Profile(saturation=...)``)."""

    name = "saturation"

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings

    def __call__(self, ctx: DecisionContext) -> np.ndarray:
        return saturated(ctx.snapshot, ctx.candidates, self.settings)
