"""A plausible fleet, prefix index and request stream for the decision-latency benchmark.

* replicas: a heterogeneous mix (H100 / A100 / L40S serving Llama-3.1-8B), built as a real
  :class:`~steersman.fleet.state.Fleet` so snapshots come from the production code path;
* load: every live row the policies read is filled with plausible values (in flight ~8,
  engine queue ~2, KV usage 20-90%, KV blocks held, recent routed tokens, EWMA latencies);
* prefix index: the default 128 MiB budget, warmed by routing ``WARM_PER_REPLICA`` requests
  per replica (capped) the way a cache-aware router spreads them: each system prompt lives
  on a handful of replicas, each conversation on one;
* requests: 1-4k-token prompts, real token ids hashed with :func:`steersman.text.block_hashes`;
  half start a conversation under one of the shared system prompts, 30% continue an earlier
  conversation (its whole prompt + a new turn), 20% share nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from steersman.config import DEFAULTS
from steersman.fleet import snapshot as S
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.state import Fleet, Replica
from steersman.policy.request import PriorityClass, SchedRequest
from steersman.testing.clock import FakeClock
from steersman.text import block_hashes

MODEL = "llama-3.1-8b"
GPUS = (("H100", 4.0), ("A100-80GB", 2.5), ("L40S", 1.2))
SYSTEM_PROMPTS = 40
WARM_PER_REPLICA = 20
WARM_MAX = 20_000
HOLDERS_PER_SYSTEM = 4


@dataclass
class Workload:
    fleet: Fleet
    index: PrefixIndex
    requests: list[SchedRequest]
    warm_requests: int
    warm_blocks: int


def _fleet(n: int) -> Fleet:
    reps = []
    for i in range(n):
        gpu, price = GPUS[i % len(GPUS)]
        reps.append(Replica(i, f"{gpu.lower()}-{i}", f"http://127.0.0.1:{9000 + i}", "engine-sim", gpu, (MODEL,),
                            gpu.lower(), price, 1, adapter=None))
    return Fleet(reps, FakeClock(start=1000.0), DEFAULTS.scheduler)


def _load(fleet: Fleet, rng: np.random.Generator) -> None:
    n = len(fleet.replicas)
    live = fleet.live

    def put(name: str, values) -> None:
        if name in S.LIVE_FIELDS:
            live[S.LIVE_FIELDS.index(name)] = values

    in_flight = rng.poisson(8, n).astype(float)
    decoding = np.floor(in_flight * rng.uniform(0.5, 0.9, n))
    put("in_flight", in_flight)
    put("decoding", decoding)
    put("running", decoding + rng.poisson(2, n))
    put("waiting", rng.poisson(2, n).astype(float))
    put("kv_usage", rng.uniform(0.2, 0.9, n))
    put("active_blocks", in_flight * rng.uniform(80, 250, n))
    put("pending_prefill", (in_flight - decoding) * rng.uniform(500, 3000, n))
    put("recent_tokens", rng.uniform(0, 200_000, n))
    put("ttft_ewma", rng.uniform(0.15, 0.8, n))
    put("tpot_ewma", rng.uniform(0.015, 0.05, n))
    put("scraped_at", fleet.clock.now() - rng.uniform(0, 0.1, n))
    put("since_scrape", rng.poisson(1, n).astype(float))


def _prompt(rng, system: list[int] | None, lo: int, hi: int) -> list[int]:
    total = int(rng.integers(lo, hi))
    head = system or []
    tail = max(total - len(head), 16)
    return head + rng.integers(0, 1 << 30, tail).tolist()


def build(n: int, requests: int = 1000, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    fleet = _fleet(n)
    _load(fleet, rng)
    index = PrefixIndex(n, DEFAULTS.scheduler.prefix_index_max_mib * (1 << 20))
    fleet.prefix = index
    systems = [rng.integers(0, 1 << 30, int(rng.integers(500, 2000))).tolist() for _ in range(SYSTEM_PROMPTS)]
    homes = [rng.choice(n, size=min(HOLDERS_PER_SYSTEM, n), replace=False) for _ in systems]
    convos: list[tuple[list[int], int]] = []  # (prompt tokens, replica) of warm conversations
    warm = min(WARM_PER_REPLICA * n, WARM_MAX)
    warm_blocks = 0
    for _ in range(warm):
        k = int(rng.integers(len(systems)))
        r = int(rng.choice(homes[k])) if rng.random() < 0.7 else int(rng.integers(n))
        toks = _prompt(rng, systems[k], 1000, 4000)
        hashes = block_hashes(toks)
        index.record(r, hashes)
        warm_blocks += len(hashes)
        if len(convos) < 5000:
            convos.append((toks, r))
    out = []
    for seq in range(requests):
        u = rng.random()
        if u < 0.5:
            toks = _prompt(rng, systems[int(rng.integers(len(systems)))], 1000, 4000)
        elif u < 0.8:
            base, _ = convos[int(rng.integers(len(convos)))]
            toks = base[: int(rng.integers(800, 3600))] + rng.integers(0, 1 << 30, int(rng.integers(50, 400))).tolist()
        else:
            toks = _prompt(rng, None, 1000, 4000)
        out.append(SchedRequest(seq=seq, model=MODEL, kind="chat", stream=True, tenant=f"t{seq % 7}",
                                priority=PriorityClass.STANDARD, arrival=fleet.clock.now(), prompt_tokens=len(toks),
                                block_hashes=tuple(block_hashes(toks)), max_tokens=None,
                                expected_output=int(rng.integers(50, 600))))
    return Workload(fleet, index, out, warm, warm_blocks)
