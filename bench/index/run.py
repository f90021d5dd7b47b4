"""bench/index: how long the prefix index holds the caller's thread (the gateway's event loop), per operation.

A request's index work is a ``match`` (its decision) and a ``record`` (where it went).  Most take tens of
µs, but a generation drop scans the whole table and a growth rehashes it: at the default budget (128 MiB,
4M slots) ~30 ms and up to ~100 ms on a 2-core VM, during which every stream the gateway relays waits.
This runs the same stream of operations through the index twice, side by side in one process:

* ``inline``: every pass on the caller's thread (the twin's index, and the gateway's before);
* ``background``: passes over big tables on a worker thread (``PrefixIndex(background=True)``, the gateway's).

Between two requests the caller spins ``--gap-us`` (the rest of a busy gateway's work, holding the GIL as it
would).  Prints per-operation p50/p99/p99.9/max on the caller's thread, how many held it over 5 and 20 ms,
and the ratios.  The prompts: ``--blocks`` random 16-token blocks each, unique, so the index fills, grows
to its largest table and then drops a generation every ``gen_cap`` blocks.

    .venv/bin/python bench/index/run.py [--requests 20000] [--blocks 512] [--gap-us 300]
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from steersman.config import DEFAULTS
from steersman.fleet import _prefix_table as T
from steersman.fleet.prefix_index import PrefixIndex
from steersman.text import BlockHashes


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(background: bool, prompts: list[BlockHashes], gap_s: float) -> dict:
    idx = PrefixIndex(4, DEFAULTS.scheduler.prefix_index_max_mib * 2**20, background=background)
    held = np.empty(len(prompts))
    t0 = time.perf_counter()
    for n, p in enumerate(prompts):
        spin(gap_s)
        t = time.perf_counter()
        idx.match(p)
        idx.record(n % 4, p)
        held[n] = time.perf_counter() - t
    wall = time.perf_counter() - t0
    waiting = len(idx._later)
    t = time.perf_counter()
    idx.close()
    ms = held * 1e3
    return {"wall_s": wall, "p50": np.median(ms), "p99": np.percentile(ms, 99), "p999": np.percentile(ms, 99.9),
            "max": ms.max(), "over5": int((ms > 5).sum()), "over20": int((ms > 20).sum()), "waiting": waiting,
            "close_ms": (time.perf_counter() - t) * 1e3, "slots": idx._tab.shape[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=512, help="16-token blocks per prompt")
    ap.add_argument("--gap-us", type=float, default=300.0, help="caller's other work between two requests")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    T.warm_up()  # as the gateway does at start
    rng = np.random.default_rng(a.seed)
    prompts = [BlockHashes.of(rng.integers(-2**62, 2**62, size=a.blocks, dtype=np.int64)) for _ in range(a.requests)]
    # the prompts (tuples of 10M ints in all) arrive over time on a gateway and die with their requests; made
    # up front here, they are frozen out of the collector's reach, as the gateway freezes its start-up heap
    # (otherwise its full collections, seconds long, hold the GIL and the worker waits on them)
    gc.freeze()
    print(f"{a.requests:,} requests of {a.blocks} unique blocks, {a.gap_us:.0f} us of other work between two; "
          f"index budget {DEFAULTS.scheduler.prefix_index_max_mib:.0f} MiB; ms the caller's thread is held per match+record")
    got = {}
    for name in ("inline", "background"):
        r = got[name] = run(name == "background", prompts, a.gap_us * 1e-6)
        print(f"  {name:10} p50 {r['p50']:.3f}  p99 {r['p99']:.3f}  p99.9 {r['p999']:7.2f}  max {r['max']:7.1f}   "
              f"held > 5 ms: {r['over5']:3d}, > 20 ms: {r['over20']:3d}   (table {r['slots']:,} slots; "
              f"{r['waiting']} records waiting at the end, close {r['close_ms']:.0f} ms; wall {r['wall_s']:.1f} s)")
    i, b = got["inline"], got["background"]
    print(f"  inline / background: p99.9 {i['p999'] / b['p999']:.0f}x, max {i['max'] / b['max']:.1f}x")


if __name__ == "__main__":
    main()
