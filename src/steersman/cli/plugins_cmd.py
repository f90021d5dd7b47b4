"""``steersman plugins``: every extension point and the names registered in it (entry points and a fleet file's
``plugins:`` loaded first), so a fleet file's names can be looked up."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register", "extension_points"]


def extension_points() -> list[tuple[str, str, object]]:
    """(where it is configured, its Protocol's name, its registry) for every extension point."""
    from steersman.api.response_store import RESPONSE_STORES
    from steersman.control.admission import ADMITTERS
    from steersman.engines import ADAPTERS
    from steersman.policy import POLICIES
    from steersman.policy.decode import DECODE_PICKERS
    from steersman.policy.framework import FILTERS, PICKERS, SCORERS

    return [
        ("policy (or scheduler.profile)", "RoutingPolicy", POLICIES),
        ("scheduler.profiles.*.filters", "Filter", FILTERS),
        ("scheduler.profiles.*.scorers", "Scorer", SCORERS),
        ("scheduler.profiles.*.picker", "Picker", PICKERS),
        ("scheduler.decode_picker", "DecodePicker", DECODE_PICKERS),
        ("endpoints[].engine", "EngineAdapter", ADAPTERS),
        ("admission.admitter", "Admitter", ADMITTERS),
        ("gateway.response_store", "ResponseStore", RESPONSE_STORES),
    ]


def register(app: typer.Typer) -> None:
    @app.command("plugins")
    def plugins(
        config: Path | None = typer.Option(None, "--config", "-c",
                                           help="Fleet file whose `plugins:` modules are loaded too."),
    ) -> None:
        """List every extension point and the plugin names registered in it (installed `steersman.plugins` entry
        points included)."""
        from rich.console import Console
        from rich.table import Table

        from steersman.fleet.config import FleetConfigError, load_fleet
        from steersman.plugins import PluginLoadError, load_plugins

        try:
            if config is not None:
                load_fleet(config)  # (imports its plugins: modules, after the entry points)
            else:
                load_plugins()
        except (FleetConfigError, PluginLoadError) as e:
            typer.echo(f"steersman plugins: {e}", err=True)
            raise typer.Exit(2) from None
        table = Table()
        table.add_column("configured as", no_wrap=True)
        table.add_column("protocol", no_wrap=True)
        table.add_column("names", overflow="fold")
        for where, protocol, registry in extension_points():
            table.add_row(where, protocol, ", ".join(registry.names()))
        con = Console()
        if not con.is_terminal:
            con = Console(width=max(160, con.width))
        con.print(table)
