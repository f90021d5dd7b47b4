"""Compiled arithmetic of the linear model for replicas without a roofline (llama.cpp), numba.

:mod:`steersman.policy.predict` documents the model (its module doc) and calls these.  They were numpy
expressions over the few candidates of a llama.cpp fleet: ~40 ufunc calls a decision on arrays of one
or two elements, ~220 us of the schedule stage's ~650 us on bench/overhead's
``critical_path.py --llama`` (the gateway idles between requests, so each call runs cache-cold).

The arithmetic is numpy's, operation for operation, so results are bit-identical:
:func:`_maximum` is ``np.maximum`` (a NaN in either wins), sums run in the order ``np.bincount`` adds,
and every product and quotient is evaluated in the order the numpy expression did
(``tests/policy/test_unprofiled_kernels.py`` compares both on random snapshots).
"""

from __future__ import annotations

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

from steersman.fleet import snapshot as S

__all__ = ["speeds_into", "own_tpot_into", "pool_kernel", "unprofiled_pass", "warm_up"]

_IN_FLIGHT, _RUNNING, _WAITING, _DECODING, _PENDING = S.IN_FLIGHT, S.RUNNING, S.WAITING, S.DECODING, S.PENDING_PREFILL
_TTFT_R, _TPOT_R, _STALLED = S.TTFT_RATIO, S.TPOT_RATIO, S.STALLED_SINCE
_PREFILL_S, _DECODE_S = S.PREFILL_S_TOKEN, S.DECODE_S_TOKEN


@njit(cache=True, nogil=True, inline="always")
def _maximum(a, b):
    """``np.maximum(a, b)`` of two floats: a NaN in either is the result."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


@njit(cache=True, nogil=True, inline="always")
def _nan0(x):
    return 0.0 if x != x else x


@njit(cache=True, nogil=True, inline="always")
def _step(live, i, default_step):
    """Seconds per decode step: the engine's own timing where it reports it, else the prior."""
    m = live[_DECODE_S, i]
    return m if m > 0.0 else default_step


@njit(cache=True, nogil=True, inline="always")
def _own_tpot(live, i, tpot_prior, default_step):
    """The decode step x the learnt TPOT ratio (the fleet's prior on an idle replica or one not observed)."""
    r = live[_TPOT_R, i]
    idle = live[_IN_FLIGHT, i] <= 0.0 and not live[_RUNNING, i] > 0.0
    return _step(live, i, default_step) * (tpot_prior if (r != r or idle) else r)


@njit(cache=True, nogil=True)
def speeds_into(live, idx, ttft_prior, default_prefill, default_step, out):
    """``out[0..2, j]`` = seconds per prompt token, seconds per decode step and the TTFT correction of
    replica ``idx[j]`` (:func:`steersman.policy.predict.unprofiled_speeds`)."""
    for j in range(idx.size):
        i = idx[j]
        m = live[_PREFILL_S, i]
        out[0, j] = m if m > 0.0 else default_prefill
        out[1, j] = _step(live, i, default_step)
        r = live[_TTFT_R, i]
        out[2, j] = ttft_prior if r != r else r


@njit(cache=True, nogil=True)
def own_tpot_into(live, idx, tpot_prior, default_step, out):
    for j in range(idx.size):
        out[j] = _own_tpot(live, idx[j], tpot_prior, default_step)


@njit(cache=True, nogil=True)
def pool_kernel(live, modelled, speed_class, tpot_prior, default_step, spread, full, own):
    """Each unprofiled replica's TPOT pooled over its class (:func:`steersman.policy.predict.pooled_tpot`) into
    ``full``, its own into ``own`` (NaN for replicas with a roofline).  False, writing nothing, when nothing
    pools (fewer than two unprofiled replicas)."""
    u = np.flatnonzero(~modelled)
    if u.size < 2:
        return False
    every = np.empty(u.size)
    w = np.empty(u.size)
    size = 0
    for j in range(u.size):
        i = u[j]
        every[j] = _own_tpot(live, i, tpot_prior, default_step)
        w[j] = 1.0 if live[_DECODE_S, i] > 0.0 else 0.0  # the engine's own timing read: it has something to pool
        size = max(size, speed_class[i] + 1)
    n_c = np.zeros(size)
    s_c = np.zeros(size)
    for j in range(u.size):  # np.bincount's order of addition
        c = speed_class[u[j]]
        n_c[c] += w[j]
        s_c[c] += every[j] * w[j]
    agree = np.empty(u.size, dtype=np.bool_)
    k_c = np.zeros(size)
    m_c = np.zeros(size)
    for j in range(u.size):
        c = speed_class[u[j]]
        e, ew = every[j], every[j] * w[j]
        others_n = n_c[c] - w[j]
        others = (s_c[c] - ew) / _maximum(others_n, 1.0)
        agree[j] = w[j] > 0.0 and (others_n == 0 or (e <= spread * others and others <= spread * e))
        k_c[c] += 1.0 if agree[j] else 0.0
        m_c[c] += e if agree[j] else 0.0
    full[:] = np.nan
    own[:] = np.nan
    for j in range(u.size):
        i = u[j]
        c = speed_class[i]
        k = k_c[c]
        pooled = agree[j] or (not w[j] > 0.0 and k > 0)  # not measured yet: its class's measured value
        full[i] = m_c[c] / _maximum(k, 1.0) if pooled else every[j]
        own[i] = every[j]
    return True


@njit(cache=True, nogil=True)
def unprofiled_pass(idx, live, modelled, price_per_hour, own, prompt_tokens, expected_output, samples, ttft_prior,
                    tpot_prior, default_prefill, default_step, now, reference_batch, pooled, use_pooled, out):
    """Overwrites ``out[.., j]`` (the columns of :func:`steersman.policy.kernels.predict_kernel`) for the
    candidates ``idx[j]`` without a roofline; ``own[j]``: their uncached prompt tokens; ``pooled``: every
    replica's pooled TPOT when ``use_pooled``; ``samples``: the sequences it decodes as, each costing its decode."""
    for j in range(idx.size):
        i = idx[j]
        if modelled[i]:
            continue
        m = live[_PREFILL_S, i]
        s_tok = m if m > 0.0 else default_prefill
        step = _step(live, i, default_step)
        r = live[_TTFT_R, i]
        r_ttft = ttft_prior if r != r else r
        ours_waiting = _maximum(live[_IN_FLIGHT, i] - live[_DECODING, i], 0.0)
        others = _maximum(live[_WAITING, i] - ours_waiting, 0.0) * prompt_tokens  # NaN (never scraped): none
        work = _maximum(live[_PENDING, i], 0.0) + _nan0(others) + own[j]
        stalled = _nan0(now - live[_STALLED, i])  # the hang floor (NaN: none awaiting), on both: see predict_kernel
        ttft = _maximum((step + work * s_tok) * r_ttft, stalled)
        tpot = pooled[i] if use_pooled else _own_tpot(live, i, tpot_prior, default_step)
        out[0, j] = ttft
        out[1, j] = tpot
        out[4, j] = tpot  # the linear model has no prefill interference
        out[5, j] = _maximum((step + own[j] * s_tok) * r_ttft, stalled)
        out[2, j] = ttft + expected_output * tpot
        out[3, j] = _nan0(price_per_hour[i]) * (own[j] * s_tok * r_ttft + samples * expected_output / reference_batch * tpot) / 3600.0


def warm_up() -> None:
    """Compile (or load) the kernels now rather than on the first request."""
    live = np.zeros((len(S.LIVE_FIELDS), 2))
    idx = np.zeros(1, dtype=np.intp)
    modelled = np.zeros(2, dtype=np.bool_)
    speeds_into(live, idx, 1.0, 1e-3, 1e-2, np.empty((3, 1)))
    own_tpot_into(live, idx, 1.0, 1e-2, np.empty(1))
    full, own = np.empty(2), np.empty(2)
    pool_kernel(live, modelled, np.zeros(2, dtype=np.int64), 1.0, 1e-2, 10.0, full, own)
    unprofiled_pass(idx, live, modelled, np.zeros(2), np.ones(1), 1.0, 1.0, 1.0, 1.0, 1.0, 1e-3, 1e-2, 0.0, 32.0, full,
                    True, np.empty((6, 1)))
