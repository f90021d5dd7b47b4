"""What each replica's KV cache still holds, for :class:`~steersman.fleet.prefix_index.PrefixIndex`.

A mixin (the index sets the attributes read here).  An engine's prefix cache evicts its least recently used
free blocks; the index, left to its own memory budget, remembers many times what the engines keep.  Given each
replica's KV capacity (:meth:`Residency.set_capacity`), it credits a replica only with its newest generations
that fit in that cache (:func:`resident_mask`): a bit per replica and generation that
:func:`~steersman.fleet._prefix_table.match_pass` ands with each block's holders.  Generations then take at
most a quarter of the known replicas' cache, and at most half of one replica's cache in its blocks, so the cut
is that fine for each.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

__all__ = ["Residency", "resident_mask", "over_capacity", "warm_up"]

#: with KV capacities known: a generation takes at most this share of the known replicas' cache
_RESIDENCY_GEN = 0.25
#: and at most this share of one replica's cache in that replica's blocks
_REPLICA_GEN = 0.5
_MIN_GEN = 256  # blocks: the smallest generation (a few prompts), unless the budget's largest is smaller
_ONE = np.uint64(1)


@njit(cache=True, nogil=True)
def resident_mask(counts, order, caps, resident, resident_total):
    """Which generations each replica's KV cache still holds, as an engine's LRU would: from the newest
    generation back, a generation counts while the replica's blocks in the newer ones and half of its own fit
    in ``caps[r]`` blocks (inf: no limit); the newest one holding its blocks always counts (they are the last
    it was sent: a generation's blocks of ``r`` are kept to about half its cache, but a small cache's, or blocks
    other replicas brought in, may outgrow twice it, and then it would be credited with nothing).
    Bit ``r % 64`` of ``resident[g, r // 64]``; ``resident_total[r]``: the blocks of the generations it holds.
    ``order``: the generations in use, oldest first."""
    resident[:] = 0
    for r in range(counts.shape[1]):
        cap = caps[r]
        before = 0.0
        kept = 0
        bit = _ONE << np.uint64(r & 63)
        w = r >> 6
        for k in range(order.size - 1, -1, -1):
            g = order[k]
            c = counts[g, r]
            if before == 0.0 or before + 0.5 * c <= cap:
                resident[g, w] |= bit
                kept += c
            before += c
        resident_total[r] = kept


@njit(cache=True, nogil=True)
def over_capacity(total, caps):
    """Whether some replica has more blocks indexed than its cache holds (else every generation is resident)."""
    for r in range(total.size):
        if total[r] > caps[r]:
            return True
    return False


def warm_up() -> None:
    """Compile (or load) the kernels with the argument types the index passes."""
    over_capacity(np.zeros(1, dtype=np.int64), np.full(1, np.inf))
    resident_mask(np.zeros((8, 1), dtype=np.int64), np.zeros(1, dtype=np.int64), np.full(1, np.inf),
                  np.zeros((8, 1), dtype=np.uint64), np.zeros(1, dtype=np.int64))


def _cap(blocks: float) -> float:
    """A capacity in blocks: NaN, inf or <= 0 (unknown) is no limit."""
    return float(blocks) if blocks == blocks and blocks > 0 else math.inf


class Residency:
    """Per-replica KV capacities and the resident mask of the prefix index."""

    n: int
    _words: int
    _counts: np.ndarray
    _total: np.ndarray
    _order: list[int]
    _memo: tuple | None
    _max_gen_cap: int
    gen_cap: int
    _gen_limit: list[int]

    def _init_residency(self) -> None:
        # each replica's KV cache, in blocks (inf: unknown): what an engine's LRU still holds (set_capacity)
        self._caps = np.full(self.n, np.inf)
        self._capped = False
        self._gen_limit = [self._max_gen_cap] * self.n  # each replica's blocks in a generation, at most
        self._all_ones = np.full((self._counts.shape[0], self._words), ~np.uint64(0), dtype=np.uint64)
        self._resident = self._all_ones.copy()
        self._resident_total = np.zeros(self.n, dtype=np.int64)
        self._resident_view = self._resident_total.view()
        self._resident_view.flags.writeable = False
        self._resident_at: object = None  # the match memo the resident mask was computed for
        self._all_resident = True  # the mask is all ones (and the resident blocks are all the indexed ones)
        self._raw_memo: tuple | None = None  # PrefixReads.match_raw's (hashes, length, result, the match memo)

    def set_capacity(self, replica: int, blocks: float) -> None:
        """``replica``'s KV cache holds ``blocks`` blocks (NaN, inf or <= 0: unknown).  The index then credits the
        replica only with the generations its cache still holds, as the engine's LRU eviction would keep them:
        from the newest back, while the replica's blocks in them fit (:func:`resident_mask`).
        Without it the index remembers what the gateway sent each replica as long as its own memory budget lets it,
        which on a long trace is many times what the engines keep: on the Mooncake trace a fifth of the requests
        were predicted to find ~22,000 prompt tokens cached that their replica had long evicted."""
        cap = _cap(blocks)
        if self._caps[replica] != cap:
            self._caps[replica] = cap
            self._caps_changed()

    def set_capacities(self, modelled: np.ndarray, reported: np.ndarray, on: bool = True) -> None:
        """Every replica's capacity: its engine's ``reported`` blocks where known (not NaN), else the ``modelled``
        ones; ``on`` False: none (every replica credited with all it was sent)."""
        caps = np.array([_cap(r if r == r else m) for r, m in zip(reported, modelled)]) if on else np.full(self.n, np.inf)
        if not np.array_equal(caps, self._caps):
            self._caps[:] = caps
            self._caps_changed()

    def _caps_changed(self) -> None:
        caps = self._caps
        known = np.isfinite(caps)
        self._capped = bool(known.any())
        # a generation of about a quarter of the known replicas' KV cache, so a replica's cache spans several of
        # them and the eviction the mask models is that fine (the default budget's generations, ~260,000 blocks
        # each, are each larger than the whole cache of a small fleet).  A replica of unknown size is left out (its
        # cache is no limit): counted as the budget's size, it let a known replica's share of the newest generation
        # outgrow its cache.  Never over the budget's largest, whatever _MIN_GEN: eight of those fill half the
        # largest table, and a fuller one would leave a probe no free slot to stop at
        self.gen_cap = min(self._max_gen_cap, max(int(float(caps[known].sum()) * _RESIDENCY_GEN), _MIN_GEN)) \
            if self._capped else self._max_gen_cap
        # and a generation closes when one replica's blocks in it reach half its cache (a small replica beside
        # large ones, or one sent most of the traffic): the mask then cuts its cache that fine too
        self._gen_limit = [max(int(c * _REPLICA_GEN), _MIN_GEN) if c < math.inf else self._max_gen_cap
                           for c in caps.tolist()]
        if not self._capped:
            self._resident[:] = self._all_ones
            self._all_resident = True
        self._memo = None
        self._resident_at = None

    def _refresh_resident(self) -> None:
        """The resident mask for the index as it is now (once per write: keyed by the match memo).  While every
        replica's indexed blocks fit in its cache (a large fleet under the index's budget), everything is resident."""
        memo = self._memo
        if memo is not None and memo is self._resident_at:
            return
        self._resident_at = memo
        if not over_capacity(self._total, self._caps):
            if not self._all_resident:
                self._resident[:] = self._all_ones
                self._all_resident = True
            return
        self._all_resident = False
        resident_mask(self._counts, np.asarray(self._order, dtype=np.int64), self._caps, self._resident,
                        self._resident_total)
