"""KVPool: block accounting, prefix hits, ref counts and LRU eviction (vLLM block_pool.py)."""

from __future__ import annotations

from simhelpers import BS, req, tokens

from steersman.sim import KVPool


def test_allocate_free_and_usage():
    kv = KVPool(10, BS)
    r = req("a", 40)  # 2 full blocks + 8 tokens
    assert kv.allocate(r, 40)
    assert len(r.blocks) == 3 and kv.num_free == 7 and kv.num_used == 3
    assert abs(kv.usage() - 0.3) < 1e-12
    kv.cache(r, 40)
    assert r.blocks[:2] == list(r.block_hashes) and r.blocks[2] is None
    assert kv.num_cached == 2
    kv.free(r)
    assert kv.num_free == 10 and kv.usage() == 0.0 and r.blocks == []
    assert kv.num_cached == 2  # cached blocks stay (ref 0, evictable)


def test_allocate_fails_without_side_effects():
    kv = KVPool(4, BS)
    a = req("a", 48)
    assert kv.allocate(a, 48)
    b = req("b", 48)
    assert not kv.allocate(b, 48)
    assert b.blocks == [] and kv.num_free == 1


def test_lookup_hits_and_never_the_last_token():
    kv = KVPool(20, BS)
    p = tokens(1, 64)  # exactly 4 blocks
    a = req("a", p)
    kv.allocate(a, 64)
    kv.cache(a, 64)
    b = req("b", p)
    # (64 - 1) // 16 = 3: a block-aligned full hit still recomputes its last block
    assert kv.lookup(b) == list(a.block_hashes[:3])
    c = req("c", p + tokens(9, 5))
    assert kv.lookup(c) == list(a.block_hashes)  # 69 tokens: all 4 blocks hit
    d = req("d", tokens(1, 32) + tokens(7, 32))  # diverges after 2 blocks
    assert kv.lookup(d) == list(a.block_hashes[:2])


def test_hit_blocks_are_shared_and_touched():
    kv = KVPool(10, BS)
    p = tokens(1, 64)
    a = req("a", p)
    kv.allocate(a, 64)
    kv.cache(a, 64)
    kv.free(a)
    assert kv.num_free == 10
    b = req("b", p + [1])
    hits = kv.lookup(b)
    assert len(hits) == 4
    assert kv.blocks_needed(b, 65, hits) == 5  # 4 evictable hits leave the free queue + 1 new
    assert kv.allocate(b, 65, hits)
    assert kv.num_free == 5 and all(kv.ref_count(h) == 1 for h in hits)
    c = req("c", p + [2])
    hits_c = kv.lookup(c)
    assert kv.blocks_needed(c, 65, hits_c) == 1  # shared blocks cost nothing
    kv.allocate(c, 65, hits_c)
    assert kv.num_free == 4 and all(kv.ref_count(h) == 2 for h in hits)
    kv.free(b)
    kv.free(c)
    assert kv.num_free == 10


def test_lru_eviction_order_tail_first():
    """Free queue: fresh blocks, then freed requests oldest first, each tail first."""
    kv = KVPool(6, BS)
    a = req("a", tokens(1, 48))
    b = req("b", tokens(2, 48))
    for r in (a, b):
        kv.allocate(r, 48)
        kv.cache(r, 48)
    kv.free(a)
    kv.free(b)
    a0, a1, a2 = a.block_hashes
    b0, b1, b2 = b.block_hashes
    assert kv.free_queue() == [a2, a1, a0, b2, b1, b0]
    # taking 4 fresh blocks evicts a's blocks tail first, then b's tail
    c = req("c", tokens(3, 64))
    kv.allocate(c, 64)
    assert not kv.is_cached(a2) and not kv.is_cached(a0) and not kv.is_cached(b2)
    assert kv.is_cached(b1) and kv.is_cached(b0)
    assert kv.free_queue() == [b1, b0]
    # a prefix hit on b's head survives; b's evicted tail is recomputed
    d = req("d", tokens(2, 48) + [5])
    assert kv.lookup(d) == [b0, b1]


def test_touch_moves_block_out_of_eviction_order():
    kv = KVPool(4, BS)
    a = req("a", tokens(1, 32))
    kv.allocate(a, 32)
    kv.cache(a, 32)
    kv.free(a)  # queue: fresh, fresh, a1, a0
    b = req("b", tokens(1, 16) + [9])
    hits = kv.lookup(b)
    kv.allocate(b, 17, hits)  # touches a0, takes one fresh block
    assert kv.free_queue() == [None, a.block_hashes[1]]
    kv.free(b)  # b's tail (uncached), then a0: a0 is now the most recently freed
    assert kv.free_queue() == [None, a.block_hashes[1], None, a.block_hashes[0]]


def test_duplicate_block_stays_uncached():
    kv = KVPool(10, BS)
    p = tokens(1, 32)
    a, b = req("a", p), req("b", p)
    kv.allocate(a, 32)
    kv.allocate(b, 32)  # both computed the same prefix before either was cached
    kv.cache(a, 32)
    kv.cache(b, 32)
    assert a.blocks == list(a.block_hashes) and b.blocks == [None, None]
    kv.free(a)
    kv.free(b)
    assert kv.num_free == 10 and kv.num_cached == 2


def test_caching_disabled():
    kv = KVPool(10, BS, caching=False)
    a = req("a", tokens(1, 64))
    kv.allocate(a, 64)
    kv.cache(a, 64)
    assert a.blocks == [None] * 4 and kv.lookup(req("b", tokens(1, 64))) == []


# -- the segment representation against the per-block one it replaced ------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from legacy_engine import KVPool as LegacyPool  # noqa: E402
from legacy_engine import LegacyRequest  # noqa: E402

from steersman.sim import SimRequest  # noqa: E402
from steersman.text.tokenizer import block_hashes  # noqa: E402

_op = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 7), st.integers(1, 400)),  # request, tokens to allocate
    st.tuples(st.just("grow"), st.integers(0, 7), st.integers(1, 120)),  # running request: more tokens
    st.tuples(st.just("cache"), st.integers(0, 7), st.integers(0, 0)),  # cache everything allocated
    st.tuples(st.just("free"), st.integers(0, 7), st.integers(0, 0)),
    st.tuples(st.just("take"), st.integers(0, 0), st.integers(1, 12)),
)


def _prompt(i: int) -> list[int]:
    # 8 prompts that are prefixes of each other or share prefixes of various lengths
    base = [tokens(1, 160), tokens(1, 96) + tokens(2, 64), tokens(1, 48) + tokens(3, 100), tokens(4, 150)]
    return (base + [p[:-24] for p in base])[i]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=80), num_blocks=st.integers(8, 60), caching=st.booleans())
def test_pool_equals_the_per_block_pool(ops, num_blocks, caching):
    """Random admissions (lookup + allocate), chunked growth, caching, frees and takes on both pools."""
    new, old = KVPool(num_blocks, BS, caching), LegacyPool(num_blocks, BS, caching)
    rn = [SimRequest(f"r{i}", len(_prompt(i)), 8, block_hashes(_prompt(i), BS)) for i in range(8)]
    ro = [LegacyRequest(f"r{i}", len(_prompt(i)), 8, block_hashes(_prompt(i), BS)) for i in range(8)]
    alloc = [0] * 8  # tokens allocated (0: holds nothing)
    for kind, i, n in ops:
        a, b = rn[i], ro[i]
        if kind == "admit" and not alloc[i]:
            hits_a, hits_b = new.lookup(a), old.lookup(b)
            assert hits_a == hits_b
            n = min(max(n, len(hits_a) * BS + 1), a.prompt_len)
            ok = new.allocate(a, n, hits_a)
            assert ok == old.allocate(b, n, hits_b)
            if ok:
                alloc[i] = n
        elif kind == "grow" and alloc[i]:
            n = min(alloc[i] + n, a.prompt_len)
            ok = new.allocate(a, n)
            assert ok == old.allocate(b, n)
            if ok:
                alloc[i] = n
        elif kind == "cache" and alloc[i]:
            new.cache(a, alloc[i])
            old.cache(b, alloc[i])
        elif kind == "free" and alloc[i]:
            new.free(a)
            old.free(b)
            alloc[i] = 0
        elif kind == "take" and n <= new.num_free:
            new.take(n)
            old.take(n)
        assert new.num_free == old.num_free and new.num_cached == old.num_cached
        assert new.free_queue() == old.free_queue()
        assert new.ref_counts() == old._ref
        for x, y in zip(rn, ro):
            assert x.blocks == y.blocks and x.num_hashed == y.num_hashed


def test_block_cached_after_a_duplicate_can_outlive_the_block_before_it():
    """b duplicates a's first 6 blocks (computed concurrently), then caches its own 4; a's are
    evicted first, so b's stay cached without their parent: c, with b's prompt, must not cache
    its copies of them (they are duplicates), exactly as the per-block pool does."""
    p_a = tokens(1, 160)
    p_b = tokens(1, 96) + tokens(2, 64)
    p_c = p_b + [7]
    for pool_cls, req_cls in ((KVPool, SimRequest), (LegacyPool, LegacyRequest)):
        kv = pool_cls(40, BS)
        a, b, c, d = (req_cls(rid, len(p), 8, block_hashes(p, BS)) for rid, p in
                      (("a", p_a), ("b", p_b), ("c", p_c), ("d", tokens(9, 320))))
        kv.allocate(a, 160)
        kv.allocate(b, 160)
        kv.cache(a, 160)
        kv.cache(b, 160)
        assert b.blocks[:6] == [None] * 6 and None not in b.blocks[6:]
        kv.allocate(d, 320)
        kv.free(a)
        kv.free(d)
        kv.free(b)
        kv.take(10)  # a's blocks
        assert kv.lookup(c) == []
        kv.allocate(c, 161)  # from d's, after which b's 4 cached blocks wait
        kv.cache(c, 161)
        assert c.blocks[6:10] == [None] * 4 and None not in c.blocks[:6]
        if pool_cls is KVPool:
            new = (c.blocks, kv.free_queue(), kv.ref_counts())
        else:
            assert (c.blocks, kv.free_queue(), kv._ref) == new
