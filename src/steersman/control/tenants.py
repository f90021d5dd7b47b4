"""Tenants and API keys: who is calling, and with what priority, limits and budget.

The gateway config names tenants and the keys that authenticate as them::

    tenants:
      acme: {priority: critical, requests_per_minute: 600, tokens_per_minute: 200000, budget_usd: 50, weight: 2}
      free: {priority: sheddable, requests_per_minute: 10}
    api_keys:
      - {sha256: "<64 hex>", tenant: acme}

Keys are never stored: only the SHA-256 hex digest of the full key string
(``steersman keys create`` prints a new key once, with the line to paste).
:meth:`TenantDirectory.authenticate` hashes the presented key and looks the
digest up in a dict.  That lookup is not a timing leak worth closing: the
attacker does not choose the digest (SHA-256 is preimage resistant), so how
long the dict takes to find it says nothing useful about a valid key; the final
``hmac.compare_digest`` keeps the one secret-dependent comparison constant-time.

With no keys configured the directory is *open*: every request is the
``open_tenant`` tenant (``default``: standard priority, no limits, unless a
tenant of that name is configured) and :attr:`TenantDirectory.open` is True so
the gateway can warn at startup.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from steersman.config._base import finite_number, shown
from steersman.config._yaml import load_yaml
from steersman.config.admission import AdmissionSettings
from steersman.policy.request import PriorityClass

__all__ = [
    "TenantConfig", "TenantDirectory", "TenantsDoc", "AuthError", "TenantConfigError",
    "generate_key", "hash_key", "load_tenants", "KEY_PREFIX", "TENANT_NAME",
]

KEY_PREFIX = "sk-steersman-"
#: Tenant names appear in metric labels and unquoted YAML: keep them plain.
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_TENANT_FIELDS = ("priority", "requests_per_minute", "tokens_per_minute", "budget_usd", "weight", "max_concurrent_requests")
_KEY_FIELDS = ("sha256", "tenant")
#: the least tenant weight: the fair queue's 1 / weight stays finite (a subnormal weight made it inf)
MIN_WEIGHT = 1e-9


class TenantConfigError(ValueError):
    """The tenants / api_keys config is invalid; the message names the field."""


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """One tenant.  ``None`` limits mean unlimited; ``weight`` is its fair share inside its band."""

    name: str
    priority: PriorityClass
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    budget_usd: float | None = None
    weight: float = 1.0
    #: requests of this tenant in the gateway at once (queued or running), past which a new one is a 429 (LiteLLM's
    #: max_parallel_requests per key); per gateway process
    max_concurrent_requests: int | None = None


@dataclass(frozen=True, slots=True)
class AuthError:
    """Why a request could not be authenticated (the gateway answers 401)."""

    reason: str  # "missing" | "malformed" | "unknown"
    message: str
    status: ClassVar[int] = 401
    code: ClassVar[str] = "invalid_api_key"


_MISSING = AuthError("missing", "No API key provided: send it as 'Authorization: Bearer <key>'.")
_MALFORMED = AuthError("malformed", "Malformed Authorization header: expected 'Bearer <key>'.")
_UNKNOWN = AuthError("unknown", "Incorrect API key provided.")


def hash_key(key: str) -> str:
    """The stored form of an API key: SHA-256 hex of the full key string (UTF-8)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def generate_key() -> tuple[str, str]:
    """A new API key and its SHA-256 hex: ``sk-steersman-`` + 32 random bytes, URL-safe base64."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


class TenantsDoc:
    """A fleet file's ``tenants`` and ``api_keys`` sections as read; its repr names no key digest (as
    :class:`~steersman.control.tenants.TenantDirectory`'s)."""

    __slots__ = ("data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TenantsDoc) and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"TenantsDoc({len(self.data.get('tenants') or ())} tenants, "
                f"{len(self.data.get('api_keys') or ())} api keys)")


class TenantDirectory:
    """Tenants by name and API-key digests; changed only whole, by :meth:`replace_with` (an operator's reload)."""

    __slots__ = ("_tenants", "_keys", "_open_tenant")

    def __init__(self, tenants: Mapping[str, TenantConfig], keys: Mapping[str, str], open_tenant: TenantConfig) -> None:
        for digest, name in keys.items():
            if name not in tenants:
                raise TenantConfigError(f"api key {digest[:8]}... references unknown tenant {name!r}")
        self._tenants = dict(tenants)
        self._keys = {d.lower(): (d.lower(), tenants[n]) for d, n in keys.items()}
        self._open_tenant = open_tenant

    @classmethod
    def from_data(cls, data: Any, where: str = "tenants config", settings: AdmissionSettings = AdmissionSettings()) -> TenantDirectory:
        """Build from the parsed YAML mapping with the keys ``tenants`` and ``api_keys`` (both optional)."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise TenantConfigError(f"{where}: expected a mapping with 'tenants' and 'api_keys', got {type(data).__name__}")
        unknown = sorted(map(str, set(data) - {"tenants", "api_keys"}))
        if unknown:
            raise TenantConfigError(f"{where}: unknown key(s) {unknown}; known: ['api_keys', 'tenants']")
        tenants = _parse_tenants(data.get("tenants"), where, settings)
        keys = _parse_keys(data.get("api_keys"), tenants, where)
        open_tenant = tenants.get(settings.open_tenant) or TenantConfig(
            settings.open_tenant, PriorityClass.parse(settings.default_priority)
        )
        return cls(tenants, keys, open_tenant)

    def replace_with(self, other: TenantDirectory) -> None:
        """Take ``other``'s tenants, keys and open tenant, in place: every holder of this directory (the
        authentication stage, the shared limits' sync) reads the new ones from the next request on; requests under
        way keep the :class:`TenantConfig` they were admitted with."""
        self._tenants, self._keys, self._open_tenant = other._tenants, other._keys, other._open_tenant

    def same_as(self, other: TenantDirectory) -> bool:
        """The same tenants (every setting), keys and open tenant."""
        return (self._tenants, self._keys, self._open_tenant) == (other._tenants, other._keys, other._open_tenant)

    @property
    def open(self) -> bool:
        """True when no API key is configured: every request is the open tenant, unauthenticated."""
        return not self._keys

    @property
    def tenants(self) -> Mapping[str, TenantConfig]:
        return dict(self._tenants)

    @property
    def open_tenant(self) -> TenantConfig:
        return self._open_tenant

    @property
    def key_count(self) -> int:
        return len(self._keys)

    def get(self, name: str) -> TenantConfig:
        if self.open and name == self._open_tenant.name:
            return self._open_tenant
        try:
            return self._tenants[name]
        except KeyError:
            raise KeyError(f"unknown tenant {name!r}") from None

    def authenticate(self, header_value: str | None) -> TenantConfig | AuthError:
        """The tenant of an ``Authorization`` header value, or why it is refused."""
        if not self._keys:
            return self._open_tenant
        if header_value is None or not header_value.strip():
            return _MISSING
        parts = header_value.split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            return _MALFORMED
        digest = hash_key(parts[1])
        found = self._keys.get(digest)
        if found is None:
            return _UNKNOWN
        stored, tenant = found
        # The dict matched an equal string already; the constant-time compare is defence in depth.
        return tenant if hmac.compare_digest(stored, digest) else _UNKNOWN

    def __repr__(self) -> str:  # never show digests
        return f"TenantDirectory(tenants={sorted(self._tenants)}, keys={len(self._keys)}, open={self.open})"


def load_tenants(path: str | Path, settings: AdmissionSettings = AdmissionSettings()) -> TenantDirectory:
    """Read a YAML file holding ``tenants`` and ``api_keys``, as the fleet file is read
    (:func:`~steersman.config._yaml.load_yaml`: a key given twice is an error naming it, numbers as YAML 1.2)."""
    p = Path(path)
    try:
        data = load_yaml(p.read_bytes().decode("utf-8"))
    except OSError as e:
        raise TenantConfigError(f"cannot read {p}: {e}") from None
    except UnicodeDecodeError:
        raise TenantConfigError(f"cannot read {p}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise TenantConfigError(f"{p}: invalid YAML: {e}") from None
    return TenantDirectory.from_data(data, str(p), settings)


def _parse_tenants(raw: Any, where: str, settings: AdmissionSettings) -> dict[str, TenantConfig]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise TenantConfigError(f"{where}: tenants must be a mapping of name -> settings, got {type(raw).__name__}")
    out: dict[str, TenantConfig] = {}
    for name, body in raw.items():
        if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
            raise TenantConfigError(
                f"{where}: tenant name {shown(name)} must be a string of letters, digits, '_', '.', '-' (at most 64; "
                "quote names YAML reads as numbers or booleans)"
            )
        field = f"tenants.{name}"
        body = {} if body is None else body
        if not isinstance(body, Mapping):
            raise TenantConfigError(f"{where}: {field} must be a mapping, got {type(body).__name__}")
        unknown = sorted(map(str, set(body) - set(_TENANT_FIELDS)))
        if unknown:
            raise TenantConfigError(f"{where}: {field}: unknown field(s) {unknown}; known: {sorted(_TENANT_FIELDS)}")
        prio = body.get("priority", settings.default_priority)
        if not isinstance(prio, str):
            raise TenantConfigError(f"{where}: {field}.priority must be a string, got {shown(prio)}")
        try:
            priority = PriorityClass.parse(prio)
        except ValueError as e:
            raise TenantConfigError(f"{where}: {field}.priority: {e}") from None
        rpm = _number(body, "requests_per_minute", field, where, positive=True)
        tpm = _number(body, "tokens_per_minute", field, where, positive=True)
        budget = _number(body, "budget_usd", field, where, positive=False)
        weight = _number(body, "weight", field, where, positive=True)
        if weight is not None and weight < MIN_WEIGHT:  # the fair queue advances a tenant by 1 / weight per service
            raise TenantConfigError(f"{where}: {field}.weight must be >= {MIN_WEIGHT:g}, got {weight!r}")
        most = body.get("max_concurrent_requests")
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
            raise TenantConfigError(f"{where}: {field}.max_concurrent_requests must be an integer >= 1, got {shown(most)}")
        out[name] = TenantConfig(name, priority, rpm, tpm, budget, 1.0 if weight is None else weight, most)
    return out


def _number(body: Mapping, key: str, field: str, where: str, *, positive: bool) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite_number(v):
        raise TenantConfigError(f"{where}: {field}.{key} must be a finite number, got {shown(v)}")
    if (positive and v <= 0) or v < 0:
        raise TenantConfigError(f"{where}: {field}.{key} must be {'> 0' if positive else '>= 0'}, got {shown(v)}")
    return float(v)



def _parse_keys(raw: Any, tenants: Mapping[str, TenantConfig], where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise TenantConfigError(f"{where}: api_keys must be a list of {{sha256, tenant}}, got {type(raw).__name__}")
    keys: dict[str, str] = {}
    first: dict[str, int] = {}
    for i, entry in enumerate(raw):
        field = f"api_keys[{i}]"
        if not isinstance(entry, Mapping):
            raise TenantConfigError(f"{where}: {field} must be a mapping {{sha256, tenant}}, got {type(entry).__name__}")
        unknown = sorted(map(str, set(entry) - set(_KEY_FIELDS)))
        if unknown:
            raise TenantConfigError(f"{where}: {field}: unknown field(s) {unknown}; known: {list(_KEY_FIELDS)}")
        digest, tenant = entry.get("sha256"), entry.get("tenant")
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise TenantConfigError(f"{where}: {field}.sha256 must be 64 hex characters (the SHA-256 of the key, not the key)")
        if not isinstance(tenant, str):
            raise TenantConfigError(f"{where}: {field}.tenant must be a tenant name, got {shown(tenant)}")
        if tenant not in tenants:
            raise TenantConfigError(
                f"{where}: {field}.tenant {shown(tenant)} is not a configured tenant; known: {sorted(tenants) or 'none'}"
            )
        digest = digest.lower()
        if digest in first:
            raise TenantConfigError(f"{where}: {field}.sha256 duplicates api_keys[{first[digest]}]")
        first[digest] = i
        keys[digest] = tenant
    return keys
