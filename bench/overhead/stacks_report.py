"""Tables for bench/overhead/stacks.py (rich), from the per-stack medians."""

from __future__ import annotations

import shutil

# per phase key (c1, c64, ..., tp): what each flattened metric is
METRICS = {
    "rps": "completed requests per second",
    "ttft_p50": "TTFT p50, ms", "ttft_p99": "TTFT p99, ms", "itl_p99": "ITL p99, ms",
    "proxy_us": "proxy process (and children) CPU us per request",
    "engines_us": "both engines' CPU us per request",
    "core": "server core busy (engines + proxy CPU / wall)",
    "other": "CPU of processes not started by the benchmark, fraction of a core",
    "idle_util": "proxy CPU with no traffic (1 s), fraction of a core",
    "errors": "failed requests, all phases and rounds",
}


def _f(x, nd=2, unit=""):
    return "-" if x is None else f"{x:.{nd}f}{unit}"


def _x(v, base):
    return "-" if v is None or not base else f"{v / base:.2f}x"


def print_tables(table: dict, skipped: dict, a, baseline: str) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(140, shutil.get_terminal_size((140, 40)).columns))
    b = table.get(baseline, {})
    rounds = f", median of {a.rounds} rounds" if a.rounds > 1 else ""
    t = Table(title=f"Streaming: 16 chunks {a.interval_ms:g} ms apart, 2 stub engines; x = ratio vs {baseline}{rounds}",
              title_justify="left")
    for col in ["stack", "c", "req/s", "TTFT\np50 ms", "p50\nx", "TTFT\np99 ms", "p99\nx", "ITL\np99 ms",
                "proxy\nus/req", "us/req\nx", "engines\nus/req", f"core {a.server_cpu}\nbusy", "other\nprocs"]:
        t.add_column(col, justify="left" if col == "stack" else "right", no_wrap=True)
    for name, m in table.items():
        for c in a.concurrency:
            k = f"c{c}"
            t.add_row(name, str(c), _f(m.get(f"{k}_rps"), 0), _f(m.get(f"{k}_ttft_p50"), 3),
                      _x(m.get(f"{k}_ttft_p50"), b.get(f"{k}_ttft_p50")), _f(m.get(f"{k}_ttft_p99"), 3),
                      _x(m.get(f"{k}_ttft_p99"), b.get(f"{k}_ttft_p99")), _f(m.get(f"{k}_itl_p99"), 3),
                      _f(m.get(f"{k}_proxy_us"), 0), _x(m.get(f"{k}_proxy_us"), b.get(f"{k}_proxy_us")),
                      _f(m.get(f"{k}_engines_us"), 0), _f((m.get(f"{k}_core") or 0) * 100, 0, "%"),
                      _f((m.get(f"{k}_other") or 0) * 100, 0, "%"))
        t.add_section()
    con.print(t)

    t = Table(title=f"Short streams: max_tokens 4, c=64, as fast as possible; x = ratio vs {baseline}",
              title_justify="left")
    for col in ["stack", "req/s", "req/s\nx", "proxy\nus/req", "us/req\nx", "proxy alone\nreq/s/core",
                f"core {a.server_cpu}\nbusy", "idle\nCPU", "errors\n(all)", "other\nprocs"]:
        t.add_column(col, justify="left" if col == "stack" else "right", no_wrap=True)
    for name, m in table.items():
        us = m.get("tp_proxy_us")
        t.add_row(name, _f(m.get("tp_rps"), 0), _x(m.get("tp_rps"), b.get("tp_rps")), _f(us, 0),
                  _x(us, b.get("tp_proxy_us")), _f(1e6 / us if us else None, 0),
                  _f((m.get("tp_core") or 0) * 100, 0, "%"),
                  _f(m["idle_util"] * 100, 1, "%") if m.get("idle_util") is not None else "-",
                  str(m.get("errors", 0)) if not m.get("errors") else f"[red]{m['errors']}[/red]",
                  _f((m.get("tp_other") or 0) * 100, 0, "%"))
    con.print(t)
    for name, why in skipped.items():
        lines = why.strip().splitlines() or [""]
        more = f"\n      ... {lines[-1].strip()}" if len(lines) > 1 else ""
        con.print(f"  [yellow]{name}: skipped[/yellow] - {lines[0]}{more}")
    worst = max((v or 0 for m in table.values() for k, v in m.items() if k.endswith("_other")), default=0)
    if worst > 0.10:
        con.print(f"[red]warning:[/red] other processes used up to {worst * 100:.0f}% of a core during a phase; "
                  "rerun on a quiet machine.")
