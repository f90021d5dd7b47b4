"""The compiled holder-set scatter against numpy's unpackbits (what the prefix index used before)."""

import numpy as np

from steersman.fleet._prefix_bits import scatter_bits


def test_scatter_bits_matches_numpy_unpackbits():
    rng = np.random.default_rng(0)
    for n in (1, 7, 8, 9, 63, 100, 1000, 1001):
        nbytes = (n + 7) // 8
        for density in (0.0, 0.01, 0.2, 1.0):
            v = 0
            for i in np.flatnonzero(rng.random(n) < density):
                v |= 1 << int(i)
            raw = np.frombuffer(v.to_bytes(nbytes, "little"), dtype=np.uint8)
            bits = np.unpackbits(raw, count=n, bitorder="little")
            start = rng.integers(-5, 5, n).astype(np.int64)
            value = int(rng.integers(1, 500))
            want_set, want_add = start.copy(), start.copy()
            np.putmask(want_set, bits, value)
            want_add[bits.view(bool)] += value
            got_set, got_add = start.copy(), start.copy()
            scatter_bits(raw, n, value, got_set, False)
            scatter_bits(raw, n, value, got_add, True)
            assert np.array_equal(got_set, want_set) and np.array_equal(got_add, want_add)
