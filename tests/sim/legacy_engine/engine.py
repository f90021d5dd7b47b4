"""The pre-lazy engine oracle: the engine model (verbatim from commit 924c35a; see the package docstring)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from steersman.config import EngineSettings
from steersman.sim.gpus import GpuProfile
from steersman.sim.memory import batch_limits, num_kv_blocks
from steersman.sim.models import ModelProfile
from steersman.sim.roofline import Roofline

from legacy_engine.request import ABORTED, FINISHED, LegacyRequest, RUNNING, WAITING
from legacy_engine.kvcache import KVPool
from legacy_engine.scheduler import Scheduler
from legacy_engine.macro import MacroStep, advance


class WeightsState(str, Enum):
    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


@dataclass(frozen=True, slots=True)
class StepResult:
    start: float
    duration: float
    end: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_seqs: int
    outputs: list[tuple[str, int]]  # (req_id, output tokens so far) per request that produced a token
    finished: list[str]
    preempted: list[str]
    compute_s: float  # roofline compute side of this step
    memory_s: float  # roofline memory side of this step


@dataclass(frozen=True, slots=True)
class EngineState:
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


class LegacyEngineModel:
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
        self._live: dict[str, LegacyRequest] = {}
        self._done: OrderedDict[str, LegacyRequest] = OrderedDict()
        self._keep_done = keep_done
        self._seq = 0
        self._weights = WeightsState.WARM if warm else WeightsState.COLD
        self._ready_at: float | None = now if warm else None
        self._busy_until = now
        self.num_steps = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    # -- requests ------------------------------------------------------------------
    @property
    def kv(self) -> KVPool:
        return self._s.kv

    def add(self, req: LegacyRequest) -> None:
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
        if -(-(total - 1) // bs) > self._s.kv.num_blocks:
            raise ValueError(f"request needs more KV blocks than the replica has ({self._s.kv.num_blocks})")
        if not self._s.chunked and total - 1 > self.max_num_batched_tokens:
            raise ValueError("without chunked prefill a request must fit max_num_batched_tokens")
        if len(req.block_hashes) > req.prompt_len // bs:
            raise ValueError("more block hashes than full prompt blocks")
        if req.output_token_ids is not None and len(req.prompt_tail) != req.prompt_len % bs:
            raise ValueError("output_token_ids needs prompt_tail = the prompt tokens after its last full block")
        if req.status != WAITING or req.num_computed or req.num_output:
            raise ValueError("request was already used")
        self._seq += 1
        req.seq = self._seq
        self._live[req.req_id] = req
        self._s.add(req)

    def abort(self, req_id: str) -> bool:
        """Drop a request wherever it is (client gone); frees its blocks. False if unknown or done."""
        req = self._live.pop(req_id, None)
        if req is None:
            return False
        s = self._s
        if req.status == RUNNING:
            s.running.remove(req)
            s.kv.free(req)
        else:  # waiting: removed lazily from the queue
            s.num_waiting -= 1
        req.status = ABORTED
        self._remember(req)
        return True

    def request(self, req_id: str) -> LegacyRequest | None:
        """A live request, or one of the last ``keep_done`` finished / aborted ones."""
        return self._live.get(req_id) or self._done.get(req_id)

    def _remember(self, req: LegacyRequest) -> None:
        if self._keep_done:
            done = self._done
            done[req.req_id] = req
            if len(done) > self._keep_done:
                done.popitem(last=False)

    def has_work(self) -> bool:
        return bool(self._s.running) or self._s.num_waiting > 0

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
        assert self._ready_at is not None
        return self._ready_at

    def unload(self) -> None:
        """Weights gone: cold, KV cache dropped, running requests back to waiting (front, in order)."""
        s = self._s
        for req in reversed(s.running):
            s.preempt(req)
            s.num_preemptions -= 1  # not a scheduler preemption
            req.num_preemptions -= 1
        s.running.clear()
        s.kv.reset()
        self._weights = WeightsState.COLD
        self._ready_at = None

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
    def step(self, now: float) -> StepResult | None:
        """Schedule and cost ONE step starting at max(now, end of the previous step).

        None if nothing can run (no work, or weights not warm at ``now``).
        """
        if not self._warm_at(now):
            return None
        s = self._s
        if not s.running and not s.num_waiting:
            return None
        start = now if now > self._busy_until else self._busy_until
        sched, preempted = s.schedule()
        if not sched and not preempted:
            return None
        tokens = sampled = pkv = dkv = n_dec = 0
        pairs = 0.0
        produced = []
        for r, n in sched:
            c = r.num_computed
            new = c + n
            r.num_computed = new
            tokens += n
            if r.first_scheduled_at is None:
                r.first_scheduled_at = start
            if new >= r.prompt_len + r.num_output:
                sampled += 1
                produced.append(r)
                if n == 1 and r.num_output:
                    dkv += new
                    n_dec += 1
                    continue
            pairs += n * (c + 0.5 * n)
            pkv += new
        duration, compute_s, memory_s = self.roofline.cost(tokens, pairs, pkv, dkv, sampled)
        end = start + duration
        outputs = []
        finished = []
        kv = s.kv
        for r in produced:
            out = r.num_output + 1
            r.num_output = out
            outputs.append((r.req_id, out))
            if out == 1:
                r.first_token_at = end
                self.prompt_tokens_total += r.prompt_len
            if out >= r.max_output:
                kv.free(r)
                r.status = FINISHED
                r.finished_at = end
                finished.append(r.req_id)
                del self._live[r.req_id]
                self._remember(r)
        self.generation_tokens_total += sampled
        if finished:
            s.running = [r for r in s.running if r.status == RUNNING]
        self._busy_until = end
        self.num_steps += 1
        return StepResult(
            start, duration, end, tokens - n_dec, n_dec, len(sched), outputs, finished,
            [r.req_id for r in preempted], compute_s, memory_s,
        )

    def advance(self, now: float, until: float):  # -> MacroStep
        """Run consecutive identical decode steps in closed form; see :mod:`steersman.sim.macro`."""
        return advance(self, now, until)

    # -- observation -----------------------------------------------------------------
    def state(self, now: float | None = None) -> EngineState:
        """Counters and gauges (vLLM /metrics equivalents); ``now`` resolves a finished load."""
        if now is not None:
            self._warm_at(now)
        s = self._s
        kv = s.kv
        return EngineState(
            num_running=len(s.running),
            num_waiting=s.num_waiting,
            kv_blocks_used=kv.num_used,
            kv_blocks_total=kv.num_blocks,
            kv_usage=kv.usage(),
            prefix_queries=s.prefix_queries,
            prefix_hits=s.prefix_hits,
            num_preemptions=s.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            weights=self._weights,
            weights_ready_at=self._ready_at,
            busy_until=self._busy_until,
            num_steps=self.num_steps,
        )

    def running(self) -> list[LegacyRequest]:
        return list(self._s.running)

    def waiting(self) -> list[LegacyRequest]:
        return list(self._s.waiting)
