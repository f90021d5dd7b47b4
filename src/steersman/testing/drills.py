"""Live overload and cascade drills, shared by ``tests/faults`` (which assert) and ``bench/faults`` (which prints).

Every drill starts its own :class:`~steersman.testing.LiveFleet` of engine-sim
replicas running ``speedup`` times faster than real time.  The gateway's SLO
targets and reliability times are divided by ``speedup`` too (the engines'
latencies are), so the issue's numbers keep their meaning.

* :func:`overload` — measure the fleet's capacity (closed loop, same fleet, same
  run), then offer ``factor`` x that rate (Poisson arrivals) of a critical and a
  standard tenant whose clients retry 429/503 after ``Retry-After``; the gateway
  queue is bounded (``queue_max`` entries: beyond it the least important request is
  shed with 503 + Retry-After).  Reports retry amplification (upstream attempts /
  client HTTP requests), goodput vs capacity, the critical tenant's SLO attainment
  and the gateway queue's high-water mark.  ``deadline_s`` gives standard requests
  a deadline header; with it the fleet currently goes idle in waves (see the
  report of issue #5: deadline-infeasible refusals from an inflated latency
  correction), so it is off by default.
* :func:`cascade` — steady load at ``load`` x capacity with retrying clients; one
  replica degrades ``slowdown`` x, then recovers; report failures, goodput during
  the fault and the time from the fault clearing until goodput is back.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

from steersman.config import EngineSettings
from steersman.control import generate_key
from steersman.enginesim.app import SimServerConfig
from steersman.testing.faultload import Client, Done, Load, closed_loop, open_loop, percentile
from steersman.testing.faultload import in_background as _background, run_in_thread
from steersman.testing.live import LiveFleet

__all__ = ["OverloadResult", "CascadeResult", "overload", "cascade"]

MODEL = "llama-3.1-8b"


def _slo(speedup: float) -> dict:
    return {"interactive": {"ttft_s": 0.45 / speedup, "tpot_s": 0.040 / speedup},
            "standard": {"ttft_s": 2.0 / speedup, "tpot_s": 0.200 / speedup}, "batch": {}}


def _reliability(speedup: float) -> dict:
    return {"base_ejection_time_s": 30.0 / speedup, "max_ejection_time_s": 300.0 / speedup,
            "ejection_decay_s": 10.0 / speedup, "breaker_open_s": 5.0 / speedup, "breaker_window_s": 10.0 / speedup,
            "latency_floor_ttft_s": 2.0 / speedup, "latency_floor_tpot_s": 0.2 / speedup}


def _fleet(replicas: int, speedup: float, max_num_seqs: int, tenants: dict[str, str],
           queue_depth: int | None = None, queue_max: int | None = None) -> tuple[LiveFleet, dict[str, str]]:
    keys, entries = {}, []
    for name in tenants:
        k, digest = generate_key()
        keys[name] = k
        entries.append({"sha256": digest, "tenant": name})
    sims = [SimServerConfig(speedup=speedup, port=0, engine=EngineSettings(max_num_seqs=max_num_seqs)) for _ in range(replicas)]
    # the engines run max_num_seqs sequences at once, which the gateway's fleet model does not know: the
    # adaptive concurrency limit starts at twice that (an operator sets it from the engine's batch size)
    rel = {**_reliability(speedup), "limit_initial": 2.0 * max_num_seqs, "limit_max": max(200.0, 2.0 * max_num_seqs)}
    extra = {"tenants": {t: {"priority": p} for t, p in tenants.items()}, "api_keys": entries,
             "scheduler": {"slo_classes": _slo(speedup), **({} if queue_depth is None else {"saturation_queue_depth": queue_depth})},
             "reliability": rel, "admission": {} if queue_max is None else {"queue_max_entries": queue_max}}
    return LiveFleet(sims=sims, extra=extra), keys


def _body(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Summarise the quarterly report in a few sentences."}]}


def _capacity(url: str, load: Load, concurrency: int, seconds: float) -> float:
    """Completions per second with the fleet saturated (over all but the first ``seconds / 3``).

    A few requests one at a time first: the gateway learns each replica's unloaded
    latency (the concurrency limiter's baseline), as a fleet does before it is busy.
    """
    async def go() -> list[Done]:
        c = Client(url, retries=0, patience_s=30.0)
        try:
            await closed_loop(c, load, 2, 1.0)
            return await closed_loop(c, load, concurrency, seconds)
        finally:
            await c.close()

    t0 = time.monotonic() + 1.0
    done = run_in_thread(go, timeout=seconds + 60)
    lo, hi = t0 + seconds / 3, t0 + seconds
    return sum(1 for d in done if d.ok and lo <= d.end <= hi) / (hi - lo)


@dataclass
class OverloadResult:
    capacity_rps: float
    offered_rps: float
    client_requests: int  # unique requests the clients wanted served
    http_requests: int  # HTTP requests sent, retries included
    upstream_attempts: int
    goodput_rps: float  # successful completions per second during the overload
    critical_total: int
    critical_in_slo: int
    status_counts: dict[int, int]
    retry_after_missing: int  # 429/503 answers without Retry-After
    queue_high_water: int
    p99_ttft_critical_s: float
    left_at_end: tuple[int, int] = (0, 0)  # (queued in the gateway, in flight upstream) once the clients are done

    @property
    def amplification(self) -> float:
        return self.upstream_attempts / max(1, self.http_requests)

    @property
    def attempts_per_request(self) -> float:
        return self.upstream_attempts / max(1, self.client_requests)

    @property
    def goodput_ratio(self) -> float:
        return self.goodput_rps / self.capacity_rps

    @property
    def critical_attainment(self) -> float:
        return self.critical_in_slo / max(1, self.critical_total)


def overload(factor: float = 3.0, seconds: float = 8.0, speedup: float = 1.0, replicas: int = 2, max_num_seqs: int = 4,
             max_tokens: int = 64, critical_share: float = 0.1, seed: int = 0, deadline_s: float | None = None,
             queue_depth: int | None = None, queue_max: int | None = 64) -> OverloadResult:
    gc.collect()  # a full collection mid-drill (a long test session) would stall every stream at once
    lf, keys = _fleet(replicas, speedup, max_num_seqs, {"gold": "critical", "std": "standard"}, queue_depth, queue_max)
    ttft_target = 2.0 / speedup  # the standard SLO class's TTFT target, scaled
    with lf:
        gw = lf.gateway
        gold = Load("critical", {"Authorization": f"Bearer {keys['gold']}", "x-steersman-slo": "standard"},
                    _body(max_tokens), critical_share)
        # standard clients want an answer within deadline_s (scaled): the gateway refuses what cannot make it
        std_h = {"Authorization": f"Bearer {keys['std']}", "x-steersman-slo": "standard"}
        if deadline_s is not None:
            std_h["x-steersman-deadline-ms"] = str(int(deadline_s * 1000 / speedup))
        std = Load("standard", std_h, _body(max_tokens), 1 - critical_share)
        cap = _capacity(lf.url, Load("standard", {"Authorization": f"Bearer {keys['std']}"}, _body(max_tokens)),
                        concurrency=replicas * max_num_seqs * 3, seconds=6.0)
        attempts0 = gw.pipeline.retrier.attempts
        high = [0]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                high[0] = max(high[0], gw.plane.waiting)
                time.sleep(0.01)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        box: dict[str, Any] = {}

        async def go() -> list[Done]:
            c = Client(lf.url, retries=3, patience_s=2.0 * seconds)
            box["c"] = c
            try:
                return await open_loop(c, [gold, std], factor * cap, seconds, seed=seed)
            finally:
                await c.close()

        t0 = time.monotonic()
        done = run_in_thread(go, timeout=seconds * 4 + 60)
        stop.set()
        w.join(1)
        attempts = gw.pipeline.retrier.attempts - attempts0
        left = (gw.plane.waiting, int(gw.fleet.in_flight.sum()))
    c = box["c"]
    lo, hi = t0 + 1.0, t0 + seconds
    good = sum(1 for d in done if d.ok and lo <= d.end <= hi) / (hi - lo)
    crit = [d for d in done if d.cls == "critical"]
    in_slo = sum(1 for d in crit if d.ok and d.ttft is not None and d.ttft <= ttft_target)
    status: dict[int, int] = {}
    for d in done:
        status[d.status] = status.get(d.status, 0) + 1
    return OverloadResult(cap, factor * cap, len(done), c.sent, attempts, good, len(crit), in_slo, status,
                          c.missing_retry_after, high[0],
                          percentile([d.ttft for d in crit if d.ttft is not None], 99), left)


@dataclass
class CascadeResult:
    capacity_rps: float
    failed: int
    total: int
    goodput_before: float
    goodput_during: float
    recovery_s: float  # from the fault clearing until a 1 s window's goodput is back to 90 % of before
    replica_ejected: bool


def cascade(slowdown: float = 5.0, load: float = 0.7, speedup: float = 10.0, replicas: int = 3, max_num_seqs: int = 8,
            max_tokens: int = 32, before_s: float = 2.0, fault_s: float = 3.0, after_s: float = 5.0) -> CascadeResult:
    gc.collect()
    lf, keys = _fleet(replicas, speedup, max_num_seqs, {"std": "standard"})
    with lf:
        gw = lf.gateway
        headers = {"Authorization": f"Bearer {keys['std']}"}
        cap = _capacity(lf.url, Load("standard", headers, _body(max_tokens)), replicas * max_num_seqs * 3, 2.0)
        total_s = before_s + fault_s + after_s

        async def go() -> list[Done]:
            c = Client(lf.url, retries=3, patience_s=10.0)
            try:
                return await open_loop(c, [Load("standard", headers, _body(max_tokens))], load * cap, total_s)
            finally:
                await c.close()

        t0 = time.monotonic()
        join = _background(lambda: run_in_thread(go, timeout=total_s + 60))
        time.sleep(before_s)
        import httpx

        httpx.post(lf.sims[0].url + "/admin/faults", json={"slowdown": slowdown})
        ejected = False
        t_end = time.monotonic() + fault_s
        while time.monotonic() < t_end:
            ejected = ejected or bool(lf.call(_blocked, gw, 0))
            time.sleep(0.05)
        t_clear = time.monotonic()
        httpx.delete(lf.sims[0].url + "/admin/faults")
        done: list[Done] = join(total_s + 90)

    def rate(a: float, b: float) -> float:
        return sum(1 for d in done if d.ok and a <= d.end < b) / (b - a)

    before = rate(t0 + 0.5, t0 + before_s)
    during = rate(t0 + before_s, t_clear)
    recovery = float("inf")
    t = t_clear
    while t + 1.0 <= t0 + total_s:
        if rate(t, t + 1.0) >= 0.9 * before:
            recovery = t + 1.0 - t_clear
            break
        t += 0.1
    return CascadeResult(cap, sum(1 for d in done if not d.ok), len(done), before, during, max(0.0, recovery), ejected)


async def _blocked(gw, i: int) -> bool:
    return gw.fleet.blocked(i)
