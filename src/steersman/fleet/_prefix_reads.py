"""The read side of :class:`~steersman.fleet.prefix_index.PrefixIndex`: matching a prompt against the index,
blocks per replica, and turning holder sets (single replicas, Python-int bitmasks) into per-replica counts.

A mixin: it reads the index's generations through ``_get`` and its totals, and flushes the records kept by
``record_later`` before it reads (see the index's module doc for the layout and the match's approximation).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from steersman.fleet._prefix_bits import scatter_bits

__all__ = ["PrefixReads"]

_MAX_LEVELS = 32  # holder-set changes handled by binary search before walking block by block


def _mask(v: int) -> int:
    """A holder value as a bitmask (``~r`` stands for replica ``r`` alone)."""
    return 1 << ~v if v < 0 else v


class PrefixReads:
    """Reads of :class:`~steersman.fleet.prefix_index.PrefixIndex` (which sets the attributes used here)."""

    n: int
    _nbytes_mask: int
    _total: np.ndarray
    _total_view: np.ndarray
    _memo: tuple | None
    _later: list
    slots: dict  # replica -> steersman.fleet.slots.SlotMirror (llama.cpp replicas: the match is the mirror's)

    def _scatter(self, out: np.ndarray, v: int, value: int, add: bool = False) -> None:
        """``out[replicas in v] = value`` (``+= value`` with ``add``)."""
        if v < 0:
            idx = ~v
        elif v.bit_count() <= 8:
            idx = []
            while v:
                low = v & -v
                idx.append(low.bit_length() - 1)
                v ^= low
        else:
            scatter_bits(np.frombuffer(v.to_bytes(self._nbytes_mask, "little"), dtype=np.uint8), self.n, value, out, add)
            return
        if add:
            out[idx] += value
        else:
            out[idx] = value

    def _weighted_bits(self, items: list[tuple[int, int]]) -> np.ndarray:
        """``sum(k x indicator(replicas in v))`` over ``(v, k)`` pairs, as int64 per replica: single
        replicas and small sets one by one, large bitmasks unpacked together in one numpy pass."""
        out = np.zeros(self.n, dtype=np.int64)
        big_v, big_k = [], []
        for v, k in items:
            if v < 0 or v.bit_count() <= 24:
                self._scatter(out, v, k, add=True)
            else:
                big_v.append(v.to_bytes(self._nbytes_mask, "little"))
                big_k.append(k)
        if big_v:
            raw = np.frombuffer(b"".join(big_v), dtype=np.uint8).reshape(len(big_v), self._nbytes_mask)
            bits = np.unpackbits(raw, axis=1, count=self.n, bitorder="little")
            out += np.asarray(big_k, dtype=np.int64) @ bits
        return out

    def blocks_per_replica(self) -> np.ndarray:
        """Indexed blocks per replica (a copy)."""
        self.flush()
        return self._total.copy()

    def blocks_view(self) -> np.ndarray:
        """Indexed blocks per replica, read-only and without a copy: it follows the index's later writes, so
        read it within one decision (policies run between writes)."""
        if self._later:
            self.flush()
        return self._total_view

    def match(self, hashes: Sequence[int]) -> np.ndarray:
        """Leading blocks of ``hashes`` each replica probably holds (int64, one per replica).

        Walks the prompt forward over runs of blocks with the same holder set, finding the end of each
        run by binary search: O((1 + holder-set changes) x log len(hashes)) lookups.  A replica's match
        ends at the first block it is missing from (see the module doc for the approximation).

        The result is read-only and memoised until the next write: asking again for the same
        ``hashes`` object (the policy's match, then the accounting's on dispatch) costs nothing."""
        if self._later:
            self.flush()
        memo = self._memo
        if memo is not None and memo[0] is hashes and memo[1] == len(hashes):
            return memo[2]
        out = self._match(hashes)
        for r, mirror in self.slots.items():
            out[r] = mirror.match(hashes)
        out.setflags(write=False)  # half the cost of going through ``out.flags``
        self._memo = (hashes, len(hashes), out)
        return out

    def _match(self, hashes: Sequence[int]) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.int64)
        n = len(hashes)
        get = self._get
        v = get(hashes[0]) if n else None
        if v is None:
            return out
        alive = _mask(v)  # replicas holding every block so far
        last = get(hashes[n - 1])
        pos, levels = 0, 0
        ended: list[tuple[int, int]] = []  # (replicas whose match ends, its length): disjoint sets
        while True:
            levels += 1
            if levels > _MAX_LEVELS:
                end = pos  # too many holder-set changes: walk the rest block by block
            elif last == v:
                end = n - 1
            else:  # last index of the run of ``v`` that starts at ``pos``
                a, b = pos, n - 1
                while b - a > 1:
                    mid = (a + b) // 2
                    if get(hashes[mid]) == v:
                        a = mid
                    else:
                        b = mid
                end = a
            nxt = get(hashes[end + 1]) if end + 1 < n else None
            nm = 0 if nxt is None else _mask(nxt)
            gone = alive & ~nm
            if gone:
                ended.append((gone, end + 1))
                alive &= nm
            if not alive:
                if len(ended) > 2:
                    return self._weighted_bits(ended)
                for m, k in ended:
                    self._scatter(out, m, k)
                return out
            pos, v = end + 1, nxt
