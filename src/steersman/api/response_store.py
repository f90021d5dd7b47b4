"""The gateway's store of Responses (``store: true``): what ``previous_response_id`` continues, and what
``GET`` / ``DELETE /v1/responses/{id}`` read.

In memory, least recently used first out past a byte budget (``GatewaySettings.response_store_mib``), each
response visible to its own tenant only (another tenant's id reads as unknown, as OpenAI's store answers for
another project's).  Engines need none of it: each turn is sent whole, so the conversation's earlier turns are a
prompt prefix the scheduler routes to the replica that has it cached.  One gateway's memory: gateways behind one
load balancer each keep their own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["ResponseStore", "Stored"]


@dataclass(frozen=True, slots=True)
class Stored:
    response: bytes  # the Response object's JSON
    conversation: tuple[dict[str, Any], ...]  # its chat messages, instructions excepted, with the output's own
    size: int


class ResponseStore:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[tuple[str, str], Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        body = orjson.dumps(response)
        size = len(body) + len(orjson.dumps(conversation))
        if size > self.max_bytes:
            return  # larger than the whole store: not kept (a follow-up names an unknown id)
        key = (tenant, response["id"])
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        self._items[key] = Stored(body, tuple(conversation), size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, gone = self._items.popitem(last=False)
            self.bytes -= gone.size

    def get(self, tenant: str, response_id: str) -> Stored | None:
        key = (tenant, response_id)
        got = self._items.get(key)
        if got is not None:
            self._items.move_to_end(key)
        return got

    def delete(self, tenant: str, response_id: str) -> bool:
        got = self._items.pop((tenant, response_id), None)
        if got is None:
            return False
        self.bytes -= got.size
        return True
