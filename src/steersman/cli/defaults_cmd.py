"""``steersman defaults``: every default with its source."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("defaults")
    def defaults() -> None:
        """Print every default setting and where its value comes from."""
        from rich.console import Console
        from rich.table import Table

        from steersman.config import DEFAULTS, sources
        from steersman.config._base import value_ranges

        ranges = value_ranges(DEFAULTS)
        table = Table("setting", "default", "allowed", "source", show_lines=False)
        for name, (value, source) in sources(DEFAULTS).items():
            table.add_row(name, repr(value), ranges.get(name, ""), source)
        Console().print(table)
