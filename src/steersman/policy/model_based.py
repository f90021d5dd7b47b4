"""steersman's default profile: model-based, SLO-aware, cost-minimising.

For every candidate the engine model predicts TTFT, TPOT and the request's
marginal GPU cost (:mod:`steersman.policy.predict`).  The ``slo-cheapest``
picker then takes **the cheapest replica whose prediction meets the request's
budget** (TTFT, TPOT and deadline; a critical request or a valuable workflow
step must meet it with a safety margin), breaking near-ties by the weighted
scores, and ties of those by each model's count of tied decisions
(:meth:`SloCheapest.tie_break`); when no replica meets it, every candidate within ``late_latency_tie`` (2x) of the least
predicted latency counts as equally late and the scores choose (late work spreads by load and prefix
instead of crowding the fastest replicas, which on-time requests need).  A
request whose prompt a replica mostly holds goes to such a holder first (Preble's
exploit; an unprotected one even when only another replica would meet its budget,
unless the holders are far slower or would break their residents' TPOT: see
:func:`~steersman.policy.kernels.slo_pool_kernel`).  When every candidate is
saturated the request waits in the gateway queue.  A request of a class in
``SchedulerSettings.shed_infeasible`` (default: sheddable) that no replica is
predicted to serve within its SLO is refused early instead (:func:`shed`).
"""

from __future__ import annotations

from steersman.config import DEFAULTS, SchedulerSettings
from steersman.fleet import snapshot as S
from steersman.policy.base import POLICIES, Decision, Queue, Reject, Route
import numpy as np

from steersman.policy.framework import PICKERS, DecisionContext, Profile, Scores, WeightedScorer
from steersman.policy.kernels import failure_shares, slo_pool_kernel
from steersman.policy.plugin_kernels import pick_top, uncached_kernel
from steersman.policy.predict import pooling_factor
from steersman.policy.request import PriorityClass
from steersman.policy.saturation import Saturation
from steersman.policy.slot_wait import wait_for_slot
from steersman.policy.scorers import FitsKv, KvHeadroom, LoadBalance, PrefixAffinity, Shortlist, targets

__all__ = ["SloCheapest", "steersman_profile", "corrections", "raw_cached", "shed", "hold"]


@PICKERS.register("slo-cheapest")
class SloCheapest:
    """Margins and ties from :class:`~steersman.config.SchedulerSettings` (``safety_margin``, ``cost_tie``,
    ``latency_tie``, ``late_latency_tie``, ``exploit_share``, ``exploit_slowdown``); the rule is :func:`~steersman.policy.kernels.slo_pool_kernel`'s.

    Its one state: each model's count of tied decisions (:meth:`tie_break`), which the fused path
    (:mod:`~steersman.policy.fastpath`) shares, being handed this picker."""

    name = "slo-cheapest"
    #: models whose tie counts are kept (the fleet's, far fewer; past it the longest-kept is dropped)
    MAX_MODELS = 4096

    def __init__(self, settings: SchedulerSettings = DEFAULTS.scheduler) -> None:
        self.safety_margin = settings.safety_margin
        self.cost_tie = settings.cost_tie
        self.latency_tie = settings.latency_tie
        self.late_latency_tie = settings.late_latency_tie
        self.exploit_share = settings.exploit_share
        self.exploit_slowdown = settings.exploit_slowdown
        self.shed = frozenset(PriorityClass.parse(c) for c in settings.shed_infeasible)
        self.hold = settings.hold_late
        self.slot_wait = (settings.slot_wait_gain, settings.slot_wait_overrun) if settings.slot_wait else None
        self._ties: dict[str, tuple[int, int]] = {}  # model -> (seq, turn) of its latest tied decision

    @classmethod
    def from_config(cls, params: dict, settings: SchedulerSettings) -> SloCheapest:
        """From a profile's YAML: every knob is the fleet file's ``scheduler`` setting; it takes no ``params``."""
        if params:
            raise ValueError(f"takes no params (its knobs are scheduler settings), got {sorted(params)}")
        return cls(settings)

    def early_reject(self, ctx: DecisionContext) -> Reject | None:
        """:func:`shed` for a request no candidate (saturated ones included) is predicted to give its first token
        within the TTFT budget it has left: asked of requests that wait in the gateway queue
        (``control/shed_watch.py``); the TPOT and deadline tests stay :meth:`pick`'s."""
        req = ctx.request
        protected = req.priority == PriorityClass.CRITICAL or req.protection > 0
        if req.priority not in self.shed or protected or req.resumed:
            return None
        ttft = targets(req, ctx.snapshot.time)[0]
        p = ctx.feature("prediction")
        if not p.ttft.size or float(p.ttft.min()) <= ttft:
            return None
        return shed(self.shed, req, protected, p.ttft, ttft)

    def pick(self, ctx: DecisionContext, scores: Scores) -> Decision:
        req = ctx.request
        p = ctx.feature("prediction")
        ttft, tpot, left = targets(req, ctx.snapshot.time)
        protected = req.priority == PriorityClass.CRITICAL or req.protection > 0
        margin = self.safety_margin if protected else 1.0
        snap = ctx.snapshot
        cached = raw_cached(ctx)  # the holders-first rule reads the index's raw match (see slo_pool_kernel)
        pool = np.empty(p.ttft.size, dtype=np.bool_)
        resident = snap.live[S.RESIDENT_TPOT][ctx.candidates]
        count, feasible, stay = slo_pool_kernel(p.ttft, p.tpot, p.e2e, p.cost, cached, resident, p.tpot_res,
                                                self.exploit_share * req.prompt_tokens, self.exploit_slowdown, ttft,
                                                tpot, left, margin, protected, self.cost_tie, self.latency_tie,
                                                self.late_latency_tie, pool, failure_shares(ctx.candidates, snap.live))
        if not feasible and not stay:
            late = shed(self.shed, req, protected, p.ttft, ttft) or (
                hold(req, protected, p.ttft_alone, ttft, _holder(cached, self.exploit_share, req)) if self.hold else None)
            if late is not None:
                return late
        if self.slot_wait is not None and snap.prefix is not None and snap.prefix.slots:
            wait = wait_for_slot(snap, req, ctx.candidates, p.ttft, ctx.feature("prefix_held"), protected, ttft,
                                 *self.slot_wait, settings=ctx.settings)
            if wait is not None:
                return wait
        if count == 1:
            j = int(pool.argmax())
        else:  # equally good: the weighted scores decide, then the model's turn among those tied
            j = self.tie_break(req, pool, scores())
        reason = _reason(feasible, stay)
        i = int(ctx.candidates[j])
        r_ttft, r_tpot = corrections(ctx.snapshot, i, ctx.settings)
        # the fleet learns observed / predicted: it must see the model's prediction *before* the correction,
        # else the learned ratio converges to the square root of the true one (r <- k / r)
        keep = tpot * margin if tpot < np.inf else 0.0  # what later arrivals there must not break
        return Route(i, reason, float(p.ttft[j]) / r_ttft, float(p.tpot[j]) / r_tpot, keep, not feasible and not stay,
                     float(p.ttft[j]), float(p.e2e[j]))

    def forget_turns(self) -> None:
        """Forget every model's tie turns (see :meth:`steersman.policy.framework.Profile.forget_turns`)."""
        self._ties.clear()

    def tie_break(self, req, pool: np.ndarray, total: np.ndarray) -> int:
        """Position among ``pool`` (the equally good candidates) of the pick: the best ``total`` (within 1e-12);
        when several are best, the k-th tied decision of the request's model takes the k-th of them (mod their
        count), a counter per model as round-robin's (:class:`~steersman.policy.baselines.simple.RoundRobin`).

        The request's ``seq`` (its turn before) is the gateway's counter over every model: with two models'
        requests alternating, each model's were all even or all odd, and all of one model's tied requests went
        to the same replica of its two.  Asking again for the request just decided (same ``seq``: the gateway's
        warm-up decisions, a reroute) takes the same turn; a decision with one best candidate takes none.  The
        digital twin builds its policy per run, so its turns are a function of the run's requests."""
        last = self._ties.get(req.model)
        turn = 0 if last is None else last[1] + (req.seq != last[0])
        j, count = pick_top(pool, total, turn)
        if j < 0:  # a NaN score (no clamped total has one): the best of the others, else the pool's turn
            s = np.where(pool & ~np.isnan(total), total, -np.inf)
            top = np.flatnonzero(s >= s.max() - 1e-12) if np.isfinite(s.max()) else np.flatnonzero(pool)
            count = top.size
            j = int(top[turn % count])
        if count > 1:
            if last is None and len(self._ties) >= self.MAX_MODELS:
                del self._ties[next(iter(self._ties))]
            self._ties[req.model] = (req.seq, turn)
        return j


def shed(classes: frozenset, req, protected: bool, ttft: np.ndarray, target_ttft: float) -> Reject | None:
    """A request no replica is predicted to serve within its SLO: refused early (Mooncake's early rejection)
    when its priority class is in ``classes`` (``SchedulerSettings.shed_infeasible``), it is not protected and
    not a stream under way; else None (it goes where it is predicted to finish soonest, as ever).
    ``target_ttft``: the TTFT budget it has left.  ``Retry-After``: how late the earliest predicted first token
    would be for the request sent again now, with its whole budget (the work ahead drains by then), >= 1 s: the
    budget left is spent by a wait in the gateway queue, and a Retry-After of the time waited asked a client to
    wait for nothing."""
    if req.priority not in classes or protected or req.resumed:
        return None
    best = float(ttft.min()) if ttft.size else np.inf
    late = best - target_ttft if best < np.inf and target_ttft < np.inf else 0.0
    whole = req.budget.ttft_s
    again = best - whole if whole is not None and best < np.inf else late
    what = (f"first token in {best:.2f} s at best, {max(target_ttft, 0.0):.2f} s of its {whole or 0.0:.2f} s TTFT "
            "budget left" if late > 0 else "TPOT or deadline")
    return Reject(f"no replica is predicted to meet its SLO ({what}); {req.priority.name.lower()} requests are "
                  "refused early then (scheduler.shed_infeasible)", max(1.0, again), "slo_infeasible")


def hold(req, protected: bool, ttft_alone: np.ndarray, left: float, holder: bool = False) -> Queue | None:
    """A request no replica is predicted to serve within its TTFT now: it waits in the gateway queue when it is
    not protected (a critical or sunk-cost request goes where it finishes soonest at once), not a stream under
    way, no replica holds most of its prompt (``holder``: its place is in that replica's queue, where its prefill
    is mostly skipped, not in the gateway's, from which it would go wherever capacity frees first and compute its
    prompt again: the saturation detector's affinity rule), its TTFT budget has time left, and some replica could
    still meet it once the prefill queued ahead of it there has drained (``ttft_alone``); else None (routed,
    late).  ``left``: its TTFT budget left (:func:`~steersman.policy.scorers.targets`).
    ``SchedulerSettings.hold_late``."""
    if protected or holder or req.resumed or not left < np.inf:
        return None
    if not left > 0.0 or not ttft_alone.size or not float(ttft_alone.min()) <= left:
        return None
    return Queue(f"no replica is predicted to give its first token within its TTFT budget now ({left:.2f} s left); "
                 "it waits in the gateway for one that can")


def _holder(cached: np.ndarray, exploit_share: float, req) -> bool:
    """Whether some candidate holds most of the prompt: the raw match ``cached`` (tokens) reaches ``exploit_share``
    of it, the picker's holders-first threshold."""
    best = float(cached.max()) if cached.size else 0.0
    return best > 0.0 and best >= exploit_share * req.prompt_tokens


def _reason(feasible: bool, stayed: bool) -> str:
    if feasible:
        return "cheapest meeting the SLO"
    if stayed:
        return "holder of its prompt (another replica meets the SLO; computing the prompt there costs the fleet more)"
    return "no replica meets the SLO (one of the least late: the scores chose unless it was alone)"


def raw_cached(ctx: DecisionContext) -> np.ndarray:
    """Prompt tokens the prefix index credits each candidate with (its raw match, at most prompt - 1),
    undiscounted, whatever the replica's cache still holds: what the picker's holders-first rule compares with
    ``exploit_share``."""
    held = ctx.feature("prefix_held_raw")
    pt = float(ctx.request.prompt_tokens)
    if held.size == 0:
        return np.zeros(ctx.candidates.size)
    blocks = held[ctx.candidates].astype(np.float64)
    return pt - uncached_kernel(blocks, float(ctx.snapshot.statics.block_size), pt, np.empty(blocks.size))


def corrections(snap, i: int, settings: SchedulerSettings | None = None) -> tuple[float, float]:
    """The (TTFT, TPOT) observed/predicted ratios the prediction applied to replica ``i``
    (the rule of :func:`steersman.policy.kernels.predict_kernel`; ``settings``: the prediction's, whose
    ``unprofiled_*`` pooled the TPOT of replicas without a roofline; None: the defaults)."""
    live = snap.live
    r_ttft = float(live[S.TTFT_RATIO, i])
    if r_ttft != r_ttft:
        r_ttft = snap.ttft_prior
    r_tpot = float(live[S.TPOT_RATIO, i])
    if r_tpot != r_tpot or (live[S.IN_FLIGHT, i] <= 0.0 and live[S.RUNNING, i] <= 0.0):
        r_tpot = snap.tpot_prior
    if not snap.statics.modelled[i]:  # its TPOT pooled over the replicas alike: the ratio applied is pooled / own
        r_tpot *= pooling_factor(snap, i, settings)
    return (r_ttft if r_ttft > 0 else 1.0), (r_tpot if r_tpot > 0 else 1.0)


def steersman_profile(settings: SchedulerSettings) -> Profile:
    p = Profile(
        "steersman",
        filters=[Shortlist(), FitsKv()],
        # the picker already weighs latency against the budget and cost; the scores
        # only rank replicas it finds equally good
        scorers=[
            WeightedScorer(PrefixAffinity(), 2.0),
            WeightedScorer(KvHeadroom(settings.kv_headroom_tie), 1.0),
            WeightedScorer(LoadBalance(settings.balance_tie), 1.0),
        ],
        picker=SloCheapest(settings),
        saturation=Saturation(settings),
        settings=settings,
    )
    p.kv_events = True  # where the engines publish KV events, the index reads what each holds from them
    return p


POLICIES.register("steersman", steersman_profile)
