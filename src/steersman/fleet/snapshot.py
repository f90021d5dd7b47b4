"""A frozen, vectorised view of the fleet at one instant (struct of arrays).

Policies are pure functions of a snapshot and a request; they never see the
mutable :class:`~steersman.fleet.state.Fleet` or do IO.  The live numeric state
is one matrix (a row per field, a column per replica) copied once per snapshot;
constants live in :class:`~steersman.fleet.statics.FleetStatics`.  Every array is
read-only.  The approximate prefix index is shared by reference (read-only for
policies; it changes only between decisions, at the IO edge).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from steersman.fleet.statics import FleetStatics

if TYPE_CHECKING:
    from steersman.fleet.prefix_index import PrefixIndex

__all__ = ["FleetSnapshot", "WEIGHTS_CODES", "LIVE_FIELDS"]

#: Weights state codes used in :attr:`FleetSnapshot.weights`.
WEIGHTS_CODES: Mapping[str, int] = {"cold": 0, "loading": 1, "warm": 2}

#: Rows of the live matrix.  Engine-reported: running .. kv_blocks_total; gateway
#: accounting of its own traffic: in_flight, pending_prefill (uncached prompt
#: tokens routed but not yet answered), decoding, active_blocks (KV blocks its
#: in-flight requests hold), recent_tokens (decaying work routed, Preble's window)
#: and the observed latencies ttft_ewma / tpot_ewma; ttft_ratio / tpot_ratio are
#: observed / predicted (the model's correction per replica: a degraded GPU shows >1);
#: since_scrape is the net change of our requests there since the engine's metrics were last read
#: (routed minus finished: negative when more left than came, which frees slots);
#: prefix_accuracy is the engine-reported cache hit / the index's prediction (EWMA);
#: stalled_since is when the replica last made progress on the requests of ours still
#: awaiting a first token there (their oldest dispatch, or its latest first token / stream served
#: to its end if later), NaN when none awaits: ``time - stalled_since`` is the hang signal (the
#: policies' and the reliability guard's sweep);
#: resident_tpot is the tightest TPOT target (x the margin its decision used) among our requests
#: in flight there, 0 when none has one: a newcomer must not slow the shared steps past it.
#: prefill_s_token / decode_s_token are the engine's own timing of its work where it reports it
#: (llama.cpp: seconds per computed prompt token, per generated token; EWMA over scrapes), NaN else:
#: the linear model of replicas without a GPU profile uses them instead of its priors.
#: fail_share is the share of the replica's recent attempts that failed on the server side (5xx, a broken
#: connection or stream) over the circuit breaker's window, 0 until the window holds its minimum volume
#: (``ReliabilitySettings.failure_routing``): the picker weighs each replica as 1 / (1 - fail_share) attempts.
#: pending_pairs is the attention work of pending_prefill: token pairs (query, key) its uncached prompts still
#: have to compute, (L^2 - h^2) / 2 for a prompt of L tokens whose first h are cached (a chunk of a long prompt
#: attends to everything before it, so 40,000 queued tokens of one long prompt take far longer than 40,000 of
#: short ones).
#: The ratios are NaN until a replica is observed; predictors use the fleet prior then.
LIVE_FIELDS = (
    "in_flight", "running", "waiting", "kv_usage", "prefix_queries", "prefix_hits", "weights", "scraped_at",
    "kv_blocks_total", "pending_prefill", "decoding", "active_blocks", "recent_tokens", "ttft_ewma", "tpot_ewma",
    "ttft_ratio", "tpot_ratio", "since_scrape", "prefix_accuracy", "stalled_since", "resident_tpot",
    "prefill_s_token", "decode_s_token", "fail_share", "pending_pairs", "awaiting",
)
(IN_FLIGHT, RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES, PREFIX_HITS, WEIGHTS, SCRAPED_AT,
 KV_BLOCKS_TOTAL, PENDING_PREFILL, DECODING, ACTIVE_BLOCKS, RECENT_TOKENS, TTFT_EWMA, TPOT_EWMA,
 TTFT_RATIO, TPOT_RATIO, SINCE_SCRAPE, PREFIX_ACCURACY, STALLED_SINCE, RESIDENT_TPOT,
 PREFILL_S_TOKEN, DECODE_S_TOKEN, FAIL_SHARE, PENDING_PAIRS, AWAITING) = range(len(LIVE_FIELDS))


@dataclass(frozen=True, slots=True, weakref_slot=True)  # the fleet tracks its latest snapshot (copy on write)
class FleetSnapshot:
    time: float
    names: tuple[str, ...]
    gpus: tuple[str | None, ...]
    pools: tuple[str, ...]
    model_masks: Mapping[str, np.ndarray]
    healthy: np.ndarray  # bool per replica
    routable: np.ndarray  # healthy and weights warm
    live: np.ndarray  # LIVE_FIELDS x replicas
    statics: FleetStatics
    prefix: PrefixIndex | None = None
    ttft_prior: float = 1.0  # observed/predicted ratio for replicas without observations (fleet-wide EWMA)
    tpot_prior: float = 1.0
    recent_at: np.ndarray | None = None  # when each replica's recent_tokens was last decayed
    recent_tau_s: float = 60.0
    blocked_until: np.ndarray | None = None  # out of rotation until then: ejected / breaker open (steersman.reliability)
    limits: np.ndarray | None = None  # adaptive concurrency limit per replica (None: unlimited)

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def price_per_hour(self) -> np.ndarray:
        return self.statics.price_per_hour

    def row(self, field: int) -> np.ndarray:
        return self.live[field]

    in_flight = property(lambda s: s.live[IN_FLIGHT])
    running = property(lambda s: s.live[RUNNING])
    waiting = property(lambda s: s.live[WAITING])
    kv_usage = property(lambda s: s.live[KV_USAGE])
    prefix_queries = property(lambda s: s.live[PREFIX_QUERIES])
    prefix_hits = property(lambda s: s.live[PREFIX_HITS])
    weights = property(lambda s: s.live[WEIGHTS])
    kv_blocks_total = property(lambda s: s.live[KV_BLOCKS_TOTAL])
    pending_prefill = property(lambda s: s.live[PENDING_PREFILL])
    decoding = property(lambda s: s.live[DECODING])
    active_blocks = property(lambda s: s.live[ACTIVE_BLOCKS])
    @property
    def recent_tokens(self) -> np.ndarray:
        """Work routed recently, decayed to the snapshot's time (computed on demand: few policies use it)."""
        row = self.live[RECENT_TOKENS]
        if self.recent_at is None:
            return row
        return row * np.exp(-(self.time - self.recent_at) / self.recent_tau_s)

    ttft_ewma = property(lambda s: s.live[TTFT_EWMA])
    tpot_ewma = property(lambda s: s.live[TPOT_EWMA])
    ttft_ratio = property(lambda s: s.live[TTFT_RATIO])
    tpot_ratio = property(lambda s: s.live[TPOT_RATIO])
    since_scrape = property(lambda s: s.live[SINCE_SCRAPE])
    prefix_accuracy = property(lambda s: s.live[PREFIX_ACCURACY])

    @property
    def stall(self) -> np.ndarray:
        """Seconds each replica has held requests of ours awaiting a first token without progress (0: none)."""
        return np.nan_to_num(np.maximum(self.time - self.live[STALLED_SINCE], 0.0))

    @property
    def metrics_age(self) -> np.ndarray:
        return self.time - self.live[SCRAPED_AT]

    def serves(self, model: str) -> np.ndarray:
        """Boolean mask of replicas configured for ``model`` (healthy or not)."""
        mask = self.model_masks.get(model)
        if mask is None:
            return np.zeros(self.size, dtype=bool)
        return mask

    def candidates(self, model: str) -> np.ndarray:
        """Indices of healthy replicas with warm weights serving ``model``."""
        mask = self.model_masks.get(model)
        if mask is None:
            return np.empty(0, dtype=np.intp)
        return np.flatnonzero(mask & self.routable)
