#!/usr/bin/env python
"""bench/policies/cache_bound.py: how much of the Mooncake trace's prompts any routing could find cached.

A routing policy cannot hit more than one cache as large as the whole fleet's KV, holding each block once (no
replica duplicating another's), with every request in trace order.  This feeds the trace's ``hash_ids`` (512-token
blocks) to one LRU cache of that size (and of 0.5x, 2x and unbounded) and prints the share of prompt blocks found
as a cached prefix.  Compare with the engines' hit rates in bench/policies' table (llm-d 32.7%, steersman 28.8%
on the whole trace): the gap left to routing.  LRU, not Belady, and running requests' blocks are not set aside,
so this is a yardstick rather than a strict bound.

    .venv/bin/python bench/policies/cache_bound.py          # ~2 s
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict

from workloads import FLEET, TRACES

from steersman.config import DEFAULTS
from steersman.fleet.config import load_fleet
from steersman.sim import EngineModel, gpu_profile, model_profile

MOONCAKE_BLOCK = 512  # tokens per hash_id in the Mooncake trace (its README)


def fleet_kv_tokens() -> int:
    total = 0
    for r in load_fleet(FLEET).simulated.replicas:
        e = EngineModel(gpu_profile(r.gpu), model_profile(r.model), DEFAULTS.engine, warm=True, now=0.0, keep_done=0)
        total += r.count * e.kv.num_blocks * e.block_size
    return total


def lru_prefix_hits(rows: list[list[int]], capacity: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hit = asked = 0
    for hs in rows:
        for h in hs:
            if h not in cache:
                break
            hit += 1
        asked += len(hs)
        for h in hs:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hit / max(asked, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(TRACES / "mooncake-synthetic.jsonl"))
    args = ap.parse_args(argv)
    with open(args.trace) as f:
        rows = [json.loads(line)["hash_ids"] for line in f if line.strip()]
    tokens = fleet_kv_tokens()
    blocks = tokens // MOONCAKE_BLOCK
    print(f"{len(rows)} requests; the fleet's KV holds {tokens:,} tokens = {blocks:,} Mooncake blocks")
    for share in (0.5, 1.0, 2.0, None):
        cap = int(blocks * share) if share else len({h for hs in rows for h in hs})
        name = f"{share}x the fleet's KV" if share else "unbounded"
        print(f"  one LRU cache of {name:>22}: {100 * lru_prefix_hits(rows, cap):5.1f}% of prompt blocks hit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
