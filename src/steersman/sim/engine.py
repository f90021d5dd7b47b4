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
The running requests are kept lazily (:mod:`steersman.sim.decodeset`: a step costs
O(tail + admitted + finished + preempted), not O(batch)); runs of decode steps are
applied in closed form by :mod:`steersman.sim.decoderuns`; the weights' life cycle
is :mod:`steersman.sim.weights`.

``loading`` until weight bytes per GPU / ``weight_load_gbps`` -> ``warm``.
:meth:`unload` goes back to ``cold``, drops the KV cache and returns running
requests to the waiting queue (they recompute after the next load).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from steersman.config import EngineSettings
from steersman.sim.decodeset import DecodeSetMixin
from steersman.sim.decoderuns import DecodeRunsMixin
from steersman.sim.engine_types import EngineState, StepResult, WeightsState
from steersman.sim.gpus import GpuProfile
from steersman.sim.kvcache import KVPool
from steersman.sim.memory import replica_capacity
from steersman.sim.models import ModelProfile
from steersman.sim.request import ABORTED, RUNNING, WAITING, DecodeClock, SimRequest
from steersman.sim.roofline import Roofline
from steersman.sim.scheduler import Scheduler
from steersman.sim.weights import WeightsMixin

__all__ = ["EngineModel", "StepResult", "EngineState", "WeightsState"]

_heappop = heapq.heappop
_WARM = WeightsState.WARM


class EngineModel(DecodeSetMixin, WeightsMixin, DecodeRunsMixin):
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
        self.gpu, self.model, self.settings = gpu, model, settings
        self.tp = settings.tensor_parallel
        self.block_size = settings.block_size
        cap = replica_capacity(gpu, model, settings, kv_blocks)
        self.max_num_batched_tokens, self.max_num_seqs, self.max_model_len, blocks = cap
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
        #: requests left waiting by the latest step's schedule: what vLLM's num_requests_waiting says while
        #: that step runs (its stats are made per step; a request that arrives meanwhile is not in them)
        self._logged_waiting = 0
        self._slowdown = 1.0
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
        if req.kv_ready:
            if req.max_output < 2:
                raise ValueError("a kv_ready request has its first token already: max_output must be >= 2")
            req._output = 1
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


    # -- a degraded GPU ------------------------------------------------------------
    @property
    def slowdown(self) -> float:
        """Every step lasts this factor x its roofline time (1.0: a healthy GPU)."""
        return self._slowdown

    def set_slowdown(self, factor: float) -> None:
        """From the next step on, every step lasts ``factor`` x its roofline time (a degraded GPU);
        the roofline's compute / memory sides are unchanged (what bounds a step does not change)."""
        if not factor > 0 or factor == float("inf"):
            raise ValueError(f"slowdown must be a positive finite factor, got {factor!r}")
        self._slowdown = float(factor)
        self._ver += 1

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
        self._logged_waiting = s.num_waiting

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
        if self._slowdown != 1.0:
            duration *= self._slowdown
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


    # -- observation -----------------------------------------------------------------
    def state(self, now: float | None = None) -> EngineState:
        """Counters and gauges (vLLM /metrics equivalents); ``now`` resolves a finished load.  O(1)."""
        if now is not None:
            self._warm_at(now)
        s = self._s
        kv = s.kv
        nb = kv.num_blocks
        free = kv.num_free
        waiting = s.num_waiting
        if now is not None and self._logged_waiting < waiting and (now < self._busy_until or self._dec or self._tail):
            # a step is running, or requests run and the next step is due (an engine steps back to back while
            # anything runs; a server's step loop resumes a little after the step's end): vLLM's gauge holds what
            # the latest schedule left waiting; requests that arrived since are the next step's to schedule.
            # Nothing running and no step: the queue as it is (an idle engine about to step, or one that cannot)
            waiting = self._logged_waiting
        return EngineState(
            len(self._dec) + len(self._tail), waiting, nb - free, nb, 1.0 - free / nb if nb else 0.0,
            s.prefix_queries, s.prefix_hits, s.num_preemptions, self.prompt_tokens_total,
            self.generation_tokens_total, self._weights, self._ready_at, self._busy_until, self.num_steps,
        )

    def running(self) -> list[SimRequest]:
        """Running requests in running (admission) order.  O(batch)."""
        return [*self._dec, *self._tail]

    def waiting(self) -> list[SimRequest]:
        return list(self._s.waiting)
