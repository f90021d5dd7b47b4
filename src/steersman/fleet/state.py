"""The live, mutable state of the fleet, owned by the gateway's IO edge.

Writers: the request path (what this gateway routed: in flight, pending prefill, decoding, KV blocks held,
observed latencies), the metrics scraper and health checks.  Readers: policies, through :meth:`Fleet.snapshot` only.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Sequence
from types import MappingProxyType

import numpy as np

from steersman.clock import Clock
from steersman.config import DEFAULTS, SchedulerSettings
from steersman.fleet import snapshot as S
from steersman.fleet._awaited import Awaited
from steersman.fleet._learning import FleetLearning
from steersman.fleet.records import Replica, Ticket, attention_pairs
from steersman.fleet.slots import SlotMirror
from steersman.fleet.snapshot import WEIGHTS_CODES, FleetSnapshot
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.text.lora import lora_key

__all__ = ["Replica", "Fleet", "Ticket"]

_WARM = WEIGHTS_CODES["warm"]


def _or_one(x: float) -> float:
    return 1.0 if math.isnan(x) else x


def _frozen(a: np.ndarray) -> np.ndarray:
    """``a``, read-only (``_frozen(a.view())``: a read-only view of it, no copy)."""
    a.flags.writeable = False
    return a


class Fleet(Awaited, FleetLearning):
    def __init__(self, replicas: Sequence[Replica], clock: Clock, settings: SchedulerSettings = DEFAULTS.scheduler) -> None:
        self.replicas = list(replicas)
        self.clock = clock
        self.settings = settings
        n = len(self.replicas)
        self.live = np.zeros((len(S.LIVE_FIELDS), n))
        self.live[S.WEIGHTS] = _WARM
        self.live[S.SCRAPED_AT] = -np.inf
        for row in (S.KV_BLOCKS_TOTAL, S.TTFT_EWMA, S.TPOT_EWMA, S.STALLED_SINCE, S.PREFILL_S_TOKEN, S.DECODE_S_TOKEN):
            self.live[row] = np.nan
        self.live[S.TTFT_RATIO] = self.live[S.TPOT_RATIO] = np.nan  # unobserved: the fleet-wide prior applies
        self.live[S.PREFIX_ACCURACY] = 1.0
        # the engines' last cumulative (prefill s, tokens, decode s, tokens) and work counter (EngineMetrics.progress)
        self._work = np.full((5, n), np.nan)
        self.ratio_prior = {S.TTFT_RATIO: math.nan, S.TPOT_RATIO: math.nan}  # NaN until the first observation
        self._ewma_at = np.full(self.live.shape, -np.inf)  # when each learnt average last took an observation
        self._prior_at = {S.TTFT_RATIO: -math.inf, S.TPOT_RATIO: -math.inf}
        self.healthy = np.ones(n, dtype=bool)
        self.routable = np.ones(n, dtype=bool)
        #: taken out of rotation by an operator (``POST /admin/replicas/{name}/drain``, a twin drill's ``drain``): no
        #: new request goes there, the ones under way finish; until resumed
        self.draining = np.zeros(n, dtype=bool)
        self._recent_at = np.zeros(n)
        # read-only views lent to every snapshot (made once: the arrays above are changed in place only)
        self._views = tuple(_frozen(a.view()) for a in (self.healthy, self.routable, self.live, self._recent_at))
        #: per replica, when a stream of ours there last got an event (a token) from its engine (-inf: never);
        #: the reliability guard's stall rule reads it (see last_output)
        self.output_at = np.full(n, -np.inf)
        self._awaiting: list[dict[int, float]] = [{} for _ in range(n)]  # ticket key -> dispatch time, in order
        self._expected: list[dict[int, float]] = [{} for _ in range(n)]  # awaiting ticket key -> predicted TTFT
        # whole (non-streamed) responses in flight, which show no first token: ticket key -> [dispatch time, predicted
        # end-to-end seconds (0: none)]; their replica's stall counts from the oldest's dispatch (or the last answer)
        self._whole: list[dict[int, list[float]]] = [{} for _ in range(n)]
        self._whole_since = np.full(n, np.nan)
        self._residents: list[dict[float, int]] = [{} for _ in range(n)]  # TPOT target -> our requests there
        self._prefix = None  # a steersman.fleet.prefix_index.PrefixIndex, attached by the gateway / twin
        self._residency = settings.prefix_residency
        self._guard = None  # a steersman.reliability.ReplicaGuard (ejection, breakers, limits), attached likewise
        self._lent = None  # weakref to the latest snapshot, which reads the arrays below without a copy
        self.on_first_token: Callable[[], None] | None = None  # a prefill done (the gateway wakes its queue)
        self._keys = itertools.count(1)  # ticket keys: deterministic (not id(), which depends on allocation)
        # per replica: the $ of its busy time so far, each moment's price split among our requests in flight then
        # (see _accrue), and when it was last advanced
        self._spent = [0.0] * n
        self._spent_at = [0.0] * n
        self._static()
        #: replicas whose engine reuses a prompt only from a free slot (llama.cpp): the gateway mirrors their slots
        ll = DEFAULTS.llamacpp
        self.slots = {i: SlotMirror(ll.parallel, DEFAULTS.engine.block_size, ll.slot_prompt_similarity)
                      for i, c in enumerate(self.caches_after_prefill) if c}

    guard = property(lambda self: self._guard)

    @guard.setter
    def guard(self, guard) -> None:
        """Attach the reliability guard; its stall rule reads what this fleet predicted (expected_first_token)
        and when each replica last made progress (last_output: a stream's event, or its engine's work counter)."""
        self._guard = guard
        if guard is not None:
            guard.outliers.stall_allowance = self.expected_first_token
            guard.outliers.whole_since = self.whole_since
            guard.outliers.last_output = self.last_output

    def streamed(self, index: int, now: float) -> None:
        """A stream of ours on replica ``index`` got an event (a token) from its engine at ``now``: the replica is
        making progress, however long the requests queued behind its running ones wait for a first token."""
        self.output_at[index] = now

    def last_output(self, now: float) -> np.ndarray:
        """Per replica, when a stream of ours there last got an event, or a scrape found its engine's work counter
        advanced (read-only use; ``now``: unused here, a twin computes it from its simulated engines)."""
        return self.output_at

    prefix = property(lambda self: self._prefix)

    @prefix.setter
    def prefix(self, index) -> None:
        """Attach the prefix index; replicas with a slot mirror answer its matches from the mirror."""
        self._prefix = index
        if index is not None:
            for i, mirror in self.slots.items():
                index.mirror_slots(i, mirror)
            self.prefix_residency = self.settings.prefix_residency

    @property
    def prefix_residency(self) -> bool:
        """The prefix index credits each replica only with what its KV cache still holds (``Profile.prefix_residency``
        False: a router whose own tree knows nothing of the engines' evictions)."""
        return self._residency

    @prefix_residency.setter
    def prefix_residency(self, on: bool) -> None:
        self._residency = on
        if self._prefix is not None:
            self._prefix.set_capacities(self.statics.kv_blocks, self.live[S.KV_BLOCKS_TOTAL], on)

    def _static(self) -> None:
        reps = self.replicas
        self._names = tuple(r.name for r in reps)
        self._gpus = tuple(r.gpu for r in reps)
        self._pools = tuple(r.pool for r in reps)
        #: replicas whose engine can reuse a prompt only once its request ended (the index learns it then)
        self.caches_after_prefill = tuple(r.adapter is not None and not r.adapter.shares_prefill_in_flight
                                          for r in reps)
        self.statics = build_statics([ReplicaSpec(r.gpu, r.model_profile or (r.models[0] if r.models else None), r.tp,
                                                  r.price_per_hour,
                                                  r.handoff_s_per_token, r.engine, r.pool) for r in reps])
        self._price_s = [p / 3600.0 for p in self.statics.price_per_hour.tolist()]  # $ a second, per replica
        masks: dict[str, np.ndarray] = {}
        for r in reps:
            for m in r.models:
                masks.setdefault(m, np.zeros(len(reps), dtype=bool))[r.index] = True
        self._masks = MappingProxyType({m: _frozen(a) for m, a in masks.items()})
        #: model name -> what its prompts' block hashes are keyed with (steersman.text.lora.lora_key): the LoRA
        #: adapters some replica serves; a base model is absent (its hashes are the prompt's own).  Fleet-wide: a
        #: name is an adapter everywhere (the fleet file refuses one that is a base model elsewhere; discovery warns)
        self.lora_keys = MappingProxyType({m: lora_key(m) for r in reps for m in r.loras})

    def set_models(self, index: int, models: Sequence[str], loras: Sequence[str] = ()) -> None:
        """Models discovered from an engine's ``/v1/models`` (``loras``: those of them that are LoRA adapters): the
        statics (its modelled KV capacity among them) and the prefix index's capacities follow (a replica listed
        late stayed "unlimited" there, residency off)."""
        self.replicas[index].models = tuple(models)
        self.replicas[index].loras = tuple(m for m in loras if m in models)
        self._static()
        if self._prefix is not None:
            self._prefix.set_capacities(self.statics.kv_blocks, self.live[S.KV_BLOCKS_TOTAL], self._residency)

    def models(self) -> list[str]:
        return sorted(self._masks)

    def has_model(self, model: str) -> bool:
        return model in self._masks

    @property
    def in_flight(self) -> np.ndarray:
        return self.live[S.IN_FLIGHT]

    # ---- request path -----------------------------------------------------
    def begin(self, index: int, uncached: int = 0, blocks: int = 0,
              predicted_ttft: float | None = None, predicted_tpot: float | None = None,
              streamed: bool = True, tpot_target: float = 0.0, prompt_tokens: int = 0) -> Ticket:
        """A request routed to replica ``index``: ``uncached`` of its ``prompt_tokens`` (0: as many as
        ``uncached``) to prefill there.  A non-streamed one shows no first token (its response
        comes whole): it adds no TTFT observation and does not count as awaiting one (no stall signal).
        ``tpot_target`` > 0: the TPOT it must keep there (the snapshot's ``resident_tpot``)."""
        self._own()
        now = self.clock.now()
        live = self.live
        live[S.SINCE_SCRAPE, index] += 1
        live[S.PENDING_PREFILL, index] += uncached
        pairs = attention_pairs(max(prompt_tokens, uncached), uncached)
        live[S.PENDING_PAIRS, index] += pairs
        live[S.ACTIVE_BLOCKS, index] += blocks
        decay = math.exp(-(now - self._recent_at[index]) / self.settings.recent_load_tau_s)
        live[S.RECENT_TOKENS, index] = live[S.RECENT_TOKENS, index] * decay + uncached
        self._recent_at[index] = now
        t = Ticket(index, uncached, blocks, now, self._accrue(index, now), predicted_ttft, predicted_tpot,
                   key=next(self._keys), streamed=streamed, tpot_target=tpot_target, pairs=pairs)
        live[S.IN_FLIGHT, index] += 1
        if tpot_target > 0.0:
            res = self._residents[index]
            res[tpot_target] = res.get(tpot_target, 0) + 1
            if not 0.0 < live[S.RESIDENT_TPOT, index] <= tpot_target:
                live[S.RESIDENT_TPOT, index] = tpot_target
        if streamed:  # it awaits a first token (a whole response shows none: its prefill's end is not seen)
            waiting = self._awaiting[index]
            if not waiting:
                live[S.STALLED_SINCE, index] = now
            waiting[t.key] = now
            live[S.AWAITING, index] = len(waiting)
        else:  # it awaits its answer: the stall rule's too (not the saturation's: it may be decoding already)
            whole = self._whole[index]
            if not whole:
                self._whole_since[index] = now
            whole[t.key] = [now, 0.0]
        if self.guard is not None:
            self.guard.dispatched(index, t.key, now)
        return t

    def first_token(self, t: Ticket, now: float | None = None) -> None:
        """``t``'s first token came (``now``: when; the clock's now by default)."""
        self._own()
        if t.first_at is not None:
            return
        if now is None:
            now = self.clock.now()
        t.first_at = now
        if t.on_first is not None:
            t.on_first, hook = None, t.on_first
            hook()
        live = self.live
        live[S.PENDING_PREFILL, t.replica] -= t.uncached
        live[S.PENDING_PAIRS, t.replica] -= t.pairs
        live[S.DECODING, t.replica] += 1
        self._progress(t, now)
        if t.replica in self.slots:
            self.slots[t.replica].first_token(t.key, now)
        if self.on_first_token is not None:
            self.on_first_token()
        if not t.streamed:
            self._answered(t, now)
            return  # the whole response, not a first token: no TTFT to learn from
        ttft = now - t.started
        self._ewma(S.TTFT_EWMA, t.replica, ttft, now)
        if self.guard is not None:
            self.guard.first_token(t.replica, ttft)
        if t.predicted_ttft:
            self._ratio(S.TTFT_RATIO, t.replica, ttft / t.predicted_ttft, now)

    def _accrue(self, i: int, now: float) -> float:
        """Replica ``i``'s cost integral advanced to ``now`` (at every begin and end, so the requests in flight were
        the same since the last advance): the $ of its busy time so far, each moment's divided among our requests
        in flight then.  A request's cost is the integral's rise over its stay; the costs of the requests that
        shared the replica add up to the replica's own cost over that time, however many joined or left when."""
        spent = self._spent[i]
        busy = self.live.item(S.IN_FLIGHT, i)
        if busy > 0.0:
            spent += self._price_s[i] * (now - self._spent_at[i]) / busy
            self._spent[i] = spent
        self._spent_at[i] = now
        return spent

    def end(self, t: Ticket, output_tokens: int = 0, streamed: bool = True) -> float:
        """``t`` ended, ``output_tokens`` made there; ``streamed`` False: a whole response (no TPOT to learn).
        Returns the $ of its time there: its share of the replica's cost while it was in flight (:meth:`_accrue`)."""
        self._own()
        live, i, now = self.live, t.replica, self.clock.now()
        cost = self._accrue(i, now) - t.cost_mark
        if t.cache_at_end is not None:
            if t.first_at is not None and self.prefix is not None:  # its prompt ran: the freed slot holds it
                self.prefix.record(i, t.cache_at_end)
            t.cache_at_end = None
        mirror = self.slots.get(i)
        if mirror is not None:
            mirror.release(t.key, t.first_at is not None, now)
        live[S.IN_FLIGHT, i] -= 1
        live[S.SINCE_SCRAPE, i] -= 1  # a finished request frees a batch slot (or a place in the engine's queue)
        live[S.ACTIVE_BLOCKS, i] -= t.blocks
        if t.tpot_target > 0.0:
            res = self._residents[i]
            left = res[t.tpot_target] - 1
            if left:
                res[t.tpot_target] = left
            else:
                del res[t.tpot_target]
                live[S.RESIDENT_TPOT, i] = min(res, default=0.0)
        tpot = None
        if not t.streamed:
            self._answered(t, None)
        if t.first_at is None:
            live[S.PENDING_PREFILL, i] -= t.uncached
            live[S.PENDING_PAIRS, i] -= t.pairs
            self._progress(t, None)
        else:
            live[S.DECODING, i] -= 1
            if t.verdict and self._awaiting[i]:  # a stream served to its end is progress (one the client left: not)
                live[S.STALLED_SINCE, i] = now
            if output_tokens > 1 and streamed:
                tpot = (now - t.first_at) / (output_tokens - 1)
                self._ewma(S.TPOT_EWMA, i, tpot, now)
                if t.predicted_tpot:
                    self._ratio(S.TPOT_RATIO, i, tpot / t.predicted_tpot, now)
        if self.guard is not None:
            if t.verdict is None:
                self.guard.released(i, t.key, now)
            elif t.verdict:
                self.guard.succeeded(i, t.key, now, now - t.started, output_tokens, live[S.IN_FLIGHT, i] + 1, tpot)
                if live[S.FAIL_SHARE, i] > 0.0:  # a success only lowers it (a zero share rises at a failure or scrape)
                    live[S.FAIL_SHARE, i] = self.guard.failure_share(i, now)
        return cost

    def take_slot(self, t: Ticket, hashes: Sequence[int], due: float = math.inf, decode_s: float = math.nan) -> None:
        """``t``'s prompt reaches a replica with a slot mirror: it takes the slot its engine would give it;
        ``due``: when it is predicted to end, ``decode_s``: predicted seconds from its first token to its end."""
        mirror = self.slots.get(t.replica)
        if mirror is not None:
            mirror.take(t.key, hashes, self.clock.now(), due, decode_s)

    def report(self, t: Ticket, ok: bool) -> None:
        """An attempt's verdict on its replica's health: a failure counts at once, a success when the ticket ends."""
        t.verdict = ok
        if not ok:
            self._own()
            self._progress(t, None)  # a failed attempt awaits nothing more (its ticket may end later, at a reroute)
            if self.guard is not None:
                now = self.clock.now()
                self.guard.failed(t.replica, t.key, now)
                self.live[S.FAIL_SHARE, t.replica] = self.guard.failure_share(t.replica, now)

    def blocked(self, index: int) -> bool:
        """Has the reliability guard taken the replica out of rotation (ejected, breaker open)?"""
        if self.guard is None:
            return False
        now = self.clock.now()
        return bool(self.guard.blocked_until(now, self.live[S.STALLED_SINCE])[index] > now)

    def out_of_rotation(self, index: int) -> bool:
        """Does the replica get no new requests now: unhealthy (a failed connect, failed scrapes), not warm,
        ejected or its breaker open?  A retry away from it re-routes its share (no retry-budget token)."""
        return not self.routable[index] or self.blocked(index)

    def in_rotation(self) -> np.ndarray:
        """Per replica, does it get new requests now (a new array: routable, not ejected, breaker not open)?"""
        out = self.routable.copy()
        if self.guard is not None:
            now = self.clock.now()
            out &= self.guard.blocked_until(now, self.live[S.STALLED_SINCE]) <= now
        return out

    def set_healthy(self, index: int, healthy: bool, active: bool = True) -> None:
        """``active``: an active health check's verdict (the scraper's); False for passive detection (a failed
        connection), which the scraper's next good check restores."""
        self._own()
        self.healthy[index] = healthy
        self._route(index)
        if self.guard is not None:
            self.guard.health(index, healthy, self.clock.now(), active)

    def set_draining(self, index: int, draining: bool) -> None:
        """An operator takes replica ``index`` out of rotation (``draining``: before an engine's upgrade or a node's
        maintenance; its requests under way finish, none is sent there, retries and continued streams included) or
        puts it back."""
        self._own()
        self.draining[index] = draining
        self._route(index)

    def _route(self, index: int) -> None:
        self.routable[index] = (self.healthy[index] and not self.draining[index]
                                and self.live[S.WEIGHTS, index] == _WARM)

    def _own(self) -> None:
        """Before a write: a snapshot still alive that reads the fleet's arrays gets its own frozen copies
        (copy on write; a snapshot dropped before the write, as every decision's is, costs no copy)."""
        ref = self._lent
        if ref is None:
            return
        self._lent = None
        snap = ref()
        if snap is not None:
            for name, a in (("live", self.live), ("healthy", self.healthy), ("routable", self.routable),
                            ("recent_at", self._recent_at)):
                object.__setattr__(snap, name, _frozen(a.copy()))

    def snapshot(self) -> FleetSnapshot:
        """A frozen view of the fleet now: its arrays are the fleet's, read-only, until the fleet's next
        write (then the snapshot, if still referenced, gets copies: see :meth:`_own`)."""
        self._own()  # an older snapshot still alive keeps what it saw
        now = self.clock.now()
        guard = self.guard
        blocked = None if guard is None else _frozen(guard.blocked_until(now, self.live[S.STALLED_SINCE]))
        healthy, routable, live, recent_at = self._views
        snap = FleetSnapshot(
            time=now,
            names=self._names,
            gpus=self._gpus,
            pools=self._pools,
            model_masks=self._masks,
            healthy=healthy,
            routable=routable,
            live=live,
            statics=self.statics,
            prefix=self.prefix,
            ttft_prior=_or_one(self.ratio_prior[S.TTFT_RATIO]),
            tpot_prior=_or_one(self.ratio_prior[S.TPOT_RATIO]),
            recent_at=recent_at,
            recent_tau_s=self.settings.recent_load_tau_s,
            blocked_until=blocked,
            limits=None if guard is None else _frozen(np.floor(guard.limits)),
        )
        self._lent = weakref.ref(snap)
        return snap
