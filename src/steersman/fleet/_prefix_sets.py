"""The holder sets of :class:`~steersman.fleet.prefix_index.PrefixIndex`: interning, freeing, renumbering.

A mixin (the index sets the attributes used here).  A block held by several replicas stores ``~s``, the id of
an interned set whose bits are row ``s`` of ``_setbits`` (see :mod:`steersman.fleet._prefix_table`); equal
sets share one id, so a run of blocks with the same holders is a run of equal values.
"""

from __future__ import annotations

import sys

import numpy as np

from steersman.fleet import _prefix_table as T

__all__ = ["HolderSets"]

_SET_OVERHEAD = 120  # per interned set beyond its bit row and its Python int: dict slot, list slot, key share
_MEMO = 32  # old holder value -> new, per write


class HolderSets:
    """Interned holder sets of the prefix index."""

    _words: int
    _set_id: dict[int, int]
    _set_mask: list[int | None]
    _set_free: list[int]
    _set_bytes: int
    _sets_grew: bool
    _setbits: np.ndarray
    _state: np.ndarray
    _memo_k: np.ndarray
    _memo_v: np.ndarray
    _tab: np.ndarray
    _shift: np.uint64
    _mask: int

    def _mask_of(self, v: int) -> int:
        return 1 << v if v >= 0 else self._set_mask[~v]  # type: ignore[return-value]

    def _intern(self, m: int) -> int:
        """The value of holder mask ``m`` (non-zero): a replica, or ``~id`` of its interned set."""
        if m & (m - 1) == 0:
            return m.bit_length() - 1
        s = self._set_id.get(m)
        if s is not None:
            return ~s
        if self._set_free:
            s = self._set_free.pop()
            self._set_mask[s] = m
        else:
            s = len(self._set_mask)
            self._set_mask.append(m)
            if s >= self._setbits.shape[0]:
                grown = np.zeros((2 * self._setbits.shape[0], self._words), dtype=np.uint64)
                grown[:s] = self._setbits
                self._setbits = grown
        self._setbits[s] = self._row(m)
        self._set_id[m] = s
        self._set_bytes += sys.getsizeof(m) + _SET_OVERHEAD
        self._sets_grew = True
        return ~s

    def _row(self, m: int) -> np.ndarray:
        """Holder mask ``m`` as a row of ``_setbits`` (uint64 words, replica ``r`` = bit ``r % 64`` of word ``r // 64``)."""
        return np.frombuffer(m.to_bytes(8 * self._words, "little"), dtype="<u8")

    def _collect_sets(self, used: np.ndarray | None = None) -> None:
        """Free the interned sets no block uses any more (``used``: already marked by a pass over the table);
        renumber them when most rows are free."""
        if not self._set_id:
            return
        if used is None:
            used = np.zeros(len(self._set_mask), dtype=np.bool_)
            T.mark_sets(self._tab, used)
        for s in np.flatnonzero(~used).tolist():
            m = self._set_mask[s]
            if m is not None:
                del self._set_id[m]
                self._set_mask[s] = None
                self._set_free.append(s)
                self._set_bytes -= sys.getsizeof(m) + _SET_OVERHEAD
        live = len(self._set_id)
        if self._setbits.shape[0] > 64 and 4 * live < self._setbits.shape[0]:
            self._compact_sets()

    def _compact_sets(self) -> None:
        """Renumber the live sets 0..k-1 and shrink the bit rows to fit (the byte budget counts them)."""
        remap = ~np.arange(len(self._set_mask), dtype=np.int64)
        masks = [m for m in self._set_mask if m is not None]
        for new, m in enumerate(masks):
            remap[self._set_id[m]] = ~new
        T.remap_holders(self._tab, remap, -1, self._shift, self._mask)
        rows = np.zeros((max(16, 2 * len(masks)), self._words), dtype=np.uint64)
        for new, m in enumerate(masks):
            rows[new] = self._row(m)
        self._setbits = rows
        self._set_mask = list(masks)
        self._set_id = {m: s for s, m in enumerate(masks)}
        self._set_free = []

    def _learn(self, nmemo: int, mask: int) -> int:
        """A pass stopped (``NEED``) at a block whose holders (``_state[2]``) must become ``mask``: intern it
        and add old -> new to the memo the pass is called with again.  Returns the memo's new length."""
        if nmemo == _MEMO:
            nmemo = 0
        self._memo_k[nmemo], self._memo_v[nmemo] = self._state[2], self._intern(mask)
        return nmemo + 1

