"""A replica's prefix cache as its engine's KV events describe it: the blocks it holds, exactly.

vLLM publishes the changes of its prefix cache when started with ``--kv-events-config`` (off by default;
``vllm/distributed/kv_events.py``): ``BlockStored`` (the hashes of blocks that became cached, with their
parent's hash and token ids), ``BlockRemoved`` (hashes evicted) and ``AllBlocksCleared``, batched per
scheduler step.  NVIDIA Dynamo's KV router builds its overlap index from them, and llm-d's
precise-prefix-cache-scorer too, instead of guessing what each engine still holds from what was routed
there (the approximate prefix index: :mod:`steersman.fleet.prefix_index`, generations evicted as a whole).

:class:`KvEventMirror` is one replica's cache as those events leave it: a set of block hashes.  The prefix
index asks it for the replica's match (:meth:`PrefixIndex.mirror_events`) in place of its own table, so
predictions, saturation and the accounting read what the engine holds now, evictions included.  Hashes are
chained (equal hashes, equal prefixes), and an engine's cache is prefix-closed along a chain (vLLM frees a
request's blocks tail first, and a block's holders hold every block before it, so a deeper block never
outlives a shallower one of the same chain), so a prompt's match is found by binary search.  The
digital twin feeds it from the engine model's pool (:class:`steersman.sim.kvcache.KVPool`'s ``listener``);
hashes are the gateway's own (the engine model and engine-sim hash blocks as the gateway does).  An engine that
tokenizes otherwise publishes hashes no prompt of the gateway's has: :meth:`KvEventMirror.observe` tells, from the
engine's own reports of prefix hits, when to stop reading them.  Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from steersman.config import DEFAULTS
from steersman.fleet.slots import common_blocks

__all__ = ["KvEventMirror"]


class KvEventMirror:
    """The block hashes one replica's prefix cache holds, from its KV events."""

    __slots__ = ("_held", "on_change", "stored_events", "removed_events", "cleared_events", "confirmed", "unconfirmed",
                 "mismatch_after", "_pending", "_hit")

    def __init__(self, mismatch_after: int = DEFAULTS.scheduler.kv_events_mismatch_after) -> None:
        self._held: set[int] = set()
        self.on_change: Callable[[], None] | None = None  # the prefix index's memo goes stale
        self.stored_events = self.removed_events = self.cleared_events = 0
        self.confirmed = self.unconfirmed = 0  # engine-reported prefix hits the mirror had / had not predicted
        self._hit = False  # a prompt ever matched blocks its events stored (not only ones routed here)
        self.mismatch_after = mismatch_after
        self._pending: dict[int, Sequence[int]] = {}  # ticket key -> prompt hashes routed here, no first token yet

    def __len__(self) -> int:
        return len(self._held)

    # -- events (vLLM's BlockStored / BlockRemoved / AllBlocksCleared) --------------------------------
    def stored(self, hashes: Sequence[int], parent: int | None = None) -> None:
        """``hashes`` became cached (``parent``: the hash of the block before the first, None at a prompt's start)."""
        self._held.update(hashes)
        self.stored_events += 1
        if self.on_change is not None:
            self.on_change()

    def removed(self, hashes: Sequence[int]) -> None:
        self._held.difference_update(hashes)
        self.removed_events += 1
        if self.on_change is not None:
            self.on_change()

    def cleared(self) -> None:
        self._held.clear()
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
        self._pending[key] = hashes
        if self.on_change is not None:
            self.on_change()

    def settle(self, key: int) -> None:
        if self._pending.pop(key, None) is not None and self.on_change is not None:
            self.on_change()

    def observe(self, predicted_blocks: int, reported_blocks: int) -> bool:
        """The engine reported a request's prefix hit; True once its hashes are evidently not the gateway's: it
        reported ``mismatch_after`` hits that the mirror had not predicted and the mirror never predicted one
        (``SchedulerSettings.kv_events_mismatch_after``).  A prediction counts only once some prompt has matched
        what the events stored: the credit for prompts routed here (:meth:`expect`) would otherwise confirm events
        that never matched anything."""
        if reported_blocks > 0:
            if predicted_blocks > 0 and self._hit:
                self.confirmed += 1
            else:
                self.unconfirmed += 1
        return not self.confirmed and self.unconfirmed >= self.mismatch_after

    # -- reads --------------------------------------------------------------------------------------
    def match(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica holds, or will once a prompt routed here is scheduled."""
        m = self.held(hashes)
        if self._pending and len(hashes):
            first = hashes[0]
            for p in self._pending.values():
                if len(p) and p[0] == first:  # chained hashes: a prompt that begins otherwise shares nothing
                    m = max(m, common_blocks(hashes, p))
        return m

    def held(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the replica holds (binary search: the cache is prefix-closed)."""
        held = self._held
        lo, hi = 0, len(hashes)
        if not hi or hashes[0] not in held:
            return 0
        self._hit = True
        if hashes[hi - 1] in held:
            return hi
        lo = 1
        hi -= 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in held:
                lo = mid
            else:
                hi = mid - 1
        return lo
