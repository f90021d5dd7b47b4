"""Shared pieces of the baseline profiles: the raw prefix match, deterministic choice, roofline rates.

Every baseline but round-robin (a counter per model) is a pure function of (snapshot, request).  Where a
published router draws at random (ties, P2C, ``random``) we draw from a hash of the request's sequence
number instead, so a decision is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from steersman.fleet.statics import FleetStatics
from steersman.policy.base import Decision, Route, mix64
from steersman.policy.framework import DecisionContext, Picker, Profile, feature

__all__ = ["prefix_match", "mix64", "at", "choose_min", "choose_max", "rule_profile", "prefill_s_per_token",
           "decode_step_s"]


def at(ctx: DecisionContext, row: np.ndarray) -> np.ndarray:
    """``row`` (one value per replica) over the current candidates, without a copy when all are."""
    cand = ctx.candidates
    return row if cand.size == row.size else row[cand]


@feature("prefix-match")
def prefix_match(ctx: DecisionContext) -> np.ndarray:
    """Leading prompt blocks (int64) each candidate probably holds, as the index says (no discount).  Not capped
    one block short of a block-aligned prompt's end as steersman's ``prefix_held`` is (``PrefixIndex.reusable``: the
    engine computes a prompt's last token): the routers reproduced here score the blocks (llm-d, Dynamo) or
    characters (SGLang) they match, without that rule."""
    snap, req = ctx.snapshot, ctx.request
    if snap.prefix is None or not req.block_hashes:
        return np.zeros(ctx.candidates.size, dtype=np.int64)
    return at(ctx, snap.prefix.match(req.block_hashes))


def _least(values: np.ndarray) -> np.ndarray:
    """Positions of the minimum; NaNs never win (all NaN: every position)."""
    best = np.flatnonzero(values <= values.min())
    if best.size == 0:
        ok = ~np.isnan(values)
        best = np.flatnonzero(values <= values[ok].min()) if ok.any() else np.arange(values.size)
    return best


def _route(ctx: DecisionContext, best: np.ndarray, reason: str) -> Route:
    """The tied candidate drawn from a hash of seq: ``seq`` itself counts across models, so when two models'
    requests alternate each model's seqs share a parity and ``seq % 2`` always took the same of two tied."""
    k = 0 if best.size == 1 else mix64(ctx.request.seq) % best.size
    return Route(int(ctx.candidates[best[k]]), reason)


def choose_min(ctx: DecisionContext, values: np.ndarray, reason: str, among: np.ndarray | None = None) -> Route:
    """The candidate with the least ``values``; ties by seq.  With ``among`` (candidate positions),
    ``values`` are given for those positions only."""
    if among is not None:
        return _route(ctx, among[_least(values)], reason)
    return _route(ctx, _least(values), reason)


def choose_max(ctx: DecisionContext, values: np.ndarray, reason: str) -> Route:
    return _route(ctx, _least(-values), reason)


class _RulePicker:
    """Adapts ``rule(ctx) -> Decision`` to the Picker protocol (the rule ignores weighted scores)."""

    def __init__(self, name: str, rule: Callable[[DecisionContext], Decision]) -> None:
        self.name = name
        self._rule = rule

    def pick(self, ctx: DecisionContext, scores) -> Decision:
        return self._rule(ctx)


def rule_profile(name: str, rule: Callable[[DecisionContext], Decision] | Picker) -> Profile:
    """A profile with no filters or scorers whose picker applies a published rule; never queues."""
    picker = rule if hasattr(rule, "pick") else _RulePicker(name, rule)
    return Profile(name, filters=(), scorers=(), picker=picker, saturation=None)


# ---- roofline rates per replica (pure functions of the statics, memoised by identity) ------------
_RATES: dict[int, tuple[FleetStatics, np.ndarray, np.ndarray]] = {}
_CHUNK = 2048.0  # prefill chunk when the engine's max_num_batched_tokens is unknown
_CTX = 1024.0  # context of a decode step used for the TPOT fallback
_FALLBACK_PREFILL = 1e-4  # s/token (~10k tokens/s) when no replica of the fleet is modelled
_FALLBACK_DECODE = 0.03  # s per decode step, likewise


def _fill(a: np.ndarray, default: float) -> np.ndarray:
    known = a[np.isfinite(a)]
    out = np.where(np.isfinite(a), a, np.median(known) if known.size else default)
    out.flags.writeable = False
    return out


def _rates(st: FleetStatics) -> tuple[np.ndarray, np.ndarray]:
    hit = _RATES.get(id(st))
    if hit is not None and hit[0] is st:
        return hit[1], hit[2]
    idx = np.arange(st.tp.size)
    one = np.ones(idx.size)
    chunk = np.nan_to_num(st.max_batched_tokens, nan=_CHUNK)
    prefill = st.step_time(idx, chunk, chunk * chunk / 2, chunk, 0 * one, 0 * one) / chunk
    decode = st.step_time(idx, one, 0 * one, 0 * one, _CTX * one, one)
    if len(_RATES) > 16:
        _RATES.clear()
    _RATES[id(st)] = (st, _fill(prefill, _FALLBACK_PREFILL), _fill(decode, _FALLBACK_DECODE))
    return _RATES[id(st)][1], _RATES[id(st)][2]


def prefill_s_per_token(st: FleetStatics) -> np.ndarray:
    """Seconds per prompt token of a full prefill chunk on each replica (roofline; median if unknown)."""
    return _rates(st)[0]


def decode_step_s(st: FleetStatics) -> np.ndarray:
    """Seconds of a lone decode step (context 1k) on each replica: the TPOT floor (median if unknown)."""
    return _rates(st)[1]
