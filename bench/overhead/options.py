"""bench/overhead/run.py command line: setups, defaults, parse_args()."""

from __future__ import annotations

import argparse
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent

#: steersman-rr routes round-robin like the Rust routers (like-for-like overhead); steersman runs
#: the default model-based profile (what ships: the overhead plus the scheduler's work)
SETUPS = ["direct", "steersman-rr", "steersman", "steersman-otlp", "vllm-router", "sglang-router"]
ROUTER_SETUPS = ["steersman-rr", "steersman", "steersman-otlp", "vllm-router", "sglang-router"]
MODEL = "llama-3.1-8b"
#: a setup name ending in this runs the --baseline-bin gateway (setup_kind() strips it)
BASE_SUFFIX = "@base"


def setup_kind(setup: str) -> str:
    """``steersman-rr@base`` -> ``steersman-rr``: what to start, whichever tree it comes from."""
    return setup[: -len(BASE_SUFFIX)] if setup.endswith(BASE_SUFFIX) else setup


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
    ap.add_argument("--layout", choices=["shared", "isolated"], default="shared",
                    help="shared: engines + router on --server-cpu, client on --client-cpu (CPU-bound at 64+ streams: "
                         "compare CPU per request); isolated: the router alone on --client-cpu, engines + client on "
                         "--server-cpu (the router is not starved: its added latency, not the core's queueing)")
    ap.add_argument("--peers-venv", default=str(BENCH / ".venv-peers"))
    ap.add_argument("--no-setup-peers", action="store_true", help="do not create the peers venv when it is missing")
    ap.add_argument("--steersman-bin", default=None, help="default: steersman next to this python, then PATH")
    ap.add_argument("--baseline-bin", default=None,
                    help="another tree's `steersman` executable (e.g. a wrapper running `python -m steersman` with "
                         "PYTHONPATH=<worktree>/src): each steersman setup also runs with it, as <setup>@base, "
                         "right after the current one, so old vs new are compared in the same run")
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
    if a.baseline_bin:  # interleaved: base right after new, same engines, same minute of machine load
        a.setups = [x for s in a.setups for x in ([s, s + BASE_SUFFIX] if s.startswith("steersman") else [s])]
    a.concurrency = [int(c) for c in a.concurrency.split(",") if c.strip()]
    return a
