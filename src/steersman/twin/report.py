"""Presenting twin runs: the comparison table, ``results.json`` and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["table", "write_results", "plot", "drill_timeline"]

_COLUMNS = (
    ("policy", None), ("load", None), ("req/s", "throughput_rps"), ("goodput", "goodput_rps"),
    ("SLO %", "slo_attainment"), ("TTFT p50", ("ttft_s", "p50")), ("TTFT p99", ("ttft_s", "p99")),
    ("TPOT p50", ("tpot_s", "p50")), ("e2e p99", ("e2e_s", "p99")), ("prefix hit", "prefix_cache_hit_rate"),
    ("GPU util", "gpu_utilisation"), ("mem-bound", "memory_bound_share"), ("cap. used", "capacity_used"),
    ("$", "cost_usd"), ("$/task ok", "cost_per_successful_task_usd"), ("tasks ok", "task_success_rate"),
    # the tasks still under way when the run stopped: never successes (a short run reads "tasks ok" low for them)
    ("unfinished", "tasks_unfinished"),
)


def _get(s: dict, key):
    if isinstance(key, tuple):
        v = s.get(key[0]) or {}
        return v.get(key[1])
    return s.get(key)


def _fmt(name: str, v) -> str:
    if v is None:
        return "-"
    if name in ("SLO %", "prefix hit", "GPU util", "mem-bound", "cap. used", "tasks ok"):
        return f"{100 * v:.1f}%"
    if name.startswith(("TTFT", "TPOT", "e2e")):
        return f"{1000 * v:.1f} ms"
    if name in ("$", "$/task ok"):
        return f"{v:.4f}"
    if name == "unfinished":
        return f"{v:,}"
    return f"{v:.2f}"


def table(runs: dict[str, dict[float, dict]]):
    """A rich table of ``runs[policy][load] = summary``."""
    from rich.table import Table

    t = Table(title="steersman simulate: policies side by side", title_justify="left")
    for name, _ in _COLUMNS:
        t.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True)
    for policy, by_load in runs.items():
        for load, s in sorted(by_load.items()):
            t.add_row(policy, f"{load:g}x", *(_fmt(n, _get(s, k)) for n, k in _COLUMNS[2:]))
    return t


def write_results(out: Path, meta: dict, runs: dict[str, dict[float, dict]]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "policies": {p: {f"{load:g}": s for load, s in sorted(by.items())} for p, by in runs.items()}}
    path = out / "results.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    return path


def plot(out: Path, runs: dict[str, dict[float, dict]], samples: dict[str, dict[str, np.ndarray]]) -> list[Path]:
    """latency_cdf.png (TTFT and end-to-end, at load 1x or the first), goodput_vs_load.png, cost_per_task.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy, s in samples.items():
        for ax, key in zip(axes, ("ttft", "e2e")):
            x = np.sort(s[key])
            if x.size:
                ax.plot(x, np.arange(1, x.size + 1) / x.size, label=policy)
    for ax, title in zip(axes, ("TTFT", "end-to-end latency")):
        ax.set_xscale("log")
        ax.set_xlabel("seconds")
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    if axes[0].lines:  # no policy served a request (every run refused or failed everything): no curve to name
        axes[0].legend(fontsize=8)
    else:
        axes[0].text(0.5, 0.5, "no request succeeded", ha="center", va="center", transform=axes[0].transAxes)
    fig.tight_layout()
    paths.append(out / "latency_cdf.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, by in runs.items():
        loads = sorted(by)
        ax.plot(loads, [by[x]["goodput_rps"] for x in loads], marker="o", label=policy)
    ax.set_xlabel("offered load (x the workload's rate)")
    ax.set_ylabel("goodput (requests meeting their SLO per s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "goodput_vs_load.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(runs)
    vals = []
    for p in names:
        s = runs[p][1.0] if 1.0 in runs[p] else runs[p][min(runs[p])]
        vals.append(s.get("cost_per_successful_task_usd"))
    # a policy with no successful task has no cost per one: no bar and a note, not a $0.00 bar (the cheapest-looking)
    ax.bar(names, [v if v is not None else 0.0 for v in vals])
    for k, v in enumerate(vals):
        if v is None:
            ax.text(k, 0, "no task\nsucceeded", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("$ per successful task")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    paths.append(out / "cost_per_task.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def drill_timeline(runs: dict[str, dict[float, dict]]):
    """A rich table of goodput per time window for every policy (at load 1x or the first), with the drills marked."""
    from rich.table import Table

    first = next(iter(runs.values()))
    s0 = first[1.0] if 1.0 in first else first[min(first)]
    drills = s0.get("drills") or []
    w = s0["timeline"]["window_s"]
    t = Table(title=f"goodput per {w:g} s window (requests meeting their SLO per s; * = a drill step in the window)",
              title_justify="left")
    t.add_column("t (s)", justify="right")
    for policy in runs:
        t.add_column(policy, justify="right")
    t.add_column("drill")
    cols = []
    for by in runs.values():
        s = by[1.0] if 1.0 in by else by[min(by)]
        cols.append(s["timeline"]["windows"])
    for k in range(max(len(c) for c in cols)):
        t0 = k * w
        here = [d for d in drills if t0 <= d["at_s"] < t0 + w]
        label = "; ".join(f"{d['action']} {d['replica']}" + (f" {d['value']:g}" if d["value"] is not None else "")
                          for d in here)
        t.add_row(f"{t0:g}{'*' if here else ''}", *(f"{c[k]['goodput_rps']:.2f}" if k < len(c) else "-" for c in cols),
                  label)
    return t
