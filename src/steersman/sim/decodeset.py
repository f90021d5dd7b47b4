"""The engine model's running requests as a lazy *decode set* plus a short tail.

for the whole set, and each member's token counts are stored as of the counter
value at which it joined, so ``num_output`` etc. are derived on read.  The set
keeps the aggregates a step needs: its size, its context sum (decode attention),
how many members start a new block at each position within a block (KV
allocation), and a heap of the counter values at which members finish.  A step
costs O(tail + admitted + finished + preempted), not O(batch); so does a
:meth:`commit` of any number of decode steps.  O(batch) remains in: ``outputs``
lists (``step(outputs=True)``, the default, and ``advance``), a step where the
decoding requests do not all get their token with no preemption (token budget
smaller than the batch, KV cache full, a request caching its output blocks
filling one), a preemption under the priority policy, :meth:`running`, and
:meth:`unload`.

Weights: ``cold`` (no step runs, requests queue) -> :meth:`begin_load` ->
"""

from __future__ import annotations

import heapq

from steersman.sim.request import _NEVER, FINISHED, RUNNING, SimRequest
from steersman.sim.scheduler import _priority_key

__all__ = ["DecodeSetMixin"]

_heappush = heapq.heappush


class DecodeSetMixin:
    """The decode-set half of :class:`~steersman.sim.engine.EngineModel` (its state lives there)."""

    def _join(self, r: SimRequest) -> None:
        """``r`` (eager, one token left to compute) joins the decode set at its end."""
        clock = self._clock
        d = clock.d
        off = r._computed - d
        r._base = d
        r._dc = clock
        self._off += off
        g = off % clock.bs
        self._cnt[g] += 1
        ent = [d + r.max_output - r._output, r._rpos, r]
        r._hent = ent
        _heappush(self._heap, ent)
        self._dec[r] = None
        if r._hashing:
            self._cnt_h[g] += 1
            self._n_h += 1
            r._lazyhash = False
        else:
            r._lazyhash = self._s.kv.caching and r._hashed != _NEVER

    def _leave(self, r: SimRequest, mid_step: bool = False) -> None:
        """``r`` leaves the decode set with its progress materialised.

        ``mid_step``: during a step whose decode tokens were bulk-scheduled (it holds the
        block for its next token too).
        """
        clock = self._clock
        d = clock.d
        c = r._computed + d - r._base
        r._output += d - r._base
        r._computed = c
        bs = clock.bs
        r._nblocks = (c + bs) // bs if mid_step else -(-c // bs)
        if r._lazyhash and c // bs > r._hashed:
            r._hashed = _NEVER
        off = c - d
        self._off -= off
        g = off % bs
        self._cnt[g] -= 1
        if r._hashing:
            self._cnt_h[g] -= 1
            self._n_h -= 1
        r._dc = None
        r._hent = None
        del self._dec[r]

    def _materialise_all(self) -> list[SimRequest]:
        """Empty the decode set (progress materialised); returns the running list (decoders + tail)."""
        clock = self._clock
        d = clock.d
        bs = clock.bs
        running = list(self._dec)
        for r in running:
            k = d - r._base
            c = r._computed + k
            r._computed = c
            r._output += k
            r._nblocks = -(-c // bs)
            if r._lazyhash and c // bs > r._hashed:
                r._hashed = _NEVER
            r._dc = None
            r._hent = None
        self._dec.clear()  # in place: callers hold these
        self._off = 0
        self._cnt[:] = [0] * bs
        self._cnt_h[:] = [0] * bs
        self._n_h = 0
        self._heap.clear()
        running.extend(self._tail)
        self._tail = []
        return running

    def _settle_tail(self, tail: list[SimRequest]) -> None:
        """Drop finished tail requests; the leading ones that now decode join the decode set."""
        j = 0
        for r in tail:
            if r.status != RUNNING:
                tail = [r for r in tail if r.status == RUNNING]
                break
        n = len(tail)
        while j < n:
            r = tail[j]
            out = r._output
            if not out or r._computed != r.prompt_len + out - 1:
                break
            self._join(r)
            j += 1
        self._tail = tail[j:] if j else tail

    def _decoder_victim(self, tail: list[SimRequest]) -> SimRequest | None:
        """Priority policy, mid-step: the preemption victim if it is a (bulk-scheduled) decoder."""
        best = None
        bk = None
        for r in self._dec:
            k = (r.priority, r.arrival)
            if best is None or k > bk:  # type: ignore[operator]
                best, bk = r, k
        if best is None or (tail and _priority_key(max(tail, key=_priority_key)) > bk):  # type: ignore[operator]
            return None
        self._leave(best, mid_step=True)
        return best

    def _finish(self, r: SimRequest, end: float) -> None:
        self._s.kv.free(r)
        r.status = FINISHED
        r.finished_at = end
        del self._live[r.req_id]
        if self._keep_done:
            self._remember(r)
