"""engine-sim's KV events, as vLLM publishes them (``--kv-events-config``, ZMQ publisher).

The engine model's pool tells every change of its prefix cache (:class:`steersman.sim.kvcache.KVPool`'s
``listener``); they are gathered per engine step and sent after it as one ``KVEventBatch`` on a ZMQ PUB
socket: ``[topic, seq (8 bytes, big-endian), msgpack payload]`` (:mod:`steersman.engines.kv_events`).
Stored blocks carry the gateway's own hashes and no token ids (engine-sim hashes as the gateway does), with
their parent's hash.  A subscriber too slow for the socket's high-water mark loses batches (the sequence
number shows the gap), as with vLLM; nothing blocks the engine.

Replay, as vLLM's ``replay_endpoint``: the last ``buffer_steps`` batches are kept, and a ROUTER socket answers a
DEALER's ``[b"", start seq (8 bytes, big-endian)]`` with one ``[b"", seq, payload]`` per kept batch from ``start``
on, then ``[b"", END_SEQ (-1, 8 bytes signed), b""]``: a subscriber recovers what a gap lost, or what was stored
before it joined.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

from steersman._tasks import cancel_and_wait
from steersman.config import DEFAULTS
from steersman.engines.kv_events import END_SEQ, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, encode_batch

__all__ = ["KvEventPublisher"]

log = logging.getLogger("steersman.enginesim.kv_events")


class KvEventPublisher:
    """A PUB socket bound to ``endpoint`` (``tcp://127.0.0.1:*`` takes a free port: see ``endpoint``), and with
    ``replay_endpoint`` a ROUTER socket answering replay requests (:meth:`serve_replay`; ``replay_endpoint``
    becomes the address bound)."""

    def __init__(self, endpoint: str, topic: str, block_size: int, replay_endpoint: str | None = None,
                 buffer_steps: int = DEFAULTS.sim_server.kv_events_buffer_steps) -> None:
        import zmq

        self._zmq = zmq
        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, DEFAULTS.sim_server.kv_events_hwm)
        self.endpoint = self._bind(self.sock, endpoint)  # the port taken, for subscribers
        self.replay_endpoint: str | None = None
        self._replay = None
        if replay_endpoint is not None:
            import zmq.asyncio

            self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.setsockopt(zmq.SNDHWM, buffer_steps + 2)  # a whole replay queued (past it ROUTER drops)
            try:
                self.replay_endpoint = self._bind(self._replay, replay_endpoint)
            except ValueError:
                self.sock.close(0)
                raise
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._task: asyncio.Task | None = None
        self.topic = topic.encode()
        self.block_size = block_size
        self.seq = 0
        self._pending: list = []

    def _bind(self, sock, endpoint: str) -> str:
        try:
            sock.bind(endpoint)
        except self._zmq.ZMQError as e:
            sock.close(0)
            raise ValueError(f"cannot bind the KV events endpoint {endpoint!r}: {e}") from None
        return sock.getsockopt(self._zmq.LAST_ENDPOINT).decode()

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
        if self._replay is not None:
            self._buffer.append((self.seq, payload))
        try:
            self.sock.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload], flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            pass  # past the high-water mark: dropped, and the subscriber sees the gap in seq (as with vLLM)
        self.seq += 1

    # -- replay ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Answer replay requests on the running loop (nothing without ``replay_endpoint``)."""
        if self._replay is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.serve_replay(), name="kv-events-replay")

    async def serve_replay(self) -> None:
        sock = self._replay
        assert sock is not None
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3 or frames[1] or len(frames[2]) != 8:
                log.warning("a malformed KV events replay request (%d frames) was ignored", len(frames))
                continue
            client, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):  # (a copy: the engine steps on while this sends)
                if seq >= start:
                    await sock.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await sock.send_multipart([client, b"", END_SEQ, b""])

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self.close()

    def close(self) -> None:
        self.sock.close(0)
        if self._replay is not None:
            self._replay.close(0)
