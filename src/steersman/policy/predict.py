"""Model-based latency and cost prediction for every candidate (shared decision features).

For each candidate replica the engine model's roofline (vectorised through
:class:`~steersman.fleet.statics.FleetStatics`) is fed what the snapshot says is
ahead of the request, the way vLLM v1 would schedule it:

* **queue ahead**: prompt tokens still to prefill there — this gateway's own
  routed-but-unanswered work (``pending_prefill``) plus the engine's waiting
  requests that are not ours (priced at this request's prompt length);
* **this request's uncached prefill**: its prompt minus the prefix the index
  says the replica holds (trusted in proportion to how much of the index can
  still be resident: ``kv_blocks / indexed blocks``);
* **batch**: the decoding requests (``running``) share every step.

A step with chunked prefill carries ``D`` decodes and ``P = B - D`` prefill
tokens (``B`` = max_num_batched_tokens), so

    TTFT ≈ ceil((queue ahead + own uncached) / P) × t_step(B) × ttft_ratio
    TPOT ≈ t_step(decodes only, D + 1) × tpot_ratio          (no prefill waiting)
         ≈ t_step(B) × tpot_ratio                              (prefill waiting)

where the ratios are each replica's observed/predicted correction (a degraded
GPU learns a ratio above 1).  Replicas without a known GPU/model use their
observed latencies.  The marginal **cost** of the request on a replica is its
share of GPU time priced at the replica's $/h: its prompt's share of the token
budget of the steps that prefill it plus
``expected_output × TPOT / (D + 1)`` (a batch of D + 1 shares each decode step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from steersman.policy.framework import DecisionContext, feature

__all__ = ["Prediction", "prefix_blocks", "uncached_tokens", "predict"]

#: Context assumed for the other requests of a batch when pricing their KV reads.
_CTX_FALLBACK = 1024.0


@dataclass(frozen=True, slots=True)
class Prediction:
    """Arrays aligned with the decision's ``base`` candidates."""

    ttft: np.ndarray  # seconds
    tpot: np.ndarray  # seconds per output token
    e2e: np.ndarray  # ttft + expected_output x tpot
    cost: np.ndarray  # $ of GPU time this request is expected to use there
    uncached: np.ndarray  # prompt tokens to prefill there

    def select(self, sel: np.ndarray) -> Prediction:
        return Prediction(self.ttft[sel], self.tpot[sel], self.e2e[sel], self.cost[sel], self.uncached[sel])


@feature("prefix_blocks")
def prefix_blocks(ctx: DecisionContext) -> np.ndarray:
    """Leading prompt blocks each candidate probably holds, discounted by residency confidence."""
    snap, req, idx = ctx.snapshot, ctx.request, ctx.base
    if snap.prefix is None or not req.block_hashes:
        return np.zeros(idx.size)
    held = snap.prefix.match(req.block_hashes)[idx].astype(float)
    capacity = np.where(np.isnan(snap.kv_blocks_total[idx]), snap.statics.kv_blocks[idx], snap.kv_blocks_total[idx])
    indexed = snap.prefix.blocks_per_replica()[idx]
    confidence = np.where((indexed > 0) & (capacity > 0), np.minimum(1.0, capacity / np.maximum(indexed, 1.0)), 1.0)
    return held * np.nan_to_num(confidence, nan=1.0)


@feature("uncached_tokens")
def uncached_tokens(ctx: DecisionContext) -> np.ndarray:
    req = ctx.request
    hit = np.floor(ctx.feature_base("prefix_blocks")) * ctx.snapshot.statics.block_size
    return req.prompt_tokens - np.minimum(hit, max(req.prompt_tokens - 1, 0))


@feature("prediction")
def predict(ctx: DecisionContext) -> Prediction:
    snap, req, idx = ctx.snapshot, ctx.request, ctx.base
    st = snap.statics
    own = ctx.feature_base("uncached_tokens")
    running = np.maximum(snap.running[idx], snap.decoding[idx])
    ours_waiting = np.maximum(snap.in_flight[idx] - snap.decoding[idx], 0.0)
    others = np.maximum(snap.waiting[idx] - ours_waiting, 0.0) * req.prompt_tokens
    ahead = np.maximum(snap.pending_prefill[idx], 0.0) + others
    B = np.nan_to_num(st.max_batched_tokens[idx], nan=2048.0)
    D = np.minimum(running, B - 1)
    P = np.maximum(B - D, 1.0)
    ctx_len = float(req.prompt_tokens + req.expected_output / 2) or _CTX_FALLBACK
    one = np.ones(idx.size)
    # a full mixed step: D decodes + P prefill tokens (one chunk at context ~ctx_len)
    t_full = st.step_time(idx, B, P * (ctx_len / 2 + P / 2), P + ctx_len / 2, D * ctx_len, D + one)
    t_dec = st.step_time(idx, D + one, 0 * one, 0 * one, (D + one) * ctx_len, D + one)
    steps = np.ceil((ahead + own) / P)
    ttft = steps * t_full * snap.ttft_ratio[idx]
    tpot = np.where(ahead > 0, t_full, t_dec) * snap.tpot_ratio[idx]
    unmodelled = ~st.modelled[idx]
    if unmodelled.any():
        ttft = np.where(unmodelled, np.nan_to_num(snap.ttft_ewma[idx], nan=0.5), ttft)
        tpot = np.where(unmodelled, np.nan_to_num(snap.tpot_ewma[idx], nan=0.05), tpot)
    e2e = ttft + req.expected_output * tpot
    own_prefill_s = own / B * np.where(unmodelled, ttft, t_full)  # our share of the steps' token budget
    gpu_s = own_prefill_s + req.expected_output * tpot / (D + 1)
    cost = st.price_per_hour[idx] / 3600.0 * gpu_s
    return Prediction(ttft, tpot, e2e, cost, own)
