"""What the fleet's requests await, per replica: a first token (streams) or a whole answer, and since when.

A mixin of :class:`steersman.fleet.state.Fleet` (kept apart so each module stays small): the stall signal the
policies read (``stalled_since``, ``AWAITING``) and the reliability guard's stall rule judges (with
:meth:`whole_since` for whole responses and :meth:`expected_first_token` as its allowance).
"""

from __future__ import annotations

import math

import numpy as np

from steersman.fleet import snapshot as S
from steersman.fleet.records import Ticket

__all__ = ["Awaited"]


class Awaited:
    """State lives in ``Fleet``: ``_awaiting``, ``_expected``, ``_whole``, ``_whole_since``, ``live``, ``prefix``."""

    def expect_first_token(self, t: Ticket, seconds: float) -> None:
        """``t``'s first token is predicted ``seconds`` after its dispatch (the prediction as applied, learnt
        corrections included): until then its replica's stall is no outlier (see expected_first_token)."""
        if seconds > 0.0 and t.key in self._awaiting[t.replica]:
            self._expected[t.replica][t.key] = seconds

    def expect_answer(self, t: Ticket, seconds: float) -> None:
        """``t`` is a whole response predicted ``seconds`` (end to end) after its dispatch: until then its replica's
        stall is no outlier (see expected_first_token)."""
        entry = self._whole[t.replica].get(t.key)
        if seconds > 0.0 and entry is not None:
            entry[1] = seconds

    def expected_first_token(self, index: int) -> float:
        """The TTFT predicted for the oldest request of ours awaiting a first token on ``index``, or the end-to-end
        latency predicted for its oldest whole response, whichever is longer (0: none, or not predicted).  The
        oldest only: later ones were predicted with the stall so far in (a hung replica's predictions grow with its
        stall, so they would excuse it for ever)."""
        waiting, whole = self._awaiting[index], self._whole[index]
        first = self._expected[index].get(next(iter(waiting)), 0.0) if waiting else 0.0
        return max(first, next(iter(whole.values()))[1]) if whole else first

    def expected_of(self, t: Ticket) -> float:
        """What ``t`` was predicted to take before its first token (a stream) or its answer (a whole response):
        seconds after its dispatch, 0 when not predicted or no longer awaited."""
        entry = self._whole[t.replica].get(t.key)
        return self._expected[t.replica].get(t.key, 0.0) or (entry[1] if entry is not None else 0.0)

    def whole_since(self) -> np.ndarray:
        """Per replica, since when it has held whole responses of ours without answering one (NaN: none in flight):
        the reliability guard's stall rule reads it beside the streams' ``stalled_since`` row (a hung replica
        answering nothing was never ejected when its requests were not streamed: reliability audit).  NaN too where
        the engine reports no work counter: nothing there tells a long answer from a hang."""
        return np.where(self.counts_work(), self._whole_since, np.nan)

    def _answered(self, t: Ticket, now: float | None) -> None:
        """The whole response ``t`` is no longer awaited; ``now``: it came (progress on its replica)."""
        whole = self._whole[t.replica]
        if whole.pop(t.key, None) is None:
            return
        if not whole:
            self._whole_since[t.replica] = math.nan
        elif now is not None:
            self._whole_since[t.replica] = now
        else:  # it left unanswered: the rest wait since the oldest's dispatch, or the last answer
            self._whole_since[t.replica] = max(self._whole_since[t.replica], next(iter(whole.values()))[0])

    def _progress(self, t: Ticket, now: float | None) -> None:
        """``t`` no longer awaits a first token; ``now``: it got one (progress on its replica).

        The ``stalled_since`` row this keeps is the stall signal: the policies read it in snapshots (how long
        requests have waited there), and the reliability guard's sweep ejects a replica stalled far longer than
        its peers' TTFT, counting its streams' events as progress too (:meth:`streamed`: a full replica is not hung)."""
        if self.prefix is not None and self.prefix.events:
            self.prefix.settle_expected(t.replica, t.key)  # its engine's KV events tell what it cached from now on
        waiting = self._awaiting[t.replica]
        if waiting.pop(t.key, None) is None:
            return
        self._expected[t.replica].pop(t.key, None)
        self.live[S.AWAITING, t.replica] = len(waiting)
        row = self.live[S.STALLED_SINCE]
        if not waiting:
            row[t.replica] = math.nan
        elif now is not None:
            row[t.replica] = now
        else:  # it left without progress: the rest wait since the oldest's dispatch, or the last progress
            row[t.replica] = max(row[t.replica], next(iter(waiting.values())))
