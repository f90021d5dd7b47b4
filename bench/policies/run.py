#!/usr/bin/env python
"""bench/policies: every routing profile through the digital twin, same fleet, same load near saturation.

    .venv/bin/python bench/policies/run.py            # full run (~3 min on one core here)
    .venv/bin/python bench/policies/run.py --quick    # fewer requests, 3 probe policies (~2-3 min)

Fleet: examples/twin-fleet.yaml (4x H100 + 4x A100, Llama-3.1-8B).  Workloads
(bench/policies/workloads.py): the Azure conversation and code traces, the whole
Mooncake trace (prefix-heavy) and the agentic mix of examples/agentic-mix.yaml.
For each workload the fleet's capacity is measured first (calibrate.py: the
highest rate any probed policy sustains in overload), then every profile runs at
``--target`` x that capacity (0.9: the best policy near 90% of capacity).

Per workload the table shows goodput (requests meeting their SLO per second of
the offered window, first to last arrival: the same arrivals give the same
denominator, and one straggler's drain does not dilute it),
its ratio to round-robin and to the best baseline (the best profile other than
steersman), SLO attainment, TTFT p50/p99, prefix-cache hit rate, $ per successful
task and successful tasks per $ (a task = a workflow, or a lone request).  Targets
(issue 4): on the prefix-heavy load goodput >= 2x round-robin and >= 1.3x the best
baseline; on the agentic mix successful tasks per $ >= 1.5x the best baseline.  One more row,
``steersman+reject``, is steersman with Mooncake's early rejection extended to standard requests
(``scheduler.shed_infeasible``, an opt-in: by default only 'sheddable' requests are refused when no replica
can meet their SLO); it is reported beside the others, never a baseline or the verdicts' subject.
Writes bench/policies/results.json (with ``--kv-events``: every engine publishes its KV events and the prefix
index reads them, for every profile; results-kv-events.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import msgspec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from calibrate import offered_window_goodput, probe  # noqa: E402
from table import EARLY_REJECT, opt_in_lines, print_workload, ratios, verdicts  # noqa: E402
from workloads import FLEET, bench_fleet, workloads  # noqa: E402

from steersman.policy import POLICIES  # noqa: E402
from steersman.twin.run import Experiment  # noqa: E402

BASELINES = ["round-robin", "random", "least-request", "power-of-two", "sglang-cache-aware", "llm-d", "dynamo-kv",
             "preble-e2"]
QUICK_PROBES = ["steersman", "least-request", "sglang-cache-aware"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and probe policies")
    ap.add_argument("--workload", action="append", help="only these workloads (repeat)")
    ap.add_argument("--policy", action="append", help="only these profiles (repeat; round-robin is always run)")
    ap.add_argument("--target", type=float, default=0.9, help="offered load as a share of the measured capacity")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="default: results.json (results-kv-events.json)")
    ap.add_argument("--engine-scheduling", choices=["fcfs", "priority"], default="fcfs",
                    help="every replica's engine scheduling policy (priority: vLLM --scheduling-policy priority; "
                         "each profile's requests carry their band, steersman's also its late flag)")
    ap.add_argument("--kv-events", action="store_true",
                    help="every simulated engine publishes its KV events and the prefix index reads each replica's "
                         "cache from them (scheduler.kv_events: what NVIDIA Dynamo's KV router and llm-d's precise "
                         "prefix scorer see), for every profile; writes results-kv-events.json unless --out")
    ap.add_argument("--no-opt-in", action="store_true",
                    help=f"skip the {EARLY_REJECT} row (steersman with early rejection of standard requests)")
    args = ap.parse_args(argv)

    # the full run plays the whole Mooncake trace (its prefix sharing builds up over it: see workloads.py)
    requests, agentic_s, mooncake = (600, 60.0, 1500) if args.quick else (1500, 180.0, None)
    policies = ["steersman", *BASELINES]
    if args.policy:
        unknown = [p for p in args.policy if p not in POLICIES._items]  # noqa: SLF001
        if unknown:
            ap.error(f"--policy: unknown profile(s) {unknown}")
        policies = [p for p in policies if p in args.policy or p == "round-robin"]
    probes = [p for p in (QUICK_PROBES if args.quick else policies) if p in policies]
    fleet = bench_fleet(args.engine_scheduling)
    if args.kv_events:
        fleet = msgspec.structs.replace(fleet, scheduler=replace(fleet.scheduler, kv_events=True))
    if args.out is None:
        args.out = HERE / ("results-kv-events.json" if args.kv_events else "results.json")
    # the opt-in row: Mooncake's early rejection for standard requests too (the default sheds only 'sheddable')
    rejecting = msgspec.structs.replace(fleet, scheduler=replace(fleet.scheduler, shed_infeasible=("standard", "sheddable")))
    chosen = [w for w in workloads(requests, agentic_s, mooncake) if not args.workload or w.name in args.workload]
    if not chosen:
        ap.error(f"--workload: none of {args.workload} is known")

    t_all = time.perf_counter()
    if args.kv_events:
        print("every engine publishes its KV events; steersman and dynamo-kv read each replica's cache from them, "
              "the other profiles the approximate index", flush=True)
    doc: dict = {"meta": {"fleet": str(FLEET.relative_to(HERE.parents[1])), "quick": args.quick, "seed": args.seed,
                          "target_share_of_capacity": args.target, "trace_requests": requests, "mooncake_requests": mooncake or "all",
                          "agentic_duration_s": agentic_s, "policies": policies, "probe_policies": probes,
                          "engine_scheduling": args.engine_scheduling, "kv_events": args.kv_events,
                          "python": platform.python_version(), "machine": platform.machine()},
                 "workloads": {}}
    for wl in chosen:
        t0 = time.perf_counter()
        print(f"\n== {wl.name}: measuring the fleet's capacity", flush=True)
        cap = probe(Experiment(fleet, wl.spec, wl.base_dir, args.seed), probes)
        load = cap.load_for(args.target)
        print(f"   capacity {cap.capacity_rps:.3g} req/s ({cap.best_policy} at {cap.probe_load:.3g}x); running every "
              f"profile at {args.target:.0%} of it: {load:.3g}x the workload's rate "
              f"({cap.offered_rps_at_1x * load:.3g} req/s)", flush=True)
        exp = Experiment(fleet, wl.spec, wl.base_dir, args.seed)
        for p in policies:
            t1 = time.perf_counter()
            s = exp.run(p, load)
            s["bench_goodput_rps"] = offered_window_goodput(exp.last)
            for k in ("timeline", "per_replica"):  # kept small: simulate writes these
                s.pop(k, None)
            print(f"   {p:<20} goodput {s['bench_goodput_rps']:7.3f}/s  SLO {100 * (s['slo_attainment'] or 0):5.1f}%  "
                  f"({time.perf_counter() - t1:.1f} s)", flush=True)
        summaries = {p: exp.runs[p][load] for p in policies}
        if "steersman" in policies and not args.no_opt_in:
            t1 = time.perf_counter()
            opt = Experiment(rejecting, wl.spec, wl.base_dir, args.seed)
            s = opt.run("steersman", load)
            s["bench_goodput_rps"] = offered_window_goodput(opt.last)
            for k in ("timeline", "per_replica"):
                s.pop(k, None)
            summaries[EARLY_REJECT] = s
            print(f"   {EARLY_REJECT:<20} goodput {s['bench_goodput_rps']:7.3f}/s  SLO "
                  f"{100 * (s['slo_attainment'] or 0):5.1f}%  ({time.perf_counter() - t1:.1f} s; opt-in)", flush=True)
        rat = ratios(summaries)
        print_workload(wl.name, load, cap, summaries, rat)
        doc["workloads"][wl.name] = {
            "prefix_heavy": wl.prefix_heavy, "agentic": wl.agentic, "calibration": cap.as_json(args.target),
            "policies": summaries, "ratios": rat, "wall_s": time.perf_counter() - t0}
    doc["verdicts"] = verdicts(doc["workloads"])
    doc["meta"]["wall_s"] = time.perf_counter() - t_all
    print()
    for v in doc["verdicts"]:
        ceiling = f"; at most {v['ceiling']:.2f}x if every task succeeded at this cost" if v.get("ceiling") else ""
        if v.get("ceiling_finished"):
            ceiling += (f", {v['ceiling_finished']:.2f}x if every task that finished in the window did (the others "
                        "were cut by its end, whatever the routing)")
        print(f"{'MET ' if v['met'] else 'MISSED'}  {v['target']}: measured {v['measured']:.2f}x "
              f"(vs {v['against']}{ceiling})")
    for line in opt_in_lines(doc["workloads"]):
        print(line)
    args.out.write_text(json.dumps(doc, indent=2, sort_keys=True))
    print(f"\nwrote {args.out} ({doc['meta']['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
