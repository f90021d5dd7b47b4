#!/usr/bin/env python
"""bench/policies/spread.py: steersman vs a workload's best baseline over a few loads around the calibrated one.

One calibrated load is one sample of a chaotic system: a policy change can move a single run's ratio by
+-10% while its mean over nearby loads stays put.  This reads the loads and best baselines of the last
``bench/policies/run.py`` run (its results.json), then runs steersman and that baseline at ``--factors`` x
each load (the agentic mix with seed = the factor's index, the traces do not depend on the seed) and prints
each goodput ratio and their mean, plus tasks per $ for the agentic mix, and the median over the loads of
steersman's and the baseline's TTFT p99 (the tail that goodput does not show).

    .venv/bin/python bench/policies/run.py                       # first: calibrate (writes results.json)
    .venv/bin/python bench/policies/spread.py                    # ~2 min on one core
    .venv/bin/python bench/policies/spread.py --workload mooncake --factors 0.9,1.0,1.1
    .venv/bin/python bench/policies/run.py --kv-events && .venv/bin/python bench/policies/spread.py \
        --results bench/policies/results-kv-events.json          # the engines publishing KV events
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import msgspec
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from calibrate import offered_window_goodput  # noqa: E402
from table import OURS  # noqa: E402
from workloads import bench_fleet, workloads  # noqa: E402

from steersman.twin.run import Experiment  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=HERE / "results.json", help="a bench/policies/run.py results file")
    ap.add_argument("--workload", action="append", help="only these workloads (repeat)")
    ap.add_argument("--factors", default="0.96,0.98,1.0,1.02,1.04", help="comma list of load multipliers")
    args = ap.parse_args(argv)
    try:
        doc = json.loads(args.results.read_text())
    except (OSError, ValueError) as e:
        ap.error(f"--results: {e} (run bench/policies/run.py first)")
    factors = [float(f) for f in args.factors.split(",")]
    meta = doc["meta"]
    mooncake = None if meta.get("mooncake_requests", "all") == "all" else int(meta["mooncake_requests"])
    fleet = bench_fleet(meta.get("engine_scheduling", "fcfs"))  # the engines of the run that calibrated the loads
    if meta.get("kv_events"):  # a run.py --kv-events calibration: its engines publish KV events
        fleet = msgspec.structs.replace(fleet, scheduler=replace(fleet.scheduler, kv_events=True))
    for wl in workloads(meta["trace_requests"], meta["agentic_duration_s"], mooncake):
        w = doc["workloads"].get(wl.name)
        if w is None or (args.workload and wl.name not in args.workload):
            continue
        base = w["ratios"]["best_baseline_goodput"]
        load = w["calibration"]["load"]
        rows = []
        for k, f in enumerate(factors):
            seed = k if wl.agentic else meta.get("seed", 0)
            got = {}
            for policy in (OURS, base):
                exp = Experiment(fleet, wl.spec, wl.base_dir, seed=seed)
                s = exp.run(policy, load * f)
                got[policy] = (offered_window_goodput(exp.last), s["successful_tasks_per_usd"] or 0.0,
                               s["ttft_s"]["p99"])
            rows.append((got[OURS][0] / max(got[base][0], 1e-12), got[OURS][1] / max(got[base][1], 1e-12),
                         got[OURS][2], got[base][2]))
        r = np.asarray(rows)
        each = " ".join(f"{x:.2f}" for x in r[:, 0])
        line = f"{wl.name:11} goodput vs {base}: mean {r[:, 0].mean():.3f} [{each}] at {factors} x load {load:.3g}"
        if wl.agentic:
            line += f"; tasks per $ mean {r[:, 1].mean():.3f}"
        line += f"; TTFT p99 median {np.median(r[:, 2]):.3g} s vs {np.median(r[:, 3]):.3g} s"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
