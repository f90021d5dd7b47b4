"""Digital-twin speed: requests simulated per wall-second at fleet scale.

The whole twin runs -- workload generation, the event loop, the real control plane
(admission, queue, the routing policy on fleet snapshots, accounting, prefix
index) and the engine model of every replica -- on a fleet of ``--gpus`` H100
replicas of Llama-3.1-8B (one GPU each) under an agentic mix (chatbots and coding
copilots, each application sharing its system prompt) whose rate scales with the
fleet, until ``--requests`` requests have arrived (then in-flight ones drain).

Prints the wall time, requests simulated per wall-second, the simulated span and
utilisation, and where the time goes: ``--breakdown`` times the twin's calls into
each part (control plane / policy, accounting and prefix index, engine model,
workload, snapshots, scrapes; the rest is the event loop) at ~5% overhead;
``--profile`` runs cProfile (much slower, skewed towards many small calls) and
prints its top functions and self time by area.  The target is 1,000,000 requests over 1,000 GPUs in <= 60 s of
wall time on one core.  GC: ``Twin.run`` leaves generational collection on with
raised thresholds and the start-up heap frozen (``gc.freeze``) during the run,
restored after (``TwinConfig.tune_gc``; ``--gc default`` keeps Python's settings, to compare).

    .venv/bin/python bench/twin/run.py                                   # 1,000,000 requests, 1,000 GPUs
    .venv/bin/python bench/twin/run.py --requests 100000 --gpus 100      # quick
    .venv/bin/python bench/twin/run.py --requests 100000 --gpus 1000 --breakdown
    .venv/bin/python bench/twin/run.py --requests 20000 --gpus 1000 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from steersman.config import DEFAULTS  # noqa: E402
from steersman.policy import make_policy  # noqa: E402
from steersman.twin import ReplicaPlan, Twin, TwinConfig, TwinFleet, summarize  # noqa: E402
from steersman.twin.workload import load_workload  # noqa: E402

# per GPU: 0.7 chatbot tasks/s (1-6 turns, 20 s apart) + 0.04 copilot tasks/s (10-20 calls, 1.5 s apart): ~1.3
# requests/s per GPU once sessions overlap, ~70% GPU utilisation (--load scales it)
_CHAT_PER_GPU = 0.7
_COPILOT_PER_GPU = 0.04


def spec(gpus: int, load: float) -> dict:
    return {
        "model": "llama-3.1-8b",
        "duration_s": 1e9,  # stopped by the request cap
        "sources": [
            {"kind": "chatbot", "slo": "interactive", "tasks_per_s": _CHAT_PER_GPU * gpus * load,
             "system_prompt_tokens": 600},
            {"kind": "copilot", "slo": "standard", "tasks_per_s": _COPILOT_PER_GPU * gpus * load,
             "system_prompt_tokens": 2000, "system_prompt_id": "ide",
             "max_context_tokens": 16000, "compact_to_tokens": 6000},
        ],
    }


class Capped:
    """A workload that stops after ``n`` arrivals (open-loop ones and closed-loop follow-ups alike)."""

    def __init__(self, inner, n: int) -> None:
        self.inner, self.left = inner, n

    def _take(self, items):
        items = list(items)
        if len(items) > self.left:
            items = items[: self.left]
        self.left -= len(items)
        return items

    def start(self):
        return self._take(self.inner.start())

    def next_batch(self, until):
        return self._take(self.inner.next_batch(until)) if self.left > 0 else []

    def on_complete(self, a, finished_at, ok):
        out = self.inner.on_complete(a, finished_at, ok)
        return self._take(out) if self.left > 0 else []

    @property
    def done(self) -> bool:
        return self.left <= 0 or self.inner.done

    def __getattr__(self, name):
        return getattr(self.inner, name)


_AREAS = [  # (area, substrings of a profiled function's file path), first match wins
    ("engine model", ("steersman/sim/",)),
    ("policy", ("steersman/policy/", "steersman/plugins", "numba")),
    ("fleet state / snapshot", ("steersman/fleet/",)),
    ("control plane", ("steersman/control/",)),
    ("twin loop + replicas", ("steersman/twin/core", "steersman/twin/replica", "steersman/twin/results",
                              "steersman/twin/clock", "heapq")),
    ("workload", ("steersman/twin/workload/", "numpy/random", "random.py")),
]


class Timers:
    """Wall time inside the twin's calls into each part (no profiler: two clock reads per call).

    Inclusive times of the calls the twin's event loop makes; what is left of the
    wall time is the loop itself (heap, event dispatch, the recorder, glue).
    """

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._undo: list = []

    def wrap(self, owner, name: str, area: str) -> None:
        fn = getattr(owner, name)
        spent, calls, clock = self.spent, self.calls, time.perf_counter
        spent.setdefault(area, 0.0)
        calls.setdefault(area, 0)

        def timed(*a, **kw):
            t = clock()
            try:
                return fn(*a, **kw)
            finally:
                spent[area] += clock() - t
                calls[area] += 1

        self._undo.append((owner, name, owner.__dict__.get(name) if isinstance(owner, type) else None))
        setattr(owner, name, timed)

    def restore(self) -> None:
        for owner, name, old in reversed(self._undo):
            if isinstance(owner, type):
                setattr(owner, name, old)
            else:
                delattr(owner, name)


def instrument(twin) -> Timers:
    from steersman.twin.replica import SimReplica

    tm = Timers()
    tm.wrap(twin.plane, "arrive", "control plane: admit + policy decision (arrive)")
    tm.wrap(twin.plane, "dispatch", "control plane: queued dispatch")
    tm.wrap(twin.fleet, "snapshot", "fleet snapshot")
    tm.wrap(twin.accounting, "dispatched", "accounting: dispatched (prefix index record)")
    tm.wrap(twin.accounting, "ended", "accounting: ended")
    tm.wrap(twin.accounting, "first_token", "accounting: first token")
    tm.wrap(twin, "_scrape", "metrics scrape (engine state -> fleet)")
    for name in ("submit", "wake"):
        tm.wrap(SimReplica, name, "engine model (replica submit / wake)")
    for name in ("next_batch", "on_complete"):
        tm.wrap(twin.workload, name, "workload generation")
    return tm


def breakdown(prof: cProfile.Profile) -> list[tuple[str, float]]:
    """Self time per area (cProfile's tottime summed by file)."""
    st = pstats.Stats(prof)
    total = 0.0
    areas: dict[str, float] = {}
    for (file, _line, _fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        total += tt
        name = "other (builtins, numpy, dataclasses, ...)"
        for area, keys in _AREAS:
            if any(k in file for k in keys):
                name = area
                break
        areas[name] = areas.get(name, 0.0) + tt
    return sorted(((k, v / total) for k, v in areas.items()), key=lambda kv: -kv[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--load", type=float, default=1.0, help="x the default offered rate (about 2/3 of capacity)")
    ap.add_argument("--policy", default="steersman")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gc", choices=("tuned", "default"), default="tuned")
    ap.add_argument("--profile", action="store_true", help="cProfile the run (slower) and print the breakdown")
    ap.add_argument("--breakdown", action="store_true", help="time the twin's calls into each part (~5%% slower)")
    ap.add_argument("--kv-events", action="store_true",
                    help="every engine publishes its KV events and the policy reads them (scheduler.kv_events)")
    ap.add_argument("--out", help="write the numbers as JSON here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    scheduler = dataclasses.replace(DEFAULTS.scheduler, kv_events=args.kv_events)
    fleet = TwinFleet([ReplicaPlan(f"h100-{i}", "H100", "llama-3.1-8b") for i in range(args.gpus)], scheduler)
    wl = Capped(load_workload(spec(args.gpus, args.load), args.seed), args.requests)
    twin = Twin(fleet, wl, make_policy(args.policy, fleet.scheduler),
                cfg=TwinConfig(seed=args.seed, tune_gc=args.gc == "tuned"))
    setup = time.perf_counter() - t0

    prof = cProfile.Profile() if args.profile else None
    timers = instrument(twin) if args.breakdown else None
    t1 = time.perf_counter()
    c1 = time.process_time()
    try:
        if prof is not None:
            prof.enable()
        rec = twin.run()
        if prof is not None:
            prof.disable()
    finally:
        wall = time.perf_counter() - t1
        cpu = time.process_time() - c1
        if timers is not None:
            timers.restore()
    s = summarize(rec)
    n = s["requests"]
    steps = sum(r.engine.num_steps for r in fleet.replicas)
    out = {
        "requests": n, "gpus": args.gpus, "policy": args.policy, "gc": args.gc, "profiled": args.profile,
        "kv_events": args.kv_events,
        "wall_s": wall, "cpu_s": cpu, "setup_s": setup, "cpu_us_per_request": cpu / n * 1e6, "requests_per_wall_s": n / wall, "us_per_request": wall / n * 1e6,
        "simulated_s": rec.duration, "completed": s["completed"], "gpu_utilisation": s["gpu_utilisation"],
        "engine_steps": steps, "ttft_p50_s": s["ttft_s"]["p50"], "tpot_p50_s": s["tpot_s"]["p50"],
        "extrapolated_1M_s": wall / n * 1_000_000,
    }
    print(f"twin: {n:,} requests over {args.gpus:,} x H100 (policy {args.policy}, gc {args.gc}"
          f"{', KV events' if args.kv_events else ''}{', PROFILED' if args.profile else ''})")
    print(f"  wall {wall:8.2f} s   {n / wall:10,.0f} requests/wall-s   {wall / n * 1e6:7.1f} us/request"
          f"   (setup {setup:.2f} s; 1M requests at this rate: {wall / n * 1e6:.0f} s)")
    print(f"  CPU  {cpu:8.2f} s   {n / cpu:10,.0f} requests/CPU-s    {cpu / n * 1e6:7.1f} us/request"
          f"   (wall / CPU = {wall / cpu:.2f}: > 1 when other processes share the core)")
    print(f"  simulated {rec.duration:,.0f} s: {s['completed']:,} completed, GPU utilisation "
          f"{s['gpu_utilisation']:.0%}, {steps:,} engine steps, TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms, "
          f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.1f} ms")
    if timers is not None:
        print("  wall time by part (inclusive; the twin's calls into each):")
        rows = sorted(timers.spent.items(), key=lambda kv: -kv[1])
        for area, spent in rows:
            print(f"    {area:52s} {spent:8.2f} s {spent / wall:6.1%}  {spent / n * 1e6:7.1f} us/request"
                  f"  ({timers.calls[area]:,} calls, {spent / max(timers.calls[area], 1) * 1e6:.1f} us/call)")
        rest = wall - sum(timers.spent.values())  # snapshots taken inside a queued dispatch count twice
        print(f"    {'event loop, recorder, glue (the rest)':52s} {rest:8.2f} s {rest / wall:6.1%}  "
              f"{rest / n * 1e6:7.1f} us/request")
        out["breakdown_s"] = {**timers.spent, "rest": rest}
    if prof is not None:
        print("  self time by area:")
        for area, share in breakdown(prof):
            print(f"    {area:42s} {share:6.1%}")
        out["breakdown"] = dict(breakdown(prof))
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
