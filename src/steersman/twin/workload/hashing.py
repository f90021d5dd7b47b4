"""Prompt block hashes without tokens: equal hashes mean equal prefixes.

The real gateway hashes 16-token blocks in a chain (``steersman.text.block_hashes``:
block *i*'s hash covers block *i-1*'s), so a hash stands for the whole prefix up
to its block.  The twin never has tokens.  It gives each *namespace* -- one
token sequence that grows by appending, e.g. an application's system prompt, or
one task's context after it -- a 64-bit mask, and block *i* of that sequence the
hash ``mask(ns) ^ P[i]`` where ``P`` is a fixed table of random 64-bit values per
block position.

A prompt is a namespace's prefix, except that its first blocks may come from a
parent namespace: an agent prompt is the application's system prompt (full
blocks ``0 .. S-1`` from the app namespace) followed by the task's context
(blocks ``S ..`` from the task namespace; the block that straddles the end of the
system prompt is the task's).  So two prompts share block *i* exactly when they
share blocks ``0 .. i``: within one namespace the sequence only ever grows, and
the namespace of block *i* decides all its predecessors.

Uniqueness: ``mask`` is SplitMix64's finaliser, a bijection of 64-bit words, so
two namespaces never share a block at the same position; at different positions
a clash needs ``P[i] ^ P[j] == mask(a) ^ mask(b)``, a 2**-64 event per pair,
the same odds as the real tokenizer's 64-bit hashes.  Values are signed 64-bit
(like Python's ``hash``), well spread in every bit (the prefix index buckets by
low bits), and identical in every process (no ``str`` hashing).

Namespace keys (inputs to ``mask``): ``name_namespace(s)`` for a named shared
prompt (top bit set, 63 bits of BLAKE2b of the name), ``source_namespace(src, k, seg)``
for one source's sequences: ``(src + 1) << 44 | k << 12 | seg``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from steersman.policy.base import mix64

__all__ = [
    "mix64", "mask", "masks_np", "name_namespace", "source_namespace", "positions", "block_hashes", "block_hashes_np",
    "MAX_SOURCES", "MAX_KEYS", "MAX_SEGMENTS",
]

_POS_SALT = 0x5EED_B10C_0000_0000
MAX_SOURCES = 1 << 19
MAX_KEYS = 1 << 32
MAX_SEGMENTS = 1 << 12


def mask(ns: int) -> int:
    """The signed 64-bit mask of namespace key ``ns``."""
    x = mix64(ns)
    return x - (1 << 64) if x >> 63 else x


def _mix64_np(x: np.ndarray) -> np.ndarray:
    """Vectorised :func:`mix64` over a uint64 array (wrapping arithmetic), returned as int64."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x.view(np.int64)


def masks_np(keys: np.ndarray) -> np.ndarray:
    """Vectorised :func:`mask` over an array of namespace keys (< 2**64)."""
    return _mix64_np(np.asarray(keys, dtype=np.uint64))


def name_namespace(name: str) -> int:
    """Namespace key of a named shared prompt: equal names share blocks, whichever source uses them."""
    d = hashlib.blake2b(name.encode("utf-8"), digest_size=8, person=b"steersman-ns").digest()
    return (1 << 63) | (int.from_bytes(d, "little") >> 1)


def source_namespace(source: int, key: int, segment: int = 0) -> int:
    """Namespace key of sequence ``key`` (a task, a trace request or block chain) of source ``source``."""
    if not (0 <= source < MAX_SOURCES and 0 <= key < MAX_KEYS and 0 <= segment < MAX_SEGMENTS):
        raise ValueError(f"namespace out of range: source {source}, key {key}, segment {segment}")
    return ((source + 1) << 44) | (key << 12) | segment


_pos = np.empty(0, dtype=np.int64)


def positions(stop: int) -> np.ndarray:
    """``P[0:stop]``, the per-position random words (int64), grown on demand; the same in every process."""
    global _pos
    if stop > _pos.size:
        n = max(stop, 2 * _pos.size, 4096)
        _pos = _mix64_np(np.arange(n, dtype=np.uint64) + np.uint64(_POS_SALT))
        _pos.setflags(write=False)
    return _pos[:stop]


def block_hashes_np(ns_mask: int, start: int, stop: int) -> np.ndarray:
    """Hashes of blocks ``start .. stop-1`` of the namespace with mask ``ns_mask`` (int64 array)."""
    return positions(stop)[start:stop] ^ np.int64(ns_mask)


def block_hashes(ns_mask: int, start: int, stop: int) -> list[int]:
    """Hashes of blocks ``start .. stop-1`` of the namespace with mask ``ns_mask``."""
    if stop <= start:
        return []
    return block_hashes_np(ns_mask, start, stop).tolist()
