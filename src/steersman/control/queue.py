"""The gateway queue ("delay work"): a bounded priority queue of requests waiting for capacity.

Order of service:

1. **priority band**: critical, then standard, sheddable, batch;
2. inside a band, **weighted fair sharing between tenants**: start-time fair
   queuing (Goyal, Vin & Cheng, SIGCOMM 1996) in requests.  Each tenant has a
   start tag S; the tenant with the smallest S is served and its S grows by
   ``1 / weight``; the band's virtual time V is the S of the last service.  A
   tenant that becomes backlogged starts at ``max(S, V)``, so idle time banks no
   credit.  Over any interval in which two tenants stay backlogged, their
   served counts n1, n2 satisfy ``|n1/w1 - n2/w2| <= 1/w1 + 1/w2``.  Ties go
   to the tenant whose head entry is more important (next rule);
3. inside a tenant, **workflow value** (higher first), then **deadline**
   (earliest absolute deadline first, none last), then arrival, then ``seq``.

When the queue is full the **least important** entry is shed: the lowest band
(batch, sheddable, standard, critical), inside it the lowest workflow value,
then the latest deadline (none counts as latest), then the latest arrival --
tenant shares play no part.  A newcomer that would be that entry is refused.

Items are opaque (the gateway's pending requests); the queue keeps the keys
derived from their :class:`SchedRequest` at push time.  Removal is lazy: heaps
keep dead entries until they surface or a heap is compacted (when more than half
of it is dead), so push, pop, remove and shedding cost O(log n) amortised.
``pop(models=...)`` (only entries of models with a free replica) walks tenants and
per-model sub-heaps, O(tenants in the band * log n); a generic ``can_serve``
predicate costs O((s + 1) log n) for s entries it rejects.
No IO, no clock reads: ``now`` comes from the caller.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

from steersman.config.admission import AdmissionSettings
from steersman.policy.request import PriorityClass, SchedRequest

__all__ = ["GatewayQueue", "Enqueued", "Shed", "STOP"]

#: what a ``can_serve`` predicate of :meth:`GatewayQueue.pop` answers when no later entry can be served either:
#: the walk ends there (a caller out of decisions for this pop must not be walked through the whole queue)
STOP = None

_INF = math.inf
_BANDS = tuple(PriorityClass)


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The newcomer is queued; nothing was shed."""

    depth: int  # entries queued now


@dataclass(frozen=True, slots=True)
class Shed:
    """An entry was dropped to respect the bound: the caller must answer ``item`` (503/429).

    ``newcomer`` True: the pushed item itself was refused (it was the least
    important); False: ``item`` is a queued victim and the newcomer is queued.
    """

    item: Any
    newcomer: bool
    band: PriorityClass


class _Entry:
    __slots__ = ("item", "tenant", "model", "band", "deadline", "arrival", "key", "alive")

    def __init__(self, item: Any, tenant: str, model: str, band: int, value: float, deadline: float, arrival: float, seq: int, n: int) -> None:
        self.item = item
        self.tenant = tenant
        self.model = model
        self.band = band
        self.deadline = deadline
        self.arrival = arrival
        self.key = (-value, deadline, arrival, seq, n)  # importance inside a band: smaller first; unique
        self.alive = True


class _Flow:
    """One tenant inside one band."""

    __slots__ = ("name", "weight", "start", "heap", "live", "version", "head_key", "by_model", "model_live")

    def __init__(self, name: str, start: float) -> None:
        self.name = name
        self.weight = 1.0
        self.start = start
        self.heap: list[tuple[tuple, _Entry]] = []  # all entries
        self.by_model: dict[str, list[tuple[tuple, _Entry]]] = {}  # the same entries, one heap per model
        self.model_live: dict[str, int] = {}
        self.live = 0
        self.version = 0
        self.head_key: tuple | None = None


class _Band:
    __slots__ = ("flows", "heap", "vtime", "busy", "count", "model_count")

    def __init__(self) -> None:
        self.flows: dict[str, _Flow] = {}
        self.heap: list[tuple[float, tuple, int, _Flow]] = []  # (start, head key, version, flow)
        self.vtime = 0.0
        self.busy = 0  # flows with live entries
        self.count = 0
        self.model_count: dict[str, int] = {}


def _in_order(heap: list) -> Iterator:
    """The elements of a binary heap in ascending order, lazily, without changing it."""
    if not heap:
        return
    frontier = [(heap[0], 0)]
    n = len(heap)
    while frontier:
        elem, i = heapq.heappop(frontier)
        yield elem
        for c in (2 * i + 1, 2 * i + 2):
            if c < n:
                heapq.heappush(frontier, (heap[c], c))


class GatewayQueue:
    """Bounded queue ordered by band, tenant fair share, workflow value, deadline, arrival."""

    def __init__(self, settings: AdmissionSettings = AdmissionSettings(), max_entries: int | None = None) -> None:
        self.max_entries = settings.queue_max_entries if max_entries is None else max_entries
        if isinstance(self.max_entries, bool) or not isinstance(self.max_entries, int) or self.max_entries < 1:
            raise ValueError(f"queue max entries must be an int >= 1, got {self.max_entries!r}")
        self._bands = [_Band() for _ in _BANDS]
        self._by_id: dict[int, _Entry] = {}
        self._model_count: dict[str, int] = {}
        self._shed_heap: list[tuple] = []  # max-heap of (band, key) via negation
        self._arrivals: list[tuple[float, int, _Entry]] = []
        self._deadlines: list[tuple[float, int, _Entry]] = []
        self._n_deadlines = 0
        self._counter = itertools.count()

    # -- inspection ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, item: Any) -> bool:
        return id(item) in self._by_id

    def counts(self) -> dict[PriorityClass, int]:
        """Entries per band."""
        return {PriorityClass(b): self._bands[b].count for b in range(len(_BANDS))}

    def waiting_models(self) -> dict[str, int]:
        """Entries per model (to know which freed replicas have work waiting)."""
        return dict(self._model_count)

    def waiting_for(self, model: str) -> int:
        """Entries for ``model`` (brown-out: one model's backlog, without copying :meth:`waiting_models`)."""
        return self._model_count.get(model, 0)

    def oldest_wait(self, now: float) -> float:
        """Seconds the longest-waiting entry has waited (since its arrival); 0 when empty."""
        heap = self._arrivals
        while heap and not heap[0][2].alive:
            heapq.heappop(heap)
        return max(0.0, now - heap[0][0]) if heap else 0.0

    # -- push ---------------------------------------------------------------------------------

    def push(self, item: Any, req: SchedRequest, now: float, *, weight: float = 1.0) -> Enqueued | Shed:
        """Queue ``item`` (described by ``req``; ``weight`` is its tenant's fair-share weight)."""
        if id(item) in self._by_id:
            raise ValueError("item is already queued")
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
            raise ValueError(f"tenant weight must be a finite number > 0, got {weight!r}")
        band = int(PriorityClass(req.priority))
        value = float(req.protection)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"workflow value must be a finite number >= 0, got {value!r}")
        deadline = _INF if req.budget.deadline is None else float(req.budget.deadline)
        if math.isnan(deadline):
            raise ValueError("deadline must be a number, got NaN")
        entry = _Entry(item, req.tenant, req.model, band, value, deadline, float(req.arrival), req.seq, next(self._counter))
        if len(self._by_id) >= self.max_entries:
            victim = self._least()
            if (entry.band, entry.key) > (victim.band, victim.key):
                return Shed(item, True, PriorityClass(band))
            self._discard(victim)
            self._insert(entry, float(weight))
            return Shed(victim.item, False, PriorityClass(victim.band))
        self._insert(entry, float(weight))
        return Enqueued(len(self._by_id))

    def _insert(self, e: _Entry, weight: float) -> None:
        band = self._bands[e.band]
        flow = band.flows.get(e.tenant)
        if flow is None:
            flow = band.flows[e.tenant] = _Flow(e.tenant, band.vtime)
        flow.weight = weight
        heapq.heappush(flow.heap, (e.key, e))
        heapq.heappush(flow.by_model.setdefault(e.model, []), (e.key, e))
        flow.model_live[e.model] = flow.model_live.get(e.model, 0) + 1
        band.model_count[e.model] = band.model_count.get(e.model, 0) + 1
        self._model_count[e.model] = self._model_count.get(e.model, 0) + 1
        flow.live += 1
        if flow.live == 1:
            flow.start = max(flow.start, band.vtime)  # no credit banked while idle
            band.busy += 1
            self._rekey(band, flow)
        elif e.key < flow.head_key:
            self._rekey(band, flow)
        band.count += 1
        self._by_id[id(e.item)] = e
        n = e.key[-1]
        heapq.heappush(self._shed_heap, (-e.band, -e.key[0], -e.deadline, -e.arrival, -e.key[3], -n, e))
        heapq.heappush(self._arrivals, (e.arrival, n, e))
        if e.deadline != _INF:
            heapq.heappush(self._deadlines, (e.deadline, n, e))
            self._n_deadlines += 1

    # -- pop ----------------------------------------------------------------------------------

    def pop(
        self, now: float, can_serve: Callable[[Any], bool | None] | None = None, *,
        models: Collection[str] | None = None, prefer: Callable[[Any], bool | None] | None = None
    ) -> Any | None:
        """The most important item the caller can serve now, or None.

        ``models``: only entries whose request names one of these models (e.g.
        those with a free replica) -- the fast way to filter.  ``can_serve``:
        only items it accepts, asked in queue order (costs a call per rejected
        entry); :data:`STOP` (None) ends the walk: nothing after that entry can
        be served either.  ``prefer``: inside the tenant whose turn it is, the
        entries it prefers are asked first, then the tenant's others (:data:`STOP`
        from ``prefer``: no more preferred entries to look for in this pop); the
        tenants' shares stay as they are (the control plane's first pass: a tenant
        whose requests all ran out of TTFT budget is served its share all the same).
        Skipped entries keep their place.  Ordering does not
        depend on ``now``; it is taken for the uniform control-plane signature.
        """
        if isinstance(models, str):
            raise TypeError("models must be a collection of model names, not one str")
        for band in self._bands:
            if not band.count:
                continue
            if models is not None and not any(band.model_count.get(m) for m in models):
                continue
            if can_serve is None and models is None:
                heap = band.heap
                while heap[0][2] != heap[0][3].version:
                    heapq.heappop(heap)
                flow = heap[0][3]
                e = self._head(flow)
                self._serve(band, flow, e)
                return e.item
            for _, _, version, flow in _in_order(band.heap):
                if version != flow.version:
                    continue
                for e in self._in_turn(flow, models, prefer):
                    ok = True if can_serve is None else can_serve(e.item)
                    if ok:
                        self._serve(band, flow, e)
                        return e.item
                    if ok is STOP:
                        return None
        return None

    def _in_turn(self, flow: _Flow, models: Collection[str] | None,
                 prefer: Callable[[Any], bool | None] | None) -> Iterator[_Entry]:
        """A flow's live entries in the order they are asked: those ``prefer`` prefers first (until it answers
        :data:`STOP`), then the others, each once."""
        asked: set[int] = set()
        if prefer is not None:
            for e in self._candidates(flow, models):
                if not e.alive:
                    continue
                wanted = prefer(e.item)
                if wanted is STOP:
                    break
                if wanted:
                    asked.add(id(e))
                    yield e
        for e in self._candidates(flow, models):
            if e.alive and id(e) not in asked:
                yield e

    def _candidates(self, flow: _Flow, models: Collection[str] | None) -> Iterator[_Entry]:
        """A flow's entries in order, optionally only those of ``models`` (merging per-model heaps)."""
        if models is None:
            return (e for _, e in _in_order(flow.heap))
        subs = []
        for m in dict.fromkeys(models):
            sub = flow.by_model.get(m)
            if sub:
                while not sub[0][1].alive:
                    heapq.heappop(sub)
                subs.append(sub)
        return (e for _, e in heapq.merge(*map(_in_order, subs)))

    def _serve(self, band: _Band, flow: _Flow, e: _Entry) -> None:
        band.vtime = max(band.vtime, flow.start)
        flow.start += 1.0 / flow.weight
        self._discard(e, served=True)

    # -- removal ------------------------------------------------------------------------------

    def remove(self, item: Any) -> bool:
        """Drop ``item`` if queued (client gone); True if it was."""
        e = self._by_id.get(id(item))
        if e is None:
            return False
        self._discard(e)
        return True

    def expire(self, now: float, feasible: Callable[[Any, float], bool] | None = None,
               checks: int | None = None) -> list[Any]:
        """Drop and return entries whose deadline has passed (``deadline <= now``) or, when ``feasible`` is
        given, can no longer be met (``feasible(item, now)`` False); earliest deadline first.

        Entries without a deadline never expire.  Cost: O(k log n) for k expired,
        plus one ``feasible`` call per entry with a deadline when it is given (``checks``: only for that many,
        the earliest deadlines).
        """
        out: list[_Entry] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            e = heapq.heappop(self._deadlines)[2]
            if e.alive:
                out.append(e)
                self._discard(e)  # may compact (replace) self._deadlines
        if feasible is not None:
            alive = [t for t in self._deadlines if t[2].alive]
            asked = sorted(alive) if checks is None or checks >= len(alive) else heapq.nsmallest(checks, alive)
            late = [(d, n, e) for d, n, e in asked if not feasible(e.item, now)]
            for _, _, e in late:
                out.append(e)
                self._discard(e)
        return [e.item for e in out]

    # -- internals ----------------------------------------------------------------------------

    def _least(self) -> _Entry:
        heap = self._shed_heap
        while not heap[0][-1].alive:
            heapq.heappop(heap)
        return heap[0][-1]

    def _head(self, flow: _Flow) -> _Entry:
        heap = flow.heap
        while not heap[0][1].alive:
            heapq.heappop(heap)
        return heap[0][1]

    def _rekey(self, band: _Band, flow: _Flow) -> None:
        head = self._head(flow)
        flow.version += 1
        flow.head_key = head.key
        heapq.heappush(band.heap, (flow.start, head.key, flow.version, flow))
        if len(band.heap) > 2 * band.busy + 16:
            band.heap = [t for t in band.heap if t[2] == t[3].version]
            heapq.heapify(band.heap)

    def _discard(self, e: _Entry, served: bool = False) -> None:
        """Take a live entry out (served, shed, expired or removed) and keep every index consistent."""
        e.alive = False
        del self._by_id[id(e.item)]
        band = self._bands[e.band]
        band.count -= 1
        flow = band.flows[e.tenant]
        flow.live -= 1
        if flow.heap[0][1] is e:
            heapq.heappop(flow.heap)
        _decrement(band.model_count, e.model)
        _decrement(self._model_count, e.model)
        if _decrement(flow.model_live, e.model):
            sub = flow.by_model[e.model]
            if sub[0][1] is e:
                heapq.heappop(sub)
            if len(sub) > 2 * flow.model_live[e.model] + 16:
                flow.by_model[e.model] = sub = [t for t in sub if t[1].alive]
                heapq.heapify(sub)
        else:
            del flow.by_model[e.model]
        if flow.live == 0:
            flow.heap.clear()
            flow.by_model.clear()
            flow.version += 1  # its band-heap keys are stale now
            flow.head_key = None
            band.busy -= 1
            if flow.start <= band.vtime:  # max(start, vtime) would be vtime anyway: nothing to remember
                del band.flows[e.tenant]
        elif served or e.key == flow.head_key:
            self._rekey(band, flow)
        if len(flow.heap) > 2 * flow.live + 16:
            flow.heap = [t for t in flow.heap if t[1].alive]
            heapq.heapify(flow.heap)
        if e.deadline != _INF:
            self._n_deadlines -= 1
        live = len(self._by_id)
        for name, limit in (("_shed_heap", live), ("_arrivals", live), ("_deadlines", self._n_deadlines)):
            heap = getattr(self, name)
            if len(heap) > 2 * limit + 64:
                kept = [t for t in heap if t[-1].alive]
                heapq.heapify(kept)
                setattr(self, name, kept)


def _decrement(counts: dict[str, int], key: str) -> int:
    """Decrement ``counts[key]``, deleting it at zero; the new count."""
    n = counts[key] - 1
    if n:
        counts[key] = n
    else:
        del counts[key]
    return n
