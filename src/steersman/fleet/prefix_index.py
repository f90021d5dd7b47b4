"""The approximate prefix index: which replica probably holds which prompt blocks, in bounded memory.

Learned from the gateway's own routing (:meth:`PrefixIndex.record`: the request's
blocks now live where it was sent) and corrected by what engines report
(:meth:`PrefixIndex.correct`, :meth:`PrefixIndex.forget_replica`).  Keys are the
chained 16-token block hashes of :func:`steersman.text.block_hashes`, so a hash
stands for its whole prefix.

**Memory is bounded** (peer routers' trees grow until OOM).  The blocks live in one compiled
open-addressing table (:mod:`steersman.fleet._prefix_table`: 16 bytes a slot, at most half full, so
~32 bytes a block where a dict per generation took ~80) that grows by doubling up to the size the
budget allows.  Eviction is a *generational* LRU: every block carries the generation that last touched
it; ``record`` moves the blocks it touches into the newest one (in place: a byte of the slot), and when
the newest has taken ``gen_cap`` blocks a new one starts; with eight generations in use the oldest is
dropped whole.  That is LRU at the granularity of an eighth of the capacity.

Holder sets of several replicas are interned: each distinct set is a row of bits shared by every
block it holds (and a Python int for the interning), counted in the budget; if the sets push the
total over it, the oldest generation goes early and the sets no block uses any more are freed.

**Matching is O(log n) lookups, not O(n).**  Because hashes are chained, a
replica holding block *i* almost always holds blocks ``< i`` (blocks of one
request enter and leave a generation together; engines evict leaves first).
:meth:`match` walks the prompt over runs of blocks with the same holder set and
binary-searches the end of each run.  It is exact when every holder set covers
one contiguous run of the prompt; a block dropped alone in the middle of a run
(e.g. by :meth:`correct` on a shorter prompt) can be jumped over, crediting a
replica with blocks past its hole.

Forgetting a replica rewrites its holder sets and frees the blocks it held alone: one compiled pass
over the table (a few ms at the default budget; engines restart rarely).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from steersman.fleet import _prefix_table as T
from steersman.fleet._prefix_reads import PrefixReads
from steersman.fleet.slots import SlotMirror

__all__ = ["PrefixIndex"]

#: Share of the budget the index's own structures may use.  The rest is left to the allocators.
_STRUCTURES = 0.9
#: Share of the structures' budget the table may take at its largest; the holder sets have the rest.
_TABLE_SHARE = 0.75
_GENS = 8  # generations (slot byte values 0..7)
_SLOT_BYTES = 16  # key + packed value
_MIN_SLOTS, _START_SLOTS = 1024, 1 << 14
_MEMO = 32  # old holder value -> new, per write
_SET_OVERHEAD = 120  # per interned set beyond its bit row and its Python int: dict slot, list slot, key share


class PrefixIndex(PrefixReads):
    """Bounded approximate map of block hash -> replicas holding it (see the module doc)."""

    def __init__(self, n_replicas: int, max_bytes: float) -> None:
        if n_replicas < 1:
            raise ValueError("n_replicas must be >= 1")
        self.n = n_replicas
        self.max_bytes = float(max_bytes)
        self._budget = _STRUCTURES * self.max_bytes
        self._words = (n_replicas + 63) // 64
        self._fixed = 8 * n_replicas * (_GENS + 2) + 4096
        room = _TABLE_SHARE * self._budget - self._fixed
        if room < _SLOT_BYTES * _MIN_SLOTS:
            raise ValueError(f"prefix index budget of {self.max_bytes:.0f} bytes is too small")
        self._max_slots = 1 << int(np.log2(room / _SLOT_BYTES))
        self.gen_cap = self._max_slots // (2 * _GENS)  # eight full generations fill half the largest table
        self._counts = np.zeros((_GENS, n_replicas), dtype=np.int64)
        self._total = np.zeros(n_replicas, dtype=np.int64)  # changed in place only (see blocks_view)
        self._total_view = self._total.view()
        self._total_view.flags.writeable = False
        self._order = [0]  # generation slots in use, oldest first
        self._free = list(range(_GENS - 1, 0, -1))
        self._inserts = 0  # blocks that entered the newest generation
        self._entries = 0
        self._alloc(min(self._max_slots, _START_SLOTS))
        # interned holder sets: mask (Python int) <-> id; row id of _setbits
        self._set_id: dict[int, int] = {}
        self._set_mask: list[int | None] = []
        self._set_free: list[int] = []
        self._set_bytes = 0
        self._sets_grew = False  # a set was interned since the last budget check
        self._setbits = np.zeros((16, self._words), dtype=np.uint64)
        self._alive = np.empty(self._words, dtype=np.uint64)
        self._state = np.zeros(3, dtype=np.int64)
        self._memo_k = np.empty(_MEMO, dtype=np.int64)
        self._memo_v = np.empty(_MEMO, dtype=np.int64)
        self._arr_memo: tuple | None = None
        self._later: list[tuple[int, Sequence[int]]] = []  # records to apply before the next access (record_later)
        self._memo: tuple | None = None  # (hashes object, its length, match result) until the next write
        #: replicas whose engine reuses a prompt only from a free slot (llama.cpp): their match is the mirror's
        self.slots: dict[int, SlotMirror] = {}

    def _alloc(self, slots: int) -> None:
        self._tab = np.full((slots, 2), T.EMPTY, dtype=np.int64)
        self._shift = np.uint64(64 - (slots.bit_length() - 1))
        self._mask = slots - 1

    def mirror_slots(self, replica: int, mirror: SlotMirror) -> None:
        """``replica``'s match comes from ``mirror`` (what its free slots and prompt cache would reuse now)."""
        self.slots[replica] = mirror
        mirror.on_change = self._stale
        self._memo = None

    def _stale(self) -> None:
        self._memo = None

    # ---- capacity -----------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Blocks held when every generation is full."""
        return self.gen_cap * _GENS

    def __len__(self) -> int:
        self.flush()
        return self._entries

    def nbytes_estimate(self) -> int:
        """Bytes held now: the table, the holder sets (bit rows, ints, interning), the count arrays."""
        self.flush()
        return int(self._bytes())

    def _bytes(self) -> float:
        return self._fixed + self._tab.nbytes + self._setbits.nbytes + self._set_bytes

    def _grow(self, need: int) -> None:
        """Double the table until ``need`` more keys keep it at most half full (up to the largest size)."""
        slots = self._tab.shape[0]
        want = slots
        while 2 * (self._entries + need) > want and want < self._max_slots:
            want *= 2
        if want == slots:
            return
        old = self._tab
        self._alloc(want)
        T.insert_all(self._tab, old, self._shift, self._mask)

    def _rotate(self) -> None:
        if not self._free:
            self._drop()
        self._order.append(self._free.pop())
        self._inserts = 0

    def _drop(self) -> None:
        g = self._order.pop(0)
        used = np.zeros(len(self._set_mask), dtype=np.bool_)
        self._entries -= T.drop_generation(self._tab, g, used, self._shift, self._mask)
        self._total -= self._counts[g]
        self._counts[g] = 0
        self._free.append(g)
        self._collect_sets(used)

    def _trim(self) -> None:
        """Drop the oldest generations while the holder sets push the bytes over the budget."""
        while self._bytes() > self._budget and self._entries:
            if len(self._order) == 1:  # the newest alone overflows: start over
                self._drop()
                self._order.append(self._free.pop())
                self._inserts = 0
            else:
                self._drop()

    # ---- holder sets --------------------------------------------------------
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

    def _arr(self, hashes: Sequence[int]) -> np.ndarray:
        """``hashes`` as int64 (a tuple's conversion is kept for the next call with the same tuple)."""
        a = getattr(hashes, "array", None)  # steersman.text.BlockHashes
        if a is not None:
            return a
        if isinstance(hashes, np.ndarray):
            return hashes.astype(np.int64, copy=False)
        m = self._arr_memo
        if m is not None and m[0] is hashes:
            return m[1]
        a = np.array(hashes, dtype=np.int64) if len(hashes) else np.empty(0, dtype=np.int64)
        if isinstance(hashes, tuple):
            self._arr_memo = (hashes, a)
        return a

    # ---- writes (the IO edge) ----------------------------------------------
    def record_later(self, replica: int, hashes: Sequence[int]) -> None:
        """:meth:`record`, applied at :meth:`flush` or before the index is next read or written, whichever
        comes first: every reader sees the index as if it had been recorded now, and the caller chooses when
        the work is done (the gateway: once the request's bytes are on their way to the engine, off its time
        to first token)."""
        self._later.append((replica, hashes))

    def flush(self) -> None:
        """Apply the records :meth:`record_later` kept, in their order."""
        while self._later:
            later, self._later = self._later, []
            for replica, hashes in later:
                self._record_now(replica, hashes)

    def record(self, replica: int, hashes: Sequence[int]) -> None:
        """The request was routed to ``replica``: its blocks now live there (and are the most recent)."""
        self.flush()
        self._record_now(replica, hashes)

    def _record_now(self, r: int, hashes: Sequence[int]) -> None:
        self._memo = None
        a = self._arr(hashes)
        n = a.size
        if not n:
            return
        st, memo_k, memo_v = self._state, self._memo_k, self._memo_v
        pos, nmemo = -1, 0  # -1: the pass starts after what the newest generation already credits to r
        while pos < n:
            room = self.gen_cap - self._inserts
            if room <= 0:
                self._rotate()
                nmemo = 0  # a dropped generation may have freed the sets the memo names
                continue
            if 2 * (self._entries + min(n - max(pos, 0), room)) > self._tab.shape[0]:
                self._grow(min(n - max(pos, 0), room))
            pos, status = T.record_pass(self._tab, self._setbits, self._counts, self._total, a, pos, r,
                                        self._order[-1], room, memo_k, memo_v, nmemo, self._shift, self._mask, st)
            self._inserts += int(st[0])
            self._entries += int(st[1])
            if status == T.NEED:
                nmemo = self._learn(nmemo, self._mask_of(int(st[2])) | 1 << r)
        if self._inserts >= self.gen_cap:
            self._rotate()
        if self._sets_grew:
            self._check_budget()

    def _check_budget(self) -> None:
        self._sets_grew = False
        if self._bytes() > self._budget:
            self._trim()

    def _learn(self, nmemo: int, mask: int) -> int:
        """A pass stopped (``NEED``) at a block whose holders (``_state[2]``) must become ``mask``: intern it
        and add old -> new to the memo the pass is called with again.  Returns the memo's new length."""
        if nmemo == _MEMO:
            nmemo = 0
        self._memo_k[nmemo], self._memo_v[nmemo] = self._state[2], self._intern(mask)
        return nmemo + 1

    def correct(self, replica: int, hashes: Sequence[int], cached_blocks: int) -> None:
        """The engine reported that only the first ``cached_blocks`` blocks of ``hashes`` were cached on
        ``replica`` (e.g. ``usage.prompt_tokens_details.cached_tokens // block_size``): add the replica
        to those blocks and drop it from the later ones the index had predicted."""
        self.flush()
        self._memo = None
        k = max(0, min(int(cached_blocks), len(hashes)))
        if k:
            self.record(replica, hashes[:k])
        a = self._arr(hashes)
        st, memo_k, memo_v = self._state, self._memo_k, self._memo_v
        pos, nmemo, bit = k, 0, 1 << replica
        while pos < a.size:
            pos, status = T.remove_pass(self._tab, self._setbits, self._counts, self._total, a, pos, replica,
                                        memo_k, memo_v, nmemo, self._shift, self._mask, st)
            self._entries -= int(st[1])
            if status == T.NEED:
                nmemo = self._learn(nmemo, self._mask_of(int(st[2])) & ~bit)
        self._collect_sets()
        self._check_budget()

    def forget_replica(self, replica: int) -> None:
        """The replica's KV cache is gone (restart, weights reload): it holds nothing from now on."""
        self.flush()
        self._memo = None
        mirror = self.slots.get(replica)
        if mirror is not None:
            mirror.clear()
        bit = 1 << replica
        remap = ~np.arange(len(self._set_mask), dtype=np.int64)  # unchanged unless the set holds the replica
        for s, m in enumerate(self._set_mask):
            if m is not None and m & bit:
                remap[s] = self._intern(m & ~bit)
        self._entries -= T.remap_holders(self._tab, remap, replica, self._shift, self._mask)
        self._counts[:, replica] = 0
        self._total[replica] = 0
        self._collect_sets()
        self._check_budget()
