"""Idle probes: which replicas get a canary request, and which canaries failed (pure: time is passed in).

The passive signals cannot see a replica that hangs while nothing of ours runs there: the stall rule
judges requests awaiting a first token, the stream idle timeout streams under way, and a hung GPU's
engine still answers ``/metrics`` (its work counter just stops, as an idle engine's does).  The first
request sent there found out, waiting for the stall rule.  So a replica that has shown no sign of life for
``idle_probe_s`` while nothing of ours is in flight there gets a canary (Envoy's active health checking,
asked only when the passive signals are silent): one output token, answered in milliseconds by a serving
engine.  No answer within ``idle_probe_timeout_s`` and no sign of work meanwhile (a busy engine's work
counter moves: :attr:`steersman.fleet.state.Fleet.output_at`) is a hang: the replica is ejected
(:meth:`steersman.reliability.guard.ReplicaGuard.probe_timed_out`).

Signs of life: a stream's event or a work-counter advance (``output_at``), a probe answered.  Something of ours
in flight there is not one, but no probe is sent meanwhile (the stall rule and the stream idle timeout judge it);
a probe already out is judged all the same.
A replica not routable (unhealthy, weights not warm), out of rotation (ejected, breaker open) or without a
model to ask is not probed; one back from an ejection has been silent all that time and is probed at once.
"""

from __future__ import annotations

import math

import numpy as np

from steersman.config.reliability import ReliabilitySettings

__all__ = ["IdleProbes"]


class IdleProbes:
    def __init__(self, n: int, settings: ReliabilitySettings, now: float) -> None:
        self.interval = settings.idle_probe_s
        self.timeout = settings.idle_probe_timeout_s
        self.alive_at = np.full(n, now)  # the latest sign of life seen (the start: none needed before interval)
        self.busy_at = np.full(n, -math.inf)  # when something of ours was last seen in flight there
        self.sent_at = np.full(n, math.nan)  # the probe in flight since (NaN: none)

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def tick(self, now: float, busy: np.ndarray, output_at: np.ndarray, eligible: np.ndarray) -> tuple[list[int], list[int]]:
        """Returns (replicas to probe now, replicas whose probe timed out).

        ``busy``: something of ours in flight there; ``output_at``: when a stream of ours there last got an event
        or its engine's work counter last advanced; ``eligible``: routable, in rotation and with a model to ask."""
        alive = self.alive_at = np.maximum(self.alive_at, output_at)
        # ours in flight: no new probe (the stall rule judges them), but no sign of life either: a probe already
        # out is still judged (routing the next request to a hung idle replica voided its probe)
        self.busy_at[busy] = now
        sent = self.sent_at
        waiting = np.isfinite(sent)
        # a probe overdue with no sign of life since it was sent (a busy engine's counter moved: it is working)
        late = waiting & (now - sent >= self.timeout) & (alive <= sent)
        sent[waiting & (alive > sent)] = math.nan  # life seen: whatever the probe says now, nothing to judge
        sent[late] = math.nan
        quiet = now - np.maximum(alive, self.busy_at)
        due = (eligible & ~busy & np.isnan(sent) & (quiet >= self.interval) if self.enabled
               else np.zeros_like(eligible))
        due &= ~late
        sent[due] = now
        return np.flatnonzero(due).tolist(), np.flatnonzero(late).tolist()

    def answered(self, i: int, now: float, sent: float) -> bool:
        """Replica ``i`` answered the probe sent at ``sent``; False if that probe was already judged (timed out,
        or life was seen meanwhile and a later probe is the one in flight)."""
        if self.sent_at[i] != sent:
            return False
        self.sent_at[i] = math.nan
        self.alive_at[i] = max(self.alive_at[i], now)
        return True

    def failed(self, i: int, sent: float) -> bool:
        """The probe sent at ``sent`` got an error answer (or none: the connection failed); False if already
        judged.  Not a sign of life; the replica is probed again after another interval."""
        if self.sent_at[i] != sent:
            return False
        self.sent_at[i] = math.nan
        self.alive_at[i] = sent  # (probed again only an interval after this one, not at the next tick)
        return True
