"""The saturation detector: when is a replica too busy to take more work now?

Gateway API Inference Extension semantics (its defaults live in
:class:`~steersman.config.SchedulerSettings`): a replica is saturated when its
waiting queue reaches ``saturation_queue_depth`` or its KV cache usage reaches
``saturation_kv_usage``.  Between scrapes the engine's queue is stale, so it is
estimated as ``waiting + (routed - finished since the scrape) - free slots``,
floored at 0: the net requests this gateway added since the last scrape join the
queue once they exceed the batch slots the engine had free at the scrape
(``max_num_seqs - running``, none when it was already queueing), and every request
that finished since freed a slot or a place in the queue.  Counting only the
arrivals (as before) made a replica turning over short requests look saturated a
few requests after each scrape, and queued the fleet's traffic in the gateway
until the next scrape (TTFT p99 47 ms vs 18 ms with the queue off, 2 engine-sim
H100s at 64 streams).  When the metrics are older than
``saturation_staleness_s`` only the gateway's own accounting is used
(unacknowledged requests in flight), instead of GIE's "stale means saturated",
so a lagging scraper cannot freeze the fleet.

**The step's token budget.**  Free sequence slots do not admit a prompt that the engine's step has no token
budget left for (vLLM schedules a waiting request only while ``max_num_batched_tokens`` lasts: 8,192 on an
H100, 2,048 on an A100), so a burst of prompts waits in an engine with a thousand free slots.  Of this gateway's
streams awaiting a first token on a replica, those past what one step admits at the mean pending size count
as waiting too (a long prompt is one request, not a queue; a whole, non-streamed response shows no first token,
so the gateway cannot tell its prefill done and does not count it; an engine that reports no budget, llama.cpp,
is judged by its counts alone).  Counted by slots alone, a burst of the Azure code trace went to the one H100 that had
been idle at its last scrape while seven replicas idled behind their stale queues (TTFT p99 17 s).

**Affinity.**  For a request, a replica holding most of its prompt (the prefix index's
raw match reaches ``exploit_share`` of it, the rule that also makes the picker prefer
such holders) is saturated only at ``saturation_affinity_factor`` x the queue depth,
whatever its KV usage, when some candidate does not hold it.  The request's place is in
that replica's queue, where its prefill is mostly skipped, and not in the gateway's
queue, from which it would go to whichever replica frees first and compute its prompt
again, evicting other prefixes there.  On the full Mooncake trace (bench/policies) the
gateway queue broke affinity exactly when the fleet was busiest: with the exemption the
engines' hit rate went from 9% to 23% and goodput from 0.70x to 1.00x llm-d's.  A
request with no such holder still waits in the gateway queue for the first replica that
frees.  When every candidate holds the prompt there is no affinity to keep: the gateway
queue sends it to a holder anyway, in priority order (a short prompt every replica holds
must not bypass that queue, or standard traffic fills the engines' queues ahead of
critical requests: tests/faults/test_overload.py).
"""

from __future__ import annotations

import numpy as np

from steersman.config import SchedulerSettings
from steersman.policy.kernels import saturation_kernel
from steersman.policy.predict import _NO_MATCH  # also registers the prefix_held feature read below
from steersman.policy.framework import DecisionContext
from steersman.policy.request import SchedRequest

__all__ = ["Saturation", "saturated", "affine_blocks"]


def affine_blocks(req: SchedRequest, block_size: int, settings: SchedulerSettings) -> float:
    """Leading blocks a replica must hold for ``req`` to count as its holder (``exploit_share`` of the prompt)."""
    return settings.exploit_share * req.prompt_tokens / block_size


def saturated(snap, idx: np.ndarray, settings: SchedulerSettings, held: np.ndarray = _NO_MATCH,
              affine: float = np.inf) -> np.ndarray:
    """Boolean mask over replicas ``idx``; with ``held`` (the prefix index's match, per replica of the fleet),
    holders of at least ``affine`` blocks use the affinity thresholds.  Without: for no request in particular."""
    return saturation_kernel(
        idx, snap.live, snap.statics.max_seqs, snap.statics.max_batched_tokens, snap.time, settings.saturation_staleness_s,
        float(settings.saturation_queue_depth), settings.saturation_kv_usage, held, float(affine),
        float(settings.saturation_affinity_factor), np.empty(idx.size, dtype=np.bool_),
    )


class Saturation:
    """The profile hook (``Profile(saturation=...)``)."""

    name = "saturation"

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings

    def __call__(self, ctx: DecisionContext) -> np.ndarray:
        held = ctx.feature("prefix_held")
        affine = affine_blocks(ctx.request, ctx.snapshot.statics.block_size, self.settings) if held.size else np.inf
        return saturated(ctx.snapshot, ctx.candidates, self.settings, held, affine)
