"""Scorers and filters of the seven axes (each a small registered plugin).

===================  =====================================================================
axis                 plugin(s)
===================  =====================================================================
GPU type             ``slo-headroom`` and ``cost-efficiency`` (speed vs $ against the budget,
                     from the roofline of each GPU); the ``slo-cheapest`` picker
HBM headroom         ``fits-kv`` filter, ``kv-headroom`` scorer
KV-cache state       ``prefix-affinity`` (prefix held there) and ``kv-headroom`` (pressure)
weight warmth        cold/loading replicas are never candidates (``FleetSnapshot.candidates``)
tenant priority      the picker's SLO margin: critical requests must meet their targets with
                     a safety margin; batch requests have no targets and go cheapest
workflow context     the same margin for valuable workflows (``SchedRequest.protection``), and
                     ``prefix-affinity`` keeps an agent's growing context where it is cached
latency budget       ``slo-headroom`` / the picker's feasibility (TTFT, TPOT, deadline)
===================  =====================================================================
"""

from __future__ import annotations

import numbers

import numpy as np

from steersman.config import DEFAULTS, SchedulerSettings
from steersman.policy.base import Decision, Reject
from steersman.policy.framework import FILTERS, SCORERS, DecisionContext
from steersman.policy.kernels import shortlist_fitting_kernel
from steersman.policy.plugin_kernels import (fits_kv_kernel, kv_headroom_kernel, kv_keep_kernel, load_balance_kernel,
                                             share_kernel)
from steersman.policy.request import PROMPT_FIELD, SchedRequest

__all__ = ["FitsKv", "kv_shortfall", "sequence_tokens", "model_holds", "KvHeadroom", "PrefixAffinity", "SloHeadroom", "CostEfficiency",
           "LoadBalance", "Shortlist", "targets"]


def targets(req: SchedRequest, now: float) -> tuple[float, float, float]:
    """(TTFT budget left, TPOT, time left until the deadline); inf where the request sets no target.  The TTFT
    budget is the client's, from its arrival: the time a request waited in the gateway queue (or on a failed
    attempt) is spent (a stream under way sent its first token long ago: its target stands as set)."""
    b = req.budget
    ttft = b.ttft_s if b.ttft_s is not None else np.inf
    if not req.resumed and now > req.arrival:
        ttft -= now - req.arrival
    tpot = b.tpot_s if b.tpot_s is not None else np.inf
    left = (b.deadline - now) if b.deadline is not None else np.inf
    return ttft, tpot, left


def _need_blocks(ctx: DecisionContext) -> float:
    r = ctx.request
    return r.kv_tokens / ctx.snapshot.statics.block_size


def sequence_tokens(req: SchedRequest) -> int:
    """The tokens one sequence of the request needs, what a replica's whole KV cache must hold to ever take it: its
    longest prompt (:attr:`SchedRequest.longest_prompt`: a batch's inputs are sequences of their own) plus
    ``max_tokens`` (or one token when it names none)."""
    return req.longest_prompt + (req.max_tokens or 1)


@FILTERS.register("fits-kv")
class FitsKv:
    """Drop replicas whose free KV cache cannot hold the request, or whose whole cache cannot hold one sequence at
    its longest (:func:`sequence_tokens`; unknown capacity passes).

    Capacity is the engine-reported block count, else the modelled one; free = (1 − usage) × capacity."""

    name = "fits-kv"

    def filter(self, ctx: DecisionContext) -> np.ndarray:
        snap, idx = ctx.snapshot, ctx.candidates
        out = np.empty(idx.size, dtype=np.bool_)
        fits_kv_kernel(idx, snap.kv_blocks_total, snap.statics.kv_blocks, snap.kv_usage, _need_blocks(ctx),
                       sequence_tokens(ctx.request) / snap.statics.block_size, out)
        return out

    def when_empty(self, ctx: DecisionContext) -> Decision | np.ndarray:
        return kv_shortfall(ctx.snapshot, ctx.request, ctx.candidates)


def kv_shortfall(snap, req: SchedRequest, idx: np.ndarray) -> Decision | np.ndarray:
    """What to do when no candidate's free KV cache holds the request (``fits-kv`` left none of ``idx``).

    One sequence must fit a replica's whole KV cache (engine-reported, else modelled): :func:`sequence_tokens`.

    * Some candidate's whole cache holds it: the mask of those that have the most free KV now
      (:func:`~steersman.policy.plugin_kernels.kv_keep_kernel`, what the ``shortlist`` chooses among too).  It goes
      there and waits in that engine's queue for blocks to free (vLLM schedules its waiting requests in order, so
      the blocks that free go to it).  Holding it in the gateway until some replica had the room free would starve
      it under sustained load: every smaller request behind it fits first and takes the blocks that free.
    * None does: :func:`_too_long` (a 400 only when no replica serving the model ever could).

    The prompt's length is the gateway's estimate (exact for engine-sim; a real engine may count a few percent
    differently and answers for itself at its own limits)."""
    least = sequence_tokens(req)
    keep = np.empty(idx.size, dtype=np.bool_)
    bs = snap.statics.block_size
    if not kv_keep_kernel(idx, snap.kv_blocks_total, snap.statics.kv_blocks, snap.kv_usage, req.kv_tokens / bs,
                          float(least), float(bs), keep)[1]:
        return _too_long(snap, req, least)
    return keep


def _capacity(snap, idx: np.ndarray) -> np.ndarray:
    """Tokens the whole KV cache of each of replicas ``idx`` holds: engine-reported, else modelled (NaN: unknown)."""
    reported = snap.kv_blocks_total[idx]
    return np.where(np.isnan(reported), snap.statics.kv_blocks[idx], reported) * float(snap.statics.block_size)


def model_holds(snap, model: str, least: int) -> bool:
    """Some replica serving ``model`` could ever hold ``least`` tokens of one sequence (:func:`sequence_tokens`) in
    its whole KV cache (engine-reported, else modelled; NaN, unknown capacity, is not "too small").  The routing's
    context check (:func:`_too_long`); brown-out asks it before moving a request to another model."""
    return not bool((_capacity(snap, snap.serves(model).nonzero()[0]) < least).all())


def _too_long(snap, req: SchedRequest, least: int) -> Reject:
    """No candidate in play can ever hold ``least`` tokens of one sequence.

    The candidates are what the reliability gate and saturation left (the shortlist keeps the replicas that hold
    it): a replica serving the model that could hold it (or whose capacity is unknown) may be busy, ejected or
    excluded for this attempt only, so the answer is a 503 with ``Retry-After``.  Only when no replica serving the
    model holds it is it the client's to change: a 400 ``context_length_exceeded`` naming the prompt's field
    (OpenAI's and vLLM's answer to a request over the context length), not a 503 its client would retry."""
    if model_holds(snap, req.model, least):
        return Reject(f"this request needs {least} tokens of context: no replica available now holds that many; "
                      f"those of {req.model!r} that do are busy, out of rotation or excluded")
    field = PROMPT_FIELD.get(req.kind, "prompt")
    cap = _capacity(snap, snap.serves(req.model).nonzero()[0])
    most = int(np.max(cap)) if cap.size else 0
    output = req.max_tokens if req.kind != "embedding" else None  # an embedding's one token is no one's ask
    where = f"the longest entry of the {field}" if req.longest_prompt != req.prompt_tokens else f"the {field}"
    ask = f"about {req.longest_prompt} in {where}" + (f" and {output} of output (`max_tokens`)" if output else "")
    return Reject(f"this request needs {least} tokens of context ({ask}), more than the KV cache of any replica "
                  f"serving {req.model!r} holds ({most} tokens): reduce the length of the {field}"
                  + (" or `max_tokens`" if output else ""),
                  None, "context_length_exceeded", 400, field)


@SCORERS.register("kv-headroom")
class KvHeadroom:
    """1 − KV usage after adding this request: prefer replicas with memory to spare.  Scores within ``tie``
    (default ``SchedulerSettings.kv_headroom_tie``) of the best count as the best: usage is scraped, and a
    strict ranking sent every near-tie between two scrapes to the replica whose last reading was lowest."""

    name = "kv-headroom"

    def __init__(self, tie: float | None = None) -> None:
        self.tie = DEFAULTS.scheduler.kv_headroom_tie if tie is None else float(tie)
        if not 0.0 <= self.tie < 1.0:
            raise ValueError(f"kv-headroom tie must be in [0, 1), got {self.tie}")

    @classmethod
    def from_config(cls, params: dict, settings: SchedulerSettings) -> KvHeadroom:
        """From a profile's YAML: ``tie`` defaults to the fleet file's ``scheduler.kv_headroom_tie``."""
        return cls(**{"tie": settings.kv_headroom_tie, **params})

    def score(self, ctx: DecisionContext) -> np.ndarray:
        snap, idx = ctx.snapshot, ctx.candidates
        return kv_headroom_kernel(idx, snap.kv_blocks_total, snap.statics.kv_blocks, snap.kv_usage, _need_blocks(ctx),
                                  self.tie, np.empty(idx.size))


@SCORERS.register("prefix-affinity")
class PrefixAffinity:
    """Share of the prompt the replica probably has cached (work avoided)."""

    name = "prefix-affinity"

    def score(self, ctx: DecisionContext) -> np.ndarray:
        r = ctx.request
        if r.prompt_tokens <= 0:
            return np.zeros(ctx.candidates.size)
        blocks = ctx.feature("prefix_blocks")
        return share_kernel(blocks, float(ctx.snapshot.statics.block_size), float(r.prompt_tokens), np.empty(blocks.size))


@SCORERS.register("slo-headroom")
class SloHeadroom:
    """How comfortably the predicted latency meets the budget: min over axes of the share of the target left
    (1 - predicted / target); 0 over budget, 1 with no target.  Bounded so that it ranks the replicas that meet
    the budget (target / predicted is above 1 for each of them: the framework's clamp made them all 1)."""

    name = "slo-headroom"

    def score(self, ctx: DecisionContext) -> np.ndarray:
        p = ctx.feature("prediction")
        ttft, tpot, left = targets(ctx.request, ctx.snapshot.time)
        share = np.minimum(np.minimum(_left(ttft, p.ttft), _left(tpot, p.tpot)), _left(left, p.e2e))
        return np.maximum(share, 0.0)  # NaN stays NaN: the framework counts it as 0


def _left(target: float, predicted: np.ndarray) -> np.ndarray:
    """1 - predicted / target (1 with no target; 0 when the budget is spent already)."""
    if target == np.inf:
        return np.ones(predicted.size)
    if not target > 0.0:
        return np.zeros(predicted.size)
    return 1.0 - predicted / target


@SCORERS.register("cost-efficiency")
class CostEfficiency:
    """Cheapest predicted $ for this request scores 1; others cheapest / theirs."""

    name = "cost-efficiency"

    def score(self, ctx: DecisionContext) -> np.ndarray:
        cost = ctx.feature("prediction").cost
        lo = np.nanmin(cost) if cost.size else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(cost > 0, lo / cost, 1.0)


@SCORERS.register("load-balance")
class LoadBalance:
    """Fewer requests in flight from this gateway (plus the engine's waiting ones) scores higher: min-max
    normalised, except that a load within ``tie`` (a share; default ``SchedulerSettings.balance_tie``) of the
    least counts as the least (:func:`~steersman.policy.plugin_kernels.balance_score`)."""

    name = "load-balance"

    def __init__(self, tie: float | None = None) -> None:
        self.tie = DEFAULTS.scheduler.balance_tie if tie is None else float(tie)
        if not self.tie >= 0.0:
            raise ValueError(f"load-balance tie must be >= 0, got {self.tie}")

    @classmethod
    def from_config(cls, params: dict, settings: SchedulerSettings) -> LoadBalance:
        """From a profile's YAML: ``tie`` defaults to the fleet file's ``scheduler.balance_tie``."""
        return cls(**{"tie": settings.balance_tie, **params})

    def score(self, ctx: DecisionContext) -> np.ndarray:
        snap, idx = ctx.snapshot, ctx.candidates
        return load_balance_kernel(idx, snap.in_flight, snap.waiting, self.tie, np.empty(idx.size))


@FILTERS.register("shortlist")
class Shortlist:
    """Keep at most ``k`` promising candidates so the model-based stages stay cheap at fleet scale.

    Half the places go to the least loaded replicas (in flight + waiting), a
    quarter to the replicas holding the longest cached prefix of the prompt, a
    quarter to the cheapest compute ($/h per TFLOP/s); a two-stage scheduler in
    the spirit of power-of-k choices: the expensive prediction only runs on them.

    It chooses among the candidates the ``fits-kv`` filter keeps: those whose free KV cache holds the request,
    else those whose whole cache holds it with the most KV free now (all when none's whole cache does:
    :func:`~steersman.policy.kernels.shortlist_fitting_kernel`).  Ranked among every candidate, a long prompt
    lost the few replicas large enough to hold it (many small-HBM replicas and one large one) and got a 503;
    ``[shortlist, fits-kv]`` now decides as ``[fits-kv, shortlist]``.
    """

    name = "shortlist"

    def __init__(self, k: int = 32) -> None:
        # an integer, checked here: the compiled kernel takes any number and fails at the first request otherwise
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 4:
            raise ValueError(f"shortlist k must be an integer >= 4, got {k!r}")
        self.k = int(k)

    def filter(self, ctx: DecisionContext) -> np.ndarray:
        idx = ctx.candidates
        if idx.size <= self.k:
            return np.ones(idx.size, dtype=bool)
        snap = ctx.snapshot
        held = ctx.feature("prefix_held")
        return shortlist_fitting_kernel(idx, snap.live, held, snap.statics.compute_price, snap.statics.kv_blocks,
                                        _need_blocks(ctx), float(sequence_tokens(ctx.request)),
                                        float(snap.statics.block_size), self.k, np.empty(idx.size, dtype=np.bool_))
