"""Starting what bench/overhead measures: engines, `steersman serve`, the Rust peer routers.

Every process goes through a :class:`procs.ProcessGroup` (pinned, own session,
stopped on exit). A setup that cannot run raises :class:`SkipSetup` with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from options import BASE_SUFFIX, BENCH, MODEL, setup_kind
from procs import Proc, ProcessGroup, free_port, wait_http


class SkipSetup(Exception):
    pass


def steersman_bin(a, setup: str = "") -> str | None:
    if setup.endswith(BASE_SUFFIX):
        return a.baseline_bin
    if a.steersman_bin:
        return a.steersman_bin
    cand = Path(sys.executable).parent / "steersman"
    if cand.exists():
        return str(cand)
    return shutil.which("steersman")


def check_cli(argv: list, timeout: float = 30.0) -> tuple[bool, str]:
    """Does `argv --help` run and exit 0?"""
    try:
        r = subprocess.run(argv + ["--help"], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, repr(e)
    out = (r.stdout + r.stderr).decode(errors="replace").strip().splitlines()
    return r.returncode == 0, "\n".join(out[-6:])


def ensure_peers(a, log) -> None:
    """Create the peer routers' venv (bench/setup_peers.sh) if a Rust-router setup needs it and it is missing."""
    wanted = [s for s in a.setups if s in ("vllm-router", "sglang-router")]
    peers = Path(a.peers_venv) / "bin"
    if not wanted or a.no_setup_peers or all((peers / s).exists() for s in wanted):
        return
    log(f"creating {a.peers_venv} (bench/setup_peers.sh: pip install vllm-router==0.1.17 sglang-router==0.3.2)")
    env = dict(os.environ, PEERS_VENV=str(a.peers_venv), PYTHON=sys.executable)
    try:
        r = subprocess.run(["bash", str(BENCH / "setup_peers.sh")], env=env, capture_output=True, timeout=600,
                           stdin=subprocess.DEVNULL, check=False)
        if r.returncode != 0:
            log("peers venv setup failed:\n" + (r.stdout + r.stderr).decode(errors="replace")[-2000:])
    except subprocess.TimeoutExpired:
        log("peers venv setup timed out")


def start_engines(a, pg: ProcessGroup, log) -> tuple[list[Proc], list[str]]:
    """Start `a.replicas` engines (stub or engine-sim) and wait for /health; returns (procs, base URLs)."""
    engines: list[Proc] = []
    engine_urls: list[str] = []
    ports = [free_port() for _ in range(a.replicas)]
    if a.engine == "sim":
        sb = steersman_bin(a)
        ok, why = (False, "no `steersman` executable") if not sb else check_cli([sb, "engine-sim"])
        if not ok:
            raise SystemExit(
                f"`steersman engine-sim` is not available ({why}).\n"
                "Run with --engine stub to use bench/stub_engine.py instead.")
    for i, port in enumerate(ports):
        if a.engine == "stub":
            argv = [sys.executable, str(BENCH / "stub_engine.py"), "--port", port, "--model", MODEL,
                    "--chunks", a.max_tokens, "--interval-ms", a.interval_ms]
        else:
            argv = [steersman_bin(a), "engine-sim", "--gpu", a.gpu, "--model", MODEL, "--port", port,
                    "--speedup", a.speedup]
        argv += a.engine_arg
        p = pg.start(f"engine{i}", argv, role="engine")
        engines.append(p)
        engine_urls.append(f"http://127.0.0.1:{port}")
    for p, url in zip(engines, engine_urls):
        waited = wait_http(p, url + "/health", timeout=90)
        log(f"{p.name} ready at {url} in {waited:.2f}s (pid {p.pid})")
    return engines, engine_urls


def start_router(setup: str, a, pg: ProcessGroup, engine_urls: list[str]) -> tuple[Proc, str, float]:
    """Start the router for `setup`; returns (proc, base_url, ready_seconds) or raises SkipSetup."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    sb = steersman_bin(a, setup)
    name, setup = setup, setup_kind(setup)  # the process (and its log) keeps the setup's name: runs may overlap
    if setup in ("steersman", "steersman-rr", "steersman-otlp"):
        if not sb:
            raise SkipSetup("no `steersman` executable found (install the repo: pip install -e .)")
        ok, why = check_cli([sb, "serve"])
        if not ok:
            raise SkipSetup(f"`steersman serve` is not available yet: {why}")
        cfg = pg.log_dir / f"{name}.fleet.yaml"
        lines = [f"gateway: {{host: 127.0.0.1, port: {port}}}", "endpoints:"]
        policy = "round-robin" if setup == "steersman-rr" else getattr(a, "fleet_policy", None)
        if policy:  # else the fleet's default profile
            lines.insert(1, f"policy: {policy}")
        if setup == "steersman-otlp":  # the default profile exporting every request's spans (README: Tracing)
            sink = free_port()
            pg.start(f"{name}-otlp-sink", [sys.executable, str(Path(__file__).with_name("otlp_sink.py")), sink],
                     role="server")  # beside the engines, not on the router's core
            lines[0] = (f"gateway: {{host: 127.0.0.1, port: {port}, "
                        f"otlp_traces_endpoint: 'http://127.0.0.1:{sink}/v1/traces'}}")
        for i, u in enumerate(engine_urls):
            lines.append(f'  - {{name: e{i}, url: "{u}", engine: vllm, gpu: {a.gpu}, models: [{MODEL}]}}')
        cfg.write_text("\n".join(lines) + "\n")
        p = pg.start(name, [sb, "serve", "--config", cfg], role="router")
        try:
            waited = wait_http(p, base + "/health", timeout=60)
        except (RuntimeError, TimeoutError) as e:
            pg.stop(p)
            raise SkipSetup(f"`steersman serve` did not become ready: {e}") from None
        return p, base, waited
    peers = Path(a.peers_venv) / "bin"
    exe = peers / setup
    if not exe.exists():
        raise SkipSetup(f"{exe} missing; create it with: bash bench/setup_peers.sh")
    prom = str(free_port())
    if setup == "vllm-router":
        argv = [exe, "--host", "127.0.0.1", "--port", port, "--worker-urls", *engine_urls,
                "--policy", a.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", prom,
                "--worker-startup-check-interval", "1", "--log-level", "warning"]
        p = pg.start(setup, argv, role="router", env={"RUST_LOG": "warn"})
        waited = wait_http(p, base + "/health", timeout=60)
    else:
        argv = [exe, "launch", "--host", "127.0.0.1", "--port", port, "--worker-urls", *engine_urls,
                "--policy", a.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", prom,
                "--log-level", "warn"]
        p = pg.start(setup, argv, role="router")
        n = len(engine_urls)

        def ready(st, body):
            if st != 200:
                return False
            try:
                return json.loads(body).get("healthy_workers", 0) >= n
            except ValueError:
                return False

        waited = wait_http(p, base + "/readiness", timeout=60, want=ready)
    return p, base, waited
