"""Compiled inner loops of the hottest scheduling features (numba).

A decision touches tens of small arrays; numpy's per-call overhead (~1 µs a
ufunc) made the model-based prediction cost ~50 µs whatever the fleet size.
These kernels do the same arithmetic in one compiled loop over the candidates.
They are compiled on first use and cached on disk (``cache=True``), so only the
first process on a machine pays the compile time (~1 s).  Inputs are the
snapshot's arrays and the candidates' indices; nothing is copied.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

from steersman.fleet import _prefix_table as prefix_table
from steersman.fleet import snapshot as S
from steersman.policy import plugin_kernels, unprofiled_kernels
from steersman.policy.shortlist_kernels import shortlist_fitting_kernel, shortlist_kernel

__all__ = ["predict_kernel", "saturation_kernel", "is_saturated", "prefix_kernel", "shortlist_kernel",
           "shortlist_fitting_kernel", "slo_pool_kernel", "add_clamped", "warm_up"]

_IN_FLIGHT, _RUNNING, _WAITING, _KV_USAGE = S.IN_FLIGHT, S.RUNNING, S.WAITING, S.KV_USAGE
_SCRAPED_AT, _PENDING, _DECODING, _SINCE = S.SCRAPED_AT, S.PENDING_PREFILL, S.DECODING, S.SINCE_SCRAPE
_AWAITING = S.AWAITING
_TTFT_R, _TPOT_R = S.TTFT_RATIO, S.TPOT_RATIO
_RECENT, _STALLED, _FAIL, _PAIRS = S.RECENT_TOKENS, S.STALLED_SINCE, S.FAIL_SHARE, S.PENDING_PAIRS


@njit(cache=True, nogil=True, inline="always")
def _attention(attn_c, kv_m, P, pairs, work, c):
    """The attention part of a full prefill step (``P`` prompt tokens) of prefill ``work`` tokens computing
    ``pairs`` (query, key) pairs: compute at their mean chunk offset, or reading the keys and values there.
    No work: at the context ``c``."""
    cw = max(2.0 * pairs / work - P, 0.0) if work > 0.0 else c
    return max(attn_c * (P * (cw / 2.0) + P * P / 2.0), kv_m * (P + cw / 2.0))


@njit(cache=True, nogil=True, inline="always")
def _full_steps(steps):
    """The full prefill steps before the one that completes ``steps`` steps of work (the last, partial or full,
    is priced apart): vLLM samples the first token in the step that computes the prompt's last token, so work of
    exactly k budgets takes k steps, not k full ones and a decode step after them."""
    return max(np.ceil(steps) - 1.0, 0.0)  # np.ceil: a NaN stays NaN (math's would be an integer)


@njit(cache=True, nogil=True)
def predict_kernel(idx, live, matrix, batch_tokens, price, modelled, own, prompt_tokens, expected_output, samples,
                   ctx_len, ttft_prior, tpot_prior, reference_batch, recent_at, now, recent_tau, out):
    """``out[0..3, j]`` = predicted TTFT, TPOT, end-to-end seconds and $ for candidate ``idx[j]``; ``out[4, j]``
    the TPOT of the requests decoding there once this one's prefill is added, ``out[5, j]`` its TTFT once the
    prefill queued ahead of it has drained.

    ``samples``: the sequences it decodes as (``n``): they join the batch side by side and each costs its decode;
    ``expected_output`` is one sample's.  The formula is documented in :mod:`steersman.policy.predict`.

    An engine count it did not report (NaN ``running`` / ``waiting``) is what the gateway knows: the requests of
    ours decoding there, none of others waiting (as the unprofiled model reads it); numba's ``max`` keeps a NaN,
    which made the whole column NaN and the replica never picked, idle or not.
    """
    c = ctx_len
    for j in range(idx.size):
        i = idx[j]
        in_flight = live[_IN_FLIGHT, i]
        decoding = live[_DECODING, i]
        running = live[_RUNNING, i]
        if running != running:
            running = decoding
        ours_waiting = max(in_flight - decoding, 0.0)
        others_n = live[_WAITING, i] - ours_waiting
        others_n = others_n if others_n > 0.0 else 0.0  # NaN (not reported): none
        others = others_n * prompt_tokens
        mine = own[j]
        work = max(live[_PENDING, i], 0.0) + others + mine
        # attention work, (query, key) token pairs: the queue's own (the engine's requests that are not ours priced
        # as this prompt uncached), then this request's uncached tail of its prompt, (L^2 - h^2) / 2
        mine_pairs = mine * (2.0 * prompt_tokens - mine) / 2.0
        pairs = max(live[_PAIRS, i], 0.0) + others_n * prompt_tokens * prompt_tokens / 2.0 + mine_pairs
        B = batch_tokens[i]
        D = min(max(running, decoding), B - 1.0)
        P = B - D
        D1 = D + 1.0  # the step that completes its prefill: the decodes there and it
        if modelled[i]:
            lin_c = matrix[0, i]
            lin_c0 = matrix[1, i]
            lin_m = matrix[2, i]
            per_tok = matrix[3, i]
            fixed = matrix[4, i]
            attn_c = matrix[5, i]
            kv_m = matrix[6, i]
            dec_kv = matrix[7, i]
            shared = max(matrix[8, i] * D1, matrix[9, i]) + fixed
            t_dec = max(lin_c * D1 + lin_c0, lin_m) + (dec_kv * c + per_tok) * D1 + shared
            t_first = t_dec  # its first token's step: its samples start decoding after it
            if samples != 1.0:  # then its n sequences decode side by side
                Dn = D + samples
                t_dec = (max(lin_c * Dn + lin_c0, lin_m) + (dec_kv * c + per_tok) * Dn
                         + max(matrix[8, i] * Dn, matrix[9, i]) + fixed)
            # a full step at context ``c``; the prefill steps ahead of its first token at the context their chunks
            # attend to: a step of P prompt tokens at offset o computes P o + P^2 / 2 pairs, so the mean offset
            # of ``work`` tokens carrying ``pairs`` is pairs / work - P / 2 (``c / 2`` in t_full's terms)
            linear = max(lin_c * B + lin_c0, lin_m) + dec_kv * (D * c) + per_tok * B + shared
            t_full = linear + _attention(attn_c, kv_m, P, 0.0, 0.0, c)
            t_queue = linear + _attention(attn_c, kv_m, P, pairs, work, c)
            t_alone = linear + _attention(attn_c, kv_m, P, mine_pairs, mine, c)
            steps = work / P
            full = _full_steps(steps)
            r = live[_TTFT_R, i]
            if r != r:
                r = ttft_prior
            # a prefill replica of a disaggregated fleet: the first token reaches the client once the KV moved
            handoff = prompt_tokens * matrix[10, i]
            ttft = (full * t_queue + t_first + (t_queue - t_first) * (steps - full) + handoff) * r
            # its first token once the prefill queued ahead of it has drained (its own prefill alone)
            steps = mine / P
            full = _full_steps(steps)
            alone = (full * t_alone + t_first + (t_alone - t_first) * (steps - full) + handoff) * r
            r = live[_TPOT_R, i]
            if r != r or (in_flight <= 0.0 and running <= 0.0):
                # an idle replica's observed TPOT described the batches it had then; the fleet's ratio
                # stands for it now (else one burst of interference keeps it unpicked, and unobserved, for good)
                r = tpot_prior
            # share of this request's decode steps that carry prefill chunks: the prefill queued there
            # now, spread over its decode, plus prefill arriving at the rate routed there recently
            # (decayed sum / tau); at rho >= 1 the prefill budget is always in use (every step is full)
            lam = live[_RECENT, i] * math.exp(-max(now - recent_at[i], 0.0) / recent_tau) / recent_tau
            rho = lam * t_full / P
            if rho >= 1.0:
                share = 1.0
            else:
                mixed = lam / P
                share = mixed / (mixed + (1.0 - rho) / t_dec)
            share = min(1.0, share + max(work - mine, 0.0) / (P * max(expected_output, 1.0)))
            tpot = (t_dec + (t_full - t_dec) * share) * r
            # what a request decoding there sees once this one's prefill joins the queue ahead of its decode
            # steps (spread over a decode as long as this one's): the TPOT the residents must keep is checked
            # against this, not against this request's own TPOT, which its own prefill does not slow
            tpot_res = (t_dec + (t_full - t_dec) * min(1.0, share + mine / (P * max(expected_output, 1.0)))) * r
            # the hang signal: requests of ours have waited there this long with no progress; a new
            # one's first token comes no sooner, whatever drains ahead of it (``alone`` too: else a hung
            # replica looks able to serve it soon and a late request waits in the gateway for it)
            stalled = now - live[_STALLED, i]
            if stalled > ttft:  # NaN (none awaiting): no floor
                ttft = stalled
            if stalled > alone:
                alone = stalled
        else:  # no roofline (e.g. llama.cpp): steersman.policy.predict._unprofiled fills this column
            ttft = tpot = t_full = tpot_res = alone = math.nan
        out[0, j] = ttft
        out[1, j] = tpot
        out[4, j] = tpot_res
        out[5, j] = alone
        out[2, j] = ttft + expected_output * tpot
        gpu_s = mine / B * t_full + samples * expected_output / reference_batch * tpot
        out[3, j] = price[i] * gpu_s / 3600.0
    return out


@njit(cache=True, nogil=True, inline="always")
def is_saturated(scraped_at, running, waiting, since_scrape, kv_usage, in_flight, decoding, max_seqs, now, staleness,
                 depth, kv_threshold, pending, awaiting, budget):
    """One replica's saturation from its live values (see :mod:`steersman.policy.saturation`); ``pending``: the
    uncached prompt tokens of this gateway's requests there whose first token has not come (``in_flight -
    decoding`` of them), ``awaiting``: the streamed ones among them (a whole response shows no first token, so
    one decoding still counts in the others), ``budget``: the engine's tokens per step (``max_num_batched_tokens``;
    NaN unknown).  Saturated when a queue *exceeds* ``depth`` or the KV usage *exceeds* ``kv_threshold``: GIE's
    detector (``saturationdetector.go``) counts a pod with ``WaitingQueueSize <= QueueDepthThreshold`` and
    ``KVCacheUsagePercent <= KVCacheUtilThreshold`` as having capacity (and a depth of 0 then means "none
    waiting", not "always saturated").  Scalars only: a helper called per replica with array arguments pays
    reference counting on each call."""
    if now - scraped_at <= staleness:
        slots = max_seqs - running
        if not slots > 0.0 or waiting > 0.0:  # NaN (unknown engine), full, or already queueing:
            slots = 0.0  # an engine with waiting requests has no free slot, whatever its max_num_seqs
        if max(waiting + since_scrape - slots, 0.0) > depth or kv_usage > kv_threshold:
            return True
        # free sequence slots do not admit a prompt the step's token budget has no room for: of our streams
        # awaiting a first token, those past what one step admits (at the mean pending size) wait there
        admits = max(1.0, budget * (in_flight - decoding) / pending) if pending > budget else awaiting
        return awaiting - admits > depth
    return in_flight - decoding > depth


@njit(cache=True, nogil=True, inline="always")
def thresholds_for(h, affine_blocks, affine_factor, depth, kv_threshold):
    """(queue depth, KV usage) thresholds of saturation for a request of which the replica holds ``h``
    leading blocks (see :mod:`steersman.policy.saturation`): a holder of at least ``affine_blocks`` (> 0)
    only at ``affine_factor`` x the depth, whatever its KV usage.  Scalars only (as :func:`is_saturated`)."""
    if h > 0 and h >= affine_blocks:
        return depth * affine_factor, np.inf
    return depth, kv_threshold


@njit(cache=True, nogil=True, inline="always")
def affinity_threshold(idx, n, held, affine_blocks):
    """``affine_blocks`` when some of the first ``n`` candidates ``idx`` hold fewer blocks than that, else inf.
    When every candidate holds the prompt there is no affinity to keep: the gateway queue sends the request to a
    holder anyway, in its priority order (a prompt every replica holds must not bypass it)."""
    if held.size == 0:
        return np.inf
    for j in range(n):
        h = held[idx[j]]
        if not (h > 0 and h >= affine_blocks):
            return affine_blocks
    return np.inf


@njit(cache=True, nogil=True)
def saturation_kernel(idx, live, max_seqs, budget, now, staleness, depth, kv_threshold, held, affine_blocks,
                      affine_factor, out):
    """``out[j]`` = replica ``idx[j]`` is saturated for the request (:func:`thresholds_for`, holders exempt only
    when some candidate is not one: :func:`affinity_threshold`)."""
    affine_blocks = affinity_threshold(idx, idx.size, held, affine_blocks)
    some = held.size > 0
    for j in range(idx.size):
        i = idx[j]
        d, kv = thresholds_for(held[i] if some else 0, affine_blocks, affine_factor, depth, kv_threshold)
        out[j] = is_saturated(live[_SCRAPED_AT, i], live[_RUNNING, i], live[_WAITING, i], live[_SINCE, i],
                              live[_KV_USAGE, i], live[_IN_FLIGHT, i], live[_DECODING, i], max_seqs[i], now, staleness,
                              d, kv, live[_PENDING, i], live[_AWAITING, i], budget[i])
    return out


@njit(cache=True, nogil=True)
def prefix_kernel(idx, held, live, kv_blocks, indexed, out):
    """``out[j]`` = leading blocks replica ``idx[j]`` probably holds: the index's match, discounted by
    how much of what is indexed there its KV cache can hold and by its observed hit accuracy.
    ``held`` and ``indexed`` are per replica of the fleet (indexed by ``idx``), not per candidate."""
    if held.size != live.shape[1] or indexed.size != live.shape[1]:
        raise ValueError("prefix_kernel: held / indexed must have one entry per replica")
    for j in range(idx.size):
        i = idx[j]
        h = held[i]
        if h <= 0:
            out[j] = 0.0
            continue
        cap = live[S.KV_BLOCKS_TOTAL, i]
        if cap != cap:
            cap = kv_blocks[i]
        conf = 1.0
        if cap == cap and indexed[i] > 0 and cap < indexed[i]:
            conf = cap / indexed[i]
        acc = live[S.PREFIX_ACCURACY, i]
        if acc < conf:
            conf = acc
        out[j] = h * conf
    return out


@njit(cache=True, nogil=True, inline="always")
def _keeps(resident, tpot_res):
    """The requests decoding there keep their TPOT (``resident`` > 0: what they must keep)."""
    return not resident > 0.0 or tpot_res <= resident


@njit(cache=True, nogil=True)
def failure_shares(idx, live):
    """The candidates' ``fail_share`` (see :func:`slo_pool_kernel`), or an empty array when every one is 0."""
    for j in range(idx.size):
        if live[_FAIL, idx[j]] > 0.0:
            out = np.empty(idx.size)
            for k in range(idx.size):
                out[k] = live[_FAIL, idx[k]]
            return out
    return np.empty(0)


#: The most a replica's failure share counts for (:func:`slo_pool_kernel`): 10 attempts a success.
FAIL_SHARE_CAP = 0.9


@njit(cache=True, nogil=True)
def slo_pool_kernel(ttft, tpot, e2e, cost, cached, resident, tpot_res, exploit, exploit_slowdown, t_ttft, t_tpot,
                    t_left, margin, protected, cost_tie, latency_tie, late_tie, pool, fail):
    """Mark in ``pool`` the candidates the SLO-cheapest rule finds equally good; returns (count, feasible, stayed:
    an unprotected request kept with its prompt's holders although another replica meets its budget).

    Feasible = predicted TTFT, TPOT and end-to-end within ``margin`` x the budget, and the TPOT
    the requests already there would see with this one's prefill added (``tpot_res``) within what
    they must keep (``resident`` > 0).  **Holders first**:
    when the longest prefix the index credits to a candidate (``cached`` tokens: its raw match,
    not discounted by residency confidence as the predictions are) reaches ``exploit`` tokens,
    only the candidates holding it are considered if one of them is feasible, or else if the
    holders' least predicted end-to-end latency is within ``exploit_slowdown`` x the least of all
    and either no candidate is feasible or the request is not ``protected`` (an unprotected
    request stays with its prompt even when another replica would meet its budget and no holder
    would, among the holders that keep their residents' TPOT: computing a long prompt again costs
    the fleet more than its own latency; a protected one, critical or a workflow with sunk cost,
    goes where its budget is met).  If any considered candidate is feasible, the pool is the
    feasible ones within ``cost_tie`` of the cheapest and, among those, within ``latency_tie`` of the fastest
    (so a stalled or overloaded replica does not win on price alone); otherwise the considered
    ones within ``late_tie`` of the least predicted end-to-end latency (a late request is late on
    any of them: the scores spread late work by load and prefix instead of crowding the fastest
    replicas, which on-time requests need; one far further behind is still avoided).

    ``fail``: each candidate's recent server-side failure share ``p`` (the snapshot's ``fail_share``, an empty
    array when every one is 0): its predicted TTFT, end-to-end latency and cost count ``1 / (1 - p)`` times,
    the attempts a success takes there (``p`` at most :data:`FAIL_SHARE_CAP`), so a replica that fails fast
    does not win on its low load.
    """
    n = ttft.size
    if fail.size:
        tries = np.empty(n)
        for j in range(n):
            tries[j] = 1.0 / (1.0 - min(max(fail[j], 0.0), FAIL_SHARE_CAP))
        ttft, e2e, cost = ttft * tries, e2e * tries, cost * tries
    best_cached = 0.0
    for j in range(n):
        if cached[j] > best_cached:
            best_cached = cached[j]
    exploiting = best_cached > 0.0 and best_cached >= exploit
    stay = False  # an unprotected request kept with its prompt over a replica that meets its budget
    feasible_any = False
    feasible_holder = False
    for j in range(n):
        ok = (ttft[j] <= t_ttft * margin and tpot[j] <= t_tpot * margin and e2e[j] <= t_left * margin
              and _keeps(resident[j], tpot_res[j]))
        pool[j] = ok
        if ok:
            feasible_any = True
            if exploiting and cached[j] >= best_cached:
                feasible_holder = True
    if exploiting and not feasible_holder and (not feasible_any or not protected):
        # no holder meets the budget: the holders still, unless they are far slower (or, when another replica
        # meets it, unless they would break what their residents must keep)
        fastest_all = np.inf
        fastest_holder = np.inf
        for j in range(n):
            if e2e[j] < fastest_all:
                fastest_all = e2e[j]
            if (cached[j] >= best_cached and e2e[j] < fastest_holder
                    and (not feasible_any or _keeps(resident[j], tpot_res[j]))):
                fastest_holder = e2e[j]
        exploiting = fastest_holder <= fastest_all * exploit_slowdown
        stay = exploiting and feasible_any
    holders_only = exploiting and (feasible_holder or not feasible_any or stay)
    feasible = feasible_holder if holders_only else feasible_any
    best = np.inf
    for j in range(n):
        if holders_only and cached[j] < best_cached:
            pool[j] = False
        elif feasible and pool[j] and cost[j] < best:
            best = cost[j]
    fastest = np.inf
    if feasible:
        limit = best * cost_tie + 1e-15
        for j in range(n):
            pool[j] = pool[j] and cost[j] <= limit
            if pool[j] and e2e[j] < fastest:
                fastest = e2e[j]
    else:
        for j in range(n):
            pool[j] = not holders_only or (cached[j] >= best_cached and (not stay or _keeps(resident[j], tpot_res[j])))
            if pool[j] and e2e[j] < fastest:
                fastest = e2e[j]
    limit = fastest * (latency_tie if feasible else late_tie) + 1e-12
    count = 0
    for j in range(n):
        pool[j] = pool[j] and e2e[j] <= limit
        count += pool[j]
    return count, feasible, stay


@njit(cache=True, nogil=True)
def add_clamped(total, scores, weight):
    """``total += weight * clamp(scores, 0, 1)`` with NaN counted as 0 (``np.fmin(np.fmax(s, 0), 1)``)."""
    for j in range(total.size):
        v = scores[j]
        if not v > 0.0:  # NaN, negative, -inf
            continue
        total[j] += weight * (v if v < 1.0 else 1.0)
    return total


def warm_up() -> None:
    """Compile (or load) the kernels now rather than on the first request."""
    idx = np.zeros(1, dtype=np.intp)
    live = np.zeros((len(S.LIVE_FIELDS), 1))
    one = np.ones(1)
    predict_kernel(idx, live, np.ones((10, 1)), one * 2048.0, one, np.ones(1, dtype=np.bool_), one, 1.0, 1.0, 1.0,
                   1.0, 1.0, 1.0, 32.0, one * 0.0, 0.0, 60.0, np.empty((6, 1)))
    held = np.zeros(1, dtype=np.int64)
    matched = held.copy()
    matched.flags.writeable = False  # as the prefix index's match results are
    saturation_kernel(idx, live, one, one, 0.0, 1.0, 5.0, 0.8, matched, 1.0, 4.0, np.empty(1, dtype=np.bool_))
    prefix_kernel(idx, held, live, one, one, np.empty(1))
    shortlist_kernel(idx, live, held, one, 4, np.empty(1, dtype=np.bool_))
    shortlist_fitting_kernel(idx, live, held, one, one, 1.0, 1.0, 16.0, 4, np.empty(1, dtype=np.bool_))
    frozen = live.copy()
    frozen.flags.writeable = False  # as every snapshot's
    failure_shares(idx, frozen)
    for fail in (np.empty(0), np.zeros(1)):
        slo_pool_kernel(one, one, one, one, one, one, one, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, False, 1.05, 1.1, 2.0,
                        np.empty(1, dtype=np.bool_), fail)
    add_clamped(np.zeros(1), one, 1.0)
    plugin_kernels.warm_up()
    unprofiled_kernels.warm_up()
    prefix_table.warm_up()
