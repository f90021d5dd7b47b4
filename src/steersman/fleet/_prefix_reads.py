"""The read side of :class:`~steersman.fleet.prefix_index.PrefixIndex`: matching a prompt against the index, what
each replica would reuse of it (:meth:`PrefixReads.reusable`) and blocks per replica.

A mixin: it reads the index's table through the compiled :func:`~steersman.fleet._prefix_table.match_pass`, and
flushes the records kept by ``record_later`` before it reads (see the index's module doc for the layout and the
match's approximation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from steersman.fleet import _prefix_table as T

__all__ = ["PrefixReads"]

_MAX_LEVELS = 32  # holder-set changes handled by binary search before walking block by block


class PrefixReads:
    """Reads of :class:`~steersman.fleet.prefix_index.PrefixIndex` (which sets the attributes used here)."""

    n: int
    _total: np.ndarray
    _total_view: np.ndarray
    _memo: tuple | None
    _later: list
    _tab: np.ndarray
    _setbits: np.ndarray
    _alive: np.ndarray
    _capped: bool
    _resident: np.ndarray
    _resident_view: np.ndarray
    _resident_at: object
    _all_resident: bool
    _all_ones: np.ndarray
    _raw_memo: tuple | None
    _reuse_memo: list  # [match's, match_raw's]: (the match, the cap, the capped match) of reusable's last copy
    _refresh_resident: Callable[[], None]  # steersman.fleet._prefix_residency.Residency
    _shift: np.uint64
    _mask: int
    _entries: int
    _job: object  # a background pass running (see the index's module doc)
    _readable: bool  # False while a background pass rewrites the table (see the index's module doc)
    _table_read: bool  # some replica is not mirrored: its match is the table's
    slots: dict  # replica -> steersman.fleet.slots.SlotMirror (llama.cpp replicas: the match is the mirror's)
    events: dict  # replica -> steersman.fleet.kv_events.KvEventMirror (the match is what its KV events say it holds)
    holders: object  # steersman.fleet.kv_events.EventHolders: what all of those hold, as one index

    def flush(self) -> None:  # pragma: no cover - the index defines it
        raise NotImplementedError

    def _arr(self, hashes: Sequence[int]) -> np.ndarray:  # pragma: no cover - the index defines it
        raise NotImplementedError

    def blocks_per_replica(self) -> np.ndarray:
        """Indexed blocks per replica (a copy)."""
        self.flush()
        return self._total.copy()

    def blocks_view(self) -> np.ndarray:
        """Indexed blocks per replica, read-only and without a copy: it follows the index's later writes, so
        read it within one decision (policies run between writes).  With capacities set (``set_capacity``): the
        blocks of the generations each replica's cache still holds."""
        if self._later or self._job is not None:
            self.flush()
        if not self._capped:
            return self._total_view
        self._refresh_resident()
        return self._total_view if self._all_resident else self._resident_view

    def match_raw(self, hashes: Sequence[int]) -> np.ndarray:
        """:meth:`match` crediting every replica with all it was sent, whatever its KV cache still holds (the
        same array while every replica's cache holds all it was sent).  Memoised like :meth:`match`."""
        held = self.match(hashes)  # flushes; the resident mask is the index's as it is now
        if self._all_resident:
            return held
        memo = self._raw_memo
        if memo is not None and memo[0] is hashes and memo[1] == len(hashes) and memo[3] is self._memo:
            return memo[2]
        out = np.zeros(self.n, dtype=np.int64)
        if len(hashes) and self._entries and self._readable and self._table_read:
            T.match_pass(self._tab, self._setbits, self._arr(hashes), out, self._alive, _MAX_LEVELS, self._shift,
                         self._mask, self._all_ones)
        self._mirrored(hashes, out)
        out.setflags(write=False)
        self._raw_memo = (hashes, len(hashes), out, self._memo)
        return out

    def reusable(self, hashes: Sequence[int], prompt_tokens: int, block_size: int, raw: bool = False) -> np.ndarray:
        """Leading blocks of ``hashes`` (a prompt of ``prompt_tokens`` tokens) each replica would *reuse*: :meth:`match`
        (``raw``: :meth:`match_raw`) capped at ``(prompt_tokens - 1) // block_size`` blocks.  What the policy and the
        dispatch's predicted hit read (the prefix accuracy learns from the latter).

        An engine computes a prompt's last token whatever it holds (vLLM v1 ``KVCacheManager.get_computed_blocks``:
        ``max_cache_hit_length = num_tokens - 1``; :mod:`steersman.sim.kvcache` likewise; llama.cpp keeps one token
        to evaluate too), so of a prompt of exactly ``k`` blocks it reuses ``k - 1`` at most.  The index still holds
        (and :meth:`match` still credits) all ``k``: the engine caches them once computed, and a longer prompt sharing
        them reuses them all.  Crediting all ``k`` taught the prefix accuracy ``(k - 1) / k`` on such prompts and
        predicted one token of prefill where a whole block is computed.

        Only a block-aligned prompt is capped (otherwise the cap is at least ``len(hashes)``: the match itself, no
        copy).  A batch of prompts (``SchedRequest.longest_prompt_tokens``) has the hashes of its first and the
        tokens of all: seldom capped.  Read-only, memoised with the match until the next write."""
        got = self.match_raw(hashes) if raw else self.match(hashes)
        cap = (int(prompt_tokens) - 1) // int(block_size)
        if cap >= len(hashes):
            return got
        cap = max(cap, 0)
        k = 1 if raw else 0
        memo = self._reuse_memo[k]
        if memo is not None and memo[0] is got and memo[1] == cap:
            return memo[2]
        out = np.minimum(got, cap)
        out.setflags(write=False)
        self._reuse_memo[k] = (got, cap, out)
        return out

    def _mirrored(self, hashes: Sequence[int], out: np.ndarray) -> None:
        """The mirrored replicas' matches into ``out``: a slot mirror's each; the events mirrors' all at once from
        their shared index."""
        for r, mirror in self.slots.items():
            out[r] = mirror.match(hashes)
        if self.events:  # (the table holds nothing of theirs: PrefixIndex.mirror_events)
            self.holders.match_into(hashes, out, self.events)  # type: ignore[attr-defined]

    def match(self, hashes: Sequence[int]) -> np.ndarray:
        """Leading blocks of ``hashes`` each replica probably holds (int64, one per replica).

        Walks the prompt forward over runs of blocks with the same holder set, finding the end of each
        run by binary search: O((1 + holder-set changes) x log len(hashes)) lookups.  A replica's match
        ends at the first block it is missing from (see the module doc for the approximation).

        The result is read-only and memoised until the next write: asking again for the same
        ``hashes`` object (the policy's match, then the accounting's on dispatch) costs nothing."""
        if self._later or self._job is not None:
            self.flush()
        memo = self._memo
        if memo is not None and memo[0] is hashes and memo[1] == len(hashes):
            return memo[2]
        out = np.zeros(self.n, dtype=np.int64)
        if self._capped:
            self._refresh_resident()  # (with every match after a write: blocks_view and match_raw then read it)
        # (every replica mirrored: theirs alone; the table being rewritten in the background: nothing)
        if len(hashes) and self._entries and self._readable and self._table_read:
            T.match_pass(self._tab, self._setbits, self._arr(hashes), out, self._alive, _MAX_LEVELS, self._shift,
                         self._mask, self._resident)
        self._mirrored(hashes, out)
        out.setflags(write=False)  # half the cost of going through ``out.flags``
        self._memo = memo = (hashes, len(hashes), out)
        if self._capped:
            self._resident_at = memo  # the mask still describes the index: no write since it was computed
        return out
