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
        rows = [(name, repr(value), ranges.get(name, ""), source) for name, (value, source) in sources(DEFAULTS).items()]
        # a setting's name is never cut ("scheduler.kv_events_…" cannot be grepped or pasted): its column is as wide
        # as the longest, the others fold
        table = Table(show_lines=False)
        table.add_column("setting", no_wrap=True, min_width=max(len(r[0]) for r in rows))
        for col in ("default", "allowed", "source"):
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*row)
        con = Console()
        if not con.is_terminal:  # piped: rich would assume 80 columns
            con = Console(width=max(200, con.width))
        con.print(table)
