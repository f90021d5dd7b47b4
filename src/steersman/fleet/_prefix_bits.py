"""A holder set's bits into a per-replica array, for :class:`~steersman.fleet.prefix_index.PrefixIndex`.

A match against a prompt held by many replicas ends with one large Python-int bitmask to spread
over the replicas; numpy took four calls for it (bytes view, unpack, mask, put), ~5 µs at 1,000
replicas.  One compiled pass over the bytes does the same (compiled once, cached on disk).
"""

from __future__ import annotations

from numba import njit

import steersman._numba_cache  # noqa: F401  (before any kernel: the cache keyed by every kernel source)

__all__ = ["scatter_bits", "warm_up"]


@njit(cache=True, nogil=True)
def scatter_bits(raw, n, value, out, add):
    """``out[i] = value`` (``+= value`` with ``add``) for every bit ``i < n`` set in the little-endian bytes ``raw``."""
    for b in range(raw.size):
        x = raw[b]
        if x:
            base = b * 8
            for t in range(8):
                i = base + t
                if (x >> t) & 1 and i < n:
                    if add:
                        out[i] += value
                    else:
                        out[i] = value


def warm_up() -> None:
    """Compile (or load) now, with the argument types :class:`PrefixIndex` passes (a read-only byte view)."""
    import numpy as np

    for add in (False, True):
        scatter_bits(np.frombuffer(b"\x01", dtype=np.uint8), 1, 1, np.zeros(1, dtype=np.int64), add)
