#!/usr/bin/env python
"""The best prefix hit rate any router could reach on the peers sim workload (bench/peers/run.py --fleets sim).

The engine-sim replicas count, per admitted request, its prompt tokens as queried and the prompt blocks found
in their prefix cache as hit (at most ``(prompt tokens - 1) // 16`` blocks: the last token is always computed).
This feeds the same seeded requests, in order, to one cache that never evicts and holds every block any
request has computed: each request's hit is its longest prefix of blocks seen before.  No routing does
better: it could only lose blocks to replicas not holding them, to eviction, or to requests that run at
the same time as the one computing their prefix (16 streams start at once).  Prints the ceiling beside the
setups' rates from a results.json of run.py.

    .venv/bin/python bench/peers/hit_ceiling.py [--results bench/peers/results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import run  # noqa: E402

from steersman.api.prompt import prompt_shape  # noqa: E402
from steersman.api.schema import decode_chat  # noqa: E402

BLOCK = 16  # engine-sim's KV block (vLLM's default)


def ceiling(reqs, model: str, max_tokens: int) -> float:
    seen: set[int] = set()
    queried = hit = 0
    for r in reqs:
        body = json.dumps({"model": model, "messages": list(r.messages), "max_tokens": max_tokens}).encode()
        tokens, hashes = prompt_shape(decode_chat(body, 1 << 20), BLOCK)
        limit = min((tokens - 1) // BLOCK, len(hashes))
        n = 0
        while n < limit and hashes[n] in seen:
            n += 1
        queried += tokens
        hit += n * BLOCK
        seen.update(hashes)
    return hit / queried


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(HERE / "results.json"))
    a, rest = ap.parse_known_args(argv)
    args = run.parse_args(rest)
    spec, reqs, _, max_tokens = run.fleet_workload(args, "sim")
    c = ceiling(reqs, spec.model, max_tokens)
    print(f"sim workload ({len(reqs)} requests, seed {args.seed}): prefix hit ceiling {c:.1%}")
    p = Path(a.results)
    if p.exists():
        for row in json.loads(p.read_text()).get("fleets", {}).get("sim", []):
            if "prefix_hit_rate" in row:
                print(f"  {row['setup']:28} {row['prefix_hit_rate']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
