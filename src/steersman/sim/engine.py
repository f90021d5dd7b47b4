"""The engine model: one LLM serving replica (a vLLM v1 instance), pure and clock-free.

Time is always passed in (``now``, seconds); nothing here reads a clock or does IO.
A caller drives it:

* the simulated engine HTTP server calls :meth:`EngineModel.step` at
  :meth:`EngineModel.next_event_time`, sleeps ``duration`` and then emits the
  step's ``outputs`` (token results exist at the step's *end*);
* the digital twin does the same in virtual time, and jumps over runs of identical
  decode steps with :meth:`EngineModel.decode_plan` / :meth:`EngineModel.commit`
  (or :meth:`EngineModel.advance`), see :mod:`steersman.sim.macro`.

One step mirrors vLLM's EngineCore.step (vllm/v1/engine/core.py): the scheduler
picks the batch (:mod:`steersman.sim.scheduler`), the forward pass is costed by the
roofline (:mod:`steersman.sim.roofline`) instead of run, and update_from_output
appends one token to every request whose prompt is done and finishes the ones that
reached ``max_output``.

``step`` applies the whole step to the state at once (blocks, computed and output
counts, finished requests), so the state read between steps is the state at the
last step's end.  Requests may be added or aborted at any time; they take effect at
the next step.

Cost.  The running requests are kept as a *decode set* (the ones with one token
left to compute, in running order) followed by a short *tail* (still prefilling).
Decode progress is lazy: an engine-wide decode-step counter advances once per step
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
``loading`` until weight bytes per GPU / ``weight_load_gbps`` -> ``warm``.
:meth:`unload` goes back to ``cold``, drops the KV cache and returns running
requests to the waiting queue (they recompute after the next load).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum

from steersman.config import EngineSettings
from steersman.sim.gpus import GpuProfile
from steersman.sim.kvcache import KVPool
from steersman.sim.macro import DecodePlan, MacroStep, _none
from steersman.sim.memory import batch_limits, num_kv_blocks
from steersman.sim.models import ModelProfile
from steersman.sim.request import _NEVER, ABORTED, FINISHED, RUNNING, WAITING, DecodeClock, SimRequest
from steersman.sim.roofline import Roofline
from steersman.sim.scheduler import Scheduler, _priority_key

__all__ = ["EngineModel", "StepResult", "EngineState", "WeightsState"]

_heappush = heapq.heappush
_heappop = heapq.heappop


class WeightsState(str, Enum):
    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


_WARM = WeightsState.WARM


@dataclass(slots=True)
class StepResult:
    """One step (read-only)."""

    start: float
    duration: float
    end: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_seqs: int
    # (req_id, output tokens so far) per request that produced a token, in running order: O(batch),
    # None when step() was called with outputs=False
    outputs: list[tuple[str, int]] | None
    finished: list[str]
    preempted: list[str]
    compute_s: float  # roofline compute side of this step
    memory_s: float  # roofline memory side of this step
    first_tokens: list[str] = field(default_factory=list)  # produced their first token in this step


@dataclass(slots=True)
class EngineState:
    """Counters and gauges (read-only)."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_usage: float  # vLLM: 1 - free / total (cached blocks with ref 0 are free)
    prefix_queries: int  # tokens looked up in the prefix cache
    prefix_hits: int  # tokens found
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    weights: WeightsState
    weights_ready_at: float | None
    busy_until: float
    num_steps: int


class EngineModel:
    """One replica: ``settings.tensor_parallel`` x ``gpu`` serving ``model``."""

    def __init__(
        self,
        gpu: GpuProfile,
        model: ModelProfile,
        settings: EngineSettings | None = None,
        warm: bool = True,
        now: float = 0.0,
        kv_blocks: int | None = None,
        keep_done: int = 1024,
    ) -> None:
        """``kv_blocks`` overrides the KV capacity computed from memory (tests, what-ifs);
        ``keep_done`` finished / aborted requests stay answerable by :meth:`request`
        (a twin of a thousand replicas may want 0)."""
        settings = settings if settings is not None else EngineSettings()
        if settings.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling_policy {settings.scheduling_policy!r}")
        self.gpu, self.model, self.settings = gpu, model, settings
        self.tp = settings.tensor_parallel
        self.block_size = settings.block_size
        self.max_num_batched_tokens, self.max_num_seqs = batch_limits(gpu, settings)
        self.max_model_len = settings.max_model_len or model.max_context
        if self.max_model_len > model.max_context:
            raise ValueError(f"max_model_len {self.max_model_len} > {model.name}'s {model.max_context} positions")
        blocks = kv_blocks
        if blocks is None:
            blocks = num_kv_blocks(gpu, model, settings, self.max_num_batched_tokens, self.max_num_seqs)
        elif blocks < 1:
            raise ValueError("kv_blocks must be >= 1")
        if blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"max_model_len {self.max_model_len} is larger than the KV cache ({blocks * self.block_size} "
                f"tokens) of {self.tp} x {gpu.name} for {model.name}; lower max_model_len"
            )
        self.roofline = Roofline(gpu, model, self.tp, settings.step_overhead_s)
        self._s = Scheduler(
            KVPool(blocks, self.block_size, settings.enable_prefix_caching),
            self.max_num_batched_tokens,
            self.max_num_seqs,
            settings.scheduling_policy == "priority",
            settings.enable_chunked_prefill,
        )
        self._live: dict[str, SimRequest] = {}
        self._done: OrderedDict[str, SimRequest] = OrderedDict()
        self._keep_done = keep_done
        self._seq = 0
        self._weights = WeightsState.WARM if warm else WeightsState.COLD
        self._ready_at: float | None = now if warm else None
        self._busy_until = now
        self.num_steps = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # Running requests = the decode set (running order) + the tail (prefilling, running order).
        bs = self.block_size
        self._clock = DecodeClock(bs)
        self._dec: dict[SimRequest, None] = {}
        self._tail: list[SimRequest] = []
        self._off = 0  # sum over the decode set of computed - counter (context sum = off + n (d + 1))
        self._cnt = [0] * bs  # decode-set members by (computed - counter) % block_size
        self._cnt_h = [0] * bs  # the same, for members that cache their output blocks
        self._n_h = 0
        self._heap: list[list] = []  # [counter value at which it finishes, running position, request]
        self._ver = 0  # bumped by every change: a DecodePlan is valid only for the version it saw

    # -- requests ------------------------------------------------------------------
    @property
    def kv(self) -> KVPool:
        return self._s.kv

    def add(self, req: SimRequest) -> None:
        """Queue ``req``; ValueError if it can never run here."""
        if req.req_id in self._live:
            raise ValueError(f"duplicate request id {req.req_id!r}")
        if req.prompt_len < 1 or req.max_output < 1:
            raise ValueError("prompt_len and max_output must be >= 1")
        total = req.prompt_len + req.max_output
        if total > self.max_model_len:
            raise ValueError(
                f"prompt ({req.prompt_len}) + max_output ({req.max_output}) = {total} tokens exceeds "
                f"max_model_len {self.max_model_len}"
            )
        bs = self.block_size
        s = self._s
        if -(-(total - 1) // bs) > s.kv.num_blocks:
            raise ValueError(f"request needs more KV blocks than the replica has ({s.kv.num_blocks})")
        if not s.chunked and total - 1 > self.max_num_batched_tokens:
            raise ValueError("without chunked prefill a request must fit max_num_batched_tokens")
        if len(req.block_hashes) > req.prompt_len // bs:
            raise ValueError("more block hashes than full prompt blocks")
        if req.output_token_ids is not None and len(req.prompt_tail) != req.prompt_len % bs:
            raise ValueError("output_token_ids needs prompt_tail = the prompt tokens after its last full block")
        if req.status != WAITING or req._computed or req._output or req._dc is not None:
            raise ValueError("request was already used")
        self._seq += 1
        req.seq = self._seq
        req._hashing = s.kv.caching and req.can_hash_output(bs)
        self._live[req.req_id] = req
        s.add(req)
        self._ver += 1

    def abort(self, req_id: str) -> bool:
        """Drop a request wherever it is (client gone); frees its blocks. False if unknown or done."""
        req = self._live.pop(req_id, None)
        if req is None:
            return False
        self._ver += 1
        s = self._s
        if req.status == RUNNING:
            if req._dc is not None:
                self._leave(req)
            else:
                self._tail.remove(req)
            s.kv.free(req)
        else:  # waiting: removed lazily from the queue
            s.num_waiting -= 1
        req.status = ABORTED
        self._remember(req)
        return True

    def request(self, req_id: str) -> SimRequest | None:
        """A live request, or one of the last ``keep_done`` finished / aborted ones."""
        return self._live.get(req_id) or self._done.get(req_id)

    def _remember(self, req: SimRequest) -> None:
        if self._keep_done:
            done = self._done
            done[req.req_id] = req
            if len(done) > self._keep_done:
                done.popitem(last=False)

    def has_work(self) -> bool:
        return bool(self._dec) or bool(self._tail) or self._s.num_waiting > 0

    # -- the lazy decode set ------------------------------------------------------------
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

    # -- weights -------------------------------------------------------------------
    @property
    def weights(self) -> WeightsState:
        return self._weights

    def load_seconds(self) -> float:
        return self.model.weight_bytes_per_gpu(self.tp) / (self.settings.weight_load_gbps * 1e9)

    def begin_load(self, now: float) -> float:
        """Start loading weights (no-op unless cold); returns when they are ready."""
        if self._weights is WeightsState.COLD:
            self._weights = WeightsState.LOADING
            self._ready_at = now + self.load_seconds()
            self._ver += 1
        assert self._ready_at is not None
        return self._ready_at

    def unload(self) -> None:
        """Weights gone: cold, KV cache dropped, running requests back to waiting (front, in order)."""
        s = self._s
        for req in reversed(self._materialise_all()):
            s.preempt(req)
            s.num_preemptions -= 1  # not a scheduler preemption
            req.num_preemptions -= 1
        s.kv.reset()
        self._weights = WeightsState.COLD
        self._ready_at = None
        self._ver += 1

    def _warm_at(self, now: float) -> bool:
        if self._weights is WeightsState.LOADING and now >= self._ready_at:  # type: ignore[operator]
            self._weights = WeightsState.WARM
        return self._weights is WeightsState.WARM

    def next_event_time(self, now: float) -> float | None:
        """When the next step could start, or None (idle, or cold with nothing loading)."""
        if not self.has_work() or self._weights is WeightsState.COLD:
            return None
        t = now if now > self._busy_until else self._busy_until
        if self._weights is WeightsState.LOADING and self._ready_at > t:  # type: ignore[operator]
            t = self._ready_at  # type: ignore[assignment]
        return t

    # -- stepping ------------------------------------------------------------------
    def step(self, now: float, outputs: bool = True) -> StepResult | None:
        """Schedule and cost ONE step starting at max(now, end of the previous step).

        None if nothing can run (no work, or weights not warm at ``now``).
        ``outputs=False`` leaves ``StepResult.outputs`` None (listing it is O(batch));
        ``first_tokens`` and ``finished`` are always there.
        """
        if self._weights is not _WARM and not self._warm_at(now):
            return None
        s = self._s
        dec = self._dec
        if not dec and not self._tail and not s.num_waiting:
            return None
        start = now if now > self._busy_until else self._busy_until
        self._ver += 1
        kv = s.kv
        clock = self._clock
        d = clock.d
        bs = clock.bs
        n = len(dec)
        if n:
            takers = self._cnt[-d % bs]  # members whose next token starts a block
            if n > s.max_tokens or takers > kv.num_free or (self._n_h and self._cnt_h[(-d - 1) % bs]):
                # not every decoder gets its token without preemption, or an output block fills: one by one
                self._tail = self._materialise_all()
                n = 0
            elif takers:
                kv.take(takers)
        tail = self._tail
        sched: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        budget = s.max_tokens - n
        if tail:
            budget = s.schedule_running(
                tail, budget, sched, preempted, self._decoder_victim if (n and s.priority) else None
            )
            n = len(dec)  # a decoder may have been preempted (priority)
        if not preempted and s.num_waiting and budget > 0:
            budget = s.admit(budget, tail, n + len(tail), sched)
        if not n and not sched and not preempted:
            self._settle_tail(tail)
            return None

        # cost: decode set in closed form, the others one by one
        tokens = sampled = n_dec = n
        dkv = self._off + n * (d + 1) if n else 0
        pkv = 0
        pairs = 0.0
        produced = []
        for r, k in sched:
            c = r._computed
            new = c + k
            r._computed = new
            tokens += k
            if r.first_scheduled_at is None:
                r.first_scheduled_at = start
            if new >= r.prompt_len + r._output:
                sampled += 1
                produced.append(r)
                if k == 1 and r._output:
                    dkv += new
                    n_dec += 1
                    continue
            pairs += k * (c + 0.5 * k)
            pkv += new
        duration, compute_s, memory_s = self.roofline.cost(tokens, pairs, pkv, dkv, sampled)
        end = start + duration

        # update: the decode set advances one token; the others produce one by one
        d1 = d + 1
        clock.d = d1
        outs = [(r.req_id, r._output + d1 - r._base) for r in dec] if outputs else None
        finished = []
        heap = self._heap
        while heap and heap[0][0] <= d1:
            ent = _heappop(heap)
            r = ent[2]
            if r._hent is ent:
                self._leave(r)
                self._finish(r, end)
                finished.append(r.req_id)
        first = []
        for r in produced:
            out = r._output + 1
            r._output = out
            if outs is not None:
                outs.append((r.req_id, out))
            if out == 1:
                r.first_token_at = end
                self.prompt_tokens_total += r.prompt_len
                first.append(r.req_id)
            if out >= r.max_output:
                self._finish(r, end)
                finished.append(r.req_id)
        if tail:
            self._settle_tail(tail)
        self.generation_tokens_total += sampled
        self._busy_until = end
        self.num_steps += 1
        return StepResult(
            start, duration, end, tokens - n_dec, n_dec, n + len(sched), outs, finished,
            [r.req_id for r in preempted], compute_s, memory_s, first,
        )

    # -- runs of decode steps in closed form (see steersman.sim.macro) ----------------------
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

    # -- observation -----------------------------------------------------------------
    def state(self, now: float | None = None) -> EngineState:
        """Counters and gauges (vLLM /metrics equivalents); ``now`` resolves a finished load.  O(1)."""
        if now is not None:
            self._warm_at(now)
        s = self._s
        kv = s.kv
        nb = kv.num_blocks
        free = kv.num_free
        return EngineState(
            len(self._dec) + len(self._tail), s.num_waiting, nb - free, nb, 1.0 - free / nb if nb else 0.0,
            s.prefix_queries, s.prefix_hits, s.num_preemptions, self.prompt_tokens_total,
            self.generation_tokens_total, self._weights, self._ready_at, self._busy_until, self.num_steps,
        )

    def running(self) -> list[SimRequest]:
        """Running requests in running (admission) order.  O(batch)."""
        return [*self._dec, *self._tail]

    def waiting(self) -> list[SimRequest]:
        return list(self._s.waiting)
