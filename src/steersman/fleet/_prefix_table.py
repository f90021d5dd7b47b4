"""The prefix index's table, compiled: an open-addressing hash table of block hash -> (holders, generation).

:class:`~steersman.fleet.prefix_index.PrefixIndex` keeps its blocks here (numba, compiled once, cached
on disk).  One ``(capacity, 2)`` int64 array: column 0 the block hash (``EMPTY`` for a free slot),
column 1 the packed value ``holders << 8 | generation``, so a lookup that hits reads one cache line.
Linear probing from a Fibonacci hash of the key; the table is never more than half full (the index
drops its oldest generation first), and deletion shifts the rest of the cluster back (no tombstones).

*Holders*: ``r >= 0`` is replica ``r`` alone; ``~s`` (negative) is the interned holder set ``s``, whose
bits are row ``s`` of ``setbits`` (uint64 words, replica ``r`` is bit ``r % 64`` of word ``r // 64``).
The index interns the sets in Python, so equal sets have equal values and a run of blocks with the same
holders is a run of equal values.  A kernel that needs a set it has not been given (replica ``r`` added
to, or removed from, a set) stops with status ``NEED`` and the value in ``state[2]``; the caller
interns the new set, adds ``old -> new`` to the memo and calls again from the same block.

*Counts*: ``counts[g, r]`` is the blocks of generation ``g`` replica ``r`` holds, ``total[r]`` their sum
over the generations, both kept in place by every write.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

__all__ = ["EMPTY", "NONE", "DONE", "ROOM", "NEED", "find_value", "recent_prefix", "record_pass", "remove_pass",
           "drop_generation", "rehash", "drop_generation_flagged", "rehash_flagged", "forget_flagged", "insert_all", "remap_holders", "mark_sets", "match_pass", "warm_up"]

EMPTY = np.iinfo(np.int64).min  # the key of a free slot (a block hash equal to it is stored as EMPTY + 1)
NONE = np.iinfo(np.int64).min  # find_value: no such block
DONE, ROOM, NEED = 0, 1, 2  # record_pass / remove_pass statuses
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_ONE = np.uint64(1)


@njit(inline="always")
def _key(h):
    return h + 1 if h == EMPTY else h


@njit(inline="always")
def _home(h, shift):
    return np.int64((np.uint64(h) * _GOLD) >> shift)


@njit(inline="always")
def _find(tab, h, shift, mask):
    """Slot of key ``h``, or ``-1 - slot`` of the free slot where it would go."""
    i = _home(h, shift)
    while True:
        k = tab[i, 0]
        if k == h:
            return i
        if k == EMPTY:
            return -1 - i
        i = (i + 1) & mask


@njit(inline="always")
def _holds(v, r, setbits):
    if v >= 0:
        return v == r
    return (setbits[~v, r >> 6] >> np.uint64(r & 63)) & _ONE != 0


@njit(inline="always")
def _word(v, w, setbits):
    """Word ``w`` of the holder mask of value ``v`` (``NONE``: nobody)."""
    if v == NONE:
        return np.uint64(0)
    if v >= 0:
        return _ONE << np.uint64(v & 63) if v >> 6 == w else np.uint64(0)
    return setbits[~v, w]


@njit(inline="always")
def _memo(v, memo_k, memo_v, nmemo):
    for q in range(nmemo):
        if memo_k[q] == v:
            return memo_v[q]
    return NONE


@njit
def _delete_at(tab, i, shift, mask):
    """Free slot ``i``, shifting later entries of its cluster back so every key stays reachable."""
    j = i
    while True:
        j = (j + 1) & mask
        k = tab[j, 0]
        if k == EMPTY:
            break
        if ((j - _home(k, shift)) & mask) >= ((j - i) & mask):  # its home is not in (i, j]: it may move to i
            tab[i, 0] = k
            tab[i, 1] = tab[j, 1]
            i = j
    tab[i, 0] = EMPTY


@njit
def _shift_counts(counts, setbits, s, g, new, k):
    """``k`` blocks held by set ``s`` moved from generation ``g`` to ``new``."""
    for w in range(setbits.shape[1]):
        x = setbits[s, w]
        t = 0
        while x:
            if x & _ONE:
                r = w * 64 + t
                counts[g, r] -= k
                counts[new, r] += k
            x >>= _ONE
            t += 1


@njit(inline="always")
def _credits(tab, setbits, h, r, new, shift, mask):
    """Block ``h`` is in generation ``new`` and held by replica ``r``."""
    i = _find(tab, _key(h), shift, mask)
    return i >= 0 and tab[i, 1] & 255 == new and _holds(tab[i, 1] >> 8, r, setbits)


@njit(cache=True, nogil=True)
def find_value(tab, h, shift, mask):
    """The holders of block ``h`` (``NONE``: not held)."""
    i = _find(tab, _key(h), shift, mask)
    return tab[i, 1] >> 8 if i >= 0 else NONE


@njit(cache=True, nogil=True)
def recent_prefix(tab, setbits, hashes, r, new, shift, mask):
    """How many leading blocks of ``hashes`` generation ``new`` already credits to replica ``r``: 0 unless it
    credits block 0, else a binary search (blocks are chained, so that is a prefix -- except after a record cut
    by a rotation, whose first blocks stayed in the older generation: its later blocks in ``new`` would send the
    search past them, and every later record of that prompt would leave them to age out while it is hot)."""
    if hashes.size == 0 or not _credits(tab, setbits, hashes[0], r, new, shift, mask):
        return 0
    lo, hi = 1, hashes.size
    while lo < hi:
        mid = (lo + hi) // 2
        if _credits(tab, setbits, hashes[mid], r, new, shift, mask):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def record_pass(tab, setbits, counts, total, hashes, pos, r, new, room, memo_k, memo_v, nmemo, shift, mask, state):
    """Blocks ``hashes[pos:]`` now live on replica ``r`` and are the most recent: each moves to (or enters)
    generation ``new``.  Stops after ``room`` blocks entered ``new``.  Returns ``(pos, status)``;
    ``state[0]``: blocks that entered ``new``, ``state[1]``: new keys, ``state[2]``: the value to intern.
    ``pos`` < 0: start after the leading blocks ``new`` already credits to ``r`` (:func:`recent_prefix`)."""
    if pos < 0:
        pos = recent_prefix(tab, setbits, hashes, r, new, shift, mask)
    entered = keys = 0
    run_s, run_g, run_k = -1, -1, 0
    status = DONE
    n = hashes.size
    while pos < n:
        h = _key(hashes[pos])
        i = _find(tab, h, shift, mask)
        if i < 0:
            i = -1 - i
            tab[i, 0] = h
            tab[i, 1] = (r << 8) | new
            counts[new, r] += 1
            total[r] += 1
            keys += 1
        else:
            packed = tab[i, 1]
            v, g = packed >> 8, packed & 255
            held = _holds(v, r, setbits)
            nv = v
            if not held:
                nv = _memo(v, memo_k, memo_v, nmemo)
                if nv == NONE:
                    state[2] = v
                    status = NEED
                    break
            if g == new:
                if not held:  # another replica's recent block: add ours in place
                    tab[i, 1] = (nv << 8) | new
                    counts[new, r] += 1
                    total[r] += 1
                pos += 1
                continue
            if v >= 0:
                counts[g, v] -= 1
                counts[new, v] += 1
            else:
                if ~v != run_s or g != run_g:
                    if run_k:
                        _shift_counts(counts, setbits, run_s, run_g, new, run_k)
                    run_s, run_g, run_k = ~v, g, 0
                run_k += 1
            if not held:
                counts[new, r] += 1
                total[r] += 1
            tab[i, 1] = (nv << 8) | new
        entered += 1
        pos += 1
        if entered >= room:
            status = ROOM
            break
    if run_k:
        _shift_counts(counts, setbits, run_s, run_g, new, run_k)
    state[0] = entered
    state[1] = keys
    return pos, status


@njit(cache=True, nogil=True)
def remove_pass(tab, setbits, counts, total, hashes, pos, r, memo_k, memo_v, nmemo, shift, mask, state):
    """Replica ``r`` no longer holds blocks ``hashes[pos:]``.  Returns ``(pos, status)``; ``state[1]``: keys
    freed (blocks nobody holds any more), ``state[2]``: the value to intern (``NEED``)."""
    freed = 0
    status = DONE
    while pos < hashes.size:
        i = _find(tab, _key(hashes[pos]), shift, mask)
        if i >= 0:
            packed = tab[i, 1]
            v, g = packed >> 8, packed & 255
            if _holds(v, r, setbits):
                if v == r:
                    _delete_at(tab, i, shift, mask)
                    freed += 1
                else:
                    nv = _memo(v, memo_k, memo_v, nmemo)
                    if nv == NONE:
                        state[2] = v
                        status = NEED
                        break
                    tab[i, 1] = (nv << 8) | g
                counts[g, r] -= 1
                total[r] -= 1
        pos += 1
    state[1] = freed
    return pos, status


@njit(cache=True, nogil=True)
def drop_generation(tab, g, used, shift, mask):
    """Free every slot of generation ``g``; returns how many.  In the same pass ``used[s]`` = a block left is held
    by set ``s`` (an entry a deletion moves back into a slot already passed was marked where it stood)."""
    dropped = 0
    for i in range(mask + 1):
        while tab[i, 0] != EMPTY and tab[i, 1] & 255 == g:
            _delete_at(tab, i, shift, mask)
            dropped += 1
        if tab[i, 0] != EMPTY and tab[i, 1] < 0:
            used[~(tab[i, 1] >> 8)] = True
    return dropped


@njit(cache=True, nogil=True)
def remap_holders(tab, remap, gone, shift, mask):
    """Every set value ``~s`` becomes ``remap[s]``; then the entries held by replica ``gone`` alone are freed
    (``gone`` < 0: none).  Returns the number freed.  (Two passes: a deletion may move an entry already
    seen into the slot being scanned, and a remap applied twice would be wrong.)"""
    for i in range(mask + 1):
        if tab[i, 0] != EMPTY:
            packed = tab[i, 1]
            if packed < 0:
                tab[i, 1] = (remap[~(packed >> 8)] << 8) | (packed & 255)
    freed = 0
    if gone >= 0:
        for i in range(mask + 1):
            while tab[i, 0] != EMPTY and tab[i, 1] >> 8 == gone:
                _delete_at(tab, i, shift, mask)
                freed += 1
    return freed


@njit(cache=True, nogil=True)
def rehash(tab, old, shift, mask):
    """Every slot of the new table ``tab`` freed, then every entry of ``old`` inserted: a growth in one call
    (the index's worker thread then waits for the GIL once, not once a step, under a busy event loop)."""
    for i in range(tab.shape[0]):
        tab[i, 0] = EMPTY
        tab[i, 1] = EMPTY
    insert_all(tab, old, shift, mask)


@njit(cache=True, nogil=True)
def drop_generation_flagged(tab, g, used, shift, mask, flags):
    """:func:`drop_generation` on a worker thread: ``flags[0]`` = 1 once it runs (the GIL released), then
    ``flags[2]`` = the slots freed and ``flags[1]`` = 1 when done, all written without the GIL.  The caller
    polls them rather than the thread's future: a thread waiting for the GIL starves while a busy event loop
    releases and retakes it more often than the switch interval (each release restarts the waiter's timer)."""
    flags[0] = 1
    flags[2] = drop_generation(tab, g, used, shift, mask)
    flags[1] = 1


@njit(cache=True, nogil=True)
def rehash_flagged(tab, old, shift, mask, flags):
    """:func:`rehash` on a worker thread, with the flags of :func:`drop_generation_flagged`."""
    flags[0] = 1
    rehash(tab, old, shift, mask)
    flags[1] = 1


@njit(cache=True, nogil=True)
def forget_flagged(tab, remap, gone, shift, mask, used, flags):
    """A replica forgotten on a worker thread: :func:`remap_holders` (``flags[2]`` = the entries freed), then
    :func:`mark_sets` into ``used``, with the flags of :func:`drop_generation_flagged`."""
    flags[0] = 1
    flags[2] = remap_holders(tab, remap, gone, shift, mask)
    mark_sets(tab, used)
    flags[1] = 1


@njit(cache=True, nogil=True)
def insert_all(tab, old, shift, mask):
    """Insert every entry of table ``old`` (rows of key, packed value; ``EMPTY`` rows skipped; keys absent
    from ``tab``) into ``tab``."""
    for e in range(old.shape[0]):
        h = old[e, 0]
        if h == EMPTY:
            continue
        i = _home(h, shift)
        while tab[i, 0] != EMPTY:
            i = (i + 1) & mask
        tab[i, 0] = h
        tab[i, 1] = old[e, 1]


@njit(cache=True, nogil=True)
def mark_sets(tab, used):
    """``used[s]`` = some block is held by set ``s``."""
    for i in range(tab.shape[0]):
        if tab[i, 0] != EMPTY:
            v = tab[i, 1] >> 8
            if v < 0:
                used[~v] = True


@njit(cache=True, nogil=True, inline="always")
def _packed(tab, h, shift, mask):
    """The packed value (holders << 8 | generation) of block ``h`` (``NONE``: not held)."""
    i = _find(tab, _key(h), shift, mask)
    return tab[i, 1] if i >= 0 else NONE


@njit(cache=True, nogil=True, inline="always")
def _resident_word(p, w, setbits, resident):
    """Word ``w`` of the holders of packed value ``p`` whose KV cache still holds its generation."""
    if p == NONE:
        return np.uint64(0)
    return _word(p >> 8, w, setbits) & resident[p & 255, w]


@njit(cache=True, nogil=True)
def match_pass(tab, setbits, hashes, out, alive, max_levels, shift, mask, resident):
    """``out[r]`` = leading blocks of ``hashes`` replica ``r`` probably holds (``out`` zeroed by the caller):
    held by ``r`` in a generation its cache still holds (``resident``:
    :func:`steersman.fleet._prefix_residency.resident_mask`).

    Walks the prompt over runs of blocks with the same holders and generation, finding each run's end by binary
    search; after ``max_levels`` runs it walks block by block.  ``alive``: a scratch row of ``setbits``' width."""
    n = hashes.size
    if n == 0:
        return
    v = _packed(tab, hashes[0], shift, mask)
    if v == NONE:
        return
    words = setbits.shape[1]
    for w in range(words):
        alive[w] = _resident_word(v, w, setbits, resident)
    last = _packed(tab, hashes[n - 1], shift, mask)
    pos, levels = 0, 0
    while True:
        levels += 1
        if levels > max_levels:
            end = pos
        elif last == v:
            end = n - 1
        else:
            a, b = pos, n - 1
            while b - a > 1:
                mid = (a + b) // 2
                if _packed(tab, hashes[mid], shift, mask) == v:
                    a = mid
                else:
                    b = mid
            end = a
        nxt = _packed(tab, hashes[end + 1], shift, mask) if end + 1 < n else NONE
        left = False
        for w in range(words):
            m = _resident_word(nxt, w, setbits, resident)
            gone = alive[w] & ~m
            t = 0
            while gone:
                if gone & _ONE:
                    out[w * 64 + t] = end + 1
                gone >>= _ONE
                t += 1
            alive[w] &= m
            if alive[w]:
                left = True
        if not left:
            return
        pos, v = end + 1, nxt


def warm_up() -> None:
    """Compile (or load) every kernel now, with the argument types the index passes: hashes both writeable
    (converted from a tuple or list) and read-only (a :class:`~steersman.text.tokenizer.BlockHashes` array),
    each a separate specialization that would otherwise load on a live request."""
    tab = np.full((16, 2), EMPTY, dtype=np.int64)
    setbits = np.zeros((1, 1), dtype=np.uint64)
    counts = np.zeros((8, 1), dtype=np.int64)
    total = np.zeros(1, dtype=np.int64)
    memo = np.zeros(4, dtype=np.int64)
    state = np.zeros(3, dtype=np.int64)
    shift, mask = np.uint64(60), 15
    readonly = np.array([5, 6], dtype=np.int64)
    readonly.setflags(write=False)
    for hashes in (np.array([5, 6], dtype=np.int64), readonly):
        record_pass(tab, setbits, counts, total, hashes, -1, 0, 0, 8, memo, memo, 0, shift, mask, state)
        recent_prefix(tab, setbits, hashes, 0, 0, shift, mask)
        match_pass(tab, setbits, hashes, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.uint64), 32, shift, mask,
                   np.full((8, 1), ~np.uint64(0), dtype=np.uint64))
        remove_pass(tab, setbits, counts, total, hashes, 0, 0, memo, memo, 0, shift, mask, state)
    remap_holders(tab, np.zeros(1, dtype=np.int64), -1, shift, mask)
    mark_sets(tab, np.zeros(1, dtype=np.bool_))
    grown = np.empty((32, 2), dtype=np.int64)
    rehash(grown, tab, np.uint64(59), 31)
    flags = np.zeros(3, dtype=np.int64)
    rehash_flagged(grown, tab, np.uint64(59), 31, flags)
    drop_generation_flagged(grown, 0, np.zeros(1, dtype=np.bool_), np.uint64(59), 31, flags)
    forget_flagged(grown, np.zeros(1, dtype=np.int64), 0, np.uint64(59), 31, np.zeros(1, dtype=np.bool_), flags)
    drop_generation(grown, 0, np.zeros(1, dtype=np.bool_), np.uint64(59), 31)
    insert_all(tab, np.full((1, 2), EMPTY, dtype=np.int64), shift, mask)
    drop_generation(tab, 0, np.zeros(1, dtype=np.bool_), shift, mask)
    from steersman.fleet import _prefix_residency  # late: the index's mixin (its kernel reads no table)

    _prefix_residency.warm_up()
