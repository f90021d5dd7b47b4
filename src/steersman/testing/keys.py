"""API keys for a live fleet's tenants."""

from __future__ import annotations

from typing import Any

from steersman.control.tenants import generate_key

__all__ = ["tenants_with_keys"]


def tenants_with_keys(tenants: dict[str, dict[str, Any]]) -> tuple[dict[str, str], dict[str, Any]]:
    """A new API key per tenant: ({tenant: key}, the fleet file's ``tenants`` and ``api_keys`` sections, as
    :class:`~steersman.testing.LiveFleet`'s ``extra`` takes them)."""
    keys, entries = {}, []
    for name in tenants:
        key, digest = generate_key()
        keys[name] = key
        entries.append({"sha256": digest, "tenant": name})
    return keys, {"tenants": tenants, "api_keys": entries}
