"""Random fleets and requests whose decisions are pinned (imported as ``replayscenarios``).

``tests/policy/test_decision_replay.py`` replays them through every routing profile and
compares each decision (kind, replica, reason, predicted TTFT/TPOT to the last bit, Retry-After)
with ``data/decisions.txt.gz``, first recorded by the code before the decision path was compiled
and fused (commit 5065ab4), re-recorded when the SLO-cheapest rule gained holders-first and the
residents' TPOT (133 of the 20,880 decisions changed, all of the steersman profile; its
plugin-by-plugin path, ``Profile.decide``, gives the recorded decisions on all 2,320 cases), and
again when holders-first came to read the index's raw match and holders of most of a prompt
became exempt from saturation up to 4x the queue depth, and unprotected requests came to stay
with their prompt's holders (265 changed, all of the steersman profile; again the
plugin-by-plugin path gives every recorded decision), and when sheddable requests no replica can
serve within their SLO came to be refused early (``scheduler.shed_infeasible``: 116 changed, all
sheddable requests of the steersman profile routed "least predicted latency" before; the
plugin-by-plugin path gives every recorded decision), and when the candidates of a request no replica
is predicted to serve in time came to count as equally late within ``late_latency_tie`` (2x) of the
least predicted latency, the scores choosing among them (359 changed, all of the steersman profile:
358 late routes and 1 stay with a prompt's holders, now chosen among the holders by the same rule;
115 went to another replica, the rest changed only the reason's wording; the plugin-by-plugin
path gives every recorded decision), and when the prefix index became a compiled table holding ~2.3x
the blocks in the same budget (282 changed, by what the old index had evicted within the scenario's budget:
with a 512 MiB budget, where neither evicts, the old and the new index give all 20,880 decisions alike), and
when the load-balance and KV-headroom scores came to count near-equal values as equal
(``scheduler.balance_tie``, ``scheduler.kv_headroom_tie``: 2 changed, both late routes of the steersman
profile that had been decided by one request more in flight or a KV reading within 1% of the other's; the
random scenarios' loads seldom come within 15% of each other), and when a request no replica's free KV cache holds
came to go to the replica with the most KV free among those whose whole cache holds it (``FitsKv.when_empty``: 11
changed, all of the steersman profile, from "no replica passes filter 'fits-kv'" 503s to routes; none of the
scenarios' requests is larger than every replica's cache, which is now a 400), and when the prediction came
to count the attention work of the prefill queued ahead at the context its chunks attend to (the fleet's
``pending_pairs``, here the pending prefill as whole uncached prompts) instead of at the newcomer's own
context (1,449 changed, all of the steersman profile, 14 of them to another replica or reason, the rest in their
predicted TTFT or the last bit of their TPOT; the plugin-by-plugin
path gives every recorded decision), and when the saturation detector came to count the requests a step's token
budget leaves waiting and late requests came to wait in the gateway unless a replica holds their prompt
(``scheduler.hold_late`` on: 141 changed, all of the steersman profile: 59 late routes now held in the gateway, 32
routes now queued as every candidate is saturated, 50 to another replica or prediction among the candidates left;
the plugin-by-plugin path gives every recorded decision), and when a review's fixes came in
(4,543 changed): round-robin came to count the requests of each model (1,724 of its 2,320), the
baselines' ties came to be drawn from a hash of seq (least-request 810, sglang-cache-aware 938, and
dynamo-kv, whose prefill term also came to count the worker's pending prefill as Dynamo's
active_tokens: 807), and in the steersman profile (264) NaN engine counts came to be read as the
gateway's own (162: the replicas reporting them predicted, not NaN; 111 to another replica),
saturation came to need a queue or KV usage past the threshold, not at it, as GIE's detector (87:
29 queued now routed), both of these together (13), and the hang floor came to apply to the TTFT
once the queue drains (2: held in the gateway for a hung replica, now routed); prompts of exactly a
multiple of the step budget came to take one decode step less (none of the scenarios has one); and
when max-score (llm-d) came to draw its ties from a hash of seq too (1 changed); and when the steersman
profile's last tie came to be each model's turn among the tied replicas, not the parity of the gateway's
counter over every model (1 changed: a late route to another of its tied replicas; the prefix cap at
``(prompt_tokens - 1) // block_size`` blocks changed none); and when the shortlist came to choose among the
candidates the ``fits-kv`` filter keeps (those whose free KV cache holds the request, else those whose whole
cache does with the most free now), not among all of them, so that it no longer drops the few replicas large
enough to hold a long prompt (10 changed, all of the steersman profile, with 33 to 465 candidates at the
shortlist: the 1 to 5 places that had gone to replicas whose free KV did not hold the request, which fits-kv then
dropped, went to replicas that do: 8 routes to another replica, 2 early refusals of sheddable requests quoting a
lower least TTFT); and when an early refusal's reason came to say the TTFT budget left instead of "target" (48
changed, the reason's text only: the same decisions, Retry-After and predictions); and when policies came to
leave a 503's Retry-After to the control plane (``scheduler.no_replica_retry_after_s``; 1,485 changed, each
"|1.0" of a refusal that names no wait of its own now "|None", nothing else), and when "no healthy replica
serves model" came to say "no replica of model ... is in rotation (unhealthy, loading or drained)" (765 changed,
the reason's text only: a drained replica is healthy); the plugin-by-plugin path gives every recorded decision::

    .venv/bin/python tests/policy/replayscenarios.py --record

Scenarios are built from a seeded numpy generator only (no ``hash()`` of strings, which
varies per process), so every run sees the same snapshots and requests.  They cover what the
fast paths branch on: 1 to 1,000 replicas (the shortlist only acts above 32 candidates),
unprofiled replicas, NaN metrics, stale scrapes, saturation, KV that does not fit,
blocked/limited/excluded replicas, other or unknown models, budgets, priorities and workflows,
and the bench's loaded 1,000-replica fleet with a warm prefix index.
"""

from __future__ import annotations

import gzip
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from steersman.fleet import snapshot as S
from steersman.fleet.prefix_index import PrefixIndex
from steersman.fleet.snapshot import FleetSnapshot
from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.policy.base import Queue, Reject, Route
from steersman.policy.request import LatencyBudget, PriorityClass, SchedRequest, WorkflowView

DATA = Path(__file__).resolve().parent / "data" / "decisions.txt.gz"
MODEL, OTHER = "llama-3.1-8b", "qwen2.5-7b"
GPUS = ("H100", "A100", "L40S", None, "no-such-gpu")
SIZES = (1, 2, 3, 5, 8, 20, 33, 40, 64, 150, 400, 1000)
SCENARIOS = 160
REQUESTS = 12


def _hashes(rng: np.random.Generator, k: int) -> tuple[int, ...]:
    return tuple(int(x) for x in rng.integers(0, 1 << 62, k))


def _live(rng: np.random.Generator, n: int, now: float) -> np.ndarray:
    live = np.zeros((len(S.LIVE_FIELDS), n))

    def put(name, values, nan_share=0.0):
        v = np.asarray(values, dtype=float) * np.ones(n)
        if nan_share:
            v[rng.random(n) < nan_share] = np.nan
        live[S.LIVE_FIELDS.index(name)] = v

    busy = float(rng.choice([0.0, 2.0, 8.0, 30.0]))
    in_flight = rng.poisson(busy, n).astype(float)
    decoding = np.floor(in_flight * rng.uniform(0.3, 1.0, n))
    put("in_flight", in_flight)
    put("decoding", decoding)
    put("running", decoding + rng.poisson(busy / 3 + 0.1, n), nan_share=0.05)
    put("waiting", rng.poisson(rng.choice([0.0, 0.5, 3.0]), n), nan_share=0.05)
    put("kv_usage", rng.uniform(0.0, rng.choice([0.5, 0.97]), n), nan_share=0.03)
    put("prefix_queries", rng.poisson(50, n))
    put("prefix_hits", rng.poisson(20, n))
    put("weights", S.WEIGHTS_CODES["warm"])
    put("scraped_at", now - rng.choice([0.05, 0.5, 5.0], n))
    put("kv_blocks_total", rng.choice([500.0, 4000.0, 30000.0], n), nan_share=0.4)
    put("pending_prefill", (in_flight - decoding) * rng.uniform(0, 3000, n))
    put("awaiting", in_flight - decoding)  # all streamed (no draw: the scenarios' earlier draws stay as they were)
    pending = live[S.PENDING_PREFILL]  # its attention work as whole uncached prompts of equal length (no draw)
    put("pending_pairs", pending * (pending / np.maximum(in_flight - decoding, 1.0)) / 2.0)
    put("active_blocks", in_flight * rng.uniform(50, 250, n))
    put("recent_tokens", rng.uniform(0, rng.choice([1.0, 5e4, 1e6]), n))
    put("ttft_ewma", rng.uniform(0.05, 1.0, n), nan_share=0.3)
    put("tpot_ewma", rng.uniform(0.01, 0.06, n), nan_share=0.3)
    put("ttft_ratio", rng.uniform(0.5, 3.0, n), nan_share=0.3)
    put("tpot_ratio", rng.uniform(0.5, 3.0, n), nan_share=0.3)
    put("since_scrape", rng.poisson(1.5, n))
    put("prefix_accuracy", rng.uniform(0.2, 1.2, n), nan_share=0.2)
    put("stalled_since", now - rng.uniform(0, 20, n), nan_share=0.85)
    return live


def _fleet(rng: np.random.Generator, n: int, seed: int) -> tuple[FleetSnapshot, list[tuple[int, ...]]]:
    now = 1000.0 + float(rng.uniform(0, 100))
    mix = rng.choice(len(GPUS), size=int(rng.integers(1, 4)), replace=False)
    gpus = [GPUS[int(mix[i % mix.size])] for i in range(n)]
    statics = build_statics([ReplicaSpec(g, MODEL, int(rng.choice([1, 1, 2])), float(rng.uniform(0.5, 4.0)))
                             for g in gpus])
    masks = {MODEL: rng.random(n) < (1.0 if rng.random() < 0.7 else 0.8), OTHER: rng.random(n) < 0.3}
    routable = rng.random(n) < (1.0 if rng.random() < 0.6 else 0.9)
    index = None
    prompts: list[tuple[int, ...]] = []
    if rng.random() < 0.85:
        index = PrefixIndex(n, float(rng.choice([2 << 20, 16 << 20])))
        for _ in range(int(rng.integers(1, 40))):
            p = _hashes(rng, int(rng.integers(1, 300)))
            prompts.append(p)
            for r in rng.choice(n, size=min(n, int(rng.integers(1, 6))), replace=False):
                index.record(int(r), p[: int(rng.integers(1, len(p) + 1))])
        if rng.random() < 0.2:
            index.forget_replica(int(rng.integers(n)))
    live = _live(rng, n, now)
    busy = float(np.mean(live[S.IN_FLIGHT]))
    recent_at = now - rng.uniform(0, 120, n) if rng.random() < 0.8 else None
    blocked = limits = None
    if rng.random() < 0.4:
        blocked = np.where(rng.random(n) < 0.2, now + rng.choice([-1.0, 3.0, 40.0, np.inf], n), -np.inf)
    if rng.random() < 0.4:
        limits = np.floor(rng.uniform(0, 2 * busy + 4, n))
    snap = FleetSnapshot(
        time=now, names=tuple(f"r{i}" for i in range(n)), gpus=tuple(gpus), pools=("p",) * n,
        model_masks=masks, healthy=routable.copy(), routable=routable, live=live, statics=statics,
        prefix=index, ttft_prior=float(rng.choice([1.0, 1.7])), tpot_prior=float(rng.choice([1.0, 0.8])),
        recent_at=recent_at, recent_tau_s=60.0, blocked_until=blocked, limits=limits,
    )
    return snap, prompts


def _request(rng: np.random.Generator, seq: int, snap: FleetSnapshot, prompts) -> SchedRequest:
    u = rng.random()
    if prompts and u < 0.6:
        base = prompts[int(rng.integers(len(prompts)))]
        hashes = base[: int(rng.integers(1, len(base) + 1))] + _hashes(rng, int(rng.integers(0, 30)))
    elif u < 0.9:
        hashes = _hashes(rng, int(rng.integers(1, 250)))
    else:
        hashes = ()
    tokens = len(hashes) * 16 + int(rng.integers(0, 16)) if hashes or rng.random() < 0.5 else int(rng.integers(0, 3))
    now = snap.time
    budget = LatencyBudget()
    if rng.random() < 0.6:
        budget = LatencyBudget(ttft_s=float(rng.choice([0.05, 0.5, 2.0, 30.0])) if rng.random() < 0.8 else None,
                               tpot_s=float(rng.choice([0.005, 0.03, 0.1])) if rng.random() < 0.7 else None,
                               deadline=now + float(rng.uniform(0.5, 60)) if rng.random() < 0.3 else None)
    workflow = WorkflowView("w", 3, 5, 2, 1000, 0.1, now - 5, float(rng.choice([0.0, 0.7]))) if rng.random() < 0.2 else None
    excluded = frozenset(int(x) for x in rng.choice(snap.size, size=min(snap.size, 3), replace=False)) \
        if rng.random() < 0.15 else frozenset()
    model = MODEL if rng.random() < 0.9 else (OTHER if rng.random() < 0.7 else "unknown-model")
    return SchedRequest(seq=int(seq), model=model, kind="chat", stream=bool(rng.random() < 0.5), tenant="t",
                        priority=PriorityClass(int(rng.integers(0, 4))), arrival=now, prompt_tokens=tokens,
                        block_hashes=hashes, max_tokens=None, expected_output=int(rng.choice([1, 64, 300, 2000])),
                        budget=budget, workflow=workflow, excluded=excluded)


def random_cases():
    """(snapshot, request) pairs from the seeded generator, one snapshot per ``REQUESTS`` requests."""
    for s in range(SCENARIOS):
        rng = np.random.default_rng(1000 + s)
        snap, prompts = _fleet(rng, int(SIZES[s % len(SIZES)]), s)
        for k in range(REQUESTS):
            yield snap, _request(rng, s * 97 + k, snap, prompts)


def bench_cases(n: int = 1000, requests: int = 300):
    """The bench's loaded fleet (bench/scheduler/workload.py), one snapshot; then the same fleet with
    a third of it blocked or limited."""
    bench = Path(__file__).resolve().parents[2] / "bench" / "scheduler"
    sys.path.insert(0, str(bench))
    try:
        import workload
    finally:
        sys.path.remove(str(bench))
    wl = workload.build(n, requests=requests, seed=7)
    snap = wl.fleet.snapshot()
    for r in wl.requests:
        yield snap, r
    rng = np.random.default_rng(7)
    limited = replace(snap, blocked_until=np.where(rng.random(n) < 0.3, snap.time + 5.0, -np.inf),
                      limits=np.floor(rng.uniform(4, 14, n)))
    for r in wl.requests[: requests // 3]:
        yield limited, r


def describe(d) -> str:
    """A decision as one line; floats by ``repr`` (every bit)."""
    if isinstance(d, Route):
        return f"route|{d.replica}|{d.reason}|{d.predicted_ttft_s!r}|{d.predicted_tpot_s!r}"
    if isinstance(d, Queue):
        return f"queue|{d.reason}"
    if isinstance(d, Reject):
        return f"reject|{d.reason}|{d.retry_after!r}"
    raise TypeError(f"not a decision: {d!r}")


def decisions() -> list[str]:
    """Every profile's decision on every case, as ``profile|case|decision`` lines."""
    from steersman.config import DEFAULTS
    from steersman.policy import POLICIES
    from steersman.policy.baselines import BASELINES

    names = [*BASELINES, "steersman"]
    policies = {name: POLICIES.get(name)(DEFAULTS.scheduler) for name in names}
    out = []
    for c, (snap, req) in enumerate([*random_cases(), *bench_cases()]):
        for name in names:
            out.append(f"{name}|{c}|{describe(policies[name].pick(snap, req))}")
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(__doc__)
    DATA.parent.mkdir(exist_ok=True)
    lines = decisions()
    with gzip.open(DATA, "wt", compresslevel=9) as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} decisions to {DATA}")
