"""A replica's prefix cache as its engine's KV events describe it: the blocks it holds, exactly.

vLLM publishes the changes of its prefix cache when started with ``--kv-events-config`` (off by default;
``vllm/distributed/kv_events.py``): ``BlockStored`` (the hashes of blocks that became cached, with their
parent's hash and token ids), ``BlockRemoved`` (hashes evicted) and ``AllBlocksCleared``, batched per
scheduler step.  NVIDIA Dynamo's KV router builds its overlap index from them, and llm-d's
precise-prefix-cache-scorer too, instead of guessing what each engine still holds from what was routed
there (the approximate prefix index: :mod:`steersman.fleet.prefix_index`, generations evicted as a whole).

:class:`KvEventMirror` is one replica's cache as those events leave it: a set of block hashes.  The prefix
index takes the replica's match from it (:meth:`PrefixIndex.mirror_events`) in place of its own table, so
predictions, saturation and the accounting read what the engine holds now, evictions included; all the mirrors
also list what they hold in one :class:`EventHolders` (a block hash -> the replicas holding it), which answers a
decision for every mirrored replica at once.  Hashes are chained (equal hashes, equal prefixes), and an engine's
cache is prefix-closed along a chain (vLLM frees a request's blocks tail first, and a block's holders hold every
block before it, so a deeper block never outlives a shallower one of the same chain), so a prompt's match is found
by binary search.  The
digital twin feeds it from the engine model's pool (:class:`steersman.sim.kvcache.KVPool`'s ``listener``);
hashes are the gateway's own (the engine model and engine-sim hash blocks as the gateway does).  An engine that
tokenizes otherwise publishes hashes no prompt of the gateway's has: :meth:`KvEventMirror.observe` tells, from the
engine's own reports of prefix hits, when to stop reading them.  Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from steersman.config import DEFAULTS
from steersman.fleet.slots import common_blocks

__all__ = ["EventHolders", "KvEventMirror"]


class EventHolders:
    """What every events-mirrored replica holds, as one index: a block hash -> the bitmask of the replicas whose
    events say they hold it (``masks``), and a prompt's first block -> the replicas with a prompt beginning with it
    routed there and not yet cached (``pending``, reference counts).  A decision then costs a few lookups per run of
    blocks with the same holders (:meth:`match_into`), not one binary search per replica: in the twin at 1,000 GPUs
    ~290 replicas held each prompt's system prompt (bench/README, twenty-fifth session)."""

    __slots__ = ("masks", "pending", "hit", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.masks: dict[int, int] = {}
        self.pending: dict[int, dict[int, int]] = {}
        self.hit = 0  # replicas some prompt matched held blocks of (KvEventMirror.observe)

    def hold(self, hashes: Iterable[int], bit: int) -> None:
        masks = self.masks
        get = masks.get
        for h in hashes:
            masks[h] = get(h, 0) | bit

    def drop(self, hashes: Iterable[int], bit: int) -> None:
        masks = self.masks
        keep = ~bit
        for h in hashes:
            v = masks.get(h)
            if v is not None:
                v &= keep
                if v:
                    masks[h] = v
                else:
                    del masks[h]

    def pend(self, h: int, replica: int) -> None:
        d = self.pending.get(h)
        if d is None:
            self.pending[h] = {replica: 1}
        else:
            d[replica] = d.get(replica, 0) + 1

    def unpend(self, h: int, replica: int) -> None:
        d = self.pending.get(h)
        if d is None or replica not in d:
            return
        if d[replica] > 1:
            d[replica] -= 1
        else:
            del d[replica]
            if not d:
                del self.pending[h]

    def holders(self, h: int) -> set[int]:
        """The replicas holding block ``h``, or with a prompt beginning with it pending."""
        return set(_indices(self.masks.get(h, 0), self.n).tolist()) | set(self.pending.get(h, ()))

    def match_into(self, hashes: Sequence[int], out: np.ndarray, mirrors: dict[int, KvEventMirror]) -> None:
        """Each mirrored replica's match of ``hashes`` into ``out`` (the others' entries untouched; ``out`` holds
        zeros for the mirrored ones).  Walks the prompt over runs of blocks with the same holders, the end of each
        found by binary search (an engine's cache is prefix-closed along a chain; with a hole the walk lands past it
        or at it, never before a replica's leading run); then the pending prompts."""
        masks = self.masks
        n = len(hashes)
        if not n:
            return
        cur = masks.get(hashes[0], 0)
        if cur:
            self.hit |= cur
        pos = 1
        while cur:
            last = masks.get(hashes[n - 1], 0) & cur
            if last == cur:  # (also n == 1)
                _assign(out, cur, n, self.n)
                break
            lo, hi = pos, n - 1  # the first block not held by all of cur is in [lo, hi]
            while lo < hi:
                mid = (lo + hi) // 2
                if masks.get(hashes[mid], 0) & cur == cur:
                    lo = mid + 1
                else:
                    hi = mid
            nxt = masks.get(hashes[lo], 0) & cur
            _assign(out, cur & ~nxt, lo, self.n)
            cur, pos = nxt, lo + 1
        pend = self.pending.get(hashes[0])
        if pend:
            for r in pend:
                routed = mirrors[r].routed(hashes)
                if routed > out[r]:
                    out[r] = routed


def _indices(mask: int, n: int) -> np.ndarray:
    if mask & (mask - 1) == 0:
        return np.array([mask.bit_length() - 1] if mask else [], dtype=np.intp)
    bits = np.unpackbits(np.frombuffer(mask.to_bytes((n + 7) // 8, "little"), dtype=np.uint8), bitorder="little")
    return np.flatnonzero(bits[:n])


def _assign(out: np.ndarray, mask: int, value: int, n: int) -> None:
    if mask & (mask - 1) == 0:
        out[mask.bit_length() - 1] = value
    else:
        out[_indices(mask, n)] = value


class KvEventMirror:
    """The block hashes one replica's prefix cache holds, from its KV events."""

    __slots__ = ("_held", "_copies", "on_change", "stored_events", "removed_events", "cleared_events", "confirmed",
                 "unconfirmed", "mismatch_after", "_pending", "_hit", "_index", "_replica", "_bit")

    def __init__(self, mismatch_after: int = DEFAULTS.scheduler.kv_events_mismatch_after) -> None:
        self._held: set[int] = set()
        # block -> copies held beyond the first: an engine may cache one block twice (vLLM: two requests computed the
        # same prefix at once; its BlockPool keeps both and announces the storing and the eviction of each)
        self._copies: dict[int, int] = {}
        self.on_change: Callable[[], None] | None = None  # the prefix index's memo goes stale
        self.stored_events = self.removed_events = self.cleared_events = 0
        self.confirmed = self.unconfirmed = 0  # engine-reported prefix hits the mirror had / had not predicted
        self._hit = False  # a prompt ever matched blocks its events stored (not only ones routed here)
        self.mismatch_after = mismatch_after
        self._pending: dict[int, Sequence[int]] = {}  # ticket key -> prompt hashes routed here, no first token yet
        self._index: EventHolders | None = None  # the index shared by the fleet's mirrors (attach)
        self._replica = -1
        self._bit = 0

    def attach(self, replica: int, index: EventHolders) -> None:
        """List what this mirror (replica ``replica``) holds and expects in ``index``, and keep it listed."""
        self.detach()
        self._index, self._replica, self._bit = index, replica, 1 << replica
        index.hold(self._held, self._bit)
        for p in self._pending.values():
            if len(p):
                index.pend(p[0], replica)

    def detach(self) -> None:
        self._unlist()
        self._index = None

    def _unlist(self) -> None:
        """Take what this mirror holds and expects out of the shared index (if attached)."""
        index = self._index
        if index is None:
            return
        if self._hit_in_index():
            self._hit = True
        index.drop(self._held, self._bit)
        for p in self._pending.values():
            if len(p):
                index.unpend(p[0], self._replica)

    def _hit_in_index(self) -> bool:
        return self._index is not None and bool(self._index.hit & self._bit)

    def __len__(self) -> int:
        return len(self._held)

    def holds(self, h: int) -> bool:
        """Is block ``h`` held (its events stored it and did not remove it)?"""
        return h in self._held

    # -- events (vLLM's BlockStored / BlockRemoved / AllBlocksCleared) --------------------------------
    def stored(self, hashes: Sequence[int], parent: int | None = None) -> None:
        """``hashes`` became cached (``parent``: the hash of the block before the first, None at a prompt's start);
        a block held already is another copy of it."""
        held = self._held
        if not held.isdisjoint(hashes):
            copies = self._copies
            for h in hashes:
                if h in held:
                    copies[h] = copies.get(h, 0) + 1
        held.update(hashes)
        if self._index is not None:
            self._index.hold(hashes, self._bit)
        self.stored_events += 1
        if self.on_change is not None:
            self.on_change()

    def removed(self, hashes: Sequence[int]) -> None:
        """A copy of each of ``hashes`` was evicted: a block goes with its last copy."""
        copies = self._copies
        if copies:
            gone = []
            for h in hashes:
                extra = copies.get(h)
                if extra is None:
                    gone.append(h)
                elif extra > 1:
                    copies[h] = extra - 1
                else:
                    del copies[h]
            hashes = gone
        self._held.difference_update(hashes)
        if self._index is not None:
            self._index.drop(hashes, self._bit)
        self.removed_events += 1
        if self.on_change is not None:
            self.on_change()

    def cleared(self) -> None:
        self._unlist()
        self._held.clear()
        self._copies.clear()
        self._pending.clear()
        self.cleared_events += 1
        if self.on_change is not None:
            self.on_change()

    clear = cleared  # the prefix index's forget_replica (the engine restarted: nothing held)

    # -- prompts routed here, not cached yet ----------------------------------------------------------
    def expect(self, key: int, hashes: Sequence[int]) -> None:
        """A prompt was routed here: credit its blocks until its first token (by then its engine has scheduled
        it, and its events show what it cached).  Without this a burst of one prefix spread over the fleet before
        its first request was cached (bench/peers, engine-sim fleet: hit rate 84.3% against 85.4% from routing
        alone)."""
        old = self._pending.get(key)
        self._pending[key] = hashes
        if self._index is not None:
            if old is not None and len(old):
                self._index.unpend(old[0], self._replica)
            if len(hashes):
                self._index.pend(hashes[0], self._replica)
        if self.on_change is not None:
            self.on_change()

    def settle(self, key: int) -> None:
        p = self._pending.pop(key, None)
        if p is None:
            return
        if self._index is not None and len(p):
            self._index.unpend(p[0], self._replica)
        if self.on_change is not None:
            self.on_change()

    def observe(self, predicted_blocks: int, reported_blocks: int) -> bool:
        """The engine reported a request's prefix hit; True once its hashes are evidently not the gateway's: it
        reported ``mismatch_after`` hits that the mirror had not predicted and the mirror never predicted one
        (``SchedulerSettings.kv_events_mismatch_after``).  A prediction counts only once some prompt has matched
        what the events stored: the credit for prompts routed here (:meth:`expect`) would otherwise confirm events
        that never matched anything."""
        if reported_blocks > 0:
            if predicted_blocks > 0 and (self._hit or self._hit_in_index()):
                self.confirmed += 1
            else:
                self.unconfirmed += 1
        return not self.confirmed and self.unconfirmed >= self.mismatch_after

    # -- reads --------------------------------------------------------------------------------------
    def match(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica holds, or will once a prompt routed here is scheduled (the index
        asks :class:`EventHolders` for every mirror at once; this is one mirror's answer, the same)."""
        return max(self.held(hashes), self.routed(hashes))

    def routed(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` shared with a prompt routed here and not yet cached."""
        m = 0
        if self._pending and len(hashes):
            first = hashes[0]
            for p in self._pending.values():
                if len(p) and p[0] == first:  # chained hashes: a prompt that begins otherwise shares nothing
                    m = max(m, common_blocks(hashes, p))
        return m

    def held(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica holds (binary search: the cache is prefix-closed)."""
        held = self._held
        n = len(hashes)
        if not n or hashes[0] not in held:
            return 0
        self._hit = True
        if hashes[n - 1] in held:
            return n
        lo, hi = 1, n - 1  # the answer is in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in held:
                lo = mid
            else:
                hi = mid - 1
        return lo
