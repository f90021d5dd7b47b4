#!/usr/bin/env python
"""bench/scheduler: decision latency of every routing profile at 10, 100 and 1,000 replicas.

    .venv/bin/python bench/scheduler/run.py            # full run (~1-2 min)
    .venv/bin/python bench/scheduler/run.py --quick    # fewer decisions, 10 and 100 replicas

For each fleet size it builds a plausible loaded fleet with a warm prefix index
(bench/scheduler/workload.py), then times, per profile, the full
``policy.pick(snapshot, request)`` call -- candidate selection, the prefix match
against the index, scorers and picker -- over realistic 1-4k-token requests.
Snapshot construction (``Fleet.snapshot()``), the prefix match alone and
``PrefixIndex.record`` are timed separately.  Profiles: the baselines and, when
registered, ``steersman``.  Prints a table and writes bench/scheduler/results.json.
Target: p99 <= 100 us per decision at 1,000 replicas.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workload  # noqa: E402

from steersman.config import DEFAULTS  # noqa: E402
from steersman.policy import POLICIES  # noqa: E402
from steersman.policy.baselines import BASELINES  # noqa: E402

TARGET_P99_US = 100.0


def _stats(samples_ns: list[int]) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=float) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "mean_us": float(a.mean()), "max_us": float(a.max()), "n": int(a.size)}


def _time(f, args_list, rounds: int) -> dict[str, float]:
    clock = time.perf_counter_ns
    for a in args_list[:50]:  # warm-up (caches, lazy imports, memoised roofline rates)
        f(*a)
    out = []
    for _ in range(rounds):
        for a in args_list:
            t0 = clock()
            f(*a)
            out.append(clock() - t0)
    return _stats(out)


def profiles() -> list[str]:
    names = list(BASELINES)
    if "steersman" in POLICIES:
        names.append("steersman")
    else:
        print("note: no profile named 'steersman' is registered; skipping it")
    return names


def bench_size(n: int, decisions: int, rounds: int, names: list[str]) -> dict:
    t0 = time.perf_counter()
    wl = workload.build(n, requests=decisions)
    setup_s = time.perf_counter() - t0
    fleet, index, reqs = wl.fleet, wl.index, wl.requests
    gc.collect()
    gc.freeze()  # the warm index and requests are long-lived; keep them out of the timed collections
    snap = fleet.snapshot()
    res = {
        "replicas": n,
        "setup_s": setup_s,
        "index": {"blocks": len(index), "capacity": index.capacity, "warm_requests": wl.warm_requests,
                  "warm_blocks": wl.warm_blocks, "nbytes_estimate": index.nbytes_estimate()},
        "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in reqs])),
        "snapshot": _time(fleet.snapshot, [()] * decisions, rounds),
        "prefix_match": _time(index.match, [(r.block_hashes,) for r in reqs], rounds),
        "profiles": {},
    }
    held = np.array([index.match(r.block_hashes).max() for r in reqs], dtype=float)
    res["mean_best_match_share"] = float(np.mean(held / [len(r.block_hashes) or 1 for r in reqs]))
    for name in names:
        policy = POLICIES.get(name)(DEFAULTS.scheduler)
        res["profiles"][name] = _time(policy.pick, [(snap, r) for r in reqs], rounds)
    res["record"] = _time(index.record, [(i % n, r.block_hashes) for i, r in enumerate(reqs)], 1)  # after: it writes
    gc.unfreeze()
    return res


def table(results: list[dict], names: list[str]) -> str:
    sizes = [r["replicas"] for r in results]
    head = f"{'decision latency (us)':<26}" + "".join(f"{f'{n} replicas p50 / p99':>26}" for n in sizes)
    lines = [head, "-" * len(head)]

    def row(label, get):
        cells = []
        for r in results:
            s = get(r)
            cells.append(f"{s['p50_us']:>12.1f} / {s['p99_us']:<10.1f}" if s else f"{'-':>26}")
        lines.append(f"{label:<26}" + "".join(f"{c:>26}" for c in cells))

    for name in names:
        row(name, lambda r, name=name: r["profiles"].get(name))
    lines.append("-" * len(head))
    row("(snapshot build)", lambda r: r["snapshot"])
    row("(prefix match alone)", lambda r: r["prefix_match"])
    row("(index record)", lambda r: r["record"])
    lines.append("")
    for r in results:
        ix = r["index"]
        lines.append(f"{r['replicas']:>5} replicas: index {ix['blocks']:,} blocks ({ix['nbytes_estimate'] / 2**20:.0f} MiB "
                     f"counted) after {ix['warm_requests']:,} warm requests; mean prompt {r['mean_prompt_tokens']:.0f} "
                     f"tokens, best match {100 * r['mean_best_match_share']:.0f}% of it; setup {r['setup_s']:.1f} s")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 decisions x 2 rounds, 10 and 100 replicas")
    ap.add_argument("--replicas", default=None, help="comma-separated fleet sizes (default 10,100,1000)")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args()
    sizes = [int(x) for x in (args.replicas or ("10,100" if args.quick else "10,100,1000")).split(",")]
    decisions, rounds = (200, 2) if args.quick else (1000, 3)
    names = profiles()
    results = []
    for n in sizes:
        print(f"... {n} replicas", flush=True)
        results.append(bench_size(n, decisions, rounds, names))
    print()
    print(table(results, names))
    worst = {r["replicas"]: max(p["p99_us"] for p in r["profiles"].values()) for r in results}
    if 1000 in worst:
        verdict = "meets" if worst[1000] <= TARGET_P99_US else "misses"
        print(f"\nslowest profile p99 at 1,000 replicas: {worst[1000]:.1f} us ({verdict} the {TARGET_P99_US:.0f} us target)")
    doc = {
        "benchmark": "bench/scheduler decision latency",
        "target_p99_us_at_1000": TARGET_P99_US,
        "decisions_per_profile": decisions * rounds,
        "python": sys.version.split()[0], "numpy": np.__version__, "machine": platform.machine(),
        "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
        "results": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
