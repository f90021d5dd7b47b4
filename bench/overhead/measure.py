"""One measured load phase against a URL, with CPU accounting of the processes behind it."""

from __future__ import annotations

import asyncio
import os
import time

import loadgen
from procs import Proc, all_procs_ticks, descendants, foreign_cpu


async def phase(url: str | list[str], conc: int, body: dict, duration: float, *, engines: list[Proc], router: Proc | None,
                warmup: float, timeout: float, quickack: bool = False) -> dict:
    """Closed loop at `conc` streams: `warmup` s discarded, then `duration` s measured.

    ``url`` may be a list: stream i then talks to ``url[i % n]`` (the ``direct`` reference over every engine).

    Returns loadgen's summary plus ``other_load`` (CPU of processes not ours) and
    ``cpu`` (router / engines / client CPU per request and utilisation).
    """
    lg = loadgen.LoadGen(url, conc, body, timeout=timeout, quickack=quickack)
    await lg.connect()
    try:
        if warmup > 0:
            await lg.run(duration=warmup)
        procs = list(engines) + ([router] if router is not None else [])
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
    eng_ns = sum(c1[p.name] - c0[p.name] for p in engines)
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


async def idle_cpu(engines: list[Proc], router: Proc | None, seconds: float = 2.0) -> dict:
    """Background CPU with no traffic (health checks, metric scraping, timers)."""
    procs = list(engines) + ([router] if router is not None else [])
    await asyncio.sleep(0.3)
    c0 = {p.name: p.cpu_ns() for p in procs}
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    c1 = {p.name: p.cpu_ns() for p in procs}
    w = time.monotonic() - t0
    return {
        "seconds": w,
        "router_util": (c1[router.name] - c0[router.name]) / 1e9 / w if router is not None else None,
        "engines_util": sum(c1[p.name] - c0[p.name] for p in engines) / 1e9 / w,
    }


async def wait_quiet(max_wait: float, log) -> dict:
    """Sample other processes' CPU for 1 s, repeating while they use > 10 % of a core, up to `max_wait` s.

    Returns the last sample (foreign_cpu's dict).
    """
    t_wait = time.monotonic()
    while True:
        f0 = all_procs_ticks()
        await asyncio.sleep(1.0)
        ol = foreign_cpu(f0, all_procs_ticks(), {os.getpid()}, 1.0)
        if ol["util"] <= 0.10 or time.monotonic() - t_wait >= max_wait:
            return ol
        if time.monotonic() - t_wait < 1.5:
            log(f"waiting up to {max_wait:.0f}s for other processes to go quiet "
                f"({ol['util'] * 100:.0f}% of a core busy)")
