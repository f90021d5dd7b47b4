#!/usr/bin/env python
"""The slowest requests of one bench/peers setup, with their position in the run and their tenant.

Where a TTFT tail comes from (a cold first wave, a tenant's prompts piling onto one replica, ...):

    .venv/bin/python bench/peers/slowest.py steersman             # engine-sim fleet
    .venv/bin/python bench/peers/slowest.py vllm-router:cache_aware llama

Same engines, workload and seed as ``bench/peers/run.py``; prints the median TTFT and the 8 slowest
requests (the first request of each tenant is marked: its system prompt was cold everywhere).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import client  # noqa: E402
import run as R  # noqa: E402
from fleets import start_engines, start_router  # noqa: E402
from procs import ProcessGroup  # noqa: E402


def main() -> None:
    setup = sys.argv[1] if len(sys.argv) > 1 else "steersman"
    a = R.parse_args([])
    spec, reqs, conc, mt = R.fleet_workload(a, "llamacpp" if len(sys.argv) > 2 and sys.argv[2] == "llama" else "sim")
    pg = ProcessGroup(Path(tempfile.mkdtemp(prefix="peers-slowest-")))
    try:
        urls = start_engines(spec, pg, spec.name)
        base = start_router(setup, spec, pg, urls, Path(a.peers_venv))
        results, wall = asyncio.run(client.run(base, spec.model, reqs, conc, mt))
    finally:
        pg.stop_all()
    rows = sorted(((r.ttft if r.ttft is not None else float("inf")), i, reqs[i].tenant) for i, r in enumerate(results))
    first, seen = set(), set()
    for i, q in enumerate(reqs):
        if q.tenant is not None and q.tenant not in seen:
            seen.add(q.tenant)
            first.add(i)
    print(f"{setup}: {len(results)} requests in {wall:.2f} s, TTFT median {1e3 * rows[len(rows) // 2][0]:.1f} ms")
    for t, i, tenant in rows[-8:]:
        print(f"  {t * 1e3:8.1f} ms  request {i:3d}  tenant {tenant}{'  (first of its tenant)' if i in first else ''}")


if __name__ == "__main__":
    main()
