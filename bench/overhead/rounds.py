#!/usr/bin/env python
"""bench/overhead/rounds.py: one concurrency, every setup, in interleaved rounds (for noisy machines).

``run.py`` measures each setup once, one after another; on a shared VM the engines' own TTFT drifts
by a millisecond or more between phases a minute apart (the same gateway code read 5.98 and 9.06 ms
at 64 streams in two runs), which is more than the 0.5 ms target it judges.  This starts the engines
and every router once, then runs short phases at one concurrency round-robin over the setups, the
order rotated every round, and reports per setup the median over rounds of the added TTFT
(setup minus ``direct`` in the same round), with its range, and of the router's CPU per request.

    .venv/bin/python bench/overhead/rounds.py --layout isolated --setups direct,steersman-rr,steersman
    .venv/bin/python bench/overhead/rounds.py --layout isolated --setups steersman --baseline-bin WRAPPER \
        --rounds 8 --concurrency 64     # old vs new tree, interleaved

Takes the options of ``run.py`` (``--concurrency``: the first value is used) plus ``--rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import Bench, pinned_group  # noqa: E402
from options import parse_args  # noqa: E402
from setups import SkipSetup, start_engines, start_router  # noqa: E402


async def rounds(bench: Bench, n_rounds: int, conc: int) -> dict[str, list[dict]]:
    a = bench.a
    bench.engines, bench.engine_urls = start_engines(a, bench.pg, bench.log)
    # direct: the streams spread evenly over every engine (what a free, perfect round-robin router would do)
    urls: dict[str, tuple[str | list[str], object]] = {"direct": ([u + bench.path for u in bench.engine_urls], None)}
    for setup in a.setups:
        if setup == "direct":
            continue
        try:
            proc, base, waited = start_router(setup, a, bench.pg, bench.engine_urls)
        except SkipSetup as e:
            bench.log(f"SKIP {setup}: {e}")
            continue
        urls[setup] = (base + bench.path, proc)
        bench.log(f"{setup} ready at {base} in {waited:.2f}s (pid {proc.pid})")
    order = [s for s in a.setups if s in urls]
    got: dict[str, list[dict]] = {s: [] for s in order}
    for r in range(n_rounds):
        k = r % len(order)
        for setup in order[k:] + order[:k]:
            url, proc = urls[setup]
            s = await bench.phase(url, conc, bench.body, a.duration, proc)
            got[setup].append({"round": r, "ttft_p50": s["ttft_ms"]["p50"], "ttft_p99": s["ttft_ms"]["p99"],
                               "itl_p50": s["itl_ms"]["p50"], "rps": s["rps"], "errors": s["errors"],
                               "router_us_per_req": s["cpu"]["router_us_per_req"]})
            bench.log(f"round {r + 1}/{n_rounds} {setup:<18} c={conc} TTFT p50 {s['ttft_ms']['p50']:.3f} "
                      f"p99 {s['ttft_ms']['p99']:.3f} ms  err {s['errors']}")
    return got


def report(got: dict[str, list[dict]], conc: int) -> dict:
    direct = {x["round"]: x for x in got.get("direct", [])}
    out = {}
    print(f"\nc={conc}, {max(len(v) for v in got.values())} rounds; medians over rounds, [min, max]")
    print(f"{'setup':<20}{'TTFT p50':>10}{'added p50':>24}{'added p99':>12}{'router us/req':>15}{'served/s':>10}"
          f"{'refused':>9}")
    for setup, rows in got.items():
        p50 = np.array([x["ttft_p50"] for x in rows])
        add = np.array([x["ttft_p50"] - direct[x["round"]]["ttft_p50"] for x in rows if x["round"] in direct])
        add99 = np.array([x["ttft_p99"] - direct[x["round"]]["ttft_p99"] for x in rows if x["round"] in direct])
        cpu = [x["router_us_per_req"] for x in rows if x["router_us_per_req"] is not None]
        row = {"ttft_p50_ms": float(np.median(p50)), "rounds": rows}
        text = f"{setup:<20}{np.median(p50):10.3f}"
        if setup != "direct" and add.size:
            row.update(added_p50_ms=float(np.median(add)), added_p50_range_ms=[float(add.min()), float(add.max())],
                       added_p99_ms=float(np.median(add99)))
            text += f"{np.median(add):+10.3f} [{add.min():+.2f}, {add.max():+.2f}]{np.median(add99):+12.3f}"
        else:
            text += f"{'':>24}{'':>12}"
        if cpu:
            row["router_us_per_req"] = float(np.median(cpu))
            text += f"{np.median(cpu):15.0f}"
        else:
            text += f"{'':>15}"
        # served = completed requests a second (TTFT is theirs); refused = the requests answered with an error
        row["served_per_s"] = float(np.median([x["rps"] for x in rows]))
        row["refused"] = float(np.median([x["errors"] for x in rows]))
        text += f"{row['served_per_s']:10.0f}{row['refused']:9.0f}"
        print(text)
        out[setup] = row
    return out


def main(argv=None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--rounds", type=int, default=6)
    pre.add_argument("--duration", type=float, default=4.0, help="seconds measured per phase")
    pre.add_argument("--out", default=str(HERE / "rounds.json"))
    known, rest = pre.parse_known_args(argv)
    a = parse_args([*rest, "--duration", str(known.duration), "--out", known.out])
    conc = a.concurrency[0]
    pg, _ = pinned_group(a, "steersman-bench-rounds-")
    bench = Bench(a, pg)
    print(f"logs: {pg.log_dir}", flush=True)
    try:
        try:
            import uvloop

            got = uvloop.run(rounds(bench, known.rounds, conc))
        except ImportError:
            got = asyncio.run(rounds(bench, known.rounds, conc))
    except KeyboardInterrupt:
        print("\ninterrupted; stopping processes", file=sys.stderr)
        return 130
    finally:
        pg.stop_all()
    summary = report(got, conc)
    Path(a.out).write_text(json.dumps({"argv": sys.argv[1:], "concurrency": conc, "elapsed_s":
                                       round(time.monotonic() - bench.t_start, 1), "setups": summary}, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
