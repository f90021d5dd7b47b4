"""The ``steersman`` command line (typer + rich)."""

from __future__ import annotations

import typer

from steersman.cli import defaults_cmd, engine_sim_cmd, gateway_cmd, keys_cmd, plan_cmd, plugins_cmd, simulate_cmd

app = typer.Typer(
    name="steersman",
    help="An inference control plane for LLM fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
gateway_cmd.register(app)
engine_sim_cmd.register(app)
defaults_cmd.register(app)
keys_cmd.register(app)
simulate_cmd.register(app)
plan_cmd.register(app)
plugins_cmd.register(app)


def main() -> None:
    app()
