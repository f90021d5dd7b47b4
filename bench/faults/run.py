#!/usr/bin/env python3
"""bench/faults: live fault drills against engine-sim replicas behind the gateway, by named scenario.

    python bench/faults/run.py                 # every scenario
    python bench/faults/run.py overload        # one (or several) by name
    python bench/faults/run.py overload --factor 3 --seconds 8

Scenarios register in ``SCENARIOS`` (name -> function(args) -> list of (metric, value, target) rows);
each prints its rows side by side with the issue's targets, measured in this one run.

* ``overload`` — capacity measured first (closed loop), then ``factor`` x that rate of a critical and
  a standard tenant whose clients retry 429/503 after Retry-After: retry amplification, goodput vs
  capacity, critical SLO attainment, Retry-After coverage, gateway queue high-water mark.
* ``cascade`` — one replica degrades 5x under 0.7x-capacity load with retrying clients, then recovers:
  failures, goodput before / during, recovery time after the fault clears.
* ``kill`` — ``bench/faults/kill.py``: a replica dies mid-stream; lost / duplicated tokens, migrations.
* ``chaos`` — ``steersman.testing.chaos``: 60 s of mixed load while every fault kind (5xx, slow, hang, refused
  connections, a crash and restart) hits a random replica in turn; every answer checked against a reference engine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from steersman.testing.drills import cascade, overload

Row = tuple[str, float, str]
SCENARIOS: dict[str, Callable[[argparse.Namespace], list[Row]]] = {}


def scenario(name: str):
    def add(f):
        SCENARIOS[name] = f
        return f

    return add


@scenario("overload")
def _overload(a: argparse.Namespace) -> list[Row]:
    r = overload(factor=a.factor, seconds=a.seconds)
    return [
        ("capacity (req/s, measured first)", r.capacity_rps, ""),
        ("offered (req/s)", r.offered_rps, f"{a.factor:g}x capacity"),
        ("retry amplification (upstream attempts / client HTTP requests)", r.amplification, "<= 1.1"),
        ("upstream attempts / unique client requests", r.attempts_per_request, "<= 1.1"),
        ("goodput / capacity", r.goodput_ratio, ">= 0.90"),
        ("critical SLO attainment (TTFT within the standard target)", r.critical_attainment, ">= 0.99"),
        ("429/503 answers without Retry-After", r.retry_after_missing, "0"),
        ("gateway queue high-water mark", r.queue_high_water, "<= admission.queue_max_entries (1024)"),
        ("critical p99 TTFT (s)", r.p99_ttft_critical_s, ""),
    ]


@scenario("cascade")
def _cascade(a: argparse.Namespace) -> list[Row]:
    r = cascade(slowdown=5.0, load=0.7, speedup=10.0)
    return [
        ("capacity (req/s, measured first; engines 10x real time)", r.capacity_rps, ""),
        ("failed / total requests", r.failed / max(1, r.total), "<= 0.01"),
        ("goodput during the fault / before", r.goodput_during / max(1e-9, r.goodput_before), ">= 0.8"),
        ("recovery after the fault clears (s, engine time x10)", r.recovery_s * 10.0, "<= 60"),
        ("slow replica ejected", float(r.replica_ejected), "(routing may avoid it first)"),
    ]


@scenario("kill")
def _kill(a: argparse.Namespace) -> list[Row]:
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kill  # bench/faults/kill.py: its own engineer's scenario, with its own CLI

    r = kill.run([])
    itl99 = max(r["itl_p99_ms"], 1e-9)
    return [
        ("streams completed / started", r["completed"] / max(1, r["streams"]), "1.0"),
        ("lost tokens", r["lost_tokens"], "0"),
        ("duplicated tokens", r["duplicated_tokens"], "0"),
        ("usage mismatches", r["usage_mismatches"], "0"),
        ("migrations", r["migrations"], ""),
        ("worst failover gap / normal p99 inter-token gap", max(r["failover_gap_ms"], default=0.0) / itl99, ""),
    ]


@scenario("chaos")
def _chaos(a: argparse.Namespace) -> list[Row]:
    from steersman.testing.chaos import run as chaos  # needs the openai client (the test extra)

    r = chaos(seconds=60.0, concurrency=24, seed=1)
    print(r.summary())
    failed = sum(r.failures.values())
    return [
        ("requests under random faults (60 s, 24 clients, 4 replicas)", r.requests, ""),
        ("faults injected (errors, slow, hang, refuse, die+restart)", sum(r.faults.values()), ""),
        ("answers that differ from the reference engine's", len(r.mismatches), "0"),
        ("failed / requests", failed / max(1, r.requests), "<= 0.01"),
        ("failed after part of the stream was sent", sum(n for (_, partial), n in r.failures.items() if partial), "0"),
        ("slowest request (s)", r.slowest_s, "< 30"),
        ("recovery requests that succeeded / sent", r.recovery_ok / max(1, r.recovery), "1.0"),
        ("requests left in flight at the gateway", r.in_flight_after, "0"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenarios", nargs="*", help=f"names (default: all): {', '.join(SCENARIOS)}")
    p.add_argument("--factor", type=float, default=3.0, help="overload: offered load / capacity")
    p.add_argument("--seconds", type=float, default=8.0, help="overload: seconds of overload")
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args(argv)
    names = a.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}")
    out = {}
    for name in names:
        t0 = time.monotonic()
        rows = SCENARIOS[name](a)
        out[name] = rows
        print(f"\n== {name} ({time.monotonic() - t0:.0f} s)")
        for metric, value, target in rows:
            print(f"  {metric:<66} {value:>10.3f}   {target}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
