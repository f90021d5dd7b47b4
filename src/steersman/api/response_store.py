"""The gateway's store of Responses (``store: true``): what ``previous_response_id`` continues, and what
``GET`` / ``DELETE /v1/responses/{id}`` read.

Two stores behind one small protocol, registered by name (:data:`RESPONSE_STORES`) and chosen by
``gateway.response_store`` (unset: ``redis`` when ``gateway.response_store_url`` is set, else ``memory``): in the
gateway's memory (the default: least recently used out first past ``response_store_mib``), or in Redis (``redis://...``:
:class:`steersman.state.RedisResponseStore`), which every gateway behind one load balancer shares, so a
conversation continues whichever gateway its next turn reaches.  Either way a response is visible to its own
tenant only (another tenant's id reads as unknown, as OpenAI's store answers for another project's) and expires
``response_store_ttl_s`` after it was stored (OpenAI keeps responses 30 days).  Engines need none of it: each turn
is sent whole, so the earlier turns are a prompt prefix the scheduler routes to the replica that has it cached.

``put`` does not wait (a stream's last event is written from the relay's callback): a store with IO writes in the
background, answers its own ``get`` from the pending write meanwhile, and returns the write, which the gateway awaits
(bounded) before the answer's last bytes go out, so a next turn sent at once to another gateway finds it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import orjson

from steersman.clock import Clock
from steersman.plugins import Registry

__all__ = ["ResponseStore", "MemoryResponseStore", "Stored", "StoreUnavailable", "StoredCorrupt", "encode_stored",
           "decode_stored", "make_response_store", "response_store_name", "RESPONSE_STORES"]


@dataclass(frozen=True, slots=True)
class Stored:
    response: bytes  # the Response object's JSON
    conversation: tuple[dict[str, Any], ...]  # its chat messages, instructions excepted, with the output's own
    size: int
    input_items: tuple[dict[str, Any], ...] = ()  # its request's input, as items with ids
    expires: float = float("inf")  # on the store's clock


def encode_stored(response: dict[str, Any], conversation: list[dict[str, Any]],
                  items: Sequence[dict[str, Any]] = ()) -> bytes:
    return b'{"response":%b,"conversation":%b,"input_items":%b}' % (
        orjson.dumps(response), orjson.dumps(conversation), orjson.dumps(list(items)))


def decode_stored(raw: bytes, expires: float = float("inf")) -> Stored:
    """The record :func:`encode_stored` wrote; :class:`StoredCorrupt` for anything else (a shared store's key
    overwritten by hand or by another program: the gateway answers as for a response it does not have)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise StoredCorrupt(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise StoredCorrupt(f"a JSON {type(doc).__name__}, not an object")
    response, conversation, items = doc.get("response"), doc.get("conversation"), doc.get("input_items", [])
    if not isinstance(response, dict) or not isinstance(response.get("id"), str):
        raise StoredCorrupt("no response object with an id")
    for name, v in (("conversation", conversation), ("input_items", items)):
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            raise StoredCorrupt(f"its {name} is not a list of objects")
    return Stored(orjson.dumps(response), tuple(conversation), len(raw), input_items=tuple(items), expires=expires)


class StoreUnavailable(Exception):
    """The store could not be read or written (its server is down): the request gets a 503."""


class StoredCorrupt(Exception):
    """The stored record is not one this gateway wrote: the request is answered as for a response it does not
    have (404; retrying cannot help), the read counted ``corrupt`` and the record's key logged."""


@runtime_checkable
class ResponseStore(Protocol):
    def put(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]],
            items: Sequence[dict[str, Any]] = ()) -> Awaitable[None] | None:
        """Keep a completed response, its conversation and its input items (without waiting for any IO); the write
        under way when there is IO (never raises: a failed write is counted), else None."""

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        """The tenant's stored response, None when unknown or expired; :class:`StoreUnavailable` on IO failure."""

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Forget it; False when it was not there."""

    async def close(self) -> None: ...


#: per entry besides its record: the ordered dict's slot and node, the (tenant, id) key tuple and its id string, the
#: (record, expiry) tuple and the float, the bytes object's header (measured: tests/api/test_response_store_memory.py;
#: a store of 750-byte records held 1.58x what it counted without it)
_ENTRY_BYTES = 440


class MemoryResponseStore:
    """In the gateway's memory: least recently used out first past ``max_bytes``.  An entry is its encoded record
    alone, decoded on read: ``bytes`` is what it holds (orjson's own output over-allocates, and the decoded dicts
    are several times the JSON's size)."""

    def __init__(self, max_bytes: int, ttl_s: float, clock: Clock,
                 count: Callable[[str, str], None] = lambda op, outcome: None) -> None:
        self.count = count
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.bytes = 0
        self._items: OrderedDict[tuple[str, str], tuple[bytes, float]] = OrderedDict()  # -> (record, expiry)

    def __len__(self) -> int:
        return len(self._items)

    def put(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]],
            items: Sequence[dict[str, Any]] = ()) -> None:
        raw = encode_stored(response, conversation, items)  # (built by %: exactly its length)
        if len(raw) + _ENTRY_BYTES > self.max_bytes:
            self.count("write", "too_large")
            return  # larger than the whole store: not kept (a follow-up names an unknown id)
        self.count("write", "written")
        key = (tenant, response["id"])
        self._drop(key)
        self._items[key] = (raw, self.clock.now() + self.ttl_s)
        self.bytes += len(raw) + _ENTRY_BYTES
        while self.bytes > self.max_bytes:
            _, (gone, _) = self._items.popitem(last=False)
            self.bytes -= len(gone) + _ENTRY_BYTES

    def _drop(self, key: tuple[str, str]) -> bytes | None:
        got = self._items.pop(key, None)
        if got is None:
            return None
        self.bytes -= len(got[0]) + _ENTRY_BYTES
        return got[0]

    def lookup(self, tenant: str, response_id: str) -> Stored | None:
        key = (tenant, response_id)
        got = self._items.get(key)
        if got is None:
            return None
        raw, expires = got
        if expires <= self.clock.now():
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return decode_stored(raw, expires)

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        return self.lookup(tenant, response_id)

    def remove(self, tenant: str, response_id: str) -> bool:
        return self._drop((tenant, response_id)) is not None

    async def delete(self, tenant: str, response_id: str) -> bool:
        return self.remove(tenant, response_id)

    async def close(self) -> None:
        self._items.clear()
        self.bytes = 0


def _memory(settings, clock: Clock, count: Callable[[str, str], None]) -> MemoryResponseStore:
    return MemoryResponseStore(settings.response_store_mib * 2**20, settings.response_store_ttl_s, clock, count)


def _redis(settings, clock: Clock, count: Callable[[str, str], None]) -> ResponseStore:
    from steersman.state.redis_responses import RedisResponseStore

    # (its URL is set: GatewaySettings refuses the store 'redis' without one)
    return RedisResponseStore(settings.response_store_url, settings.response_store_prefix,
                              settings.response_store_mib * 2**20, settings.response_store_ttl_s,
                              settings.response_store_timeout_s, count)


#: response stores by name: a factory taking (GatewaySettings, clock, count(op, outcome)); ``gateway.response_store``
RESPONSE_STORES: Registry = Registry("response store", ResponseStore)
RESPONSE_STORES.register("memory", _memory)
RESPONSE_STORES.register("redis", _redis)


def response_store_name(settings) -> str:
    """The store ``settings`` (GatewaySettings) name: ``response_store``, else redis with a URL, else memory."""
    return settings.response_store or ("redis" if settings.response_store_url else "memory")


def make_response_store(settings, clock: Clock, count: Callable[[str, str], None] = lambda op, outcome: None) -> ResponseStore:
    """The store ``settings`` (GatewaySettings) name (:func:`response_store_name`), checked against
    :class:`ResponseStore`; ``count(op, outcome)`` hears of each write (``written`` / ``error`` / ``too_large``)."""
    return RESPONSE_STORES.build(response_store_name(settings), settings, clock, count)
