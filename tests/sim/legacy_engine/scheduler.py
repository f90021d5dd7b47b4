"""The pre-lazy engine oracle: the scheduler and its queues (verbatim from commit 924c35a; see the package docstring)."""

from __future__ import annotations

from collections import deque
import heapq

from legacy_engine.request import LegacyRequest, RUNNING, WAITING
from legacy_engine.kvcache import KVPool


class FcfsQueue:
    """Waiting queue in arrival order; preempted requests go back to the front.

    Aborted requests are dropped lazily when they reach the front.
    """

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[LegacyRequest] = deque()

    def push(self, req: LegacyRequest) -> None:
        self._q.append(req)

    def push_front(self, req: LegacyRequest) -> None:
        self._q.appendleft(req)

    def peek(self) -> LegacyRequest | None:
        q = self._q
        while q and q[0].status != WAITING:
            q.popleft()
        return q[0] if q else None

    def pop(self) -> LegacyRequest:
        return self._q.popleft()

    def __iter__(self):
        return (r for r in self._q if r.status == WAITING)


class PriorityQueue:
    """Waiting queue ordered by (priority, arrival), lower first (vLLM PriorityRequestQueue)."""

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h: list[tuple[int, float, int, LegacyRequest]] = []

    def push(self, req: LegacyRequest) -> None:
        heapq.heappush(self._h, (req.priority, req.arrival, req.seq, req))

    push_front = push  # a preempted request keeps its place by (priority, arrival)

    def peek(self) -> LegacyRequest | None:
        h = self._h
        while h and h[0][3].status != WAITING:
            heapq.heappop(h)
        return h[0][3] if h else None

    def pop(self) -> LegacyRequest:
        return heapq.heappop(self._h)[3]

    def __iter__(self):
        return (e[3] for e in sorted(self._h) if e[3].status == WAITING)


class Scheduler:
    """The RUNNING list, the WAITING queue and the KV pool of one replica."""

    __slots__ = (
        "kv", "max_tokens", "max_seqs", "priority", "chunked", "running", "waiting", "num_waiting",
        "num_preemptions", "prefix_queries", "prefix_hits",
    )

    def __init__(self, kv: KVPool, max_tokens: int, max_seqs: int, priority: bool, chunked: bool) -> None:
        self.kv = kv
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.priority = priority
        self.chunked = chunked
        self.running: list[LegacyRequest] = []
        self.waiting: FcfsQueue | PriorityQueue = PriorityQueue() if priority else FcfsQueue()
        self.num_waiting = 0
        self.num_preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0

    def add(self, req: LegacyRequest) -> None:
        self.waiting.push(req)
        self.num_waiting += 1

    def preempt(self, req: LegacyRequest) -> None:
        """Free ``req``'s blocks and requeue it at the front with nothing computed."""
        self.kv.free(req)
        req.status = WAITING
        req.num_computed = 0
        req.num_preemptions += 1
        self.waiting.push_front(req)
        self.num_waiting += 1
        self.num_preemptions += 1

    def schedule(self) -> tuple[list[tuple[LegacyRequest, int]], list[LegacyRequest]]:
        """Pick this step's (request, new tokens) and allocate their blocks; also return the preempted."""
        kv = self.kv
        bs = kv.block_size
        running = self.running
        budget = self.max_tokens
        sched: list[tuple[LegacyRequest, int]] = []
        preempted: list[LegacyRequest] = []
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            c = r.num_computed
            n = r.prompt_len + r.num_output - c
            if n > budget:
                n = budget
            end = c + n
            if -(-end // bs) > len(r.blocks):
                victim = None
                while not kv.allocate(r, end):
                    if self.priority:
                        victim = max(running, key=_priority_key)
                        k = running.index(victim)
                        del running[k]
                        if k < i:  # already scheduled this step: give its tokens back
                            j = next(j for j, (q, _) in enumerate(sched) if q is victim)
                            budget += sched.pop(j)[1]
                            i -= 1
                    else:
                        victim = running.pop()
                    self.preempt(victim)
                    preempted.append(victim)
                    if victim is r:
                        break
                if victim is r:
                    break
            if end // bs > r.num_hashed:
                kv.cache(r, end)
            sched.append((r, n))
            budget -= n
            i += 1

        if not preempted and self.num_waiting:
            waiting = self.waiting
            caching = kv.caching
            while budget > 0 and self.num_waiting and len(running) < self.max_seqs:
                r = waiting.peek()
                assert r is not None
                hits = kv.lookup(r) if caching else None
                hit_tokens = len(hits) * bs if hits else 0
                n = r.num_tokens - hit_tokens
                if n > budget:
                    if not self.chunked:
                        break
                    n = budget
                if not kv.allocate(r, hit_tokens + n, hits):
                    break
                waiting.pop()
                self.num_waiting -= 1
                running.append(r)
                r.status = RUNNING
                r.num_computed = hit_tokens
                if r.num_cached_tokens < 0:
                    r.num_cached_tokens = hit_tokens
                if caching:
                    self.prefix_queries += r.num_tokens
                    self.prefix_hits += hit_tokens
                kv.cache(r, hit_tokens + n)
                sched.append((r, n))
                budget -= n
        return sched, preempted

    def head_admissible(self, budget: int) -> bool:
        """Whether the waiting queue's head could be admitted now with ``budget`` tokens left.

        Has no side effect (a failed admission in :meth:`schedule` has none either).
        """
        if budget <= 0 or not self.num_waiting or len(self.running) >= self.max_seqs:
            return False
        r = self.waiting.peek()
        if r is None:
            return False
        kv = self.kv
        hits = kv.lookup(r) if kv.caching else None
        hit_tokens = len(hits) * kv.block_size if hits else 0
        n = r.num_tokens - hit_tokens
        if n > budget:
            if not self.chunked:
                return False
            n = budget
        return kv.blocks_needed(r, hit_tokens + n, hits) <= kv.num_free


def _priority_key(r: LegacyRequest) -> tuple[int, float]:
    return (r.priority, r.arrival)
