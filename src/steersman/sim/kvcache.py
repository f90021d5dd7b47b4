"""Paged KV cache with prefix caching, at the block-accounting level of vLLM v1.

Mirrors ``vllm/v1/core/block_pool.py`` (BlockPool, FreeKVCacheBlockQueue) and
``vllm/v1/core/kv_cache_manager.py`` / ``single_type_kv_cache_manager.py``
(get_computed_blocks, allocate_slots, free) for one full-attention KV group:

* The pool has ``num_blocks`` blocks of ``block_size`` tokens.  Free blocks sit in
  one queue in eviction order; new blocks are taken from its front.  A free block
  that still carries a hash is a cached block: taking it evicts it from the cache.
* A request holds ceil(tokens / block_size) blocks, in order.  When a block becomes
  full (scheduled up to its last token) its chained hash is registered, so later
  requests -- even ones scheduled in the same step -- hit it.
* A hit block is shared: its ref count goes up and, if it was free (ref 0), it
  leaves the free queue ("touch").
* Freeing a request decrements its blocks' ref counts in *reverse* order and
  appends the ones that reach 0 to the queue's tail, so its tail blocks are evicted
  before its head blocks and everything freed earlier goes before it (LRU).
* ``1 - free / total`` is vLLM's KV usage: cached blocks with ref 0 count as free.

Representation: per block, nothing.  A block that is not in the prefix cache has
no identity worth keeping, so free uncached blocks are runs (a count) in the queue
and a request's uncached blocks are counts.  Cached blocks are *segments*: a run
of consecutive positions [lo, hi) of one hash chain whose blocks all have the same
holders (so the same ref count) and, when free, sit together in the queue (deepest
first).  A request registers its new full blocks as one segment (or extends its
last one); a hit that ends inside a segment splits it; taking from the queue
shrinks a free segment from its deep end.  Hashes are chained (equal hashes mean
equal prefixes), so a hit walk looks up one hash per segment and compares the rest
in place.  Every operation is O(segments touched), independent of the number of
blocks, and the whole cache of a replica is a few hundred small objects.

A request holds a list of entries (segment, first position held) and uncached
runs, plus its trailing uncached blocks as a count.  When a held segment is split,
its holders keep the deeper part and reach the new shallower part through ``sp``
(it covers the positions just below): freeing walks ``sp`` down to the position it
first held.

This is exact for vLLM's behaviour except one corner: vLLM keeps *duplicate*
cached blocks (two blocks with the same hash, computed concurrently before either
was cached); here the second one stays uncached, so if the first is evicted while
the second is still free a later lookup misses where vLLM would hit.
"""

from __future__ import annotations

from collections import OrderedDict

from steersman.sim.kvextras import KVPoolExtras
from steersman.sim.request import _NEVER, SimRequest

__all__ = ["KVPool"]


class _Run:
    """``n`` consecutive free uncached blocks in the free queue."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class _Seg:
    """Cached blocks at positions [lo, hi) of the hash chain ``hs``, all with ``ref`` holders."""

    __slots__ = ("hs", "lo", "hi", "ref", "sp", "root")

    def __init__(self, hs: list[int], lo: int, hi: int, ref: int, sp: _Seg | None, root: int | None) -> None:
        self.hs = hs
        self.lo = lo
        self.hi = hi
        self.ref = ref
        self.sp = sp  # the segment just below lo, split off this one (its holders hold it too)
        # chain root if it was registered right after a duplicate block: it may outlive the
        # block before it, so a later registration can meet it anywhere (see _register)
        self.root = root


class KVPool(KVPoolExtras):
    __slots__ = ("num_blocks", "block_size", "caching", "num_free", "_free", "_idx", "_orph", "_ncached", "listener")

    def __init__(self, num_blocks: int, block_size: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.num_free = num_blocks
        # Free queue, front = next to be taken: _Seg (free, evicted from its deep end) | _Run -> None.
        self._free: OrderedDict[object, None] = OrderedDict()
        if num_blocks:
            self._free[_Run(num_blocks)] = None
        self._idx: dict[int, _Seg] = {}  # hash of a segment's first block -> segment
        self._orph: dict[int, list[_Seg]] = {}  # chain root -> segments registered after a duplicate
        self._ncached = 0
        #: told of every change of the prefix cache, as vLLM's KV events tell (``stored(hashes)``,
        #: ``removed(hashes)``, ``cleared()``: steersman.fleet.kv_events.KvEventMirror); None: nobody listens
        self.listener = None

    # -- state ------------------------------------------------------------------
    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks in the prefix cache (in use or evictable)."""
        return self._ncached

    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks if self.num_blocks else 0.0

    def block_list(self, req: SimRequest, n: int) -> list[int | None]:
        """``req``'s first ``n`` blocks: hash if cached, else None."""
        out: list[int | None] = []
        hs = req._chain
        p = 0
        for x, lo in req._ent:
            if x is None:
                out.extend([None] * lo)
                p += lo
            else:
                out.extend(hs[lo : x.hi])  # type: ignore[index]
                p = x.hi
        out.extend([None] * (n - p))
        return out[:n]

    # -- internals ---------------------------------------------------------------
    def _append_run(self, n: int) -> None:
        self.num_free += n
        free = self._free
        if free:
            last = next(reversed(free))
            if last.__class__ is _Run:
                last.n += n  # type: ignore[attr-defined]
                return
        free[_Run(n)] = None

    def _drop(self, s: _Seg) -> None:
        """``s`` left the cache entirely."""
        h = s.hs[s.lo]
        if self._idx.get(h) is s:
            del self._idx[h]
        self._ncached -= s.hi - s.lo
        if self.listener is not None and s.hi > s.lo:
            self.listener.removed(s.hs[s.lo : s.hi])
        s.hi = s.lo
        if s.root is not None:
            lst = self._orph[s.root]
            lst.remove(s)
            if not lst:
                del self._orph[s.root]
            s.root = None

    def _split(self, s: _Seg, e: int) -> _Seg:
        """``s`` = [lo, hi), lo < e < hi: a new segment takes [lo, e) and is returned; ``s`` keeps [e, hi)."""
        p = _Seg(s.hs, s.lo, e, s.ref, s.sp, s.root)
        idx = self._idx
        idx[s.hs[s.lo]] = p
        idx[s.hs[e]] = s
        if s.root is not None:
            lst = self._orph[s.root]
            lst[lst.index(s)] = p
            s.root = None
        s.lo = e
        s.sp = p
        return p

    def _walk(self, hs: list[int], limit: int) -> tuple[int, int, list]:
        """Longest cached prefix of ``hs[:limit]``: (blocks, how many of them are free, [(segment, end)])."""
        idx = self._idx
        path = []
        i = fh = 0
        while i < limit:
            x = idx.get(hs[i])
            if x is None or x.lo != i:
                break
            e = x.hi if x.hi < limit else limit
            xs = x.hs
            if xs is hs or (xs[e - 1] == hs[e - 1] and xs[i:e] == hs[i:e]):
                k = e
            else:
                k = i + 1
                while k < e and xs[k] == hs[k]:
                    k += 1
            path.append((x, k))
            if not x.ref:
                fh += k - i
            i = k
        return i, fh, path

    def _holding(self, i: int, h: int) -> _Seg | None:
        """The cached segment holding hash ``h`` at position ``i``, wherever it starts.  O(segments): only
        for a request whose previous block's cached twin was evicted (its pointer went stale)."""
        for s in self._idx.values():
            if s.lo <= i < s.hi and s.hs[i] == h:
                return s
        return None

    def _touch(self, req: SimRequest, path: list) -> None:
        """The hits of ``path`` become ``req``'s first blocks (ref + 1, out of the free queue)."""
        ent = req._ent
        x = None
        for x, k in path:
            if k < x.hi:
                p = self._split(x, k)
                if not p.ref:
                    self.num_free -= k - p.lo  # its blocks leave x's place in the queue
                x = p
            elif not x.ref:
                del self._free[x]
                self.num_free -= x.hi - x.lo
            x.ref += 1
            ent.append((x, x.lo))
        req._cur = x

    def _register(self, req: SimRequest, lo: int, hi: int, hs: list[int]) -> None:
        """Offer ``req``'s (uncached) blocks lo..hi-1 to the cache: each is cached unless its hash
        already is (a duplicate, stays uncached).  ``req._cov`` is lo; becomes hi."""
        idx = self._idx
        ent = req._ent
        cur = req._cur  # the segment holding the hash of block i - 1 if req's own block is not it
        i = lo
        while i < hi:
            h = hs[i]
            x = cur
            while x is not None and x.lo > i:
                x = x.sp
            if x is None or i >= x.hi or x.hs[i] != h:
                stale = cur is not None and (x is None or x.hi < i)  # block i - 1's cached twin was evicted
                x = idx.get(h)
                if x is None and stale:  # block i may still be cached inside a segment registered since
                    x = self._holding(i, h)
            if x is not None:  # duplicates as long as the chains agree
                e = x.hi if x.hi < hi else hi
                xs = x.hs
                k = i + 1
                while k < e and xs[k] == hs[k]:
                    k += 1
                if ent and ent[-1][0] is None:
                    ent[-1] = (None, ent[-1][1] + k - i)
                else:
                    ent.append((None, k - i))
                cur = x
                i = k
                continue
            # Own blocks from i.  A cached block at a later position j of this chain would have
            # its hash at j - 1 cached too, so block j - 1 would not be ours: only a segment
            # registered after a duplicate (which can outlive the block before it) can start there.
            j = hi
            orph = self._orph
            if orph:
                for s in orph.get(hs[0], ()):
                    sl = s.lo
                    if i < sl < j and s.hs[sl] == hs[sl]:
                        j = sl
            last = ent[-1][0] if ent else None
            if last is not None and last.hi == i and last.ref == 1:
                last.hi = j  # our last segment, held by us alone: grows
                last.hs = hs
            else:
                s = _Seg(hs, i, j, 1, None, None)
                idx[h] = s
                if i and ent and last is None:
                    s.root = r0 = hs[0]
                    orph.setdefault(r0, []).append(s)
                ent.append((s, i))
            self._ncached += j - i
            if self.listener is not None:
                self.listener.stored(hs[i:j], hs[i - 1] if i else None)
            cur = None
            i = j
        req._cur = cur
        req._cov = hi

    # -- vLLM KVCacheManager operations ----------------------------------------------
    def admit(self, req: SimRequest, budget: int, chunked: bool, dry: bool = False) -> tuple[int, int] | None:
        """Admission of a waiting request (holding nothing): prefix lookup, chunk, allocate, cache.

        Returns (hit blocks, tokens scheduled), or None if it does not fit (nothing changed).
        ``dry``: only tell.
        """
        bs = self.block_size
        ntok = req.prompt_len + req._output
        hits = fh = 0
        path = None
        hs = None
        if self.caching:
            hs = req._chain
            if hs is None or req._hashing:
                hs = req.chain(ntok // bs, bs)
            limit = (ntok - 1) // bs
            if limit > len(hs):
                limit = len(hs)
            if limit > 0:
                hits, fh, path = self._walk(hs, limit)
        hit_tokens = hits * bs
        n = ntok - hit_tokens
        if n > budget:
            if not chunked:
                return None
            n = budget
        end = hit_tokens + n
        nb = (end + bs - 1) // bs
        if nb - hits + fh > self.num_free:
            return None
        if dry:
            return hits, n
        req._kv = self
        req._ent = []
        if path:
            self._touch(req, path)
        else:
            req._cur = None
        req._cov = hits
        self.take(nb - hits)
        req._nblocks = nb
        if hs is not None:
            full = end // bs
            hi = full if full < len(hs) else len(hs)
            if hi > hits:
                self._register(req, hits, hi, hs)
            req._hashed = full if hi == full else _NEVER
        return hits, n

    def extend(self, req: SimRequest, end: int) -> bool:
        """A running request: blocks for its first ``end`` tokens, then cache its full ones.

        False (nothing changed) if the new blocks do not fit.
        """
        bs = self.block_size
        nb = (end + bs - 1) // bs
        need = nb - req._nblocks
        if need > 0:
            if need > self.num_free:
                return False
            self.take(need)
            req._nblocks = nb
        if self.caching:
            self._cache_to(req, end)
        return True

    def _cache_to(self, req: SimRequest, end: int) -> None:
        bs = self.block_size
        full = end // bs
        if full > req._hashed:
            hs = req._chain
            if hs is None or req._hashing:
                hs = req.chain(full, bs)
            hi = full if full < len(hs) else len(hs)
            if hi > req._cov:
                self._register(req, req._cov, hi, hs)
            req._hashed = full if hi == full else _NEVER

    def take(self, n: int) -> None:
        """Take ``n`` blocks off the free queue's front, evicting cached ones."""
        if not n:
            return
        self.num_free -= n
        free = self._free
        while n:
            key = next(iter(free))
            if key.__class__ is _Run:
                if key.n > n:  # type: ignore[attr-defined]
                    key.n -= n  # type: ignore[attr-defined]
                    return
                n -= key.n  # type: ignore[attr-defined]
                free.popitem(last=False)
            else:
                size = key.hi - key.lo  # type: ignore[attr-defined]
                if size > n:
                    key.hi -= n  # type: ignore[attr-defined]
                    self._ncached -= n
                    if self.listener is not None:
                        self.listener.removed(key.hs[key.hi : key.hi + n])  # type: ignore[attr-defined]
                    return
                free.popitem(last=False)
                self._drop(key)  # type: ignore[arg-type]
                n -= size

    def cache(self, req: SimRequest, num_tokens: int) -> None:
        """Register ``req``'s full blocks among its first ``num_tokens`` tokens (cache_full_blocks)."""
        if self.caching:
            req._kv = self
            if req._ent is None:
                req._ent = []
            self._cache_to(req, num_tokens)

    def free(self, req: SimRequest) -> None:
        """Release all of ``req``'s blocks, tail first (vLLM free)."""
        n = req._nblocks
        ent = req._ent
        cov = req._cov
        req._nblocks = req._hashed = req._cov = 0
        req._cur = None
        if ent:
            req._ent = None
        if n > cov:
            self._append_run(n - cov)
        if not ent:
            return
        free = self._free
        for x, lo in reversed(ent):
            if x is None:
                self._append_run(lo)
                continue
            while True:
                c = x.ref - 1
                x.ref = c
                if not c:
                    free[x] = None
                    self.num_free += x.hi - x.lo
                if x.lo <= lo:
                    break
                x = x.sp

    def reset(self) -> None:
        """Drop everything (weights unloaded): all blocks free, nothing cached."""
        listener = self.listener
        self.__init__(self.num_blocks, self.block_size, self.caching)  # type: ignore[misc]
        self.listener = listener
        if listener is not None:
            listener.cleared()
