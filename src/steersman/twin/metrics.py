"""Summary metrics of a twin run (the stable keys of ``results.json``; definitions in :mod:`.results`)."""

from __future__ import annotations

import numpy as np

from steersman.fleet.statics import ReplicaSpec, build_statics
from steersman.twin.results import FAILED, OK, PENDING, REFUSED, Recorder

__all__ = ["summarize", "timeline", "per_replica", "window_for", "slo_met", "PERCENTILES"]

PERCENTILES = (50, 90, 99)


def _pct(x: np.ndarray) -> dict[str, float | None]:
    if x.size == 0:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    out = {f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES}
    out["mean"] = float(x.mean())
    return out


def _capacity_tokens_per_s(rec: Recorder, mean_ctx: float) -> float:
    """Roofline decode limit: every replica at its largest batch (max_num_seqs, or what its KV holds)."""
    fleet = rec.fleet
    plans = fleet.plans
    st = build_statics([ReplicaSpec(p.gpu, p.model, p.tp, p.price_per_hour) for p in plans])
    total = 0.0
    ctx = max(mean_ctx, 1.0)
    for i, rep in enumerate(fleet.replicas):
        eng = rep.engine
        kv_tokens = eng.state().kv_blocks_total * eng.block_size
        batch = float(max(1, min(eng.max_num_seqs, int(kv_tokens // ctx))))
        idx = np.array([i])
        one = np.ones(1)
        t = st.step_time(idx, one * batch, 0 * one, 0 * one, one * batch * ctx, one * batch)[0]
        total += batch / t
    return total


def summarize(rec: Recorder) -> dict:
    c = rec.arrays()
    status = c["status"]
    dur = max(rec.duration, 1e-9)
    ok = status == OK
    ttft = c["first"] - c["arrival"]
    out = c["output"].astype(float)
    tpot = np.where(out > 1, (c["finish"] - c["first"]) / np.maximum(out - 1, 1), 0.0)
    e2e = c["finish"] - c["arrival"]
    met = slo_met(c)
    n = int(status.size)

    tasks: dict[str, bool] = {}
    for wf, good in zip(c["workflow"].tolist(), met.tolist()):
        tasks[wf] = tasks.get(wf, True) and good
    # under way when the run stopped: a later call not sent, or one that never ended (no drain)
    unfinished = (rec.cut_short | set(c["workflow"][status == PENDING].tolist())) & tasks.keys()
    successes = sum(tasks.values()) - sum(tasks[wf] for wf in unfinished)

    states = rec.engine_states
    queries = sum(s.prefix_queries for s in states)
    hits = sum(s.prefix_hits for s in states)
    busy = float(rec.busy.sum())
    replicas = len(rec.fleet.replicas)
    cost = rec.fleet.price_per_hour * dur / 3600.0
    out_tokens = float(out[ok].sum())
    ctx = c["prompt"][ok] + out[ok] / 2
    capacity = _capacity_tokens_per_s(rec, float(ctx.mean()) if ctx.size else 1024.0)
    return {
        "requests": n,
        "completed": int(ok.sum()),
        "refused": int((status == REFUSED).sum()),
        "failed": int((status == FAILED).sum()),
        "duration_s": rec.duration,
        "ttft_s": _pct(ttft[ok]),
        "tpot_s": _pct(tpot[ok & (out > 1)]),
        "e2e_s": _pct(e2e[ok]),
        "slo_attainment": float(met.sum() / n) if n else None,
        "goodput_rps": float(met.sum() / dur),
        "throughput_rps": float(ok.sum() / dur),
        "output_tokens_per_s": out_tokens / dur,
        "prefix_cache_hit_rate": float(hits / queries) if queries else 0.0,
        "gpu_utilisation": busy / (dur * replicas) if replicas else 0.0,
        "compute_bound_share": float(rec.compute_bound.sum() / busy) if busy else 0.0,
        "memory_bound_share": float(1.0 - rec.compute_bound.sum() / busy) if busy else 0.0,
        "cost_usd": cost,
        "cost_per_hour_usd": rec.fleet.price_per_hour,
        "tasks": len(tasks),
        "tasks_succeeded": int(successes),
        "tasks_unfinished": len(unfinished),
        "task_success_rate": successes / len(tasks) if tasks else None,
        "cost_per_successful_task_usd": cost / successes if successes else None,
        "successful_tasks_per_usd": successes / cost if cost else None,
        "capacity_output_tokens_per_s": capacity,
        "capacity_used": out_tokens / dur / capacity if capacity else None,
        "replicas": replicas,
        **_predictions(c["predicted"], met),
    }


def _predictions(predicted: np.ndarray, met: np.ndarray) -> dict:
    """How the routes' SLO predictions came out (None where no route predicted: the baselines)."""
    on, late = predicted == "met", predicted == "missed"
    routed = int(on.sum() + late.sum())
    return {
        "predicted_missed_share": float(late.sum() / routed) if routed else None,
        "slo_attainment_predicted_met": float(met[on].mean()) if on.any() else None,
        "slo_attainment_predicted_missed": float(met[late].mean()) if late.any() else None,
    }


_NICE_WINDOWS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)


def window_for(duration_s: float, windows: int = 40) -> float:
    """A round window length giving at most about ``windows`` windows over the run."""
    for w in _NICE_WINDOWS:
        if duration_s / w <= windows:
            return float(w)
    return float(_NICE_WINDOWS[-1])


def slo_met(c: dict) -> np.ndarray:
    """Per request of ``Recorder.arrays()``: completed within its TTFT and TPOT targets and its deadline."""
    out = c["output"].astype(float)
    ttft = c["first"] - c["arrival"]
    tpot = np.where(out > 1, (c["finish"] - c["first"]) / np.maximum(out - 1, 1), 0.0)
    return (c["status"] == OK) & (ttft <= c["ttft_target"]) & (tpot <= c["tpot_target"]) & (c["finish"] <= c["deadline"])


def timeline(rec: Recorder, window_s: float | None = None) -> dict:
    """What happened per time window (to see a failure drill's effect): arrivals by arrival time; completions,
    failures, refusals, goodput and TTFT percentiles of completed requests by finish time."""
    c = rec.arrays()
    w = window_s or window_for(rec.duration)
    n = max(1, int(np.ceil(rec.duration / w))) if rec.duration > 0 else 1
    status, fin = c["status"], c["finish"]
    met = slo_met(c)
    ttft = c["first"] - c["arrival"]

    def bins(t: np.ndarray) -> np.ndarray:
        return np.clip((np.nan_to_num(t, nan=-1.0) // w).astype(int), -1, n - 1)

    fb, ab = bins(fin), bins(c["arrival"])
    rows = []
    for k in range(n):
        here = fb == k
        ok = here & (status == OK)
        tt = ttft[ok]
        rows.append({
            "t_s": k * w, "arrived": int((ab == k).sum()), "completed": int(ok.sum()),
            "failed": int((here & (status == FAILED)).sum()), "refused": int((here & (status == REFUSED)).sum()),
            "goodput_rps": float((here & met).sum() / w),
            "ttft_p50_s": float(np.percentile(tt, 50)) if tt.size else None,
            "ttft_p99_s": float(np.percentile(tt, 99)) if tt.size else None,
        })
    return {"window_s": w, "windows": rows}


def per_replica(rec: Recorder) -> list[dict]:
    """Per replica: its name, requests whose last attempt went there and how they ended, every attempt sent there
    (retries, continued streams and disaggregated decodes included) and those that failed there, TTFT percentiles,
    busy share."""
    c = rec.arrays()
    status, rep = c["status"], c["replica"]
    ttft = c["first"] - c["arrival"]
    dur = max(rec.duration, 1e-9)
    out = []
    for i, plan in enumerate(rec.fleet.plans):
        mine = rep == i
        ok = mine & (status == OK)
        tt = ttft[ok]
        out.append({"name": plan.name, "gpu": plan.gpu, "requests": int(mine.sum()), "completed": int(ok.sum()),
                    "failed": int((mine & (status == FAILED)).sum()),
                    "attempts": int(rec.attempts[i]), "failed_attempts": int(rec.attempt_failures[i]),
                    "ttft_p50_s": float(np.percentile(tt, 50)) if tt.size else None,
                    "ttft_p99_s": float(np.percentile(tt, 99)) if tt.size else None,
                    "gpu_utilisation": float(rec.busy[i] / dur)})
    return out
