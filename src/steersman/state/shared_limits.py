"""Tenants' rate limits and spend shared through Redis by every gateway that names the same URL and key prefix.

Each gateway keeps admitting from its own token buckets and budget ledger (pure, in memory: admission makes no
IO), and every ``limits_sync_s`` (0.1 s) one Redis script per gateway hands over what each limited tenant took
and spent here since the last sync and gets back the shared state, which the local buckets then mirror
(Kong's Rate Limiting Advanced does so with its ``sync_rate``; APISIX's limit-count with ``sync_interval``):

* **buckets**: each tenant's request and token buckets live in Redis (``{prefix}limits:tenant:{name}``: levels
  and the time of their last refill, on Redis's clock, so the gateways' clocks do not matter), refilled there at
  the tenant's rate and charged with every gateway's net takes (refunds and releases subtracted).  A gateway
  then holds the shared levels, less what it took since handing its deltas over.  Over any window the gateways
  together admit what one bucket would, plus what they admit between two syncs;
* **spend**: each tenant's dollars spent, summed in Redis (kept without expiry: a restarted gateway starts from
  what was spent, not from zero), and what every other gateway's requests in flight hold against the budget
  (one field per gateway, dropped once that gateway has not synced for ``3 x limits_sync_s + 1 s``).

Each sync carries the tenants served here within the last minute (or with requests in flight) and a tenth of the
others in turn (each idle tenant's mirror refreshed every ten syncs; all of them at the first): its cost follows
the active tenants, not the configured ones (~25 us of the event loop and ~25 us of Redis per tenant synced).
An idle tenant's mirror may be up to ten syncs (1 s) old when its first request comes to this gateway.

Handing over is exactly once: each sync is numbered, and the script applies a gateway's sync only if its number
is newer than the last it applied (a sync whose answer was lost, a timeout after Redis ran it, is sent again and
skipped, not counted twice).  Redis unreachable: each gateway goes on with its own buckets and spend (as without
sharing) and logs the outage once (and its end); once Redis answers, the spend of the failed syncs is handed over,
but not their requests and tokens (each gateway already held its tenants to its own buckets meanwhile: handed
over, they put a tenant that stayed within its limits in debt for about as long as the outage lasted).  The
state lives in one Redis server (not a cluster: the script reads and writes keys it derives).  Spend is kept
without expiry; resetting a tenant's spend (a new billing period) is deleting its key's ``usd`` field.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from steersman.control.budget import BudgetLedger
from steersman.control.ratelimit import RateLimiter
from steersman.control.tenants import TenantConfig
from steersman.obs.histogram import CounterFamily

__all__ = ["SharedLimits"]

log = logging.getLogger("steersman.state")

_SLICES = 10  # an idle tenant's mirror is refreshed every this many syncs
_RETRY_MAX_S = 29 * 24 * 3600.0  # a lost sync is sent again within its number's 30 days in Redis, else dropped
_RECENT_S = 60.0  # a tenant served here within this long is synced every time (a bucket's burst: one minute's worth)

# ARGV: prefix, gateway id, gateway liveness (s), tenants, the sync's number; then per tenant: name, request rate
# (/s), request capacity, requests taken, token rate, token capacity, tokens taken, dollars spent, dollars held here.
# A rate of 0: that bucket is unlimited.  A sync numbered no newer than the gateway's last applied one changes no
# level or spend (sent again after its answer was lost; numbers are kept 30 days).  Returns per tenant: request
# level, token level, dollars spent, dollars the other live gateways hold (strings: Lua numbers would come back as
# integers), or 'bad' first for a tenant whose key is not one it wrote (nothing of it changed; the others are).
_SCRIPT = """
local prefix, gw, live_s, n, seq = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local gws = prefix .. 'limits:gateways'
local seqkey = prefix .. 'limits:seq:' .. gw
local fresh = seq > (tonumber(redis.call('GET', seqkey)) or 0)
-- read and check everything first: a script's writes before an error stay, so none is made before all are known
local rows = {}
local i = 6
for k = 1, n do
  local key = prefix .. 'limits:tenant:' .. ARGV[i]
  local kind = redis.call('TYPE', key)['ok']
  local s = {}
  if kind == 'hash' then s = redis.call('HMGET', key, 'rl', 'tl', 't', 'usd') end
  local ok = (kind == 'hash' or kind == 'none')
  for f = 1, 4 do  -- numbers Lua reads and finite (Lua's tonumber takes ' 1' and 'inf', which Redis's would not)
    local v = s[f] and tonumber(s[f])
    if s[f] and (not v or v ~= v or v == math.huge or v == -math.huge) then ok = false end
  end
  rows[k] = {key, ok, s, i}
  i = i + 9
end
redis.call('ZADD', gws, now, gw)
redis.call('ZREMRANGEBYSCORE', gws, '-inf', now - live_s)
redis.call('PEXPIRE', gws, math.floor(live_s * 1000) + 1000)
local out = {}
for k = 1, n do
  local key, ok, s, j = rows[k][1], rows[k][2], rows[k][3], rows[k][4]
  if not ok then
    out[k] = {'bad', fresh and '1' or '0', '', ''}  -- (whether this sync was new: its spend is the gateway's again)
  else
    local dt = math.max(0, now - (tonumber(s[3]) or now))
    local levels = {'', ''}
    for b = 0, 1 do
      local rate, cap, taken = tonumber(ARGV[j + 1 + 3 * b]), tonumber(ARGV[j + 2 + 3 * b]), tonumber(ARGV[j + 3 + 3 * b])
      if not fresh then taken = 0 end
      if rate > 0 then
        local level = tonumber(s[1 + b]) or cap
        level = math.min(cap, math.min(cap, level + dt * rate) - taken)
        redis.call('HSET', key, b == 0 and 'rl' or 'tl', tostring(level))
        levels[b + 1] = tostring(level)
      end
    end
    redis.call('HSET', key, 't', tostring(now))
    local spent = tonumber(s[4]) or 0
    if fresh then  -- added here, not by HINCRBYFLOAT: nothing Redis parses can fail after the first write
      spent = spent + tonumber(ARGV[j + 7])
      redis.call('HSET', key, 'usd', string.format('%.17g', spent))
    end
    redis.call('HSET', key, 'held:' .. gw, ARGV[j + 8])
    local others = 0
    local fields = redis.call('HKEYS', key)
    for f = 1, #fields do
      local name = fields[f]
      if string.sub(name, 1, 5) == 'held:' and name ~= 'held:' .. gw then
        if redis.call('ZSCORE', gws, string.sub(name, 6)) then
          others = others + (tonumber(redis.call('HGET', key, name)) or 0)
        else
          redis.call('HDEL', key, name)
        end
      end
    end
    out[k] = {levels[1], levels[2], string.format('%.17g', spent), tostring(others)}
  end
end
if fresh then redis.call('SET', seqkey, tostring(seq), 'PX', 2592000000) end
return out
"""


class SharedLimits:
    """Syncs a gateway's :class:`RateLimiter` and :class:`BudgetLedger` with Redis (see the module's docstring)."""

    def __init__(self, url: str, prefix: str, sync_s: float, timeout_s: float, limiter: RateLimiter,
                 ledger: BudgetLedger, tenants: Callable[[], Mapping[str, TenantConfig]],
                 now: Callable[[], float]) -> None:
        self.prefix = prefix
        self.sync_s = sync_s
        self.limiter, self.ledger = limiter, ledger
        self.tenants, self.now = tenants, now
        self.client = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.script = self.client.register_script(_SCRIPT)
        self.id = uuid.uuid4().hex[:12]
        self.syncs = self.failures = 0
        #: syncs by outcome (ok, error: Redis failed or did not answer in time, resent: a lost one sent again,
        #: dropped: a lost one too old to send again) and tenants skipped for a key not of ours (bad_record)
        self.counts = CounterFamily("steersman:shared_limits_syncs", "Syncs of tenants' limits and spend with Redis "
                                    "(gateway.limits_url), by outcome.", ["outcome"])
        self.down = False
        self._task: asyncio.Task | None = None
        self._seq = 0  # the last sync's number
        # a sync whose outcome is unknown: (its number, its spend, when it was sent)
        self._retry: tuple[int, dict[str, float], float] | None = None
        self._bad: set[str] = set()  # tenants whose Redis key is not a record of ours (logged once)
        self._turn = 0  # the next slice of idle tenants to refresh
        self._first = True  # the first sync loads every tenant
        self._recent: dict[str, float] = {}  # tenant -> when it last took or spent here
        self._last: dict[str, TenantConfig] = {}  # the limited tenants at the last sync
        #: tenants that left the limited set (a reload removed them or their limits): still synced, every time, until
        #: one sync has carried them with nothing of theirs pending here (spend settled, money held, takes)
        self._leaving: dict[str, TenantConfig] = {}
        limiter.share()
        ledger.share()

    def key(self, tenant: str) -> str:
        return f"{self.prefix}limits:tenant:{tenant}"

    def _limited(self) -> list[TenantConfig]:
        now = {t.name: t for t in self.tenants().values()
               if t.requests_per_minute is not None or t.tokens_per_minute is not None or t.budget_usd is not None}
        for name, t in self._last.items():
            if name not in now:
                self._leaving[name] = t
        for name in [n for n in self._leaving if n in now]:
            del self._leaving[name]
        self._last = now
        return [*now.values(), *self._leaving.values()]

    def _left(self, carried: list[TenantConfig]) -> None:
        """Forget the leaving tenants this (delivered) sync carried that have nothing of theirs left to hand over:
        no money held here (the sync set its held field to 0), no spend or takes since it was taken."""
        for t in carried:
            n = t.name
            if n in self._leaving and self.ledger.held(n) <= 0.0 and not self.ledger.unsynced(n) \
                    and not self.limiter.unsynced(n):
                del self._leaving[n]

    async def start(self) -> None:
        """One sync now (the gateway serves from the shared state from its first request), then every ``sync_s``."""
        await self.sync()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_s)
            try:
                await self.sync()
            except Exception:  # a bug must not end the syncs (cancellation is no Exception)
                log.exception("shared limits sync failed")

    def _synced(self, tenants: list[TenantConfig], deltas: dict, spend: dict, now: float) -> list[TenantConfig]:
        """The tenants this sync carries: every one at the first, else the ones served here within the last
        ``_RECENT_S`` (something handed over, or in flight), and a tenth of the others in turn."""
        recent = self._recent
        for name in (*deltas, *spend):
            recent[name] = now
        for name in [n for n, at in recent.items() if now - at > _RECENT_S and self.ledger.held(n) <= 0.0]:
            del recent[name]
        if self._first:
            return tenants
        leaving = self._leaving
        busy = [t for t in tenants if t.name in recent or t.name in leaving or self.ledger.held(t.name) > 0.0]
        idle = [t for t in tenants if not (t.name in recent or t.name in leaving or self.ledger.held(t.name) > 0.0)]
        if idle:
            k = max(1, -(-len(idle) // _SLICES))
            start = (self._turn * k) % len(idle)
            self._turn += 1
            busy += idle[start:start + k]
        return busy

    def _args(self, seq: int, tenants: list[TenantConfig], deltas: dict, spend: dict, now: float) -> list[object]:
        args: list[object] = [self.prefix, self.id, 3 * self.sync_s + 1.0, len(tenants), seq]
        for t in tenants:
            req, tok = self.limiter.buckets_of(t, now)
            d = deltas.get(t.name, (0.0, 0.0))
            args += [t.name,
                     repr(req.rate) if req else "0", repr(req.capacity) if req else "0", repr(d[0]),
                     repr(tok.rate) if tok else "0", repr(tok.capacity) if tok else "0", repr(d[1]),
                     repr(spend.get(t.name, 0.0)), repr(self.ledger.held(t.name))]
        return args

    async def sync(self) -> bool:
        """Hand this gateway's takes and spend over and mirror the shared state; False on failure (see the module's
        docstring for what a failed sync keeps)."""
        limited = self._limited()
        if not limited:
            return True
        if self._retry is not None:  # a sync whose answer was lost: sent again as it was numbered (skipped if applied)
            seq, lost, at = self._retry
            if self.now() - at > _RETRY_MAX_S:  # its number is forgotten by now: sent again it could count twice
                log.warning("shared limits: a sync of $%.6g spend whose answer was lost %.0f s ago is dropped (its "
                            "outcome can no longer be known)", sum(lost.values()), self.now() - at)
                self.counts.inc("dropped")
                self._retry = None
            else:
                tenants = [t for t in limited if t.name in lost]
                if tenants and not await self._send(seq, tenants, {}, lost, retry=True):
                    self.limiter.take_deltas()  # (still down: the takes since are dropped, the spend kept)
                    return False
                self._retry = None
        # taken only now: a cancel above (close()) leaves them where they were
        deltas, spend = self.limiter.take_deltas(), self.ledger.take_spend()
        self._seq += 1
        carried = self._synced(limited, deltas, spend, self.now())
        ok = await self._send(self._seq, carried, deltas, spend)
        if ok and self._leaving:
            self._left(carried)
        return ok

    async def _send(self, seq: int, tenants: list[TenantConfig], deltas: dict, spend: dict,
                    retry: bool = False) -> bool:
        now = self.now()
        try:
            got = await self.script(args=self._args(seq, tenants, deltas, spend, now))
        except (RedisError, OSError, asyncio.CancelledError) as e:
            # its outcome is unknown: its spend goes again under its number; its takes are dropped (each gateway
            # held its tenants to its own buckets meanwhile)
            if not retry:
                self._retry = (seq, spend, now) if spend else None
            if isinstance(e, asyncio.CancelledError):
                raise
            self.failures += 1
            self.counts.inc("error")
            if not self.down:
                self.down = True
                log.warning("shared limits (Redis) unreachable (%s): each gateway enforces its own tenants' limits "
                            "and spend until it answers again", e)
            return False
        if self.down:
            self.down = False
            log.warning("shared limits (Redis) answer again: tenants' limits and spend are shared")
        now = self.now()
        for t, (rl, tl, spent, others) in zip(tenants, got):
            if _text(rl) == "bad":  # its key is not one this wrote: nothing of it changed in Redis
                self.counts.inc("bad_record")
                if t.name not in self._bad:
                    self._bad.add(t.name)
                    log.warning("shared limits: Redis key %s is not a tenant record (another program's?): tenant "
                                "%r is not shared until it is deleted or repaired", self.key(t.name), t.name)
                if t.name in spend and _text(tl) == "1":  # (a resend of a sync applied before: spent then)
                    self.ledger.restore_spend({t.name: spend[t.name]})  # (its takes are dropped, as in an outage)
                continue
            self._bad.discard(t.name)
            if not retry:
                self.limiter.apply_shared(t, _num(rl), _num(tl), now)
            self.ledger.apply_shared(t.name, float(spent), float(others))
        self.counts.inc("resent" if retry else "ok")
        if not retry:
            self._first = False
            self.syncs += 1
        return True

    async def close(self) -> None:
        """Stop syncing, hand the last deltas over (best effort) and close the connection."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.sync()
        await self.client.aclose()


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _num(v: bytes | str) -> float | None:
    """A level the script returned ('' for an unlimited bucket)."""
    v = _text(v)
    return float(v) if v else None
