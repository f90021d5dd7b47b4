"""Stored Responses in Redis, shared by every gateway that names the same server and key prefix.

One key per response, ``{prefix}response:{tenant digest}:{id}``, holding the Response object and its conversation
as one JSON document, written with an expiry (``SET ... PX``): Redis forgets it after the TTL, and its own
``maxmemory`` policy bounds the memory (a response larger than ``response_store_mib`` is not stored).  The tenant
is part of the key, so another tenant's id is simply not there.

``put`` does not wait: it keeps the document as pending and writes it on a task, which it returns; this gateway's
reads find a pending write first, and the gateway holds the answer's last bytes until the write landed (at most
``response_store_timeout_s``), so a client that sends its next turn as soon as the stream ends finds it whichever
gateway that turn reaches.  A write that fails is logged and counted (``failed_writes``); a read or delete
that fails raises :class:`StoreUnavailable` (the gateway answers 503, which clients retry; the Redis error is
logged, not sent); a record that is not one the gateway wrote raises :class:`StoredCorrupt` (answered 404).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from steersman.api.response_store import Stored, StoreUnavailable, StoredCorrupt, decode_stored, encode_stored

__all__ = ["RedisResponseStore"]

log = logging.getLogger("steersman.state")

#: the longest expiry given to Redis: ``SET ... PX`` refuses one whose deadline (now + PX, in ms) passes a signed
#: 64-bit integer, and that on every write; 2**62 ms (~146 million years) stays well within on any Redis
_MAX_TTL_MS = 2**62


class RedisResponseStore:
    def __init__(self, url: str, prefix: str, max_bytes: int, ttl_s: float, timeout_s: float,
                 count: Callable[[str, str], None] = lambda op, outcome: None) -> None:
        self.count = count  # (op, outcome) of each write: written / error / too_large
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.ttl_ms = max(1, int(min(_MAX_TTL_MS, ttl_s * 1000)))  # (config bounds the TTL: kept safe here too)
        self.client = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._pending: dict[bytes, bytes] = {}
        self._writing: dict[bytes, asyncio.Task] = {}  # key -> its write under way
        self.failed_writes = 0

    def key(self, tenant: str, response_id: str) -> bytes:
        who = hashlib.sha256(tenant.encode()).hexdigest()[:16]
        return f"{self.prefix}response:{who}:{response_id}".encode()

    def put(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]],
            items: Sequence[dict[str, Any]] = ()) -> Awaitable[None] | None:
        raw = encode_stored(response, conversation, items)
        if len(raw) > self.max_bytes:
            self.count("write", "too_large")
            return None
        key = self.key(tenant, response["id"])
        self._pending[key] = raw
        task = self._writing[key] = asyncio.get_running_loop().create_task(self._write(key, raw))
        return task

    async def _write(self, key: bytes, raw: bytes) -> None:
        try:
            await self.client.set(key, raw, px=self.ttl_ms)
            self.count("write", "written")
        except (RedisError, OSError) as e:
            self.failed_writes += 1
            self.count("write", "error")
            log.warning("stored response not written to Redis (%s): a follow-up naming it will not find it", e)
        finally:
            if self._pending.get(key) is raw:
                del self._pending[key]
                self._writing.pop(key, None)

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        key = self.key(tenant, response_id)
        raw = self._pending.get(key)
        if raw is None:
            try:
                raw = await self.client.get(key)
            except ResponseError as e:
                if not str(e).startswith("WRONGTYPE"):  # BUSY, MASTERDOWN, TRYAGAIN, NOPERM...: the server's state
                    log.warning("response store (Redis) read failed: %s", e)
                    raise StoreUnavailable("the response store cannot be read") from None
                # a data error (not a string there): retrying cannot help
                log.warning("stored response %r unreadable in Redis (%s): answered as not found", key, e)
                raise StoredCorrupt(str(e)) from None
            except (RedisError, OSError) as e:  # the details are the operator's, not the client's
                log.warning("response store (Redis) read failed: %s", e)
                raise StoreUnavailable("the response store cannot be read") from None
        if raw is None:
            return None
        try:
            return decode_stored(raw)
        except StoredCorrupt as e:
            log.warning("stored response %r in Redis is corrupt (%s): answered as not found", key, e)
            raise

    async def delete(self, tenant: str, response_id: str) -> bool:
        key = self.key(tenant, response_id)
        pending = self._pending.pop(key, None)
        writing = self._writing.pop(key, None)
        if writing is not None:  # a write under way must not bring it back after the delete
            await asyncio.wait({writing})
        try:
            n = await self.client.delete(key)
        except (RedisError, OSError) as e:
            log.warning("response store (Redis) delete failed: %s", e)
            raise StoreUnavailable("the response store cannot be written") from None
        return bool(n) or pending is not None

    async def check(self) -> bool:
        """Whether Redis answers now (a ``PING``); logs a warning naming the URL when it does not (at the gateway's
        start: an unreachable store was first reported by the first failed write)."""
        try:
            await self.client.ping()
            return True
        except (RedisError, OSError) as e:
            log.warning("the response store (Redis) does not answer at start (%s): stored Responses cannot be read "
                        "or written until it does (chat is served meanwhile)", e)
            return False

    async def close(self) -> None:
        if self._writing:
            await asyncio.wait(set(self._writing.values()), timeout=2.0)
        await self.client.aclose()
