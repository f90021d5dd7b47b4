#!/usr/bin/env python
"""bench/overhead: latency and CPU added by an LLM gateway vs talking to the engine directly.

For each setup -- ``direct`` (client -> the engines, streams spread evenly), ``steersman`` (``steersman
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

Code layout (all in bench/overhead/): options.py (CLI, setups), setups.py
(engines, `steersman serve`, peer routers), measure.py (one load phase + CPU
accounting), harness.py (the run loop), targets.py (ratios, target checks),
report.py (tables). stacks.py is a separate benchmark (HTTP stack choice).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/: loadgen, procs
sys.path.insert(0, str(HERE))  # bench/overhead/: the modules below, also when run.py is imported

from harness import Bench, pinned_group  # noqa: E402
from options import parse_args  # noqa: E402
from report import print_report  # noqa: E402
from targets import derive  # noqa: E402


def main(argv=None) -> int:
    a = parse_args(argv)
    pg, pinned = pinned_group(a, "steersman-bench-overhead-")
    log_dir = pg.log_dir
    bench = Bench(a, pg)
    bench.results["meta"]["pinned"] = pinned
    if not pinned:
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
