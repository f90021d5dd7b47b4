"""engine-sim's KV events, as vLLM publishes them (``--kv-events-config``, ZMQ publisher).

The engine model's pool tells every change of its prefix cache (:class:`steersman.sim.kvcache.KVPool`'s
``listener``); they are gathered per engine step and sent after it as one ``KVEventBatch`` on a ZMQ PUB
socket: ``[topic, seq (8 bytes, big-endian), msgpack payload]`` (:mod:`steersman.engines.kv_events`).
Stored blocks carry the gateway's own hashes and no token ids (engine-sim hashes as the gateway does), with
their parent's hash.  A subscriber too slow for the socket's high-water mark loses batches (the sequence
number shows the gap), as with vLLM; nothing blocks the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from steersman.engines.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, encode_batch

__all__ = ["KvEventPublisher"]

_HWM = 100_000  # vLLM KVEventsConfig.hwm


class KvEventPublisher:
    """A PUB socket bound to ``endpoint`` (``tcp://127.0.0.1:*`` takes a free port: see ``endpoint``)."""

    def __init__(self, endpoint: str, topic: str, block_size: int) -> None:
        import zmq

        self._zmq = zmq
        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, _HWM)
        try:
            self.sock.bind(endpoint)
        except zmq.ZMQError as e:
            self.sock.close(0)
            raise ValueError(f"cannot bind the KV events endpoint {endpoint!r}: {e}") from None
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()  # the port taken, for subscribers
        self.topic = topic.encode()
        self.block_size = block_size
        self.seq = 0
        self._pending: list = []

    # -- the pool's listener ------------------------------------------------------------------------
    def stored(self, hashes: Sequence[int], parent: int | None = None) -> None:
        self._pending.append(BlockStored(list(hashes), parent, [], self.block_size))

    def removed(self, hashes: Sequence[int]) -> None:
        self._pending.append(BlockRemoved(list(hashes)))

    def cleared(self) -> None:
        self._pending.append(AllBlocksCleared())

    # -- once a step -------------------------------------------------------------------------------
    def flush(self, ts: float) -> None:
        """Send what the step changed as one batch (nothing if nothing changed)."""
        if not self._pending:
            return
        payload = encode_batch(KVEventBatch(ts, self._pending))
        self._pending = []
        try:
            self.sock.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload], flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            pass  # past the high-water mark: dropped, and the subscriber sees the gap in seq (as with vLLM)
        self.seq += 1

    def close(self) -> None:
        self.sock.close(0)
