"""The approximate prefix index: which replica probably holds which prompt blocks, in bounded memory.

Learned from the gateway's own routing (:meth:`PrefixIndex.record`: the request's
blocks now live where it was sent) and corrected by what engines report
(:meth:`PrefixIndex.correct`, :meth:`PrefixIndex.forget_replica`).  Keys are the
chained 16-token block hashes of :func:`steersman.text.block_hashes`, so a hash
stands for its whole prefix.

**Memory is bounded** (peer routers' trees grow until OOM).  The layout is a
*generational* LRU: a few plain dicts ``block hash -> holders``, newest last.
``record`` moves the blocks it touches into the newest generation; when that one
is full a new one starts and the oldest is dropped whole.  That is LRU at the
granularity of a generation, at ~80 bytes per block instead of ~270 for an
``OrderedDict`` with per-entry LRU under churn (both measured with tracemalloc),
so ~3x more blocks fit in the same budget.  Capacity comes from measured costs
(bytes per slot of a large dict, bytes per hash object): each generation is a
dict filled exactly to the usable size of its power-of-two table, so it never
over-allocates, and the budget reserves the newest generation's growth and its
last resize.  Holder sets of several replicas are Python-int bitmasks whose
bytes are counted as they are stored; if they push the total over the budget
the oldest generation goes early.  A block held by a single replica (the common
case) stores a per-replica shared object: it costs nothing beyond its key.

A shared filter says which generations may hold a block: one byte per slot,
bit *j* for the generation in slot *j* (a one-hash Bloom filter per generation,
12 bits per block, ~8% false positives each), so a block absent everywhere costs
one byte lookup instead of a cache-missing probe of every generation's dict.

**Matching is O(log n) lookups, not O(n).**  Because hashes are chained, a
replica holding block *i* almost always holds blocks ``< i`` (blocks of one
request enter and leave a generation together; engines evict leaves first).
:meth:`match` walks the prompt over runs of blocks with the same holder set and
binary-searches the end of each run.  It is exact when every holder set covers
one contiguous run of the prompt; a block dropped alone in the middle of a run
(e.g. by :meth:`correct` on a shorter prompt) can be jumped over, crediting a
replica with blocks past its hole.

Forgetting a replica is O(generations): existing generations remember it as
*stale* (masked out on read, stripped when an entry moves) and a fresh
generation starts for what is recorded afterwards.  There are at most eight
generations, so when all are in use a forget drops the oldest (least recently
used) one early; forgets with nothing recorded in between cost no generation.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from steersman.fleet._prefix_reads import PrefixReads, _mask
from steersman.fleet._prefix_sizing import _MAX_GENS, layout, measured_costs
from steersman.fleet.slots import SlotMirror

__all__ = ["PrefixIndex", "measured_costs"]

#: Share of the budget the index's own structures may use.  The rest is left to the allocators:
#: pymalloc arenas and the C heap keep freed memory around, and over 20M inserted blocks the
#: process RSS settled ~8% above the bytes :meth:`PrefixIndex.nbytes_estimate` counts.
_STRUCTURES = 0.9


class _Gen:
    __slots__ = ("d", "bit", "stale", "inserts", "vbytes", "counts")

    def __init__(self, n: int, slot: int) -> None:
        self.d: dict[int, int] = {}
        self.bit = 1 << slot  # this generation's bit in the shared filter
        self.stale = 0  # replicas forgotten after this generation closed (their bits are ignored)
        self.inserts = 0  # keys ever inserted (a dict never reuses the slots of deleted keys)
        self.vbytes = 0  # bytes of multi-replica bitmasks stored here (each counted, shared or not)
        self.counts = np.zeros(n, dtype=np.int64)  # live blocks per replica held in this generation


def _vcost(v: int) -> int:
    return 0 if v <= 256 else sys.getsizeof(v)  # negatives are shared single-replica objects, <=256 cached


class PrefixIndex(PrefixReads):
    """Bounded approximate map of block hash -> replicas holding it (see the module doc)."""

    def __init__(self, n_replicas: int, max_bytes: float) -> None:
        if n_replicas < 1:
            raise ValueError("n_replicas must be >= 1")
        self.n = n_replicas
        self.max_bytes = float(max_bytes)
        self._budget = _STRUCTURES * self.max_bytes
        fixed = 8 * n_replicas * (_MAX_GENS + 2) + 4096
        k, self.gen_cap, self.gens_target = layout(self._budget, fixed)
        self._table_full = measured_costs()[0] * (1 << k)
        self._key_bytes = measured_costs()[1]
        self._filter = bytearray(8 << k)  # slot h mod 8*2**k: bit j set if generation j got such a key
        self._fview = np.frombuffer(self._filter, dtype=np.uint8)
        self._fmask = (8 << k) - 1
        self._free = list(range(_MAX_GENS - 1, 0, -1))  # filter bits not used by a generation
        self._one = [~r for r in range(n_replicas)]  # canonical "held by r only" values, shared by entries
        self._total = np.zeros(n_replicas, dtype=np.int64)  # changed in place only (see blocks_view)
        self._total_view = self._total.view()
        self._total_view.flags.writeable = False
        self._nbytes_mask = (n_replicas + 7) // 8
        self._later: list[tuple[int, Sequence[int]]] = []  # records to apply before the next access (record_later)
        self._gens = [_Gen(n_replicas, 0)]
        self._trim()
        self._memo: tuple | None = None  # (hashes object, its length, match result) until the next write
        #: replicas whose engine reuses a prompt only from a free slot (llama.cpp): their match is the mirror's
        self.slots: dict[int, SlotMirror] = {}

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
        return self.gen_cap * self.gens_target

    def __len__(self) -> int:
        self.flush()
        return sum(len(g.d) for g in self._gens)

    def nbytes_estimate(self) -> int:
        """Bytes held now: dict tables, filters, hash objects, multi-replica bitmasks, count arrays."""
        self.flush()
        gens = self._gens
        per_gen = sum(sys.getsizeof(g.d) + g.vbytes + g.counts.nbytes for g in gens)
        keys = self._key_bytes * sum(len(g.d) for g in gens)
        return int(per_gen + keys + len(self._filter) + self._total.nbytes + 1024)

    def _projected(self) -> float:
        """Bytes once the newest generation is full, including its last table resize."""
        new = self._gens[-1]
        room = self.gen_cap - new.inserts
        return self.nbytes_estimate() - sys.getsizeof(new.d) + 1.5 * self._table_full + self._key_bytes * room

    def _over_budget(self) -> bool:
        """``_projected() > budget``, computed exactly only when a cheap upper bound says it may be.

        Between two exact computations the projection can only grow by the newest generation's
        bitmask bytes: older dicts never grow (pops and replacements do not resize a dict) and only
        lose keys and bitmask bytes, and every key inserted into the newest one was already counted
        in its reserved room.  So the last exact value plus the growth of ``vbytes`` since bounds it."""
        vb = self._gens[-1].vbytes
        if self._proj_at + (vb - self._proj_vbytes) <= self._budget:
            return False
        self._proj_at, self._proj_vbytes = self._projected(), vb
        return self._proj_at > self._budget

    def _rotate(self) -> None:
        if not self._free:
            self._drop()
        self._gens.append(_Gen(self.n, self._free.pop()))
        self._trim()

    def _drop(self) -> None:
        g = self._gens.pop(0)
        self._total -= g.counts
        self._fview &= 0xFF ^ g.bit
        self._free.append(g.bit.bit_length() - 1)

    def _trim(self) -> None:
        gens = self._gens
        while len(gens) > 1 and self._projected() > self._budget:
            self._drop()
        if self._projected() > self._budget:  # the newest alone overflows (its bitmasks): start over
            self._drop()
            self._gens.append(_Gen(self.n, self._free.pop()))
        self._proj_at, self._proj_vbytes = self._projected(), self._gens[-1].vbytes
        self._newest_first = tuple(reversed(gens))
        self._probe = tuple((g.bit, g.d, g.stale) for g in self._newest_first)

    # ---- values -------------------------------------------------------------
    def _canon(self, m: int) -> int | None:
        if m == 0:
            return None
        return self._one[m.bit_length() - 1] if m & (m - 1) == 0 else m

    def _live(self, v: int, stale: int) -> int | None:
        return self._canon(_mask(v) & ~stale) if stale else v

    def _get(self, h: int) -> int | None:
        c = self._filter[h & self._fmask]
        if not c:
            return None
        for bit, d, stale in self._probe:
            if c & bit:
                v = d.get(h)
                if v is not None:
                    return self._live(v, stale) if stale else v
        return None

    # ---- writes (the IO edge) ----------------------------------------------
    def record_later(self, replica: int, hashes: Sequence[int]) -> None:
        """:meth:`record`, applied at :meth:`flush` or before the index is next read or written, whichever
        comes first: every reader sees the index as if it had been recorded now, and the caller chooses when
        the work is done (the gateway: once the request's bytes are on their way to the engine, off its time
        to first token; a long unique prompt's record took 250 us there)."""
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

    def _record_now(self, replica: int, hashes: Sequence[int]) -> None:
        self._memo = None
        hashes = hashes[self._recent_prefix(replica, hashes):]
        i, n = 0, len(hashes)
        while i < n:
            room = self.gen_cap - self._gens[-1].inserts
            if room <= 0:
                self._rotate()
                continue
            self._record(replica, hashes[i : i + room])  # each hash inserts at most one key: no resize
            i += room
        if self._gens[-1].inserts >= self.gen_cap:
            self._rotate()
        elif self._over_budget():
            self._trim()

    def _recent_prefix(self, r: int, hashes: Sequence[int]) -> int:
        """How many leading blocks the newest generation already credits to replica ``r``.

        Blocks are chained, so that is a prefix: a binary search (~log2 n lookups) lets
        a request that repeats or extends a recent prompt record only its new tail.
        """
        nd, bit, one = self._gens[-1].d, 1 << r, self._one[r]
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            v = nd.get(hashes[mid])
            if v is not None and (v == one or (v > 0 and v & bit)):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _record(self, r: int, hashes: Sequence[int]) -> None:
        """One pass over the blocks, O(1) work each: a block the filter has never seen (the common
        case for a new tail) costs one byte lookup; only blocks a generation may hold are probed."""
        bit, one = 1 << r, self._one[r]
        new = self._gens[-1]
        nd, nbit = new.d, new.bit
        filt, fmask = self._filter, self._fmask
        older = self._newest_first[1:]
        added = vbytes = inserts = 0
        memo: dict[int, int] = {}
        moved: dict[tuple[_Gen, int], int] = {}
        fresh: dict[int, int] = {}
        for h in hashes:
            slot = h & fmask
            c = filt[slot]
            if c:
                if c & nbit:
                    v = nd.get(h)
                    if v is not None:  # already recent
                        if v == one or (v > 0 and v & bit):
                            continue
                        nv = memo.get(v)  # another replica's block: add our bit in place
                        if nv is None:
                            nv = memo[v] = _mask(v) | bit
                        nd[h] = nv
                        vbytes += _vcost(nv) - _vcost(v)
                        added += 1
                        continue
                entered = False
                for g in older:  # newest first
                    if not c & g.bit:
                        continue
                    v = g.d.pop(h, None)
                    if v is None:
                        continue
                    g.vbytes -= _vcost(v)
                    if g.stale and (v := self._live(v, g.stale)) is None:
                        continue  # only forgotten replicas held it: new unless an older generation has it
                    moved[g, v] = moved.get((g, v), 0) + 1
                    if v == one or (v > 0 and v & bit):
                        nd[h] = v
                    else:
                        nv = memo.get(v)
                        if nv is None:
                            nv = memo[v] = _mask(v) | bit
                        nd[h] = v = nv
                        added += 1
                    vbytes += _vcost(v)
                    entered = True
                    break
                if entered:
                    filt[slot] = c | nbit
                    inserts += 1
                    continue
                filt[slot] = c | nbit
            else:
                filt[slot] = nbit
            fresh[h] = one  # nowhere: a new block held by this replica alone
        if fresh:  # one update, after the moved blocks (sizes the table as it always did)
            nd.update(fresh)
            inserts += len(fresh)
            added += len(fresh)
        new.inserts += inserts
        new.vbytes += vbytes
        if moved:
            by_gen: dict[_Gen, list[tuple[int, int]]] = {}
            for (g, v), k in moved.items():
                by_gen.setdefault(g, []).append((v, k))
            for g, items in by_gen.items():
                delta = self._weighted_bits(items)
                g.counts -= delta
                new.counts += delta
        if added:
            new.counts[r] += added
            self._total[r] += added

    def correct(self, replica: int, hashes: Sequence[int], cached_blocks: int) -> None:
        """The engine reported that only the first ``cached_blocks`` blocks of ``hashes`` were cached on
        ``replica`` (e.g. ``usage.prompt_tokens_details.cached_tokens // block_size``): add the replica
        to those blocks and drop it from the later ones the index had predicted."""
        self.flush()
        self._memo = None
        k = max(0, min(int(cached_blocks), len(hashes)))
        if k:
            self.record(replica, hashes[:k])
        bit, one = 1 << replica, self._one[replica]
        for h in hashes[k:]:
            for g in self._newest_first:
                v = g.d.get(h)
                if v is not None:
                    break
            else:
                continue
            live = self._live(v, g.stale)
            if live is None or not (live == one or (live > 0 and live & bit)):
                continue
            nv = self._canon(_mask(live) & ~bit)
            if nv is None:
                del g.d[h]
            else:
                g.d[h] = nv
            g.vbytes += _vcost(nv or 0) - _vcost(v)
            g.counts[replica] -= 1
            self._total[replica] -= 1

    def forget_replica(self, replica: int) -> None:
        """The replica's KV cache is gone (restart, weights reload).  O(generations): existing
        generations mask the replica out from now on; what is recorded later starts a new one."""
        self.flush()
        self._memo = None
        mirror = self.slots.get(replica)
        if mirror is not None:
            mirror.clear()
        bit = 1 << replica
        for g in self._gens:
            g.stale |= bit
            g.counts[replica] = 0
        self._total[replica] = 0
        if self._gens[-1].d:
            self._rotate()
        else:
            self._gens[-1].stale = 0
            self._trim()
