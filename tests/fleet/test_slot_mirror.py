"""The gateway's mirror of a llama.cpp replica's slots follows llama-server's slot choice
(get_available_slot, server_prompt_cache::load of llama.cpp in llama-cpp-python 0.3.36)."""

from __future__ import annotations

import math
import random

from steersman.fleet import slots as slots_module
from steersman.fleet.slots import SAVED_PROMPTS, SlotMirror, common_blocks

A = tuple(range(100, 140))  # a 40-block prompt
A2 = A[:30] + tuple(range(500, 510))  # shares A's first 30 blocks
B = tuple(range(200, 240))
C = tuple(range(300, 340))


def test_common_blocks_is_the_shared_prefix_of_chained_hashes():
    assert common_blocks(A, A) == 40
    assert common_blocks(A, A2) == 30
    assert common_blocks(A, B) == 0
    assert common_blocks(A[:5], A) == 5
    assert common_blocks((), A) == 0


def test_a_running_prompt_serves_nobody_until_its_request_ends():
    m = SlotMirror(4, 16)
    assert m.take(1, A, now=0.0) == 0
    assert m.match(A) == 0  # its copy is in a busy slot; the other slots are empty
    assert m.take(2, A, now=0.1) == 0  # a follower sent now computes it again
    m.release(1, ran=True, now=1.0)
    assert m.match(A) == 40
    assert m.match(A2) == 30


def test_of_two_followers_sent_after_the_holder_ended_only_one_reuses_its_slot():
    m = SlotMirror(4, 16)
    m.take(1, A, now=0.0)
    m.release(1, ran=True, now=1.0)
    assert m.take(2, A, now=1.1) == 40
    assert m.take(3, A, now=1.1) == 0  # measured: 0 and 302 of 311 tokens cached


def test_the_most_similar_free_slot_wins_and_a_weak_match_goes_to_the_lru_slot():
    m = SlotMirror(3, 16)
    for key, p, t in ((1, A, 0.0), (2, A2, 0.0), (3, B, 0.0)):
        m.take(key, p, now=t)
    m.release(1, ran=True, now=1.0)
    m.release(2, ran=True, now=2.0)
    m.release(3, ran=True, now=3.0)
    assert m.take(4, A, now=4.0) == 40  # the slot holding A (full), not A2's (30 blocks)
    # 3 of 40 blocks = 7.5% similar: under the 10% threshold, so the least recently used free slot (A2's)
    weak = B[:3] + tuple(range(900, 937))
    assert m.match(weak) == 0
    assert m.take(5, weak, now=5.0) == 0
    # empty slots tie on LRU and llama-server takes the last: A went to slot 2, A2 to slot 1, B to slot 0
    assert [s.prompt for s in m._slots] == [B, weak, A]  # A2 was the least recently used
    # the idle B and A2 went to the host prompt cache when request 4 started (--cache-idle-slots); A2, pushed
    # out of its slot by request 5, was there already
    assert m.saved == [B, A2]


def test_a_prompt_pushed_out_of_its_slot_is_loaded_back_from_the_host_prompt_cache():
    m = SlotMirror(1, 16)
    m.take(1, A, now=0.0)
    m.release(1, ran=True, now=1.0)
    m.take(2, B, now=2.0)  # LRU slot: A is saved to the host cache
    m.release(2, ran=True, now=3.0)
    assert m.match(A) == 40  # B is not similar: LRU slot, and A comes back from the cache
    m.take(3, A, now=4.0)
    m.release(3, ran=True, now=5.0)
    m.take(4, C, now=6.0)  # saves A again (it left the cache when it was loaded)
    m.release(4, ran=True, now=7.0)
    assert m.match(A) == 40


def test_idle_slots_are_saved_when_a_request_starts_so_a_second_follower_loads_the_prompt():
    m = SlotMirror(4, 16)
    m.take(1, A, now=0.0)
    m.release(1, ran=True, now=1.0)
    m.take(2, B, now=1.5)  # starting: the idle slot holding A is saved to the host cache
    m.release(2, ran=True, now=2.0)
    assert m.take(3, A, now=3.0) == 40  # the slot holding A
    assert m.match(A) == 40  # its copy in the host cache, loaded into the least recently used free slot
    assert m.take(4, A, now=3.1) == 40
    assert m.match(A) == 0  # loading took it out of the cache; both copies are busy
    assert m.take(5, A, now=3.2) == 0


def test_without_a_start_in_between_an_idle_prompt_is_not_saved():
    m = SlotMirror(4, 16)
    m.take(1, A, now=0.0)
    m.release(1, ran=True, now=1.0)
    assert m.take(2, A, now=1.1) == 40
    assert m.take(3, A, now=1.1) == 0  # nothing started while A's slot was idle: no copy in the host cache


def test_the_host_cache_keeps_one_copy_of_a_prompt_and_drops_its_prefixes():
    m = SlotMirror(4, 16)
    short = A[:20]
    m.take(1, short, now=0.0)
    m.release(1, ran=True, now=0.5)
    m.take(2, B, now=1.0)  # saves the idle ``short``
    m.release(2, ran=True, now=1.5)
    assert m.saved == [short]
    m.take(3, A, now=2.0)  # by similarity (20 of 40 blocks) into short's slot: nothing is saved then
    m.release(3, ran=True, now=2.5)
    m.take(4, C, now=3.0)  # saves the idle A and B; A replaces its prefix ``short``
    assert sorted(m.saved) == sorted([B, A])
    m.release(4, ran=True, now=3.5)
    m.take(5, C, now=4.0)  # A and B are in the cache already: nothing changes
    assert sorted(m.saved) == sorted([B, A])


def test_the_host_cache_skips_prompts_it_would_keep_under_a_quarter_of():
    m = SlotMirror(1, 16)
    m.take(1, A, now=0.0)
    m.release(1, ran=True, now=1.0)
    m.take(2, B, now=2.0)  # A goes to the host cache
    m.release(2, ran=True, now=3.0)
    assert m.match(A[:8]) == 0  # would keep 8 of the cached A's 40 blocks: 20% < 25%, "don't trash large prompts"
    assert m.match(A[:10]) == 10  # 25%: loaded


def test_the_host_cache_is_bounded():
    m = SlotMirror(1, 16)
    for k in range(SAVED_PROMPTS + 10):
        m.take(k + 1, (10_000 + k,) * 1 + (k,), now=float(k))
        m.release(k + 1, ran=True, now=float(k) + 0.5)
    assert len(m.saved) == SAVED_PROMPTS


def test_with_every_slot_busy_a_request_waits_and_takes_the_slot_that_frees():
    m = SlotMirror(2, 16)
    m.take(1, A, now=0.0)
    m.take(2, B, now=0.0)
    assert m.match(A) == 0
    assert m.take(3, A, now=0.5) == 0  # queued in the engine
    m.release(1, ran=True, now=1.0)  # it takes the freed slot, which holds A
    assert m.match(A) == 0  # ... so no free slot is left
    assert [f.blocks for f in m.in_flight(A)] == [40]
    m.release(3, ran=True, now=2.0)
    assert m.match(A) == 40


def test_in_flight_reports_when_each_slot_frees_and_the_first_token_moves_it():
    m = SlotMirror(4, 16)
    m.take(1, A, now=0.0, due=2.0, decode_s=0.5)
    m.take(2, A2, now=0.0)
    got = sorted((f.blocks, f.due, f.since) for f in m.in_flight(A))
    assert got == [(30, math.inf, 0.0), (40, 2.0, 0.0)]
    m.first_token(1, now=2.5)  # the prefill ran late: it ends 0.5 s after its first token
    assert max(f.due for f in m.in_flight(A) if f.blocks == 40) == 3.0
    assert m.in_flight(B) == []


def test_a_request_that_never_ran_leaves_nothing_and_restart_forgets_all():
    m = SlotMirror(2, 16)
    m.take(1, A, now=0.0)
    m.release(1, ran=False, now=1.0)
    assert m.match(A) == 0
    m.take(2, A, now=2.0)
    m.release(2, ran=True, now=3.0)
    m.clear()
    assert m.match(A) == 0


def test_resizing_to_the_engines_slot_count_keeps_busy_slots():
    m = SlotMirror(4, 16)
    m.take(1, A, now=0.0)
    m.resize(2)
    assert len(m) == 2
    assert [f.blocks for f in m.in_flight(A)] == [40]
    m.resize(6)
    assert len(m) == 6
    m.release(1, ran=True, now=1.0)
    assert m.match(A) == 40


def test_a_change_tells_the_prefix_index():
    calls = []
    m = SlotMirror(2, 16, on_change=lambda: calls.append(1))
    m.take(1, A, now=0.0)
    m.release(1, ran=True, now=1.0)
    assert len(calls) == 2


class _ListCache(SlotMirror):
    """The mirror with its host prompt cache as one list scanned whole (the code before the cache was grouped
    by first block): the reference the grouped cache must agree with, choice for choice."""

    def __init__(self, n: int, block_size: int) -> None:
        super().__init__(n, block_size)
        self._saved = []

    @property
    def saved(self):
        return list(self._saved)

    def _save(self, prompt):
        saved, n = self._saved, len(prompt)
        if any(len(p) >= n and common_blocks(p, prompt) == n for p in saved):
            return
        kept = [p for p in saved if not (len(p) <= n and common_blocks(p, prompt) == len(p))]
        if len(kept) != len(saved):
            saved[:] = kept
            self._unsaved()
        saved.append(prompt)
        if len(saved) > slots_module.SAVED_PROMPTS:
            del saved[0]
            self._unsaved()

    def _drop(self, k):
        del self._saved[k]

    def _find(self, hashes, own):
        lcp_own = common_blocks(own, hashes)
        keep = lcp_own / len(own) if own else -1.0
        got, load = lcp_own, None
        for k, p in enumerate(self._saved):
            lcp = common_blocks(p, hashes)
            if lcp / len(p) >= 0.25 and lcp / len(p) > keep and lcp > got:
                keep, got, load = lcp / len(p), lcp, k
        return load


def test_the_cache_grouped_by_first_block_chooses_as_a_scan_of_the_whole_cache(monkeypatch):
    # and a take reusing the decision's match (same prompt object, nothing changed since) chooses as a fresh one
    monkeypatch.setattr(slots_module, "SAVED_PROMPTS", 24)  # a bound the run reaches: eviction is compared too
    rng = random.Random(3)
    # tenants' system prompts (shared leading blocks), their questions, and unique prompts, some prefixes
    # of others, 600 requests over 3 slots
    systems = [tuple(rng.randrange(1 << 40) for _ in range(rng.randint(2, 12))) for _ in range(6)]
    for seed in range(4):
        rng = random.Random(seed)
        grouped, scanned = SlotMirror(3, 16), _ListCache(3, 16)
        plain = SlotMirror(3, 16)  # asked no match before its takes: it never reuses a match's choice
        running: list[int] = []
        peak = 0
        for k in range(1, 601):
            now = float(k)
            if running and (len(running) >= 4 or rng.random() < 0.45):
                key = running.pop(rng.randrange(len(running)))
                ran = rng.random() < 0.9
                for m in (grouped, scanned, plain):
                    m.release(key, ran, now)
            else:
                r = rng.random()
                if r < 0.7:
                    sys_p = systems[rng.randrange(len(systems))]
                    p = sys_p + tuple(rng.randrange(1 << 40) for _ in range(rng.randint(0, 3)))
                    if rng.random() < 0.2:
                        p = p[: rng.randint(1, len(p))]
                else:
                    p = tuple(rng.randrange(1 << 40) for _ in range(rng.randint(1, 8)))
                assert grouped.match(p) == scanned.match(p)
                if running and rng.random() < 0.2:  # a request ends between a decision and its dispatch
                    key = running.pop(rng.randrange(len(running)))
                    for m in (grouped, scanned, plain):
                        m.release(key, True, now)
                took = plain.take(k, tuple(list(p)), now)  # another object: chosen afresh
                assert grouped.take(k, p, now) == scanned.take(k, p, now) == took
                running.append(k)
            assert grouped.saved == scanned.saved
            assert [s.prompt for s in grouped._slots] == [s.prompt for s in scanned._slots]
            assert grouped.saved == plain.saved and [s.prompt for s in plain._slots] == [s.prompt for s in grouped._slots]
            peak = max(peak, len(grouped.saved))
        assert peak == 24  # the cache filled up and evicted
