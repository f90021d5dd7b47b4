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

    TTFT ≈ (⌊W / P⌋ × t_step(B) + t_step(D + W mod P)) × ttft_ratio,   W = queue ahead + own uncached
    (the partial step interpolated between the decode-only and the full step)
    TPOT ≈ t_step(decodes only, D + 1) × tpot_ratio          (no other prefill waiting)
         ≈ t_step(B) × tpot_ratio                              (other prefill waiting)

where the ratios are each replica's observed/predicted correction (a degraded
GPU learns a ratio above 1; a replica not yet observed takes the fleet's, so it
is explored on equal terms).  Replicas without a known GPU/model use their
observed latencies.  The **cost** of the request on a replica is the GPU time it uses priced at the
replica's $/h: its prompt's share of the token budget of the steps that prefill
it, plus ``expected_output × TPOT / REFERENCE_BATCH`` (decode steps are shared by a
batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from steersman.fleet import snapshot as S
from steersman.policy.framework import DecisionContext, feature

__all__ = ["Prediction", "prefix_blocks", "uncached_tokens", "predict", "REFERENCE_BATCH"]

#: Context assumed for the other requests of a batch when pricing their KV reads.
_CTX_FALLBACK = 1024.0
#: Decode GPU time is priced as if shared by this many sequences: a typical busy
#: batch, so cost ranks hardware ($ per unit of speed) and cache hits, not transient
#: load (a busier replica is not "cheaper" because its batch is bigger right now;
#: its higher predicted TPOT makes it costlier, which spreads load within a class).
REFERENCE_BATCH = 32.0


@dataclass(frozen=True, slots=True)
class Prediction:
    """Arrays aligned with the decision's candidates (when first computed)."""

    ttft: np.ndarray  # seconds
    tpot: np.ndarray  # seconds per output token
    e2e: np.ndarray  # ttft + expected_output x tpot
    cost: np.ndarray  # $ of GPU time this request is expected to use there
    uncached: np.ndarray  # prompt tokens to prefill there

    def select(self, sel: np.ndarray) -> Prediction:
        return Prediction(self.ttft[sel], self.tpot[sel], self.e2e[sel], self.cost[sel], self.uncached[sel])


@feature("prefix_blocks")
def prefix_blocks(ctx: DecisionContext) -> np.ndarray:
    """Leading prompt blocks each candidate probably holds, discounted by residency confidence:
    the share of the indexed blocks the replica's KV cache can hold, and how often the
    engine's reported hits matched the index's predictions there."""
    snap, req, idx = ctx.snapshot, ctx.request, ctx.candidates
    if snap.prefix is None or not req.block_hashes:
        return np.zeros(idx.size)
    held = snap.prefix.match(req.block_hashes)[idx].astype(float)
    capacity = np.where(np.isnan(snap.kv_blocks_total[idx]), snap.statics.kv_blocks[idx], snap.kv_blocks_total[idx])
    indexed = snap.prefix.blocks_per_replica()[idx]
    confidence = np.where((indexed > 0) & (capacity > 0), np.minimum(1.0, capacity / np.maximum(indexed, 1.0)), 1.0)
    return held * np.fmin(np.nan_to_num(confidence, nan=1.0), snap.prefix_accuracy[idx])


@feature("uncached_tokens")
def uncached_tokens(ctx: DecisionContext) -> np.ndarray:
    req = ctx.request
    hit = np.floor(ctx.feature("prefix_blocks")) * ctx.snapshot.statics.block_size
    return req.prompt_tokens - np.minimum(hit, max(req.prompt_tokens - 1, 0))


@feature("prediction")
def predict(ctx: DecisionContext) -> Prediction:
    snap, req, idx = ctx.snapshot, ctx.request, ctx.candidates
    st = snap.statics
    live = snap.live[:, idx]
    own = ctx.feature("uncached_tokens")
    in_flight, decoding = live[S.IN_FLIGHT], live[S.DECODING]
    D = np.maximum(live[S.RUNNING], decoding)
    others = np.maximum(live[S.WAITING] - np.maximum(in_flight - decoding, 0.0), 0.0) * req.prompt_tokens
    work = np.maximum(live[S.PENDING_PREFILL], 0.0) + others + own
    B = st.batch_tokens[idx]
    D = np.minimum(D, B - 1.0)
    P = B - D
    c = float(req.prompt_tokens + req.expected_output / 2) or _CTX_FALLBACK
    # a full mixed step (D decodes + a P-token prefill chunk at context ~c) and a decode-only step
    t_full = st.step_time(idx, B, P * (c / 2 + P / 2), P + c / 2, D * c, D + 1.0)
    t_dec = st.step_time(idx, D + 1.0, 0.0, 0.0, (D + 1.0) * c, D + 1.0)
    full = np.floor(work / P)
    rem = work - full * P  # the last, partial step (step time is close to affine in its tokens)
    r_ttft, r_tpot = live[S.TTFT_RATIO], live[S.TPOT_RATIO]
    ttft = (full * t_full + t_dec + (t_full - t_dec) * (rem / P)) * np.where(r_ttft == r_ttft, r_ttft, snap.ttft_prior)
    tpot = np.where(work > own, t_full, t_dec) * np.where(r_tpot == r_tpot, r_tpot, snap.tpot_prior)
    unmodelled = ~st.modelled[idx]
    if unmodelled.any():
        ttft = np.where(unmodelled, np.nan_to_num(live[S.TTFT_EWMA], nan=0.5), ttft)
        tpot = np.where(unmodelled, np.nan_to_num(live[S.TPOT_EWMA], nan=0.05), tpot)
        t_full = np.where(unmodelled, ttft, t_full)
    e2e = ttft + req.expected_output * tpot
    gpu_s = own / B * t_full + req.expected_output * tpot / REFERENCE_BATCH
    return Prediction(ttft, tpot, e2e, st.price_per_hour[idx] * (gpu_s / 3600.0), own)
