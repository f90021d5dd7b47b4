"""steersman vs the peer routers on the same engines, in one run (bench/README.md).

For each fleet (2 real llama-server replicas of Gemma 3 270M; N engine-sim replicas for a larger
fleet) and each setup (steersman default profile, sglang-router cache_aware / round_robin,
vllm-router cache_aware), the engines are started fresh (empty prefix caches), the router in front,
and the same seeded workload is sent: tenants sharing long system prompts plus unique prompts,
closed loop.  Reported: TTFT p50/p99, output tokens/s, the prefix-cache hit rate read from the
engines' own counters, and added latency (the median of TTFT through the router minus direct to an
engine over back-to-back pairs, short prompts, one at a time, connections kept alive, less the engine's
own prompt time where it reports it).  Ratios are
against steersman, all from this run.

    .venv/bin/python bench/peers/run.py                 # both fleets, ~4-6 minutes on 2 cores
    .venv/bin/python bench/peers/run.py --fleets sim --sim-replicas 8
    .venv/bin/python bench/peers/run.py --fleets llamacpp --rounds 3   # medians of 3 rounds, order rotated
    .venv/bin/python bench/peers/run.py --setups steersman,steersman@base --baseline-bin WRAPPER  # old vs new code

With ``--rounds K`` every setup runs K times, the setups' order rotated each round (so none always
runs first or last on a drifting machine); the table shows each column's median over the rounds, and
a second table counts in how many rounds steersman beat each peer on each column.  48 requests on
two llama-server replicas give a TTFT p50 that moves 2x between runs; the medians and the counts are
what to read there.  ``steersman@base`` runs the ``--baseline-bin`` executable (e.g. a script running
``python -m steersman`` with ``PYTHONPATH`` set to a worktree of an older commit) in the same run.
``http-floor`` (opt-in, a reference, not a router) is steersman's own HTTP server and upstream pool
relaying round-robin with no pipeline (bench/overhead/stack_proxies.py ``steersman-http``): steersman's
added latency less this row's is what its request path (parsing, admission, prompt shape, decision,
accounting) costs.  ``steersman+busy-poll`` (opt-in) is the default steersman with ``gateway.busy_poll_s: 0.05``
(HAProxy-style busy polling, off by default: it spends a core while traffic flows; steersman/http/busypoll.py).
``steersman+kv-events`` (opt-in, engine-sim fleet only) is the default steersman with every engine publishing its KV
events and the gateway reading each replica's cache from them (``endpoints[].kv_events``).
``steersman+no-preconnect`` (opt-in) is the default steersman without the spare upstream connection opened when an
engine closes one (``gateway.upstream_preconnect``; llama-server closes the connection after every streamed
response, so without a spare every request waits for a connect).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import client  # noqa: E402
from fleets import FleetSpec, SkipSetup, prefix_counters, start_engines, start_router  # noqa: E402
from procs import ProcessGroup  # noqa: E402
from workload import Request, requests  # noqa: E402

#: steersman:batch is the same gateway and profile with every request in the `batch` SLO class
#: (x-steersman-slo: batch, no TTFT target), which the peers ignore: it shows what the default
#: `standard` class's 2 s TTFT target does to routing when the engines are this slow.
SETUPS = ["steersman", "steersman:batch", "sglang-router:cache_aware", "sglang-router:round_robin", "vllm-router:cache_aware"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--fleets", default="llamacpp,sim", help="comma list: llamacpp, sim")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--llama-replicas", type=int, default=2)
    ap.add_argument("--sim-replicas", type=int, default=4)
    ap.add_argument("--sim-speedup", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--llama-requests", type=int, default=48)
    ap.add_argument("--llama-concurrency", type=int, default=4)
    ap.add_argument("--llama-max-tokens", type=int, default=16)
    ap.add_argument("--sim-requests", type=int, default=400)
    ap.add_argument("--sim-concurrency", type=int, default=16)
    ap.add_argument("--sim-max-tokens", type=int, default=32)
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--unique-frac", type=float, default=0.2)
    ap.add_argument("--probe-pairs", type=int, default=40, help="added-latency probe: direct/router request pairs")
    ap.add_argument("--rounds", type=int, default=1, help="run every setup this many times, order rotated; report medians")
    ap.add_argument("--baseline-bin", default=None,
                    help="a `steersman` executable of older code: setup steersman@base runs it (old vs new in one run)")
    ap.add_argument("--peers-venv", default=str(HERE.parent / ".venv-peers"))
    ap.add_argument("--out", default=str(HERE / "results.json"))
    return ap.parse_args(argv)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _probe(router: str, directs: list[str], model: str, pairs: int, fresh: bool = False) -> float:
    """Added latency (seconds): the median over ``pairs`` back-to-back pairs of (TTFT via the router - TTFT
    direct to an engine), short unique prompts, one output token, the pair's order alternating and the direct
    request going to each engine in turn; on engines that report their own prompt time (llama-server), each
    TTFT less that time (:func:`client.probe`): a 20-token prompt costs ~5 ms a token there on a slow VM, and
    which slot a router's choice lands on decides how much of it is reused (steersman's probes read ~8 ms
    faster than direct on plain TTFT).

    By default each target keeps one connection alive for the whole probe (two untimed requests open and
    warm it), as an OpenAI client's pool does and as the router keeps its own to the engines.  ``fresh``: a
    new connection per request (a client without a pool), which also times each server's accept.
    """
    timeout = aiohttp.ClientTimeout(total=120)

    def session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1, force_close=fresh), timeout=timeout)

    sessions = {u: session() for u in [router, *directs]}
    try:
        for u, s in sessions.items():
            for k in range(2):
                await client.probe(s, u, model, f"Warm-up {k} {u[-5:]}: say ok.")
        diffs = []
        for i in range(pairs):
            direct = directs[i % len(directs)]
            got = {}
            for url in ((direct, router) if (i // len(directs)) % 2 else (router, direct)):
                got[url] = await client.probe(sessions[url], url, model, f"Probe {i} {url[-5:]}{'n' if fresh else ''}: say ok.")
            if got[router] is not None and got[direct] is not None:
                diffs.append(got[router] - got[direct])
        if len(diffs) < pairs:
            print(f"  added-latency probe{' (new conn)' if fresh else ''}: {pairs - len(diffs)} of {pairs} pairs failed",
                  flush=True)
        return statistics.median(diffs) if diffs else float("nan")
    finally:
        for s in sessions.values():
            await s.close()


def fleet_workload(a, fleet: str) -> tuple[FleetSpec, list[Request], int, int]:
    """The fleet ``llamacpp`` or ``sim`` and its seeded workload: (spec, requests, streams, max tokens)."""
    if fleet == "llamacpp":
        return (FleetSpec("llamacpp", a.llama_replicas, "gemma-3-270m", "llamacpp"),
                requests(a.llama_requests, a.tenants, 260, a.unique_frac, 120, a.seed),
                a.llama_concurrency, a.llama_max_tokens)
    if fleet == "sim":
        return (FleetSpec("sim", a.sim_replicas, "llama-3.1-8b", "engine-sim", sim_speedup=a.sim_speedup),
                requests(a.sim_requests, a.tenants * 3, 1500, a.unique_frac, 600, a.seed),
                a.sim_concurrency, a.sim_max_tokens)
    raise SystemExit(f"unknown fleet {fleet!r}")


def run_setup(setup: str, spec: FleetSpec, reqs: list[Request], a, conc: int, max_tokens: int, log) -> dict:
    pg = ProcessGroup(Path(tempfile.mkdtemp(prefix=f"peers-{spec.name}-")))
    try:
        if setup == "steersman+kv-events" and spec.name != "sim":
            log(f"  skip {setup}: only engine-sim publishes KV events here (llama-server has none)")
            return {"setup": setup, "skipped": "no KV events from llama-server"}
        events: list[str] | None = [] if setup == "steersman+kv-events" else None
        urls = start_engines(spec, pg, spec.name, events)
        try:
            base = start_router(setup, spec, pg, urls, Path(a.peers_venv),
                                steersman_bin=a.baseline_bin if setup.startswith("steersman@base") else None,
                                kv_events=events)
        except SkipSetup as e:
            log(f"  skip {setup}: {e}")
            return {"setup": setup, "skipped": str(e)}
        q0, h0 = prefix_counters(spec, urls)
        hdrs = {"x-steersman-slo": "batch"} if setup == "steersman:batch" else None
        results, wall = asyncio.run(client.run(base, spec.model, reqs, conc, max_tokens, headers=hdrs))
        q1, h1 = prefix_counters(spec, urls)
        added = asyncio.run(_probe(base, urls, spec.model, a.probe_pairs))
        added_new = asyncio.run(_probe(base, urls, spec.model, a.probe_pairs, fresh=True))
    finally:
        pg.stop_all()
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok]
    errors = sorted({r.error for r in results if not r.ok})[:3]
    return {
        "setup": setup, "requests": len(results), "ok": len(ok), "errors": errors, "wall_s": wall,
        "ttft_p50_ms": _pct(ttfts, 0.5) * 1e3, "ttft_p99_ms": _pct(ttfts, 0.99) * 1e3,
        "output_tok_s": sum(r.tokens for r in ok) / wall if wall > 0 else 0.0,
        "prefix_hit_rate": (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0,
        "added_ttft_p50_ms": added * 1e3,
        "added_new_conn_ms": added_new * 1e3,
    }


#: the columns compared, and whether lower is better
COLUMNS = (("ttft_p50_ms", True), ("ttft_p99_ms", True), ("output_tok_s", False), ("prefix_hit_rate", False),
           ("added_ttft_p50_ms", True), ("added_new_conn_ms", True))


def medians(runs: list[dict]) -> dict:
    """One row per setup from its rounds: each column's median (a setup skipped in any round is skipped)."""
    skipped = next((r for r in runs if "skipped" in r), None)
    if skipped is not None:
        return skipped
    row = {"setup": runs[0]["setup"], "rounds": len(runs), "requests": sum(r["requests"] for r in runs),
           "ok": sum(r["ok"] for r in runs), "errors": sorted({e for r in runs for e in r["errors"]})[:3]}
    for col, _ in COLUMNS:
        row[col] = statistics.median(r[col] for r in runs)
    return row


def wins(by_setup: dict[str, list[dict]]) -> list[str]:
    """Per peer and column: in how many rounds steersman was better (ties count half)."""
    ref = by_setup.get("steersman")
    if not ref or any("skipped" in r for r in ref):
        return []
    lines = ["rounds steersman won, per peer and column (a tie counts half)"]
    for setup, runs in by_setup.items():
        if setup == "steersman" or any("skipped" in r for r in runs):
            continue
        cells = []
        for col, lower in COLUMNS:
            w = 0.0
            for mine, theirs in zip(ref, runs):
                a, b = mine[col], theirs[col]
                w += 0.5 if a == b else float((a < b) if lower else (a > b))
            cells.append(f"{col} {w:g}/{len(runs)}")
        lines.append(f"  {setup:26} " + "  ".join(cells))
    return lines


def table(fleet: str, rows: list[dict]) -> str:
    ref = next((r for r in rows if r["setup"] == "steersman" and "skipped" not in r), None)
    head = f"{'setup':28} {'ok':>7} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'out tok/s':>10} {'prefix hit':>10} {'added ms':>9} {'new conn':>9}"
    lines = [f"== {fleet}" + (f" (medians of {rows[0]['rounds']} rounds)" if rows and rows[0].get("rounds", 1) > 1 else ""),
             head]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['setup']:28} skipped: {r['skipped']}")
            continue
        lines.append(f"{r['setup']:28} {r['ok']:>3}/{r['requests']:<3} {r['ttft_p50_ms']:12.1f} {r['ttft_p99_ms']:12.1f} "
                     f"{r['output_tok_s']:10.1f} {r['prefix_hit_rate']:10.1%} {r['added_ttft_p50_ms']:9.2f} {r['added_new_conn_ms']:9.2f}")
    if ref is not None:
        lines.append("ratios peer/steersman (TTFT: >1 means steersman faster; tok/s and hit rate: <1 means steersman ahead)")
        for r in rows:
            if r is ref or "skipped" in r:
                continue
            lines.append(f"  {r['setup']:26} TTFT p50 x{r['ttft_p50_ms'] / ref['ttft_p50_ms']:.2f}  "
                         f"p99 x{r['ttft_p99_ms'] / ref['ttft_p99_ms']:.2f}  tok/s x{r['output_tok_s'] / max(ref['output_tok_s'], 1e-9):.2f}  "
                         f"hit x{r['prefix_hit_rate'] / max(ref['prefix_hit_rate'], 1e-9):.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    setups = [s for s in a.setups.split(",") if s]
    out: dict = {"args": vars(a), "fleets": {}}
    for fleet in [f for f in a.fleets.split(",") if f]:
        spec, reqs, conc, mt = fleet_workload(a, fleet)
        by_setup: dict[str, list[dict]] = {s: [] for s in setups}
        for k in range(a.rounds):
            order = setups[k % len(setups):] + setups[:k % len(setups)]  # rotated: no setup always first or last
            for setup in order:
                tag = f" round {k + 1}/{a.rounds}" if a.rounds > 1 else ""
                log(f"{fleet}:{tag} {setup} ({len(reqs)} requests, {conc} streams, {spec.replicas} replicas)")
                r = run_setup(setup, spec, reqs, a, conc, mt, log)
                by_setup[setup].append(r)
                if "skipped" not in r:
                    log(f"  ok {r['ok']}/{r['requests']} TTFT p50 {r['ttft_p50_ms']:.1f} ms, hit {r['prefix_hit_rate']:.1%} {r['errors'] or ''}")
        rows = [medians(runs) for runs in by_setup.values()]  # one round: its own numbers
        out["fleets"][fleet] = rows
        print(table(f"{fleet} x{spec.replicas}", rows), flush=True)
        if a.rounds > 1:
            out.setdefault("rounds", {})[fleet] = by_setup
            print("\n".join(wins(by_setup)), flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=str))
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
