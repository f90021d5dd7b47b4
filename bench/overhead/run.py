#!/usr/bin/env python
"""bench/overhead: latency and CPU added by an LLM gateway vs talking to the engine directly.

For each setup -- ``direct`` (client -> one engine), ``steersman`` (``steersman
serve``), ``vllm-router`` and ``sglang-router`` (Rust routers from PyPI, in
``bench/.venv-peers``), all in front of the same engine replicas -- and each
concurrency (1, 64, 256 closed-loop streams) it measures TTFT and
inter-chunk latency p50/p90/p99, then a throughput phase (short streams,
max_tokens 4, concurrency 64) with requests/s and CPU-us per request of the
router process. Engines and router are pinned to one core, the load client
to the other, so at 64+ streams the server core is saturated and CPU per
request is the number to compare.

    .venv/bin/python bench/overhead/run.py                 # engines: steersman engine-sim
    .venv/bin/python bench/overhead/run.py --engine stub   # engines: bench/stub_engine.py
    .venv/bin/python bench/overhead/run.py --quick         # ~1 min smoke run

Prints a table with absolute numbers and ratios (vs direct, vs vllm-router)
and writes bench/overhead/results.json. Talks only to 127.0.0.1; every
process it starts is stopped on exit, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import loadgen
from procs import (
    ProcessGroup,
    all_procs_ticks,
    descendants,
    foreign_cpu,
    free_port,
    wait_http,
)

SETUPS = ["direct", "steersman", "vllm-router", "sglang-router"]
ROUTER_SETUPS = ["steersman", "vllm-router", "sglang-router"]
MODEL = "llama-3.1-8b"


# --------------------------------------------------------------------------- args


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="gateway overhead benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--engine", choices=["sim", "stub"], default="sim",
                    help="sim: `steersman engine-sim`; stub: bench/stub_engine.py (lowest noise)")
    ap.add_argument("--replicas", type=int, default=2, help="engine replicas behind each router")
    ap.add_argument("--setups", default=",".join(SETUPS), help="comma list from " + ",".join(SETUPS))
    ap.add_argument("--concurrency", default="1,64,256", help="comma list of concurrent streams")
    ap.add_argument("--max-tokens", type=int, default=16, help="chunks per streamed request (latency phases)")
    ap.add_argument("--interval-ms", type=float, default=2.0, help="stub: gap between chunks")
    ap.add_argument("--speedup", type=float, default=4.0,
                    help="sim: engine-sim --speedup (llama-3.1-8b/H100 decodes ~8.3 ms/token at 1, so 4 gives "
                         "~2 ms between chunks, the pacing shared/README used)")
    ap.add_argument("--gpu", default="H100", help="sim: engine-sim --gpu")
    ap.add_argument("--engine-arg", action="append", default=[], help="extra argument for every engine (repeatable)")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--policy", default="round_robin", help="routing policy for the Rust routers")
    ap.add_argument("--warmup", type=float, default=1.5, help="seconds of discarded load before each phase")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds measured per latency phase")
    ap.add_argument("--tp-duration", type=float, default=6.0, help="seconds measured in the throughput phase")
    ap.add_argument("--tp-max-tokens", type=int, default=4)
    ap.add_argument("--tp-concurrency", type=int, default=64)
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--quickack-diagnostic", action="store_true",
                    help="also run sglang-router with a TCP_QUICKACK client (shows its latency without the Nagle stall)")
    ap.add_argument("--server-cpu", type=int, default=0, help="core for engines and routers")
    ap.add_argument("--client-cpu", type=int, default=1, help="core for this process (the load client)")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--peers-venv", default=str(BENCH / ".venv-peers"))
    ap.add_argument("--no-setup-peers", action="store_true", help="do not create the peers venv when it is missing")
    ap.add_argument("--steersman-bin", default=None, help="default: steersman next to this python, then PATH")
    ap.add_argument("--request-timeout", type=float, default=20.0)
    ap.add_argument("--max-minutes", type=float, default=10.0, help="skip remaining phases after this")
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="first wait up to this many seconds until other processes use < 10%% of a core")
    ap.add_argument("--quick", action="store_true", help="short phases (warmup 0.5 s, 2 s measured)")
    ap.add_argument("--out", default=str(BENCH / "overhead" / "results.json"))
    ap.add_argument("--log-dir", default=None, help="default: a new /tmp/steersman-bench-overhead-* dir")
    a = ap.parse_args(argv)
    if a.quick:
        a.warmup, a.duration, a.tp_duration = 0.5, 2.0, 2.0
    a.setups = [s.strip() for s in a.setups.split(",") if s.strip()]
    bad = [s for s in a.setups if s not in SETUPS]
    if bad:
        ap.error(f"unknown setups {bad}")
    if "direct" not in a.setups:
        a.setups.insert(0, "direct")
    a.concurrency = [int(c) for c in a.concurrency.split(",") if c.strip()]
    return a


# --------------------------------------------------------------------------- helpers


def fmt(x, nd=2, unit=""):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}{unit}"


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b


def steersman_bin(a) -> str | None:
    if a.steersman_bin:
        return a.steersman_bin
    cand = Path(sys.executable).parent / "steersman"
    if cand.exists():
        return str(cand)
    return shutil.which("steersman")


def check_cli(argv: list, timeout: float = 30.0) -> tuple[bool, str]:
    """Does `argv --help` run and exit 0?"""
    try:
        r = subprocess.run(argv + ["--help"], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, repr(e)
    out = (r.stdout + r.stderr).decode(errors="replace").strip().splitlines()
    return r.returncode == 0, "\n".join(out[-6:])


# --------------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, a, pg: ProcessGroup):
        self.a = a
        self.pg = pg
        self.t_start = time.monotonic()
        self.engines = []
        self.engine_urls: list[str] = []
        self.results: dict = {
            "meta": {
                "started": _dt.datetime.now().isoformat(timespec="seconds"),
                "host": platform.node(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "pinned": None,
                "log_dir": str(pg.log_dir),
                "argv": sys.argv[1:],
            },
            "config": {k: v for k, v in vars(a).items() if k not in ("out", "log_dir")},
            "engine": {},
            "setups": {},
        }
        self.path = "/v1/chat/completions" if a.endpoint == "chat" else "/v1/completions"
        mk = loadgen.chat_body if a.endpoint == "chat" else loadgen.completion_body
        self.body = mk(model=MODEL, max_tokens=a.max_tokens)
        self.tp_body = mk(model=MODEL, max_tokens=a.tp_max_tokens)

    def over_time(self) -> bool:
        return time.monotonic() - self.t_start > self.a.max_minutes * 60

    def log(self, msg: str):
        el = time.monotonic() - self.t_start
        print(f"[{el:6.1f}s] {msg}", flush=True)

    # ---- peer routers' venv
    def ensure_peers(self):
        a = self.a
        wanted = [s for s in a.setups if s in ("vllm-router", "sglang-router")]
        peers = Path(a.peers_venv) / "bin"
        if not wanted or a.no_setup_peers or all((peers / s).exists() for s in wanted):
            return
        self.log(f"creating {a.peers_venv} (bench/setup_peers.sh: pip install vllm-router==0.1.17 sglang-router==0.3.2)")
        env = dict(os.environ, PEERS_VENV=str(a.peers_venv), PYTHON=sys.executable)
        try:
            r = subprocess.run(["bash", str(BENCH / "setup_peers.sh")], env=env, capture_output=True, timeout=600,
                               stdin=subprocess.DEVNULL, check=False)
            if r.returncode != 0:
                self.log("peers venv setup failed:\n" + (r.stdout + r.stderr).decode(errors="replace")[-2000:])
        except subprocess.TimeoutExpired:
            self.log("peers venv setup timed out")

    # ---- engines
    def start_engines(self):
        a = self.a
        ports = [free_port() for _ in range(a.replicas)]
        if a.engine == "sim":
            sb = steersman_bin(a)
            ok, why = (False, "no `steersman` executable") if not sb else check_cli([sb, "engine-sim"])
            if not ok:
                raise SystemExit(
                    f"`steersman engine-sim` is not available ({why}).\n"
                    "Run with --engine stub to use bench/stub_engine.py instead.")
        for i, port in enumerate(ports):
            if a.engine == "stub":
                argv = [sys.executable, str(BENCH / "stub_engine.py"), "--port", port, "--model", MODEL,
                        "--chunks", a.max_tokens, "--interval-ms", a.interval_ms]
            else:
                argv = [steersman_bin(a), "engine-sim", "--gpu", a.gpu, "--model", MODEL, "--port", port,
                        "--speedup", a.speedup]
            argv += a.engine_arg
            p = self.pg.start(f"engine{i}", argv, role="engine")
            self.engines.append(p)
            self.engine_urls.append(f"http://127.0.0.1:{port}")
        for p, url in zip(self.engines, self.engine_urls):
            waited = wait_http(p, url + "/health", timeout=90)
            self.log(f"{p.name} ready at {url} in {waited:.2f}s (pid {p.pid})")
        self.results["engine"] = {"kind": a.engine, "urls": self.engine_urls,
                                  "argv": [e.argv for e in self.engines]}

    # ---- routers
    def start_router(self, setup: str):
        """Start the router for `setup`; returns (proc, base_url, ready_seconds) or raises SkipSetup."""
        a = self.a
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        if setup == "steersman":
            sb = steersman_bin(a)
            if not sb:
                raise SkipSetup("no `steersman` executable found (install the repo: pip install -e .)")
            ok, why = check_cli([sb, "serve"])
            if not ok:
                raise SkipSetup(f"`steersman serve` is not available yet: {why}")
            cfg = self.pg.log_dir / "fleet.yaml"
            lines = [f"gateway: {{host: 127.0.0.1, port: {port}}}", "endpoints:"]
            for i, u in enumerate(self.engine_urls):
                lines.append(f'  - {{name: e{i}, url: "{u}", engine: vllm, gpu: {a.gpu}, models: [{MODEL}]}}')
            cfg.write_text("\n".join(lines) + "\n")
            p = self.pg.start("steersman", [sb, "serve", "--config", cfg], role="router")
            try:
                waited = wait_http(p, base + "/health", timeout=60)
            except (RuntimeError, TimeoutError) as e:
                self.pg.stop(p)
                raise SkipSetup(f"`steersman serve` did not become ready: {e}") from None
            return p, base, waited
        peers = Path(a.peers_venv) / "bin"
        exe = peers / setup
        if not exe.exists():
            raise SkipSetup(f"{exe} missing; create it with: bash bench/setup_peers.sh")
        prom = str(free_port())
        if setup == "vllm-router":
            argv = [exe, "--host", "127.0.0.1", "--port", port, "--worker-urls", *self.engine_urls,
                    "--policy", a.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", prom,
                    "--worker-startup-check-interval", "1", "--log-level", "warning"]
            p = self.pg.start(setup, argv, role="router", env={"RUST_LOG": "warn"})
            waited = wait_http(p, base + "/health", timeout=60)
        else:
            argv = [exe, "launch", "--host", "127.0.0.1", "--port", port, "--worker-urls", *self.engine_urls,
                    "--policy", a.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", prom,
                    "--log-level", "warn"]
            p = self.pg.start(setup, argv, role="router")
            n = len(self.engine_urls)

            def ready(st, body):
                if st != 200:
                    return False
                try:
                    return json.loads(body).get("healthy_workers", 0) >= n
                except ValueError:
                    return False

            waited = wait_http(p, base + "/readiness", timeout=60, want=ready)
        return p, base, waited

    # ---- one load phase
    async def phase(self, url: str, conc: int, body: dict, duration: float, router, quickack=False) -> dict:
        a = self.a
        lg = loadgen.LoadGen(url, conc, body, timeout=a.request_timeout, quickack=quickack)
        await lg.connect()
        try:
            if a.warmup > 0:
                await lg.run(duration=a.warmup)
            procs = list(self.engines) + ([router] if router is not None else [])
            ours = {os.getpid()}
            for p in procs:
                ours.update(descendants(p.pid))
            f0 = all_procs_ticks()
            c0 = {p.name: p.cpu_ns() for p in procs}
            res = await lg.run(duration=duration)
            c1 = {p.name: p.cpu_ns() for p in procs}
            f1 = all_procs_ticks()
        finally:
            await lg.close()
        s = res.summary()
        s["other_load"] = foreign_cpu(f0, f1, ours, s["wall_s"])
        n = max(1, s["requests"])
        eng_ns = sum(c1[p.name] - c0[p.name] for p in self.engines)
        rt_ns = (c1[router.name] - c0[router.name]) if router is not None else 0
        w = s["wall_s"] or 1.0
        s["cpu"] = {
            "router_s": rt_ns / 1e9,
            "router_us_per_req": rt_ns / 1e3 / n if router is not None else None,
            "router_util": rt_ns / 1e9 / w if router is not None else None,
            "engines_s": eng_ns / 1e9,
            "engines_us_per_req": eng_ns / 1e3 / n,
            "server_core_util": (eng_ns + rt_ns) / 1e9 / w,
            "client_us_per_req": s["client_cpu_us_per_req"],
            "client_util": s["client_cpu_util"],
        }
        return s

    async def idle_cpu(self, router, seconds: float = 2.0) -> dict:
        """Background CPU with no traffic (health checks, metric scraping, timers)."""
        procs = list(self.engines) + ([router] if router is not None else [])
        await asyncio.sleep(0.3)
        c0 = {p.name: p.cpu_ns() for p in procs}
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        c1 = {p.name: p.cpu_ns() for p in procs}
        w = time.monotonic() - t0
        return {
            "seconds": w,
            "router_util": (c1[router.name] - c0[router.name]) / 1e9 / w if router is not None else None,
            "engines_util": sum(c1[p.name] - c0[p.name] for p in self.engines) / 1e9 / w,
        }

    async def run_setup(self, setup: str, quickack: bool = False) -> dict:
        a = self.a
        out: dict = {"status": "ok", "latency": {}, "throughput": None}
        router = None
        if setup == "direct":
            base = self.engine_urls[0]
            out["url"] = base
        else:
            try:
                router, base, waited = self.start_router(setup)
            except SkipSetup as e:
                self.log(f"SKIP {setup}: {e}")
                return {"status": "skipped", "reason": str(e)}
            out.update(url=base, ready_s=waited, argv=router.argv, pid=router.pid)
            self.log(f"{setup} ready at {base} in {waited:.2f}s (pid {router.pid})")
        url = base + self.path
        try:
            # sanity: a few requests, all must succeed
            chk = await loadgen.LoadGen(url, 1, self.body, timeout=a.request_timeout, quickack=quickack).run(requests=3)
            cs = chk.summary()
            if cs["ok"] != 3:
                raise RuntimeError(f"sanity requests failed: {cs['statuses']} {cs['first_error']}")
            out["chunks_per_req"] = cs["chunks_per_req"]
            out["idle"] = await self.idle_cpu(router)
            for c in a.concurrency:
                if self.over_time():
                    self.log(f"time budget reached, skipping {setup} c={c}")
                    continue
                s = await self.phase(url, c, self.body, a.duration, router, quickack)
                out["latency"][str(c)] = s
                self.log(f"{setup:<14} c={c:<4} {s['rps']:7.0f} req/s  TTFT p50 {fmt(s['ttft_ms']['p50'], 3)} "
                         f"p99 {fmt(s['ttft_ms']['p99'], 3)} ms  ITL p50 {fmt(s['itl_ms']['p50'], 3)} "
                         f"p99 {fmt(s['itl_ms']['p99'], 3)} ms  err {s['errors']}  "
                         f"router {fmt(s['cpu']['router_us_per_req'], 0)} us/req  "
                         f"core{a.server_cpu} {s['cpu']['server_core_util'] * 100:.0f}%  "
                         f"client {s['cpu']['client_util'] * 100:.0f}%  other {s['other_load']['util'] * 100:.0f}%")
            if not a.no_throughput and not self.over_time():
                s = await self.phase(url, a.tp_concurrency, self.tp_body, a.tp_duration, router, quickack)
                out["throughput"] = s
                self.log(f"{setup:<14} throughput c={a.tp_concurrency} max_tokens={a.tp_max_tokens}: "
                         f"{s['rps']:.0f} req/s  router {fmt(s['cpu']['router_us_per_req'], 0)} us/req  "
                         f"engines {fmt(s['cpu']['engines_us_per_req'], 0)} us/req  err {s['errors']}")
        except Exception as e:  # noqa: BLE001 - keep going with the next setup
            out["status"] = "error"
            out["reason"] = repr(e)
            self.log(f"ERROR in {setup}: {e!r}")
            if router is not None:
                out["log_tail"] = router.log_tail()
        finally:
            if router is not None:
                self.pg.stop(router)
        return out

    async def run(self):
        a = self.a
        t_wait = time.monotonic()
        while True:
            f0 = all_procs_ticks()
            await asyncio.sleep(1.0)
            ol = foreign_cpu(f0, all_procs_ticks(), {os.getpid()}, 1.0)
            if ol["util"] <= 0.10 or time.monotonic() - t_wait >= a.wait_quiet:
                break
            if time.monotonic() - t_wait < 1.5:
                self.log(f"waiting up to {a.wait_quiet:.0f}s for other processes to go quiet "
                         f"({ol['util'] * 100:.0f}% of a core busy)")
        self.t_start = time.monotonic()  # the time budget starts now
        self.results["meta"]["other_load_at_start"] = ol
        if ol["util"] > 0.10:
            self.log(f"warning: other processes are busy ({ol['util'] * 100:.0f}% of a core: "
                     + ", ".join(f"{t['proc']} {t['util'] * 100:.0f}%" for t in ol["top"]) + "); results will be noisy")
        self.ensure_peers()
        self.start_engines()
        for setup in a.setups:
            if self.over_time():
                self.results["setups"][setup] = {"status": "skipped", "reason": "time budget"}
                continue
            self.results["setups"][setup] = await self.run_setup(setup)
        if a.quickack_diagnostic and "sglang-router" in a.setups and not self.over_time():
            self.results["setups"]["sglang+quickack"] = await self.run_setup("sglang-router", quickack=True)
        d = self.results["setups"].get("direct", {})
        if d.get("latency"):
            one = d["latency"].get("1") or next(iter(d["latency"].values()))
            self.results["engine"]["pacing"] = {
                "chunks_per_req": one["chunks_per_req"], "ttft_p50_ms": one["ttft_ms"]["p50"],
                "itl_p50_ms": one["itl_ms"]["p50"], "e2e_p50_ms": one["e2e_ms"]["p50"]}


class SkipSetup(Exception):
    pass


# --------------------------------------------------------------------------- report


def derive(results: dict, a) -> dict:
    """Ratios vs direct and vs vllm-router, and target checks."""
    S = results["setups"]
    d = S.get("direct", {})
    v = S.get("vllm-router", {})
    der: dict = {"latency": {}, "throughput": {}}
    for name, s in S.items():
        if s.get("status") != "ok":
            continue
        for c, ph in s["latency"].items():
            dp = d.get("latency", {}).get(c)
            vp = v.get("latency", {}).get(c) if v.get("status") == "ok" else None
            row = {}
            for k in ("ttft_ms", "itl_ms"):
                for q in ("p50", "p99"):
                    x = ph[k][q]
                    row[f"{k}_{q}_added"] = (x - dp[k][q]) if dp and x is not None and dp[k][q] is not None else None
                    row[f"{k}_{q}_x_direct"] = ratio(x, dp[k][q]) if dp else None
                    row[f"{k}_{q}_x_vllm"] = ratio(x, vp[k][q]) if vp else None
            row["router_cpu_x_vllm"] = ratio(ph["cpu"]["router_us_per_req"], vp["cpu"]["router_us_per_req"]) if vp else None
            row["rps_x_direct"] = ratio(ph["rps"], dp["rps"]) if dp else None
            der["latency"].setdefault(name, {})[c] = row
        tp = s.get("throughput")
        if tp:
            dtp = d.get("throughput")
            vtp = v.get("throughput") if v.get("status") == "ok" else None
            rus = tp["cpu"]["router_us_per_req"]
            der["throughput"][name] = {
                "rps_x_direct": ratio(tp["rps"], dtp["rps"]) if dtp else None,
                "rps_x_vllm": ratio(tp["rps"], vtp["rps"]) if vtp else None,
                "router_cpu_x_vllm": ratio(rus, vtp["cpu"]["router_us_per_req"]) if vtp and rus else None,
                # what one router process could sustain with a whole core to itself
                "router_capacity_rps_per_core": (1e6 / rus) if rus else None,
            }
    # targets, for every router that ran (the product targets are for steersman)
    tg = {}
    for name in ROUTER_SETUPS:
        s = S.get(name, {})
        if s.get("status") != "ok":
            continue
        t = {}
        r64 = der["latency"].get(name, {}).get("64")
        if r64:
            t["p50_added_ttft_ms_at_64"] = r64["ttft_ms_p50_added"]
            t["p50_added_ttft_le_0.5ms_at_64"] = r64["ttft_ms_p50_added"] is not None and r64["ttft_ms_p50_added"] <= 0.5
        tp = s.get("throughput")
        if tp:
            t["throughput_rps"] = tp["rps"]
            t["throughput_ge_2000rps"] = tp["rps"] >= 2000
            t["router_capacity_rps_per_core"] = der["throughput"][name]["router_capacity_rps_per_core"]
        if name != "vllm-router" and S.get("vllm-router", {}).get("status") == "ok":
            worse = []
            for c, row in der["latency"].get(name, {}).items():
                for k in ("ttft_ms_p50_x_vllm", "ttft_ms_p99_x_vllm", "itl_ms_p99_x_vllm"):
                    if row.get(k) is not None and row[k] > 1.0:
                        worse.append(f"{k.replace('_x_vllm', '')}@{c}={row[k]:.2f}x")
                if row.get("router_cpu_x_vllm") is not None and row["router_cpu_x_vllm"] > 1.0:
                    worse.append(f"router_cpu@{c}={row['router_cpu_x_vllm']:.2f}x")
            trow = der["throughput"].get(name, {})
            if trow.get("rps_x_vllm") is not None and trow["rps_x_vllm"] < 1.0:
                worse.append(f"throughput={trow['rps_x_vllm']:.2f}x")
            t["not_worse_than_vllm_router"] = not worse
            t["worse_than_vllm_router_on"] = worse
        tg[name] = t
    der["targets"] = tg
    return der


def _x(v):
    return fmt(v, 2, "x")


def print_report(results: dict, der: dict, a):
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(json.dumps(der, indent=2))
        return
    con = Console(width=max(150, shutil.get_terminal_size((150, 40)).columns))
    S = results["setups"]
    ok = {n: s for n, s in S.items() if s.get("status") == "ok"}
    eng = results.get("engine", {})
    pac = eng.get("pacing", {})
    con.print(f"\n[bold]bench/overhead[/bold]  engine={eng.get('kind')} x{a.replicas}  endpoint={a.endpoint}  "
              f"policy={a.policy}  pinned={results['meta']['pinned']}\n"
              f"engine pacing (direct, c=1): {fmt(pac.get('chunks_per_req'), 0)} chunks/request, "
              f"ITL p50 {fmt(pac.get('itl_p50_ms'), 2)} ms, E2E p50 {fmt(pac.get('e2e_p50_ms'), 1)} ms")
    direct_chunks = ok.get("direct", {}).get("chunks_per_req")

    def name_cell(n, s):
        c = s.get("chunks_per_req")
        if direct_chunks and c and abs(c - direct_chunks) > 0.01:
            return f"{n} [red](chunks {c:.0f}!={direct_chunks:.0f})[/red]"
        return n

    t = Table(title=f"Streaming latency, ms (closed loop, {a.max_tokens} chunks/request); "
                    "+ = added vs direct, x = ratio", title_justify="left")
    for col in ["setup", "c", "req/s", "TTFT\np50", "TTFT\np90", "TTFT\np99", "+TTFT\np50", "+TTFT\np99",
                "TTFT p50\nx direct", "TTFT p50\nx vllm", "ITL\np50", "ITL\np99", "ITL p99\nx vllm", "err"]:
        t.add_column(col, justify="left" if col == "setup" else "right", no_wrap=True)
    for n, s in ok.items():
        for c, ph in s["latency"].items():
            r = der["latency"].get(n, {}).get(c, {})
            dr = n == "direct"
            nv = n in ("direct", "vllm-router")
            t.add_row(name_cell(n, s), c, fmt(ph["rps"], 0), fmt(ph["ttft_ms"]["p50"], 3), fmt(ph["ttft_ms"]["p90"], 3),
                      fmt(ph["ttft_ms"]["p99"], 3),
                      "" if dr else fmt(r.get("ttft_ms_p50_added"), 3), "" if dr else fmt(r.get("ttft_ms_p99_added"), 3),
                      "" if dr else _x(r.get("ttft_ms_p50_x_direct")), "" if nv else _x(r.get("ttft_ms_p50_x_vllm")),
                      fmt(ph["itl_ms"]["p50"], 3), fmt(ph["itl_ms"]["p99"], 3),
                      "" if nv else _x(r.get("itl_ms_p99_x_vllm")),
                      str(ph["errors"]) if not ph["errors"] else f"[red]{ph['errors']}[/red]")
        t.add_section()
    con.print(t)

    t = Table(title=f"CPU per request (us) during the latency phases; engines and router pinned to core "
                    f"{a.server_cpu}, client to core {a.client_cpu}", title_justify="left")
    for col in ["setup", "c", "router\nus/req", "router\nx vllm", "engines\nus/req", f"core {a.server_cpu}\nbusy",
                "client\nbusy", "client\nus/req", "other\nprocs"]:
        t.add_column(col, justify="left" if col == "setup" else "right", no_wrap=True)
    for n, s in ok.items():
        for c, ph in s["latency"].items():
            r = der["latency"].get(n, {}).get(c, {})
            cpu = ph["cpu"]
            ol = ph.get("other_load", {})
            olu = ol.get("util", 0.0)
            ols = fmt(olu * 100, 0, "%") + (f" ({ol['top'][0]['proc']})" if olu > 0.05 and ol.get("top") else "")
            t.add_row(n, c, fmt(cpu["router_us_per_req"], 0),
                      "" if n in ("direct", "vllm-router") else _x(r.get("router_cpu_x_vllm")),
                      fmt(cpu["engines_us_per_req"], 0), fmt(cpu["server_core_util"] * 100, 0, "%"),
                      fmt(cpu["client_util"] * 100, 0, "%"), fmt(cpu["client_us_per_req"], 0),
                      ols if olu <= 0.10 else f"[red]{ols}[/red]")
        t.add_section()
    con.print(t)

    idle = [f"{n}: " + (f"router {s['idle']['router_util'] * 100:.1f}%, " if s["idle"].get("router_util") is not None else "")
            + f"engines {s['idle']['engines_util'] * 100:.1f}%" for n, s in ok.items() if s.get("idle")]
    if idle:
        con.print("  CPU with no traffic (2 s; health checks, metric scraping; inflates us/req at c=1): " + "; ".join(idle))

    if not a.no_throughput and any(s.get("throughput") for s in ok.values()):
        t = Table(title=f"Throughput: streamed max_tokens={a.tp_max_tokens}, c={a.tp_concurrency}, as fast as possible "
                        f"(engines + router share core {a.server_cpu})", title_justify="left")
        for col in ["setup", "req/s", "req/s\nx direct", "req/s\nx vllm", "err", "router\nus/req", "router\nx vllm",
                    "router\nreq/s/core", "engines\nus/req", f"core {a.server_cpu}\nbusy", "client\nbusy", "other\nprocs"]:
            t.add_column(col, justify="left" if col == "setup" else "right", no_wrap=True)
        for n, s in ok.items():
            tp = s.get("throughput")
            if not tp:
                continue
            r = der["throughput"].get(n, {})
            cpu = tp["cpu"]
            nv = n in ("direct", "vllm-router")
            t.add_row(n, fmt(tp["rps"], 0), "" if n == "direct" else _x(r.get("rps_x_direct")),
                      "" if nv else _x(r.get("rps_x_vllm")), str(tp["errors"]), fmt(cpu["router_us_per_req"], 0),
                      "" if nv else _x(r.get("router_cpu_x_vllm")), fmt(r.get("router_capacity_rps_per_core"), 0),
                      fmt(cpu["engines_us_per_req"], 0), fmt(cpu["server_core_util"] * 100, 0, "%"),
                      fmt(cpu["client_util"] * 100, 0, "%"), fmt(tp.get("other_load", {}).get("util", 0) * 100, 0, "%"))
        con.print(t)
        con.print("  router req/s/core = 1e6 / router us/req: what the router process alone could sustain "
                  "on a whole core.")

    tg = der.get("targets", {})
    if tg:
        con.print("[bold]Targets[/bold] (they are steersman's; the Rust routers are shown for reference)")
        for n, t in tg.items():
            parts = []
            if "p50_added_ttft_ms_at_64" in t:
                good = t["p50_added_ttft_le_0.5ms_at_64"]
                parts.append(f"+TTFT p50 @64 = {fmt(t['p50_added_ttft_ms_at_64'], 3)} ms "
                             + ("[green]<= 0.5 ok[/green]" if good else "[red]> 0.5[/red]"))
            if "throughput_rps" in t:
                good = t["throughput_ge_2000rps"]
                parts.append(f"{t['throughput_rps']:.0f} short streams/s " + ("[green]>= 2000 ok[/green]" if good
                             else "[red]< 2000[/red]")
                             + f" (alone: {fmt(t.get('router_capacity_rps_per_core'), 0)}/s per core)")
            if "not_worse_than_vllm_router" in t:
                parts.append("[green]not worse than vllm-router[/green]" if t["not_worse_than_vllm_router"]
                             else "[red]worse than vllm-router on[/red] " + ", ".join(t["worse_than_vllm_router_on"]))
            con.print(f"  [bold]{n}[/bold]: " + "; ".join(parts))
    for n, s in S.items():
        if s.get("status") != "ok":
            reason = str(s.get("reason", "")).strip().splitlines()
            short = reason[0] if reason else ""
            last = reason[-1] if len(reason) > 1 else ""
            con.print(f"  [yellow]{n}: {s.get('status')}[/yellow] - {short}" + (f"\n      ... {last}" if last else ""))
    worst = max((ph.get("other_load", {}).get("util", 0) for s in ok.values()
                 for ph in list(s["latency"].values()) + ([s["throughput"]] if s.get("throughput") else [])),
                default=0)
    busy_client = max((ph["cpu"]["client_util"] for s in ok.values()
                       for ph in list(s["latency"].values()) + ([s["throughput"]] if s.get("throughput") else [])),
                      default=0)
    if busy_client > 0.90:
        con.print(f"[red]warning:[/red] the load client was {busy_client * 100:.0f}% busy in some phase, so it may have "
                  "limited that phase (its reads coalesce chunks, inflating ITL/TTFT).")
    if worst > 0.10:
        con.print(f"[red]warning:[/red] other processes used up to {worst * 100:.0f}% of a core during a phase; "
                  "on 2 cores that skews latency and CPU numbers - rerun on a quiet machine.")


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    a = parse_args(argv)
    log_dir = Path(a.log_dir) if a.log_dir else Path(tempfile.mkdtemp(prefix="steersman-bench-overhead-"))
    pin = not a.no_pin and (os.cpu_count() or 1) >= 2
    pg = ProcessGroup(log_dir, cpus={a.server_cpu} if pin else None)
    if pin:
        os.sched_setaffinity(0, {a.client_cpu})
    bench = Bench(a, pg)
    bench.results["meta"]["pinned"] = (
        {"engines_and_routers": a.server_cpu, "client": a.client_cpu} if pin else False)
    if not pin:
        print("warning: not pinning (fewer than 2 CPUs or --no-pin); numbers are noisier", file=sys.stderr)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    rc = 0
    print(f"logs: {log_dir}", flush=True)
    try:
        try:
            import uvloop

            uvloop.run(bench.run())
        except ImportError:
            asyncio.run(bench.run())
    except KeyboardInterrupt:
        print("\ninterrupted; stopping processes", file=sys.stderr)
        bench.results["meta"]["aborted"] = "interrupted"
        rc = 130
    except SystemExit as e:
        if e.code not in (0, None):
            print(e.code if isinstance(e.code, str) else f"exit {e.code}", file=sys.stderr)
            bench.results["meta"]["aborted"] = str(e.code)
            rc = 2
    except Exception as e:  # noqa: BLE001
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        bench.results["meta"]["aborted"] = repr(e)
        rc = 1
    finally:
        pg.stop_all()
    bench.results["meta"]["elapsed_s"] = round(time.monotonic() - bench.t_start, 1)
    if bench.results["setups"]:
        der = derive(bench.results, a)
        bench.results["derived"] = der
        print_report(bench.results, der, a)
        out = Path(a.out)
        if bench.results["meta"].get("aborted"):
            out = out.with_name(out.stem + ".partial" + out.suffix)  # never clobber a complete run
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(bench.results, indent=2, default=str) + "\n")
        print(f"wrote {out}  (process logs in {log_dir})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
