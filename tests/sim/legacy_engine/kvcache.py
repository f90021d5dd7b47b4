"""The pre-lazy engine oracle: the paged KV pool (verbatim from commit 924c35a; see the package docstring)."""

from __future__ import annotations

from collections import OrderedDict

from legacy_engine.request import LegacyRequest, _NEVER, _Run


class KVPool:
    __slots__ = ("num_blocks", "block_size", "caching", "num_free", "_free", "_ref")

    def __init__(self, num_blocks: int, block_size: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.num_free = num_blocks
        # Free queue, front = next to be taken: cached block hash | _Run -> None.
        self._free: OrderedDict[object, None] = OrderedDict()
        if num_blocks:
            self._free[_Run(num_blocks)] = None
        # Every block in the prefix cache: hash -> ref count (0 = free, evictable).
        self._ref: dict[int, int] = {}

    # -- state ------------------------------------------------------------------
    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks in the prefix cache (in use or evictable)."""
        return len(self._ref)

    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks if self.num_blocks else 0.0

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._ref

    def ref_count(self, block_hash: int) -> int:
        return self._ref.get(block_hash, 0)

    def free_queue(self) -> list[int | None]:
        """The free queue front to back: a hash per cached block, None per uncached one (tests)."""
        out: list[int | None] = []
        for key in self._free:
            if key.__class__ is _Run:
                out.extend([None] * key.n)  # type: ignore[attr-defined]
            else:
                out.append(key)  # type: ignore[arg-type]
        return out

    # -- vLLM KVCacheManager operations ----------------------------------------------
    def lookup(self, req: LegacyRequest) -> list[int]:
        """Hashes of the longest run of ``req``'s leading blocks in the cache.

        As vLLM's get_computed_blocks: at most (num_tokens - 1) // block_size blocks,
        so at least the last token is recomputed (a fully cached, block-aligned prompt
        recomputes its whole last block).
        """
        if not self.caching:
            return []
        bs = self.block_size
        ref = self._ref
        hits: list[int] = []
        for i in range((req.num_tokens - 1) // bs):
            h = req.block_hash(i, bs)
            if h is None or h not in ref:
                break
            hits.append(h)
        return hits

    def blocks_needed(self, req: LegacyRequest, num_tokens: int, hits: list[int] | None = None) -> int:
        """Free blocks that :meth:`allocate` would consume (vLLM get_num_blocks_to_allocate)."""
        n_hits = len(hits) if hits else 0
        need = -(-num_tokens // self.block_size) - len(req.blocks) - n_hits
        if need < 0:
            need = 0
        if hits:
            ref = self._ref
            need += sum(1 for h in hits if ref[h] == 0)
        return need

    def allocate(self, req: LegacyRequest, num_tokens: int, hits: list[int] | None = None) -> bool:
        """Make ``req`` hold blocks for its first ``num_tokens`` tokens (vLLM allocate_slots).

        ``hits`` (from :meth:`lookup`, for a request being admitted) are touched and
        become its first blocks.  Returns False, changing nothing, if the free queue
        is too short.  Does not cache anything: call :meth:`cache` next.
        """
        blocks = req.blocks
        need = -(-num_tokens // self.block_size) - len(blocks)
        if hits:
            need -= len(hits)
        if need < 0:
            need = 0
        if hits:
            ref = self._ref
            if need + sum(1 for h in hits if ref[h] == 0) > self.num_free:
                return False
            free = self._free
            for h in hits:
                c = ref[h]
                if c == 0:
                    del free[h]
                    self.num_free -= 1
                ref[h] = c + 1
            blocks.extend(hits)
        elif need > self.num_free:
            return False
        if need:
            self.take(need)
            blocks.extend([None] * need)
        return True

    def take(self, n: int) -> None:
        """Take ``n`` blocks off the free queue's front, evicting cached ones."""
        self.num_free -= n
        free = self._free
        ref = self._ref
        while n:
            key = next(iter(free))
            if key.__class__ is _Run:
                if key.n > n:  # type: ignore[attr-defined]
                    key.n -= n  # type: ignore[attr-defined]
                    return
                n -= key.n  # type: ignore[attr-defined]
                free.popitem(last=False)
            else:
                free.popitem(last=False)
                del ref[key]  # type: ignore[arg-type]
                n -= 1

    def cache(self, req: LegacyRequest, num_tokens: int) -> None:
        """Register ``req``'s full blocks among its first ``num_tokens`` tokens (cache_full_blocks)."""
        full = num_tokens // self.block_size
        i = req.num_hashed
        if full <= i or not self.caching:
            return
        bs = self.block_size
        blocks = req.blocks
        ref = self._ref
        while i < full:
            if blocks[i] is None:
                h = req.block_hash(i, bs)
                if h is None:
                    i = _NEVER
                    break
                if h not in ref:  # else: a duplicate of a cached block, stays uncached
                    ref[h] = 1
                    blocks[i] = h
            i += 1
        req.num_hashed = i

    def free(self, req: LegacyRequest) -> None:
        """Release all of ``req``'s blocks, tail first (vLLM free)."""
        blocks = req.blocks
        req.blocks = []
        req.num_hashed = 0
        if not blocks:
            return
        free = self._free
        ref = self._ref
        anon = 0
        for h in reversed(blocks):
            if h is None:
                anon += 1
                continue
            if anon:
                self._append_run(anon)
                anon = 0
            c = ref[h] - 1
            ref[h] = c
            if c == 0:
                free[h] = None
                self.num_free += 1
        if anon:
            self._append_run(anon)

    def _append_run(self, n: int) -> None:
        self.num_free += n
        free = self._free
        if free:
            last = next(reversed(free))
            if last.__class__ is _Run:
                last.n += n  # type: ignore[attr-defined]
                return
        free[_Run(n)] = None

    def reset(self) -> None:
        """Drop everything (weights unloaded): all blocks free, nothing cached."""
        self.__init__(self.num_blocks, self.block_size, self.caching)  # type: ignore[misc]
