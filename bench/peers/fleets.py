"""Engines and routers for bench/peers: fresh engines per setup (no cache carried over), one router each.

Every process goes through bench/procs.py's ProcessGroup (own session, PDEATHSIG, stopped on exit).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from procs import ProcessGroup, free_port, wait_http

from steersman.engines.llamacpp import llamacpp_metrics
from steersman.engines.metric_names import METRIC_NAMES
from steersman.engines.openai_http import parse_metrics
from steersman.fleet.processes import LlamaServerFleet

BIN = Path(sys.executable).parent
STACK_PROXIES = Path(__file__).resolve().parent.parent / "overhead" / "stack_proxies.py"


class SkipSetup(Exception):
    pass


@dataclass(frozen=True, slots=True)
class FleetSpec:
    name: str  # "llamacpp" | "sim"
    replicas: int
    model: str
    engine_kind: str  # the steersman fleet-file engine kind
    sim_gpu: str = "H100"
    sim_speedup: float = 10.0


def start_engines(spec: FleetSpec, pg: ProcessGroup, tag: str, kv_events: list[str] | None = None) -> list[str]:
    """The fleet's engines, started fresh; their URLs.  ``kv_events`` (a list, engine-sim only): each engine also
    publishes its KV events on a port of its own, appended to it."""
    urls, procs = [], []
    lf = LlamaServerFleet(1) if spec.name == "llamacpp" else None
    if lf is not None and (lf.binary is None or lf.model is None):
        raise SystemExit("llama-server / GGUF missing: run `make llama` first")
    for i in range(spec.replicas):
        port = free_port()
        if lf is not None:
            argv = lf.command(port)
        else:
            argv = [BIN / "steersman", "engine-sim", "--gpu", spec.sim_gpu, "--model", spec.model,
                    "--port", port, "--speedup", spec.sim_speedup]
            if kv_events is not None:
                kv_events.append(f"tcp://127.0.0.1:{free_port()}")
                argv += ["--kv-events-endpoint", kv_events[-1]]
        procs.append(pg.start(f"{tag}-engine{i}", argv, role="engine"))
        urls.append(f"http://127.0.0.1:{port}")
    for p, u in zip(procs, urls):
        wait_http(p, u + "/health", timeout=180)
    return urls


def _cfg_lines(setup: str) -> list[str]:
    """``steersman+cfg:SECTION.KEY=VALUE[;...]``: the same gateway with these fleet-file settings (not ``gateway``,
    which the other variants set), e.g. ``steersman+cfg:scheduler.slot_wait_overrun=1.0`` to measure a default."""
    if "+cfg:" not in setup:
        return []
    by: dict[str, list[str]] = {}
    for pair in setup.split("+cfg:", 1)[1].split(";"):
        key, _, value = pair.partition("=")
        section, _, name = key.partition(".")
        if not (section and name and value) or section == "gateway":
            raise SystemExit(f"setup {setup!r}: expected +cfg:SECTION.KEY=VALUE[;...] (not gateway.*)")
        by.setdefault(section, []).append(f"{name}: {value}")
    return [f"{section}: {{{', '.join(items)}}}" for section, items in by.items()]


def start_router(setup: str, spec: FleetSpec, pg: ProcessGroup, urls: list[str], peers: Path,
                 steersman_bin: str | None = None, kv_events: list[str] | None = None) -> str:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if setup.startswith("steersman"):
        cfg = pg.log_dir / f"fleet-{spec.name}.yaml"
        # steersman+busy-poll: the same gateway with HAProxy-style busy polling (gateway.busy_poll_s, off by default)
        poll = ", busy_poll_s: 0.05" if setup == "steersman+busy-poll" else ""
        # steersman+no-preconnect: without a spare upstream connection opened when an engine closes one
        # (gateway.upstream_preconnect; llama-server closes the connection after every streamed response)
        poll += ", upstream_preconnect: false" if setup == "steersman+no-preconnect" else ""
        lines = [f"gateway: {{host: 127.0.0.1, port: {port}{poll}}}", *_cfg_lines(setup), "endpoints:"]
        for i, u in enumerate(urls):
            gpu = f", gpu: {spec.sim_gpu}" if spec.name == "sim" else ""
            events = f', kv_events: "{kv_events[i]}"' if kv_events else ""
            lines.append(f'  - {{name: e{i}, url: "{u}", engine: {spec.engine_kind}, models: [{spec.model}]{gpu}{events}}}')
        cfg.write_text("\n".join(lines) + "\n")
        if setup.startswith("steersman@base") and not steersman_bin:
            raise SkipSetup("steersman@base needs --baseline-bin")
        p = pg.start("steersman", [steersman_bin or BIN / "steersman", "serve", "--config", cfg], role="router")
        wait_http(p, base + "/health", timeout=120)
        return base
    if setup == "http-floor":
        # a reference, not a router: steersman's own HTTP server and upstream pool relaying round-robin, with no
        # pipeline (no parsing, policy, accounting): what steersman's added latency would be with a free pipeline
        p = pg.start("http-floor", [sys.executable, STACK_PROXIES, "steersman-http", "--port", port, "--upstream", *urls],
                     role="router")
        wait_http(p, base + "/health", timeout=60)
        return base
    router, _, policy = setup.partition(":")
    exe = peers / "bin" / router
    if not exe.exists():
        raise SkipSetup(f"{exe} missing: run bench/setup_peers.sh")
    prom = str(free_port())
    common = ["--host", "127.0.0.1", "--port", port, "--worker-urls", *urls, "--policy", policy,
              "--prometheus-host", "127.0.0.1", "--prometheus-port", prom]
    if router == "vllm-router":
        p = pg.start(setup.replace(":", "-"), [exe, *common, "--worker-startup-check-interval", "1"],
                     role="router", env={"RUST_LOG": "warn"})
        wait_http(p, base + "/health", timeout=120)
        return base
    p = pg.start(setup.replace(":", "-"), [exe, "launch", *common, "--log-level", "warn"], role="router")

    def ready(st, body):
        try:
            return st == 200 and json.loads(body).get("healthy_workers", 0) >= len(urls)
        except ValueError:
            return False

    wait_http(p, base + "/readiness", timeout=120, want=ready)
    return base


def prefix_counters(spec: FleetSpec, urls: list[str]) -> tuple[float, float]:
    """(prompt tokens queried, prompt tokens served from the prefix cache) summed over the engines."""
    q = h = 0.0
    for u in urls:
        with urllib.request.urlopen(u + "/metrics", timeout=10) as r:
            text = r.read().decode()
        m = llamacpp_metrics(text, None) if spec.name == "llamacpp" else parse_metrics(text, METRIC_NAMES["engine-sim"])
        q += m.prefix_queries
        h += m.prefix_hits
    return q, h
