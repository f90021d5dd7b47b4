"""The tables bench/overhead/run.py prints (rich), from results + targets.derive()."""

from __future__ import annotations

import json
import math
import shutil


def fmt(x, nd=2, unit=""):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}{unit}"


def _x(v):
    return fmt(v, 2, "x")


def print_report(results: dict, der: dict, a):
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(json.dumps(der, indent=2))
        return
    con = Console(width=max(150, shutil.get_terminal_size((150, 40)).columns))
    S = results["setups"]
    ok = {n: s for n, s in S.items() if s.get("status") == "ok"}
    eng = results.get("engine", {})
    pac = eng.get("pacing", {})
    con.print(f"\n[bold]bench/overhead[/bold]  engine={eng.get('kind')} x{a.replicas}  endpoint={a.endpoint}  "
              f"policy={a.policy}  pinned={results['meta']['pinned']}\n"
              f"engine pacing (direct, c=1): {fmt(pac.get('chunks_per_req'), 0)} chunks/request, "
              f"ITL p50 {fmt(pac.get('itl_p50_ms'), 2)} ms, E2E p50 {fmt(pac.get('e2e_p50_ms'), 1)} ms")
    direct_chunks = ok.get("direct", {}).get("chunks_per_req")

    def name_cell(n, s):
        c = s.get("chunks_per_req")
        if direct_chunks and c and abs(c - direct_chunks) > 0.01:
            return f"{n} [red](chunks {c:.0f}!={direct_chunks:.0f})[/red]"
        return n

    t = Table(title=f"Streaming latency, ms (closed loop, {a.max_tokens} chunks/request); "
                    "+ = added vs direct, x = ratio", title_justify="left")
    for col in ["setup", "c", "req/s", "TTFT\np50", "TTFT\np90", "TTFT\np99", "+TTFT\np50", "+TTFT\np99",
                "TTFT p50\nx direct", "TTFT p50\nx vllm", "ITL\np50", "ITL\np99", "ITL p99\nx vllm", "err"]:
        t.add_column(col, justify="left" if col == "setup" else "right", no_wrap=True)
    for n, s in ok.items():
        for c, ph in s["latency"].items():
            r = der["latency"].get(n, {}).get(c, {})
            dr = n == "direct"
            nv = n in ("direct", "vllm-router")
            t.add_row(name_cell(n, s), c, fmt(ph["rps"], 0), fmt(ph["ttft_ms"]["p50"], 3), fmt(ph["ttft_ms"]["p90"], 3),
                      fmt(ph["ttft_ms"]["p99"], 3),
                      "" if dr else fmt(r.get("ttft_ms_p50_added"), 3), "" if dr else fmt(r.get("ttft_ms_p99_added"), 3),
                      "" if dr else _x(r.get("ttft_ms_p50_x_direct")), "" if nv else _x(r.get("ttft_ms_p50_x_vllm")),
                      fmt(ph["itl_ms"]["p50"], 3), fmt(ph["itl_ms"]["p99"], 3),
                      "" if nv else _x(r.get("itl_ms_p99_x_vllm")),
                      str(ph["errors"]) if not ph["errors"] else f"[red]{ph['errors']}[/red]")
        t.add_section()
    con.print(t)

    t = Table(title=f"CPU per request (us) during the latency phases; {_layout(a)}", title_justify="left")
    for col in ["setup", "c", "router\nus/req", "router\nx vllm", "engines\nus/req", f"core {a.server_cpu}\nbusy",
                "client\nbusy", "client\nus/req", "other\nprocs"]:
        t.add_column(col, justify="left" if col == "setup" else "right", no_wrap=True)
    for n, s in ok.items():
        for c, ph in s["latency"].items():
            r = der["latency"].get(n, {}).get(c, {})
            cpu = ph["cpu"]
            ol = ph.get("other_load", {})
            olu = ol.get("util", 0.0)
            ols = fmt(olu * 100, 0, "%") + (f" ({ol['top'][0]['proc']})" if olu > 0.05 and ol.get("top") else "")
            t.add_row(n, c, fmt(cpu["router_us_per_req"], 0),
                      "" if n in ("direct", "vllm-router") else _x(r.get("router_cpu_x_vllm")),
                      fmt(cpu["engines_us_per_req"], 0), fmt(cpu["server_core_util"] * 100, 0, "%"),
                      fmt(cpu["client_util"] * 100, 0, "%"), fmt(cpu["client_us_per_req"], 0),
                      ols if olu <= 0.10 else f"[red]{ols}[/red]")
        t.add_section()
    con.print(t)

    idle = [f"{n}: " + (f"router {s['idle']['router_util'] * 100:.1f}%, " if s["idle"].get("router_util") is not None else "")
            + f"engines {s['idle']['engines_util'] * 100:.1f}%" for n, s in ok.items() if s.get("idle")]
    if idle:
        con.print("  CPU with no traffic (2 s; health checks, metric scraping; inflates us/req at c=1): " + "; ".join(idle))

    if not a.no_throughput and any(s.get("throughput") for s in ok.values()):
        t = Table(title=f"Throughput: streamed max_tokens={a.tp_max_tokens}, c={a.tp_concurrency}, as fast as possible "
                        f"({_layout(a)})", title_justify="left")
        for col in ["setup", "req/s", "req/s\nx direct", "req/s\nx vllm", "err", "router\nus/req", "router\nx vllm",
                    "router\nreq/s/core", "engines\nus/req", f"core {a.server_cpu}\nbusy", "client\nbusy", "other\nprocs"]:
            t.add_column(col, justify="left" if col == "setup" else "right", no_wrap=True)
        for n, s in ok.items():
            tp = s.get("throughput")
            if not tp:
                continue
            r = der["throughput"].get(n, {})
            cpu = tp["cpu"]
            nv = n in ("direct", "vllm-router")
            t.add_row(n, fmt(tp["rps"], 0), "" if n == "direct" else _x(r.get("rps_x_direct")),
                      "" if nv else _x(r.get("rps_x_vllm")), str(tp["errors"]), fmt(cpu["router_us_per_req"], 0),
                      "" if nv else _x(r.get("router_cpu_x_vllm")), fmt(r.get("router_capacity_rps_per_core"), 0),
                      fmt(cpu["engines_us_per_req"], 0), fmt(cpu["server_core_util"] * 100, 0, "%"),
                      fmt(cpu["client_util"] * 100, 0, "%"), fmt(tp.get("other_load", {}).get("util", 0) * 100, 0, "%"))
        con.print(t)
        con.print("  router req/s/core = 1e6 / router us/req: what the router process alone could sustain "
                  "on a whole core.")

    tg = der.get("targets", {})
    if tg:
        con.print("[bold]Targets[/bold] (they are steersman's; the Rust routers are shown for reference)")
        for n, t in tg.items():
            parts = []
            if "p50_added_ttft_ms_at_64" in t:
                good = t["p50_added_ttft_le_0.5ms_at_64"]
                parts.append(f"+TTFT p50 @64 = {fmt(t['p50_added_ttft_ms_at_64'], 3)} ms "
                             + ("[green]<= 0.5 ok[/green]" if good else "[red]> 0.5[/red]"))
            if "throughput_rps" in t:
                good = t["throughput_ge_2000rps"]
                parts.append(f"{t['throughput_rps']:.0f} short streams/s " + ("[green]>= 2000 ok[/green]" if good
                             else "[red]< 2000[/red]")
                             + f" (alone: {fmt(t.get('router_capacity_rps_per_core'), 0)}/s per core)")
            if "not_worse_than_vllm_router" in t:
                parts.append("[green]not worse than vllm-router[/green]" if t["not_worse_than_vllm_router"]
                             else "[red]worse than vllm-router on[/red] " + ", ".join(t["worse_than_vllm_router_on"]))
            con.print(f"  [bold]{n}[/bold]: " + "; ".join(parts))
    for n, s in S.items():
        if s.get("status") != "ok":
            reason = str(s.get("reason", "")).strip().splitlines()
            short = reason[0] if reason else ""
            last = reason[-1] if len(reason) > 1 else ""
            con.print(f"  [yellow]{n}: {s.get('status')}[/yellow] - {short}" + (f"\n      ... {last}" if last else ""))
    worst = max((ph.get("other_load", {}).get("util", 0) for s in ok.values()
                 for ph in list(s["latency"].values()) + ([s["throughput"]] if s.get("throughput") else [])),
                default=0)
    busy_client = max((ph["cpu"]["client_util"] for s in ok.values()
                       for ph in list(s["latency"].values()) + ([s["throughput"]] if s.get("throughput") else [])),
                      default=0)
    if busy_client > 0.90:
        con.print(f"[red]warning:[/red] the load client was {busy_client * 100:.0f}% busy in some phase, so it may have "
                  "limited that phase (its reads coalesce chunks, inflating ITL/TTFT).")
    if worst > 0.10:
        con.print(f"[red]warning:[/red] other processes used up to {worst * 100:.0f}% of a core during a phase; "
                  "on 2 cores that skews latency and CPU numbers - rerun on a quiet machine.")


def _layout(a) -> str:
    if getattr(a, "layout", "shared") == "isolated":
        return f"router alone on core {a.client_cpu}, engines + client on core {a.server_cpu}"
    return f"engines + router on core {a.server_cpu}, client on core {a.client_cpu}"
