"""Compiled passes of the filter and scorer plugins (numba), and their per-replica tests.

Each is the arithmetic of the numpy expression the plugin used before, element by element
(no fastmath: IEEE results are identical; ``tests/policy/test_decision_replay.py`` pins the
decisions).  The per-replica helpers (``is_available``, ``fits_kv``, ``kv_headroom``,
``uncached``) take scalars only: a helper called once per replica with array arguments pays
reference counting on every call (36 µs instead of 2.4 µs for the reliability pass over
1,000 replicas).  :mod:`steersman.policy.fastpath` builds on the same helpers.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

__all__ = ["is_available", "is_excluded", "reliability_kernel", "fits_kv", "kv_headroom", "fits_kv_kernel",
           "kv_keep_kernel", "kv_headroom_kernel", "load_balance_kernel", "balance_score", "uncached",
           "uncached_kernel", "share_kernel", "pick_top", "warm_up"]


@njit(cache=True, nogil=True, inline="always")
def is_available(routable, blocked, blocked_until, now, limited, in_flight, limit, excluded):
    """One replica is routable, not blocked after ``now`` (when ``blocked``), under its concurrency limit
    (when ``limited``; NaN fails) and not ``excluded`` (see :func:`is_excluded`).  Scalars only: a helper called
    per replica with array arguments pays reference counting on each call."""
    if not routable:
        return False
    if blocked and not blocked_until <= now:
        return False
    if limited and not in_flight < limit:
        return False
    return not excluded


@njit(cache=True, nogil=True, inline="always")
def is_excluded(excluded, i):
    """``i`` is one of the few replicas in ``excluded`` (call only when there are some)."""
    for e in range(excluded.size):
        if excluded[e] == i:
            return True
    return False


@njit(cache=True, nogil=True)
def reliability_kernel(idx, routable, blocked_until, now, in_flight, limits, excluded, out):
    """``out[j]`` = replica ``idx[j]`` is available (:func:`is_available`); returns how many are."""
    blocked, limited, some = blocked_until.size > 0, limits.size > 0, excluded.size > 0
    kept = 0
    for j in range(idx.size):
        i = idx[j]
        ok = is_available(routable[i], blocked, blocked_until[i] if blocked else 0.0, now, limited, in_flight[i],
                          limits[i] if limited else 0.0, is_excluded(excluded, i) if some else False)
        out[j] = ok
        kept += ok
    return kept


@njit(cache=True, nogil=True, inline="always")
def _capacity(reported, modelled_blocks):
    return modelled_blocks if reported != reported else reported


@njit(cache=True, nogil=True, inline="always")
def fits_kv(reported, modelled_blocks, kv_usage, need, least):
    """A replica's free KV blocks hold ``need`` and its whole cache ``least`` blocks, one sequence at its longest
    (the prompt and ``max_tokens``: a request over every replica's cache was let through on its expected output
    and ran to the context's end, a llama.cpp audit's ``max_tokens`` 100,000; or its capacity is unknown)."""
    cap = _capacity(reported, modelled_blocks)
    return cap != cap or (cap >= least and (1.0 - kv_usage) * cap >= need)


@njit(cache=True, nogil=True, inline="always")
def kv_headroom(reported, modelled_blocks, kv_usage, need):
    """``1 - (usage + need / capacity)``, + 0 for an unknown capacity.  A replica reporting no KV blocks has no
    room (-inf, numpy's ``need / 0``) for a request needing some: numba's division raises ZeroDivisionError
    where numpy's gave inf, and the whole decision failed."""
    cap = _capacity(reported, modelled_blocks)
    if cap <= 0.0:  # NaN (unknown) is not: it falls through to + need / inf
        return -np.inf if need > 0.0 else 1.0 - kv_usage
    return 1.0 - (kv_usage + need / (np.inf if cap != cap else cap))


@njit(cache=True, nogil=True)
def fits_kv_kernel(idx, kv_blocks_total, kv_blocks, kv_usage, need, least, out):
    """``out[j]`` = replica ``idx[j]``'s free KV blocks ``(1 - usage) x capacity`` hold ``need`` blocks and its
    whole cache ``least`` (:func:`fits_kv`), or its capacity is unknown (reported, else modelled, else NaN).
    Returns how many pass."""
    kept = 0
    for j in range(idx.size):
        i = idx[j]
        ok = fits_kv(kv_blocks_total[i], kv_blocks[i], kv_usage[i], need, least)
        out[j] = ok
        kept += ok
    return kept


@njit(cache=True, nogil=True, inline="always")
def free_if_holds(reported, modelled_blocks, kv_usage, least, block_size):
    """Tokens free now in a replica's KV cache whose whole (reported, else modelled) holds ``least`` tokens of one
    sequence: ``(1 - usage) x capacity``, none when its usage is unknown (unscraped); -inf when its whole cache
    does not hold them (or its capacity is unknown: :func:`fits_kv` passes it)."""
    cap = _capacity(reported, modelled_blocks) * block_size
    if not cap >= least:
        return -np.inf
    return (1.0 - (kv_usage if kv_usage == kv_usage else 1.0)) * cap


@njit(cache=True, nogil=True)
def kv_keep_kernel(idx, kv_blocks_total, kv_blocks, kv_usage, need, least, block_size, out):
    """``out[j]`` = the ``fits-kv`` filter keeps replica ``idx[j]``: its free KV blocks hold ``need`` blocks
    (:func:`fits_kv`); when no candidate's do, its whole cache holds ``least`` tokens of one sequence and it has the
    most tokens free now among those (:func:`free_if_holds`): where the request waits in the engine's queue for
    blocks (``FitsKv.when_empty``, :func:`steersman.policy.scorers.kv_shortfall`).  Returns (how many fit now, how
    many are kept); (0, 0), every ``out`` False, when no candidate's whole cache holds it."""
    fitting = 0
    best = -np.inf
    for j in range(idx.size):
        i = idx[j]
        ok = fits_kv(kv_blocks_total[i], kv_blocks[i], kv_usage[i], need, least / block_size)
        out[j] = ok
        fitting += ok
        if not fitting:  # none fits so far: the most free among the whole caches that hold it
            free = free_if_holds(kv_blocks_total[i], kv_blocks[i], kv_usage[i], least, block_size)
            if free > best:
                best = free
    if fitting:
        return fitting, fitting
    kept = 0
    if best > -np.inf:
        for j in range(idx.size):
            i = idx[j]
            ok = free_if_holds(kv_blocks_total[i], kv_blocks[i], kv_usage[i], least, block_size) >= best
            out[j] = ok
            kept += ok
    return 0, kept


@njit(cache=True, nogil=True)
def kv_headroom_kernel(idx, kv_blocks_total, kv_blocks, kv_usage, need, tie, out):
    """``out[j]`` = 1 - (KV usage + ``need`` / capacity) of replica ``idx[j]`` (unknown capacity: + 0); a score
    within ``tie`` of the best is the best (:func:`kv_best_within`)."""
    best = -np.inf
    for j in range(idx.size):
        i = idx[j]
        v = kv_headroom(kv_blocks_total[i], kv_blocks[i], kv_usage[i], need)
        out[j] = v
        if v > best:
            best = v
    for j in range(idx.size):
        out[j] = kv_best_within(out[j], best, tie)
    return out


@njit(cache=True, nogil=True, inline="always")
def kv_best_within(v, best, tie):
    """A KV headroom score within ``tie`` of the candidates' best counts as the best (usage is scraped: between
    two scrapes a strict ranking sends every near-tie to the replica whose last reading was lowest).  NaN stays."""
    return best if v >= best - tie else v


@njit(cache=True, nogil=True)
def load_balance_kernel(idx, in_flight, waiting, tie, out):
    """``out[j]`` = :func:`balance_score` of load = in flight + waiting over the candidates; all 1 when every
    load is equal; all NaN when a load is NaN (numpy's min/max propagate it)."""
    n = idx.size
    lo, hi = np.inf, -np.inf
    nan = False
    for j in range(n):
        i = idx[j]
        v = in_flight[i] + waiting[i]
        out[j] = v
        if v != v:
            nan = True
        else:
            lo = min(lo, v)
            hi = max(hi, v)
    if nan:
        out[:] = np.nan
        return out
    band = balance_band(lo, tie)
    for j in range(n):
        out[j] = balance_score(out[j], lo, hi, band)
    return out


@njit(cache=True, nogil=True, inline="always")
def balance_band(lo, tie):
    """Loads up to this count as the least ``lo``: load + 1 within ``tie`` (a share) of lo + 1."""
    return (lo + 1.0) * (1.0 + tie) - 1.0


@njit(cache=True, nogil=True, inline="always")
def balance_score(load, lo, hi, band):
    """1 for a load within the band of the least (``hi <= lo``: every load is equal), else min-max
    ``(hi - load) / (hi - lo)``: near-equal loads tie (each model's tied requests take them in turn) instead
    of sending each finished request's successor back to the replica it just left."""
    if hi <= lo or load <= band:
        return 1.0
    return (hi - load) / (hi - lo)


@njit(cache=True, nogil=True)
def uncached_kernel(blocks, block_size, prompt_tokens, out):
    """``out[j]`` = prompt tokens left to prefill when ``floor(blocks[j])`` blocks of ``block_size`` are cached
    (at least one token is always computed; NaN stays NaN, as ``np.minimum`` keeps it)."""
    for j in range(blocks.size):
        out[j] = uncached(blocks[j], block_size, prompt_tokens)
    return out


@njit(cache=True, nogil=True, inline="always")
def uncached(blocks, block_size, prompt_tokens):
    limit = max(prompt_tokens - 1.0, 0.0)
    hit = np.floor(blocks) * block_size
    return prompt_tokens - (hit if hit != hit or hit < limit else limit)


@njit(cache=True, nogil=True)
def share_kernel(values, mul, div, out):
    """``out[j] = values[j] * mul / div`` (left to right, as numpy evaluates it)."""
    for j in range(values.size):
        out[j] = values[j] * mul / div
    return out


@njit(cache=True, nogil=True)
def pick_top(pool, scores, turn):
    """(position of the pick among ``pool``, how many tie for it): the best ``scores`` (within 1e-12), the
    ``turn``-th of them modulo their count (:meth:`~steersman.policy.model_based.SloCheapest.tie_break` counts
    the turns per model); (-1, 0) when no score is comparable (NaN)."""
    best = -np.inf
    for j in range(pool.size):
        if pool[j]:
            s = scores[j]
            if s != s:
                return -1, 0
            if s > best:
                best = s
    limit = best - 1e-12
    count = 0
    for j in range(pool.size):
        count += (scores[j] if pool[j] else -np.inf) >= limit
    if count == 0:
        return -1, 0
    k = turn % count
    for j in range(pool.size):
        if (scores[j] if pool[j] else -np.inf) >= limit:
            if k == 0:
                return j, count
            k -= 1
    return -1, 0


def warm_up() -> None:
    """Compile (or load) these kernels now (called by :func:`steersman.policy.kernels.warm_up`)."""
    idx = np.zeros(1, dtype=np.intp)
    one = np.ones(1)
    none = np.empty(0)
    for blocked, limits in ((none, none), (one, one)):
        reliability_kernel(idx, np.ones(1, dtype=np.bool_), blocked, 0.0, one, limits, np.zeros(0, dtype=np.intp),
                           np.empty(1, dtype=np.bool_))
    fits_kv_kernel(idx, one, one, one, 1.0, 1.0, np.empty(1, dtype=np.bool_))
    kv_keep_kernel(idx, one, one, one, 1.0, 1.0, 16.0, np.empty(1, dtype=np.bool_))
    # as scorers.kv_shortfall calls it from Python: the snapshot's rows and the statics are read-only (a type of
    # their own to numba), the candidates a buffer's slice or the context's read-only array
    frozen, frozen_idx = one.copy(), idx.copy()
    frozen.flags.writeable = frozen_idx.flags.writeable = False
    for ix in (idx, frozen_idx):
        kv_keep_kernel(ix, frozen, frozen, frozen, 1.0, 1.0, 16.0, np.empty(1, dtype=np.bool_))
    kv_headroom_kernel(idx, one, one, one, 1.0, 0.0, np.empty(1))  # any float tie: one specialization
    load_balance_kernel(idx, one, one, 0.0, np.empty(1))
    uncached_kernel(one, 16.0, 1.0, np.empty(1))
    share_kernel(one, 16.0, 1.0, np.empty(1))
    pick_top(np.ones(1, dtype=np.bool_), one, 0)
