"""Arrivals, the workload protocol an event loop drives, offered load and counters.

A workload is an *event source*: pure, seeded and deterministic.  It knows
nothing about the fleet; the twin's event loop asks it for requests and tells it
when they finish.  Two kinds of arrivals:

* **open-loop** (*pulled*): task starts at a Poisson rate, trace replay.  Their
  times do not depend on the fleet.  The loop pulls them in time windows with
  :meth:`Workload.next_batch`; :attr:`Workload.next_time` says when the next one
  is due, so a loop can skip empty windows.
* **closed-loop** (*pushed*): the next call of an agent's task, a retry, the
  next task of a user in a fixed population.  They are returned by
  :meth:`Workload.on_complete` (and, for a population's first calls, by
  :meth:`Workload.start`) with a time at or after the completion, and the loop
  pushes them into its own event queue.

A loop looks like this::

    w = load_workload("workload.yaml", seed=1)
    heap = [(a.time, a.seq, a) for a in w.start()]          # call start() exactly once, first
    heapq.heapify(heap)
    now = 0.0
    while True:
        horizon = now + WINDOW
        if w.next_time < horizon:                            # cheap skip of empty windows
            for a in w.next_batch(horizon):                  # time-sorted, each arrival exactly once
                heapq.heappush(heap, (a.time, a.seq, a))
        ... run the fleet up to `horizon`, popping arrivals whose time has come; for every
        finished or failed request:
            for b in w.on_complete(a, finished_at, ok):      # b.time >= finished_at
                heapq.heappush(heap, (b.time, b.seq, b))
        now = horizon
        if w.done and not heap and fleet_idle: break

Cost: building a request costs a few microseconds plus ~10-40 ns per prompt
block (each call carries the tuple of all its block hashes), and CPython's
cyclic GC walks every young tuple of hashes once: run the twin with
``gc.set_threshold(50_000, 20, 100)`` (or ``gc.disable()`` / ``gc.freeze()``), which
roughly halves the cost of a long run.

Contract:

* ``start()`` first and once; then ``next_batch`` with non-decreasing ``until``.
* Every arrival handed out must be completed exactly once with ``on_complete``
  (``ok=False`` for a failure, a rejection, a timeout, ...): that is how a task
  moves on, retries or gives up, and how :attr:`Workload.done` knows nothing is
  in flight.  Completing an arrival twice, or one the workload never emitted,
  raises ``ValueError`` (a twin bug, caught early).
* ``seq`` numbers arrivals 0, 1, 2, ... in the order the workload hands them out
  (across ``start``, ``next_batch`` and ``on_complete``), so ``(time, seq)`` is a
  deterministic total order.  ``source`` is the index of the leaf source in
  :attr:`Workload.sources`.
* The *content* of an agent task (its calls, token counts, gaps) is fixed when
  the task is created, from the seed and the task's number alone, so two runs
  under different policies see the same tasks; only the timing of follow-ups
  (completion + gap) depends on the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol, runtime_checkable

__all__ = ["Arrival", "Workload", "OfferedLoad", "WorkloadStats", "SourceInfo", "WorkloadBase", "Source"]


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request the workload sends."""

    time: float  # virtual seconds at which the client sends it
    seq: int  # 0, 1, 2, ... in emission order
    tenant: str
    model: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]  # chained hashes of the prompt's full blocks (twin.workload.hashing)
    output_tokens: int  # what the engine will generate (EOS / stop decided up front), <= max_tokens
    max_tokens: int | None  # what the request asks for (None: no limit given)
    slo_class: str | None  # "interactive" | "standard" | "batch" | None
    deadline_s: float | None  # relative deadline for the whole response, or None
    workflow: str | None  # workflow (task) id, for agents
    step: int | None  # k (1-based) within the workflow
    steps: int | None  # expected n
    attempt: int = 0  # 0 for the first try of this step, 1, 2, ... for retries
    source: int = 0  # index of the leaf source in Workload.sources


@dataclass(slots=True, eq=False, repr=False)
class _Draft:
    """Mutable twin of :class:`Arrival` (same slots): built cheaply, then turned into an Arrival in place.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``
    (~2 us for 15 fields); this one stores them directly (~0.2 us), and
    :meth:`WorkloadBase._emit` numbers it and switches its class to :class:`Arrival`.
    """

    time: float
    seq: int
    tenant: str
    model: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    output_tokens: int
    max_tokens: int | None
    slo_class: str | None
    deadline_s: float | None
    workflow: str | None
    step: int | None
    steps: int | None
    attempt: int = 0
    source: int = 0


assert Arrival.__slots__ == _Draft.__slots__ and [f.name for f in fields(Arrival)] == list(_Draft.__slots__)


@dataclass(frozen=True, slots=True)
class OfferedLoad:
    """Expected load a workload offers, averaged over time (what a capacity planner sizes a fleet for).

    ``new_prompt_tokens_per_s`` counts the prompt tokens past the longest full-block
    prefix shared with an earlier prompt (the shared system prompt, the task's
    previous call): what prefill costs with an unbounded prefix cache.  Agent
    sources assume no failures (no retries) and, for a fixed user population,
    the service latency given to ``offered_load``.
    """

    requests_per_s: float = 0.0
    prompt_tokens_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    new_prompt_tokens_per_s: float = 0.0
    tasks_per_s: float = 0.0  # workflows (tasks, sessions) started per second; 0 for traces
    task_requests_per_s: float = 0.0  # the part of requests_per_s that belongs to workflows

    def __add__(self, other: OfferedLoad) -> OfferedLoad:
        return OfferedLoad(*(getattr(self, f) + getattr(other, f) for f in self.__slots__))

    def scaled(self, k: float) -> OfferedLoad:
        return OfferedLoad(*(getattr(self, f) * k for f in self.__slots__))

    @property
    def calls_per_task(self) -> float:
        return self.task_requests_per_s / self.tasks_per_s if self.tasks_per_s else math.nan

    @property
    def prompt_tokens_per_request(self) -> float:
        return self.prompt_tokens_per_s / self.requests_per_s if self.requests_per_s else 0.0

    @property
    def output_tokens_per_request(self) -> float:
        return self.output_tokens_per_s / self.requests_per_s if self.requests_per_s else 0.0

    def __str__(self) -> str:
        head = f"{self.requests_per_s:.3g} req/s"
        if self.tasks_per_s:
            head += f" ({self.tasks_per_s:.3g} tasks/s x {self.calls_per_task:.3g} calls"
            head += ")" if self.task_requests_per_s >= self.requests_per_s * (1 - 1e-9) else " + open-loop requests)"
        return (
            f"{head}; prompt {self.prompt_tokens_per_s:,.0f} tok/s ({self.prompt_tokens_per_request:,.0f}/req, "
            f"{self.new_prompt_tokens_per_s:,.0f} tok/s new); output {self.output_tokens_per_s:,.0f} tok/s "
            f"({self.output_tokens_per_request:,.0f}/req)"
        )


@dataclass(slots=True)
class WorkloadStats:
    """Counters of what a workload did (retries and abandoned tasks are the cost of failures)."""

    emitted: int = 0  # arrivals handed out (retries included)
    completed: int = 0  # on_complete(ok=True)
    failed: int = 0  # on_complete(ok=False)
    retries: int = 0  # arrivals that were retries (attempt > 0)
    tasks_started: int = 0
    tasks_completed: int = 0  # every step succeeded
    tasks_abandoned: int = 0  # a step failed more than the allowed retries

    def __add__(self, other: WorkloadStats) -> WorkloadStats:
        return WorkloadStats(*(getattr(self, f) + getattr(other, f) for f in self.__slots__))

    @property
    def in_flight(self) -> int:
        return self.emitted - self.completed - self.failed


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What one leaf source is: the twin labels per-source results with it."""

    index: int
    name: str
    kind: str  # "chatbot" | "copilot" | "research" | "autonomous" | "agent" | "azure" | "mooncake"
    tenant: str  # the tenant (or, for a trace with a tenant mix, the first one)
    slo_class: str | None
    closed_loop: bool  # True when it pushes follow-ups from on_complete
    params: Mapping[str, object] = field(default_factory=dict)


@runtime_checkable
class Workload(Protocol):
    """What the twin's event loop needs (see the module docstring for the loop and the contract).

    Every workload built here (:class:`WorkloadBase`: sources and mixes) also has
    ``next_time``, ``sources``, ``stats`` and ``offered_load()``.
    """

    def start(self) -> list[Arrival]:
        """Call once, first: closed-loop arrivals known up front (a user population's first calls), to push."""
        ...

    def next_batch(self, until: float) -> list[Arrival]:
        """Open-loop arrivals with ``time < until`` not handed out yet, sorted by (time, seq)."""
        ...

    def on_complete(self, a: Arrival, finished_at: float, ok: bool) -> list[Arrival]:
        """``a`` finished (``ok``) or failed at ``finished_at``: the call(s) it triggers, to push (times >= finished_at)."""
        ...

    @property
    def done(self) -> bool:
        """Nothing more will ever arrive: open-loop sources exhausted and nothing in flight."""
        ...


class WorkloadBase:
    """Implements the public protocol on top of a few internal hooks, numbering arrivals as they leave.

    Hooks (all return lists of ``_Draft`` in time order, except ``_follow``):
    ``_initial()``, ``_pull(until)``, ``_follow(a, finished_at, ok)``, ``_peek()``,
    ``_idle()`` (no open-loop arrival left and nothing in flight), ``_bind(first_index)``
    (assign leaf indices; returns how many leaves), ``_infos()``, ``_stats()``,
    ``_load(t0, t1, latency_s)``.  A :class:`~steersman.twin.workload.mix.Mix` calls
    its leaves' hooks and numbers the merged drafts itself.
    """

    __slots__ = ("_seq", "_started", "_bound")

    def __init__(self) -> None:
        self._seq = 0
        self._started = False
        self._bound = False

    # ----- the public protocol
    @property
    def sources(self) -> tuple[SourceInfo, ...]:
        """The leaf sources, by index (``Arrival.source``)."""
        self._ensure_bound()
        return tuple(self._infos())

    def start(self) -> list[Arrival]:
        if self._started:
            raise RuntimeError("start() was already called: a workload is used once")
        self._ensure_bound()
        self._started = True
        return self._emit(self._initial())

    def next_batch(self, until: float) -> list[Arrival]:
        if not self._started:
            raise RuntimeError("call start() first (it may return closed-loop arrivals to push)")
        return self._emit(self._pull(until))

    @property
    def next_time(self) -> float:
        """Time of the next open-loop arrival not handed out yet (``math.inf`` when there is none)."""
        self._ensure_bound()
        return self._peek()

    def on_complete(self, a: Arrival, finished_at: float, ok: bool) -> list[Arrival]:
        if not self._started:
            raise RuntimeError("call start() first")
        return self._emit(self._follow(a, finished_at, ok))

    @property
    def done(self) -> bool:
        return self._started and self._idle()

    @property
    def stats(self) -> WorkloadStats:
        """Counters so far (a copy)."""
        return self._stats()

    def continuation_hashes(self, a: Arrival) -> tuple[int, ...]:
        """Hashes of the full blocks past ``a``'s prompt that its output completes, as the next prompt of the
        same workflow will carry them (empty when unknown: traces, or ``a`` is not in flight).

        vLLM caches generated blocks too, so an agent's next call also hits its
        previous output.  An engine model can register these for ``a``'s output
        blocks (``len(a.block_hashes) + i`` for the i-th) to reproduce that.
        """
        self._ensure_bound()
        return self._continuation(a)

    def offered_load(self, t0: float | None = None, t1: float | None = None, *, latency_s: float = 0.0) -> OfferedLoad:
        """Expected load over ``[t0, t1)``; ``latency_s`` is the service time a user population waits per call."""
        self._ensure_bound()
        return self._load(t0, t1, latency_s)

    # ----- internals
    def _ensure_bound(self) -> None:
        if not self._bound:
            self._bind(0)

    def _emit(self, drafts: list) -> list:
        n = self._seq
        for d in drafts:
            d.seq = n
            n += 1
            d.__class__ = Arrival
        self._seq = n
        return drafts

    # hooks
    def _bind(self, first: int) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _infos(self) -> Sequence[SourceInfo]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _initial(self) -> list:
        return []

    def _pull(self, until: float) -> list:  # pragma: no cover - abstract
        raise NotImplementedError

    def _peek(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _follow(self, a: Arrival, finished_at: float, ok: bool) -> list:  # pragma: no cover - abstract
        raise NotImplementedError

    def _idle(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def _stats(self) -> WorkloadStats:  # pragma: no cover - abstract
        raise NotImplementedError

    def _load(self, t0: float | None, t1: float | None, latency_s: float) -> OfferedLoad:  # pragma: no cover
        raise NotImplementedError

    def _continuation(self, a: Arrival) -> tuple[int, ...]:
        return ()


class Source(WorkloadBase):
    """A leaf source: one generator or one trace.  Usable alone, or inside a Mix."""

    __slots__ = ("index", "name", "tenant", "model", "_st")

    def __init__(self, name: str, tenant: str, model: str) -> None:
        super().__init__()
        self.index = 0
        self.name = name
        self.tenant = tenant
        self.model = model
        self._st = WorkloadStats()

    def _bind(self, first: int) -> int:
        if self._bound:
            if first != self.index:
                raise ValueError(f"source {self.name!r} is already part of another workload")
            return 1
        self.index = first
        self._bound = True
        self._on_bind()
        return 1

    def _on_bind(self) -> None:
        """Set up what depends on the source index (hash namespaces)."""

    @property
    def never_ends(self) -> bool:
        """It sends requests until the twin stops it (no end, no cap): a run needs a duration."""
        return False

    def _infos(self) -> Sequence[SourceInfo]:
        return (self._info(),)

    def _info(self) -> SourceInfo:  # pragma: no cover - abstract
        raise NotImplementedError

    def _stats(self) -> WorkloadStats:
        return WorkloadStats(*(getattr(self._st, f) for f in WorkloadStats.__slots__))
