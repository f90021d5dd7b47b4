"""vLLM's KV cache events on the wire, and the gateway's subscriber that feeds a replica's mirror with them.

The format is vLLM's (``vllm/distributed/kv_events.py``, ``examples/online_serving/kv_events_subscriber.py``):
a ZMQ PUB socket (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
"tcp://*:5557"}'``) sends multipart messages ``[topic, seq (8 bytes, big-endian), payload]``; the payload is
a msgpack ``KVEventBatch`` (``ts``, ``events``, ``data_parallel_rank``), arrays with each event tagged by its
class name: ``BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium)``,
``BlockRemoved(block_hashes, medium)``, ``AllBlocksCleared()``.  engine-sim publishes the same
(:mod:`steersman.enginesim.kv_events`).

Hashes.  A stored block that carries its ``token_ids`` is hashed again the gateway's way (its chained hash of
the block's ids, the parent's gateway hash first), and the engine's hash is kept as a key to that: this holds
for any engine whose token ids are the gateway's (its tokenizer, :mod:`steersman.text`).  An event without
token ids is taken to carry the gateway's hashes themselves (engine-sim's, which hashes as the gateway does).
A block whose parent the subscriber never saw stored (it joined late, or missed messages) cannot be chained:
it is skipped and counted.  Sequence gaps (a slow subscriber past the publisher's high-water mark) are
counted and logged; what they held is learnt again as blocks are stored anew.  Batches numbered from 0 again
mean a new engine process (vLLM numbers them per process): its cache starts empty, so the mirror is cleared.

Limits: a subscriber sees what is stored after it connects (a gateway started beside a warm engine credits it
with nothing until its blocks are stored again: under-credit, never a false hit); a gap loses removals too, so
the blocks evicted during it stay credited until stored and evicted again.  vLLM's replay socket
(``replay_endpoint``) is not used.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from steersman.fleet.kv_events import KvEventMirror
from steersman.obs.histogram import CounterFamily
from steersman.text.tokenizer import ROOT_HASH, block_hashes

__all__ = ["BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch", "KvEventSubscriber", "decode_batch",
           "encode_batch", "subscribe_all"]

log = logging.getLogger("steersman.kv_events")


class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """vLLM's KVCacheEvent."""


class BlockStored(_Event):
    block_hashes: list[Any]  # vLLM's ExternalBlockHash: int or bytes
    parent_block_hash: Any | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[Any]
    medium: str | None = None


class AllBlocksCleared(_Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_ENCODER = msgspec.msgpack.Encoder()


def decode_batch(payload: bytes) -> KVEventBatch:
    return _DECODER.decode(payload)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


class KvEventSubscriber:
    """One replica's KV events (a ZMQ SUB socket on ``endpoint``, ``topic``) into its :class:`KvEventMirror`."""

    def __init__(self, name: str, endpoint: str, topic: str, mirror: KvEventMirror, block_size: int,
                 counts: CounterFamily | None = None) -> None:
        self.name = name
        self.endpoint = endpoint
        self.topic = topic
        self.mirror = mirror
        self.block_size = block_size
        self.counts = counts
        self.last_seq: int | None = None
        self._gateway: dict[Any, int] = {}  # the engine's hash -> the gateway's, for blocks stored with token ids
        self._task: asyncio.Task | None = None

    def _count(self, kind: str, n: int = 1) -> None:
        if self.counts is not None and n:
            self.counts.inc(self.name, kind, amount=n)

    # -- messages (pure: the socket loop below calls these) -----------------------------------------
    def receive(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._count("malformed")
            return
        seq = int.from_bytes(frames[1], "big")
        if self.last_seq is not None and seq <= self.last_seq:  # numbered from 0 again: a new engine process,
            self.mirror.cleared()  # whose cache starts empty
            self._gateway.clear()
            self._count("restarted")
            log.warning("replica %s: KV events numbered from %d again (after %d): its engine restarted", self.name,
                        seq, self.last_seq)
        elif self.last_seq is not None and seq > self.last_seq + 1:
            self._count("missed", seq - self.last_seq - 1)
            log.warning("replica %s: %d KV event batch(es) missed", self.name, seq - self.last_seq - 1)
        self.last_seq = seq
        try:
            batch = decode_batch(frames[2])
        except msgspec.DecodeError:
            self._count("malformed")
            return
        for ev in batch.events:
            self.apply(ev)

    def apply(self, ev: BlockStored | BlockRemoved | AllBlocksCleared) -> None:
        if isinstance(ev, BlockStored):
            hashes, parent = self._stored(ev)
            if hashes:
                self.mirror.stored(hashes, parent)
                self._count("stored", len(hashes))
        elif isinstance(ev, BlockRemoved):
            gw = self._gateway
            hashes = [gw.pop(h, h) if gw else h for h in ev.block_hashes]
            self.mirror.removed(hashes)
            self._count("removed", len(hashes))
        else:
            self.mirror.cleared()
            self._gateway.clear()
            self._count("cleared")

    def _stored(self, ev: BlockStored) -> tuple[list[int], int | None]:
        """The gateway's hashes of the blocks stored, and of their parent (None: they begin a prompt)."""
        n = len(ev.block_hashes)
        if not ev.token_ids:  # the gateway's own hashes (engine-sim); bytes (vLLM's own) cannot be without ids
            ours = [h for h in ev.block_hashes if isinstance(h, int)]
            self._count("unchained", n - len(ours))
            return ours, ev.parent_block_hash if len(ours) == n else -1  # (-1: some dropped, not a prompt's start)
        bs = ev.block_size
        if bs != self.block_size or len(ev.token_ids) != n * bs:
            self._count("unchained", n)
            return [], None
        if ev.parent_block_hash is None:
            parent = ROOT_HASH
        else:
            got = self._gateway.get(ev.parent_block_hash)
            if got is None:
                self._count("unchained", n)
                return [], None
            parent = got
        ours = block_hashes(ev.token_ids, bs, parent)
        self._gateway.update(zip(ev.block_hashes, ours))
        return ours, None if ev.parent_block_hash is None else parent

    # -- the socket -------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kv-events-{self.name}")

    async def _run(self) -> None:
        import zmq
        import zmq.asyncio

        sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sock.connect(self.endpoint)
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    self.receive(frames)
                except Exception:  # one bad batch must not end the replica's events
                    self._count("malformed")
                    log.exception("replica %s: a KV event batch could not be applied", self.name)
        finally:
            sock.close(0)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass


def subscribe_all(fleet, endpoints, block_size: int, mismatch_after: int) -> tuple[list[KvEventSubscriber], CounterFamily]:
    """A mirror and a started subscriber for each endpoint that names ``kv_events``; the events counter.
    ``mismatch_after``: ``SchedulerSettings.kv_events_mismatch_after``."""
    counts = CounterFamily("steersman_kv_events", "KV cache events read from the engines, by kind (blocks stored, "
                           "removed; caches cleared; blocks that could not be chained; batches malformed or missed; "
                           "engine restarts seen in the batch numbers).",
                           ["replica", "kind"])
    subs = []
    for i, ep in enumerate(endpoints):
        if not getattr(ep, "kv_events", None) or fleet.prefix is None:
            continue
        mirror = KvEventMirror(mismatch_after)
        fleet.prefix.mirror_events(i, mirror)
        sub = KvEventSubscriber(fleet.replicas[i].name, ep.kv_events, ep.kv_events_topic, mirror, block_size, counts)
        sub.start()
        subs.append(sub)
    return subs, counts
