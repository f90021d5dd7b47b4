"""The engine model as it was before lazy decoding (commit 924c35a), kept as a test oracle.

request.py, kvcache.py, scheduler.py, macro.py and engine.py of that commit in one
module, renamed (LegacyRequest, LegacyEngineModel); everything else is verbatim.
The equivalence tests run it beside the current engine, and
``bench/twin/engine_speed.py --old`` times it.  Do not change its behaviour.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
import heapq
import math
from dataclasses import dataclass, field
from enum import Enum

from steersman.config import EngineSettings
from steersman.sim.gpus import GpuProfile
from steersman.sim.memory import batch_limits, num_kv_blocks
from steersman.sim.models import ModelProfile
from steersman.sim.roofline import Roofline
from steersman.text.tokenizer import ROOT_HASH


WAITING = "waiting"  # queued, new or preempted (then num_preemptions > 0)
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class LegacyRequest:
    """One generation request.

    The caller decides the output length up front (``max_output`` includes the
    EOS / stop token): the request finishes when it has produced that many tokens.
    ``block_hashes`` are the chained hashes of the prompt's full blocks
    (:func:`steersman.text.tokenizer.block_hashes` with the engine's block size);
    fewer (or none) just means less can be cached.

    Optional output-block caching (vLLM v1 caches full blocks of generated tokens
    too): give ``output_token_ids(n)`` returning the first ``n`` output token ids,
    and ``prompt_tail``, the prompt tokens after its last full block (the block that
    straddles prompt and output needs them).  Without it, only prompt blocks are
    cached.

    Fields after ``prompt_tail`` are maintained by the engine; read them, don't set them.
    """

    req_id: str
    prompt_len: int
    max_output: int
    block_hashes: Sequence[int] = ()
    priority: int = 0
    arrival: float = 0.0
    output_token_ids: Callable[[int], Sequence[int]] | None = field(default=None, repr=False)
    prompt_tail: Sequence[int] = field(default=(), repr=False)

    status: str = field(default=WAITING, init=False)
    num_computed: int = field(default=0, init=False)  # tokens whose KV is computed (or hit)
    num_output: int = field(default=0, init=False)  # tokens produced so far
    num_cached_tokens: int = field(default=-1, init=False)  # prefix hit at first scheduling (-1: not yet)
    num_preemptions: int = field(default=0, init=False)
    first_scheduled_at: float | None = field(default=None, init=False)
    first_token_at: float | None = field(default=None, init=False)
    finished_at: float | None = field(default=None, init=False)
    # KV blocks held, in order: the block's hash if it is in the prefix cache, else None.
    blocks: list[int | None] = field(default_factory=list, init=False, repr=False)
    num_hashed: int = field(default=0, init=False, repr=False)  # leading blocks already offered to the cache
    out_hashes: list[int] = field(default_factory=list, init=False, repr=False)  # hashes of full output blocks
    seq: int = field(default=0, init=False, repr=False)  # arrival order in this engine

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens (what a recompute after preemption must prefill)."""
        return self.prompt_len + self.num_output

    @property
    def done(self) -> bool:
        return self.status == FINISHED or self.status == ABORTED

    def block_hash(self, i: int, block_size: int) -> int | None:
        """Chained hash of full block ``i`` of the sequence, or None if it cannot be known."""
        ph = self.block_hashes
        if i < len(ph):
            return ph[i]
        fn = self.output_token_ids
        if fn is None or len(ph) != self.prompt_len // block_size:
            return None
        oh = self.out_hashes
        j = i - len(ph)
        while len(oh) <= j:
            start = (len(ph) + len(oh)) * block_size
            end = start + block_size
            p = self.prompt_len
            parent = oh[-1] if oh else (ph[-1] if ph else ROOT_HASH)
            toks: list[int] = []
            if start < p:
                base = p - len(self.prompt_tail)
                toks.extend(self.prompt_tail[start - base :])
            toks.extend(fn(end - p)[max(0, start - p) : end - p])
            oh.append(hash((parent, *toks)))
        return oh[j]


_NEVER = 1 << 62  # num_hashed sentinel: no further block of this request can be hashed


class _Run:
    """``n`` consecutive free uncached blocks in the free queue."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class KVPool:
    __slots__ = ("num_blocks", "block_size", "caching", "num_free", "_free", "_ref")

    def __init__(self, num_blocks: int, block_size: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.num_free = num_blocks
        # Free queue, front = next to be taken: cached block hash | _Run -> None.
        self._free: OrderedDict[object, None] = OrderedDict()
        if num_blocks:
            self._free[_Run(num_blocks)] = None
        # Every block in the prefix cache: hash -> ref count (0 = free, evictable).
        self._ref: dict[int, int] = {}

    # -- state ------------------------------------------------------------------
    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks in the prefix cache (in use or evictable)."""
        return len(self._ref)

    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks if self.num_blocks else 0.0

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._ref

    def ref_count(self, block_hash: int) -> int:
        return self._ref.get(block_hash, 0)

    def free_queue(self) -> list[int | None]:
        """The free queue front to back: a hash per cached block, None per uncached one (tests)."""
        out: list[int | None] = []
        for key in self._free:
            if key.__class__ is _Run:
                out.extend([None] * key.n)  # type: ignore[attr-defined]
            else:
                out.append(key)  # type: ignore[arg-type]
        return out

    # -- vLLM KVCacheManager operations ----------------------------------------------
    def lookup(self, req: LegacyRequest) -> list[int]:
        """Hashes of the longest run of ``req``'s leading blocks in the cache.

        As vLLM's get_computed_blocks: at most (num_tokens - 1) // block_size blocks,
        so at least the last token is recomputed (a fully cached, block-aligned prompt
        recomputes its whole last block).
        """
        if not self.caching:
            return []
        bs = self.block_size
        ref = self._ref
        hits: list[int] = []
        for i in range((req.num_tokens - 1) // bs):
            h = req.block_hash(i, bs)
            if h is None or h not in ref:
                break
            hits.append(h)
        return hits

    def blocks_needed(self, req: LegacyRequest, num_tokens: int, hits: list[int] | None = None) -> int:
        """Free blocks that :meth:`allocate` would consume (vLLM get_num_blocks_to_allocate)."""
        n_hits = len(hits) if hits else 0
        need = -(-num_tokens // self.block_size) - len(req.blocks) - n_hits
        if need < 0:
            need = 0
        if hits:
            ref = self._ref
            need += sum(1 for h in hits if ref[h] == 0)
        return need

    def allocate(self, req: LegacyRequest, num_tokens: int, hits: list[int] | None = None) -> bool:
        """Make ``req`` hold blocks for its first ``num_tokens`` tokens (vLLM allocate_slots).

        ``hits`` (from :meth:`lookup`, for a request being admitted) are touched and
        become its first blocks.  Returns False, changing nothing, if the free queue
        is too short.  Does not cache anything: call :meth:`cache` next.
        """
        blocks = req.blocks
        need = -(-num_tokens // self.block_size) - len(blocks)
        if hits:
            need -= len(hits)
        if need < 0:
            need = 0
        if hits:
            ref = self._ref
            if need + sum(1 for h in hits if ref[h] == 0) > self.num_free:
                return False
            free = self._free
            for h in hits:
                c = ref[h]
                if c == 0:
                    del free[h]
                    self.num_free -= 1
                ref[h] = c + 1
            blocks.extend(hits)
        elif need > self.num_free:
            return False
        if need:
            self.take(need)
            blocks.extend([None] * need)
        return True

    def take(self, n: int) -> None:
        """Take ``n`` blocks off the free queue's front, evicting cached ones."""
        self.num_free -= n
        free = self._free
        ref = self._ref
        while n:
            key = next(iter(free))
            if key.__class__ is _Run:
                if key.n > n:  # type: ignore[attr-defined]
                    key.n -= n  # type: ignore[attr-defined]
                    return
                n -= key.n  # type: ignore[attr-defined]
                free.popitem(last=False)
            else:
                free.popitem(last=False)
                del ref[key]  # type: ignore[arg-type]
                n -= 1

    def cache(self, req: LegacyRequest, num_tokens: int) -> None:
        """Register ``req``'s full blocks among its first ``num_tokens`` tokens (cache_full_blocks)."""
        full = num_tokens // self.block_size
        i = req.num_hashed
        if full <= i or not self.caching:
            return
        bs = self.block_size
        blocks = req.blocks
        ref = self._ref
        while i < full:
            if blocks[i] is None:
                h = req.block_hash(i, bs)
                if h is None:
                    i = _NEVER
                    break
                if h not in ref:  # else: a duplicate of a cached block, stays uncached
                    ref[h] = 1
                    blocks[i] = h
            i += 1
        req.num_hashed = i

    def free(self, req: LegacyRequest) -> None:
        """Release all of ``req``'s blocks, tail first (vLLM free)."""
        blocks = req.blocks
        req.blocks = []
        req.num_hashed = 0
        if not blocks:
            return
        free = self._free
        ref = self._ref
        anon = 0
        for h in reversed(blocks):
            if h is None:
                anon += 1
                continue
            if anon:
                self._append_run(anon)
                anon = 0
            c = ref[h] - 1
            ref[h] = c
            if c == 0:
                free[h] = None
                self.num_free += 1
        if anon:
            self._append_run(anon)

    def _append_run(self, n: int) -> None:
        self.num_free += n
        free = self._free
        if free:
            last = next(reversed(free))
            if last.__class__ is _Run:
                last.n += n  # type: ignore[attr-defined]
                return
        free[_Run(n)] = None

    def reset(self) -> None:
        """Drop everything (weights unloaded): all blocks free, nothing cached."""
        self.__init__(self.num_blocks, self.block_size, self.caching)  # type: ignore[misc]


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
