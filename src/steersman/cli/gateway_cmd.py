"""``steersman up`` (embedded simulated fleet) and ``steersman serve --config fleet.yaml``."""

from __future__ import annotations

import logging
import math
from importlib import resources
from pathlib import Path

import typer

__all__ = ["register"]


def _default_fleet():
    from steersman.fleet.config import load_yaml, parse_fleet

    text = resources.files("steersman.fleet").joinpath("default_fleet.yaml").read_text()
    return parse_fleet(load_yaml(text), "embedded default fleet")


def examples(url: str, model: str, keyed: bool) -> tuple[str, str]:
    """The ready-to-paste curl and Python examples of the banner; with API keys configured (``keyed``) they send
    the key in ``$STEERSMAN_API_KEY`` (with a placeholder key they were a 401)."""
    auth = " -H \"Authorization: Bearer $STEERSMAN_API_KEY\"" if keyed else ""
    curl = (
        f"curl -N {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\\n"
        f"  -d '{{\"model\": \"{model}\", \"stream\": true, \"max_tokens\": 32, "
        f"\"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'"
    )
    key = "os.environ[\"STEERSMAN_API_KEY\"]" if keyed else "\"unused\""
    py = (
        ("import os\n" if keyed else "")
        + "from openai import OpenAI\n"
        f"client = OpenAI(base_url=\"{url}/v1\", api_key={key})\n"
        f"for chunk in client.chat.completions.create(model=\"{model}\", stream=True, max_tokens=32,\n"
        "        messages=[{\"role\": \"user\", \"content\": \"Hello!\"}]):\n"
        "    print(chunk.choices[0].delta.content or \"\", end=\"\", flush=True)\n"
        f"print(client.responses.create(model=\"{model}\", input=\"Hello!\", max_output_tokens=32).output_text)"
    )
    if keyed:
        curl = ("# API keys are configured: export STEERSMAN_API_KEY=<a tenant's key> "
                "(steersman keys create --tenant NAME makes one)\n" + curl)
    return curl, py


def _banner(gw) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    con = Console(width=max(120, Console().width))
    models = gw.fleet.models()
    model = models[0] if models else "MODEL"
    t = Table("replica", "engine", "gpu", "pool", "models", "$/h", "url", title="fleet", min_width=100)
    for r in gw.fleet.replicas:
        t.add_row(r.name, r.engine, r.gpu or "?", r.pool, ", ".join(r.models), f"{r.price_per_hour:.2f}", r.url)
    con.print(t)
    curl, py = examples(gw.url, model, keyed=not gw.tenants.open)
    con.print(Panel.fit(f"[bold green]steersman gateway ready[/] at [bold]{gw.url}[/]  (models: {', '.join(models)})\n"
                        f"metrics: {gw.url}/metrics   health: {gw.url}/health   Ctrl-C stops everything", title="steersman"))
    # plain print: rich would wrap the examples at the terminal width and break copy-paste
    print(f"\n# curl\n{curl}\n\n# python\n{py}\n", flush=True)
    print("steersman ready", gw.url, flush=True)


def _parse_engines(spec: str) -> tuple[str, int]:
    """``llamacpp:N`` -> ("llamacpp", N)."""
    kind, _, n = spec.partition(":")
    if kind != "llamacpp" or not n.isdigit() or not 1 <= int(n) <= 64:
        raise typer.BadParameter(f"--engines must be llamacpp:N with 1 <= N <= 64, got {spec!r}")
    return kind, int(n)


def _run(cfg, command: str, engines: tuple[str, int] | None = None, reload=None) -> None:
    """``reload``: reads the fleet file again (``POST /admin/reload``); None without one."""
    from steersman.api.gateway import Gateway
    from steersman.cli._run import exit_if_cannot_listen, run_service

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    holder: dict = {}
    procs = None
    if engines is not None:
        import atexit

        from steersman.fleet.processes import LlamaServerFleet

        procs = LlamaServerFleet(engines[1])
        atexit.register(procs.stop_now)  # last resort; children also die with us (PR_SET_PDEATHSIG)

    async def start() -> None:
        nonlocal cfg
        if procs is not None:
            import msgspec

            from steersman.fleet.config import EndpointConfig

            logging.getLogger("steersman.engines").info("starting %d llama-server replica(s)", procs.count)
            endpoints = tuple(msgspec.convert(ep, EndpointConfig) for ep in await procs.start())
            cfg = msgspec.structs.replace(cfg, endpoints=endpoints, simulated=None)  # the real engines replace the sims
        gw = holder["gw"] = Gateway(cfg)
        gw.reload_from = reload
        await gw.start()
        if procs is not None:
            import asyncio

            holder["watch"] = asyncio.get_running_loop().create_task(procs.watch())
        _banner(gw)

    async def stop() -> None:
        if "watch" in holder:
            holder["watch"].cancel()
        try:
            if "gw" in holder:
                await holder["gw"].stop()
        finally:
            if procs is not None:
                await procs.stop()

    async def drain() -> None:
        if "gw" in holder:
            await holder["gw"].drain()

    try:
        run_service(start, stop, freeze=cfg.gateway.gc_freeze, gc_threshold0=cfg.gateway.gc_threshold0, drain=drain)
    except Exception as e:  # an engine that does not start, a setting start-up refuses: say why, no traceback
        exit_if_cannot_listen(command, e)
        if isinstance(e, (RuntimeError, ValueError)):  # EngineStartError; an engine-sim that exited or never got
            # ready; a value the gateway's parts refuse (a FleetConfigError is one)
            typer.echo(f"{command}: {e}", err=True)
            raise typer.Exit(2) from None
        raise


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up(
        port: int | None = typer.Option(None, help="Gateway port (default 8080)."),
        host: str | None = typer.Option(None, help="Gateway address (default 127.0.0.1)."),
        speedup: float | None = typer.Option(None, help="Run the simulated fleet this many times faster than real time."),
        engines: str | None = typer.Option(
            None, help="Real engines instead of the simulated fleet: llamacpp:N starts N llama-server replicas "
            "of Gemma 3 270M (build once with `make llama`)."),
    ) -> None:
        """Start the gateway and an embedded simulated fleet (2x H100 + 2x A100 Llama-3.1-8B, 1x L40S Qwen2.5-7B)."""
        import msgspec

        from steersman.fleet.config import FleetConfigError, with_gateway

        spec = _parse_engines(engines) if engines is not None else None
        if speedup is not None and not (math.isfinite(speedup) and speedup > 0):
            raise typer.BadParameter(f"--speedup must be > 0 and finite, got {speedup:g}")
        try:
            cfg = with_gateway(_default_fleet(), port=port, host=host)
        except FleetConfigError as e:
            raise typer.BadParameter(str(e)) from None
        if speedup is not None and cfg.simulated is not None:
            cfg = msgspec.structs.replace(cfg, simulated=msgspec.structs.replace(cfg.simulated, speedup=speedup))
        _run(cfg, "steersman up", spec)

    @app.command("serve")
    def serve(
        config: Path = typer.Option(..., "--config", "-c", help="Fleet file (YAML)."),
        port: int | None = typer.Option(None, help="Override gateway.port."),
        host: str | None = typer.Option(None, help="Override gateway.host."),
    ) -> None:
        """Start the gateway for the fleet described in a YAML file."""
        from steersman.fleet.config import FleetConfigError, check_spawnable, load_fleet, with_gateway

        try:
            cfg = with_gateway(load_fleet(config), port=port, host=host)
            if cfg.simulated is not None:
                check_spawnable(cfg.simulated, str(config))
        except FleetConfigError as e:
            typer.echo(f"steersman serve: {e}", err=True)
            raise typer.Exit(2) from None
        _run(cfg, "steersman serve", reload=lambda: with_gateway(load_fleet(config), port=port, host=host))
