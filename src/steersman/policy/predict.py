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

    TTFT ≈ (⌊W / P⌋ × t_step(B) + t_step(D + W mod P) + H) × ttft_ratio,   W = queue ahead + own uncached
    (the partial step interpolated between the decode-only and the full step; H = prompt tokens × the
    replica's KV hand-off seconds per token on a prefill replica of a disaggregated fleet, else 0)
    TPOT ≈ (t_step(D + 1) + (t_step(B) − t_step(D + 1)) × s) × tpot_ratio,   s = min(1, m + q)

where ``s`` is the share of the request's decode steps that carry prefill chunks:
``q = prefill queued there now / (P × expected_output)`` (it drains during the
decode) and ``m`` the share of steps that prefill arriving at the rate routed there
recently (``λ = recent_tokens / τ``) keeps busy: with ``ρ = λ t_step(B) / P``,
``m = (λ/P) / (λ/P + (1 − ρ) / t_step(D + 1))``, and ``m = 1`` once ``ρ ≥ 1`` (the
prefill budget is always in use: every step is a full one).

**Samples** (``n`` > 1): the request decodes as ``n`` sequences side by side (vLLM), so its TPOT
takes ``t_step(D + n)`` for ``t_step(D + 1)`` (its first token's step does not: the samples start
decoding after it), its cost counts ``n`` decodes and its KV (``SchedRequest.kv_tokens``, what the
``fits-kv`` filter and the accounting use) the prompt once plus ``n`` expected outputs.

**What the residents see** (``tpot_res``): the TPOT of a request already decoding there once
this one's uncached prefill joins the queue ahead, ``s`` taking ``+ uncached / (P x
expected_output)`` (this request's decode length standing in for theirs).  The picker checks
the TPOT the residents must keep against it: this request's own TPOT is not slowed by its own
prefill, theirs is (a long prompt landing on a replica of interactive decodes).

**Hang signal**: TTFT is at least the replica's stall (``snapshot.stall``: how long
requests of ours have awaited a first token there with no progress), so a replica
that stopped answering stops looking attractive long before the outlier detector
has the evidence to eject it (an all-or-nothing TPOT rule used to hide this).

The ratios are each replica's observed/predicted correction (a degraded
GPU learns a ratio above 1; a replica not yet observed takes the fleet's, so it
is explored on equal terms; an idle replica takes the fleet's TPOT ratio, since
the TPOT it was observed at described the batches it had then).

Replicas without a known GPU/model (llama.cpp) get a linear model, ``TTFT ≈ (t_step + W × s_token) ×
ttft_ratio`` and ``TPOT ≈ t_step × tpot_ratio``, whose ``s_token`` and ``t_step`` are the engine's own
timing of its work where it reports it (llama.cpp's ``prompt_seconds_total`` / ``prompt_tokens_total`` and
``tokens_predicted_seconds_total`` / ``tokens_predicted_total``, learnt per scrape: the fleet's
``prefill_s_token`` / ``decode_s_token`` rows) and the priors ``scheduler.unprofiled_*`` until then (the profile's
settings: :attr:`DecisionContext.settings <steersman.policy.framework.DecisionContext.settings>`); the same observed/predicted ratios correct each replica online, and since ``W`` counts only *uncached*
tokens, a replica holding the prompt's prefix predicts a low TTFT.  Their TPOT is pooled over the replicas
configured alike (:func:`pooled_tpot`): what their requests saw between tokens is mostly the prompts computed
beside them, not the hardware.  The **cost** of the request on a replica is the GPU time it uses priced at the
replica's $/h: its prompt's share of the token budget of the steps that prefill
it, plus ``expected_output × TPOT / REFERENCE_BATCH`` (decode steps are shared by a
batch).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from steersman.config import DEFAULTS, SchedulerSettings
from steersman.policy import unprofiled_kernels as U
from steersman.policy.framework import DecisionContext, feature
from steersman.policy.kernels import predict_kernel, prefix_kernel
from steersman.policy.plugin_kernels import uncached_kernel

__all__ = ["Prediction", "prefix_blocks", "uncached_tokens", "predict", "REFERENCE_BATCH", "unprofiled_speeds", "pooled_tpot",
           "pooling_factor"]

_NO_MATCH = np.zeros(0, dtype=np.int64)
_NO_MATCH.flags.writeable = False
_NO_POOL = np.zeros(0)  # no pooled TPOTs (_unprofiled_inputs)
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
    tpot_res: np.ndarray  # the TPOT of the requests decoding there once this one's prefill is added
    ttft_alone: np.ndarray  # its TTFT there once the prefill queued ahead of it has drained

    def select(self, sel: np.ndarray) -> Prediction:
        return Prediction(self.ttft[sel], self.tpot[sel], self.e2e[sel], self.cost[sel], self.uncached[sel],
                          self.tpot_res[sel], self.ttft_alone[sel])


@feature("prefix_held", per_replica=True)
def prefix_held(ctx: DecisionContext) -> np.ndarray:
    """The prefix index's match for every replica (not only candidates): leading blocks held (those its KV cache
    still holds, with ``scheduler.prefix_residency``) that its engine would reuse: at most
    ``(prompt_tokens - 1) // block_size``, the prompt's last token being always computed
    (:meth:`PrefixIndex.reusable <steersman.fleet.prefix_index.PrefixIndex.reusable>`)."""
    snap, req = ctx.snapshot, ctx.request
    if snap.prefix is None or not req.block_hashes:
        return _NO_MATCH
    return snap.prefix.reusable(req.block_hashes, req.prompt_tokens, snap.statics.block_size)


@feature("prefix_held_raw", per_replica=True)
def prefix_held_raw(ctx: DecisionContext) -> np.ndarray:
    """``prefix_held`` crediting every replica with all the gateway sent it, whatever its KV cache still holds
    (``scheduler.prefix_residency``): the holders-first rule's, so a workflow whose context its replica evicted
    still goes back there (where its later calls find what this one computes) unless that replica is slower."""
    snap, req = ctx.snapshot, ctx.request
    if snap.prefix is None or not req.block_hashes:
        return _NO_MATCH
    return snap.prefix.reusable(req.block_hashes, req.prompt_tokens, snap.statics.block_size, raw=True)


@feature("prefix_blocks")
def prefix_blocks(ctx: DecisionContext) -> np.ndarray:
    """Leading prompt blocks each candidate probably holds, discounted by residency confidence:
    the share of the indexed blocks the replica's KV cache can hold, and how often the
    engine's reported hits matched the index's predictions there."""
    snap, idx = ctx.snapshot, ctx.candidates
    held = ctx.feature("prefix_held")
    if held.size == 0:
        return np.zeros(idx.size)
    return prefix_kernel(idx, held, snap.live, snap.statics.kv_blocks, snap.prefix.blocks_view(), np.empty(idx.size))


@feature("uncached_tokens")
def uncached_tokens(ctx: DecisionContext) -> np.ndarray:
    """Prompt tokens minus the cached ones: ``prompt - min(floor(prefix_blocks) x block_size, prompt - 1)``."""
    blocks = ctx.feature("prefix_blocks")
    return uncached_kernel(blocks, float(ctx.snapshot.statics.block_size), float(ctx.request.prompt_tokens),
                           np.empty(blocks.size))


@feature("prediction")
def predict(ctx: DecisionContext) -> Prediction:
    snap, req, idx = ctx.snapshot, ctx.request, ctx.candidates
    st = snap.statics
    own = np.ascontiguousarray(ctx.feature("uncached_tokens"), dtype=float)
    out = predict_kernel(
        idx, snap.live, st.matrix, st.batch_tokens, st.price_per_hour, st.modelled, own,
        float(req.prompt_tokens), float(req.expected_output), float(req.samples),
        float(req.prompt_tokens + req.expected_output / 2) or _CTX_FALLBACK,
        snap.ttft_prior, snap.tpot_prior, REFERENCE_BATCH,
        snap.recent_at if snap.recent_at is not None else np.full(snap.live.shape[1], snap.time),
        float(snap.time), float(snap.recent_tau_s), np.empty((6, idx.size)),
    )
    if not _all_modelled(st):
        _unprofiled(snap, idx, own, float(req.prompt_tokens), float(req.expected_output), out, float(req.samples),
                    ctx.settings)
    return Prediction(out[0], out[1], out[2], out[3], own, out[4], out[5])


_ALL_MODELLED: dict[int, tuple[object, bool]] = {}


def _all_modelled(st) -> bool:
    """``st.modelled.all()``, memoised by identity (the statics of a fleet are frozen and long-lived)."""
    hit = _ALL_MODELLED.get(id(st))
    if hit is None or hit[0] is not st:
        if len(_ALL_MODELLED) > 16:
            _ALL_MODELLED.clear()
        hit = _ALL_MODELLED[id(st)] = (st, bool(st.modelled.all()))
    return hit[1]


def _sched(settings: SchedulerSettings | None) -> SchedulerSettings:
    """The settings whose ``unprofiled_*`` priors apply (None: the defaults, read now)."""
    return DEFAULTS.scheduler if settings is None else settings


def unprofiled_speeds(snap, i: np.ndarray, settings: SchedulerSettings | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replicas ``i`` without a roofline: (seconds per prompt token, seconds per decode step, the learnt TTFT
    correction) -- the engine's own timing where it reports it, else the priors of ``settings`` (see the module
    doc)."""
    i = np.asarray(i, dtype=np.intp)
    out = np.empty((3, i.size))
    sched = _sched(settings)
    U.speeds_into(snap.live, i, float(snap.ttft_prior), sched.unprofiled_prefill_s_per_token,
                  sched.unprofiled_decode_step_s, out)
    return out[0], out[1], out[2]


def _own_tpot(snap, i: np.ndarray, settings: SchedulerSettings | None = None) -> np.ndarray:
    """Replicas ``i`` (unprofiled): the decode step (the engine's own timing, else the prior) x the learnt TPOT
    ratio (the fleet's prior on an idle replica)."""
    i = np.asarray(i, dtype=np.intp)
    out = np.empty(i.size)
    U.own_tpot_into(snap.live, i, float(snap.tpot_prior), _sched(settings).unprofiled_decode_step_s, out)
    return out


def pooled_tpot(snap, i: np.ndarray, settings: SchedulerSettings | None = None) -> np.ndarray:
    """The TPOT predicted on unprofiled replicas ``i``: each one's own learnt value (:func:`_own_tpot`), pooled over
    the replicas configured alike (``statics.speed_class``) that agree with each other.

    What a replica's requests saw between tokens is mostly what was prefilled beside them (a llama.cpp step
    computes a whole new prompt with every decoding slot waiting), so the learnt TPOT of two identical replicas
    drifts apart with the traffic each happened to get (median 1.5x, up to 7.3x on bench/peers' llama.cpp
    fleet) and the
    latency-first picker then followed the lucky one, busier or not.  A replica whose own value is within
    ``unprofiled_tpot_pool_spread`` of the mean of the others of its class takes the mean of the agreeing ones;
    one further away (a degraded host) keeps its own, and one whose engine timing is not read yet takes its
    class's measured value rather than the prior."""
    both = _pooled_all(snap, settings)
    return _own_tpot(snap, i, settings) if both is None else both[0][i]


#: the last snapshot, the settings it was pooled with (held: frozen, and their identity is the key), and its
#: pooled and own TPOTs (a decision asks for them two or three times, on one snapshot)
_POOLED: list = [None, None, None]


def _pooled_all(snap, settings: SchedulerSettings | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(pooled TPOT, own TPOT) of every replica (NaN for replicas with a roofline), memoised for the snapshot and
    ``settings`` (their spread and decode-step prior); None when nothing pools (pooling off, or fewer than two
    replicas without a roofline)."""
    sched = _sched(settings)
    ref, was, got = _POOLED
    if ref is not None and ref() is snap and was is sched:
        return got
    spread = sched.unprofiled_tpot_pool_spread
    st = snap.statics
    got = None
    if spread > 1.0:
        full, own = np.empty(st.speed_class.size), np.empty(st.speed_class.size)
        if U.pool_kernel(snap.live, st.modelled, st.speed_class, float(snap.tpot_prior), sched.unprofiled_decode_step_s,
                         float(spread), full, own):
            got = full, own
    _POOLED[:] = weakref.ref(snap), sched, got
    return got


def pooling_factor(snap, i: int, settings: SchedulerSettings | None = None) -> float:
    """How much :func:`pooled_tpot` scaled unprofiled replica ``i``'s own learnt TPOT (1.0: not at all).  A
    ratio of the two, not pooled / step, so an unpooled replica's correction stays bit for bit its own."""
    both = _pooled_all(snap, settings)
    if both is None:
        return 1.0  # nothing pools: pooled_tpot is the replica's own
    pooled, own = float(both[0][i]), float(both[1][i])
    return pooled / own if own > 0.0 and pooled > 0.0 and math.isfinite(pooled / own) else 1.0


def _unprofiled_inputs(snap, settings: SchedulerSettings | None = None) -> tuple[float, float, np.ndarray, bool]:
    """What :func:`~steersman.policy.unprofiled_kernels.unprofiled_pass` takes besides the candidates: the
    priors of ``settings`` (seconds per prompt token, per decode step), every replica's pooled TPOT and whether it
    applies (nothing pools on a fleet where every replica has a roofline, or on fewer than two without one)."""
    sched = DEFAULTS.scheduler if settings is None else settings  # (inline: once per decision)
    both = None if _all_modelled(snap.statics) else _pooled_all(snap, sched)
    return (sched.unprofiled_prefill_s_per_token, sched.unprofiled_decode_step_s,
            _NO_POOL if both is None else both[0], both is not None)


def _unprofiled(snap, idx: np.ndarray, own: np.ndarray, prompt_tokens: float, expected_output: float,
                out: np.ndarray, samples: float = 1.0, settings: SchedulerSettings | None = None) -> None:
    """Overwrite ``out`` for the candidates without a roofline (see the module doc; compiled:
    :mod:`steersman.policy.unprofiled_kernels`)."""
    st = snap.statics
    prefill, step, pooled, use_pooled = _unprofiled_inputs(snap, settings)
    U.unprofiled_pass(idx, snap.live, st.modelled, st.price_per_hour, own, prompt_tokens, expected_output, samples,
                      float(snap.ttft_prior), float(snap.tpot_prior), prefill, step, float(snap.time), REFERENCE_BATCH,
                      pooled, use_pooled, out)
