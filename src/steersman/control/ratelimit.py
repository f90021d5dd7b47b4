"""Per-tenant rate limits: token buckets for requests per minute and tokens per minute.

A :class:`TokenBucket` refills continuously at ``rate`` per second up to
``capacity``.  For a limit of L per minute, ``rate = L / 60`` and
``capacity = rate * rate_burst_s`` -- by default one minute's worth (L), the
shape of Envoy's local rate limit token bucket (``max_tokens = tokens_per_fill``,
``fill_interval`` 60 s), refilled smoothly instead of once a minute.  Over any
window of length T a bucket hands out at most ``rate * T + capacity``.

Tokens are *reserved* at admission (prompt tokens + ``max_tokens`` for each
sample, as OpenAI counts a request against a TPM limit; the expected output when
the request names no ``max_tokens``: :attr:`SchedRequest.limit_tokens`) and
*settled* when the request ends with the real usage: the difference is refunded
(never above capacity) or charged extra.  A request whose reservation alone
exceeds the bucket's capacity is :class:`TooLarge`.  An extra charge may leave the bucket
in debt (a negative level); the next admission then waits until the debt and its
own cost have refilled.  A refusal carries ``retry_after``: the seconds until
the bucket holds enough, assuming nobody else takes from it meanwhile.

Pure: every call takes ``now`` (seconds from the injected clock); time that goes
backwards refills nothing.  Not thread-safe: one event loop (or the twin) owns it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from steersman.config.admission import AdmissionSettings
from steersman.control.tenants import TenantConfig

__all__ = ["TokenBucket", "RateLimiter", "Reservation", "Throttle", "TooLarge"]


class TokenBucket:
    """A continuously refilled bucket; the level may go negative (debt) only through :meth:`give`."""

    __slots__ = ("rate", "capacity", "_level", "_t")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"token bucket rate must be a finite number > 0, got {rate!r}")
        if not (math.isfinite(capacity) and capacity > 0):
            raise ValueError(f"token bucket capacity must be a finite number > 0, got {capacity!r}")
        self.rate = float(rate)
        self.capacity = float(capacity)
        self._level = self.capacity  # starts full
        self._t = float(now)

    def _advance(self, now: float) -> None:
        if now > self._t:
            self._level = min(self.capacity, self._level + (now - self._t) * self.rate)
            self._t = now

    def level(self, now: float) -> float:
        self._advance(now)
        return self._level

    def wait(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` can be taken (0: now); ``inf`` if it exceeds the capacity."""
        if cost > self.capacity:
            return math.inf
        self._advance(now)
        short = cost - self._level
        if short <= 1e-9 * max(1.0, cost):  # float slack so waiting exactly ``wait`` always suffices
            return 0.0
        return short / self.rate

    def take(self, cost: float, now: float) -> float:
        """Take ``cost`` and return 0.0, or take nothing and return the seconds to wait."""
        w = self.wait(cost, now)
        if w == 0.0:
            self._level -= cost
        return w

    def set_level(self, level: float, now: float) -> None:
        """Hold ``level`` (at most the capacity; a debt as it is) from ``now`` on: a bucket mirroring a shared one."""
        self._advance(now)
        self._level = min(self.capacity, level)

    def give(self, amount: float, now: float) -> None:
        """Refund (``amount`` > 0, capped at capacity) or charge extra (< 0, may leave a debt)."""
        self._advance(now)
        self._level = min(self.capacity, self._level + amount)


class Reservation:
    """What one admitted request holds: settle it exactly once (:meth:`RateLimiter.settle` / ``release``)."""

    __slots__ = ("tenant", "tokens", "done")

    def __init__(self, tenant: str, tokens: int) -> None:
        self.tenant = tenant
        self.tokens = tokens
        self.done = False

    def __repr__(self) -> str:
        return f"Reservation(tenant={self.tenant!r}, tokens={self.tokens}, done={self.done})"


@dataclass(frozen=True, slots=True)
class Throttle:
    """Over a rate limit now: answer 429 with ``Retry-After: retry_after``."""

    reason: str
    retry_after: float  # seconds until the bucket(s) hold enough, if nobody else takes meanwhile
    limit: str  # "requests_per_minute" | "tokens_per_minute"
    status: ClassVar[int] = 429
    code: ClassVar[str] = "rate_limit_exceeded"


@dataclass(frozen=True, slots=True)
class TooLarge:
    """The request alone needs more tokens than the tenant's bucket can ever hold: 429, retrying cannot help."""

    reason: str
    tokens: int
    capacity: float
    retry_after: ClassVar[None] = None
    status: ClassVar[int] = 429
    code: ClassVar[str] = "request_too_large"


class _Buckets:
    __slots__ = ("rpm", "tpm", "requests", "tokens")

    def __init__(self, rpm: float | None, tpm: float | None, burst_s: float, now: float) -> None:
        self.rpm, self.tpm = rpm, tpm
        # capacity = L x burst / 60, multiplied first: (L / 60) x 60 is not always L in floating point (999 ->
        # 998.9999999999999), which refused a request of exactly a minute's worth of tokens as too large
        # ... and it holds at least one request (below 60 a minute with a 1 s burst, or 0.5 a minute, it held less
        # and never admitted one)
        self.requests = None if rpm is None else TokenBucket(rpm / 60.0, max(1.0, rpm * burst_s / 60.0), now)
        self.tokens = None if tpm is None else TokenBucket(tpm / 60.0, tpm * burst_s / 60.0, now)


class RateLimiter:
    """Token buckets per tenant, created on first use (full) and rebuilt if the tenant's limits change."""

    def __init__(self, settings: AdmissionSettings = AdmissionSettings()) -> None:
        if not (math.isfinite(settings.rate_burst_s) and settings.rate_burst_s > 0):
            raise ValueError(f"rate_burst_s must be > 0, got {settings.rate_burst_s!r}")
        self._burst_s = settings.rate_burst_s
        self._by_tenant: dict[str, _Buckets] = {}
        #: net [requests, tokens] each tenant took since :meth:`take_deltas` (None: not shared, nothing kept)
        self._delta: dict[str, list[float]] | None = None

    def _buckets(self, tenant: TenantConfig, now: float) -> _Buckets:
        b = self._by_tenant.get(tenant.name)
        if b is None or b.rpm != tenant.requests_per_minute or b.tpm != tenant.tokens_per_minute:
            b = self._by_tenant[tenant.name] = _Buckets(tenant.requests_per_minute, tenant.tokens_per_minute, self._burst_s, now)
        return b

    def reserve(self, tenant: TenantConfig, tokens: int, now: float) -> Reservation | Throttle | TooLarge:
        """Take one request and ``tokens`` tokens from the tenant's buckets, all or nothing."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"tokens to reserve must be an int >= 0, got {tokens!r}")
        b = self._buckets(tenant, now)
        if b.tokens is not None and tokens > b.tokens.capacity:
            return TooLarge(
                f"request needs {tokens} tokens (prompt + max output) but tenant {tenant.name!r} may use at most "
                f"{b.tokens.capacity:g} tokens per {self._burst_s:g} s; lower max_tokens or shorten the prompt",
                tokens, b.tokens.capacity,
            )
        w_req = 0.0 if b.requests is None else b.requests.wait(1.0, now)
        w_tok = 0.0 if b.tokens is None else b.tokens.wait(tokens, now)
        if w_req > 0.0 or w_tok > 0.0:
            limit = "requests_per_minute" if w_req >= w_tok else "tokens_per_minute"
            value = tenant.requests_per_minute if limit == "requests_per_minute" else tenant.tokens_per_minute
            return Throttle(f"tenant {tenant.name!r} is over its limit of {value:g} {limit.replace('_', ' ')}", max(w_req, w_tok), limit)
        if b.requests is not None:
            b.requests.take(1.0, now)
        if b.tokens is not None:
            b.tokens.take(tokens, now)
        if self._delta is not None:
            self._moved(tenant.name, 1.0, float(tokens))
        return Reservation(tenant.name, tokens)

    def _moved(self, tenant: str, requests: float, tokens: float) -> None:
        d = self._delta.get(tenant)  # type: ignore[union-attr]
        if d is None:
            self._delta[tenant] = [requests, tokens]  # type: ignore[index]
        else:
            d[0] += requests
            d[1] += tokens

    def settle(self, res: Reservation, used_tokens: int, now: float) -> None:
        """The request ended having used ``used_tokens``: refund the rest or charge the excess."""
        if isinstance(used_tokens, bool) or not isinstance(used_tokens, int) or used_tokens < 0:
            raise ValueError(f"used tokens must be an int >= 0, got {used_tokens!r}")
        b = self._finish(res)
        if b is not None and b.tokens is not None:
            b.tokens.give(res.tokens - used_tokens, now)
        if self._delta is not None:
            self._moved(res.tenant, 0.0, float(used_tokens - res.tokens))

    def release(self, res: Reservation, now: float) -> None:
        """The request never ran (shed, expired, cancelled while queued): give back the request and its tokens."""
        b = self._finish(res)
        if b is not None:
            if b.requests is not None:
                b.requests.give(1.0, now)
            if b.tokens is not None:
                b.tokens.give(res.tokens, now)
        if self._delta is not None:
            self._moved(res.tenant, -1.0, -float(res.tokens))

    def _finish(self, res: Reservation) -> _Buckets | None:
        if res.done:
            raise ValueError(f"{res!r} was already settled or released")
        res.done = True
        return self._by_tenant.get(res.tenant)

    def levels(self, tenant: str, now: float) -> tuple[float | None, float | None]:
        """Current (requests, tokens) bucket levels of a tenant; ``None`` where unlimited or not seen yet."""
        b = self._by_tenant.get(tenant)
        if b is None:
            return None, None
        return (None if b.requests is None else b.requests.level(now), None if b.tokens is None else b.tokens.level(now))

    # -- shared among gateways (steersman.state.shared_limits does the IO) -------------------------------------

    def share(self) -> None:
        """Keep what each tenant takes (:meth:`take_deltas`) for a sync with the other gateways."""
        if self._delta is None:
            self._delta = {}

    def unsynced(self, tenant: str) -> bool:
        """Whether the tenant took or gave back here since the last :meth:`take_deltas` (shared limits only)."""
        return bool(self._delta) and tenant in self._delta

    def take_deltas(self) -> dict[str, list[float]]:
        """Net [requests, tokens] each tenant took here since the last call (refunds and releases subtracted)."""
        out, self._delta = self._delta or {}, {}
        return out

    def buckets_of(self, tenant: TenantConfig, now: float) -> tuple[TokenBucket | None, TokenBucket | None]:
        """The tenant's (requests, tokens) buckets, made if need be (None where unlimited)."""
        b = self._buckets(tenant, now)
        return b.requests, b.tokens

    def apply_shared(self, tenant: TenantConfig, requests: float | None, tokens: float | None, now: float) -> None:
        """Every gateway's buckets for ``tenant`` hold ``requests`` / ``tokens`` (the shared levels after the deltas
        this gateway handed over): its own buckets take them, less what it took since it handed those over."""
        b = self._buckets(tenant, now)
        d = (self._delta or {}).get(tenant.name, (0.0, 0.0))
        for bucket, level, since in ((b.requests, requests, d[0]), (b.tokens, tokens, d[1])):
            if bucket is not None and level is not None:
                bucket.set_level(level - since, now)
