"""Continuous batching as vLLM v1's scheduler does it (vllm/v1/core/sched/scheduler.py).

There are no prefill and decode phases, only requests whose computed tokens catch
up with their tokens (prompt + output).  Each step has a token budget
(``max_num_batched_tokens``):

1. RUNNING requests, in admission order: each gets min(remaining, budget) tokens
   (1 for a decode, the next chunk for one still prefilling).  If its new blocks do
   not fit, the lowest-priority running request is preempted -- FCFS: the last
   admitted; priority: max (priority, arrival) -- its blocks are freed, its computed
   tokens reset to 0 and it goes back to the *front* of the waiting queue (it will
   re-prefill prompt + generated tokens, "recompute").  Repeat until it fits or it
   preempted itself.
2. Only if nothing was preempted this step: WAITING requests, in queue order (FCFS,
   or (priority, arrival) with ``scheduling_policy == "priority"``), while budget
   remains and fewer than ``max_num_seqs`` run: look up the prefix cache (longest run
   of cached leading blocks; those tokens skip prefill), give it a chunk of
   min(uncached tokens, budget) and its blocks, or stop at the first that does not
   fit (head-of-line blocking, as vLLM).  Without chunked prefill a request whose
   uncached tokens exceed the remaining budget also stops admission.

After the forward pass every request whose computed tokens reach its token count
produces one token; one that reaches ``max_output`` finishes and frees its blocks.

The RUNNING list is always decoding requests (one token left to compute) followed
by a few still prefilling: a request is admitted only in a step whose budget was not
used up, so every request before it got all its remaining tokens.  The engine
(:mod:`steersman.sim.engine`) keeps the decoding ones lazily and schedules them in
bulk; this module holds the waiting queue, admission, and the per-request loop of
step 1 (:meth:`Scheduler.schedule_running`) for the requests it does not bulk.
"""

from __future__ import annotations

import heapq
from collections import deque

from steersman.sim.kvcache import KVPool
from steersman.sim.request import RUNNING, WAITING, SimRequest

__all__ = ["Scheduler", "FcfsQueue", "PriorityQueue"]



class FcfsQueue:
    """Waiting queue in arrival order; preempted requests go back to the front.

    Aborted requests are dropped lazily when they reach the front.
    """

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[SimRequest] = deque()

    def push(self, req: SimRequest) -> None:
        self._q.append(req)

    def push_front(self, req: SimRequest) -> None:
        self._q.appendleft(req)

    def peek(self) -> SimRequest | None:
        q = self._q
        while q and q[0].status != WAITING:
            q.popleft()
        return q[0] if q else None

    def pop(self) -> SimRequest:
        return self._q.popleft()

    def __iter__(self):
        return (r for r in self._q if r.status == WAITING)


class PriorityQueue:
    """Waiting queue ordered by (priority, arrival), lower first (vLLM PriorityRequestQueue)."""

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h: list[tuple[int, float, int, SimRequest]] = []

    def push(self, req: SimRequest) -> None:
        heapq.heappush(self._h, (req.priority, req.arrival, req.seq, req))

    push_front = push  # a preempted request keeps its place by (priority, arrival)

    def peek(self) -> SimRequest | None:
        h = self._h
        while h and h[0][3].status != WAITING:
            heapq.heappop(h)
        return h[0][3] if h else None

    def pop(self) -> SimRequest:
        return heapq.heappop(self._h)[3]

    def __iter__(self):
        return (e[3] for e in sorted(self._h) if e[3].status == WAITING)


class Scheduler:
    """The WAITING queue, admission and preemption of one replica, over its KV pool."""

    __slots__ = (
        "kv", "max_tokens", "max_seqs", "priority", "chunked", "waiting", "num_waiting",
        "num_preemptions", "prefix_queries", "prefix_hits", "_rpos",
    )

    def __init__(self, kv: KVPool, max_tokens: int, max_seqs: int, priority: bool, chunked: bool) -> None:
        self.kv = kv
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.priority = priority
        self.chunked = chunked
        self.waiting: FcfsQueue | PriorityQueue = PriorityQueue() if priority else FcfsQueue()
        self.num_waiting = 0
        self.num_preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._rpos = 0  # admissions so far: running order

    def add(self, req: SimRequest) -> None:
        self.waiting.push(req)
        self.num_waiting += 1

    def preempt(self, req: SimRequest) -> None:
        """Free ``req``'s blocks and requeue it at the front with nothing computed.

        ``req`` must not be decoding lazily (the engine materialises it first).
        """
        self.kv.free(req)
        req.status = WAITING
        req._computed = 0
        req.num_preemptions += 1
        self.waiting.push_front(req)
        self.num_waiting += 1
        self.num_preemptions += 1

    # -- step 1, request by request ----------------------------------------------------
    def schedule_running(
        self, running: list[SimRequest], budget: int, sched: list, preempted: list, victim_of=None
    ) -> int:
        """Step 1 over ``running`` (eager requests, in running order): append (request, tokens) to
        ``sched`` and victims to ``preempted``; returns the budget left.

        ``victim_of`` (priority policy, when the engine bulk-schedules its decoding
        requests outside ``running``): returns the victim if it is one of those (taken
        out of the engine's decode set, materialised, not yet freed), or None when the
        victim is in ``running`` (then picked here).
        """
        i = 0
        kv = self.kv
        bs = kv.block_size
        while i < len(running) and budget > 0:
            r = running[i]
            c = r._computed
            n = r.prompt_len + r._output - c
            if n > budget:
                n = budget
            end = c + n
            if -(-end // bs) > r._nblocks:
                victim = None
                while not kv.extend(r, end):
                    if self.priority:
                        if victim_of is not None:
                            v = victim_of(running)
                            if v is not None:  # a bulk-scheduled decoder: its token given back
                                self.preempt(v)
                                preempted.append(v)
                                budget += 1
                                victim = v
                                continue
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
            else:
                kv.extend(r, end)  # no new block: caches the block it fills, if any
            sched.append((r, n))
            budget -= n
            i += 1
        return budget

    # -- step 2 ---------------------------------------------------------------------------
    def admit(self, budget: int, running: list[SimRequest], num_running: int, sched: list) -> int:
        """Admit waiting requests (appended to ``running`` and ``sched``); returns the budget left."""
        waiting = self.waiting
        kv = self.kv
        bs = kv.block_size
        caching = kv.caching
        chunked = self.chunked
        max_seqs = self.max_seqs
        while budget > 0 and self.num_waiting and num_running < max_seqs:
            r = waiting.peek()
            assert r is not None
            ready = r.kv_ready and r._output == 1 and not r.num_preemptions
            if ready:  # KV transferred in: blocks for prompt + first token, nothing computed but that token
                got = kv.admit(r, r.prompt_len + 1, True)
            else:
                got = kv.admit(r, budget, chunked)
            if got is None:
                break
            hits, n = got
            if ready:
                n = 1
            waiting.pop()
            self.num_waiting -= 1
            running.append(r)
            num_running += 1
            r.status = RUNNING
            self._rpos += 1
            r._rpos = self._rpos
            hit_tokens = hits * bs
            r._computed = hit_tokens if not ready else r.prompt_len
            if r.num_cached_tokens < 0:
                r.num_cached_tokens = hit_tokens
            if caching and not ready:
                self.prefix_queries += r.prompt_len + r._output
                self.prefix_hits += hit_tokens
            sched.append((r, n))
            budget -= n
        return budget

    def head_admissible(self, budget: int, num_running: int) -> bool:
        """Whether the waiting queue's head could be admitted now with ``budget`` tokens left.

        Has no side effect (a failed admission in :meth:`admit` has none either).
        """
        if budget <= 0 or not self.num_waiting or num_running >= self.max_seqs:
            return False
        r = self.waiting.peek()
        if r is None:
            return False
        kv = self.kv
        ntok = r.prompt_len + r._output
        if r.kv_ready and r._output == 1 and not r.num_preemptions:  # blocks only, one token of budget
            return kv.num_free * kv.block_size >= ntok or kv.admit(r, ntok, True, dry=True) is not None
        if (self.chunked or ntok <= budget) and kv.num_free * kv.block_size >= ntok:
            return True  # fits even without a single cache hit
        return kv.admit(r, budget, self.chunked, dry=True) is not None


def _priority_key(r: SimRequest) -> tuple[int, float]:
    return (r.priority, r.arrival)
