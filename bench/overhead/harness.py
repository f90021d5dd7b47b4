"""The bench/overhead run: engines up, then each setup in turn (router up, sanity, phases, router down)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import loadgen
import measure
from options import MODEL
from procs import ProcessGroup
from report import fmt
from setups import SkipSetup, ensure_peers, start_engines, start_router


def pinned_group(a, prefix: str) -> tuple[ProcessGroup, dict | bool]:
    """The process group of a run, laid out on the cores by ``a.layout`` (this process pinned too); returns it
    and where each role runs (False when not pinned: fewer than 2 CPUs or ``--no-pin``)."""
    log_dir = Path(a.log_dir) if a.log_dir else Path(tempfile.mkdtemp(prefix=prefix))
    pin = not a.no_pin and (os.cpu_count() or 1) >= 2
    isolated = a.layout == "isolated"
    router_cpus = {a.client_cpu} if isolated else {a.server_cpu}
    pg = ProcessGroup(log_dir, cpus={a.server_cpu} if pin else None, role_cpus={"router": router_cpus} if pin else None)
    if not pin:
        return pg, False
    client = a.server_cpu if isolated else a.client_cpu
    os.sched_setaffinity(0, {client})
    return pg, {"engines": a.server_cpu, "router": min(router_cpus), "client": client}


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

    async def phase(self, url: str, conc: int, body: dict, duration: float, router, quickack=False) -> dict:
        return await measure.phase(url, conc, body, duration, engines=self.engines, router=router,
                                   warmup=self.a.warmup, timeout=self.a.request_timeout, quickack=quickack)

    async def run_setup(self, setup: str, quickack: bool = False) -> dict:
        a = self.a
        out: dict = {"status": "ok", "latency": {}, "throughput": None}
        router = None
        if setup == "direct":  # the engines themselves, the streams spread evenly (a free, perfect round-robin)
            out["url"] = self.engine_urls
        else:
            try:
                router, base, waited = start_router(setup, a, self.pg, self.engine_urls)
            except SkipSetup as e:
                self.log(f"SKIP {setup}: {e}")
                return {"status": "skipped", "reason": str(e)}
            out.update(url=base, ready_s=waited, argv=router.argv, pid=router.pid)
            self.log(f"{setup} ready at {base} in {waited:.2f}s (pid {router.pid})")
        url = [u + self.path for u in self.engine_urls] if router is None else base + self.path
        try:
            # sanity: a few requests, all must succeed
            chk = await loadgen.LoadGen(url, 1, self.body, timeout=a.request_timeout, quickack=quickack).run(requests=3)
            cs = chk.summary()
            if cs["ok"] != 3:
                raise RuntimeError(f"sanity requests failed: {cs['statuses']} {cs['first_error']}")
            out["chunks_per_req"] = cs["chunks_per_req"]
            out["idle"] = await measure.idle_cpu(self.engines, router)
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
        ol = await measure.wait_quiet(a.wait_quiet, self.log)
        self.t_start = time.monotonic()  # the time budget starts now
        self.results["meta"]["other_load_at_start"] = ol
        if ol["util"] > 0.10:
            self.log(f"warning: other processes are busy ({ol['util'] * 100:.0f}% of a core: "
                     + ", ".join(f"{t['proc']} {t['util'] * 100:.0f}%" for t in ol["top"]) + "); results will be noisy")
        ensure_peers(a, self.log)
        self.engines, self.engine_urls = start_engines(a, self.pg, self.log)
        self.results["engine"] = {"kind": a.engine, "urls": self.engine_urls,
                                  "argv": [e.argv for e in self.engines]}
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
