"""A JSON request body with one member set last, without parsing it (the body is forwarded as the client wrote it).

vLLM's parser (pydantic over ``json``), msgspec and orjson all take the last of duplicate keys, so a member
appended last wins over one the client sent: the gateway's priority band, a brown-out's model, a tenant's
cache salt.
"""

from __future__ import annotations

__all__ = ["with_member"]


def with_member(body: bytes, key: bytes, value_json: bytes) -> bytes:
    """``body`` (a JSON object) with ``"key": value_json`` (already JSON) as its last member; ValueError when
    ``body`` does not end as an object."""
    end = body.rstrip().rfind(b"}")
    if end < 0:
        raise ValueError("the request body is not a JSON object")
    head = body[:end].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return b'%b%b"%b":%b}' % (head, sep, key, value_json)
