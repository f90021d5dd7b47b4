"""The gateway's prefix index runs its full-table passes on a worker thread (``background=True``).

A generation's drop scans the whole table and a growth rehashes it (~30 ms and up to ~105 ms at the
default budget on a 2-core VM): on the event loop each froze every stream in flight.  These tests hold
the worker on an event to look at the index while a pass runs, deterministically (no timing).
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from steersman.fleet import _prefix_table as T
from steersman.fleet.prefix_index import PrefixIndex
from steersman.text import BlockHashes

BUDGET = 1 << 20  # small: a few thousand blocks a generation, so rotations and drops come quickly


def _prompt(rnd: random.Random, blocks: int) -> BlockHashes:
    return BlockHashes.of(np.array([rnd.getrandbits(62) for _ in range(blocks)], dtype=np.int64))


class _Gate:
    """Wraps a table kernel: notes the thread it ran on and, while ``hold`` is set, waits for ``go``."""

    def __init__(self, monkeypatch, name: str) -> None:
        self.inner = getattr(T, name)
        self.threads: list[str] = []
        self.hold = False
        self.entered = threading.Event()
        self.go = threading.Event()
        monkeypatch.setattr(T, name, self)

    inside = 0  # calls running now

    def __call__(self, *args):
        self.threads.append(threading.current_thread().name)
        self.inside += 1
        try:
            if self.hold:
                args[-1][0] = 1  # the pass's "started" flag: the caller goes on while it is held here
                self.entered.set()
                assert self.go.wait(30)
            return self.inner(*args)
        finally:
            self.inside -= 1


@pytest.fixture
def index():
    idx = PrefixIndex(4, BUDGET, background=True, background_from_slots=0)  # every pass on the worker
    yield idx
    idx.close()


def test_drops_and_growths_run_on_the_worker_never_on_the_caller(monkeypatch, index):
    drops, rehashes = _Gate(monkeypatch, "drop_generation_flagged"), _Gate(monkeypatch, "rehash_flagged")
    rnd = random.Random(1)
    for k in range(int(index.capacity * 1.25) // 8):  # 1.25x the capacity in 8-block prompts: growths, drops
        index.record(k % 4, _prompt(rnd, 8))
        index.match(_prompt(rnd, 4))
    index.settle()
    assert drops.threads and rehashes.threads
    assert all(t.startswith("prefix-index") for t in drops.threads + rehashes.threads), (drops.threads, rehashes.threads)


def test_during_a_drop_reads_match_nothing_and_records_wait_in_order(monkeypatch, index):
    drops = _Gate(monkeypatch, "drop_generation_flagged")
    rnd = random.Random(2)
    kept = _prompt(rnd, 8)
    drops.hold = True
    while True:  # fill every generation until the oldest must go
        index.record(0, _prompt(rnd, 8))
        index.record(1, kept)  # keeps `kept` in the newest generations
        if index._job is not None:
            if not index._readable:
                break  # a drop started
            index.settle()  # a growth: let it finish
    assert drops.entered.wait(30)
    assert index._job is not None and not index._readable
    assert not index.match(kept).any()  # the table is being rewritten: no prefix knowledge for now
    late = [_prompt(rnd, 8) for _ in range(5)]
    for i, p in enumerate(late):
        index.record(i % 4, p)
    assert len(index._later) >= 5  # waiting, in order
    assert not index.match(late[0]).any()
    drops.go.set()
    index.settle()
    assert index._job is None and index._readable and not index._later
    for i, p in enumerate(late):
        assert index.match(p)[i % 4] == 8  # applied once the drop was done
    assert index.match(kept)[1] == 8


def test_during_a_growth_reads_use_the_old_table(monkeypatch, index):
    rehash = _Gate(monkeypatch, "rehash_flagged")
    rnd = random.Random(3)
    first = _prompt(rnd, 8)
    index.record(2, first)
    rehash.hold = True
    start = index._tab.shape[0]
    while index._job is None:  # the first pass of this budget is a growth (drops come at twice the entries)
        index.record(0, _prompt(rnd, 16))
    assert rehash.entered.wait(30)
    assert index._job is not None and index._readable
    assert index.match(first)[2] == 8  # the old table answers while the new one is built
    assert index._tab.shape[0] == start
    rehash.go.set()
    index.settle()
    assert index._tab.shape[0] > start
    assert index.match(first)[2] == 8


def test_the_background_index_agrees_with_the_inline_one(monkeypatch):
    """Same records on both, well past the capacity (drops, growths, set interning): the counts stay
    consistent with the table, and every recent prompt is matched the same on both."""
    inline, bg = PrefixIndex(8, BUDGET), PrefixIndex(8, BUDGET, background=True, background_from_slots=0)
    try:
        rnd = random.Random(4)
        shared = [_prompt(rnd, 6) for _ in range(20)]  # prefixes several replicas hold: interned sets
        recent = []
        for k in range(int(inline.capacity * 1.5) // 10):
            p = BlockHashes.of(np.concatenate([rnd.choice(shared).array, _prompt(rnd, 4).array]))
            for idx in (inline, bg):
                idx.record(k % 8, p)
            recent = (recent + [(k % 8, p)])[-50:]
        bg.settle()
        for idx in (inline, bg):
            assert (idx._total == idx._counts.sum(axis=0)).all()
            assert idx._entries == int((idx._tab[:, 0] != T.EMPTY).sum())
            assert 2 * idx._entries <= idx._tab.shape[0]
        for r, p in recent:
            a, b = inline.match(p), bg.match(p)
            assert a[r] == b[r] == len(p)
    finally:
        bg.close()


def test_forgetting_a_replica_waits_for_the_running_pass_then_runs_on_the_worker(monkeypatch, index):
    drops = _Gate(monkeypatch, "drop_generation_flagged")
    drops.hold = True
    rnd = random.Random(5)
    while index._job is None or index._readable:
        index.record(rnd.randrange(4), _prompt(rnd, 8))
        if index._job is not None and index._readable:
            index.settle()  # a growth
    assert drops.entered.wait(30)
    forgets = _Gate(monkeypatch, "forget_flagged")
    forgets.hold = True
    inner = forgets.inner
    forgets.inner = lambda *a: (drops.inside == 0 or pytest.fail("a remap beside a drop"), inner(*a))[1]
    drops.go.set()
    kept = _prompt(rnd, 8)
    index.record(1, kept)  # waits behind the drop, then the forget
    index.forget_replica(1)  # waits for the drop first: the two passes never run together
    assert forgets.entered.wait(30) and forgets.threads[0].startswith("prefix-index")
    assert not index.match(kept).any() and index.blocks_view()[1] == 0  # forgotten at once for the policies
    forgets.go.set()
    index.settle()
    assert index._job is None and index.blocks_per_replica()[1] == 0
    assert index.match(kept)[1] == 0  # the record made before the forget did not outlive it
    assert (index._total == index._counts.sum(axis=0)).all()
    assert index._entries == int((index._tab[:, 0] != T.EMPTY).sum())
