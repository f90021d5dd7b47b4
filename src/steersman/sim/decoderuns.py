"""The engine model's runs of plain decode steps in closed form (the math is in :mod:`steersman.sim.macro`).

:meth:`DecodeRunsMixin.decode_plan` describes the longest run of identical decode
steps from the next step, :meth:`DecodeRunsMixin.commit` applies the first k of
them at O(block size + finishing requests), :meth:`DecodeRunsMixin.advance` is both
up to a time.
"""

from __future__ import annotations

import heapq

from steersman.sim.engine_types import WeightsState
from steersman.sim.macro import DecodePlan, MacroStep, _none
from steersman.sim.request import _NEVER

__all__ = ["DecodeRunsMixin"]

_heappop = heapq.heappop
_WARM = WeightsState.WARM


class DecodeRunsMixin:
    """The closed-form decode-run half of :class:`~steersman.sim.engine.EngineModel` (its state lives there)."""

    def decode_plan(self, now: float) -> DecodePlan | None:
        """The longest run of plain decode steps starting at max(now, end of the previous step).

        Changes nothing (but resolves a finished weight load, as every call given ``now``).
        None when the next step is not a plain decode step: something is prefilling, a
        waiting request could be admitted, the step would preempt, or nothing runs;
        call :meth:`step` then.  O(1) (O(block size) when the KV cache may run out
        during the run), plus a prefix-cache lookup of the waiting queue's head.
        """
        if self._weights is not _WARM and not self._warm_at(now):
            return None
        dec = self._dec
        if self._tail or not dec:
            return None
        s = self._s
        n = len(dec)
        budget = s.max_tokens - n
        if budget < 0 or (s.num_waiting and s.head_admissible(budget, n)):
            return None
        d = self._clock.d
        bs = self.block_size
        free = s.kv.num_free
        cnt = self._cnt
        w0 = cnt[-d % bs]
        if w0 > free:
            return None  # the next step preempts
        heap = self._heap
        top = heap[0]
        while top[2]._hent is not top:
            _heappop(heap)
            top = heap[0]
        k_fin = k = top[0] - d
        if n * ((k + bs - 1) // bs) > free:  # the KV cache may run out first: largest k whose new blocks fit
            q = free // n
            rest = free - n * q
            r = 0
            acc = w0
            while acc <= rest:
                r += 1
                acc += cnt[(-d - r) % bs]
            if q * bs + r < k:
                k = q * bs + r
        busy = self._busy_until
        d0, sl, c0, cs, m0, ms = self.roofline.decode_line(n, self._off + n * (d + 1))
        slow = self._slowdown
        if slow != 1.0:
            d0 *= slow
            sl *= slow
        return DecodePlan(now if now > busy else busy, d0, sl, k, n, c0, cs, m0, ms, k_fin, self._ver)

    def commit(self, plan: DecodePlan, steps: int, outputs: bool = False) -> MacroStep:
        """Apply the first ``steps`` (1 <= steps <= plan.max_steps) steps of ``plan``.

        The plan must come from the last :meth:`decode_plan` with no change since
        (ValueError otherwise).  O(1 + finishing requests); ``outputs=True`` lists every
        running request's output count (O(batch)).
        """
        if plan._ver != self._ver or not 0 < steps <= plan.max_steps:
            if plan._ver != self._ver:
                raise ValueError("stale DecodePlan: the engine changed since decode_plan()")
            raise ValueError(f"steps must be in 1..{plan.max_steps}, got {steps}")
        self._ver += 1
        k = steps
        clock = self._clock
        d = clock.d
        dec = self._dec
        n = len(dec)
        if self._n_h and self._fills_within(k, d):
            self._commit_one_by_one(k)
        else:
            bs = clock.bs
            q, r = divmod(k, bs)
            total = n * q
            if r:  # members whose block boundary comes within the last r steps: a cyclic range of _cnt
                cnt = self._cnt
                hi = -d % bs + 1
                lo = hi - r
                total += sum(cnt[lo:hi]) if lo >= 0 else sum(cnt[:hi]) + sum(cnt[lo:])
            if total:
                self._s.kv.take(total)
            clock.d = d + k
        d_end = clock.d
        end = plan.start + k * plan.first_duration + plan.slope * k * (k - 1) / 2
        outs = [(r.req_id, r._output + d_end - r._base) for r in dec] if outputs else None
        finished = []
        if k == plan.finish_steps:
            heap = self._heap
            while heap and heap[0][0] <= d_end:
                ent = _heappop(heap)
                r = ent[2]
                if r._hent is ent:
                    self._leave(r)
                    self._finish(r, end)
                    finished.append(r.req_id)
        self.generation_tokens_total += n * k
        self.num_steps += k
        self._busy_until = end
        self._logged_waiting = self._s.num_waiting
        tri = k * (k - 1) / 2
        return MacroStep(
            k, plan.start, end, n, plan.first_duration, plan.slope, outs, finished,
            k * plan.compute_s + plan.compute_slope * tri, k * plan.memory_s + plan.memory_slope * tri,
        )

    def _fills_within(self, k: int, d: int) -> bool:
        """Whether a member caching its output blocks fills one in the next k decode steps."""
        bs = self.block_size
        if k >= bs:
            return True
        ch = self._cnt_h
        return any(ch[(-d - 1 - j) % bs] for j in range(k))

    def _commit_one_by_one(self, k: int) -> None:
        """k decode steps with output blocks filling: blocks taken and cached in step() order.

        Events (step, position in running, 0 = new block / 1 = block full): a new block is
        taken when token position c + j starts a block; a block is cached when position
        c + j ends one.  Interleaving matters once output blocks are hashed: a take may
        evict a cached block whose hash a later fill registers again.
        """
        running = self._materialise_all()
        kv = self._s.kv
        bs = self.block_size
        events = []
        for i, r in enumerate(running):
            c = r._computed
            for j in range((-c) % bs, k, bs):
                events.append((j, i, 0))
            if r._hashing:
                for j in range((-c - 1) % bs, k, bs):
                    events.append((j, i, 1))
        events.sort()
        for j, i, kind in events:
            r = running[i]
            if kind == 0:
                if (r._computed + j) // bs >= r._nblocks:
                    kv.take(1)
                    r._nblocks += 1
            else:
                end = r._computed + j + 1
                if end // bs > r._hashed:
                    kv.cache(r, end)
        for r in running:
            c = r._computed + k
            r._computed = c
            r._output += k
            r._nblocks = -(-c // bs)
            if r._lazyhash and c // bs > r._hashed:
                r._hashed = _NEVER
        self._settle_tail(running)

    def advance(self, now: float, until: float, outputs: bool = True) -> MacroStep:
        """Run the decode steps of :meth:`decode_plan` that start before ``until`` (the caller's
        next event), in closed form; ``steps`` 0 if there is no plan (call :meth:`step`)."""
        start = now if now > self._busy_until else self._busy_until
        if not self._warm_at(now) or start >= until:
            return _none(start)
        plan = self.decode_plan(now)
        if plan is None:
            return _none(start)
        k = plan.steps_before(until)
        if k == 0:
            return _none(start)
        return self.commit(plan, k, outputs)
