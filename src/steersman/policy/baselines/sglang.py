"""SGLang router's ``cache_aware`` policy with its published defaults.

Source: sgl-project/sglang ``sgl-router/src/policies/cache_aware.rs`` (and the router's
``CacheAware`` defaults ``cache_threshold 0.3, balance_abs_threshold 64,
balance_rel_threshold 1.5``):

1. load = requests in flight per worker (the router's own counter).  The system is
   *imbalanced* when ``max - min > balance_abs_threshold`` **and**
   ``max > balance_rel_threshold * min``; then the least loaded worker wins.
2. otherwise the approximate radix tree gives the worker with the longest prefix
   match; if ``matched / prompt > cache_threshold`` that worker wins,
3. else the worker with the **smallest tree** (fewest cached characters) does.

On our snapshot: load is ``in_flight`` over the candidates (SGLang takes min/max
over all workers, healthy or not), the tree is the shared prefix index (blocks of
16 tokens where SGLang matches characters, so the rate is matched tokens / prompt
tokens and tree size is indexed blocks per replica), and ties, which SGLang
resolves by iteration order, are drawn from a hash of the request's sequence number.
"""

from __future__ import annotations

from steersman.config import SchedulerSettings
from steersman.policy.base import POLICIES, Decision
from steersman.policy.baselines.common import at, choose_max, choose_min, rule_profile
from steersman.policy.framework import DecisionContext, Profile

__all__ = ["CacheAware", "sglang_cache_aware", "CACHE_THRESHOLD", "BALANCE_ABS_THRESHOLD", "BALANCE_REL_THRESHOLD"]

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


class CacheAware:
    """The three-step rule as a picker (see the module doc)."""

    name = "sglang-cache-aware"

    def __init__(self, cache_threshold: float = CACHE_THRESHOLD, balance_abs_threshold: float = BALANCE_ABS_THRESHOLD,
                 balance_rel_threshold: float = BALANCE_REL_THRESHOLD) -> None:
        self.cache_threshold = cache_threshold
        self.abs_t = balance_abs_threshold
        self.rel_t = balance_rel_threshold

    def pick(self, ctx: DecisionContext, scores=None) -> Decision:
        snap, req = ctx.snapshot, ctx.request
        load = at(ctx, snap.in_flight)
        hi, lo = load.max(), load.min()
        if hi - lo > self.abs_t and hi > self.rel_t * lo:
            return choose_min(ctx, load, "sglang: load imbalanced, least loaded")
        matched = ctx.feature("prefix-match")
        best = matched.max()
        rate = min(best * snap.statics.block_size, req.prompt_tokens) / req.prompt_tokens if req.prompt_tokens > 0 else 0.0
        if rate > self.cache_threshold:
            return choose_max(ctx, matched, f"sglang: prefix match {rate:.2f} > {self.cache_threshold}")
        tree = at(ctx, snap.prefix.blocks_per_replica()) if snap.prefix is not None else 0 * load
        return choose_min(ctx, tree, f"sglang: prefix match {rate:.2f} <= {self.cache_threshold}, smallest tree")


def sglang_cache_aware(settings: SchedulerSettings) -> Profile:
    p = rule_profile("sglang-cache-aware", CacheAware())
    p.prefix_residency = False  # the router's radix tree evicts by its own size and age, not the engines'
    return p


POLICIES.register("sglang-cache-aware", sglang_cache_aware)
