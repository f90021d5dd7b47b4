"""vLLM's KV events on the wire: engine-sim's publisher, the gateway's subscriber, over real ZMQ on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

from steersman.enginesim.kv_events import KvEventPublisher
from steersman.engines.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, KvEventSubscriber,
                                         decode_batch, encode_batch)
from steersman.fleet.kv_events import FirstBlocks, KvEventMirror
from steersman.obs.histogram import CounterFamily
from steersman.text.tokenizer import ROOT_HASH, block_hashes


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


def test_token_ids_are_hashed_the_gateways_way_and_removals_mapped_back():
    sub = _sub(block_size=4)
    ids = list(range(100, 112))  # three blocks of 4
    ours = block_hashes(ids, 4, ROOT_HASH)
    sub.apply(BlockStored([b"e1", b"e2"], None, ids[:8], 4))  # vLLM's own (bytes) hashes
    sub.apply(BlockStored([b"e3"], b"e2", ids[8:], 4))  # chained on the parent's gateway hash
    assert sub.mirror.match(ours) == 3
    first = FirstBlocks()
    sub.mirror.attach(0, first)  # only the block stored without a parent begins a prompt
    assert first.holders(ours[0]) == {0: 1} and first.holders(ours[2]) is None
    sub.apply(BlockRemoved([b"e3"]))
    assert sub.mirror.match(ours) == 2
    sub.apply(BlockStored([b"x"], b"unknown-parent", [1, 2, 3, 4], 4))  # joined late: cannot chain it
    sub.apply(BlockStored([b"y"], None, [1, 2, 3, 4, 5], 4))  # ids not whole blocks
    sub.apply(BlockStored([b"z"], None, [], 4))  # vLLM's own hash and no ids: nothing to match it with
    assert sub.counts.get("r0", "unchained") == 3
    sub.apply(AllBlocksCleared())
    assert sub.mirror.match(ours) == 0 and not sub._gateway


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
    first = FirstBlocks()
    sub.mirror.attach(3, first)
    sub.apply(BlockStored([10, 11], 9, [], 16))  # engine-sim's own hashes, chained on 9: not a prompt's start
    assert first.holders(9) == {3: 1} and first.holders(10) is None and len(first) == 1
    sub.apply(BlockRemoved([9]))
    assert len(first) == 0


def test_engine_sim_publisher_reaches_the_subscriber_over_zmq():
    async def main() -> None:
        pub = KvEventPublisher("tcp://127.0.0.1:*", "kv-events", 16)
        sub = KvEventSubscriber("r0", pub.endpoint, "kv-events", KvEventMirror(), 16)
        sub.start()
        try:
            chain = list(range(1, 33))
            deadline = time.monotonic() + 10
            while sub.mirror.match(chain) < 32:  # PUB drops what it sends before the SUB joins: resend until seen
                assert time.monotonic() < deadline, "no event arrived"
                pub.stored(chain[:16])
                pub.stored(chain[16:], chain[15])
                pub.flush(time.time())
                await asyncio.sleep(0.05)
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
