"""vLLM's KV events on the wire: engine-sim's publisher, the gateway's subscriber, over real ZMQ on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import time

from steersman.enginesim.kv_events import KvEventPublisher
from steersman.engines.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, KvEventSubscriber,
                                         decode_batch, encode_batch)
from steersman.fleet.kv_events import EventHolders, KvEventMirror
from steersman.obs.histogram import CounterFamily
from steersman.text.tokenizer import ROOT_HASH, block_hash_tuple, block_hashes


def _sub(block_size: int = 16) -> KvEventSubscriber:
    counts = CounterFamily("t_kv_events", "test", ["replica", "kind"])
    return KvEventSubscriber("r0", "tcp://127.0.0.1:1", "", KvEventMirror(), block_size, counts)


def test_vllm_format_round_trips():
    batch = KVEventBatch(1.5, [BlockStored([1, 2], None, [], 16), BlockRemoved([2]), AllBlocksCleared()])
    raw = encode_batch(batch)
    # vLLM's structs are tagged arrays: [ts, [["BlockStored", hashes, parent, token_ids, block_size], ...]]
    import msgspec

    generic = msgspec.msgpack.decode(raw)
    assert generic[0] == 1.5 and generic[1][0][0] == "BlockStored" and generic[1][1][0] == "BlockRemoved"
    assert generic[1][2] == ["AllBlocksCleared"]
    assert decode_batch(raw) == batch


def _vllm_structs(array_like: bool):
    """vLLM's event structs as later versions declare them (lora_name, extra_keys, group_idx added; from 0.28 the
    events are maps, ``array_like`` False), written here independently of steersman's."""
    import msgspec

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list
        parent_block_hash: int | bytes | None
        token_ids: list
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list | None = None
        group_idx: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list
        medium: str | None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return EventBatch, BlockStored, BlockRemoved, AllBlocksCleared


def test_both_of_vllms_layouts_are_read():
    """Up to vLLM 0.27 an event is a tagged array; 0.28 made it a map tagged by ``type`` (and versions added
    fields): every batch of a 0.28 engine was counted malformed before both were read."""
    import msgspec

    for array_like in (True, False):
        EventBatch, Stored, Removed, Cleared = _vllm_structs(array_like)
        raw = msgspec.msgpack.encode(EventBatch(2.0, [
            Stored([11, 12], None, [], 16, None, "GPU", None, [None, None], 0), Removed([12], "GPU"), Cleared(),
            Stored([13], 11, [], 16, None, "GPU", None)], 0))
        got = decode_batch(raw)
        assert got == KVEventBatch(2.0, [BlockStored([11, 12], None, [], 16, None, "GPU", None, [None, None]),
                                         BlockRemoved([12], "GPU"),
                                         AllBlocksCleared(), BlockStored([13], 11, [], 16, None, "GPU")], 0)
        sub = _sub()
        sub.receive([b"", (0).to_bytes(8, "big"), raw])
        assert sub.counts.get("r0", "malformed") == 0 and sub.mirror.match([11, 13]) == 0  # (cleared in between)
        sub.receive([b"", (1).to_bytes(8, "big"), msgspec.msgpack.encode(EventBatch(3.0, [
            Stored([11, 12], None, [], 16, None, "GPU", None)]))])
        assert sub.mirror.match([11, 12]) == 2


def test_token_ids_are_hashed_the_gateways_way_and_removals_mapped_back():
    sub = _sub(block_size=4)
    ids = list(range(100, 112))  # three blocks of 4
    ours = block_hashes(ids, 4, ROOT_HASH)
    sub.apply(BlockStored([b"e1", b"e2"], None, ids[:8], 4))  # vLLM's own (bytes) hashes
    sub.apply(BlockStored([b"e3"], b"e2", ids[8:], 4))  # chained on the parent's gateway hash
    assert sub.mirror.match(ours) == 3
    index = EventHolders(1)
    sub.mirror.attach(0, index)  # what it held before is listed too
    assert [index.holders(h) for h in ours] == [{0}, {0}, {0}]
    sub.apply(BlockRemoved([b"e3"]))
    assert sub.mirror.match(ours) == 2 and index.holders(ours[2]) == set()
    sub.apply(BlockStored([b"x"], b"unknown-parent", [1, 2, 3, 4], 4))  # joined late: cannot chain it
    sub.apply(BlockStored([b"y"], None, [1, 2, 3, 4, 5], 4))  # ids not whole blocks
    sub.apply(BlockStored([b"z"], None, [], 4))  # vLLM's own hash and no ids: nothing to match it with
    assert sub.counts.get("r0", "unchained") == 3
    sub.apply(AllBlocksCleared())
    assert sub.mirror.match(ours) == 0 and not sub._gateway


def test_a_salted_prompts_blocks_chain_from_its_salted_root():
    """vLLM hashes a request's ``cache_salt`` into its first block (``extra_keys``); the gateway hashes a salted
    prompt from :func:`cache_root` of the salt.  Read from the root, every salted prompt missed (and its unsalted
    twin, which vLLM cannot serve from those blocks, was credited), so with ``isolate_tenant_caches`` the mismatch
    guard dropped every replica's events."""
    from steersman.api.prompt import cache_root, prompt_shape
    from steersman.api.schema import CompletionRequest

    ids = list(range(1000, 1064))  # four blocks of 16
    _, salted = prompt_shape(CompletionRequest(model="m", prompt=ids, cache_salt="tenant-a"), 16)
    _, plain = prompt_shape(CompletionRequest(model="m", prompt=ids), 16)
    assert list(salted) == block_hashes(ids, 16, cache_root("tenant-a"))
    sub = _sub()
    sub.apply(BlockStored([b"e0", b"e1", b"e2"], None, ids[:48], 16, None, "GPU", None, [("tenant-a",), None, None]))
    sub.apply(BlockStored([b"e3"], b"e2", ids[48:], 16, None, "GPU", None, [None]))  # the chain goes on
    assert sub.mirror.match(salted) == 4 and sub.mirror.match(plain) == 0
    sub.apply(BlockRemoved([b"e3"]))
    assert sub.mirror.match(salted) == 3


def test_blocks_the_gateways_hashes_do_not_cover_are_not_credited():
    """A block of an adapter named by its id alone (vLLM < 0.11: which adapter is not known) and blocks after a
    multi-modal input or prompt embeddings are not text the gateway hashes: crediting them is a false hit."""
    ids = list(range(100, 164))
    ours = block_hashes(ids, 16, ROOT_HASH)
    sub = _sub()
    sub.apply(BlockStored([b"o0"], None, ids[:16], 16, 7, "GPU"))  # vLLM < 0.11: the adapter by its id
    assert sub.mirror.match(ours) == 0 and sub.counts.get("r0", "unchained") == 1
    sub.apply(BlockStored([b"m0", b"m1", b"m2", b"m3"], None, ids, 16, None, "GPU", None,
                          [None, None, (("img-1", 8),), None]))  # an image from the third block on
    assert sub.mirror.match(ours) == 2 and sub.counts.get("r0", "unchained") == 3
    sub.apply(BlockStored([b"s0"], None, ids[:16], 16, None, "GPU", None, [("salt", b"embeds")]))  # salt + more
    assert sub.counts.get("r0", "unchained") == 4


def test_an_adapters_blocks_are_credited_to_the_adapters_prompts_only():
    """vLLM hashes a LoRA adapter into every block of its KV (``lora_name``; first in each block's ``extra_keys``,
    then the first block's ``cache_salt``): the blocks are the adapter's prompts' (keyed as the gateway keys a
    request for it, steersman.text.lora), never the base model's.  They were skipped: an adapter's prompts were
    never credited, and the hits the engine reported for them counted against the mirror."""
    from steersman.api.prompt import cache_root
    from steersman.text.lora import lora_key, rekeyed

    ids = list(range(100, 164))
    base = block_hashes(ids, 16, ROOT_HASH)
    sql = rekeyed(block_hash_tuple(ids, 16), lora_key("sql-adapter"))
    sub = _sub()
    sub.apply(BlockStored([b"l0", b"l1"], None, ids[:32], 16, None, "GPU", "sql-adapter",
                          [("sql-adapter",), ("sql-adapter",)]))
    sub.apply(BlockStored([b"l2"], b"l1", ids[32:48], 16, None, "GPU", "sql-adapter", [("sql-adapter",)]))
    assert sub.mirror.match(sql) == 3 and sub.mirror.match(base) == 0 and sub.counts.get("r0", "unchained") == 0
    salted = rekeyed(block_hash_tuple(ids, 16, cache_root("t")), lora_key("sql-adapter"))
    sub.apply(BlockStored([b"t0"], None, ids[:16], 16, None, "GPU", "sql-adapter", [("sql-adapter", "t")]))
    assert sub.mirror.match(salted) == 1
    sub.apply(BlockRemoved([b"l2"]))
    assert sub.mirror.match(sql) == 2


def test_a_block_stored_twice_stays_credited_until_its_last_copy_is_removed():
    """vLLM keeps two blocks with one hash when two requests computed the same prefix at once, and announces the
    eviction of each; the first removal forgot the block (and the chain after it) while the engine held a copy."""
    ids = list(range(200, 232))
    ours = block_hashes(ids, 16, ROOT_HASH)
    sub = _sub()
    sub.apply(BlockStored([b"a", b"b"], None, ids, 16))
    sub.apply(BlockStored([b"a"], None, ids[:16], 16))  # the second copy of the first block
    sub.apply(BlockRemoved([b"a"]))
    assert sub.mirror.match(ours) == 2
    sub.apply(BlockRemoved([b"a"]))
    assert sub.mirror.match(ours) == 0
    sim = _sub()  # engine-sim's own hashes (no token ids): the same
    sim.apply(BlockStored([7, 8], None, [], 16))
    sim.apply(BlockStored([7], None, [], 16))
    sim.apply(BlockRemoved([7]))
    assert sim.mirror.match([7, 8]) == 2
    sim.apply(AllBlocksCleared())
    sim.apply(BlockStored([7], None, [], 16))
    sim.apply(BlockRemoved([7]))  # no copy left over from before the clear
    assert sim.mirror.match([7]) == 0 and not sim.mirror._copies


def test_an_endpoint_that_cannot_be_subscribed_to_falls_back_to_routing_and_stops_cleanly():
    """libzmq refuses ``tcp://host`` without a port only at connect: the subscriber's task died with the error, the
    replica stayed mirrored with nothing, and the error came out of ``stop()`` (the gateway's stop then skipped
    everything after it).  The fleet file refuses such an endpoint; the subscriber survives one anyway."""
    from steersman.fleet.prefix_index import PrefixIndex

    async def main():
        index = PrefixIndex(2, 2**20)
        mirror = KvEventMirror()
        index.mirror_events(0, mirror)
        counts = CounterFamily("t_kv_events", "test", ["replica", "kind"])
        sub = KvEventSubscriber("r0", "tcp://127.0.0.1", "", mirror, 16, counts, "tcp://127.0.0.1",
                                unreadable=lambda: index.unmirror_events(0))
        sub.start()
        await asyncio.sleep(0.05)
        await sub.stop()  # raises nothing
        return index, counts

    index, counts = asyncio.run(main())
    assert 0 not in index.events and counts.get("r0", "failed") == 1


def test_gaps_and_garbage_are_counted_not_fatal():
    sub = _sub()
    ok = encode_batch(KVEventBatch(0.0, [BlockStored([7, 8], None, [], 16)]))
    sub.receive([b"", (0).to_bytes(8, "big"), ok])
    sub.receive([b"", (3).to_bytes(8, "big"), b"\xc1not msgpack"])
    sub.receive([b"only two frames", b""])
    assert sub.counts.get("r0", "missed") == 2
    assert sub.counts.get("r0", "malformed") == 2
    assert sub.mirror.match([7, 8]) == 2
    sub.receive([b"", (0).to_bytes(8, "big"), encode_batch(KVEventBatch(0.0, [BlockStored([9], None, [], 16)]))])
    assert sub.counts.get("r0", "restarted") == 1  # numbered from 0 again: a new engine, an empty cache
    assert sub.mirror.match([7, 8]) == 0 and sub.mirror.match([9]) == 1
    index = EventHolders(4)
    sub.mirror.attach(3, index)
    sub.apply(BlockStored([10, 11], 9, [], 16))  # engine-sim's own hashes, chained on 9
    assert [index.holders(h) for h in (9, 10, 11)] == [{3}, {3}, {3}]
    sub.apply(BlockRemoved([9, 10, 11]))
    assert not index.masks


def test_engine_sim_publisher_reaches_the_subscriber_over_zmq():
    async def main() -> None:
        pub = KvEventPublisher("tcp://127.0.0.1:*", "kv-events", 16)
        sub = KvEventSubscriber("r0", pub.endpoint, "kv-events", KvEventMirror(), 16)
        sub.start()
        try:
            chain = list(range(1, 33))
            await _joined(pub, sub)
            pub.stored(chain[:16])
            pub.stored(chain[16:], chain[15])
            pub.flush(time.time())
            await _until(lambda: sub.mirror.match(chain) == 32, "the chain did not arrive")
            pub.removed(chain[20:])
            pub.flush(time.time())
            deadline = time.monotonic() + 10
            while sub.mirror.match(chain) != 20:
                assert time.monotonic() < deadline, "the removal did not arrive"
                await asyncio.sleep(0.02)
            assert sub.last_seq == pub.seq - 1
        finally:
            await sub.stop()
            pub.close()

    asyncio.run(main())


async def _joined(pub, sub) -> None:
    """Until the subscriber receives: PUB drops what it sends before the SUB has joined, so a fresh block is sent
    until one arrives (the same block sent again would be another copy of it: KvEventMirror counts copies)."""
    deadline = time.monotonic() + 10
    probes = []
    while not any(sub.mirror.holds(h) for h in probes):
        assert time.monotonic() < deadline, "no event arrived"
        probes.append(10**9 + len(probes))
        pub.stored([probes[-1]])
        pub.flush(time.time())
        await asyncio.sleep(0.05)


async def _until(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _replaying(name: str, start_sub: bool = True):
    """engine-sim's publisher with a replay socket, and a subscriber that asks it (started unless ``start_sub``)."""
    pub = KvEventPublisher("tcp://127.0.0.1:*", "", 16, replay_endpoint="tcp://127.0.0.1:*")
    pub.start()
    counts = CounterFamily(name, "test", ["replica", "kind"])
    sub = KvEventSubscriber("r0", pub.endpoint, "", KvEventMirror(), 16, counts, replay=pub.replay_endpoint)
    if start_sub:
        sub.start()
    try:
        yield pub, sub, counts
    finally:
        await sub.stop()
        await pub.stop()


def test_a_late_subscriber_replays_what_was_stored_before_it_joined():
    """vLLM's replay socket: a gateway that starts beside a warm engine asks for the batches it kept, so the
    mirror holds what was cached before it connected (without replay: nothing until stored again)."""
    async def main() -> None:
        async with _replaying("t_kv_replay", start_sub=False) as (pub, sub, counts):
            chain = list(range(1, 41))
            for k in range(4):  # published before anyone listens: lost on the PUB socket, kept for replay
                pub.stored(chain[10 * k:10 * k + 10], chain[10 * k - 1] if k else None)
                pub.flush(time.time())
            pub.removed(chain[30:])
            pub.flush(time.time())
            sub.start()
            other = 1000
            while sub.last_seq is None:  # a new batch shows the subscriber where the engine is
                other += 1
                pub.stored([other])
                pub.flush(time.time())
                await asyncio.sleep(0.05)
            await _until(lambda: sub.mirror.match(chain) == 30, "the replayed batches were not applied")
            assert counts.get("r0", "replayed") >= 5 and counts.get("r0", "missed") == 0

    asyncio.run(main())


class _Dropping:
    """A PUB socket past its high-water mark: what is sent is lost (the publisher still keeps it for replay)."""

    def __init__(self, sock) -> None:
        self.sock, self.dropping = sock, False

    def send_multipart(self, frames, flags=0):
        if not self.dropping:
            self.sock.send_multipart(frames, flags=flags)

    def close(self, linger=None):
        self.sock.close(linger)


def test_a_gap_is_asked_for_again_and_its_removals_applied():
    async def main() -> None:
        chain = list(range(1, 21))
        async with _replaying("t_kv_gap") as (pub, sub, counts):
            pub.stored(chain)  # before the subscriber joined: it is replayed
            pub.flush(time.time())
            await _joined(pub, sub)
            await _until(lambda: sub.mirror.match(chain) == 20, "the chain was not replayed")
            before = counts.get("r0", "replayed")
            pub.sock = dropping = _Dropping(pub.sock)
            dropping.dropping = True
            pub.removed(chain[5:])  # lost in the gap: without replay chain[5:] would stay credited
            pub.flush(time.time())
            pub.stored([500, 501])
            pub.flush(time.time())
            dropping.dropping = False
            pub.stored([900])
            pub.flush(time.time())
            await _until(lambda: sub.mirror.match([900]) == 1, "the batch after the gap did not arrive")
            assert sub.mirror.match(chain) == 5 and sub.mirror.match([500, 501]) == 2
            assert counts.get("r0", "replayed") - before == 2 and counts.get("r0", "missed") == 0

    asyncio.run(main())


def test_a_replay_that_never_ends_is_given_up_and_the_events_go_on():
    async def main() -> None:
        import zmq
        import zmq.asyncio

        deaf = zmq.asyncio.Context.instance().socket(zmq.ROUTER)  # takes replay requests, never answers
        deaf.setsockopt(zmq.LINGER, 0)
        deaf.bind("tcp://127.0.0.1:*")
        pub = KvEventPublisher("tcp://127.0.0.1:*", "", 16)
        counts = CounterFamily("t_kv_deaf", "test", ["replica", "kind"])
        sub = KvEventSubscriber("r0", pub.endpoint, "", KvEventMirror(), 16, counts,
                                replay=deaf.getsockopt(zmq.LAST_ENDPOINT).decode(), replay_timeout_s=0.2)
        pub.stored([0])
        pub.flush(time.time())  # seq 0 before it listens: the first it sees is later, so it asks for a replay
        sub.start()
        try:
            k = 0
            while sub.last_seq is None:
                k += 1
                pub.stored([k])
                pub.flush(time.time())
                await asyncio.sleep(0.05)
            await _until(lambda: counts.get("r0", "replay_failed") >= 1, "the replay was not given up")
            pub.stored([777])
            pub.flush(time.time())
            await _until(lambda: sub.mirror.match([777]) == 1, "the events stopped after a failed replay")
        finally:
            await sub.stop()
            pub.close()
            deaf.close(0)

    asyncio.run(main())


def test_a_restarted_engines_first_batches_are_replayed_after_its_cache_is_cleared():
    """A new engine process numbers its batches from 0 again: the mirror is cleared, and the batches of the new
    process the subscriber did not see are asked for."""
    async def main() -> None:
        async with _replaying("t_kv_restart") as (pub, sub, counts):
            for k in range(5):
                pub.stored([100 + k])
                pub.flush(time.time())
            await _joined(pub, sub)
            await _until(lambda: sub.mirror.match([100]) == 1, "the first batches were not replayed")
            pub.seq, old = 0, sub.last_seq  # the engine restarts: numbered from 0, nothing kept
            pub._buffer.clear()
            pub.sock = dropping = _Dropping(pub.sock)
            dropping.dropping = True
            for k in range(3):  # the new process's first batches, lost on the PUB socket
                pub.stored([200 + k])
                pub.flush(time.time())
            dropping.dropping = False
            pub.stored([300])
            pub.flush(time.time())
            await _until(lambda: sub.mirror.match([300]) == 1, "the new process's batch did not arrive")
            assert old >= 3 and sub.last_seq == 3 and counts.get("r0", "restarted") == 1
            assert [sub.mirror.match([h]) for h in (100, 200, 201, 202)] == [0, 1, 1, 1]

    asyncio.run(main())
