#!/usr/bin/env python
"""Two source trees of the gateway, alternated, at one load: clients' TTFT and the gateway's CPU a request.

    .venv/bin/python bench/overhead/ab.py --src src --src /tmp/head/src --pairs 3
    .venv/bin/python bench/overhead/ab.py --src src --src /tmp/head/src --requests 10000 --max-tokens 16

Each run starts two engine-sims (core 0), the gateway of one tree (``PYTHONPATH=<tree>``, core 1, alone), warms it
with 2,000 streams, then sends ``--requests`` streams at ``--concurrency`` with bench/loadgen.py (core 0) and reads
the gateway's CPU time from /proc: the same numbers as bench/overhead's isolated layout, for one concurrency, with
the trees alternated ``--pairs`` times (this VM's phases drift by more than most changes move them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PY = sys.executable


def _wait(url: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(url)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(src: str, a, tmp: Path) -> dict:
    ports = [18101, 18102]
    engines = [subprocess.Popen(["taskset", "-c", "0", PY, "-m", "steersman", "engine-sim", "--gpu", "H100", "--model",
                                 "llama-3.1-8b", "--port", str(p), "--speedup", "4"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    cfg = tmp / "fleet.yaml"
    cfg.write_text("gateway: {host: 127.0.0.1, port: 18080}\nendpoints:\n" + "".join(
        f'  - {{name: e{i}, url: "http://127.0.0.1:{p}", engine: vllm, gpu: H100, models: [llama-3.1-8b]}}\n'
        for i, p in enumerate(ports)))
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    gw = subprocess.Popen(["taskset", "-c", "1", PY, "-m", "steersman", "serve", "--config", str(cfg)], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for p in ports:
            _wait(f"http://127.0.0.1:{p}/health")
        _wait("http://127.0.0.1:18080/health")
        load = ["taskset", "-c", "0", PY, str(HERE.parent / "loadgen.py"), "--url",
                "http://127.0.0.1:18080/v1/chat/completions", "-c", str(a.concurrency), "--max-tokens",
                str(a.max_tokens), "--warmup", "0", "--json", str(tmp / "out.json")]
        subprocess.run(load + ["-n", "2000"], check=True, stdout=subprocess.DEVNULL)
        before = _cpu_s(gw.pid)
        subprocess.run(load + ["-n", str(a.requests)], check=True, stdout=subprocess.DEVNULL)
        cpu = _cpu_s(gw.pid) - before
        s = json.loads((tmp / "out.json").read_text())["raw"]
        return {"src": src, "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p99_ms": s["ttft_ms"]["p99"],
                "cpu_us_per_req": cpu / a.requests * 1e6, "rps": s.get("rps")}
    finally:
        for p in (gw, *engines):
            p.terminate()
        for p in (gw, *engines):
            p.wait(10)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", action="append", required=True, help="a tree's src directory (give two)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.pairs):
            for src in (a.src if i % 2 == 0 else a.src[::-1]):
                r = one(src, a, Path(d))
                rows.append(r)
                print(f"{r['src']:>24}  TTFT p50 {r['ttft_p50_ms']:7.3f} ms  p99 {r['ttft_p99_ms']:7.3f} ms  "
                      f"gateway CPU {r['cpu_us_per_req']:5.0f} us/req", flush=True)
    for src in a.src:
        ttft = median(r["ttft_p50_ms"] for r in rows if r["src"] == src)
        cpu = median(r["cpu_us_per_req"] for r in rows if r["src"] == src)
        print(f"{src:>24}  median TTFT p50 {ttft:.3f} ms, CPU {cpu:.0f} us/req")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
