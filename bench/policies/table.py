"""Ratios, the per-workload table and the target verdicts of bench/policies."""

from __future__ import annotations

__all__ = ["ratios", "print_workload", "verdicts", "opt_in_lines", "EARLY_REJECT"]

OURS = "steersman"
#: steersman with Mooncake's early rejection for standard requests too (scheduler.shed_infeasible: an opt-in; the
#: default sheds only the 'sheddable' class): a row of the table, never a baseline or the verdicts' subject
EARLY_REJECT = "steersman+reject"
RR = "round-robin"
GOODPUT = "bench_goodput_rps"  # met SLO per second of the offered window (calibrate.offered_window_goodput)


def _div(a, b):
    return a / b if a is not None and b else None


def _best(summaries: dict, key: str) -> tuple[str | None, float | None]:
    vals = {p: s.get(key) for p, s in summaries.items() if p not in (OURS, EARLY_REJECT) and s.get(key) is not None}
    if not vals:
        return None, None
    p = max(vals, key=vals.get)
    return p, vals[p]


def ratios(summaries: dict) -> dict:
    """Per policy: goodput / round-robin's, goodput / the best baseline's, tasks per $ / the best baseline's."""
    rr = summaries.get(RR, {}).get(GOODPUT)
    best_g, g = _best(summaries, GOODPUT)
    best_t, t = _best(summaries, "successful_tasks_per_usd")
    out = {"best_baseline_goodput": best_g, "best_baseline_tasks_per_usd": best_t, "per_policy": {}}
    for p, s in summaries.items():
        out["per_policy"][p] = {"goodput_vs_round_robin": _div(s.get(GOODPUT), rr),
                                "goodput_vs_best_baseline": _div(s.get(GOODPUT), g),
                                "tasks_per_usd_vs_best_baseline": _div(s.get("successful_tasks_per_usd"), t)}
    return out


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def print_workload(name: str, load: float, cap, summaries: dict, rat: dict) -> None:
    head = (f"{'policy':<20} {'goodput/s':>9} {'vs RR':>6} {'vs best':>7} {'SLO %':>6} {'TTFT p50':>9} "
            f"{'TTFT p99':>9} {'prefix hit':>10} {'$/task ok':>9} {'tasks ok/$':>10} {'failed':>6} {'refused':>7} "
            f"{'pred miss':>9} {'SLO|met':>7} {'SLO|miss':>8}")
    print(f"\n{name}: {load:.3g}x the workload's rate, {cap.offered_rps_at_1x * load:.3g} req/s offered "
          f"(capacity {cap.capacity_rps:.3g} req/s); best baseline: goodput {rat['best_baseline_goodput']}, "
          f"tasks/$ {rat['best_baseline_tasks_per_usd']}")
    print(head)
    print("-" * len(head))
    for p, s in summaries.items():
        r = rat["per_policy"][p]
        ttft = s.get("ttft_s") or {}
        print(f"{p:<20} {_f(s[GOODPUT], '9.3f')} {_f(r['goodput_vs_round_robin'], '6.2f')} "
              f"{_f(r['goodput_vs_best_baseline'], '7.2f')} {_f(100 * (s['slo_attainment'] or 0), '6.1f')} "
              f"{_f(ttft.get('p50') and 1000 * ttft['p50'], '7.0f')}ms {_f(ttft.get('p99') and 1000 * ttft['p99'], '7.0f')}ms "
              f"{_f(100 * s['prefix_cache_hit_rate'], '9.1f')}% {_f(s['cost_per_successful_task_usd'], '9.4f')} "
              f"{_f(s['successful_tasks_per_usd'], '10.1f')} {s['failed']:>6} {s['refused']:>7} "
              f"{_pct(s.get('predicted_missed_share'), 8)} {_pct(s.get('slo_attainment_predicted_met'), 6)} "
              f"{_pct(s.get('slo_attainment_predicted_missed'), 7)}")


def _pct(v, width: int) -> str:
    """A share as a percentage, '-' when there is none (profiles that do not predict)."""
    return f"{'-':>{width}} " if v is None else f"{100 * v:{width}.1f}%"


def _ceiling(summaries: dict, against: str | None, finished: bool = False) -> float | None:
    """Steersman's tasks per $ if every task of its run had succeeded at the run's cost, over the best baseline's:
    the most a routing policy can reach on a fixed fleet, where every GPU-hour is paid whether used or not.
    ``finished``: over the tasks that finished within the run (``tasks_unfinished`` left out): those cut by the
    window's end cannot succeed whatever the routing, so this is the most routing can reach at this load."""
    ours, best = summaries.get(OURS, {}), summaries.get(against or "", {})
    if not ours.get("cost_usd") or not best.get("successful_tasks_per_usd"):
        return None
    tasks = ours["tasks"] - (ours.get("tasks_unfinished", 0) if finished else 0)
    return tasks / ours["cost_usd"] / best["successful_tasks_per_usd"]


def verdicts(by_workload: dict) -> list[dict]:
    """The issue's targets, checked on what was measured (steersman vs the baselines)."""
    out = []
    for name, w in by_workload.items():
        r = w["ratios"]["per_policy"].get(OURS)
        if r is None:
            continue
        if w["prefix_heavy"]:
            for key, target, against in (("goodput_vs_round_robin", 2.0, RR),
                                         ("goodput_vs_best_baseline", 1.3, w["ratios"]["best_baseline_goodput"])):
                m = r[key]
                out.append({"workload": name, "target": f"{name}: goodput >= {target}x {against}",
                            "measured": m or 0.0, "against": against, "met": bool(m and m >= target)})
        if w["agentic"]:
            m = r["tasks_per_usd_vs_best_baseline"]
            against = w["ratios"]["best_baseline_tasks_per_usd"]
            out.append({"workload": name, "target": f"{name}: successful tasks per $ >= 1.5x {against}",
                        "measured": m or 0.0, "against": against, "met": bool(m and m >= 1.5),
                        "ceiling": _ceiling(w["policies"], against),
                        "ceiling_finished": _ceiling(w["policies"], against, finished=True)})
    return out


def opt_in_lines(by_workload: dict) -> list[str]:
    """What the opt-in early rejection measured, per workload (informational: not a target's verdict)."""
    out = []
    for name, w in by_workload.items():
        r = w["ratios"]["per_policy"].get(EARLY_REJECT)
        s = w["policies"].get(EARLY_REJECT)
        if r is None or s is None:
            continue
        n = max(1, s.get("requests") or 1)
        out.append(f"opt-in  {name}: steersman + early rejection of standard requests: goodput "
                   f"{_f(r['goodput_vs_best_baseline'], '.2f')}x {w['ratios']['best_baseline_goodput']}, "
                   f"{_f(r['goodput_vs_round_robin'], '.2f')}x round-robin, tasks per $ "
                   f"{_f(r['tasks_per_usd_vs_best_baseline'], '.2f')}x; refused {s['refused']} of {n}")
    return out
