"""Multi-tenant mixes: several sources, one workload, with the tenants (and their priority classes) they run as.

``Mix(sources, tenants)`` merges its sources' open-loop arrivals in time order
(stable: equal times keep source order), routes each completion back to the
source that sent the arrival (``Arrival.source``), numbers arrivals across all
sources, and sums their counters and offered load.  Mixes nest (a mix of mixes
is flattened into its leaf sources).

``tenants`` maps a tenant name to a :class:`~steersman.control.tenants.TenantConfig`
or just its priority class (``"critical"``, ``PriorityClass.BATCH``...); the
twin builds its tenant directory from :attr:`Mix.tenants`.  A source whose
tenant is not listed gets the default priority (``standard``) unless
``strict=True``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from steersman.config.admission import AdmissionSettings
from steersman.control.tenants import TENANT_NAME, TenantConfig
from steersman.policy.request import PriorityClass
from steersman.twin.workload.base import OfferedLoad, Source, SourceInfo, WorkloadBase, WorkloadStats

__all__ = ["Mix"]


def _time(d) -> float:
    return d.time


class Mix(WorkloadBase):
    """Several sources as one workload."""

    __slots__ = ("_leaves", "_first", "tenants", "_by_peek")

    def __init__(self, sources: Sequence[WorkloadBase],
                 tenants: Mapping[str, TenantConfig | PriorityClass | str] | None = None, *, strict: bool = False,
                 default_priority: str = AdmissionSettings().default_priority) -> None:
        super().__init__()
        leaves: list[Source] = []
        for s in sources:
            if isinstance(s, Mix):
                leaves.extend(s._leaves)
            elif isinstance(s, Source):
                leaves.append(s)
            else:
                raise TypeError(f"a Mix combines sources and mixes, got {type(s).__name__}")
        if not leaves:
            raise ValueError("a Mix needs at least one source")
        names = [s.name for s in leaves]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"source names must be unique (they prefix workflow ids); duplicated: {dup}")
        if len({id(s) for s in leaves}) != len(leaves):
            raise ValueError("the same source object appears twice")
        self._leaves = leaves
        self._first = 0
        out: dict[str, TenantConfig] = {}
        for name, t in (tenants or {}).items():
            if isinstance(t, TenantConfig):
                out[name] = t
            else:
                prio = t if isinstance(t, PriorityClass) else PriorityClass.parse(str(t))
                out[name] = TenantConfig(name, prio)
        for s in leaves:
            for name in getattr(s, "_tenants", [s.tenant]):
                if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
                    raise ValueError(f"source {s.name!r}: bad tenant name {name!r}")
                if name not in out:
                    if strict:
                        raise ValueError(f"source {s.name!r} runs as tenant {name!r}, which is not listed in tenants "
                                         f"(known: {sorted(out)})")
                    out[name] = TenantConfig(name, PriorityClass.parse(default_priority))
        self.tenants: dict[str, TenantConfig] = out

    @property
    def leaves(self) -> tuple[Source, ...]:
        return tuple(self._leaves)

    def priority(self, tenant: str) -> PriorityClass:
        return self.tenants[tenant].priority

    # ----- hooks
    def _bind(self, first: int) -> int:
        if self._bound:
            if first != self._first:
                raise ValueError("this mix is already part of another workload")
            return len(self._leaves)
        self._first = first
        for i, s in enumerate(self._leaves):
            s._bind(first + i)
            s._started = True  # driven through its hooks from now on, not on its own
        self._bound = True
        return len(self._leaves)

    def _infos(self) -> Sequence[SourceInfo]:
        return [s._info() for s in self._leaves]

    def _merge(self, lists: list[list]) -> list:
        lists = [x for x in lists if x]
        if not lists:
            return []
        if len(lists) == 1:
            return lists[0]
        out = [d for x in lists for d in x]
        out.sort(key=_time)  # stable: ties keep source order; each list is sorted, so this is a merge
        return out

    def _initial(self) -> list:
        return self._merge([s._initial() for s in self._leaves])

    def _pull(self, until: float) -> list:
        return self._merge([s._pull(until) for s in self._leaves if s._peek() < until])

    def _peek(self) -> float:
        return min((s._peek() for s in self._leaves), default=math.inf)

    def _follow(self, a, finished_at: float, ok: bool) -> list:
        i = a.source - self._first
        if not 0 <= i < len(self._leaves):
            raise ValueError(f"on_complete for an arrival of unknown source {a.source} (seq {a.seq})")
        return self._leaves[i]._follow(a, finished_at, ok)

    def _continuation(self, a) -> tuple[int, ...]:
        i = a.source - self._first
        return self._leaves[i]._continuation(a) if 0 <= i < len(self._leaves) else ()

    def _idle(self) -> bool:
        return all(s._idle() for s in self._leaves)

    def _stats(self) -> WorkloadStats:
        total = WorkloadStats()
        for s in self._leaves:
            total = total + s._stats()
        return total

    def source_stats(self) -> list[WorkloadStats]:
        """Counters per leaf source (index = ``Arrival.source``)."""
        return [s._stats() for s in self._leaves]

    def _load(self, t0: float | None, t1: float | None, latency_s: float) -> OfferedLoad:
        total = OfferedLoad()
        for s in self._leaves:
            total = total + s._load(t0, t1, latency_s)
        return total

    def source_loads(self, t0: float | None = None, t1: float | None = None, *, latency_s: float = 0.0) -> list[OfferedLoad]:
        self._ensure_bound()
        return [s._load(t0, t1, latency_s) for s in self._leaves]

    def tenant_loads(self, t0: float | None = None, t1: float | None = None, *,
                     latency_s: float = 0.0) -> dict[str, OfferedLoad]:
        """Offered load per tenant (a trace with a tenant mix splits its load by the weights)."""
        out: dict[str, OfferedLoad] = {}
        for s, load in zip(self._leaves, self.source_loads(t0, t1, latency_s=latency_s)):
            weights = getattr(s, "_tenant_w", None)
            shares = [(s.tenant, 1.0)] if weights is None else list(zip(s._tenants, weights.tolist()))
            for name, w in shares:
                out[name] = out.get(name, OfferedLoad()) + load.scaled(w)
        return out

    def summary(self, t0: float | None = None, t1: float | None = None, *, latency_s: float = 0.0) -> str:
        """A table of expected load per source and in total (users x calls per user x tokens per call)."""
        lines = []
        for info, load in zip(self.sources, self.source_loads(t0, t1, latency_s=latency_s)):
            lines.append(f"{info.name} [{info.kind}, tenant {info.tenant}, slo {info.slo_class}]: {load}")
        lines.append(f"total: {self.offered_load(t0, t1, latency_s=latency_s)}")
        return "\n".join(lines)
