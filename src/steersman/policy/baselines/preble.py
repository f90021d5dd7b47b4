"""Preble's E2 (exploit / explore) global scheduling rule (Srivatsa et al., ICLR 2025).

Source: "Preble: Efficient Distributed Prompt Scheduling for LLM Serving" (its E2
algorithm), and WukLab/preble ``multi_node/global_scheduler_with_time.py``:

* **exploit** when the request's longest cached prefix is longer than its uncached
  rest (``matched > prompt - matched``): send it to a GPU holding that prefix; if
  several do, the one with the least load cost;
* **explore** otherwise: the GPU with the least ``L_i + M_i + P_i``, where ``L_i`` is
  the GPU's load over a recent window H (prefill time of the uncached tokens routed
  there plus the decode time of its requests), ``M_i`` the cost of what the request
  would evict, ``P_i`` the request's own prefill time on that GPU (its uncached part).

Our approximations:

* the prefix tree is the shared prefix index (16-token blocks), matched per replica;
* ``L_i`` = ``recent_tokens`` (uncached prompt tokens routed there, decayed with
  ``recent_load_tau_s`` = 60 s instead of a 3-minute sliding window) priced with the
  replica's roofline prefill seconds per token, plus ``decoding x expected_output x
  TPOT`` (Preble: active requests x mean output length x measured TPOT; our TPOT is
  the observed EWMA, else the roofline decode step);
* ``P_i`` = the request's uncached tokens on that replica x the same prefill rate
  (one chunk's per-token cost; attention growth with context is ignored);
* ``M_i`` (eviction cost) is left out: the index does not model per-replica
  capacity pressure;
* Preble's post-assignment rebalancing (moving hot prefixes off an overloaded GPU,
  replicating a prefix) and its per-GPU fair waiting queue are not part of the
  per-request rule and are not reproduced;
* ties are drawn from a hash of the request's sequence number.
"""

from __future__ import annotations

import numpy as np

from steersman.config import SchedulerSettings
from steersman.policy.base import POLICIES, Decision
from steersman.policy.baselines.common import choose_min, decode_step_s, prefill_s_per_token, rule_profile
from steersman.policy.framework import DecisionContext, Profile

__all__ = ["E2", "preble_e2", "load_cost"]


def load_cost(ctx: DecisionContext, pos: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(``L_i`` in seconds, prefill seconds per token) for the candidates (or candidate positions ``pos``)."""
    snap = ctx.snapshot
    idx = ctx.candidates if pos is None else ctx.candidates[pos]

    def rows(a: np.ndarray) -> np.ndarray:
        return a if idx.size == a.size else a[idx]

    s_tok = rows(prefill_s_per_token(snap.statics))
    tpot = rows(snap.tpot_ewma)
    tpot = np.where(np.isfinite(tpot), tpot, rows(decode_step_s(snap.statics)))
    load = rows(snap.recent_tokens) * s_tok + rows(snap.decoding) * (ctx.request.expected_output * tpot)
    return load, s_tok


class E2:
    name = "preble-e2"

    def pick(self, ctx: DecisionContext, scores=None) -> Decision:
        req = ctx.request
        prompt = req.prompt_tokens
        cached = np.minimum(ctx.feature("prefix-match") * ctx.snapshot.statics.block_size, prompt)
        best = cached.max()
        if best > prompt - best:  # exploit: only the holders' load matters
            holders = np.flatnonzero(cached >= best)
            load, _ = load_cost(ctx, holders)
            return choose_min(ctx, load, "preble E2: exploit (cached > uncached), least loaded holder", holders)
        load, s_tok = load_cost(ctx)
        return choose_min(ctx, load + (prompt - cached) * s_tok, "preble E2: explore, least load + own prefill")


def preble_e2(settings: SchedulerSettings) -> Profile:
    return rule_profile("preble-e2", E2())


POLICIES.register("preble-e2", preble_e2)
