#!/usr/bin/env python
"""The gateway queue under a long overload: what one dispatch pass costs when many requests wait.

N requests wait in the control plane's queue with their TTFT budgets spent (a long overload leaves the queue
like this), one replica has room, and the real ``steersman`` policy routes: each ``dispatch`` pops one request,
as the live gateway does at each request end.  Prints the time a dispatched request costs for each N, and,
with ``--baseline-src`` (another checkout's ``src``), the same measured in a subprocess running that code,
side by side, with the ratio.  Before the walk was bounded (thirty-first session) a pop walked the whole queue.

    .venv/bin/python bench/scheduler/queue_pass.py
    .venv/bin/python bench/scheduler/queue_pass.py --baseline-src /tmp/head/src   # old vs new, one run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def measure(sizes: list[int], pops: int) -> dict[int, float]:
    from steersman.config.admission import AdmissionSettings
    from steersman.control import DefaultAdmitter, GatewayQueue, TenantConfig
    from steersman.control.plane import ControlPlane, Dispatch
    from steersman.policy import make_policy
    from steersman.policy.request import LatencyBudget, PriorityClass
    from steersman.testing.snapshots import fleet_snapshot, sched_request

    full = fleet_snapshot(2, waiting=[99, 99])  # saturated: arrivals wait
    free = fleet_snapshot(2)
    out = {}
    for n in sizes:
        s = AdmissionSettings(queue_max_entries=n + pops + 1)
        p = ControlPlane(make_policy("steersman"), DefaultAdmitter(s), GatewayQueue(s))
        t = TenantConfig("t", PriorityClass.STANDARD)
        seq = 0

        def push(now: float) -> None:
            nonlocal seq
            p.arrive(seq, sched_request(seq=seq, budget=LatencyBudget(ttft_s=2.0)), t, full, now)
            seq += 1

        for _ in range(n):
            push(0.0)
        best = float("inf")
        for rep in range(3):
            t0 = time.perf_counter()
            for k in range(pops):
                now = 100.0 + rep * pops + k  # every budget spent: the first pass finds nothing
                got = p.dispatch(lambda: free, now, limit=1)
                assert len(got) == 1 and isinstance(got[0][1], Dispatch)
                push(now)  # the queue stays N long
            best = min(best, (time.perf_counter() - t0) / pops)
        out[n] = best * 1e6
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,4000")
    ap.add_argument("--pops", type=int, default=200)
    ap.add_argument("--baseline-src", default=None, help="another checkout's src/ to compare with")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # (the subprocess's answer)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    if a.json:
        print(json.dumps(measure(sizes, a.pops)))
        return 0
    base = None
    if a.baseline_src:
        env = {**os.environ, "PYTHONPATH": a.baseline_src}
        r = subprocess.run([sys.executable, __file__, "--sizes", a.sizes, "--pops", str(a.pops), "--json"], env=env,
                           capture_output=True, text=True, check=True)
        base = {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    new = measure(sizes, a.pops)
    print(f"{'queued':>8} {'us a dispatched request':>24}" + (f" {'baseline':>10} {'ratio':>7}" if base else ""))
    for n in sizes:
        row = f"{n:>8} {new[n]:>24.1f}"
        if base:
            row += f" {base[n]:>10.1f} {base[n] / new[n]:>6.1f}x"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
