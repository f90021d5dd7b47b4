"""Outlier ejection: take replicas that fail or fall far behind their peers out of rotation for a while.

Passive detection, per replica (Envoy's outlier detection, adapted to LLM latency):

* **Consecutive failures** — ``consecutive_failures`` (Envoy ``consecutive_5xx``, 5)
  server-side failures in a row (5xx, connect failure, broken stream) eject it.
* **Latency outliers** — a replica is an outlier when, against the *median of its
  peers* (the other replicas with ``latency_min_samples`` samples):
  its TPOT EWMA is at least ``latency_outlier_ratio`` x theirs, or it has
  *stalled* ``latency_outlier_ratio`` x the peers' TTFT (and x their own
  stalls, so a fleet-wide freeze is not an outlier, and x the TTFT predicted for the
  oldest request awaiting a first token there, so a CPU engine computing a long cold prompt
  is not an outlier next to peers whose prompts were cached).  TTFT itself is not
  compared: it is mostly queueing, which differs between healthy replicas under
  load, and ejecting a busy replica under overload starts the very cascade this
  is meant to stop (the overload drill did exactly that); a degraded GPU shows in
  its TPOT, a hung one in its stall.  A stall is how long a
  replica holding requests awaiting a first token has shown no progress at all: no
  first token, no finished stream, no event (a token) on any stream of ours
  under way there, and no advance of its engine's work counter.  That is how a
  hung GPU shows — it sends nothing — while a merely busy replica keeps streaming
  to (or computing for) its running requests however long its queue: a
  request waiting behind long decodes starts only when one ends and frees its slot
  and KV, far later than the TTFT predicted for it, and a full replica can go
  seconds without a first token.  That is queueing, which the picker's saturation
  and stall floor route around; ejecting it moved its load to its peers, which
  filled up and were ejected in turn.  The detector does not track progress: the
  fleet does — its ``stalled_since`` row (since the oldest awaiting dispatch or
  the latest first token / stream served to its end; the policies read it as
  their queueing signal, see :mod:`steersman.fleet.state`) and, per replica, when
  a stream of ours there last got an event or a scrape last found its engine's work
  counter advanced (requests of ours that stream nothing: ``last_output``, set by the
  fleet: ``Fleet.last_output``, ``EngineMetrics.progress``).  Each sweep is handed that row: stall = now - the later
  of the two, none where the row is NaN (nothing awaits).
  Nothing under the standard SLO targets (``latency_floor_ttft_s`` /
  ``latency_floor_tpot_s``) is ever an outlier.  Envoy has no latency detector; its
  success-rate detector compares hosts with the fleet the same way (mean - 1.9
  stdev, needing 5 hosts) — a ratio to the median works from 2 replicas on.

An ejected replica is out for ``base_ejection_time_s`` x (its ejection count),
at most ``max_ejection_time_s``; the count drops by one for every
``ejection_decay_s`` it spends in rotation.  At most ``max_ejection_percent`` of
the fleet is out at once — but with ``always_eject_one`` at least one replica may
be (Envoy's documented behaviour; with 2-4 replicas 10 % would otherwise be none).
When its time is up the replica returns with fresh latency statistics.

Pure: time is passed in; state is per-replica arrays.
"""

from __future__ import annotations

import math

import numpy as np

from steersman.config.reliability import ReliabilitySettings

__all__ = ["OutlierDetector"]


class OutlierDetector:
    def __init__(self, n: int, settings: ReliabilitySettings, alpha: float) -> None:
        self.s = settings
        self.n = n
        self.alpha = alpha
        self.until = np.full(n, -np.inf)  # ejected until this time (every write counts in ``changes``)
        self.changes = 0  # writes to ``until`` so far: readers cache what they derive from it
        self.count = np.zeros(n, dtype=np.int64)  # ejection multiplier
        self.total = np.zeros(n, dtype=np.int64)  # ejections ever (metrics / tests)
        self._back_at = np.zeros(n)  # when the multiplier last decayed / the replica came back
        self.consecutive = np.zeros(n, dtype=np.int64)
        self.ttft = np.full(n, np.nan)
        self.tpot = np.full(n, np.nan)
        #: replica -> the predicted TTFT of the oldest request awaiting a first token there (0: none
        #: predicted); a stall is judged against it too (set by the fleet: Fleet.expected_first_token)
        self.stall_allowance = None
        #: when an ejection was last refused because max_ejection_percent was reached (-inf: never)
        self.capped_at = -math.inf
        #: optional () -> per replica, since when it has held whole responses without answering one (NaN: none):
        #: a stall as much as requests awaiting a first token (set by the fleet)
        self.whole_since = None
        #: now -> per replica, when a stream of ours there last got an event from its engine (set by the fleet:
        #: Fleet.last_output); None: stalls are judged from ``stalled_since`` alone
        self.last_output = None
        self.samples = np.zeros(n, dtype=np.int64)
        self.reasons: list[str] = [""] * n

    # ---- observations -------------------------------------------------------------
    def success(self, i: int) -> None:
        self.consecutive[i] = 0

    def failure(self, i: int, now: float) -> bool:
        """A server-side failure; True when it ejected the replica."""
        self.consecutive[i] += 1
        if self.consecutive[i] >= self.s.consecutive_failures and not self.is_ejected(i, now):
            return self.eject(i, now, f"{int(self.consecutive[i])} consecutive failures")
        return False

    def latency(self, i: int, ttft: float | None = None, tpot: float | None = None) -> None:
        a = self.alpha
        if ttft is not None:
            old = self.ttft[i]
            self.ttft[i] = ttft if math.isnan(old) else old + a * (ttft - old)
            self.samples[i] += 1
        if tpot is not None:
            old = self.tpot[i]
            self.tpot[i] = tpot if math.isnan(old) else old + a * (tpot - old)

    # ---- ejection -----------------------------------------------------------------------
    def is_ejected(self, i: int, now: float) -> bool:
        return bool(self.until[i] > now)

    def max_ejected(self) -> int:
        cap = int(self.s.max_ejection_percent * self.n / 100.0)
        return max(cap, 1) if self.s.always_eject_one else cap

    def eject(self, i: int, now: float, reason: str) -> bool:
        if int((self.until > now).sum()) >= self.max_ejected():
            self.capped_at = now  # refused for the cap: an ejected replica that serves again should make room
            return False
        self._decay(i, now)
        self.count[i] += 1
        self.total[i] += 1
        self.changes += 1
        self.until[i] = now + min(self.s.base_ejection_time_s * self.count[i], self.s.max_ejection_time_s)
        self.reasons[i] = reason
        self.consecutive[i] = 0
        self.ttft[i] = self.tpot[i] = np.nan  # it comes back with fresh statistics
        self.samples[i] = 0
        return True

    def uneject(self, i: int, now: float) -> None:
        if self.until[i] > now:
            self.changes += 1
            self.until[i] = now
            self._back_at[i] = now

    def _decay(self, i: int, now: float) -> None:
        if self.until[i] > now:
            return
        back = max(self._back_at[i], self.until[i])
        steps = int((now - back) // self.s.ejection_decay_s) if math.isfinite(back) else 0
        if steps > 0:
            self.count[i] = max(0, self.count[i] - steps)
            self._back_at[i] = back + steps * self.s.ejection_decay_s

    def sweep(self, now: float, stalled_since: np.ndarray) -> list[int]:
        """Judge latency outliers; returns the replicas ejected by this sweep.

        ``stalled_since``: per replica, since when it has held requests awaiting a first token without
        progress, NaN when none awaits (the fleet's row, read now and not kept).  A replica streaming to
        its running requests makes progress too: its stall counts from its last event (``last_output``)
        when that is later."""
        s = self.s
        n = self.n
        if n < 2:
            return []
        active = self.until <= now
        judged = active & (self.samples >= s.latency_min_samples)
        since = np.asarray(stalled_since, dtype=float)
        whole = None
        if self.whole_since is not None:
            whole = self.whole_since()
            since = np.fmin(since, whole)  # (NaN where neither waits)
        stalls = np.nan_to_num(np.maximum(now - since, 0.0))
        if self.last_output is not None and (stalls >= s.latency_floor_ttft_s).any():
            # progress can only shorten a stall: asked only when one is past the floor (a twin computes it)
            since = np.maximum(since, self.last_output(now))  # NaN (none awaits) stays NaN
            stalls = np.nan_to_num(np.maximum(now - since, 0.0))
        # only a replica past a floor can be an outlier (each rule below is at least its floor): judging
        # just those gives the same ejections, and a healthy fleet's sweep (10 a second) skips the
        # per-replica medians, which cost ~0.2-0.9 ms a sweep over 4 replicas and grow as n^2
        maybe = active & ((judged & (self.tpot >= s.latency_floor_tpot_s)) | (stalls >= s.latency_floor_ttft_s))
        out = []
        for i in np.flatnonzero(maybe):
            peers = judged.copy()
            peers[i] = False
            if peers.any():
                ref_ttft = float(np.median(self.ttft[peers]))  # judged peers have a TTFT
            elif whole is not None and whole[i] == whole[i]:  # whole responses alone (no TTFT anywhere): judged
                ref_ttft = 0.0  # against the floor, the other replicas' stalls and its own predicted answers
            else:
                continue
            ref_tpot = float(np.nanmedian(self.tpot[peers])) if np.isfinite(self.tpot[peers]).any() else math.nan
            others = active.copy()
            others[i] = False
            ref_stall = float(np.median(stalls[others])) if others.any() else 0.0
            r = s.latency_outlier_ratio
            why = ""
            if judged[i] and self.tpot[i] >= max(r * ref_tpot, s.latency_floor_tpot_s):  # NaN compares False
                why = f"TPOT {self.tpot[i]:.3g}s vs peers' {ref_tpot:.3g}s"
            elif stalls[i] >= max(r * ref_ttft, r * ref_stall, s.latency_floor_ttft_s):
                allow = self.stall_allowance(int(i)) if self.stall_allowance is not None else 0.0
                if stalls[i] >= r * allow:
                    why = f"no first token for {stalls[i]:.3g}s vs peers' TTFT {ref_ttft:.3g}s" + (
                        f" (predicted {allow:.3g}s)" if allow > 0.0 else "")
            if why and self.eject(int(i), now, why):
                out.append(int(i))
        return out
