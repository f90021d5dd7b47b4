"""Engine-model CPU per simulated request, driven the way the digital twin drives it.

One replica (H100, Llama-3.1-8B, default engine settings) serves a Poisson stream of
requests (prompts 500-4,000 tokens, 40% of them starting with one of 16 shared
prefixes of 256-1,024 tokens; outputs 50-500 tokens) at ``--load`` x its capacity
(measured first with a burst of the same workload).  The replica is driven in the
twin pattern: at each event, a run of plain decode steps in closed form
(``decode_plan`` / ``commit``, cut at the next arrival's step boundary) or one
``step()``, and ``state()`` after every event.

Prints the engine CPU per request (time inside engine calls), the wall time of the
whole loop per request, and the steps simulated per second.  ``--old`` also runs
the reference (pre-lazy) engine of ``tests/sim/legacy_engine/`` with
``advance()`` / ``step()``, the loop the twin had before.

    .venv/bin/python bench/twin/engine_speed.py [--requests 20000] [--load 0.8] [--old]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from steersman.config import EngineSettings  # noqa: E402
from steersman.sim import EngineModel, SimRequest, gpu_profile, model_profile  # noqa: E402
from steersman.text.tokenizer import ROOT_HASH  # noqa: E402

BS = 16


def workload(n: int, rate: float, seed: int = 1) -> list[tuple[float, str, int, int, list[int]]]:
    """(arrival, id, prompt_len, max_output, block hashes) sorted by arrival."""
    rng = random.Random(seed)
    prefixes = []
    for p in range(16):
        length = rng.randrange(256, 1025)
        h, hs = ROOT_HASH, []
        for i in range(length // BS):
            h = hash((h, "prefix", p, i))
            hs.append(h)
        prefixes.append((length, hs))
    out = []
    t = 0.0
    for i in range(n):
        if rate < math.inf:
            t += rng.expovariate(rate)
        prompt = rng.randrange(500, 4001)
        hs: list[int] = []
        h = ROOT_HASH
        if rng.random() < 0.4:
            length, phs = prefixes[rng.randrange(16)]
            hs = phs[: min(length, prompt) // BS]
            h = hs[-1] if hs else h
        for j in range(len(hs), prompt // BS):
            h = hash((h, "own", i, j))
            hs.append(h)
        out.append((t, f"r{i}", prompt, rng.randrange(50, 501), hs))
    return out


def make_engine(kind):
    return kind(gpu_profile("H100"), model_profile("llama-3.1-8b"), EngineSettings(), keep_done=0)


def drive(eng, reqs, new_api: bool, make_req=SimRequest) -> dict:
    """Twin pattern on one replica; returns timings and counts."""
    pc = time.perf_counter
    eng_s = 0.0
    steps = events = 0
    n = len(reqs)
    i = 0
    t = 0.0
    w0 = pc()
    while i < n or eng.has_work():
        if not eng.has_work():
            t = max(t, reqs[i][0])
        # everything that arrived by the next step's start joins it
        start = max(t, eng._busy_until)
        while i < n and reqs[i][0] <= start:
            a, rid, p, o, hs = reqs[i]
            r = make_req(rid, p, o, hs, arrival=a)
            t0 = pc()
            eng.add(r)
            eng_s += pc() - t0
            i += 1
        until = reqs[i][0] if i < n else math.inf
        t0 = pc()
        if new_api:
            plan = eng.decode_plan(start)
            if plan is not None:
                ms = eng.commit(plan, plan.steps_before(until))
                steps += ms.steps
                t = ms.end
            else:
                res = eng.step(start, outputs=False)
                steps += 1
                t = res.end
        else:
            ms = eng.advance(start, until)
            if ms.steps:
                steps += ms.steps
                t = ms.end
            else:
                res = eng.step(start)
                steps += 1
                t = res.end
        eng.state()
        eng_s += pc() - t0
        events += 1
    wall = pc() - w0
    st = eng.state()
    return dict(eng_s=eng_s, wall=wall, steps=steps, events=events, sim_s=t, preemptions=st.num_preemptions,
                hits=st.prefix_hits / max(1, st.prefix_queries))


def capacity(kind, new_api: bool, n: int = 3000) -> float:
    """Requests/s of the replica on this workload: a burst, completed requests over the makespan."""
    eng = make_engine(kind)
    reqs = workload(n, math.inf, seed=7)
    out = drive(eng, reqs, new_api)
    return n / out["sim_s"]


def report(name: str, n: int, out: dict) -> None:
    print(
        f"{name:>5}: {out['eng_s'] / n * 1e6:7.1f} us engine CPU / request   "
        f"{out['wall'] / n * 1e6:7.1f} us loop wall / request   "
        f"{out['steps'] / out['eng_s']:>10,.0f} steps/s   "
        f"({out['steps']:,} steps in {out['events']:,} events, {out['sim_s']:,.0f} s simulated, "
        f"{out['preemptions']} preemptions, prefix hit rate {out['hits']:.0%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--load", type=float, default=0.8, help="arrival rate / replica capacity")
    ap.add_argument("--old", action="store_true", help="also run the reference engine (slow)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    new_api = hasattr(EngineModel, "decode_plan")
    cap = capacity(EngineModel, new_api)
    rate = args.load * cap
    reqs = workload(args.requests, rate, args.seed)
    print(f"H100 x Llama-3.1-8B, defaults: capacity {cap:.2f} req/s on this workload; "
          f"{args.requests:,} requests at {rate:.2f} req/s ({args.load:.0%})")
    report("new" if new_api else "cur", args.requests, drive(make_engine(EngineModel), reqs, new_api))
    if args.old:
        sys.path.insert(0, str(ROOT / "tests" / "sim"))
        from legacy_engine import LegacyEngineModel, LegacyRequest

        report("old", args.requests, drive(make_engine(LegacyEngineModel), reqs, False, LegacyRequest))


if __name__ == "__main__":
    main()
