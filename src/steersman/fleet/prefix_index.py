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

**What the engines still hold** (:mod:`steersman.fleet._prefix_residency`, ``scheduler.prefix_residency``): with
each replica's KV capacity set, :meth:`match` credits a replica only with the newest generations its cache can
hold (an engine's LRU, at generation granularity; generations then take at most a quarter of the fleet's cache),
and :meth:`match_raw` with everything it was sent.

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

**What a replica would reuse** (:meth:`reusable`, what the policy and the dispatch read) is the match capped at
``(prompt_tokens - 1) // block_size`` blocks: an engine computes a prompt's last token whatever it holds, so of
a prompt of exactly ``k`` blocks it reuses ``k - 1`` (the index still holds all ``k``).

Forgetting a replica rewrites its holder sets and frees the blocks it held alone: one compiled pass
over the table (a few ms at the default budget; engines restart rarely).

**Off the event loop** (``background=True``, the gateway's index).  Dropping a generation scans the whole
table (~30 ms at the default budget's 4M slots on a 2-core VM, once per ``gen_cap`` recorded blocks) and
growing it rehashes every block (13-105 ms for the last doublings): run on the gateway's loop, each froze
every stream in flight that long; forgetting a replica (its engine restarted) took two passes, ~70 ms.  In
the background a worker thread runs those compiled passes (they release the GIL; see
:mod:`steersman.fleet._prefix_jobs` for why it never waits for the GIL) while the loop goes on: records
wait in order (``record_later``'s list, applied ``_REPLAY`` an access once the pass is done; a record cut
by it is applied again whole, which moves its first blocks to the newest generation too), reads during a
drop or a forget match nothing (the table is being rewritten; routing falls back on load for those few
milliseconds) and reads during a growth read the old table (the pass only reads it).  Tables under
``_BACKGROUND_FROM`` slots keep their passes inline.  The twin keeps every pass inline
(``background=False``): the same results, on its virtual clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import logging
import math

import numpy as np

from steersman.fleet import _prefix_table as T
from steersman.fleet._prefix_generations import Generations, _geometry
from steersman.fleet._prefix_jobs import BackgroundPasses
from steersman.fleet._prefix_reads import PrefixReads
from steersman.fleet._prefix_residency import Residency
from steersman.fleet._prefix_sets import _MEMO, HolderSets
from steersman.fleet.kv_events import EventHolders, KvEventMirror
from steersman.fleet.slots import SlotMirror

__all__ = ["PrefixIndex"]

log = logging.getLogger("steersman.fleet")

#: Share of the budget the index's own structures may use.  The rest is left to the allocators.
_STRUCTURES = 0.9
#: Share of the structures' budget the table may take at its largest; the holder sets have the rest.
_TABLE_SHARE = 0.75
_GENS = 8  # generations (slot byte values 0..7)
_SLOT_BYTES = 16  # key + packed value
_MIN_SLOTS, _START_SLOTS = 1024, 1 << 14
#: Tables this big or bigger have their full passes on the worker (``background=True``): a pass over a smaller
#: one takes ~2 ms or less, not worth holding records back for (the growths from 16K slots come every few).
_BACKGROUND_FROM = 1 << 18
#: Records applied per access after a background pass (the rest on the next accesses): a pass of 30-100 ms on a
#: loaded gateway keeps tens to hundreds waiting, and applying them all at once would be a stall of its own.
_REPLAY = 16


class PrefixIndex(PrefixReads, HolderSets, BackgroundPasses, Residency, Generations):
    """Bounded approximate map of block hash -> replicas holding it (see the module doc)."""

    def __init__(self, n_replicas: int, max_bytes: float, background: bool = False,
                 background_from_slots: int = _BACKGROUND_FROM) -> None:
        if n_replicas < 1:
            raise ValueError("n_replicas must be >= 1")
        self.n = n_replicas
        self.max_bytes = float(max_bytes)
        self._budget = _STRUCTURES * self.max_bytes
        self._words = (n_replicas + 63) // 64
        self._fixed = 8 * n_replicas * (_GENS + 2) + 4096
        room = _TABLE_SHARE * self._budget - self._fixed
        if room < _SLOT_BYTES * _MIN_SLOTS:
            least = math.ceil(1000 * (_SLOT_BYTES * _MIN_SLOTS + self._fixed) / (_TABLE_SHARE * _STRUCTURES) / 2**20)
            raise ValueError(f"prefix index budget of {self.max_bytes:.0f} bytes is too small for {n_replicas} "
                             f"replicas (scheduler.prefix_index_max_mib: at least {least / 1000:.3f} MiB)")
        self._max_slots = 1 << int(np.log2(room / _SLOT_BYTES))
        self._max_gen_cap = self._max_slots // (2 * _GENS)  # eight full generations fill half the largest table
        self.gen_cap = self._max_gen_cap
        self._counts = np.zeros((_GENS, n_replicas), dtype=np.int64)
        self._total = np.zeros(n_replicas, dtype=np.int64)  # changed in place only (see blocks_view)
        self._total_view = self._total.view()
        self._total_view.flags.writeable = False
        self._init_residency()
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
        self._reuse_memo: list = [None, None]  # reusable's capped copies of the match, of match_raw
        #: replicas whose match is a mirror's: a llama.cpp engine's slots (it reuses a prompt only from a free slot)
        self.slots: dict[int, SlotMirror] = {}
        #: or an engine's KV events (what it holds, exactly); ``holders``: what all of them hold, as one index
        self.events: dict[int, KvEventMirror] = {}
        self.holders = EventHolders(n_replicas)
        self._table_read = True  # some replica's match is the table's (not every one mirrored)
        # background passes (see the module doc): the worker, the pass running, what finishes it on the caller's thread
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefix-index") if background else None
        self._background_from = background_from_slots  # smaller tables: passes inline
        self._job: Future | None = None
        self._job_done: Callable[[np.ndarray], None] | None = None
        self._readable = True  # False while a background pass rewrites the table: reads match nothing

    def _alloc(self, slots: int) -> None:
        self._tab = np.full((slots, 2), T.EMPTY, dtype=np.int64)
        self._shift, self._mask = _geometry(slots)

    def mirror_slots(self, replica: int, mirror: SlotMirror) -> None:
        """``replica``'s match comes from ``mirror`` (what its free slots and prompt cache would reuse now)."""
        self.slots[replica] = mirror
        mirror.on_change = self._stale
        self._mirrors_changed()

    def mirror_events(self, replica: int, mirror: KvEventMirror) -> None:
        """``replica``'s match comes from its engine's KV events (:mod:`steersman.fleet.kv_events`): what it
        holds now, exactly; what is routed there is not recorded."""
        if self._entries and replica not in self.events:
            self.forget_replica(replica)  # what routing taught the table about it
        self.events[replica] = mirror
        mirror.attach(replica, self.holders)
        mirror.on_change = self._stale
        self._mirrors_changed()

    def unmirror_events(self, replica: int) -> None:
        """``replica`` is learnt from routing again (its KV events do not describe its cache, or cannot be read)."""
        ev = self.events.pop(replica, None)
        if ev is not None:
            ev.detach()
            ev.on_change = None
            self._mirrors_changed()

    def _mirrors_changed(self) -> None:
        """Whether the table still answers for some replica: a replica may be both slot- and events-mirrored
        (a llama.cpp endpoint naming ``kv_events``), so the mirrors are counted once each."""
        self._table_read = len(self.slots.keys() | self.events.keys()) < self.n
        self._memo = None

    def expect(self, replica: int, key: int, hashes: Sequence[int]) -> bool:
        """A prompt routed to ``replica`` (ticket ``key``): True if its KV events will say when it is cached (it is
        credited there until :meth:`settle_expected`), False if the index should record it."""
        ev = self.events.get(replica)
        if ev is not None:
            ev.expect(key, hashes)
        return ev is not None

    def settle_expected(self, replica: int, key: int) -> None:
        """The prompt of ticket ``key`` got its first token (or left): its replica's events tell from now on."""
        ev = self.events.get(replica)
        if ev is not None:
            ev.settle(key)

    def observe_hits(self, replica: int, predicted_blocks: int, reported_blocks: int) -> None:
        """The engine reported a request's prefix hit: a replica whose KV events never predict its hits (their hashes
        are not the gateway's) is read from routing again (:meth:`KvEventMirror.observe`)."""
        ev = self.events.get(replica)
        if ev is not None and ev.observe(predicted_blocks, reported_blocks):
            self.unmirror_events(replica)
            log.warning("replica %d: its KV events matched none of %d prefix hits its engine reported (its block hashes "
                        "are not the gateway's: another tokenizer?); the index learns it from routing instead",
                        replica, ev.unconfirmed)

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
        to first token).  Nothing for a replica whose KV events say what it holds (:meth:`mirror_events`)."""
        if replica not in self.events:
            self._later.append((replica, hashes))

    def flush(self) -> None:
        """Apply the records :meth:`record_later` kept, in their order.  With background passes: none while a
        pass runs, and at most ``_REPLAY`` a call after one (see the module doc)."""
        if self._pool is not None:
            self._replay(_REPLAY)
            return
        while self._later:
            later, self._later = self._later, []
            for replica, hashes in later:
                self._record_now(replica, hashes)

    def record(self, replica: int, hashes: Sequence[int]) -> None:
        """The request was routed to ``replica``: its blocks now live there (and are the most recent); nothing for a
        replica whose KV events say what it holds."""
        if replica in self.events:
            return
        if self._pool is not None:
            self._later.append((replica, hashes))
            self.flush()
            return
        self.flush()
        self._record_now(replica, hashes)

    def _record_now(self, r: int, hashes: Sequence[int]) -> bool:
        """True: a background pass had to start before the record could finish (apply it again after)."""
        self._memo = None
        a = self._arr(hashes)
        n = a.size
        if not n:
            return False
        st, memo_k, memo_v = self._state, self._memo_k, self._memo_v
        pos, nmemo = -1, 0  # -1: the pass starts after what the newest generation already credits to r
        while pos < n:
            room = self.gen_cap - self._inserts
            lim = self._gen_limit[r]
            if lim < self.gen_cap:  # r's blocks in the generation: at most half its cache (Residency._caps_changed)
                room = min(room, lim - int(self._counts[self._order[-1], r]))
            if room <= 0:
                if self._rotate():
                    return True
                nmemo = 0  # a dropped generation may have freed the sets the memo names
                continue
            need = min(n - max(pos, 0), room)
            if 2 * (self._entries + need) > self._tab.shape[0]:
                if self._grow(need):
                    return True
                free = self._tab.shape[0] // 2 - self._entries
                if free < need:  # the largest table: never past half full (a probe stops only at a free slot)
                    if free <= 0:
                        if self._make_room():
                            return True
                        nmemo = 0
                        continue
                    room = free
            pos, status = T.record_pass(self._tab, self._setbits, self._counts, self._total, a, pos, r,
                                        self._order[-1], room, memo_k, memo_v, nmemo, self._shift, self._mask, st)
            self._inserts += int(st[0])
            self._entries += int(st[1])
            if status == T.NEED:
                nmemo = self._learn(nmemo, self._mask_of(int(st[2])) | 1 << r)
        if self._inserts >= self.gen_cap and self._rotate():
            return False  # recorded; the next generation starts when the drop is done
        if self._sets_grew:
            self._check_budget()
        return False

    def correct(self, replica: int, hashes: Sequence[int], cached_blocks: int) -> None:
        """The engine reported that only the first ``cached_blocks`` blocks of ``hashes`` were cached on
        ``replica`` (e.g. ``usage.prompt_tokens_details.cached_tokens // block_size``): add the replica
        to those blocks and drop it from the later ones the index had predicted."""
        self.settle()
        self._memo = None
        k = max(0, min(int(cached_blocks), len(hashes)))
        if k:
            self.record(replica, hashes[:k])
            self.settle()  # the record may have started a background pass: the passes below write the table
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
        """The replica's KV cache is gone (restart, weights reload): it holds nothing from now on (with
        background passes: once the pass is done; reads match nothing meanwhile)."""
        self.settle()
        self._memo = None
        mirror = self.slots.get(replica) or self.events.get(replica)
        if mirror is not None:
            mirror.clear()
        bit = 1 << replica
        remap = ~np.arange(len(self._set_mask), dtype=np.int64)  # unchanged unless the set holds the replica
        for s, m in enumerate(self._set_mask):
            if m is not None and m & bit:
                remap[s] = self._intern(m & ~bit)
        self._counts[:, replica] = 0
        self._total[replica] = 0
        if self._pool is None or self._tab.shape[0] < self._background_from:
            self._entries -= T.remap_holders(self._tab, remap, replica, self._shift, self._mask)
            self._collect_sets()
            self._check_budget()
            return
        used = np.zeros(len(self._set_mask), dtype=np.bool_)  # (no set is interned while the pass runs)

        def done(flags) -> None:
            self._entries -= int(flags[2])
            self._collect_sets(used)
            self._check_budget()

        tab, shift, mask = self._tab, self._shift, self._mask  # two passes over the table: ~70 ms at the default budget
        self._start(lambda flags: T.forget_flagged(tab, remap, replica, shift, mask, used, flags), done, readable=False)
