"""Ratios vs direct and vs vllm-router, and the target checks, computed from a run's results."""

from __future__ import annotations

from options import ROUTER_SETUPS


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b


def derive(results: dict, a) -> dict:
    """Ratios vs direct and vs vllm-router, and target checks."""
    S = results["setups"]
    d = S.get("direct", {})
    v = S.get("vllm-router", {})
    der: dict = {"latency": {}, "throughput": {}}
    for name, s in S.items():
        if s.get("status") != "ok":
            continue
        for c, ph in s["latency"].items():
            dp = d.get("latency", {}).get(c)
            vp = v.get("latency", {}).get(c) if v.get("status") == "ok" else None
            row = {}
            for k in ("ttft_ms", "itl_ms"):
                for q in ("p50", "p99"):
                    x = ph[k][q]
                    row[f"{k}_{q}_added"] = (x - dp[k][q]) if dp and x is not None and dp[k][q] is not None else None
                    row[f"{k}_{q}_x_direct"] = ratio(x, dp[k][q]) if dp else None
                    row[f"{k}_{q}_x_vllm"] = ratio(x, vp[k][q]) if vp else None
            row["router_cpu_x_vllm"] = ratio(ph["cpu"]["router_us_per_req"], vp["cpu"]["router_us_per_req"]) if vp else None
            row["rps_x_direct"] = ratio(ph["rps"], dp["rps"]) if dp else None
            der["latency"].setdefault(name, {})[c] = row
        tp = s.get("throughput")
        if tp:
            dtp = d.get("throughput")
            vtp = v.get("throughput") if v.get("status") == "ok" else None
            rus = tp["cpu"]["router_us_per_req"]
            der["throughput"][name] = {
                "rps_x_direct": ratio(tp["rps"], dtp["rps"]) if dtp else None,
                "rps_x_vllm": ratio(tp["rps"], vtp["rps"]) if vtp else None,
                "router_cpu_x_vllm": ratio(rus, vtp["cpu"]["router_us_per_req"]) if vtp and rus else None,
                # what one router process could sustain with a whole core to itself
                "router_capacity_rps_per_core": (1e6 / rus) if rus else None,
            }
    # targets, for every router that ran (the product targets are for steersman)
    tg = {}
    for name in ROUTER_SETUPS:
        s = S.get(name, {})
        if s.get("status") != "ok":
            continue
        t = {}
        r64 = der["latency"].get(name, {}).get("64")
        if r64:
            t["p50_added_ttft_ms_at_64"] = r64["ttft_ms_p50_added"]
            t["p50_added_ttft_le_0.5ms_at_64"] = r64["ttft_ms_p50_added"] is not None and r64["ttft_ms_p50_added"] <= 0.5
        tp = s.get("throughput")
        if tp:
            t["throughput_rps"] = tp["rps"]
            t["throughput_ge_2000rps"] = tp["rps"] >= 2000
            t["router_capacity_rps_per_core"] = der["throughput"][name]["router_capacity_rps_per_core"]
        if name != "vllm-router" and S.get("vllm-router", {}).get("status") == "ok":
            worse = []
            for c, row in der["latency"].get(name, {}).items():
                for k in ("ttft_ms_p50_x_vllm", "ttft_ms_p99_x_vllm", "itl_ms_p99_x_vllm"):
                    if row.get(k) is not None and row[k] > 1.0:
                        worse.append(f"{k.replace('_x_vllm', '')}@{c}={row[k]:.2f}x")
                if row.get("router_cpu_x_vllm") is not None and row["router_cpu_x_vllm"] > 1.0:
                    worse.append(f"router_cpu@{c}={row['router_cpu_x_vllm']:.2f}x")
            trow = der["throughput"].get(name, {})
            if trow.get("rps_x_vllm") is not None and trow["rps_x_vllm"] < 1.0:
                worse.append(f"throughput={trow['rps_x_vllm']:.2f}x")
            t["not_worse_than_vllm_router"] = not worse
            t["worse_than_vllm_router_on"] = worse
        tg[name] = t
    der["targets"] = tg
    return der
