"""Admin endpoints of the gateway and the admin key that guards them.

Everything that reveals the fleet's internals is an admin endpoint: ``GET
/metrics`` (replica names, per-tenant and per-replica counters) and ``GET
/admin/fleet`` (every replica's URL, engine, health and load).  With
``gateway.admin_key_sha256`` set (the SHA-256 hex of the key, like tenant keys:
the key itself is never stored) they need ``Authorization: Bearer <admin key>``;
a missing key is a 401, any other key (a tenant's included) a 403, both in the
OpenAI error format.  Without it they are open, like the open tenant mode, and
the gateway says so at startup; ``POST /admin/reload`` (it changes who may use the
gateway) is refused then.
"""

from __future__ import annotations

import hmac
import math
import re
from urllib.parse import unquote

from steersman.api.errors import ApiError
from steersman.control.tenants import hash_key
from steersman.fleet import snapshot as S

__all__ = ["AdminGuard", "fleet_view", "replica_action", "REPLICAS_PATH"]

#: ``POST /admin/replicas/{name}/drain`` and ``.../resume``: an operator takes a replica out of rotation and back
REPLICAS_PATH = "/admin/replicas/"
_ACTIONS = ("drain", "resume")

_HEX64 = re.compile(r"[0-9a-f]{64}")


class AdminGuard:
    __slots__ = ("_digest",)

    def __init__(self, admin_key_sha256: str | None) -> None:
        if admin_key_sha256 is not None:
            admin_key_sha256 = admin_key_sha256.strip().lower()
            if not _HEX64.fullmatch(admin_key_sha256):
                raise ValueError("gateway.admin_key_sha256 must be the SHA-256 hex digest of the admin key (64 hex digits)")
        self._digest = admin_key_sha256

    @property
    def open(self) -> bool:
        return self._digest is None

    def check(self, authorization: str | None) -> ApiError | None:
        """None if the request may use admin endpoints, else the error to answer."""
        if self._digest is None:
            return None
        parts = (authorization or "").split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            return ApiError(401, "Admin endpoints need the admin key: `Authorization: Bearer <admin key>`.",
                            "authentication_error", None, "missing_admin_key")
        if not hmac.compare_digest(hash_key(parts[1]), self._digest):
            return ApiError(403, "This key may not use admin endpoints.", "permission_error", None, "not_admin")
        return None


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def fleet_view(fleet) -> dict:
    """What ``GET /admin/fleet`` shows: every replica's address, engine, models, health and load.

    ``routable``: it gets new requests now (healthy, weights warm, not drained by an operator (``draining``, see
    :func:`replica_action`), not ejected, breaker not open; an observability
    audit found an ejected replica shown routable: the page read health and warmth only), ``ejected`` the latter two
    alone; the engine's own load as last scraped (running, waiting, KV cache usage: NaN, unknown, is null)."""
    reps = []
    rotation = fleet.in_rotation()
    for r in fleet.replicas:
        i = r.index
        reps.append({
            "name": r.name, "url": r.url, "engine": r.engine, "gpu": r.gpu, "models": list(r.models), "pool": r.pool,
            "healthy": bool(fleet.healthy[i]), "routable": bool(rotation[i]), "draining": bool(fleet.draining[i]),
            "ejected": fleet.blocked(i),  # (by the guard, whatever else keeps it out: a drained one's too)
            "in_flight": float(fleet.in_flight[i]),
            "running": _finite(fleet.live[S.RUNNING, i]), "waiting": _finite(fleet.live[S.WAITING, i]),
            "kv_cache_usage": _finite(fleet.live[S.KV_USAGE, i]),
            # the engine's own timing of its work where it reports it (llama.cpp), what the scheduler predicts with
            "prefill_s_per_token": _finite(fleet.live[S.PREFILL_S_TOKEN, i]),
            "decode_s_per_token": _finite(fleet.live[S.DECODE_S_TOKEN, i]),
        })
    return {"replicas": reps}


def replica_action(fleet, path: str) -> tuple[int, str]:
    """``POST /admin/replicas/{name}/drain`` takes the replica out of rotation (its requests under way finish,
    none is sent there: before an engine's upgrade or a node's maintenance; ``in_flight`` in ``GET /admin/fleet``
    says when it is empty), ``.../resume`` puts it back (Envoy's and AWS load balancers' connection draining,
    sglang-router's ``/remove_worker`` without forgetting the worker).  ``{name}`` is a replica's name as
    ``GET /admin/fleet`` lists it, URL-encoded.  Returns (replica index, action); :class:`ApiError` 404 naming
    what is unknown."""
    rest = path[len(REPLICAS_PATH):]
    name, _, action = rest.rpartition("/")
    if not name or action not in _ACTIONS:
        raise ApiError(404, f"No such endpoint: {path}. An operator drains a replica with POST "
                       f"{REPLICAS_PATH}{{name}}/drain and puts it back with POST {REPLICAS_PATH}{{name}}/resume.",
                       "invalid_request_error", None, "not_found")
    name = unquote(name)
    names = [r.name for r in fleet.replicas]
    if name not in names:
        raise ApiError(404, f"No replica named {name!r}; the fleet's replicas: {', '.join(names)}.",
                       "invalid_request_error", "name", "replica_not_found")
    return names.index(name), action
