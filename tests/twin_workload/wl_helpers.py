"""A minimal event loop that drives a workload as the twin does (imported as `wl_helpers`)."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable


def drive(w, *, latency: float | Callable = 0.5, window: float = 1.0, until: float = float("inf"),
          max_requests: int | None = None, ok: Callable | None = None, timed: bool = False, start: bool = True, pending=(),
          keep: bool = True):
    """Run ``w`` to completion (or ``until`` / ``max_requests``): every arrival finishes ``latency`` after it arrives.

    Returns (arrivals in arrival order, completions [(arrival, finished_at, ok, followups)], workload seconds).
    ``latency`` may be a function of the arrival; ``ok(arrival) -> bool`` decides failures; ``start=False``
    when the caller already called ``w.start()``;
    ``pending``: arrivals the caller already took from the workload, to run too.  With ``keep=False`` nothing
    is retained: returns ((requests, blocks), [], workload seconds).
    """
    spent = 0.0
    clock = time.perf_counter
    heap: list = []
    seen: list = []
    done: list = []
    counts = [0, 0]
    lat = latency if callable(latency) else (lambda a: latency)

    def push(a):
        if keep:
            seen.append(a)
        else:  # count only: holding every arrival (and its hash tuple) would measure memory, not the workload
            counts[0] += 1
            counts[1] += len(a.block_hashes)
        heapq.heappush(heap, (a.time + lat(a), a.seq, a))

    t0 = clock()
    first = (w.start() if start else []) + list(pending)
    spent += clock() - t0
    for a in first:
        push(a)
    now = 0.0
    while now < until and (max_requests is None or (len(seen) if keep else counts[0]) < max_requests):
        horizon = now + window
        if w.next_time < horizon:
            t0 = clock()
            batch = w.next_batch(horizon)
            spent += clock() - t0
            for a in batch:
                push(a)
        while heap and heap[0][0] < horizon:
            t, _, a = heapq.heappop(heap)
            good = True if ok is None else ok(a)
            t0 = clock()
            fu = w.on_complete(a, t, good)
            spent += clock() - t0
            if keep:
                done.append((a, t, good, fu))
            for b in fu:
                push(b)
        now = horizon
        if w.done and not heap:
            break
    if not keep:
        seen = tuple(counts)
    return (seen, done, spent) if timed else (seen, done)


def content(a) -> tuple:
    """What a request is, independent of when it was sent."""
    return (a.tenant, a.model, a.prompt_tokens, a.block_hashes, a.output_tokens, a.max_tokens, a.slo_class,
            a.deadline_s, a.workflow, a.step, a.steps, a.attempt, a.source)


def common_prefix(a: tuple, b: tuple) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
