"""Twin vs live: the same small workload through engine-sim servers behind the real gateway and through the twin.

The prompts are real text: the live engines tokenize and hash them; the twin gets the same token counts and
block hashes.  TTFT and TPOT medians must agree within 10%, and the policies must rank the same.  The twin's
fixed per-request latency is first calibrated to this harness on an idle fleet (see ``_calibrate``); the
engine-model part is never tuned.
"""

import asyncio
import random
import time
from dataclasses import dataclass

import httpx
import numpy as np

from steersman.enginesim.app import SimServerConfig
from steersman.policy import make_policy
from steersman.testing import LiveFleet, ReplayWorkload
from steersman.text import block_hashes, render_chat, tokenize
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize

MODEL = "llama-3.1-8b"
GPU = "L40S"  # a slow GPU: TTFT of ~100+ ms, so the live path's few ms of HTTP, tokenization and Python client stay small
N, RATE, OUT, SYSTEMS = 48, 6.0, 60, 12


@dataclass(frozen=True, slots=True)
class _Arrival:
    time: float
    seq: int
    prompt_tokens: int
    block_hashes: tuple
    output_tokens: int
    messages: list
    tenant: str = "t"
    model: str = MODEL
    max_tokens: int | None = OUT
    slo_class: str | None = "batch"
    deadline_s: float | None = None
    workflow: str | None = None
    step: int | None = None
    steps: int | None = None


def _workload(seed: int = 7) -> list[_Arrival]:
    rng = random.Random(seed)
    # 12 long system prompts, each used by ~4 requests: a prefix-aware policy prefills each once, round-robin
    # about twice (once per replica) -- the policies must rank the same live and in the twin
    systems = [f"You are assistant number {k}. " + " ".join(f"Rule {k}.{i}: be precise about topic {i}." for i in range(200))
               for k in range(SYSTEMS)]
    out, t = [], 0.0
    for i in range(N):
        t += rng.expovariate(RATE)
        question = " ".join(f"detail{rng.randrange(10**6)}" for _ in range(250))  # ~500 unique tokens
        msgs = [{"role": "system", "content": systems[rng.randrange(SYSTEMS)]}, {"role": "user", "content": f"Question {i}: {question}"}]
        ids = tokenize(render_chat(msgs))
        out.append(_Arrival(t, i, len(ids), tuple(block_hashes(ids)), OUT, msgs))
    return out


def _twin(policy: str, items, overhead_s: float = TwinConfig().gateway_latency_s) -> tuple[float, float]:
    fleet = TwinFleet([ReplicaPlan(f"r{i}", GPU, MODEL) for i in range(2)])
    s = summarize(Twin(fleet, ReplayWorkload(items), make_policy(policy), cfg=TwinConfig(gateway_latency_s=overhead_s)).run())
    assert s["completed"] == len(items)
    return s["ttft_s"]["p50"], s["tpot_s"]["p50"], s["ttft_s"]["mean"]


def _probe(seed: int = 11, n: int = 6) -> list[_Arrival]:
    """Requests 0.4 s apart on an idle fleet (unique prompts): their live TTFT minus the engine model's is the
    fixed per-request cost of the live path (Python HTTP client, gateway, engine-sim HTTP + tokenization)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(f"probe{rng.randrange(10**6)}" for _ in range(400))
        msgs = [{"role": "user", "content": text}]
        ids = tokenize(render_chat(msgs))
        out.append(_Arrival(0.4 * i, i, len(ids), tuple(block_hashes(ids)), OUT, msgs))
    return out


def _calibrate() -> float:
    """The twin is calibrated to the deployment it predicts, as a user would: its per-request fixed latency
    (TwinConfig.gateway_latency_s) is set to this harness's, measured on an idle fleet."""
    probe = _probe()
    live = _live("round-robin", probe)
    twin = _twin("round-robin", probe, overhead_s=0.0)
    return min(0.02, max(0.0, live[0] - twin[0]))  # median TTFT difference (robust to a cold first request), capped


async def _live_run(url: str, items) -> tuple[float, float]:
    ttfts, tpots = [], []
    async with httpx.AsyncClient(timeout=60) as client:
        t0 = time.monotonic()

        async def one(a):
            await asyncio.sleep(max(0.0, t0 + a.time - time.monotonic()))  # the workload's arrival time
            body = {"model": MODEL, "messages": a.messages, "max_tokens": OUT, "ignore_eos": True, "stream": True}
            sent = time.monotonic()
            first = last = None
            n = 0
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                        last = time.monotonic()
                        first = first or last
                        n += 1
            ttfts.append(first - sent)
            tpots.append((last - first) / max(n - 1, 1))

        await asyncio.gather(*(one(a) for a in items))
    return float(np.median(ttfts)), float(np.median(tpots)), float(np.mean(ttfts))


def _live(policy: str, items) -> tuple[float, float]:
    with LiveFleet(sims=[SimServerConfig(gpu=GPU, speedup=1.0, port=0) for _ in range(2)], policy=policy) as lf:
        return asyncio.run(_live_run(lf.url, items))


def test_twin_matches_live_medians_and_policy_ranking():
    items = _workload()
    overhead = _calibrate()
    results = {}
    for policy in ("round-robin", "steersman"):
        live, twin = _live(policy, items), _twin(policy, items, overhead)
        results[policy] = (live, twin)
        for name, lv, tv in (("TTFT", live[0], twin[0]), ("TPOT", live[1], twin[1])):
            assert abs(tv - lv) <= 0.10 * lv, f"{policy} {name}: live {lv * 1000:.1f} ms, twin {tv * 1000:.1f} ms (fixed {overhead * 1000:.1f} ms)"
    live_rank = sorted(results, key=lambda p: results[p][0][2])  # by mean TTFT
    twin_rank = sorted(results, key=lambda p: results[p][1][2])
    assert live_rank == twin_rank == ["steersman", "round-robin"], results
