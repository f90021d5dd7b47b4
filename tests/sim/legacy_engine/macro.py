"""The pre-lazy engine oracle: closed-form decode runs (advance) (verbatim from commit 924c35a; see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from legacy_engine.request import FINISHED, RUNNING, _NEVER
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from legacy_engine.engine import LegacyEngineModel


@dataclass(frozen=True, slots=True)
class MacroStep:
    steps: int  # 0: the next step is not a plain decode step (call step())
    start: float
    end: float
    num_seqs: int  # requests decoding in every step
    first_duration: float  # step j lasts first_duration + duration_slope * j
    duration_slope: float
    outputs: list[tuple[str, int]]  # (req_id, output tokens so far) at the end, every running request
    finished: list[str]  # finished at the end of the last step
    compute_s: float  # summed over the steps
    memory_s: float


def _none(t: float) -> MacroStep:
    return MacroStep(0, t, t, 0, 0.0, 0.0, [], [], 0.0, 0.0)


def _steps_before(start: float, d0: float, slope: float, until: float, cap: int) -> int:
    """Largest k <= cap such that step k-1 starts before ``until`` (start_j = start + j d0 + slope j(j-1)/2)."""
    if until == math.inf:
        return cap

    def start_of(j: int) -> float:
        return start + j * d0 + slope * j * (j - 1) / 2

    # solve slope/2 j^2 + (d0 - slope/2) j + (start - until) = 0 for the last j with start_of(j) < until
    a, b, c = slope / 2, d0 - slope / 2, start - until
    j = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a) if a > 0 else -c / b
    j = min(int(j), cap)
    while j > 0 and start_of(j) >= until:
        j -= 1
    while j + 1 < cap and start_of(j + 1) < until:
        j += 1
    return min(j + 1, cap)


def advance(eng: LegacyEngineModel, now: float, until: float) -> MacroStep:
    start = now if now > eng._busy_until else eng._busy_until
    if not eng._warm_at(now) or start >= until:
        return _none(start)
    s = eng._s
    running = s.running
    n = len(running)
    if n == 0 or n > s.max_tokens:
        return _none(start)
    if s.head_admissible(s.max_tokens - n):  # cheap, and the usual reason to refuse
        return _none(start)
    kv = s.kv
    bs = kv.block_size
    # One pass: all decoding? context sum, tokens left, and block phases.  Newly
    # admitted (still prefilling) requests sit at the end: look there first.
    ctx = n
    min_left = _NEVER
    phase = [0] * bs  # requests by computed % bs
    base = 0  # sum of computed // bs - blocks held
    hashing = False  # does any request cache its output blocks?
    for r in reversed(running):
        c = r.num_computed
        out = r.num_output
        if c != r.prompt_len + out - 1 or not out:
            return _none(start)
        ctx += c
        left = r.max_output - out
        if left < min_left:
            min_left = left
        phase[c % bs] += 1
        base += c // bs - len(r.blocks)
        if r.output_token_ids is not None and r.num_hashed != _NEVER:
            hashing = True

    roof = eng.roofline
    d0, c0, m0 = roof.cost(n, 0.0, 0, ctx, n)
    d1, c1, m1 = roof.cost(n, 0.0, 0, ctx + n, n)
    slope = d1 - d0
    k = _steps_before(start, d0, slope, until, min_left)

    # Blocks: a request with c = q*bs + p computed holds ceil((c + k) / bs) = q + ceil((p + k) / bs) after k steps.
    def blocks_for(k: int) -> int:
        return base + sum(cnt * ((p + k + bs - 1) // bs) for p, cnt in enumerate(phase) if cnt)

    free = kv.num_free
    if blocks_for(k) > free:
        lo, hi = 0, k  # blocks_for(lo) <= free < blocks_for(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if blocks_for(mid) <= free:
                lo = mid
            else:
                hi = mid
        k = lo
    if k == 0:
        return _none(start)

    if hashing:
        _blocks_in_step_order(running, kv, k)
    end = start + k * d0 + slope * k * (k - 1) / 2
    outputs = []
    done = []
    total = 0
    caching = kv.caching
    for r in running:
        c = r.num_computed
        if not hashing:
            need = (c + k + bs - 1) // bs - len(r.blocks)
            if need > 0:
                total += need
                r.blocks += [None] * need
            if caching and r.num_hashed != _NEVER and (-c - 1) % bs < k:
                r.num_hashed = _NEVER  # step() finds no hash for the block that fills
        r.num_computed = c + k
        out = r.num_output + k
        r.num_output = out
        outputs.append((r.req_id, out))
        if out >= r.max_output:
            done.append(r)
    if total:
        kv.take(total)
    finished = []
    if done:  # freed at the end of the last step, in running order, as step() does
        for r in done:
            kv.free(r)
            r.status = FINISHED
            r.finished_at = end
            finished.append(r.req_id)
            del eng._live[r.req_id]
            eng._remember(r)
        s.running = [r for r in running if r.status == RUNNING]
    eng.generation_tokens_total += n * k
    eng.num_steps += k
    eng._busy_until = end
    tri = k * (k - 1) / 2
    return MacroStep(
        k, start, end, n, d0, slope, outputs, finished, k * c0 + (c1 - c0) * tri, k * m0 + (m1 - m0) * tri
    )


def _blocks_in_step_order(running: list, kv, k: int) -> None:
    """Allocate and cache the blocks of k decode steps in exactly the order step() would.

    Events (step, position in running, 0 = new block / 1 = block full): a new block is
    taken when token position c + j starts a block; a block is cached when position
    c + j ends one.  Interleaving matters once output blocks are hashed: a take may
    evict a cached block whose hash a later fill registers again.
    """
    bs = kv.block_size
    events = []
    for i, r in enumerate(running):
        c = r.num_computed
        for j in range((-c) % bs, k, bs):
            events.append((j, i, 0))
        if r.num_hashed != _NEVER:
            for j in range((-c - 1) % bs, k, bs):
                events.append((j, i, 1))
    events.sort()
    for j, i, kind in events:
        r = running[i]
        if kind == 0:
            if (r.num_computed + j) // bs >= len(r.blocks):
                kv.take(1)
                r.blocks.append(None)
        else:
            end = r.num_computed + j + 1
            if end // bs > r.num_hashed:
                kv.cache(r, end)
