"""``steersman keys create --tenant T``: a new API key, shown once, and the config line to paste."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    keys = typer.Typer(help="Manage API keys (the gateway stores only their SHA-256).", no_args_is_help=True)

    @keys.command("create")
    def create(
        tenant: str = typer.Option(..., "--tenant", help="The tenant the key authenticates as (must be under `tenants:`)."),
    ) -> None:
        """Create an API key for TENANT: print it once with the `api_keys:` line to paste into the gateway config."""
        from steersman.control.tenants import TENANT_NAME, generate_key

        if not TENANT_NAME.fullmatch(tenant):
            typer.echo(
                f"error: tenant name {tenant!r} must be letters, digits, '_', '.', '-' (at most 64, starting with a letter or digit)",
                err=True,
            )
            raise typer.Exit(2)
        key, digest = generate_key()
        quoted = tenant if _plain_yaml_string(tenant) else f'"{tenant}"'
        typer.echo(f"API key for tenant {tenant}:\n\n    {key}\n")
        typer.echo("Add this line under `api_keys:` in the gateway config:\n")
        typer.echo(f'    - {{sha256: "{digest}", tenant: {quoted}}}\n')
        typer.echo(
            "warning: this key is shown once and is not stored anywhere (the gateway keeps only its SHA-256). "
            "Copy it now; a lost key cannot be recovered -- create a new one and delete the old line.",
            err=True,
        )

    app.add_typer(keys, name="keys")


def _plain_yaml_string(s: str) -> bool:
    """True if ``s`` reads back unquoted as the same string (not a number, bool or null) from a fleet file, whose loader
    reads numbers as YAML 1.2 does (``1e3`` is a number there, a string to YAML 1.1)."""
    import yaml

    from steersman.fleet.config import load_yaml

    try:
        return load_yaml(s) == s
    except yaml.YAMLError:
        return False
