"""vLLM's KV cache events on the wire, and the gateway's subscriber that feeds a replica's mirror with them.

The format is vLLM's (``vllm/distributed/kv_events.py``, ``examples/online_serving/kv_events_subscriber.py``):
a ZMQ PUB socket (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
"tcp://*:5557"}'``) sends multipart messages ``[topic, seq (8 bytes, big-endian), payload]``; the payload is
a msgpack ``KVEventBatch`` (``ts``, ``events``, ``data_parallel_rank``), an array, with each event tagged by its
class name: ``BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...)``,
``BlockRemoved(block_hashes, medium)``, ``AllBlocksCleared()``; up to vLLM 0.27 each event is an array (of the
fields later versions add, ``lora_name`` and ``extra_keys`` are read, ``group_idx`` and later ones ignored), from
0.28 a map whose ``type`` is the class name: both are read.  engine-sim publishes the array layout
(:mod:`steersman.enginesim.kv_events`).

Hashes.  A stored block that carries its ``token_ids`` is hashed again the gateway's way (its chained hash of
the block's ids, the parent's gateway hash first), and the engine's hash is kept as a key to that: this holds
for any engine whose token ids are the gateway's (its tokenizer, :mod:`steersman.text`).  What else vLLM hashed
into a block (``extra_keys``: a LoRA adapter's name on every block, multi-modal inputs, the request's
``cache_salt`` on its first block, prompt embeddings) is read as the gateway hashes prompts: a ``cache_salt``
alone on a prompt's first block makes the chain's root the one a request with that salt hashes from
(:func:`steersman.api.prompt.cache_root`); a block of a LoRA adapter's KV (``lora_name``, also first in every
block's ``extra_keys``) is hashed as the gateway hashes a request for that adapter, keyed with it
(:mod:`steersman.text.lora`); one named by its ``lora_id`` alone (vLLM < 0.11), or with other extra keys, and
the blocks after it, are skipped and counted (``unchained``): the gateway's prompt hashes do not cover them, and
crediting them would be a false hit.  An event without token ids is taken to carry the
gateway's hashes themselves (engine-sim's, which hashes as the gateway does).  A block whose parent the
subscriber never saw stored (it joined late, or missed messages) cannot be chained: it is skipped and counted.
vLLM may hold two copies of one block (two requests computed the same prefix at once) and evicts each with a
``BlockRemoved`` of its own: a block stays credited until its last copy is removed.  Sequence gaps (a slow
subscriber past the publisher's high-water mark) are
counted and logged; what they held is learnt again as blocks are stored anew.  Batches numbered from 0 again
mean a new engine process (vLLM numbers them per process): its cache starts empty, so the mirror is cleared.

Replay (an endpoint's ``kv_events_replay``: vLLM's ``replay_endpoint``, a ROUTER socket keeping the last
``buffer_steps`` batches): on a gap, and when it joins an engine already publishing, the subscriber asks for the
batches it missed (a DEALER sends ``[b"", start seq]``; one ``[b"", seq, payload]`` comes back per batch kept,
then ``[b"", END_SEQ, b""]``) and applies them before the batch that showed the gap; what the engine no longer
keeps stays missed.  Without it, a subscriber sees what is stored after it connects (a gateway started beside a
warm engine credits it with nothing until its blocks are stored again: under-credit, never a false hit), and a gap
loses removals too (the blocks evicted during it stay credited until stored and evicted again).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from steersman._tasks import cancel_and_wait
from steersman.config import DEFAULTS
from steersman.fleet.kv_events import KvEventMirror
from steersman.obs.histogram import CounterFamily
from steersman.api.prompt import cache_root
from steersman.text.lora import lora_key, rekeyed
from steersman.text.tokenizer import ROOT_HASH, block_hashes

__all__ = ["END_SEQ", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch", "KvEventSubscriber",
           "decode_batch", "encode_batch", "subscribe_all"]

log = logging.getLogger("steersman.kv_events")

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # vLLM ZmqEventPublisher.END_SEQ: a replay's last message


class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """vLLM's KVCacheEvent (an array tagged by the class name, up to vLLM 0.27; later fields are ignored)."""


class BlockStored(_Event):
    block_hashes: list[Any]  # vLLM's ExternalBlockHash: int or bytes
    parent_block_hash: Any | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None  # vLLM 0.11+: the adapter whose KV this is (hashed into every block)
    extra_keys: list[Any] | None = None  # vLLM 0.11+: one per block, what else its hash covered (None: nothing)


class BlockRemoved(_Event):
    block_hashes: list[Any]
    medium: str | None = None


class AllBlocksCleared(_Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


# vLLM 0.28 encodes each event as a map tagged by ``type`` (the batch stays an array); msgspec cannot take both
# layouts in one union, so a batch the array decoder rejects is read with these, then converted.
class _MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _MapBlockStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[Any]
    parent_block_hash: Any | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None


class _MapBlockRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[Any]
    medium: str | None = None


class _MapAllBlocksCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class _MapBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_MapBlockStored | _MapBlockRemoved | _MapAllBlocksCleared]
    data_parallel_rank: int | None = None


_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_MAP_DECODER = msgspec.msgpack.Decoder(_MapBatch)
_ENCODER = msgspec.msgpack.Encoder()


def _canonical(ev: _MapBlockStored | _MapBlockRemoved | _MapAllBlocksCleared
               ) -> BlockStored | BlockRemoved | AllBlocksCleared:
    if isinstance(ev, _MapBlockStored):
        return BlockStored(ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size, ev.lora_id, ev.medium,
                           ev.lora_name, ev.extra_keys)
    if isinstance(ev, _MapBlockRemoved):
        return BlockRemoved(ev.block_hashes, ev.medium)
    return AllBlocksCleared()


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch in either of vLLM's layouts (events as tagged arrays, or as maps tagged by ``type``: vLLM 0.28);
    raises ``msgspec.DecodeError`` for anything else."""
    try:
        return _DECODER.decode(payload)
    except msgspec.ValidationError:
        m = _MAP_DECODER.decode(payload)
        return KVEventBatch(m.ts, [_canonical(e) for e in m.events], m.data_parallel_rank)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


class KvEventSubscriber:
    """One replica's KV events (a ZMQ SUB socket on ``endpoint``, ``topic``) into its :class:`KvEventMirror`."""

    def __init__(self, name: str, endpoint: str, topic: str, mirror: KvEventMirror, block_size: int,
                 counts: CounterFamily | None = None, replay: str | None = None,
                 replay_timeout_s: float = DEFAULTS.scheduler.kv_events_replay_timeout_s,
                 unreadable: Callable[[], None] | None = None) -> None:
        self.name = name
        self.unreadable = unreadable  # called if the events cannot be subscribed to: the replica is learnt from routing
        self.endpoint = endpoint
        self.replay = replay  # the engine's replay endpoint (vLLM's replay_endpoint): gaps are asked for again
        self.replay_timeout_s = replay_timeout_s
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
            self._restarted(seq)  # whose cache starts empty
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

    def _restarted(self, seq: int) -> None:
        log.warning("replica %s: KV events numbered from %d again (after %s): its engine restarted", self.name,
                    seq, self.last_seq)
        self._forget_all()
        self._count("restarted")
        self.last_seq = None

    def _forget_all(self) -> None:
        self.mirror.cleared()
        self._gateway.clear()

    def apply(self, ev: BlockStored | BlockRemoved | AllBlocksCleared) -> None:
        if isinstance(ev, BlockStored):
            ours = self._stored(ev)
            if ours:
                self.mirror.stored(ours)  # (it counts the copies of a block stored twice)
                self._count("stored", len(ours))
        elif isinstance(ev, BlockRemoved):
            gw = self._gateway
            hashes = [gw.get(h, h) for h in ev.block_hashes] if gw else ev.block_hashes
            self.mirror.removed(hashes)  # (a block held twice stays: the mirror counts its copies)
            if gw:
                held = self.mirror.holds
                for h, g in zip(ev.block_hashes, hashes):
                    if not held(g):
                        gw.pop(h, None)  # the engine's hash is mapped while the gateway's block is held
            self._count("removed", len(hashes))
        else:
            self._forget_all()
            self._count("cleared")

    def _stored(self, ev: BlockStored) -> list[int]:
        """The gateway's hashes of the blocks stored that the gateway's prompt hashes can match."""
        n = len(ev.block_hashes)
        if not ev.token_ids:  # the gateway's own hashes (engine-sim); bytes (vLLM's own) cannot be without ids
            ours = [h for h in ev.block_hashes if isinstance(h, int)]
            self._count("unchained", n - len(ours))
            return ours
        bs = ev.block_size
        lora = ev.lora_name
        if bs != self.block_size or len(ev.token_ids) != n * bs or (ev.lora_id is not None and lora is None):
            self._count("unchained", n)  # (an adapter named by its id alone, vLLM < 0.11: which one is not known)
            return []
        key = lora_key(lora) if lora is not None else 0  # an adapter's KV: its prompts' hashes are keyed
        if ev.parent_block_hash is None:
            parent = ROOT_HASH
        else:
            got = self._gateway.get(ev.parent_block_hash)
            if got is None:
                self._count("unchained", n)
                return []
            parent = got ^ key  # (the chain runs on the unkeyed hashes: steersman.text.lora.rekeyed)
        keep = n
        extra = ev.extra_keys
        if extra:
            for j, keys in enumerate(extra[:n]):
                if keys and lora is not None and keys[0] in (lora, ev.lora_id):
                    keys = keys[1:]  # vLLM puts the adapter first in every block's keys
                if not keys:
                    continue
                salt = keys[0] if len(keys) == 1 and isinstance(keys[0], str) else None
                if j == 0 and ev.parent_block_hash is None and salt is not None:
                    parent = cache_root(salt)  # the request's cache_salt (vLLM hashes it into its first block)
                    continue
                keep = j  # multi-modal inputs, prompt embeddings: not in the gateway's hashes, nor what follows
                break
            if keep < n:
                self._count("unchained", n - keep)
                if not keep:
                    return []
        ours = rekeyed(block_hashes(ev.token_ids[: keep * bs], bs, parent), key)
        self._gateway.update(zip(ev.block_hashes, ours))
        return ours

    # -- the socket -------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kv-events-{self.name}")

    async def _run(self) -> None:
        import zmq
        import zmq.asyncio

        sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        dealer = None
        try:
            try:
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
                sock.connect(self.endpoint)
                dealer = self._dealer() if self.replay else None
            except zmq.ZMQError as e:  # (the fleet file's check lets no such endpoint through)
                self._count("failed")
                log.error("replica %s: cannot subscribe to its KV events at %s (replay %s): %s; the index learns it "
                          "from routing instead", self.name, self.endpoint, self.replay, e)
                if self.unreadable is not None:
                    self.unreadable()
                return
            while True:
                frames = await sock.recv_multipart()
                try:
                    if dealer is not None and len(frames) == 3 and len(frames[1]) == 8:
                        seq = int.from_bytes(frames[1], "big")
                        if self.last_seq is not None and seq <= self.last_seq:
                            self._restarted(seq)  # a new engine process: its batches before this one too
                        last = self.last_seq
                        if seq > (0 if last is None else last + 1):  # joined late, or a gap: ask for what it missed
                            dealer = await self._replayed(dealer, 0 if last is None else last + 1, seq - 1)
                    self.receive(frames)
                except Exception:  # one bad batch must not end the replica's events
                    self._count("malformed")
                    log.exception("replica %s: a KV event batch could not be applied", self.name)
        finally:
            sock.close(0)
            if dealer is not None:
                dealer.close(0)

    def _dealer(self):
        import zmq
        import zmq.asyncio

        dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.replay)
        except BaseException:
            dealer.close(0)
            raise
        return dealer

    async def _replayed(self, dealer, start: int, upto: int):
        """Ask the replay socket for batches ``start``..``upto`` and apply those past ``last_seq``, in order (vLLM's
        protocol: ``[b"", start]`` out, ``[b"", seq, payload]`` back per batch it still keeps, then ``END_SEQ``).
        Returns the socket to ask next time: a new one after a failure, so late replies answer nothing.  Never
        raises (but cancellation): a replay that fails leaves the gap missed."""
        got = 0
        try:
            async with asyncio.timeout(self.replay_timeout_s):
                await dealer.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await dealer.recv_multipart()
                    if len(frames) != 3 or frames[0] or len(frames[1]) != 8:
                        self._count("malformed")
                        continue
                    if frames[1] == END_SEQ:
                        break
                    seq = int.from_bytes(frames[1], "big")
                    if seq <= upto and (self.last_seq is None or seq > self.last_seq):
                        self.receive([b"", frames[1], frames[2]])
                        got += 1
        except asyncio.CancelledError:
            raise
        except Exception as e:  # TimeoutError, a ZMQ error, a batch that could not be applied
            self._count("replay_failed")
            log.warning("replica %s: the KV events replay from %s failed (%s)", self.name, self.replay,
                        "no end within %.1f s" % self.replay_timeout_s if isinstance(e, TimeoutError) else repr(e))
            dealer.close(0)
            dealer = self._dealer()
        self._count("replayed", got)
        return dealer

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)


def subscribe_all(fleet, endpoints, block_size: int, mismatch_after: int,
                  replay_timeout_s: float = DEFAULTS.scheduler.kv_events_replay_timeout_s,
                  ) -> tuple[list[KvEventSubscriber], CounterFamily]:
    """A mirror and a started subscriber for each endpoint that names ``kv_events``; the events counter.
    ``mismatch_after``, ``replay_timeout_s``: ``SchedulerSettings.kv_events_mismatch_after``,
    ``kv_events_replay_timeout_s``."""
    counts = CounterFamily("steersman:kv_events", "KV cache events read from the engines, by kind (blocks stored, "
                           "removed; caches cleared; blocks that could not be chained; batches malformed or missed; "
                           "engine restarts seen in the batch numbers; batches replayed, replays given up; "
                           "subscriptions that failed).",
                           ["replica", "kind"])
    subs = []
    for i, ep in enumerate(endpoints):
        if not getattr(ep, "kv_events", None) or fleet.prefix is None:
            continue
        mirror = KvEventMirror(mismatch_after)
        fleet.prefix.mirror_events(i, mirror)
        sub = KvEventSubscriber(fleet.replicas[i].name, ep.kv_events, ep.kv_events_topic, mirror, block_size, counts,
                                getattr(ep, "kv_events_replay", None), replay_timeout_s,
                                functools.partial(fleet.prefix.unmirror_events, i))
        sub.start()
        subs.append(sub)
    return subs, counts
