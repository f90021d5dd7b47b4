"""The prefix index's compiled table against a dict: lookups stay exact through deletions in clusters that
wrap around the table's end (backward-shift deletion), generation drops, holder remaps and growth."""

from __future__ import annotations

import random

import numpy as np

from steersman.fleet import _prefix_table as T

SLOTS = 64
SHIFT, MASK = np.uint64(64 - 6), SLOTS - 1


def _home(h: int) -> int:
    return ((h * 0x9E3779B97F4A7C15) % 2**64) >> 58


def _keys_near_the_end(rnd: random.Random, n: int) -> list[int]:
    """Keys whose home slot is one of the last six: their clusters wrap around to slot 0."""
    out: list[int] = []
    while len(out) < n:
        h = rnd.randrange(-(2**63) + 1, 2**63)
        if _home(h % 2**64) >= SLOTS - 6 and h not in out:
            out.append(h)
    return out


def _check(tab: np.ndarray, model: dict[int, int]) -> None:
    for h, v in model.items():
        assert T.find_value(tab, h, SHIFT, MASK) == v
    assert int((tab[:, 0] != T.EMPTY).sum()) == len(model)


def test_dropping_generations_keeps_every_other_key_reachable():
    rnd = random.Random(1)
    for trial in range(200):
        tab = np.full((SLOTS, 2), T.EMPTY, dtype=np.int64)
        keys = _keys_near_the_end(rnd, 24) + [rnd.randrange(-(2**63) + 1, 2**63) for _ in range(6)]
        rnd.shuffle(keys)
        model, gen = {}, {}
        counts, total = np.zeros((8, 4), dtype=np.int64), np.zeros(4, dtype=np.int64)
        state, memo = np.zeros(3, dtype=np.int64), np.zeros(1, dtype=np.int64)
        setbits = np.zeros((1, 1), dtype=np.uint64)
        for h in keys:
            g, r = rnd.randrange(3), rnd.randrange(4)
            T.record_pass(tab, setbits, counts, total, np.array([h], dtype=np.int64), 0, r, g, 8, memo, memo, 0,
                          SHIFT, MASK, state)
            model[h], gen[h] = r, g
        _check(tab, model)
        g = rnd.randrange(3)
        used = np.zeros(1, dtype=np.bool_)
        dropped = T.drop_generation(tab, g, used, SHIFT, MASK)
        assert dropped == sum(1 for h in model if gen[h] == g), trial
        model = {h: v for h, v in model.items() if gen[h] != g}
        _check(tab, model)
        assert not used.any()  # single replicas only here: no set marked
        assert counts.sum() == total.sum() == len(keys)


def test_remapping_holders_and_freeing_a_replica_alone():
    rnd = random.Random(2)
    for trial in range(200):
        tab = np.full((SLOTS, 2), T.EMPTY, dtype=np.int64)
        keys = _keys_near_the_end(rnd, 20)
        model = {}
        for h in keys:  # written directly: values -1..-3 are sets 0..2, 0..3 replicas
            v = rnd.choice([-1, -2, -3, 0, 1, 2, 3])
            i = T.find_value(tab, h, SHIFT, MASK)
            assert i == T.NONE
            T.insert_all(tab, np.array([[h, (v << 8) | 5]], dtype=np.int64), SHIFT, MASK)
            model[h] = v
        remap = np.array([~2, 1, ~0], dtype=np.int64)  # set 0 -> set 2, set 1 -> replica 1, set 2 -> set 0
        gone = rnd.randrange(4)
        freed = T.remap_holders(tab, remap, gone, SHIFT, MASK)
        want = {}
        for h, v in model.items():
            nv = int(remap[~v]) if v < 0 else v
            if nv != gone:
                want[h] = nv
        assert freed == len(model) - len(want), trial
        _check(tab, want)
        assert all(p & 255 == 5 for p in tab[tab[:, 0] != T.EMPTY, 1].tolist())  # generations kept


def test_a_hash_equal_to_the_empty_marker_is_still_stored():
    tab = np.full((SLOTS, 2), T.EMPTY, dtype=np.int64)
    counts, total = np.zeros((8, 1), dtype=np.int64), np.zeros(1, dtype=np.int64)
    state, memo = np.zeros(3, dtype=np.int64), np.zeros(1, dtype=np.int64)
    hashes = np.array([T.EMPTY, 7], dtype=np.int64)
    T.record_pass(tab, np.zeros((1, 1), dtype=np.uint64), counts, total, hashes, 0, 0, 0, 8, memo, memo, 0,
                  SHIFT, MASK, state)
    assert T.find_value(tab, T.EMPTY, SHIFT, MASK) == 0 and T.find_value(tab, 7, SHIFT, MASK) == 0
    assert total[0] == 2


_LIFE = """
import numpy as np
from steersman.fleet import _prefix_residency as R
from steersman.fleet import _prefix_table as T
from steersman.fleet.prefix_index import PrefixIndex
from steersman.text import BlockHashes

T.warm_up()
kernels = [getattr(m, name) for m in (T, R) for name in m.__all__ if hasattr(getattr(m, name), "signatures")]
before = [len(k.signatures) for k in kernels]
for background in (False, True):  # the twin's index; the gateway's (passes on a worker thread)
    idx = PrefixIndex(4, 1 << 20, background=background)
    h = BlockHashes.of(np.arange(40, dtype=np.int64))
    idx.record(1, h)
    idx.match(h)
    idx.correct(2, h, 3)
    idx.forget_replica(1)
    idx.match(tuple(range(5)))
    idx.record(0, list(range(9)))
    idx.correct(0, (1, 2, 3), 1)
    idx.set_capacity(2, 500.0)  # the residency mask (prefix_residency)
    idx.match(h)
    idx.blocks_view()
    for k in range(3000):  # growth, rotations, drops
        idx.record(k % 4, [hash((k, i)) for i in range(20)])
        idx.match(h)
    idx.close()
print(before == [len(k.signatures) for k in kernels], len(kernels))
"""


def test_warm_up_covers_every_specialization_the_index_uses():
    """A specialization first met on a live request costs it a compile or a cache load (read-only hashes from
    :class:`BlockHashes` are one): after ``warm_up`` the index's whole life adds none.  In a fresh process, so
    that no earlier test has loaded them."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LIFE], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["True", "15"], out.stdout + out.stderr


def test_a_generation_drop_marks_the_sets_the_blocks_left_use():
    rnd = random.Random(3)
    for trial in range(200):
        tab = np.full((SLOTS, 2), T.EMPTY, dtype=np.int64)
        left: dict[int, tuple[int, int]] = {}
        for h in _keys_near_the_end(rnd, 24):  # clusters wrap, so deletions move entries across the end
            v, g = rnd.choice([-1, -2, -3, -4, 0, 1]), rnd.randrange(3)
            T.insert_all(tab, np.array([[h, (v << 8) | g]], dtype=np.int64), SHIFT, MASK)
            left[h] = (v, g)
        used = np.zeros(4, dtype=np.bool_)
        T.drop_generation(tab, 1, used, SHIFT, MASK)
        want = {~v for v, g in left.values() if g != 1 and v < 0}
        assert set(np.flatnonzero(used).tolist()) == want, trial
        _check(tab, {h: v for h, (v, g) in left.items() if g != 1})
