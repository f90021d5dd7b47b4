#!/usr/bin/env python
"""Successful agent tasks per $ with every task run to its end (a diagnostic beside run.py, not its verdict).

run.py plays the agentic mix for ``agentic_duration_s`` (180 s) and stops: a task whose next call comes after
the window is *unfinished*, neither a success nor a failure.  The long tasks (copilots' 10-20 calls, research
agents' ~50) are mostly cut there, so its tasks per $ counts mostly the short ones, and ~40% of the tasks of
every profile are unfinished whatever the routing (run.py prints the ceiling this leaves).  Here new tasks
stop starting at the window's end but every task started runs to its end (the sources' ``end_s``, no stop):
each task is a success or a failure, and the cost is the fleet's GPU-hours until the last call ends (idle
included, as always; a profile that leaves one task crawling for an hour pays that hour).

The load is run.py's: ``--load`` (the workload's rate multiple; run.py's calibration prints it: 4.97x at 90%
of the capacity on the bench fleet), or ``--results`` to read it from a results.json.  Rows: every profile
asked, and steersman with ``admission.workflow_missed_demotion`` at each ``--demotion`` (opt-in there).

    .venv/bin/python bench/policies/drained.py                       # at run.py's calibrated load (4.97x)
    .venv/bin/python bench/policies/drained.py --load 7.18 --demotion 2   # ~1.3x the capacity
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import msgspec
import yaml

from workloads import AGENTIC, bench_fleet

from steersman.twin.run import Experiment

PROFILES = "steersman,sglang-cache-aware,preble-e2,llm-d,dynamo-kv,round-robin"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load", type=float, default=None, help="the mix's rate multiple (default: from --results, else 4.97)")
    ap.add_argument("--results", type=Path, default=None, help="a run.py results.json whose agentic load to use")
    ap.add_argument("--window", type=float, default=180.0, help="seconds in which tasks start (run.py's 180)")
    ap.add_argument("--policies", default=PROFILES)
    ap.add_argument("--demotion", type=int, action="append", default=[], help="steersman rows with this demotion")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    load = a.load
    if load is None and a.results is not None:
        load = json.loads(a.results.read_text())["workloads"]["agentic"]["calibration"]["load"]
    load = 4.97 if load is None else load
    mix = yaml.safe_load(AGENTIC.read_text())
    mix.pop("duration_s", None)
    for src in mix["sources"]:
        src["end_s"] = a.window
    fleet = bench_fleet()
    rows = [(p, p, fleet) for p in a.policies.split(",")]
    for d in a.demotion:
        rows.append((f"steersman+demotion{d}", "steersman",
                     msgspec.structs.replace(fleet, admission=replace(fleet.admission, workflow_missed_demotion=d))))
    print(f"agentic mix, tasks starting for {a.window:g} s at {load:.3g}x its rate, every task run to its end")
    print(f"{'profile':24} {'tasks':>6} {'ok':>6} {'ok %':>6} {'SLO %':>6} {'last end s':>10} {'cost $':>8} "
          f"{'ok/$':>7} {'wall s':>6}")
    out = {}
    for name, policy, f in rows:
        t = time.perf_counter()
        s = Experiment(f, mix, AGENTIC.parent, a.seed).run(policy, load)
        out[name] = s
        print(f"{name:24} {s['tasks']:6d} {s['tasks_succeeded']:6d} {100 * s['tasks_succeeded'] / max(s['tasks'], 1):6.1f} "
              f"{100 * (s['slo_attainment'] or 0):6.1f} {s['duration_s']:10.0f} {s['cost_usd']:8.3f} "
              f"{s['successful_tasks_per_usd']:7.1f} {time.perf_counter() - t:6.1f}", flush=True)
    ours = out.get("steersman")
    base = {k: v for k, v in out.items() if not k.startswith("steersman")}
    if ours and base:
        by_count = max(base, key=lambda k: base[k]["tasks_succeeded"])
        by_usd = max(base, key=lambda k: base[k]["successful_tasks_per_usd"])
        print(f"steersman: successful tasks {ours['tasks_succeeded'] / max(base[by_count]['tasks_succeeded'], 1):.2f}x "
              f"{by_count}'s; tasks per $ {ours['successful_tasks_per_usd'] / base[by_usd]['successful_tasks_per_usd']:.2f}x "
              f"{by_usd}'s (the best baseline on each)")


if __name__ == "__main__":
    main()
