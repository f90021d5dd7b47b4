#!/usr/bin/env python
"""bench/overhead/stacks.py: which HTTP stack should the gateway relay streams on?

Measures, side by side in one run, minimal streaming proxies on candidate
stacks in front of the same 2 stub engines (bench/stub_engine.py, 16 chunks
2 ms apart), plus the full gateway:

    direct          client -> engine 0 (reference, no proxy)
    aiohttp         (a) aiohttp web server + aiohttp ClientSession, iter_any relay
    steersman-http  (b) steersman.http.HttpServer + UpstreamPool, Exchange.pipe relay (no pipeline/policy)
    steersman-rr    (c) the full gateway, `steersman serve --config fleet.yaml` with `policy: round-robin`
    steersman       (c') the same with the fleet's default routing policy (what ships)
    granian         (d) granian RSGI server + aiohttp ClientSession (skipped with a reason if not installed)

(a), (b), (d) are in stack_proxies.py. For each: TTFT p50/p99 and proxy CPU
us/request at 1 and 64 concurrent streams, then short-request throughput
(max_tokens 4, c=64), and CPU with no traffic. Ratios are vs (a). Engines and
proxy are pinned to core 0, the load client (bench/loadgen.py) to core 1, as in
run.py. ~1.7 min with defaults; every process is stopped on exit.

    .venv/bin/python bench/overhead/stacks.py
    .venv/bin/python bench/overhead/stacks.py --rounds 3      # medians over 3 rounds (~5 min)
    .venv/bin/python bench/overhead/stacks.py --stacks aiohttp,steersman-http --duration 6

Writes bench/overhead/stacks.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/: loadgen, procs
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
import measure  # noqa: E402
from options import MODEL  # noqa: E402
from procs import Proc, ProcessGroup, free_port, wait_http  # noqa: E402
from setups import SkipSetup, start_engines, start_router  # noqa: E402
from stacks_report import METRICS, print_tables  # noqa: E402

STACKS = ["direct", "aiohttp", "steersman-http", "steersman-rr", "steersman", "granian"]
BASELINE = "aiohttp"
GRANIAN_HINT = ".venv/bin/pip install granian==2.8.9"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="HTTP stack comparison for the gateway's relay path",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--stacks", default=",".join(STACKS), help="comma list from " + ",".join(STACKS))
    ap.add_argument("--rounds", type=int, default=1, help="repeat every stack this many times; tables show medians")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds discarded before each phase")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds measured per latency phase")
    ap.add_argument("--tp-duration", type=float, default=4.0, help="seconds measured in the throughput phase")
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--interval-ms", type=float, default=2.0, help="stub: gap between chunks")
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--granian-arg", action="append", default=[], help="extra granian CLI argument (repeatable)")
    ap.add_argument("--steersman-bin", default=None, help="default: steersman next to this python, then PATH")
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="first wait up to this many seconds until other processes use < 10%% of a core")
    ap.add_argument("--out", default=str(HERE / "stacks.json"))
    ap.add_argument("--log-dir", default=None, help="default: a new /tmp/steersman-bench-stacks-* dir")
    a = ap.parse_args(argv)
    a.stacks = [s.strip() for s in a.stacks.split(",") if s.strip()]
    bad = [s for s in a.stacks if s not in STACKS]
    if bad:
        ap.error(f"unknown stacks {bad}")
    a.concurrency = [int(c) for c in a.concurrency.split(",") if c.strip()]
    return a


def missing(stack: str) -> str | None:
    """Why `stack` cannot run here, or None."""
    need = {"aiohttp": ["aiohttp"], "granian": ["granian", "aiohttp"], "steersman-http": ["steersman", "httptools"]}
    for mod in need.get(stack, []):
        if importlib.util.find_spec(mod) is None:
            hint = GRANIAN_HINT if mod == "granian" else ".venv/bin/pip install -e '.[bench]'"
            return f"python module {mod!r} is not installed in this venv ({hint})"
    return None


class StackBench:
    def __init__(self, a, pg: ProcessGroup):
        self.a = a
        self.pg = pg
        self.t0 = time.monotonic()
        # what setups.start_engines / start_router read
        self.cfg = SimpleNamespace(engine="stub", replicas=2, max_tokens=16, interval_ms=a.interval_ms, engine_arg=[],
                                   steersman_bin=a.steersman_bin, gpu="H100", speedup=4.0, peers_venv="", policy="round_robin")
        self.engines: list[Proc] = []
        self.urls: list[str] = []
        self.body = loadgen.chat_body(model=MODEL, max_tokens=16)
        self.tp_body = loadgen.chat_body(model=MODEL, max_tokens=4)
        self.rounds: dict[str, list[dict]] = {s: [] for s in a.stacks}
        self.skipped: dict[str, str] = {}

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def start_proxy(self, stack: str, rnd: int) -> tuple[Proc, str]:
        if stack in ("steersman", "steersman-rr"):
            cfg = SimpleNamespace(**vars(self.cfg), fleet_policy="round-robin" if stack == "steersman-rr" else None)
            p, base, _ = start_router("steersman", cfg, self.pg, self.urls)
            return p, base
        port = free_port()
        if stack == "granian":
            argv = [sys.executable, "-m", "granian", "--interface", "rsgi", "--host", "127.0.0.1", "--port", port,
                    "--workers", "1", "--http", "1", "--no-ws", "--loop", "uvloop", "--log-level", "warning",
                    "--no-access-log", "--working-dir", HERE, *self.a.granian_arg, "stack_proxies:rsgi_app"]
            env = {"STACKS_UPSTREAMS": ",".join(self.urls)}
        else:
            argv = [sys.executable, HERE / "stack_proxies.py", stack, "--port", port, "--upstream", *self.urls]
            env = {}
        p = self.pg.start(f"{stack}-r{rnd}", argv, role="router", env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(p, base + "/health", timeout=30)
        except (RuntimeError, TimeoutError) as e:
            self.pg.stop(p)
            raise SkipSetup(f"{stack} did not start: {e}") from None
        return p, base

    async def run_stack(self, stack: str, rnd: int) -> dict:
        a = self.a
        router = None
        if stack == "direct":
            base = self.urls[0]
        else:
            router, base = self.start_proxy(stack, rnd)
        url = base + "/v1/chat/completions"
        r: dict = {"errors": 0}
        try:
            chk = (await loadgen.LoadGen(url, 1, self.body, timeout=20).run(requests=3)).summary()
            if chk["ok"] != 3 or chk["chunks_per_req"] != 16:
                raise RuntimeError(f"sanity requests failed: {chk['statuses']} chunks/req {chk['chunks_per_req']} "
                                   f"{chk['first_error']}")
            if router is not None:
                r["idle_util"] = (await measure.idle_cpu(self.engines, router, seconds=1.0))["router_util"]
            phases = [(f"c{c}", c, self.body, a.duration) for c in a.concurrency]
            phases.append(("tp", 64, self.tp_body, a.tp_duration))
            for key, c, body, dur in phases:
                s = await measure.phase(url, c, body, dur, engines=self.engines, router=router, warmup=a.warmup,
                                        timeout=20)
                r[key] = s
                r["errors"] += s["errors"]
                self.log(f"{stack:<15} {key:<4} {s['rps']:6.0f} req/s  TTFT p50 {s['ttft_ms']['p50'] or 0:7.3f} "
                         f"p99 {s['ttft_ms']['p99'] or 0:7.3f} ms  proxy {s['cpu']['router_us_per_req'] or 0:5.0f} "
                         f"us/req  core{a.server_cpu} {s['cpu']['server_core_util'] * 100:3.0f}%  "
                         f"other {s['other_load']['util'] * 100:.0f}%  err {s['errors']}")
        finally:
            if router is not None:
                self.pg.stop(router)
        return r

    async def run(self) -> None:
        a = self.a
        ol = await measure.wait_quiet(a.wait_quiet, self.log)
        if ol["util"] > 0.10:
            self.log(f"warning: other processes are busy ({ol['util'] * 100:.0f}% of a core: "
                     + ", ".join(f"{t['proc']} {t['util'] * 100:.0f}%" for t in ol["top"]) + "); results will be noisy")
        for s in a.stacks:
            why = missing(s)
            if why:
                self.skipped[s] = why
                self.log(f"SKIP {s}: {why}")
        self.engines, self.urls = start_engines(self.cfg, self.pg, self.log)
        todo = [s for s in a.stacks if s not in self.skipped]
        for rnd in range(a.rounds):
            order = todo if rnd % 2 == 0 else todo[::-1]  # alternate the order: drift hits every stack alike
            for stack in order:
                if stack in self.skipped:
                    continue
                try:
                    self.rounds[stack].append(await self.run_stack(stack, rnd))
                except SkipSetup as e:
                    self.skipped[stack] = str(e)
                    self.log(f"SKIP {stack}: {e}")
                except Exception as e:  # noqa: BLE001 - the other stacks still run
                    self.skipped[stack] = f"error: {e!r}"
                    self.log(f"ERROR in {stack}: {e!r}")


def flatten(r: dict) -> dict:
    """The scalar metrics of one round of one stack (see stacks_report.METRICS)."""
    out = {"errors": r["errors"], "idle_util": r.get("idle_util")}
    for key in [k for k in r if k.startswith("c") and isinstance(r[k], dict)] + ["tp"]:
        s = r.get(key)
        if not s:
            continue
        out[f"{key}_rps"] = s["rps"]
        out[f"{key}_ttft_p50"] = s["ttft_ms"]["p50"]
        out[f"{key}_ttft_p99"] = s["ttft_ms"]["p99"]
        out[f"{key}_itl_p99"] = s["itl_ms"]["p99"]
        out[f"{key}_proxy_us"] = s["cpu"]["router_us_per_req"]
        out[f"{key}_engines_us"] = s["cpu"]["engines_us_per_req"]
        out[f"{key}_core"] = s["cpu"]["server_core_util"]
        out[f"{key}_other"] = s["other_load"]["util"]
    return out


def medians(rounds: list[dict]) -> dict:
    flat = [flatten(r) for r in rounds]
    keys = {k for f in flat for k in f}
    out = {}
    for k in keys:
        vals = [f[k] for f in flat if f.get(k) is not None]
        out[k] = (sum(vals) if k == "errors" else statistics.median(vals)) if vals else None
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    log_dir = Path(a.log_dir) if a.log_dir else Path(tempfile.mkdtemp(prefix="steersman-bench-stacks-"))
    pin = not a.no_pin and (os.cpu_count() or 1) >= 2
    pg = ProcessGroup(log_dir, cpus={a.server_cpu} if pin else None)
    if pin:
        os.sched_setaffinity(0, {a.client_cpu})
    else:
        print("warning: not pinning (fewer than 2 CPUs or --no-pin); numbers are noisier", file=sys.stderr)
    bench = StackBench(a, pg)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    print(f"logs: {log_dir}", flush=True)
    rc = 0
    try:
        import uvloop

        uvloop.run(bench.run())
    except KeyboardInterrupt:
        print("\ninterrupted; stopping processes", file=sys.stderr)
        rc = 130
    except Exception as e:  # noqa: BLE001
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        rc = 1
    finally:
        pg.stop_all()
    table = {s: medians(rs) for s, rs in bench.rounds.items() if rs}
    if table:
        print_tables(table, bench.skipped, a, BASELINE)
        out = {"meta": {"started_unix": time.time() - (time.monotonic() - bench.t0), "argv": sys.argv[1:],
                        "pinned": pin, "elapsed_s": round(time.monotonic() - bench.t0, 1), "log_dir": str(log_dir),
                        "metrics": METRICS},
               "config": {k: v for k, v in vars(a).items() if k not in ("out", "log_dir")},
               "medians": table, "skipped": bench.skipped,
               "rounds": {s: [flatten(r) for r in rs] for s, rs in bench.rounds.items()}}
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {a.out}  (process logs in {log_dir})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
