"""NVIDIA Dynamo's KV router: least ``overlap_score_weight x prefill_blocks + decode_blocks``.

Sources: Dynamo docs "KV Router" / "Router Design" (cost function, ``--kv-overlap-score-weight``
default 1.0, ``--router-temperature`` default 0.0 = deterministic) and the selector in
``lib/llm/src/kv_router/scheduler.rs`` (later ``lib/kv-router/src/scheduling/selector.rs``)::

    potential_tokens = new_tokens(isl, overlap_blocks) + active_tokens      # sequence.rs
    potential_prefill_block = potential_tokens / block_size
    decode_block = potential_blocks = new_blocks(request) + active_blocks   # sequence.rs
    logit = overlap_weight * potential_prefill_block + decode_block         # lower is better

where ``new_tokens = isl - overlap_blocks * block_size`` (the request's uncached prompt tokens),
``active_tokens`` the uncached prompt tokens of the worker's requests whose prefill has not finished
(``mark_prefill_completed`` takes each off at its first token) and ``new_blocks`` counts the request's
blocks not already among the worker's active (in-flight) blocks.  With temperature 0 the router takes the
minimum logit.

On our snapshot: ``overlap_blocks`` is the prefix index's match for the replica (read from the engines' KV
events when they publish them, ``scheduler.kv_events``, as Dynamo's indexer does; else the approximate index);
``active_tokens`` is ``pending_prefill``, the uncached prompt tokens of this gateway's requests there that
have no first token yet (without it a worker with a long prefill queue looked as cheap as an idle one);
``active_blocks`` is the KV blocks of this gateway's requests in flight there
(prompt + expected output each, not de-duplicated across requests as Dynamo's
per-worker sequence tracker does).  We approximate ``new_blocks`` by the request's
blocks minus the overlap, i.e. we assume the blocks the index says are cached
there are the shared ones.  Ties, which Dynamo resolves at random, are drawn
from a hash of the request's sequence number.
"""

from __future__ import annotations

import math

from steersman.config import SchedulerSettings
from steersman.policy.base import POLICIES, Decision
from steersman.policy.baselines.common import at, choose_min, rule_profile
from steersman.policy.framework import DecisionContext, Profile

__all__ = ["KvRouterCost", "dynamo_kv", "OVERLAP_SCORE_WEIGHT", "cost"]

OVERLAP_SCORE_WEIGHT = 1.0


def cost(ctx: DecisionContext, weight: float = OVERLAP_SCORE_WEIGHT):
    """Dynamo's logit for every candidate (lower is better)."""
    snap, req = ctx.snapshot, ctx.request
    bs = snap.statics.block_size
    overlap = ctx.feature("prefix-match")
    isl = req.prompt_tokens
    prefill_blocks = ((isl - overlap * bs).clip(min=0.0) + at(ctx, snap.pending_prefill)) / bs
    new_blocks = (math.ceil(isl / bs) - overlap).clip(min=0.0)
    decode_blocks = at(ctx, snap.active_blocks) + new_blocks
    return weight * prefill_blocks + decode_blocks


class KvRouterCost:
    name = "dynamo-kv"

    def __init__(self, overlap_score_weight: float = OVERLAP_SCORE_WEIGHT) -> None:
        self.weight = overlap_score_weight

    def pick(self, ctx: DecisionContext, scores=None) -> Decision:
        return choose_min(ctx, cost(ctx, self.weight), "dynamo: least prefill + decode blocks")


def dynamo_kv(settings: SchedulerSettings) -> Profile:
    p = rule_profile("dynamo-kv", KvRouterCost())
    p.kv_events = True  # Dynamo's KV router builds its index from the engines' KV events (docs: KV Cache Routing)
    return p


POLICIES.register("dynamo-kv", dynamo_kv)
