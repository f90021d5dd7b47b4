"""KV events: the mirror, the engine model's pool as their source, the twin reading them."""

from __future__ import annotations

import random

import pytest

from steersman.fleet.kv_events import KvEventMirror
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.slots import common_blocks
from steersman.sim.kvcache import KVPool
from steersman.sim.request import SimRequest


def test_mirror_match_is_the_held_prefix():
    m = KvEventMirror()
    chain = list(range(100, 120))
    assert m.match(chain) == 0
    m.stored(chain[:7])
    assert m.match(chain) == 7
    assert m.match(chain[:3]) == 3
    m.stored(chain[7:20], chain[6])
    assert m.match(chain) == 20
    m.removed(chain[12:])  # evicted from the deep end, as vLLM does
    assert m.match(chain) == 12
    assert m.match([999, *chain]) == 0  # another prompt's first block: nothing
    m.cleared()
    assert m.match(chain) == 0 and len(m) == 0


def test_the_index_takes_a_mirrored_replicas_match_and_records_nothing_for_it():
    idx = PrefixIndex(2, 1 << 20)
    m = KvEventMirror()
    idx.mirror_events(1, m)
    hashes = tuple(range(1, 11))
    idx.record(0, hashes)
    idx.record(1, hashes)  # routed there: the events, not the routing, say what it holds
    idx.record_later(1, hashes)
    assert list(idx.match(hashes)) == [10, 0]
    m.stored(hashes[:4])  # the engine cached the first four blocks: the memo goes stale
    assert list(idx.match(hashes)) == [10, 4]
    assert list(idx.match_raw(hashes)) == [10, 4]
    assert idx.blocks_per_replica()[1] == 0


def _cached(pool: KVPool) -> set[int]:
    return {h for s in pool._segments() for h in s.hs[s.lo : s.hi]}


@pytest.mark.parametrize("seed", range(4))
def test_the_pools_events_leave_the_mirror_holding_what_it_caches(seed):
    """Random admissions, growth, frees and evictions (a pool much smaller than the prompts offered): after every
    operation the mirror fed by the pool's listener holds exactly the pool's cached hashes."""
    rng = random.Random(seed)
    pool = KVPool(num_blocks=64, block_size=16)
    m = KvEventMirror()
    pool.listener = m
    prefixes = [[rng.getrandbits(60) for _ in range(rng.randint(1, 12))] for _ in range(6)]
    running: list[SimRequest] = []
    for step in range(300):
        if running and (rng.random() < 0.45 or len(running) > 5):
            pool.free(running.pop(rng.randrange(len(running))))
        else:
            base = rng.choice(prefixes)
            tail = [rng.getrandbits(60) for _ in range(rng.randint(0, 6))]
            ids_blocks = base + tail
            req = SimRequest(req_id=f"r{step}", prompt_len=16 * len(ids_blocks) + rng.randint(0, 15), max_output=1,
                             block_hashes=_chain(ids_blocks))
            if pool.admit(req, budget=10_000, chunked=False) is not None:
                running.append(req)
        assert m._held == _cached(pool), f"step {step}"
        assert len(m) == pool.num_cached
    assert m.removed_events > 0  # evictions happened (a pool much smaller than what it was offered)
    pool.reset()
    assert len(m) == 0 and m.cleared_events == 1


def _chain(blocks: list[int]) -> tuple[int, ...]:
    out, h = [], 0
    for b in blocks:
        h = hash((h, b))
        out.append(h)
    return tuple(out)


def test_events_whose_hashes_are_not_the_gateways_are_dropped_after_enough_unpredicted_hits(caplog):
    """A real vLLM's token ids are its model's, not the gateway's: its events then never match a prompt, and the
    replica would look cold for ever; once its engine reported kv_events_mismatch_after hits the events never
    predicted, the index reads that replica from routing again."""
    idx = PrefixIndex(2, 1 << 20)
    for r in (0, 1):
        idx.mirror_events(r, KvEventMirror(mismatch_after=4))
    idx.events[1].stored([10**6])  # it confirms once: kept for good
    assert idx.match((10**6,)).tolist() == [0, 1]  # a prompt matched what its events stored
    idx.observe_hits(1, 3, 3)
    for _ in range(3):
        idx.observe_hits(0, 0, 5)
        idx.observe_hits(1, 0, 5)
        idx.observe_hits(0, 0, 0)  # no hit reported: no evidence either way
    assert set(idx.events) == {0, 1}
    idx.observe_hits(0, 0, 5)
    idx.observe_hits(1, 0, 5)
    assert set(idx.events) == {1} and 0 not in idx.slots
    assert "matched none of 4 prefix hits" in caplog.text
    hashes = (1, 2, 3)
    idx.record(0, hashes)  # learnt from routing again
    assert idx.match(hashes).tolist() == [3, 0]


def test_a_prompt_routed_there_counts_until_its_first_token():
    """The engine publishes a prompt's blocks once it has scheduled it: until then the replica is credited with
    the prompts routed there (a burst of one prefix would otherwise spread before its first request is cached)."""
    idx = PrefixIndex(2, 1 << 20)
    m = KvEventMirror()
    idx.mirror_events(0, m)
    hashes = tuple(range(1, 9))
    assert idx.expect(0, 7, hashes) is True and idx.expect(1, 8, hashes) is False  # replica 1 records as before
    assert idx.match(hashes[:5] + (99,)).tolist()[0] == 5
    m.stored(hashes[:3])
    idx.settle_expected(0, 7)  # its first token: the events tell from now on
    assert idx.match(hashes).tolist()[0] == 3
    idx.expect(0, 9, (42, 43))
    assert idx.match(hashes).tolist()[0] == 3  # a prompt that begins otherwise shares nothing
    m.cleared()
    assert idx.match((42, 43)).tolist()[0] == 0


def test_credit_for_routed_prompts_does_not_vouch_for_events_that_never_matched():
    """With mismatched hashes the only predicted hits come from the prompts routed there (expect): those must not
    count as the events being right."""
    idx = PrefixIndex(1, 1 << 20)
    m = KvEventMirror(mismatch_after=3)
    idx.mirror_events(0, m)
    m.stored([777, 778])  # the engine's blocks, in hashes no prompt here has
    hashes = (1, 2, 3)
    for k in range(3):
        idx.expect(0, k, hashes)
        assert idx.match(hashes).tolist() == [3]  # credited from routing, not from the events
        idx.observe_hits(0, 3, 3)
        idx.settle_expected(0, k)
    assert not idx.events  # three engine-reported hits, none from what the events stored: dropped


@pytest.mark.parametrize("seed", range(3))
def test_the_index_asks_only_the_mirrors_that_may_share_a_prompts_first_block(seed):
    """Three pools publishing to one index, random admissions, frees, evictions, prompts routed and settled, a reset
    and a mirror dropped: after every operation the index's match equals every mirror asked one by one, and the
    first-block index names exactly the replicas holding a chain's root or a pending prompt beginning with it (fails
    if a root's eviction or a settle is not told: a replica would be asked in vain, or a holder missed)."""
    rng = random.Random(seed)
    idx = PrefixIndex(4, 1 << 20)
    pools = [KVPool(num_blocks=48, block_size=16) for _ in range(3)]
    mirrors = [KvEventMirror() for _ in pools]
    for r, (pool, m) in enumerate(zip(pools, mirrors)):
        pool.listener = m
        idx.mirror_events(r, m)
    prefixes = [[rng.getrandbits(60) for _ in range(rng.randint(1, 10))] for _ in range(5)]
    firsts = {_chain(p)[0] for p in prefixes}
    running: list[tuple[int, SimRequest]] = []
    pending: dict[int, int] = {}  # ticket key -> replica
    for step in range(400):
        op = rng.random()
        base = rng.choice(prefixes)
        prompt = _chain(base + [rng.getrandbits(60) for _ in range(rng.randint(0, 5))])
        if op < 0.3 and running:
            r, req = running.pop(rng.randrange(len(running)))
            pools[r].free(req)
        elif op < 0.45:
            r = rng.randrange(4)
            if idx.expect(r, step, prompt):
                pending[step] = r
            else:
                idx.record(r, prompt)  # replica 3 learns from routing
        elif op < 0.55 and pending:
            key = rng.choice(list(pending))
            idx.settle_expected(pending.pop(key), key)
        elif op < 0.56:
            pools[rng.randrange(3)].reset()
        else:
            r = rng.randrange(3)
            req = SimRequest(req_id=f"r{step}", prompt_len=16 * len(prompt), max_output=1, block_hashes=prompt)
            if pools[r].admit(req, budget=10_000, chunked=False) is not None:
                running.append((r, req))
        if step == 300:  # its events never predicted a hit: read from routing again, and out of the first-block index
            mirrors[2].mismatch_after = 0
            idx.observe_hits(2, 0, 1)
            assert 2 not in idx.events
        got = idx.match(prompt).tolist()
        for r, m in enumerate(mirrors):
            if r not in idx.events:
                continue
            held = [h in m._held for h in prompt]
            lead = held.index(False) if False in held else len(prompt)
            routed = max((common_blocks(prompt, p) for p in m._pending.values()), default=0)
            if not any(held[lead:]):  # what it holds of the prompt is a prefix (the engine model leaves holes rarely)
                assert got[r] == max(lead, routed), f"step {step} replica {r}"
            else:  # a hole: the binary search lands past it or before it
                assert max(lead, routed) <= got[r] <= len(prompt), f"step {step} replica {r}"
        for r, m in enumerate(mirrors):  # every prompt's first block is one of the prefixes' first blocks
            for h in firsts:
                named = r in idx.holders.holders(h)
                may_share = h in m._held or any(p[0] == h for p in m._pending.values())
                assert named == (r in idx.events and may_share), f"step {step} replica {r}"
    assert sum(m.removed_events for m in mirrors) > 0


def test_events_mirrors_are_not_slot_mirrors():
    """Slot waiting (llama.cpp: a prompt reused only from a free slot) asks its mirrors for running copies; a
    replica with KV events has none of that, so an unprofiled vLLM publishing events must not be taken for one
    (it raised AttributeError in the decision when event mirrors were kept with the slot mirrors)."""
    import types

    import numpy as np

    from steersman.policy.slot_wait import wait_for_slot

    idx = PrefixIndex(2, 1 << 20)
    m = KvEventMirror()
    idx.mirror_events(0, m)
    hashes = (5, 6, 7)
    m.stored(hashes)
    assert 0 not in idx.slots and idx.match(hashes).tolist() == [3, 0]
    snap = types.SimpleNamespace(prefix=idx, time=0.0,
                                 statics=types.SimpleNamespace(block_size=16, modelled=np.zeros(2, dtype=bool)))
    req = types.SimpleNamespace(block_hashes=hashes, resumed=False, prompt_tokens=48, slot_waiters_ahead=0)
    assert wait_for_slot(snap, req, np.array([0, 1]), np.array([0.5, 0.5]), idx.match(hashes), False, 1.0, 0.8,
                         0.5) is None
