"""What the fleet learns from what it observes: engine metrics as scraped, and the request path's own timings
(TTFT / TPOT corrections, prefix-hit accuracy, per-token timing).  A mixin of :class:`steersman.fleet.state.Fleet`,
kept apart so each module stays small; its state lives there."""

from __future__ import annotations

import math

import numpy as np

from steersman.engines.base import EngineMetrics
from steersman.fleet import snapshot as S
from steersman.fleet.snapshot import WEIGHTS_CODES

__all__ = ["FleetLearning"]

_WARM = WEIGHTS_CODES["warm"]
_MAX_RATIO = 100.0  # one wild observation must not poison the correction


class FleetLearning:
    """Learning from observations (the state lives in ``Fleet``)."""

    def observe_prefix(self, index: int, predicted_blocks: int, reported_blocks: int) -> None:
        """The engine reported how much of a prompt it had cached; learn how far to trust the index there."""
        self._own()
        if predicted_blocks > 0:
            self._ewma(S.PREFIX_ACCURACY, index, min(reported_blocks / predicted_blocks, 1.0), self.clock.now())
        if self.prefix is not None and self.prefix.events:
            self.prefix.observe_hits(index, predicted_blocks, reported_blocks)

    def _ratio(self, row: int, i: int, value: float, now: float) -> None:
        """Observed / predicted, per replica and fleet-wide (the prior of replicas not yet observed)."""
        value = min(value, _MAX_RATIO)
        self._ewma(row, i, value, now)
        prior = self.ratio_prior[row]
        a = self._weight(self._prior_at[row], now)
        self._prior_at[row] = now
        self.ratio_prior[row] = value if math.isnan(prior) else prior + a * (value - prior)

    def _weight(self, last: float, now: float) -> float:
        """An observation's weight in a learnt average: ``latency_ewma_alpha`` at most, less when the last one
        came less than ~``latency_ewma_tau_s`` / 5 ago (``1 - exp(-dt / tau)``: a time average, so thousands of
        observations a second move it no faster than a few do; ``tau`` 0: the per-observation weight alone)."""
        a = self.settings.latency_ewma_alpha
        tau = self.settings.latency_ewma_tau_s
        return min(a, -math.expm1(-(now - last) / tau)) if tau > 0.0 else a

    def _ewma(self, row: int, i: int, value: float, now: float) -> None:
        old = self.live[row, i]
        self.live[row, i] = value if math.isnan(old) else old + self._weight(self._ewma_at[row, i], now) * (value - old)
        self._ewma_at[row, i] = now

    # ---- scraper / health -------------------------------------------------
    def update_metrics(self, index: int, m: EngineMetrics) -> None:
        self._own()
        col = self.live[:, index]
        if m.prefix_queries < col[S.PREFIX_QUERIES] and self.prefix is not None:
            # a cumulative counter went back: the engine restarted (crash, OOM, rolling update) and its
            # KV cache went with it; the index stops crediting it with what it held before
            self.prefix.forget_replica(index)
        col[S.RUNNING] = m.num_running
        col[S.WAITING] = m.num_waiting
        col[S.KV_USAGE] = m.kv_usage
        col[S.PREFIX_QUERIES] = m.prefix_queries
        col[S.PREFIX_HITS] = m.prefix_hits
        if m.kv_blocks_total is not None:
            col[S.KV_BLOCKS_TOTAL] = m.kv_blocks_total
            if self.prefix is not None and self._residency:
                self.prefix.set_capacity(index, float(m.kv_blocks_total))  # the engine's own, over the modelled
        if m.slots and index in self.slots:
            self.slots[index].resize(m.slots)
        if m.prefill_seconds is not None and m.prefill_tokens is not None:
            self._timing(index, S.PREFILL_S_TOKEN, 0, m.prefill_seconds, m.prefill_tokens)
        if m.decode_seconds is not None and m.decode_tokens is not None:
            self._timing(index, S.DECODE_S_TOKEN, 2, m.decode_seconds, m.decode_tokens)
        if m.progress is not None:
            self._worked(index, m.progress)
        if m.weights is not None:
            was = col[S.WEIGHTS]
            col[S.WEIGHTS] = WEIGHTS_CODES.get(m.weights, _WARM)
            if was == _WARM and col[S.WEIGHTS] != _WARM and self.prefix is not None:
                self.prefix.forget_replica(index)  # weights reloaded: its KV cache is gone
            self._route(index)
        col[S.SCRAPED_AT] = self.clock.now()
        col[S.SINCE_SCRAPE] = 0
        if self.guard is not None:  # sweeps must run with no traffic too (a hung replica's last requests)
            self.guard.maybe_sweep(col[S.SCRAPED_AT], self.live[S.STALLED_SINCE])
            # failures leave the window with time, also while the picker keeps traffic away from the replica
            col[S.FAIL_SHARE] = self.guard.failure_share(index, col[S.SCRAPED_AT])

    def _timing(self, i: int, row: int, k: int, seconds: float, tokens: float) -> None:
        """Learn seconds per token from an engine's cumulative timing counters (the work done since the
        last scrape; at the first scrape its lifetime average, if it has worked)."""
        w = self._work
        last_s, last_t = w[k, i], w[k + 1, i]
        w[k, i], w[k + 1, i] = seconds, tokens
        if math.isnan(last_t) or tokens < last_t or seconds < last_s:  # first read, or the engine restarted
            last_s = last_t = 0.0
        done = tokens - last_t
        if done > 0:
            self._ewma(row, i, (seconds - last_s) / done, self.clock.now())

    def _worked(self, i: int, progress: float) -> None:
        """The engine's work counter read ``progress``: advanced since the last scrape, the replica computed in
        between, which the stall rule counts as progress like a stream's event (``output_at``): requests of
        ours that stream nothing (whole responses) or whose streams a slow client paused still show its work.
        The first read says nothing of when the work was done; a counter gone back (a restart), neither."""
        last = self._work[4, i]
        self._work[4, i] = progress
        if progress > last:  # NaN (the first read) compares False
            now = self.clock.now()
            if now > self.output_at[i]:
                self.output_at[i] = now

    def counts_work(self) -> np.ndarray:
        """Per replica, whether its engine reports a work counter (read at least once): only there does a whole
        response's long silence say anything (an ``engine: openai`` endpoint shows no work while it computes one)."""
        return ~np.isnan(self._work[4])

    def timing_unlearnt(self, index: int) -> bool:
        """The engine reports its own prefill timing but has computed no prompt token yet (a fresh llama-server)."""
        return not math.isnan(self._work[1, index]) and math.isnan(self.live[S.PREFILL_S_TOKEN, index])
