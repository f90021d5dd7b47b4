"""The shortlist's compiled pass (numba): above ``k`` candidates, the few the expensive prediction is run for.

:func:`shortlist_kernel` marks the k/2 least loaded candidates, the k/4 holding the longest prefix and the k/4
with the cheapest compute, in one pass with small sorted buffers; :func:`shortlist_fitting_kernel` does so among
the candidates the ``fits-kv`` filter keeps.  Used by :class:`~steersman.policy.scorers.Shortlist` and the fused
path (:mod:`steersman.policy.fastpath`); re-exported by :mod:`steersman.policy.kernels`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

from steersman.fleet import snapshot as S
from steersman.policy import plugin_kernels

__all__ = ["shortlist_kernel", "shortlist_fitting_kernel"]

_IN_FLIGHT, _WAITING, _KV_USAGE, _KV_TOTAL = S.IN_FLIGHT, S.WAITING, S.KV_USAGE, S.KV_BLOCKS_TOTAL


@njit(cache=True, nogil=True, inline="always")
def _insert(buf_key, buf_pos, m, key, pos):
    """Keep the m smallest keys seen so far (buf sorted ascending, +inf padded)."""
    if key >= buf_key[m - 1]:
        return
    k = m - 1
    while k > 0 and buf_key[k - 1] > key:
        buf_key[k] = buf_key[k - 1]
        buf_pos[k] = buf_pos[k - 1]
        k -= 1
    buf_key[k] = key
    buf_pos[k] = pos


@njit(cache=True, nogil=True)
def shortlist_kernel(idx, live, held, compute_price, k, keep):
    """Mark in ``keep`` (over positions of ``idx``) the k/2 least loaded candidates, the k/4 holding
    the longest prefix and the k/4 with the cheapest compute: one pass, small sorted buffers."""
    _shortlist(idx, live, held, compute_price, k, keep, _ALL, live[0], 0.0, 0.0)
    return keep


_ALL, _FITTING, _MARKED = 0, 1, 2  # the candidates _shortlist ranks


@njit(cache=True, nogil=True)
def _shortlist(idx, live, held, compute_price, k, keep, among, kv_blocks, need, least):
    """:func:`shortlist_kernel` among the candidates: ``_ALL``; ``_FITTING``, those whose free KV cache holds
    ``need`` blocks and whole cache ``least`` (:func:`~steersman.policy.plugin_kernels.fits_kv`, ``kv_blocks`` the
    modelled capacity);
    ``_MARKED``, those ``keep`` marks.  Returns how many there were: when ``among`` is not ``_ALL`` and they are
    ``k`` or fewer, ``keep`` marks them all (ranked, a few of them would be left out)."""
    if held.size and held.size != live.shape[1]:
        raise ValueError("shortlist_kernel: held must have one entry per replica")
    m_load, m_held, m_cost = k // 2, k // 4, k // 4
    lk = np.full(m_load, np.inf)
    lp = np.full(m_load, -1)
    hk = np.full(m_held, np.inf)
    hp = np.full(m_held, -1)
    ck = np.full(m_cost, np.inf)
    cp = np.full(m_cost, -1)
    nh = held.size
    worst_load, worst_held, worst_cost = np.inf, np.inf, np.inf
    eligible = 0
    for j in range(idx.size):
        i = idx[j]
        if among == _FITTING:
            ok = plugin_kernels.fits_kv(live[_KV_TOTAL, i], kv_blocks[i], live[_KV_USAGE, i], need, least)
            keep[j] = ok
            if not ok:
                continue
        elif among == _MARKED and not keep[j]:
            continue
        eligible += 1
        key = live[_IN_FLIGHT, i] + live[_WAITING, i]
        if key < worst_load:  # most candidates stop at these comparisons
            _insert(lk, lp, m_load, key, j)
            worst_load = lk[m_load - 1]
        if nh and held[i] > 0:
            key = -float(held[i])
            if key < worst_held:
                _insert(hk, hp, m_held, key, j)
                worst_held = hk[m_held - 1]
        key = compute_price[i]
        if key < worst_cost:
            _insert(ck, cp, m_cost, key, j)
            worst_cost = ck[m_cost - 1]
    if among != _ALL and eligible <= k:
        return eligible
    keep[:] = False
    for p in lp:
        if p >= 0:
            keep[p] = True
    for p in hp:
        if p >= 0:
            keep[p] = True
    for p in cp:
        if p >= 0:
            keep[p] = True
    return eligible


@njit(cache=True, nogil=True)
def shortlist_fitting_kernel(idx, live, held, compute_price, kv_blocks, need, least, block_size, k, keep):
    """:func:`shortlist_kernel` among the candidates the ``fits-kv`` filter keeps
    (:func:`~steersman.policy.plugin_kernels.kv_keep_kernel`: those whose free KV holds ``need`` blocks, else those
    whose whole cache holds ``least`` tokens with the most free now), all of them when they are ``k`` or fewer;
    among all the candidates when no candidate's whole cache holds the request (fits-kv answers then).  Ranked
    among them all, a long prompt lost the few replicas large enough to hold it (a fleet of many small-HBM
    replicas and a large one) to smaller ones that load, prefix or price put first, and got a 503 where the large
    one would take it.  The common case is one pass: some candidate's free KV holds the request."""
    if _shortlist(idx, live, held, compute_price, k, keep, _FITTING, kv_blocks, need, least / block_size):
        return keep
    kept = plugin_kernels.kv_keep_kernel(idx, live[_KV_TOTAL], kv_blocks, live[_KV_USAGE], need, least, block_size,
                                         keep)[1]
    _shortlist(idx, live, held, compute_price, k, keep, _MARKED if kept else _ALL, kv_blocks, need, least / block_size)
    return keep
