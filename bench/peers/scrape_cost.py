"""CPU a llama-server spends answering the gateway's scrapes (/metrics + /slots every 50 ms), vs idle.

    .venv/bin/python bench/peers/scrape_cost.py [--seconds 10]     # needs `make llama`
"""

from __future__ import annotations

import argparse
import asyncio
import time

import psutil

from steersman.fleet.processes import LlamaServerFleet
from steersman.testing import LiveFleet


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    window = ap.parse_args().seconds
    fleet = LlamaServerFleet(1)
    asyncio.run(fleet.start())
    proc = psutil.Process(fleet.procs[0].pid)

    def cpu_s() -> float:
        t = proc.cpu_times()
        return t.user + t.system

    def measure() -> float:
        time.sleep(1.0)  # settle
        c0 = cpu_s()
        time.sleep(window)  # the measured window (wall time is the point here)
        return cpu_s() - c0

    try:
        idle = measure()
        with LiveFleet(endpoints=fleet.endpoints()):
            scraped = measure()
    finally:
        asyncio.run(fleet.stop())
    print(f"llama-server CPU per second: idle {idle / window * 1e3:.1f} ms, "
          f"scraped every 50 ms (/metrics + /slots) {scraped / window * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
