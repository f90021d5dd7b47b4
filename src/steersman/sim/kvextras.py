"""The KV pool's slower, vLLM-shaped surface: introspection (tests) and the per-call API.

:class:`KVPoolExtras` is mixed into :class:`~steersman.sim.kvcache.KVPool`:

* introspection, O(cached blocks): ``ref_counts``, ``is_cached``, ``ref_count``,
  ``free_queue``;
* vLLM's KVCacheManager calls one by one -- ``lookup`` (get_computed_blocks),
  ``blocks_needed`` (get_num_blocks_to_allocate), ``allocate`` (allocate_slots) --
  used by the reference engine of the equivalence tests; the engine model itself
  admits with :meth:`~steersman.sim.kvcache.KVPool.admit` in one call.
"""

from __future__ import annotations

from steersman.sim.request import SimRequest

__all__ = ["KVPoolExtras"]


class KVPoolExtras:
    __slots__ = ()

    def ref_counts(self) -> dict[int, int]:
        """Every cached block: hash -> ref count (0 = free, evictable).  O(cached blocks)."""
        out = {}
        for s in self._segments():
            hs, ref = s.hs, s.ref
            for p in range(s.lo, s.hi):
                out[hs[p]] = ref
        return out

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self.ref_counts()

    def ref_count(self, block_hash: int) -> int:
        return self.ref_counts().get(block_hash, 0)

    def free_queue(self) -> list[int | None]:
        """The free queue front to back: a hash per cached block, None per uncached one (tests)."""
        out: list[int | None] = []
        for key in self._free:
            if not hasattr(key, "hs"):  # a run of uncached blocks
                out.extend([None] * key.n)  # type: ignore[attr-defined]
            else:
                hs = key.hs  # type: ignore[attr-defined]
                out.extend(hs[p] for p in range(key.hi - 1, key.lo - 1, -1))  # type: ignore[attr-defined]
        return out

    def _segments(self) -> list:
        return list(self._idx.values())

    def lookup(self, req: SimRequest) -> list[int]:
        """Hashes of the longest run of ``req``'s leading blocks in the cache.

        As vLLM's get_computed_blocks: at most (num_tokens - 1) // block_size blocks,
        so at least the last token is recomputed (a fully cached, block-aligned prompt
        recomputes its whole last block).
        """
        if not self.caching:
            return []
        bs = self.block_size
        limit = (req.num_tokens - 1) // bs
        hs = req.chain(limit, bs)
        limit = min(limit, len(hs))
        hits, _, _ = self._walk(hs, limit) if limit > 0 else (0, 0, None)
        return hs[:hits]

    def blocks_needed(self, req: SimRequest, num_tokens: int, hits: list[int] | None = None) -> int:
        """Free blocks that :meth:`allocate` would consume (vLLM get_num_blocks_to_allocate)."""
        n_hits = len(hits) if hits else 0
        need = -(-num_tokens // self.block_size) - req.num_blocks - n_hits
        if need < 0:
            need = 0
        if hits:
            need += self._walk(req.chain(n_hits, self.block_size), n_hits)[1]
        return need

    def allocate(self, req: SimRequest, num_tokens: int, hits: list[int] | None = None) -> bool:
        """Make ``req`` hold blocks for its first ``num_tokens`` tokens (vLLM allocate_slots).

        ``hits`` (from :meth:`lookup`, for a request holding nothing) are touched and
        become its first blocks.  Returns False, changing nothing, if the free queue is
        too short.  Does not cache anything: call :meth:`cache` next.
        """
        if self.blocks_needed(req, num_tokens, hits) > self.num_free:
            return False
        req._kv = self
        if req._ent is None:
            req._ent = []
        if hits:
            n_hits = len(hits)
            _, _, path = self._walk(req.chain(n_hits, self.block_size), n_hits)
            self._touch(req, path)
            req._cov = req._nblocks = n_hits
            req._hashed = 0
        total = -(-num_tokens // self.block_size)
        if total > req._nblocks:
            self.take(total - req._nblocks)
            req._nblocks = total
        return True
