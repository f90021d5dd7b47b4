"""The scheduling framework: filters -> weighted scorers -> picker, as pure functions of a snapshot.

One decision runs over a :class:`DecisionContext` (the frozen fleet snapshot, the
request, and the candidate replicas).  Plugins implement one small Protocol each
and are registered by name; a :class:`Profile` (from YAML) chooses plugins and
weights.  The framework, not the plugins, clamps every score to [0, 1] (NaN
counts as 0), applies the weights, and times every plugin call for the
``steersman:plugin_latency_seconds`` metric.  Scores are computed when the
picker asks for them (:class:`Scores`): a picker that can decide without them
(one replica clearly best) skips their cost.

Scores and masks are arrays aligned with ``ctx.candidates`` (replica indices).
Expensive per-decision features (prefix match, latency prediction) are computed
once, on first use, and shared by all plugins (:meth:`DecisionContext.feature`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from steersman.config import DEFAULTS, SchedulerSettings
from steersman.fleet.snapshot import FleetSnapshot
from steersman.obs.histogram import HistogramFamily
from steersman.plugins import Registry
from steersman.policy.base import Decision, Queue, Reject, Route, mix64, none_in_rotation
from steersman.policy.kernels import add_clamped
from steersman.policy.request import SchedRequest

__all__ = [
    "DecisionContext", "Filter", "Scorer", "Picker", "Profile", "Scores", "WeightedScorer",
    "FILTERS", "SCORERS", "PICKERS", "FEATURES", "PER_REPLICA", "PLUGIN_LATENCY", "feature", "build", "make_plugin",
]

#: Per-plugin decision latency (framework-measured; perf_counter is a CPU-cost
#: measurement, not control-plane time, so it does not go through the clock).
PLUGIN_LATENCY = HistogramFamily(
    "steersman:plugin_latency_seconds", "Time spent in each scheduling plugin per decision.", ["plugin"],
    (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2),
)

#: Shared features by name: ``f(ctx) -> value`` (arrays aligned with ``ctx.candidates``).
FEATURES: dict[str, Callable[[DecisionContext], Any]] = {}
#: Features with one value per replica of the fleet (not per candidate): never re-sliced when filters narrow.
PER_REPLICA: set[str] = set()


def feature(name: str, per_replica: bool = False):
    """Register a shared per-decision feature computed lazily from the context.

    ``per_replica``: its value is indexed by replica (the whole fleet), not aligned with the
    candidates, so narrowing the candidates leaves it as it is."""

    def add(f: Callable[[DecisionContext], Any]):
        FEATURES[name] = f
        if per_replica:
            PER_REPLICA.add(name)
        else:
            PER_REPLICA.discard(name)
        return f

    return add


@dataclass(slots=True)
class DecisionContext:
    """One decision: the snapshot, the request, and the candidate replicas still in play.

    A feature is computed over the candidates in play when it is first asked for
    (so an early ``shortlist`` filter makes every later feature cheap) and re-sliced
    when filters narrow the candidates further.
    """

    snapshot: FleetSnapshot
    request: SchedRequest
    base: np.ndarray  # initial candidate replica indices
    sel: np.ndarray | None = None  # positions in ``base`` still in play (None: all)
    _features: dict[str, tuple[Any, np.ndarray | None]] = field(default_factory=dict)
    _cand: np.ndarray | None = None  # ``base[sel]``, kept by :meth:`narrow`
    #: the profile's scheduler settings, for the shared features that read some (the unprofiled model's priors);
    #: None: the defaults
    settings: SchedulerSettings | None = None

    @property
    def candidates(self) -> np.ndarray:
        if self.sel is None:
            return self.base
        cand = self._cand
        if cand is None:
            cand = self._cand = self.base[self.sel]
        return cand

    def feature(self, name: str) -> Any:
        """A shared feature over the current candidates (arrays, or objects with ``select(positions)``)."""
        entry = self._features.get(name)
        if entry is None:
            entry = self._features[name] = (FEATURES[name](self), self.sel)
        value, at = entry
        if at is self.sel or name in PER_REPLICA:
            return value
        # narrowed since: positions now in play, relative to those the feature was computed for
        rel = self.sel if at is None else np.searchsorted(at, self.sel)
        if isinstance(value, np.ndarray):
            return value[rel]
        select = getattr(value, "select", None)
        return select(rel) if select is not None else value

    def narrow(self, keep: np.ndarray) -> None:
        """Keep only the current candidates where ``keep`` is true."""
        self.sel = keep.nonzero()[0] if self.sel is None else self.sel[keep]
        self._cand = None


@runtime_checkable
class Filter(Protocol):
    name: str

    def filter(self, ctx: DecisionContext) -> np.ndarray:
        """Boolean mask over ``ctx.candidates``: True keeps the replica.

        A filter may also define ``when_empty(ctx) -> Decision | mask | None``, asked when it keeps none: a
        decision to answer with, a non-empty mask of candidates to keep after all, or None (the framework's 503)."""
        ...


@runtime_checkable
class Scorer(Protocol):
    name: str

    def score(self, ctx: DecisionContext) -> np.ndarray:
        """Scores over ``ctx.candidates``; higher is better.  Values outside [0, 1] are clamped."""
        ...


class Scores:
    """The weighted total of a profile's scores, computed (and clamped) only if a picker asks."""

    __slots__ = ("_profile", "_ctx", "_total")

    def __init__(self, profile: Profile, ctx: DecisionContext) -> None:
        self._profile = profile
        self._ctx = ctx
        self._total: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self._total is None:
            self._total = self._profile._score(self._ctx)
        return self._total


@runtime_checkable
class Picker(Protocol):
    name: str

    def pick(self, ctx: DecisionContext, scores: Scores) -> Decision:
        """Choose among ``ctx.candidates``; ``scores()`` gives the weighted total (computed on demand)."""
        ...


FILTERS: Registry = Registry("scheduling filter", Filter)
SCORERS: Registry = Registry("scheduling scorer", Scorer)
PICKERS: Registry = Registry("scheduling picker", Picker)


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


_clock = time.perf_counter  # two reads per plugin call, inline (no wrapper call per plugin)


class Profile:
    """A named scheduling profile; implements :class:`steersman.policy.base.RoutingPolicy`.

    ``saturation`` (a callable ``ctx -> bool mask of saturated candidates``), when
    set, makes the profile answer :class:`Queue` once every candidate is saturated
    and keeps saturated replicas out otherwise ("delay work").

    When every plugin is one :mod:`steersman.policy.fastpath` knows (the ``steersman``
    profile's), :meth:`pick` runs its fused compiled passes instead of :meth:`decide`: the same
    decisions and per-plugin observations, without a context, masks and narrowed copies per
    stage.  The plugins are fixed at construction.
    """

    #: the prefix index credits a replica only with what its KV cache still holds (``SchedulerSettings.prefix_residency``);
    #: False for a profile modelling a router whose own prefix tree knows nothing of the engines' evictions
    prefix_residency = True
    #: the profile reads each replica's cache from its engine's KV events when the engines publish them
    #: (``SchedulerSettings.kv_events``): NVIDIA Dynamo's KV router does; a router keeping its own approximate
    #: prefix tree (sglang-router, llm-d's default prefix-cache-scorer, Preble) does not
    kv_events = False

    def __init__(self, name: str, filters: Sequence[Filter], scorers: Sequence[WeightedScorer], picker: Picker,
                 saturation: Callable[[DecisionContext], np.ndarray] | None = None,
                 settings: SchedulerSettings | None = None) -> None:
        for ws in scorers:
            if not ws.weight >= 0:
                raise ValueError(f"profile {name!r}: scorer {ws.scorer.name!r} needs a weight >= 0")
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self.saturation = saturation
        self.settings = settings  # the shared features' (DecisionContext.settings); None: the defaults
        from steersman.policy.reliability import RELIABILITY  # every profile's first step (late: it imports us)

        self.gate = RELIABILITY
        self._hist = {p.name: PLUGIN_LATENCY.labels(p.name) for p in (*self.filters, *(w.scorer for w in self.scorers), picker)}
        self._hist["saturation"] = PLUGIN_LATENCY.labels("saturation")
        self._hist[self.gate.name] = PLUGIN_LATENCY.labels(self.gate.name)
        from steersman.policy.fastpath import fused  # late: it imports the plugins, which import us

        self._fast = fused(self)  # the same decisions in a few compiled passes, for the plugins it knows

    def context(self, snapshot: FleetSnapshot, request: SchedRequest) -> DecisionContext:
        return DecisionContext(snapshot, request, snapshot.candidates(request.model), settings=self.settings)

    def forget_turns(self) -> None:
        """Forget the rotations the picker keeps (a picker's optional ``forget_turns``: round-robin's counter, the
        steersman picker's tie turns): the gateway's warm-up decisions are no requests, and a live gateway's first
        request takes the first turn as the digital twin's does."""
        forget = getattr(self.picker, "forget_turns", None)
        if forget is not None:
            forget()

    def early_reject(self, snapshot: FleetSnapshot, request: SchedRequest) -> Reject | None:
        """The picker's early rejection of ``request`` (its optional ``early_reject(ctx)``: Mooncake's, in the
        steersman picker) over the candidates the reliability gate keeps, saturated ones and those at their
        concurrency limit included: asked of a
        request that waits in the gateway queue, which :meth:`pick` would only answer "saturated" (see
        ``control/shed_watch.py``).  None when the picker has none or refuses nothing."""
        judge = getattr(self.picker, "early_reject", None)
        if judge is None:
            return None
        ctx = self.context(snapshot, request)
        if ctx.candidates.size == 0:
            return None
        keep = self.gate.available(ctx)  # at the concurrency limit is saturated too: kept (a review found every
        kept = np.count_nonzero(keep)  # replica at its limit left none, and the request waited for its turn)
        if not kept:
            return None
        if kept < keep.size:
            ctx.narrow(keep)
        return judge(ctx)

    def pick(self, snapshot: FleetSnapshot, request: SchedRequest) -> Decision:
        if self._fast is not None:
            return self._fast(snapshot, request)
        return self.decide(self.context(snapshot, request))

    def decide(self, ctx: DecisionContext) -> Decision:
        if ctx.candidates.size == 0:
            return none_in_rotation(ctx.request.model)
        clock, hist = _clock, self._hist
        t0 = clock()
        keep = self.gate.filter(ctx)  # reliability: ejected, breaker, limit, excluded
        hist[self.gate.name].observe(clock() - t0)
        kept = np.count_nonzero(keep)  # a count: cheaper than keep.all() and keep.any() on a large fleet
        if kept < keep.size:
            if not kept:
                return self.gate.empty(ctx)
            ctx.narrow(keep)
        if self.saturation is not None and not ctx.request.resumed:  # a resumed stream is not new work
            t0 = clock()
            sat = self.saturation(ctx)
            hist["saturation"].observe(clock() - t0)
            busy = np.count_nonzero(sat)
            if busy == sat.size:
                return Queue("every candidate replica is saturated")
            if busy:
                ctx.narrow(~sat)
        for f in self.filters:
            t0 = clock()
            keep = f.filter(ctx)
            hist[f.name].observe(clock() - t0)
            kept = np.count_nonzero(keep)
            if not kept:
                empty = getattr(f, "when_empty", None)  # optional: the filter's own answer when it leaves none
                verdict = empty(ctx) if empty is not None else None
                if verdict is None:
                    return Reject(f"no replica passes filter {f.name!r}")
                if not isinstance(verdict, np.ndarray):
                    return verdict
                keep, kept = verdict, np.count_nonzero(verdict)
            if kept < keep.size:
                ctx.narrow(keep)
        t0 = clock()
        out = self.picker.pick(ctx, Scores(self, ctx))
        hist[self.picker.name].observe(clock() - t0)  # includes the scorers the picker asked for (as before)
        return out

    def _score(self, ctx: DecisionContext) -> np.ndarray:
        total = np.zeros(ctx.candidates.size)
        clock, hist = _clock, self._hist
        for ws in self.scorers:
            t0 = clock()
            s = ws.scorer.score(ctx)
            hist[ws.scorer.name].observe(clock() - t0)
            if type(s) is not np.ndarray or s.dtype != np.float64 or s.shape != total.shape:
                s = np.asarray(s, dtype=float)
                if s.shape != total.shape:
                    s = np.broadcast_to(s, total.shape)
            add_clamped(total, np.ascontiguousarray(s), ws.weight)  # clamped to [0, 1]: NaN -> 0, +inf -> 1
        return total


def build(name: str, spec: Mapping[str, Any], saturation: Callable[[DecisionContext], np.ndarray] | None = None,
          settings: SchedulerSettings | None = None) -> Profile:
    """A profile from its YAML form::

        filters: [{type: fits-kv}]
        scorers: [{type: prefix-affinity, weight: 3}, {type: queue-depth, weight: 2, params: {...}}]
        picker: {type: max-score}
        queue_when_saturated: true

    ``settings``: the fleet file's scheduler settings (default: those ``saturation`` carries, else the defaults).
    A plugin with a ``from_config(params, settings)`` classmethod is built by it (its knobs default to those
    settings, as the ``steersman`` profile's do); any other by ``factory(**params)``.  A plugin that refuses its
    params raises :class:`ValueError` naming it (what the fleet file's loader reports)."""
    if settings is None:
        settings = getattr(saturation, "settings", None) or DEFAULTS.scheduler
    filters = [make_plugin(FILTERS, f, settings) for f in spec.get("filters", ())]
    scorers = [WeightedScorer(make_plugin(SCORERS, s, settings), _weight(s)) for s in spec.get("scorers", ())]
    picker = make_plugin(PICKERS, spec.get("picker", "max-score"), settings)
    return Profile(name, filters, scorers, picker, saturation if spec.get("queue_when_saturated", False) else None,
                   settings)


def make_plugin(reg: Registry, item: Any, settings: SchedulerSettings):
    """One plugin from its YAML form (a name, or ``{type, params}``), built as :func:`build` builds it."""
    if isinstance(item, str):
        item = {"type": item}
    kind = item.get("type") if isinstance(item, Mapping) else None
    if not isinstance(kind, str):
        raise ValueError(f"a {reg.what} is a name or {{type: name, params: {{...}}}}, got {item!r}")
    factory = reg.get(kind)  # an unknown name: UnknownPlugin (a KeyError) listing the known ones
    params = item.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{reg.what} {kind!r}: params must be a mapping, got {params!r}")
    from_config = getattr(factory, "from_config", None)
    try:
        plugin = from_config(dict(params), settings) if from_config is not None else factory(**params)
    except Exception as e:  # a plugin's own check, or a param it does not take: name the plugin
        raise ValueError(f"{reg.what} {kind!r}: {e}") from None
    try:
        return reg.check(plugin, kind)
    except TypeError as e:  # registered as the wrong extension point: said where the file names it
        raise ValueError(str(e)) from None


def _weight(item: Any) -> float:
    w = item.get("weight", 1.0) if isinstance(item, Mapping) else 1.0
    if isinstance(w, bool) or not isinstance(w, (int, float)):
        raise ValueError(f"scorer {item.get('type')!r}: weight must be a number >= 0, got {w!r}")
    return float(w)


@PICKERS.register("max-score")
class MaxScore:
    """Highest weighted score; ties broken by a hash of the request's sequence number (deterministic, spreads load;
    the counter itself is the gateway's over every model, so its parity would favour one replica of each)."""

    name = "max-score"

    def pick(self, ctx: DecisionContext, scores: Scores) -> Decision:
        total = scores()
        best = np.flatnonzero(total >= total.max() - 1e-12) if total.size else np.arange(ctx.candidates.size)
        return Route(int(ctx.candidates[best[mix64(ctx.request.seq) % best.size]]), "max-score")
