"""The default profile's decision as a few compiled passes over one buffer of candidate indices.

:meth:`Profile.decide <steersman.policy.framework.Profile.decide>` runs any composition of plugins:
a :class:`~steersman.policy.framework.DecisionContext`, a boolean mask per filter, narrowed index
arrays, a feature cache.  At 1,000 replicas that glue cost more than the arithmetic (~30 numpy
calls, each touching memory other processes evicted meanwhile).  When a profile is made of the
plugins below only (the ``steersman`` profile is), :meth:`Profile.pick` runs this path instead:

* the model's routable replicas and the reliability gate: one pass, compacting the available ones
  into the buffer; then saturation, each shortlist (among the candidates fits-kv keeps) and fits-kv
  filter compact it in place;
* the picker: prefix blocks, uncached tokens and the prediction in one kernel (calling
  :func:`~steersman.policy.kernels.prefix_kernel` and
  :func:`~steersman.policy.kernels.predict_kernel` unchanged), the unprofiled fallback
  (:func:`~steersman.policy.unprofiled_kernels.unprofiled_pass`), :func:`~steersman.policy.kernels.slo_pool_kernel`,
  and only on a tie the scorers, each adding its clamped, weighted score in one pass.

Every test is the plugins' own per-replica helper from :mod:`steersman.policy.kernels` and
:mod:`steersman.policy.plugin_kernels`, so the
arithmetic is the same; decisions are the same (``tests/policy/test_decision_replay.py`` replays
20,880 recorded ones, ``tests/policy/test_fastpath.py`` compares both paths).  Each plugin's stage
is timed for ``steersman:plugin_latency_seconds`` as in the plugin-by-plugin path (the picker's time
includes the scorers it asks for); exits other than a route (reject, queue) give the same answers.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

from steersman.fleet import snapshot as S
from steersman.policy import framework
from steersman.policy import kernels as K
from steersman.policy import plugin_kernels as P
from steersman.policy import unprofiled_kernels as U
from steersman.policy.base import Decision, Queue, Reject, Route, none_in_rotation
from steersman.policy.framework import Profile
from steersman.policy.model_based import SloCheapest, _holder, _reason, corrections, hold, shed
from steersman.policy.predict import _CTX_FALLBACK, _NO_MATCH, REFERENCE_BATCH, _unprofiled_inputs
from steersman.policy.reliability import _NONE, ReliabilityFilter, excluded_array
from steersman.policy.request import PriorityClass
from steersman.policy.saturation import Saturation, affine_blocks
from steersman.policy.slot_wait import wait_for_slot
from steersman.policy.scorers import (FitsKv, KvHeadroom, LoadBalance, PrefixAffinity, Shortlist, kv_shortfall,
                                      sequence_tokens, targets)

__all__ = ["fused"]

_SCORERS = (PrefixAffinity, KvHeadroom, LoadBalance)
_RESIDENT = S.RESIDENT_TPOT
_CRITICAL = PriorityClass.CRITICAL  # an enum member looked up once (via the class: ~0.2 us a decision)


@njit(cache=True, nogil=True)
def gate_pass(mask, routable, blocked_until, now, in_flight, limits, excluded, out):
    """Writes to ``out`` the replicas serving the model (``mask``) that are routable and available
    (:func:`~steersman.policy.plugin_kernels.is_available`), ascending; returns (routable ones, available ones)."""
    blocked, limited, some = blocked_until.size > 0, limits.size > 0, excluded.size > 0
    candidates = kept = 0
    for i in range(mask.size):
        if mask[i] and routable[i]:
            candidates += 1
            if P.is_available(True, blocked, blocked_until[i] if blocked else 0.0, now, limited, in_flight[i],
                              limits[i] if limited else 0.0, P.is_excluded(excluded, i) if some else False):
                out[kept] = i
                kept += 1
    return candidates, kept


@njit(cache=True, nogil=True)
def saturation_pass(idx, n, live, max_seqs, budget, now, staleness, depth, kv_threshold, held, affine_blocks,
                    affine_factor):
    """Keeps (in order) the first ``n`` of ``idx`` not saturated for the request
    (:func:`~steersman.policy.kernels.thresholds_for`, holders exempt only when some candidate is not one);
    returns how many."""
    affine_blocks = K.affinity_threshold(idx, n, held, affine_blocks)
    some = held.size > 0
    kept = 0
    for j in range(n):
        i = idx[j]
        d, kv = K.thresholds_for(held[i] if some else 0, affine_blocks, affine_factor, depth, kv_threshold)
        if not K.is_saturated(live[S.SCRAPED_AT, i], live[S.RUNNING, i], live[S.WAITING, i], live[S.SINCE_SCRAPE, i],
                              live[S.KV_USAGE, i], live[S.IN_FLIGHT, i], live[S.DECODING, i], max_seqs[i], now,
                              staleness, d, kv, live[S.PENDING_PREFILL, i], live[S.AWAITING, i], budget[i]):
            idx[kept] = i
            kept += 1
    return kept


@njit(cache=True, nogil=True)
def shortlist_pass(idx, n, live, held, compute_price, kv_blocks, need, least, block_size, k, keep):
    """:func:`~steersman.policy.kernels.shortlist_fitting_kernel` over the first ``n``, applied in place."""
    K.shortlist_fitting_kernel(idx[:n], live, held, compute_price, kv_blocks, need, least, block_size, k, keep[:n])
    kept = 0
    for j in range(n):
        if keep[j]:
            idx[kept] = idx[j]
            kept += 1
    return kept


@njit(cache=True, nogil=True)
def fits_pass(idx, n, kv_blocks_total, kv_blocks, kv_usage, need, least):
    kept = 0
    for j in range(n):
        i = idx[j]
        if P.fits_kv(kv_blocks_total[i], kv_blocks[i], kv_usage[i], need, least):
            idx[kept] = i
            kept += 1
    return kept


@njit(cache=True, nogil=True)
def prediction_pass(idx, held, raw, live, kv_blocks, indexed, block_size, matrix, batch_tokens, price, modelled,
                    prompt_tokens, expected_output, samples, ctx_len, ttft_prior, tpot_prior, reference_batch, recent_at, now,
                    recent_tau, blocks, own, out, t_ttft, t_tpot, t_left, margin, protected, cost_tie, latency_tie,
                    late_tie, exploit, exploit_slowdown, cached, resident, pool, default_prefill, default_step, pooled,
                    use_pooled):
    """The ``prefix_blocks``, ``uncached_tokens`` and ``prediction`` features of :mod:`steersman.policy.predict`
    into ``blocks``, ``own`` and ``out`` (candidates without a roofline by
    :func:`~steersman.policy.unprofiled_kernels.unprofiled_pass`, ``pooled``: every replica's pooled TPOT
    when ``use_pooled``), then the picker's :func:`~steersman.policy.kernels.slo_pool_kernel` into ``pool``.
    Returns (candidates without a roofline, pool size, feasible, stayed)."""
    if held.size:
        K.prefix_kernel(idx, held, live, kv_blocks, indexed, blocks)
    else:
        blocks[:] = 0.0
    for j in range(idx.size):
        own[j] = P.uncached(blocks[j], block_size, prompt_tokens)
    K.predict_kernel(idx, live, matrix, batch_tokens, price, modelled, own, prompt_tokens, expected_output, samples,
                     ctx_len, ttft_prior, tpot_prior, reference_batch, recent_at, now, recent_tau, out)
    unprofiled = 0
    for j in range(idx.size):
        # the picker's holders-first rule reads the index's raw match (see slo_pool_kernel)
        cached[j] = prompt_tokens - P.uncached(float(raw[idx[j]]), block_size, prompt_tokens) if raw.size else 0.0
        resident[j] = live[_RESIDENT, idx[j]]
        if not modelled[idx[j]]:
            unprofiled += 1
    if unprofiled:
        U.unprofiled_pass(idx, live, modelled, price, own, prompt_tokens, expected_output, samples, ttft_prior,
                          tpot_prior, default_prefill, default_step, now, reference_batch, pooled, use_pooled, out)
    count, feasible, stay = K.slo_pool_kernel(out[0], out[1], out[2], out[3], cached, resident, out[4], exploit,
                                        exploit_slowdown, t_ttft, t_tpot, t_left, margin, protected, cost_tie,
                                        latency_tie, late_tie, pool, K.failure_shares(idx, live))
    return unprofiled, count, feasible, stay


@njit(cache=True, nogil=True, inline="always")
def _clamped(v, weight):
    """What :func:`~steersman.policy.kernels.add_clamped` adds for a score ``v > 0``."""
    return weight * (v if v < 1.0 else 1.0)


@njit(cache=True, nogil=True)
def affinity_add(blocks, block_size, prompt_tokens, weight, total):
    for j in range(blocks.size):
        v = blocks[j] * block_size / prompt_tokens
        if v > 0.0:
            total[j] += _clamped(v, weight)


@njit(cache=True, nogil=True)
def headroom_add(idx, kv_blocks_total, kv_blocks, kv_usage, need, tie, weight, total):
    """:func:`~steersman.policy.plugin_kernels.kv_headroom_kernel`'s scores, clamped, weighted and added."""
    _add(P.kv_headroom_kernel(idx, kv_blocks_total, kv_blocks, kv_usage, need, tie, np.empty(idx.size)), weight, total)


@njit(cache=True, nogil=True)
def balance_add(idx, in_flight, waiting, tie, weight, total):
    """:func:`~steersman.policy.plugin_kernels.load_balance_kernel`'s scores, clamped, weighted and added."""
    _add(P.load_balance_kernel(idx, in_flight, waiting, tie, np.empty(idx.size)), weight, total)


@njit(cache=True, nogil=True, inline="always")
def _add(scores, weight, total):
    for j in range(scores.size):
        v = scores[j]
        if v > 0.0:  # NaN, negative: nothing (as the framework's add_clamped)
            total[j] += _clamped(v, weight)


def fused(profile: Profile):
    """The fused decision for ``profile``, or None when it uses a plugin this path does not know."""
    if type(profile.gate) is not ReliabilityFilter or type(profile.picker) is not SloCheapest:
        return None
    if profile.saturation is not None and type(profile.saturation) is not Saturation:
        return None
    if any(type(f) not in (Shortlist, FitsKv) for f in profile.filters):
        return None
    if any(type(ws.scorer) not in _SCORERS for ws in profile.scorers):
        return None
    return _Fused(profile)


class _Fused:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        h = profile._hist
        self.gate_hist = h[profile.gate.name]
        sat = profile.saturation
        self.sat = None if sat is None else (h["saturation"], sat.settings, sat.settings.saturation_staleness_s,
                                             float(sat.settings.saturation_queue_depth), sat.settings.saturation_kv_usage)
        self.filters = tuple((f, h[f.name]) for f in profile.filters)
        self.scorers = tuple((type(ws.scorer), ws.weight, h[ws.scorer.name], getattr(ws.scorer, "tie", 0.0))
                             for ws in profile.scorers)
        self.picker = profile.picker
        self.picker_hist = h[profile.picker.name]
        self.settings = profile.settings  # the prediction's (unprofiled priors), as DecisionContext.settings

    def __call__(self, snap, req) -> Decision:
        clock = framework._clock
        mask = snap.model_masks.get(req.model)
        if mask is None:
            return none_in_rotation(req.model)
        t0 = clock()
        idx = np.empty(mask.size, dtype=np.intp)
        candidates, n = gate_pass(mask, snap.routable, _NONE if snap.blocked_until is None else snap.blocked_until,
                                  snap.time, snap.live[S.IN_FLIGHT],
                                  _NONE if snap.limits is None or req.resumed else snap.limits,
                                  excluded_array(req.excluded), idx)
        if not candidates:
            return none_in_rotation(req.model)
        if not n and snap.blocked_until is not None and not gate_pass(
                mask, snap.routable, snap.blocked_until, snap.time, snap.live[S.IN_FLIGHT], _NONE,
                excluded_array(req.excluded), idx)[1]:  # panic (the reliability filter's): the guard's blocks ignored
            candidates, n = gate_pass(mask, snap.routable, _NONE, snap.time, snap.live[S.IN_FLIGHT],
                                      _NONE if snap.limits is None or req.resumed else snap.limits,
                                      excluded_array(req.excluded), idx)
        self.gate_hist.observe(clock() - t0)
        if not n:
            return self.profile.gate.empty(self.profile.context(snap, req))
        held = None
        if self.sat is not None and not req.resumed:
            hist, settings, staleness, depth, kv = self.sat
            t0 = clock()
            held = _held(snap, req)
            affine = affine_blocks(req, snap.statics.block_size, settings) if held.size else np.inf
            n = saturation_pass(idx, n, snap.live, snap.statics.max_seqs, snap.statics.max_batched_tokens, snap.time,
                                staleness, depth, kv, held, affine, settings.saturation_affinity_factor)
            hist.observe(clock() - t0)
            if not n:
                return Queue("every candidate replica is saturated")
        need = req.kv_tokens / snap.statics.block_size
        for f, hist in self.filters:
            t0 = clock()
            if type(f) is Shortlist:
                if n > f.k:
                    if held is None:
                        held = _held(snap, req)
                    n = shortlist_pass(idx, n, snap.live, held, snap.statics.compute_price, snap.statics.kv_blocks,
                                       need, float(sequence_tokens(req)), float(snap.statics.block_size), f.k,
                                       np.empty(n, dtype=np.bool_))
            else:
                m = fits_pass(idx, n, snap.live[S.KV_BLOCKS_TOTAL], snap.statics.kv_blocks, snap.live[S.KV_USAGE],
                              need, sequence_tokens(req) / snap.statics.block_size)
                if not m:  # idx[:n] untouched (nothing kept): the filter's own answer (FitsKv.when_empty)
                    verdict = kv_shortfall(snap, req, idx[:n])
                    if not isinstance(verdict, np.ndarray):
                        return verdict
                    m = int(np.count_nonzero(verdict))
                    idx[:m] = idx[:n][verdict]
                n = m
            hist.observe(clock() - t0)
            if not n:
                return Reject(f"no replica passes filter {f.name!r}")
        t0 = clock()
        out = self._pick(snap, req, idx[:n], _held(snap, req) if held is None else held, need, clock)
        self.picker_hist.observe(clock() - t0)
        return out

    def _pick(self, snap, req, idx, held, need, clock) -> Decision:
        st, k = snap.statics, idx.size
        blocks, own, out, pool = np.empty(k), np.empty(k), np.empty((6, k)), np.empty(k, dtype=np.bool_)
        cached, resident = np.empty(k), np.empty(k)
        pt, eo = float(req.prompt_tokens), float(req.expected_output)
        p = self.picker
        ttft, tpot, left = targets(req, snap.time)
        protected = req.priority == _CRITICAL or req.protection > 0
        margin = p.safety_margin if protected else 1.0
        unprofiled, count, feasible, stay = prediction_pass(
            idx, held, _held(snap, req, raw=True), snap.live, st.kv_blocks, snap.prefix.blocks_view() if held.size else _NO_MATCH,
            float(st.block_size), st.matrix, st.batch_tokens, st.price_per_hour, st.modelled, pt, eo, float(req.samples),
            float(req.prompt_tokens + req.expected_output / 2) or _CTX_FALLBACK, snap.ttft_prior, snap.tpot_prior,
            REFERENCE_BATCH, snap.recent_at if snap.recent_at is not None else np.full(snap.live.shape[1], snap.time),
            float(snap.time), float(snap.recent_tau_s), blocks, own, out,
            float(ttft), float(tpot), float(left), float(margin), protected, float(p.cost_tie), float(p.latency_tie),
            float(p.late_latency_tie),
            float(p.exploit_share * pt), float(p.exploit_slowdown), cached, resident, pool,
            *_unprofiled_inputs(snap, self.settings))
        if not feasible and not stay and (p.shed or p.hold):
            late = (shed(p.shed, req, protected, out[0], ttft) if p.shed else None) or (
                hold(req, protected, out[5], ttft, _holder(cached, p.exploit_share, req)) if p.hold else None)
            if late is not None:
                return late
        if unprofiled and p.slot_wait is not None and snap.prefix is not None and snap.prefix.slots:
            wait = wait_for_slot(snap, req, idx, out[0], held, protected, ttft, *p.slot_wait, settings=self.settings)
            if wait is not None:
                return wait
        if count == 1:
            j = int(pool.argmax())
        else:  # equally good: the weighted scores decide, then the model's turn among those tied (SloCheapest's)
            j = p.tie_break(req, pool, self._scores(snap, req, idx, blocks, need, clock))
        reason = _reason(feasible, stay)
        i = int(idx[j])
        r_ttft, r_tpot = corrections(snap, i, self.settings)
        keep = tpot * margin if tpot < np.inf else 0.0  # what later arrivals there must not break
        return Route(i, reason, float(out[0, j]) / r_ttft, float(out[1, j]) / r_tpot, keep, not feasible and not stay,
                     float(out[0, j]), float(out[2, j]))

    def _scores(self, snap, req, idx, blocks, need, clock) -> np.ndarray:
        total = np.zeros(idx.size)
        live = snap.live
        for kind, weight, hist, tie in self.scorers:
            t0 = clock()
            if kind is PrefixAffinity:
                if req.prompt_tokens > 0:
                    affinity_add(blocks, float(snap.statics.block_size), float(req.prompt_tokens), weight, total)
            elif kind is KvHeadroom:
                headroom_add(idx, live[S.KV_BLOCKS_TOTAL], snap.statics.kv_blocks, live[S.KV_USAGE], need, tie,
                             weight, total)
            else:
                balance_add(idx, live[S.IN_FLIGHT], live[S.WAITING], tie, weight, total)
            hist.observe(clock() - t0)
        return total


def _held(snap, req, raw: bool = False) -> np.ndarray:
    """The ``prefix_held`` feature (``raw``: ``prefix_held_raw``)."""
    if snap.prefix is None or not req.block_hashes:
        return _NO_MATCH
    return snap.prefix.reusable(req.block_hashes, req.prompt_tokens, snap.statics.block_size, raw)
