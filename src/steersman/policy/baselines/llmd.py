"""llm-d's default scheduling profile: prefix-cache 3, queue 2, KV-cache utilization 2, max score.

Sources (checked against the code, not only the docs):

* weights: llm-d's ``inference-scheduling`` well-lit path (``gaie-inference-scheduling``
  values) and the Gateway API Inference Extension default ``default-plugins.yaml``:
  ``prefix-cache-scorer`` weight 3, ``queue-scorer`` weight 2,
  ``kv-cache-utilization-scorer`` weight 2, ``max-score-picker``;
* ``queue-scorer`` (GIE ``pkg/epp/scheduling/framework/plugins/scorer/queue.go``):
  ``(max - waiting) / (max - min)`` over the candidates' ``WaitingQueueSize``, 1.0 for
  every pod when all queues are equal;
* ``kv-cache-utilization-scorer`` (``scorer/kvcache_utilization.go``): ``1 - KVCacheUsagePercent``;
* ``prefix-cache-scorer`` (``plugins/multi/prefix/plugin.go``): ``matchLen / total``, the
  longest run of leading prompt blocks the pod is believed to hold over the prompt's
  blocks, from an approximate LRU index fed by the picker's own decisions (as ours is), an LRU per
  server of its engine's cache size (``NumOfGPUBlocks``: the pod's ``CacheNumBlocks`` with AutoTune,
  else 31,250 blocks): ours with ``scheduler.prefix_residency``.

Differences: llm-d hashes 64-character blocks of the prompt text (256 blocks at
most); we use the request's 16-token block hashes, all of them.  Its max-score
picker shuffles ties at random; ours breaks them by the request's sequence number.
The three scorers are registered so other profiles can reuse them.
"""

from __future__ import annotations

import numpy as np

from steersman.config import SchedulerSettings
from steersman.policy.base import POLICIES
from steersman.policy.baselines.common import at
from steersman.policy.framework import SCORERS, DecisionContext, MaxScore, Profile, WeightedScorer

__all__ = ["PrefixMatchFraction", "QueueDepth", "KvUtilization", "llm_d"]


@SCORERS.register("prefix-match-fraction")
class PrefixMatchFraction:
    """Leading prompt blocks held / prompt blocks (llm-d ``prefix-cache-scorer``)."""

    name = "prefix-match-fraction"

    def score(self, ctx: DecisionContext) -> np.ndarray:
        total = len(ctx.request.block_hashes)
        if total == 0:
            return np.zeros(ctx.candidates.size)
        return ctx.feature("prefix-match") / total


@SCORERS.register("queue-depth")
class QueueDepth:
    """Min-max normalised engine waiting queue, shorter is better (llm-d ``queue-scorer``)."""

    name = "queue-depth"

    def score(self, ctx: DecisionContext) -> np.ndarray:
        q = at(ctx, ctx.snapshot.waiting)
        lo, hi = q.min(), q.max()
        if hi <= lo:
            return np.ones(q.size)
        return (hi - q) / (hi - lo)


@SCORERS.register("kv-utilization")
class KvUtilization:
    """Free share of the KV cache, ``1 - usage`` (llm-d ``kv-cache-utilization-scorer``)."""

    name = "kv-utilization"

    def score(self, ctx: DecisionContext) -> np.ndarray:
        return 1.0 - at(ctx, ctx.snapshot.kv_usage)


def llm_d(settings: SchedulerSettings) -> Profile:
    return Profile(
        "llm-d",
        filters=(),
        scorers=(
            WeightedScorer(PrefixMatchFraction(), 3.0),
            WeightedScorer(QueueDepth(), 2.0),
            WeightedScorer(KvUtilization(), 2.0),
        ),
        picker=MaxScore(),
        saturation=None,
    )


POLICIES.register("llm-d", llm_d)
